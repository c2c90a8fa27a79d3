/* orphans TOTAL BATCH DONE: a worker that makes TOTAL short-lived orphans for
 * its init to reap. Per batch it forks an intermediate that starts BATCH
 * grandchildren and exits without waiting for them, so they are reparented to
 * drainit (PID 1 or subreaper): most (vfork + _exit) are zombies by then, every
 * eighth (fork + a 1ms sleep) is still alive. The worker reaps only its
 * intermediates. It writes "TOTAL ELAPSED_MS" to DONE, then waits for SIGTERM
 * and exits 0. Forks that fail with EAGAIN (a full pid space on a shared
 * machine) are retried. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t term;
static void on_term(int sig) { (void)sig; term = 1; }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static pid_t retry_fork(void) {
    for (;;) {
        pid_t p = fork();
        if (p >= 0 || errno != EAGAIN) return p;
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    long total = atol(argv[1]), batch = atol(argv[2]);
    signal(SIGTERM, on_term);
    double t0 = now_ms();
    long made = 0;
    while (made < total) {
        long n = total - made < batch ? total - made : batch;
        pid_t mid = retry_fork();
        if (mid < 0) return 125;
        if (mid == 0) {
            for (long i = 0; i < n; i++) {
                pid_t g;
                if (i % 8 == 7) {
                    g = retry_fork();
                    if (g == 0) {
                        usleep(1000);
                        _exit(0);
                    }
                } else {
                    /* vfork is called here, not in a helper: a vfork child
                     * must not return from the function that called it. */
                    while ((g = vfork()) < 0 && errno == EAGAIN) usleep(1000);
                    if (g == 0) _exit(0);
                }
                if (g < 0) _exit(125);
            }
            _exit(0);
        }
        int st;
        while (waitpid(mid, &st, 0) < 0 && errno == EINTR) {}
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 124;
        made += n;
    }
    /* SIGTERM blocked until sigsuspend: the test signals as soon as the
     * report exists, and a SIGTERM handled between the check of `term` and
     * a pause() would leave it sleeping. */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, &old);
    FILE *f = fopen(argv[3], "w");
    fprintf(f, "%ld %.0f\n", made, now_ms() - t0);
    fclose(f);
    while (!term) sigsuspend(&old);
    return 0;
}
