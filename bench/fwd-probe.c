/* bench/fwd-probe.c: the smallest signal forwarder, a probe for the floor of
 * the SIGUSR1 latency row (bench/RESULTS.md, issue 19); not an init: it
 * reaps only its child.
 *
 *   fwd-probe sfd -- CMD...    waits by reading a signalfd, as catatonit does
 *   fwd-probe wait -- CMD...   waits in sigwaitinfo, as dumb-init does
 *   fwd-probe MODE,pgrp -- CMD...  CMD in a process group of its own and
 *                              signalled by pid, the probe a subreaper: as
 *                              catatonit starts its child
 *
 * CMD runs in a new session (as dumb-init and drainit start it); every signal
 * is blocked, read and sent to its group; fwd-probe exits with CMD's status. Build: gcc -O2 -o fwd-probe
 * bench/fwd-probe.c; measure it as bench/run measures an init (its latency
 * function, with `fwd-probe sfd --` as the prefix). */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0)
        return 2;
    int use_sfd = strncmp(argv[1], "sfd", 3) == 0;
    int pgrp = strstr(argv[1], ",pgrp") != NULL;
    if (pgrp)
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    pid_t child = fork();
    if (child == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (pgrp)
            setpgid(0, 0);
        else
            setsid();
        execvp(argv[3], argv + 3);
        _exit(127);
    }
    int fd = use_sfd ? signalfd(-1, &all, SFD_CLOEXEC) : -1;
    for (;;) {
        int sigs[16], n = 0;
        if (use_sfd) {
            struct signalfd_siginfo si[16];
            ssize_t got = read(fd, si, sizeof si);
            for (ssize_t i = 0; i < got / (ssize_t)sizeof si[0]; i++)
                sigs[n++] = (int)si[i].ssi_signo;
        } else {
            siginfo_t info;
            int sig = sigwaitinfo(&all, &info);
            if (sig > 0)
                sigs[n++] = sig;
        }
        for (int i = 0; i < n; i++) {
            if (sigs[i] != SIGCHLD) {
                kill(pgrp ? child : -child, sigs[i]);
                continue;
            }
            int st;
            pid_t p;
            while ((p = waitpid(-1, &st, WNOHANG)) > 0)
                if (p == child)
                    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
    }
}
