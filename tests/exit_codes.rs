//! drainit exits with the worker's code, 128+N for a death by signal N, and
//! 126/127 when the command cannot run, in both modes.

mod common;
use common::*;

#[test]
fn worker_exit_codes_pass_through() {
    for mode in MODES {
        for code in [0, 1, 42, 75 + 1, 255] {
            let mut run = drainit(mode, sh(&format!("exit {code}"))).spawn();
            let ended = run.wait(secs(10));
            assert_eq!(ended.code, Some(code), "{mode:?} exit {code}; log:\n{}", run.log());
            assert!(run.log().contains(&format!("event=exit code={code}")), "{}", run.log());
        }
    }
}

#[test]
fn death_by_signal_is_128_plus_n() {
    for mode in MODES {
        for (sig, name) in [(libc::SIGKILL, "SIGKILL"), (libc::SIGSEGV, "SIGSEGV"), (libc::SIGUSR2, "SIGUSR2")] {
            let mut run = drainit(mode, sh(&format!("kill -{sig} $$"))).spawn();
            let ended = run.wait(secs(10));
            assert_eq!(ended.code, Some(128 + sig), "{mode:?} {name}; log:\n{}", run.log());
            assert!(run.log().contains(&format!("signal={name} code={}", 128 + sig)), "{}", run.log());
        }
    }
}

#[test]
fn real_time_signal_death() {
    let rtmin = 34; // SIGRTMIN as glibc and bash number it
    let mut run = drainit(Mode::Subreaper, sh(&format!("kill -{} $$", rtmin + 1))).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(128 + rtmin + 1), "{}", run.log());
    assert!(run.log().contains("signal=SIGRTMIN+1"), "{}", run.log());
}

#[test]
fn command_not_found_is_127_and_not_executable_is_126() {
    let dir = Scratch::new("exec");
    let plain = dir.path("not-executable");
    std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
    for mode in MODES {
        for (cmd, code) in [
            ("no-such-command-anywhere".to_string(), 127),
            ("/no/such/path".to_string(), 127),
            (path_str(&plain), 126),
            (path_str(&dir.0), 126),
        ] {
            let mut run = drainit(mode, ["--", &cmd]).spawn();
            let ended = run.wait(secs(10));
            assert_eq!(ended.code, Some(code), "{mode:?} {cmd}; log:\n{}", run.log());
            let log = run.log();
            assert!(log.contains("event=exec_failed") && log.contains(&format!("code={code}")), "{log}");
            assert_eq!(run.count_events("child_started"), 0, "{log}");
        }
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
