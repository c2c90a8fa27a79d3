//! A worker that asks to be traced (PTRACE_TRACEME, the usual anti-debugging
//! check: it fails when a debugger already traces the program) makes
//! drainit, its parent, its tracer. Each signal it gets then stops it and
//! is reported to drainit as a stop. A stop is never an exit: drainit lets
//! the worker go with its signal, and the worker behaves as without drainit.

mod kit;
use kit::*;

/// `traceme DIR plain|child|exec PROGRAM ARGS...`: PTRACE_TRACEME first, then
/// - plain: DIR/ready, and exit 0 on SIGTERM;
/// - child: start a child that exits 5 at once, and wait for its SIGCHLD
///   (through a handler) and its status before DIR/ready; exit 0 on SIGTERM;
/// - orphan: fork; the parent exits at once, and the child, once it has
///   been reparented (to drainit), asks to be traced and goes on as `child`;
/// - exec: exec PROGRAM (a traced exec reports a SIGTRAP to the tracer).
///
/// Exit 123 when the request to be traced fails, 122 when the child's
/// SIGCHLD or status is not what it should be.
const TRACEME: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t chld;
static void on_chld(int sig) { (void)sig; chld = 1; }
static void on_term(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv) {
    if (argc < 3) return 124;
    if (strcmp(argv[2], "orphan") == 0) {
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) return 125;
        if (pid > 0) _exit(0);
        /* Bounded: the parent is exiting now. */
        for (int i = 0; getppid() == parent; i++) {
            if (i == 10000) return 120;
            usleep(1000);
        }
        argv[2] = "child";
    }
    if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0) { perror("PTRACE_TRACEME"); return 123; }
    if (strcmp(argv[2], "exec") == 0) {
        execvp(argv[3], argv + 3);
        perror("exec");
        return 127;
    }
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_chld;
    sigaction(SIGCHLD, &sa, NULL);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    if (strcmp(argv[2], "child") == 0) {
        pid_t child = fork();
        if (child < 0) return 125;
        if (child == 0) _exit(5);
        while (!chld) sigsuspend(&old);
        int status;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 5) return 122;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/ready", argv[1]);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 121;
    close(fd);
    for (;;) sigsuspend(&old);
}
"#;

fn traceme(dir: &Scratch, how: &[&str]) -> Vec<String> {
    let program = c_helper("traceme", TRACEME);
    let mut argv = vec!["--".to_string(), path_str(&program), dir.str()];
    argv.extend(how.iter().map(|s| s.to_string()));
    argv
}

/// The `child_exited` events, as (code, signal).
fn exits(run: &Running) -> Vec<(Option<String>, Option<String>)> {
    run.events()
        .iter()
        .filter(|e| e.name == "child_exited")
        .map(|e| (e.get("code").map(str::to_string), e.get("signal").map(str::to_string)))
        .collect()
}

per_mode! {
    /// The forwarded SIGTERM stops the traced worker; drainit must pass it
    /// on, not read the stop as an exit with code 15 and SIGKILL the worker
    /// at the deadline.
    fn a_forwarded_stop_signal_reaches_a_traced_worker(mode, how: &str) {
        let dir = Scratch::new("traceme");
        let options = ["--grace", "3s", "--orchestrator-timeout", "5s"];
        let argv: Vec<String> = options.iter().map(|s| s.to_string()).chain(traceme(&dir, &[how])).collect();
        let mut run = drainit(mode, argv).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready") || run.try_ended()), "{mode:?}: {}", run.log());
        assert!(dir.exists("ready"), "{mode:?} {how}: the worker did not get to be ready; log:\n{}", run.log());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?} {how}: the worker's own 0; log:\n{log}");
        assert_eq!(exits(&run), [(Some("0".into()), None)], "{mode:?} {how}: one exit, code 0; log:\n{log}");
        assert_eq!(run.count_events("deadline_reached"), 0, "{mode:?} {how}: {log}");
        check_log_end(&log, 0).unwrap();
    }
    case plain("plain");
    case sigchld_of_its_own_child("child");
}

per_mode! {
    /// A traced exec stops the worker with a SIGTRAP that only a tracer sees
    /// (without one, there is none): letting the worker go must not hand it
    /// that SIGTRAP, which would kill the program just exec'd.
    fn a_traced_exec_runs_the_program(mode) {
        let dir = Scratch::new("traceme-exec");
        let rec = Recorder::new(&dir, "w");
        let mut argv = traceme(&dir, &["exec"]);
        argv.extend(rec.argv());
        let mut run = drainit(mode, argv).spawn();
        assert!(wait_until(secs(10), || rec.is_ready() || run.try_ended()), "{mode:?}: {}", run.log());
        assert!(rec.is_ready(), "{mode:?}: the exec'd recorder never got ready; log:\n{}", run.log());
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(5)), "{mode:?}: {:?}; log:\n{}", rec.seen(), run.log());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: {log}");
        assert_eq!(exits(&run), [(Some("0".into()), None)], "{mode:?}: {log}");
        assert_eq!(rec.exit_code(), Some(0));
    }
}

per_mode! {
    /// An orphan that asks to be traced has drainit as its parent too: its
    /// SIGCHLD and SIGTERM reach it, and it is reaped once, with its code.
    fn a_traced_orphan_is_let_go_and_reaped(mode) {
        let dir = Scratch::new("traceme-orphan");
        let program = c_helper("traceme", TRACEME);
        let rec = Recorder::new(&dir, "w");
        // The orphan (a double fork) writes DIR/ready; the worker waits for
        // SIGTERM as the recorder.
        let script = format!("{} {} orphan; exec {}", path_str(&program), dir.str(), rec.argv().join(" "));
        let mut run = drainit(mode, with_sh(&["-v"], &script)).spawn();
        assert!(rec.wait_ready(secs(10)), "{mode:?}: {}", run.log());
        assert!(wait_until(secs(10), || dir.exists("ready")), "{mode:?}: the orphan never got ready; {}", run.log());
        // The orphan gets the group's SIGTERM too (it stays in the
        // worker's group) and exits 0 on it.
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: {log}");
        assert_eq!(exits(&run), [(Some("0".into()), None)], "{mode:?}: {log}");
        let reaped: Vec<String> =
            run.events().iter().filter(|e| e.name == "reaped").map(|e| e["code"].to_string()).collect();
        assert_eq!(reaped, ["0"], "{mode:?}: the orphan reaped once, with 0 (no stop read as an exit); log:\n{log}");
    }
}

per_mode! {
    /// A real-time signal (which nix's Signal enum cannot name) is passed on
    /// as it came: its default action ends the traced worker, as it would
    /// without drainit.
    fn a_real_time_signal_is_passed_on(mode) {
        let dir = Scratch::new("traceme-rt");
        let mut run = drainit(mode, traceme(&dir, &["plain"])).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready") || run.try_ended()), "{mode:?}: {}", run.log());
        assert!(dir.exists("ready"), "{mode:?}: {}", run.log());
        run.signal(libc::SIGRTMIN() + 6);
        let ended = run.wait(secs(10));
        let log = run.log();
        let sig = libc::SIGRTMIN() + 6;
        assert_eq!(ended.code, Some(128 + sig), "{mode:?}: {log}");
        assert_eq!(run.count_events("child_exited"), 1, "{mode:?}: {log}");
    }
}
