/* sigrec DIR: the tests' worker. It records every signal it is sent and
 * behaves as DIR/config says (tests/kit/recorder.rs writes it).
 *
 * Config, one setting per line (a line `@N SETTING` applies only when
 * DRAINIT_ATTEMPT is N):
 *   term exit|record|ignore|default   SIGTERM: ends it (default), is only
 *                                      recorded, is ignored (SIG_IGN), or
 *                                      keeps its default action (death)
 *   exit_on SIG        SIG ends it too, like `term exit`
 *   die_on SIG         SIG is recorded, then kills it (its default action:
 *                      drainit sees a death by SIG) after `exit` says so
 *   default SIG        SIG keeps its default action and is not recorded
 *   code N             the exit code when a signal ends it (0)
 *   linger MS          after an ending signal, record MS ms more, then exit
 *   exit_after MS N    exit N by itself MS ms after it is ready
 *   retry_after TEXT   just before exit_after, write TEXT to
 *                      $DRAINIT_RETRY_AFTER_FILE
 *   setsid             leave the process group and session first
 *   orphan             fork; the parent exits once the child is ready, so
 *                      that the recorder is an orphan (a double fork)
 *   child DIR2         start `sigrec DIR2` as a child (same group) before
 *                      being ready, and wait until it is ready
 *   child_on_stop DIR2 the same, when an ending signal comes (before exit)
 *   per_attempt        outputs go to DIR/attempt-$DRAINIT_ATTEMPT
 *
 * Outputs, in DIR (or DIR/attempt-N):
 *   stat     /proc/self/stat as the first instruction saw it
 *   pid      its pid (after orphan/setsid)
 *   ready    created once every handler is in place and children are
 *            ready; it holds CLOCK_MONOTONIC then, in ns
 *   seen     "SIG COUNT" per signal received, rewritten atomically (all
 *            pending signals are drained first): at once when a new kind
 *            arrives, else at most every 20ms while counts change (a storm
 *            must not turn the recorder into a load of its own)
 *   sequence "SIG NS" per signal received, in the order it took them, NS
 *            the CLOCK_MONOTONIC time it took it; appended just before each
 *            rewrite of `seen` (so it always holds what `seen` counts). The
 *            order is arrival order for signals that come one at a time;
 *            signals pending together come out as the kernel hands them
 *            over: the lowest-numbered standard one first, then real-time
 *            ones in number order (signal(7))
 *   winsize  "ROWS COLS" of the terminal on fd 0, rewritten on each SIGWINCH
 *            before `seen` shows it
 *   exit     how it ended, written just before: "CODE" or "signal SIG",
 *            then CLOCK_MONOTONIC in ns on a second line
 *
 * Signals are blocked and taken with sigtimedwait: no handler, no race, and a
 * stop signal (TSTP, TTIN, TTOU) never stops it. SIGCHLD from its own
 * children (si_code > 0) is not recorded; they are reaped. glibc keeps 32 and
 * 33 for itself: those cannot be recorded. Exit 124: bad config or a child
 * that never became ready. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXSIG 65
#define MAXCHILD 64

enum term { T_EXIT, T_RECORD, T_IGNORE, T_DEFAULT };

static struct {
    enum term term;
    int ends[MAXSIG], dies[MAXSIG], dfl[MAXSIG];
    int code, linger_ms, after_ms, after_code, has_after, do_setsid, orphan, per_attempt;
    char retry_after[256];
    char *children[MAXCHILD], *on_stop[MAXCHILD];
    int nchildren, non_stop;
} cfg;

static char out[4096], self_exe[4096];
static unsigned long counts[MAXSIG];
/* Lines of `sequence` not yet appended. */
static char pending[1 << 16];
static size_t npending;
static int seq_fd = -1;
static int orphan_fd = -1; /* tells the parent left behind by `orphan` */

static void die(const char *what) {
    fprintf(stderr, "sigrec: %s: %s\n", what, strerror(errno));
    _exit(124);
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void put(const char *name, const char *text) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", out, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, getpid());
    int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) die(tmp);
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n) die(tmp);
    close(fd);
    if (rename(tmp, path) != 0) die(path);
}

static void flush_sequence(void) {
    if (!npending) return;
    if (seq_fd < 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/sequence", out);
        seq_fd = open(path, O_CREAT | O_APPEND | O_WRONLY | O_CLOEXEC, 0644);
        if (seq_fd < 0) die(path);
    }
    for (size_t at = 0; at < npending;) {
        ssize_t n = write(seq_fd, pending + at, npending - at);
        if (n <= 0) die("sequence");
        at += n;
    }
    npending = 0;
}

static long long mono_ns(void);

static void note(int sig) {
    if (sizeof pending - npending < 64) flush_sequence();
    npending += snprintf(pending + npending, sizeof pending - npending, "%d %lld\n", sig, mono_ns());
}

