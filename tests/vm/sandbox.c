/* sandbox: run PROG as a container runtime would, inside the cgroup v2 VM
 * (tests/vm/): PID 1 of a new PID and mount namespace with its own /proc,
 * its processes in the cgroup CGROUP (a directory under /sys/fs/cgroup that
 * the scenario made, with memory.max and memory.oom.group set), and by
 * default in a cgroup namespace rooted there with the cgroup2 filesystem
 * mounted read-only at /sys/fs/cgroup, as runc and crun mount it: PROG then
 * sees `0::/` in /proc/self/cgroup and its own memory.max at the mount's
 * root.
 *
 *   sandbox [-H] [-p PIDFILE] [-s STATUSFILE] CGROUP PROG [ARGS...]
 *
 *   -H             the host view: no cgroup namespace, /sys/fs/cgroup left
 *                  as the VM mounted it (PROG finds its cgroup by the path
 *                  in /proc/self/cgroup)
 *   -p PIDFILE     PROG's pid as the VM sees it, written once it is forked
 *   -s STATUSFILE  where the status line goes (else stdout)
 *
 * The launcher itself stays in the VM's root cgroup, outside CGROUP, so a
 * group OOM kill (memory.oom.group=1) takes PROG and everything it started
 * but not the launcher: it waits for PROG and writes how PROG ended, one
 * line, `exited N` or `signal N`, and exits 0 (124 when the sandbox could
 * not be set up; the reason on stderr). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "sandbox: %s: %s\n", what, strerror(errno));
    _exit(124);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die(path);
    if (close(fd) != 0) die(path);
}

/* Write TEXT to PATH whole or not at all: a reader waiting for the file
 * never sees half of it. */
static void put(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) die(path);
}

int main(int argc, char **argv) {
    int host_view = 0, opt;
    const char *pidfile = NULL, *statusfile = NULL;
    while ((opt = getopt(argc, argv, "+Hp:s:")) != -1) {
        if (opt == 'H') host_view = 1;
        else if (opt == 'p') pidfile = optarg;
        else if (opt == 's') statusfile = optarg;
        else return 124;
    }
    if (argc - optind < 2) {
        fprintf(stderr, "usage: sandbox [-H] [-p PIDFILE] [-s STATUSFILE] CGROUP PROG [ARGS...]\n");
        return 124;
    }
    const char *cgroup = argv[optind];
    char **prog = argv + optind + 1;
    char procs[4200];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", cgroup);

    /* The launcher's own mount namespace too: the child's mounts must not
     * reach the VM's. */
    if (unshare(CLONE_NEWNS | CLONE_NEWPID) != 0) die("unshare(NEWNS|NEWPID)");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* PID 1 of the new namespace. Into the cgroup first, then the
         * cgroup namespace: its root is the cgroup the caller is in. */
        write_file(procs, "0");
        if (!host_view && unshare(CLONE_NEWCGROUP) != 0) die("unshare(NEWCGROUP)");
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("mount --make-rprivate /");
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) die("mount /proc");
        if (!host_view) {
            if (umount2("/sys/fs/cgroup", MNT_DETACH) != 0) die("umount /sys/fs/cgroup");
            if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
                die("mount cgroup2 read-only at /sys/fs/cgroup");
        }
        execvp(prog[0], prog);
        die(prog[0]);
    }
    char text[32];
    snprintf(text, sizeof text, "%d\n", pid);
    if (pidfile) put(pidfile, text);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (WIFSIGNALED(status)) snprintf(text, sizeof text, "signal %d\n", WTERMSIG(status));
    else snprintf(text, sizeof text, "exited %d\n", WEXITSTATUS(status));
    if (statusfile) put(statusfile, text);
    else if (fputs(text, stdout) < 0 || fflush(stdout) != 0) die("stdout");
    return 0;
}
