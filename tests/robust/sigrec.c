/* sigrec OUT READY MODE: a worker that catches every catchable signal and
 * keeps the set of signal numbers it has seen in OUT (one per line, rewritten
 * atomically whenever the set grows). READY is created once the handlers are
 * in place. MODE "exit": SIGTERM writes OUT and exits 0; "keep": SIGTERM is
 * recorded like any other signal and the worker runs on. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t seen[65];
static volatile sig_atomic_t term;
static int exit_on_term;

static void on_signal(int sig) {
    if (sig > 0 && sig < 65) seen[sig] = 1;
    if (sig == SIGTERM && exit_on_term) term = 1;
}

static int dump(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int n = 0;
    if (!f) return -1;
    for (int s = 1; s < 65; s++)
        if (seen[s]) { fprintf(f, "%d\n", s); n++; }
    fclose(f);
    rename(tmp, path);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    exit_on_term = strcmp(argv[3], "exit") == 0;
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    sigprocmask(SIG_BLOCK, &all, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    for (int s = 1; s <= SIGRTMAX; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, NULL); /* 32, 33: EINVAL, fine */
    close(open(argv[2], O_CREAT | O_WRONLY, 0644));
    int last = 0;
    for (;;) {
        sigsuspend(&none);
        int n = 0;
        for (int s = 1; s < 65; s++) n += seen[s] != 0;
        if (n != last) { dump(argv[1]); last = n; }
        if (term) { dump(argv[1]); return 0; }
    }
}