static void dump_seen(void) {
    static char text[MAXSIG * 32];
    flush_sequence();
    size_t at = 0;
    text[0] = 0;
    for (int s = 1; s < MAXSIG; s++)
        if (counts[s]) at += snprintf(text + at, sizeof text - at, "%d %lu\n", s, counts[s]);
    put("seen", text);
}

static void dump_winsize(void) {
    struct winsize ws;
    char text[64];
    if (ioctl(0, TIOCGWINSZ, &ws) != 0) return;
    snprintf(text, sizeof text, "%u %u\n", ws.ws_row, ws.ws_col);
    put("winsize", text);
}

static void read_config(const char *dir) {
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/config", dir);
    FILE *f = fopen(path, "r");
    if (!f) return; /* no config: the defaults */
    const char *attempt = getenv("DRAINIT_ATTEMPT");
    while (fgets(line, sizeof line, f)) {
        char *p = line, key[64], arg[256] = "";
        line[strcspn(line, "\n")] = 0;
        if (*p == '@') {
            char *sp = strchr(p, ' ');
            if (!sp) continue;
            *sp = 0;
            if (!attempt || strcmp(p + 1, attempt) != 0) continue;
            p = sp + 1;
        }
        int n = 0;
        if (sscanf(p, "%63s %n", key, &n) != 1) continue;
        snprintf(arg, sizeof arg, "%s", p + n);
        if (!strcmp(key, "term")) {
            cfg.term = !strcmp(arg, "record") ? T_RECORD : !strcmp(arg, "ignore") ? T_IGNORE
                     : !strcmp(arg, "default") ? T_DEFAULT : T_EXIT;
        } else if (!strcmp(key, "exit_on") && atoi(arg) > 0 && atoi(arg) < MAXSIG) {
            cfg.ends[atoi(arg)] = 1;
        } else if (!strcmp(key, "die_on") && atoi(arg) > 0 && atoi(arg) < MAXSIG) {
            cfg.dies[atoi(arg)] = 1;
        } else if (!strcmp(key, "default") && atoi(arg) > 0 && atoi(arg) < MAXSIG) {
            cfg.dfl[atoi(arg)] = 1;
        } else if (!strcmp(key, "code")) {
            cfg.code = atoi(arg);
        } else if (!strcmp(key, "linger")) {
            cfg.linger_ms = atoi(arg);
        } else if (!strcmp(key, "exit_after")) {
            cfg.has_after = sscanf(arg, "%d %d", &cfg.after_ms, &cfg.after_code) == 2;
        } else if (!strcmp(key, "retry_after")) {
            snprintf(cfg.retry_after, sizeof cfg.retry_after, "%s", arg);
        } else if (!strcmp(key, "setsid")) {
            cfg.do_setsid = 1;
        } else if (!strcmp(key, "orphan")) {
            cfg.orphan = 1;
        } else if (!strcmp(key, "per_attempt")) {
            cfg.per_attempt = 1;
        } else if (!strcmp(key, "child") || !strcmp(key, "child_on_stop")) {
            int late = !strcmp(key, "child_on_stop");
            int *n = late ? &cfg.non_stop : &cfg.nchildren;
            if (*n == MAXCHILD) {
                errno = E2BIG;
                die(line);
            }
            (late ? cfg.on_stop : cfg.children)[(*n)++] = strdup(arg);
        } else {
            errno = EINVAL;
            die(line);
        }
    }
    fclose(f);
}

/* Start `sigrec DIR` and wait (at most 10s) until it says it is ready, on a
 * pipe whose write end it inherits (SIGREC_READY_FD). */
static void start_child(const char *dir) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", dup(fds[1])); /* dup: without O_CLOEXEC */
        setenv("SIGREC_READY_FD", fd, 1);
        execl(self_exe, "sigrec", dir, (char *)NULL);
        die(self_exe);
    }
    close(fds[1]);
    struct pollfd p = { .fd = fds[0], .events = POLLIN };
    char c;
    if (poll(&p, 1, 10000) != 1 || read(fds[0], &c, 1) != 1) {
        errno = ETIMEDOUT;
        die(dir);
    }
    close(fds[0]);
}

static void say_ready(void) {
    char text[32];
    snprintf(text, sizeof text, "%lld\n", mono_ns());
    put("ready", text);
    const char *fd = getenv("SIGREC_READY_FD");
    int fds[2] = { fd ? atoi(fd) : -1, orphan_fd };
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) {
            if (write(fds[i], "r", 1) != 1) {}
            close(fds[i]);
        }
    unsetenv("SIGREC_READY_FD");
}

