/* climber: a worker whose memory climbs, for the cgroup v2 VM (tests/vm/).
 *
 *   climber STEP_MIB EVERY_MS MAX_MIB PROGRESS_FILE
 *
 * Every EVERY_MS ms (on a schedule from its start: a step that took
 * longer is not followed by a full wait) it maps STEP_MIB MiB more of anonymous memory, faulted
 * in by the kernel at once (MAP_POPULATE: under TCG a page fault a page
 * would make the climb the emulator's speed, not the test's) and written
 * (so it is charged to its cgroup and resident), until it holds
 * MAX_MIB MiB; then it waits for a signal. After each step it appends
 * `MIB MS` to PROGRESS_FILE (MS since its start, CLOCK_MONOTONIC): what it
 * held when the OOM killer or a stop came is the file's last line.
 *
 * SIGTERM stops the climb: it appends `term MIB MS`, frees what it holds,
 * appends `exit 0 MS` and exits 0 (the worker that cleans up when asked).
 * Without a SIGTERM it ends only by a signal's default action: the OOM
 * killer's SIGKILL. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int progress = -1;
static struct timespec start;

static long elapsed_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - start.tv_sec) * 1000 + (t.tv_nsec - start.tv_nsec) / 1000000;
}

static void note(const char *fmt, long a, long b) {
    char line[96];
    int n = snprintf(line, sizeof line, fmt, a, b);
    if (write(progress, line, n) != n) _exit(124);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: climber STEP_MIB EVERY_MS MAX_MIB PROGRESS_FILE\n");
        return 124;
    }
    long step = atol(argv[1]), every = atol(argv[2]), max = atol(argv[3]);
    clock_gettime(CLOCK_MONOTONIC, &start);
    progress = open(argv[4], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (progress < 0 || step <= 0 || every < 0 || max < step) {
        fprintf(stderr, "climber: bad arguments or %s: %s\n", argv[4], strerror(errno));
        return 124;
    }
    /* SIGTERM taken synchronously: checked between steps, and waited for
     * once the climb is over. */
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);

    long held = 0;
    char **chunks = calloc(max / step + 1, sizeof *chunks);
    int n = 0;
    for (;;) {
        long left = (n + 1) * every - elapsed_ms();
        if (left < 0) left = 0;
        struct timespec wait = { left / 1000, (left % 1000) * 1000000 };
        siginfo_t info;
        int got = held < max ? sigtimedwait(&term, &info, &wait) : sigwaitinfo(&term, &info);
        if (got == SIGTERM) {
            note("term %ld %ld\n", held, elapsed_ms());
            for (int i = 0; i < n; i++) munmap(chunks[i], step << 20);
            note("exit %ld %ld\n", 0, elapsed_ms());
            return 0;
        }
        if (held >= max) continue;
        char *p = mmap(NULL, step << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) {
            note("mmap_failed %ld %ld\n", held, elapsed_ms());
            continue;
        }
        for (long off = 0; off < step << 20; off += 4096) p[off] = 1;
        chunks[n++] = p;
        held += step;
        note("%ld %ld\n", held, elapsed_ms());
    }
}
