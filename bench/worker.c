/* bench/worker.c: the worker process that bench/run starts under each init.
 *
 * Built by bench/run with gcc; not part of drainit.
 *
 *   worker sig FIFO       open FIFO for writing, install a SIGUSR1 handler that
 *                         writes CLOCK_MONOTONIC (u64 ns) to FIFO, write a
 *                         ready marker (u64 0), then pause() forever.  SIGTERM
 *                         keeps its default action: the worker dies at once.
 *   worker ignterm FIFO   like sig, but SIGTERM is ignored (deadline test).
 *   worker reap N OUT     make N orphans that all exit at the same moment and
 *                         time until every one of them has been reaped by the
 *                         init; writes "forked=N reaped_ms=X" to OUT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int out_fd = -1;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_usr1(int sig) {
    (void)sig;
    int saved = errno;
    uint64_t t = now_ns(); /* clock_gettime and write are async-signal-safe */
    ssize_t r = write(out_fd, &t, sizeof t);
    (void)r;
    errno = saved;
}

static int wait_mode(const char *fifo, int ignore_term) {
    out_fd = open(fifo, O_WRONLY | O_CLOEXEC);
    if (out_fd < 0) {
        perror("worker: open fifo");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    if (ignore_term)
        signal(SIGTERM, SIG_IGN);
    uint64_t ready = 0;
    if (write(out_fd, &ready, sizeof ready) != sizeof ready)
        return 1;
    for (;;)
        pause();
}

static int reap_mode(long n, const char *out) {
    /* Shared table where the spawner records the orphans' pids. */
    pid_t *pids = mmap(NULL, (size_t)n * sizeof(pid_t), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    long *forked = mmap(NULL, sizeof(long), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (pids == MAP_FAILED || forked == MAP_FAILED) {
        perror("worker: mmap");
        return 1;
    }
    int go[2];
    if (pipe(go) < 0) {
        perror("worker: pipe");
        return 1;
    }
    uint64_t tf = now_ns();
    pid_t s = fork();
    if (s < 0) {
        perror("worker: fork");
        return 1;
    }
    if (s == 0) {
        /* Spawner: fork N children blocked on the go pipe, then exit so that
         * they are orphaned (reparented to the init, PID 1). */
        close(go[1]);
        long i;
        for (i = 0; i < n; i++) {
            pid_t p = fork();
            if (p == 0) {
                char c;
                while (read(go[0], &c, 1) < 0 && errno == EINTR)
                    ;
                _exit(0);
            }
            if (p < 0)
                break;
            pids[i] = p;
        }
        *forked = i;
        _exit(0);
    }
    close(go[0]);
    int st;
    while (waitpid(s, &st, 0) < 0 && errno == EINTR)
        ;
    long left = *forked;
    uint64_t tf1 = now_ns();

    /* A pidfd per orphan tells when it has exited (readable from the moment
     * it is a zombie): the kernel's share of the work, a floor for any init.
     * Optional: without pidfds, exited_ms is reported as -1. */
    /* Without CAP_SYS_RESOURCE the hard RLIMIT_NOFILE may be a little short
     * of N: then the floor is taken over the first (hard - 64) orphans. */
    long npfd = left;
    struct rlimit rl = {(rlim_t)left + 64, (rlim_t)left + 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if ((long)rl.rlim_cur - 64 < npfd)
            npfd = (long)rl.rlim_cur - 64;
    }
    int *pfd = calloc((size_t)left + 1, sizeof(int));
    int have_pfd = pfd && npfd > 0;
    for (long j = 0; have_pfd && j < npfd; j++) {
        pfd[j] = (int)syscall(SYS_pidfd_open, pids[j], 0);
        if (pfd[j] < 0)
            have_pfd = 0;
    }
    usleep(100000); /* let the fork storm settle */

    /* Release all orphans at once: closing the only write end gives every
     * blocked read() EOF.  A pid is gone once kill(pid, 0) says ESRCH (a
     * zombie still answers 0); pids only grow in a fresh namespace, so there
     * is no reuse within the test.  Wait for the pids one after the other:
     * each finished pid is checked once, so the poller stays cheap (it must
     * not steal the CPU from the init it measures). */
    uint64_t t0 = now_ns();
    close(go[1]);
    uint64_t deadline = t0 + 60ull * 1000000000ull;
    struct timespec nap = {0, 500000}; /* 0.5 ms between checks */
    uint64_t te = 0;
    long i = 0;
    while (have_pfd && i < npfd) {
        struct pollfd p = {pfd[i], POLLIN, 0};
        if (poll(&p, 1, 0) > 0) {
            i++;
            continue;
        }
        if (now_ns() > deadline)
            break;
        nanosleep(&nap, NULL);
    }
    if (have_pfd)
        te = now_ns();
    i = 0;
    while (i < left) {
        if (kill(pids[i], 0) < 0 && errno == ESRCH) {
            i++;
            continue;
        }
        if (now_ns() > deadline)
            break;
        nanosleep(&nap, NULL);
    }
    left -= i;
    uint64_t t1 = now_ns();
    FILE *f = fopen(out, "w");
    if (!f) {
        perror("worker: open out");
        return 1;
    }
    fprintf(f, "forked=%ld left=%ld reaped_ms=%.3f exited_ms=%.3f fork_ms=%.3f\n",
            *forked, left, (double)(t1 - t0) / 1e6,
            te ? (double)(te - t0) / 1e6 : -1.0, (double)(tf1 - tf) / 1e6);
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "sig") == 0)
        return wait_mode(argv[2], 0);
    if (argc >= 3 && strcmp(argv[1], "ignterm") == 0)
        return wait_mode(argv[2], 1);
    if (argc >= 4 && strcmp(argv[1], "reap") == 0)
        return reap_mode(atol(argv[2]), argv[3]);
    fprintf(stderr, "usage: worker sig FIFO | ignterm FIFO | reap N OUT\n");
    return 2;
}
