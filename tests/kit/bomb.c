/* bomb CAP TOTAL MODE READY FORKS: a worker that answers SIGTERM by starting a fork bomb
 * and never stops on its own. Every bomb process forks while fewer than CAP
 * bomb processes live (a counter in shared memory), and exits when the cap is
 * reached, so there is a steady churn of forks and orphans until something
 * SIGKILLs them all. MODE "group": the bomb stays in the worker's process
 * group; "setsid": every new process leaves it with setsid(). SIGCHLD is
 * ignored so a parent's own children never linger as zombies; orphans go to
 * drainit. Whichever bomb process notices first writes the number of forks
 * so far to FORKS every 50ms. Safety for a shared machine (pid_max may be 32768, shared with others):
 * the bomb forks at most 10 times per millisecond, makes at most TOTAL forks and stops by itself 5s after it started,
 * whatever drainit does, so a drainit that stops reaping leaves at most TOTAL
 * zombies behind for a few seconds. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct shared { long live, forks, reported_ms; };
static volatile sig_atomic_t term;
static void on_term(int sig) { (void)sig; term = 1; }

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void report(const char *path, long forks) {
    char tmp[4096], line[32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%ld\n", forks);
    if (write(fd, line, n) < 0) {}
    close(fd);
    rename(tmp, path);
}

int main(int argc, char **argv) {
    if (argc != 6) return 2;
    long cap = atol(argv[1]), total = atol(argv[2]);
    int use_setsid = strcmp(argv[3], "setsid") == 0;
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 125;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGCHLD, SIG_IGN);
    /* Blocked until sigsuspend: a SIGTERM between the check of `term` and
     * the wait would otherwise be handled just before a pause() that then
     * sleeps through it (the test signals as soon as READY exists). */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, &old);
    close(open(argv[4], O_CREAT | O_WRONLY, 0644));
    while (!term) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    long start = now_ms();
    int root = 1;
    sh->reported_ms = start;
    __atomic_add_fetch(&sh->live, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        long now = now_ms();
        if (now - start > 5000) _exit(0);
        long last = __atomic_load_n(&sh->reported_ms, __ATOMIC_SEQ_CST);
        if (last >= 0 && now - last >= 50 &&
            __atomic_compare_exchange_n(&sh->reported_ms, &last, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            report(argv[5], __atomic_load_n(&sh->forks, __ATOMIC_SEQ_CST));
        if (__atomic_load_n(&sh->forks, __ATOMIC_SEQ_CST) >= total) {
            if (!root) _exit(0);
            if (__atomic_exchange_n(&sh->reported_ms, -1, __ATOMIC_SEQ_CST) != -1) report(argv[5], total);
            usleep(1000);
        } else if (__atomic_load_n(&sh->forks, __ATOMIC_SEQ_CST) > (now - start) * 10 + 100) {
            usleep(200); /* ahead of the rate: keep going through the deadline */
        } else if (__atomic_load_n(&sh->live, __ATOMIC_SEQ_CST) < cap) {
            pid_t p = fork();
            if (p == 0) {
                root = 0;
                __atomic_add_fetch(&sh->live, 1, __ATOMIC_SEQ_CST);
                __atomic_add_fetch(&sh->forks, 1, __ATOMIC_SEQ_CST);
                if (use_setsid) setsid();
                continue;
            }
            if (p < 0) usleep(1000);
        } else if (!root) {
            __atomic_sub_fetch(&sh->live, 1, __ATOMIC_SEQ_CST);
            _exit(0);
        } else {
            usleep(100);
        }
    }
}
