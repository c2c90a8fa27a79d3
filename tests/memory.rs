//! Memory on this machine's cgroup v1 (the v2 scenarios run in the VM): OOM
//! kills told and a slow climb turned into an ordinary stop, with drainit a
//! host process in a memory cgroup the test makes (under the test's own, so
//! nothing leaves the machine's accounting), as PID 1 and as subreaper. The
//! bad values of the new flags are refused here too.

mod kit;
use kit::*;

/// A worker that takes `STEP` MiB (touched) every `EVERY` ms up to `MAX`
/// MiB, then waits; on SIGTERM it writes "cleaned" to `FILE` (its cleanup,
/// which an OOM kill never lets run) and exits 0.
const HOG: &str = r#"
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
static volatile sig_atomic_t term;
static void on_term(int sig) { (void)sig; term = 1; }
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    long step = atol(argv[1]) << 20, every = atol(argv[2]), max = atol(argv[3]) << 20;
    signal(SIGTERM, on_term);
    for (long total = 0; total < max && !term; total += step) {
        char *p = malloc(step);
        if (!p) return 4;
        memset(p, 1, step);
        usleep(every * 1000);
    }
    while (!term) pause();
    int fd = open(argv[4], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { write(fd, "cleaned\n", 8); close(fd); }
    return 0;
}
"#;

fn hog() -> String {
    path_str(&c_helper("hog", HOG))
}

/// The finish program: its environment, to `env` in the scratch dir.
fn finish_script(dir: &Scratch) -> String {
    let path = dir.path("finish.sh");
    std::fs::write(&path, format!("#!/bin/sh\nenv > {}\n", dir.path("env").display())).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path_str(&path)
}

