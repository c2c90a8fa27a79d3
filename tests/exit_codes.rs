//! drainit exits with the worker's code, 128+N for a death by signal N, and
//! 126/127 when the command cannot run, in both modes.

mod kit;
use kit::*;

per_mode! {
    fn worker_exit_code_passes_through(mode, code: i32) {
        let mut run = drainit(mode, sh(&format!("exit {code}"))).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(code), "{mode:?} exit {code}; log:\n{}", run.log());
        check_log_end(&run.log(), code).unwrap();
    }
    case exit_0(0);
    case exit_1(1);
    case exit_42(42);
    case exit_76(76); // not 75: that one is the default backoff code
    case exit_255(255);
}

per_mode! {
    fn death_by_signal_is_128_plus_n(mode, sig: i32, name: &str) {
        let mut run = drainit(mode, sh(&format!("kill -{sig} $$"))).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(128 + sig), "{mode:?} {name}; log:\n{}", run.log());
        let exited = run.event("child_exited").unwrap_or_else(|| panic!("{}", run.log()));
        assert_eq!((&exited["signal"], exited.num("code")), (name, 128 + sig as i64), "{}", run.log());
    }
    case sigkill(libc::SIGKILL, "SIGKILL");
    case sigsegv(libc::SIGSEGV, "SIGSEGV");
    case sigusr2(libc::SIGUSR2, "SIGUSR2");
}

#[test]
fn real_time_signal_death() {
    let rtmin = 34; // SIGRTMIN as glibc and bash number it
    let mut run = drainit(Mode::Subreaper, sh(&format!("kill -{} $$", rtmin + 1))).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(128 + rtmin + 1), "{}", run.log());
    assert_eq!(run.event("child_exited").map(|e| e["signal"].to_string()).as_deref(), Some("SIGRTMIN+1"));
}

/// What an exec failure looks like: `code`, one exec_failed, no worker.
fn exec_fails(run: Builder, code: i32) {
    let mut run = run.spawn();
    let ended = run.wait(secs(10));
    let log = run.log();
    assert_eq!(ended.code, Some(code), "{log}");
    let failed = run.event("exec_failed").unwrap_or_else(|| panic!("{log}"));
    assert_eq!(failed.num("code"), code as i64, "{log}");
    assert_eq!(run.count_events("exec_failed"), 1, "{log}");
    assert_eq!(run.count_events("child_started"), 0, "{log}");
    check_log_end(&log, code).unwrap();
}

per_mode! {
    fn command_not_found_is_127(mode, cmd: &str) {
        exec_fails(drainit(mode, ["--", cmd]), 127);
    }
    case in_path("no-such-command-anywhere");
    case by_path("/no/such/path");
}

per_mode! {
    fn a_file_without_exec_permission_is_126(mode) {
        let dir = Scratch::new("exec");
        let plain = dir.path("not-executable");
        std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
        exec_fails(drainit(mode, ["--", &path_str(&plain)]), 126);
    }
}

per_mode! {
    fn a_directory_is_126(mode, cmd: &str) {
        exec_fails(drainit(mode, ["--", cmd]), 126);
    }
    case root("/");
    case dot(".");
}

per_mode! {
    fn a_directory_by_path_is_126(mode) {
        let dir = Scratch::new("dir-cmd");
        exec_fails(drainit(mode, ["--", &dir.str()]), 126);
    }
}

per_mode! {
    /// Found in PATH, but a directory.
    fn a_directory_in_path_is_126(mode) {
        let dir = Scratch::new("dir-cmd");
        std::fs::create_dir(dir.path("tool")).unwrap();
        let path = format!("{}:{}", dir.str(), std::env::var("PATH").unwrap_or_default());
        exec_fails(drainit(mode, ["--", "tool"]).env("PATH", path), 126);
    }
}

#[test]
fn worker_exiting_127_by_itself_is_not_an_exec_failure() {
    let mut run = drainit(Mode::Subreaper, sh("exit 127")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(127));
    assert_eq!(run.count_events("exec_failed"), 0, "{}", run.log());
    assert_eq!(run.count_events("child_exited"), 1, "{}", run.log());
}

#[test]
fn path_search_and_arguments_without_a_shell() {
    let dir = Scratch::new("argv");
    let out = dir.path("argv");
    let mut run = drainit(
        Mode::Subreaper,
        ["--", "sh", "-c", "printf '%s|' \"$@\" > \"$0\"", &path_str(&out), "a b", "--grace", "-q", "*"],
    )
    .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(dir.read("argv"), "a b|--grace|-q|*|");
}
