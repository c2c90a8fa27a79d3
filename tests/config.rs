//! Bad configuration: one clear line naming the value and why, exit 2, and
//! the worker never starts. Flags beat variables.

mod common;
use common::*;

/// Run drainit with `args` and `env`, the worker touching a file; returns
/// (exit code, stderr, whether the worker ran).
fn attempt(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, bool) {
    let dir = Scratch::new("config");
    let marker = path_str(&dir.path("ran"));
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--".into(), "touch".into(), marker]);
    let mut builder = drainit(Mode::Subreaper, all);
    for (k, v) in env {
        builder = builder.env(k, v);
    }
    let mut run = builder.spawn();
    let ended = run.wait(secs(10));
    (ended.code, run.log(), dir.exists("ran"))
}

#[test]
fn bad_values_exit_2_with_one_line_and_no_worker() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--grace", "abc"], &[], "--grace 'abc'"),
        (&["--grace=-1s"], &[], "--grace '-1s'"),
        (&["--grace", "-1s"], &[], "--grace '-1s'"),
        (&["--grace", "10s"], &[], "at most 9s"),
        (&["--grace", "25s", "--orchestrator-timeout", "25s"], &[], "at most 24s"),
        (&["--orchestrator-timeout", "0.5"], &[], "--orchestrator-timeout '0.5'"),
        (&["--rewrite", "TERM:NOPE"], &[], "'NOPE'"),
        (&["--rewrite", "TERM"], &[], "FROM:TO"),
        (&["--rewrite", "KILL:TERM"], &[], "SIGKILL"),
        (&["--backoff-exit-code", "0"], &[], "1 to 255"),
        (&["--backoff-exit-code", "256"], &[], "1 to 255"),
        (&["--backoff-exit-code", "x"], &[], "'x'"),
        (&["--backoff-delay", "soon"], &[], "--backoff-delay 'soon'"),
        (&["--backoff-delay", "0"], &[], "more than 0"),
        (&["--backoff-delay", "1m"], &[], "longer than the backoff max delay 30s"),
        (&["--backoff-timeout", "1y2"], &[], "--backoff-timeout"),
        (&["--nope"], &[], "--nope"),
        (&[], &[("DRAINIT_GRACE", "abc")], "DRAINIT_GRACE 'abc'"),
        (&[], &[("DRAINIT_GRACE", "")], "DRAINIT_GRACE is set but empty"),
        (&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "")], "DRAINIT_ORCHESTRATOR_TIMEOUT is set but empty"),
        (&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("DRAINIT_GRACE", "5s")], "DRAINIT_GRACE '5s'"),
        (&[], &[("DRAINIT_REWRITE", "TERM:QUIT,USR1")], "DRAINIT_REWRITE 'USR1'"),
        (&[], &[("DRAINIT_BACKOFF_EXIT_CODES", "75,300")], "DRAINIT_BACKOFF_EXIT_CODES '300'"),
        (&[], &[("DRAINIT_BACKOFF_EXIT_CODES", "")], "empty"),
        (&[], &[("DRAINIT_BACKOFF_MAX_DELAY", "0.5")], "longer than the backoff max delay 500ms"),
        (&[], &[("DRAINIT_LOG", "loud=yes")], "DRAINIT_LOG"),
    ];
    for (args, env, needle) in cases {
        let (code, stderr, ran) = attempt(args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(!ran, "{args:?} {env:?}: the worker ran");
        assert_eq!(stderr.lines().count(), 1, "{args:?} {env:?}: one line, got:\n{stderr}");
        assert!(stderr.starts_with("drainit: error: "), "{stderr}");
        assert!(stderr.contains(needle), "{args:?} {env:?}: {stderr:?} should name {needle:?}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn missing_command_is_an_error() {
    let mut run = drainit(Mode::Subreaper, ["--grace", "1s"]).spawn();
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(2));
    assert!(run.log().contains("COMMAND"), "{}", run.log());
    assert_eq!(run.log().lines().count(), 1);
}

#[test]
fn a_flag_beats_its_variable() {
    // The variable alone would be rejected (grace too long); the flag wins.
    let (code, stderr, ran) = attempt(&["--grace", "2s"], &[("DRAINIT_GRACE", "60s")]);
    assert_eq!((code, ran), (Some(0), true), "{stderr}");
    assert!(stderr.contains("event=exit code=0"));
}

#[test]
fn durations_accept_bare_seconds_and_humantime() {
    for (args, env) in [
        (&["--grace", "2"][..], &[][..]),
        (&["--grace", "1m", "--orchestrator-timeout", "90s"], &[]),
        (&["--orchestrator-timeout", "1m30s"], &[]),
        (&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "30s"), ("DRAINIT_GRACE", "29s")]),
        (&[], &[("DRAINIT_GRACE", "500ms")]),
    ] {
        let (code, stderr, ran) = attempt(args, env);
        assert_eq!((code, ran), (Some(0), true), "{args:?} {env:?}: {stderr}");
    }
}

#[test]
fn default_grace_is_orchestrator_timeout_minus_one_second() {
    for (args, env, want) in [
        (&[][..], &[][..], "grace=9s"),
        (&["--orchestrator-timeout", "30s"], &[], "grace=29s"),
        (&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")], "grace=4s"),
    ] {
        let mut all: Vec<&str> = vec!["-v"];
        all.extend(args);
        let (code, stderr, _) = attempt(&all, env);
        assert_eq!(code, Some(0));
        assert!(stderr.contains(want), "{args:?} {env:?}: {stderr}");
    }
}

#[test]
fn help_and_version() {
    let out = std::process::Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--grace",
        "DRAINIT_GRACE",
        "--orchestrator-timeout",
        "DRAINIT_ORCHESTRATOR_TIMEOUT",
        "--rewrite",
        "DRAINIT_REWRITE",
        "--backoff-exit-code",
        "DRAINIT_BACKOFF_EXIT_CODES",
        "--backoff-delay",
        "DRAINIT_BACKOFF_DELAY",
        "--backoff-max-delay",
        "DRAINIT_BACKOFF_MAX_DELAY",
        "--backoff-timeout",
        "DRAINIT_BACKOFF_TIMEOUT",
        "DRAINIT_LOG",
        "Exit status",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    let out = std::process::Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("drainit "));
}
