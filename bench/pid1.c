/* bench/pid1.c: start a command as PID 1 of a new PID namespace, as a
 * container runtime does.  Built by bench/run with gcc; not part of drainit.
 *
 *   pid1 CMD [ARG...]
 *
 * unshare(CLONE_NEWPID | CLONE_NEWNS), fork; the child (PID 1 of the new
 * namespace) makes / private, mounts a fresh /proc and execs CMD.  The
 * parent keeps no fd, waits for it and ends as it ended (its exit code, or
 * 128 + its signal).  The driver signals and times PID 1 itself, through
 * its host pid (this launcher's only child) and a pidfd, so nothing of the
 * launcher is in a PID-1 row but the start-up one, where `bare` (the
 * launcher execing the command with no init) carries the same cost.
 * What `unshare --pid --fork --mount-proc` does, minus its own start-up.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pid1 CMD [ARG...]\n");
        return 2;
    }
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
        perror("pid1: unshare");
        return 125;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("pid1: fork");
        return 125;
    }
    if (pid == 0) {
        if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
            perror("pid1: mount");
            _exit(125);
        }
        execvp(argv[1], argv + 1);
        perror("pid1: exec");
        _exit(127);
    }
    /* Nothing of ours stays open: a fifo's reader sees its end when the
     * namespace's processes are gone, not when we are. */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}