fn finish_var(dir: &Scratch, key: &str) -> Option<String> {
    dir.lines("env").into_iter().find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

per_mode! {
    /// The worker OOM-killed: told as such (oom_kill, child_exited oom=1,
    /// exit and termination oom_kills, the finish program's variables) and
    /// exiting --oom-exit-code.
    fn the_worker_oom_killed_is_told(mode) {
        let _heavy = heavy();
        let dir = Scratch::new("oom-worker");
        let cg = Cgroup::new(&format!("worker-{mode:?}"), Some(64));
        std::fs::write(dir.path("termination"), "").unwrap();
        let args = vec![
            "--oom-exit-code".to_string(),
            "3".into(),
            "--finish".into(),
            finish_script(&dir),
            "--termination-log".into(),
            path_str(&dir.path("termination")),
            "--".into(),
            hog(),
            "8".into(),
            "5".into(),
            "400".into(),
            path_str(&dir.path("cleaned")),
        ];
        let mut run = cg.enter(drainit(mode, args)).spawn();
        let ended = run.wait(secs(30));
        let log = run.log();
        assert_eq!(ended.code, Some(3), "--oom-exit-code instead of 137: {log}");
        assert_eq!(cg.oom_kills(), 1, "the kernel's count: {log}");
        let oom = run.event("oom_kill").unwrap_or_else(|| panic!("no oom_kill: {log}"));
        assert_eq!((oom.num("count"), oom.num("total")), (1, 1), "{log}");
        let exited = run.event("child_exited").unwrap();
        assert_eq!((exited.get("signal"), exited.get("oom")), (Some("SIGKILL"), Some("1")), "{log}");
        let exit = run.event("exit").unwrap();
        assert_eq!(exit.get("oom_kills"), Some("1"), "{log}");
        assert_eq!(finish_var(&dir, "DRAINIT_WORKER_STATUS").as_deref(), Some("oom_kill"), "{log}");
        assert_eq!(finish_var(&dir, "DRAINIT_OOM_KILLS").as_deref(), Some("1"));
        assert_eq!(finish_var(&dir, "DRAINIT_EXIT_CODE").as_deref(), Some("3"));
        let message = dir.read("termination");
        assert!(message.contains(" worker=oom_kill ") && message.contains(" oom_kills=1"), "{message}");
        assert!(!dir.exists("cleaned"), "an OOM kill runs no cleanup");
        check_log_end(&log, 3).unwrap();
    }
}

per_mode! {
    /// The OOM killer takes the worker's child (the worker goes on and
    /// exits 3): no longer a silent loss.
    fn a_workers_child_oom_killed_is_told(mode) {
        let _heavy = heavy();
        let dir = Scratch::new("oom-child");
        let cg = Cgroup::new(&format!("child-{mode:?}"), Some(64));
        let script = format!("{} 8 5 400 {}; exit 3", hog(), path_str(&dir.path("cleaned")));
        let mut run = cg.enter(drainit(mode, sh(&script))).spawn();
        let ended = run.wait(secs(30));
        let log = run.log();
        assert_eq!(ended.code, Some(3), "the worker's own code: {log}");
        assert_eq!(cg.oom_kills(), 1, "{log}");
        let oom = run.event("oom_kill").unwrap_or_else(|| panic!("no oom_kill: {log}"));
        assert_eq!(oom.num("total"), 1, "{log}");
        assert_eq!(run.event("child_exited").unwrap().get("oom"), None, "the worker itself exited: {log}");
        assert_eq!(run.event("exit").unwrap().get("oom_kills"), Some("1"), "{log}");
        check_log_end(&log, 3).unwrap();
    }
}

per_mode! {
    /// A worker climbing 2 MiB every 20 ms to 200 MiB under a 64 MiB limit
    /// is stopped before the kill: it drains (its cleanup runs), the finish
    /// program runs with the reason, and the kernel's count does not move.
    fn a_climb_is_turned_into_a_stop(mode) {
        let _heavy = heavy();
        let dir = Scratch::new("memory-stop");
        let cg = Cgroup::new(&format!("climb-{mode:?}"), Some(64));
        let args = vec![
            "--memory-stop".to_string(),
            "50".into(),
            "--memory-check".into(),
            "10ms".into(),
            "--finish".into(),
            finish_script(&dir),
            "--".into(),
            hog(),
            "2".into(),
            "20".into(),
            "200".into(),
            path_str(&dir.path("cleaned")),
        ];
        let mut run = cg.enter(drainit(mode, args)).spawn();
        let ended = run.wait(secs(30));
        let log = run.log();
        assert_eq!(ended.code, Some(143), "never 0 after a stop drainit began: {log}");
        let stop = run.event("memory_stop").unwrap_or_else(|| panic!("no memory_stop: {log}"));
        let (used, limit) = (stop.num("used"), stop.num("limit"));
        assert_eq!((limit, stop.num("percent"), stop.get("signal")), (64 << 20, 50, Some("SIGTERM")), "{log}");
        assert!(used >= 32 << 20 && used < limit, "{log}");
        eprintln!("margin: working set {} MiB of {} MiB at the stop", used >> 20, limit >> 20);
        assert_eq!(cg.oom_kills(), 0, "the stop came before the kill: {log}");
        assert_eq!(run.count_events("oom_kill"), 0, "{log}");
        assert_eq!(dir.read("cleaned"), "cleaned\n", "the worker's cleanup ran");
        assert_eq!(finish_var(&dir, "DRAINIT_STOP_REASON").as_deref(), Some("memory"), "{log}");
        assert_eq!(finish_var(&dir, "DRAINIT_OOM_KILLS").as_deref(), Some("0"));
        check_log_end(&log, 143).unwrap();
    }
}

/// No limit to take a percent of: one warning, and the worker starts.
#[test]
fn no_limit_leaves_the_memory_stop_off() {
    let cg = Cgroup::new("nolimit", None);
    let mut run = cg.enter(drainit(Mode::Subreaper, ["--memory-stop", "50", "--", "true"])).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let off = run.event("memory_stop_off").unwrap_or_else(|| panic!("{}", run.log()));
    assert_eq!(off.get("reason"), Some("no_limit"));
    assert_eq!(run.count_events("memory_stop"), 0);
}

cases! {
    /// Bad values: exit 2, one line naming the flag and its variable.
    fn bad_values_are_refused(flag: &str, value: &str, var: &str) {
        let mut run = drainit(Mode::Subreaper, [flag, value, "--", "true"]).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(2), "{}", run.log());
        let log = run.log();
        one_clear_line(&log, flag).unwrap();
        one_clear_line(&log, var).unwrap();
    }
    case memory_stop_0("--memory-stop", "0", "DRAINIT_MEMORY_STOP");
    case memory_stop_100("--memory-stop", "100", "DRAINIT_MEMORY_STOP");
    case memory_stop_abc("--memory-stop", "abc", "DRAINIT_MEMORY_STOP");
    case memory_check_9ms("--memory-check", "9ms", "DRAINIT_MEMORY_CHECK");
    case oom_exit_code_256("--oom-exit-code", "256", "DRAINIT_OOM_EXIT_CODE");
}
