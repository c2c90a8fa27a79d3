/* bench/stop-split.c: bench/run's shutdown row split in two, to see where an
 * init spends it (bench/RESULTS.md, issue 19): from the SIGTERM sent to the
 * init until its worker has the signal, and from then until the init is
 * gone (the worker exits at once in its handler).
 *
 *   stop-split ROUNDS 'INIT-PREFIX' ...
 *   e.g. stop-split 300 'catatonit --' 'drainit --' 'env TMPDIR=/dev/shm drainit --'
 *
 * Each prefix is run with `sh -c 'exec PREFIX SELF worker'`, the rounds
 * interleaved over the prefixes; stdin is /dev/null, the worker reports on
 * fd 3 (a pipe every init here passes on). Prints medians. Build: gcc -O2
 * -o stop-split bench/stop-split.c; run as bench/run is run. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_INITS 16
#define MAX_ROUNDS 5000

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void on_term(int sig) {
    (void)sig;
    long long t = now();
    (void)!write(3, &t, sizeof t);
    _exit(0);
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static long long median(long long *xs, int n) {
    qsort(xs, n, sizeof *xs, cmp);
    return xs[n / 2];
}

static long long to_worker[MAX_INITS][MAX_ROUNDS], to_gone[MAX_INITS][MAX_ROUNDS];

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "worker") == 0) {
        signal(SIGTERM, on_term);
        long long ready = 0;
        (void)!write(3, &ready, sizeof ready);
        for (;;)
            pause();
    }
    int rounds = argc > 2 ? atoi(argv[1]) : 0, inits = argc - 2;
    if (rounds < 1 || rounds > MAX_ROUNDS || inits > MAX_INITS) {
        fprintf(stderr, "usage: stop-split ROUNDS 'INIT-PREFIX'... (at most %d rounds, %d inits)\n", MAX_ROUNDS,
                MAX_INITS);
        return 2;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        return 1;
    self[len] = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < inits; i++) {
            char cmd[8192];
            snprintf(cmd, sizeof cmd, "exec %s %s worker", argv[i + 2], self);
            int p[2];
            if (pipe(p) != 0)
                return 1;
            pid_t init = fork();
            if (init == 0) {
                close(p[0]);
                if (p[1] != 3) {
                    dup2(p[1], 3);
                    close(p[1]);
                }
                execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
                _exit(127);
            }
            close(p[1]);
            long long ready, got = 0;
            if (read(p[0], &ready, sizeof ready) != sizeof ready) {
                fprintf(stderr, "stop-split: %s: the worker never reported ready\n", argv[i + 2]);
                return 1;
            }
            usleep(10000); /* let the init settle into its wait */
            long long t0 = now();
            kill(init, SIGTERM);
            if (read(p[0], &got, sizeof got) != sizeof got)
                got = 0;
            int status;
            waitpid(init, &status, 0);
            long long t2 = now();
            close(p[0]);
            if (got == 0) {
                fprintf(stderr, "stop-split: %s: the worker never reported SIGTERM\n", argv[i + 2]);
                return 1;
            }
            to_worker[i][r] = got - t0;
            to_gone[i][r] = t2 - got;
        }
    }
    printf("%-50s %16s %16s %10s\n", "init (median of rounds)", "SIGTERM->worker", "worker->gone", "total");
    for (int i = 0; i < inits; i++) {
        long long total[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            total[r] = to_worker[i][r] + to_gone[i][r];
        long long a = median(to_worker[i], rounds), b = median(to_gone[i], rounds), c = median(total, rounds);
        printf("%-50.50s %13.1f us %13.1f us %7.1f us\n", argv[i + 2], a / 1e3, b / 1e3, c / 1e3);
    }
    return 0;
}