static void reap(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

static long long mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void finish(int code) {
    char text[64];
    dump_seen();
    snprintf(text, sizeof text, "%d\n%lld\n", code, mono_ns());
    put("exit", text);
    _exit(code);
}

/* Die of `sig` as its default action would have it, once that is written. */
static void die_of(int sig) {
    char text[64];
    sigset_t one;
    dump_seen();
    snprintf(text, sizeof text, "signal %d\n%lld\n", sig, mono_ns());
    put("exit", text);
    signal(sig, SIG_DFL);
    sigemptyset(&one);
    sigaddset(&one, sig);
    raise(sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    _exit(128 + sig); /* not reached for a signal whose default kills */
}

static void write_retry_after(void) {
    const char *path = getenv("DRAINIT_RETRY_AFTER_FILE");
    if (!cfg.retry_after[0] || !path) return;
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return; /* drainit's business: the file may be unusable */
    if (write(fd, cfg.retry_after, strlen(cfg.retry_after)) < 0) {}
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sigrec DIR\n");
        return 124;
    }
    /* The first instruction's view of itself. */
    char stat[1024] = "";
    int sfd = open("/proc/self/stat", O_RDONLY);
    if (sfd >= 0) {
        ssize_t n = read(sfd, stat, sizeof stat - 1);
        stat[n > 0 ? n : 0] = 0;
        close(sfd);
    }
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0) die("/proc/self/exe");
    self_exe[n] = 0;
    read_config(argv[1]);
    snprintf(out, sizeof out, "%s", argv[1]);
    if (cfg.per_attempt) {
        const char *a = getenv("DRAINIT_ATTEMPT");
        snprintf(out, sizeof out, "%s/attempt-%s", argv[1], a ? a : "0");
        mkdir(out, 0755);
    }
    put("stat", stat);

    if (cfg.orphan) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) die("pipe");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid > 0) {
            close(fds[1]);
            char c;
            struct pollfd p = { .fd = fds[0], .events = POLLIN };
            _exit(poll(&p, 1, 10000) == 1 && read(fds[0], &c, 1) == 1 ? 0 : 124);
        }
        close(fds[0]);
        orphan_fd = fds[1];
    }
    if (cfg.do_setsid && setsid() < 0) die("setsid");

    sigset_t all, wait;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    for (int s = 1; s < MAXSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL); /* 32, 33: EINVAL, fine */
    sigfillset(&wait);
    if (cfg.term == T_EXIT) cfg.ends[SIGTERM] = 1;
    if (cfg.term == T_DEFAULT) cfg.dfl[SIGTERM] = 1;
    sigset_t open_set;
    sigemptyset(&open_set);
    if (cfg.term == T_IGNORE) {
        signal(SIGTERM, SIG_IGN);
        sigaddset(&open_set, SIGTERM);
        sigdelset(&wait, SIGTERM);
    }
    for (int s = 1; s < MAXSIG; s++)
        if (cfg.dfl[s]) {
            sigaddset(&open_set, s);
            sigdelset(&wait, s);
        }

    char text[32];
    snprintf(text, sizeof text, "%d\n", getpid());
    put("pid", text);
    for (int i = 0; i < cfg.nchildren; i++) start_child(cfg.children[i]);
    sigprocmask(SIG_UNBLOCK, &open_set, NULL);
    say_ready();

    long ready_at = now_ms(), stop_at = -1, dumped_at = 0;
    int dirty = 0;
    for (;;) {
        long now = now_ms(), due = -1;
        if (dirty && now - dumped_at >= 20) {
            dump_seen();
            dirty = 0;
            dumped_at = now;
        }
        if (cfg.has_after) due = ready_at + cfg.after_ms;
        if (stop_at >= 0 && (due < 0 || stop_at < due)) due = stop_at;
        if (dirty && (due < 0 || dumped_at + 20 < due)) due = dumped_at + 20;
        if (stop_at >= 0 && now >= stop_at) finish(cfg.code);
        if (cfg.has_after && now >= ready_at + cfg.after_ms) {
            write_retry_after();
            finish(cfg.after_code);
        }
        siginfo_t info;
        int sig;
        if (due < 0) {
            sig = sigwaitinfo(&wait, &info);
        } else {
            long left = due - now;
            struct timespec ts = { left / 1000, (left % 1000) * 1000000 };
            sig = sigtimedwait(&wait, &info, &ts);
        }
        if (sig < 0) continue; /* EAGAIN (a deadline is due) or EINTR */
        /* Drain everything pending, then act. */
        int new_kind = 0, winch = 0, ending = 0, dying = 0;
        struct timespec zero = { 0, 0 };
        do {
            if (sig == SIGCHLD && info.si_code > 0) {
                reap();
                continue;
            }
            note(sig);
            new_kind |= counts[sig]++ == 0;
            dirty = 1;
            winch |= sig == SIGWINCH;
            ending |= cfg.ends[sig];
            if (cfg.dies[sig] && !dying) dying = sig;
        } while ((sig = sigtimedwait(&wait, &info, &zero)) > 0);
        if (winch) dump_winsize();
        if (dying) die_of(dying);
        if (dirty && (new_kind || winch || ending || now_ms() - dumped_at >= 20)) {
            dump_seen();
            dirty = 0;
            dumped_at = now_ms();
        }
        if (ending && stop_at < 0) {
            for (int i = 0; i < cfg.non_stop; i++) start_child(cfg.on_stop[i]);
            stop_at = now_ms() + cfg.linger_ms;
        }
    }
}
