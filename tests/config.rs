//! Bad configuration: one clear line naming the value and why, exit 2, and
//! the worker never starts. Flags beat variables.

mod kit;
use kit::*;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

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

cases! {
    fn bad_value_exits_2_with_one_line_and_no_worker(args: &[&str], env: &[(&str, &str)], needle: &str) {
        assert_refused(args, env, needle);
    }
    case grace_not_a_duration(&["--grace", "abc"], &[], "--grace 'abc'");
    case grace_negative_joined(&["--grace=-1s"], &[], "--grace '-1s'");
    case grace_negative(&["--grace", "-1s"], &[], "--grace '-1s'");
    case grace_too_long_for_the_default_timeout(&["--grace", "10s"], &[], "at most 9s");
    case grace_equal_to_the_timeout(&["--grace", "25s", "--orchestrator-timeout", "25s"], &[], "at most 24s");
    case timeout_under_a_second(&["--orchestrator-timeout", "0.5"], &[], "--orchestrator-timeout '0.5'");
    case rewrite_unknown_signal(&["--rewrite", "TERM:NOPE"], &[], "'NOPE'");
    case rewrite_without_target(&["--rewrite", "TERM"], &[], "FROM:TO");
    case rewrite_of_sigkill(&["--rewrite", "KILL:TERM"], &[], "SIGKILL");
    case backoff_code_0(&["--backoff-exit-code", "0"], &[], "1 to 255");
    case backoff_code_256(&["--backoff-exit-code", "256"], &[], "1 to 255");
    case backoff_code_not_a_number(&["--backoff-exit-code", "x"], &[], "'x'");
    case backoff_delay_not_a_duration(&["--backoff-delay", "soon"], &[], "--backoff-delay 'soon'");
    case backoff_delay_zero(&["--backoff-delay", "0"], &[], "more than 0");
    case backoff_timeout_garbage(&["--backoff-timeout", "1y2"], &[], "--backoff-timeout");
    case watchdog_under_1ms(&["--watchdog", "1ns"], &[], "--watchdog '1ns': must be at least 1ms");
    case ready_timeout_under_1ms(&["--ready-timeout", "999us"], &[], "--ready-timeout '999us': must be at least 1ms");
    case watchdog_variable_under_1ms(&[], &[("DRAINIT_WATCHDOG", "500us")], "DRAINIT_WATCHDOG '500us': must be at least 1ms");
    case unknown_flag(&["--nope"], &[], "--nope");
    case grace_variable_not_a_duration(&[], &[("DRAINIT_GRACE", "abc")], "DRAINIT_GRACE 'abc'");
    case grace_variable_empty(&[], &[("DRAINIT_GRACE", "")], "DRAINIT_GRACE is set but empty");
    case timeout_variable_empty(
        &[],
        &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "")],
        "DRAINIT_ORCHESTRATOR_TIMEOUT is set but empty",
    );
    case grace_variable_equal_to_the_timeout(
        &[],
        &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("DRAINIT_GRACE", "5s")],
        "DRAINIT_GRACE '5s'",
    );
    case rewrite_variable_half_bad(&[], &[("DRAINIT_REWRITE", "TERM:QUIT,USR1")], "DRAINIT_REWRITE 'USR1'");
    case backoff_codes_variable_out_of_range(
        &[],
        &[("DRAINIT_BACKOFF_EXIT_CODES", "75,300")],
        "DRAINIT_BACKOFF_EXIT_CODES '300'",
    );
    case backoff_codes_variable_empty(&[], &[("DRAINIT_BACKOFF_EXIT_CODES", "")], "empty");
    case log_filter_garbage(&[], &[("DRAINIT_LOG", "loud=yes")], "DRAINIT_LOG");
}

cases! {
    /// A value that is not UTF-8 is a bad value: exit 2 and one line naming
    /// the flag or variable.
    fn a_non_utf8_value_is_named(flag: Option<&str>, var: Option<&str>) {
        let bad = OsStr::from_bytes(b"\xff");
        let mut args = Vec::new();
        if let Some(flag) = flag {
            args.extend([OsStr::new(flag), bad]);
        }
        args.extend([OsStr::new("--"), OsStr::new("true")]);
        let mut builder = drainit(Mode::Subreaper, args);
        if let Some(var) = var {
            builder = builder.env(var, bad);
        }
        let mut run = builder.spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(2), "{log}");
        one_clear_line(&log, flag.or(var).unwrap()).unwrap();
        assert_eq!(run.count_events("child_started"), 0, "{log}");
    }
    case grace_flag(Some("--grace"), None);
    case grace_variable(None, Some("DRAINIT_GRACE"));
    case rewrite_variable(None, Some("DRAINIT_REWRITE"));
    case log_variable(None, Some("DRAINIT_LOG"));
}

const HUGE: &str = "10000000000000000000"; // seconds: fits a Duration, not an Instant

cases! {
    /// A duration that parses but overflows the clock must be refused (exit
    /// 2, one line) or work; never a panic. The worker asks for a huge
    /// retry-after on its first attempt too.
    fn an_enormous_duration_never_panics(options: &[&str], var: Option<&str>) {
        let dir = Scratch::new("huge");
        let rec = Recorder::new(&dir, "w")
            .per_attempt()
            .exit_after(0, 3)
            .on_attempt(1, |r| r.exit_after(0, 75).retry_after(HUGE));
        let mut builder = drainit(Mode::Subreaper, rec.worker_with(options));
        if let Some(var) = var {
            builder = builder.env(var, HUGE);
        }
        let mut run = builder.spawn();
        // Refused at once, or working: a backoff sleep of 300 billion years
        // (or a clamped one), which SIGTERM ends.
        assert!(
            wait_until(secs(10), || run.try_ended() || run.event("backoff").is_some()),
            "neither refused nor backing off: {}",
            run.log()
        );
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let log = run.log();
        assert!(!log.contains("panicked"), "{log}");
        match ended.code {
            Some(2) => one_clear_line(&log, "error").unwrap(),
            Some(code) => check_log_end(&log, code).unwrap(),
            None => panic!("drainit died of signal {:?}: {log}", ended.signal),
        }
    }
    case timeout_flag(&["--orchestrator-timeout", HUGE], None);
    case timeout_variable(&[], Some("DRAINIT_ORCHESTRATOR_TIMEOUT"));
    case backoff_max_delay_and_timeout(
        &["--backoff-max-delay", HUGE, "--backoff-timeout", "18000000000000000000"],
        None,
    );
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
    check_log_end(&stderr, 0).unwrap();
}

cases! {
    fn durations_accept_bare_seconds_and_humantime(args: &[&str], env: &[(&str, &str)]) {
        let (code, stderr, ran) = attempt(args, env);
        assert_eq!((code, ran), (Some(0), true), "{args:?} {env:?}: {stderr}");
    }
    case bare_seconds(&["--grace", "2"], &[]);
    case minutes(&["--grace", "1m", "--orchestrator-timeout", "90s"], &[]);
    case minutes_and_seconds(&["--orchestrator-timeout", "1m30s"], &[]);
    case by_variables(&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "30s"), ("DRAINIT_GRACE", "29s")]);
    case milliseconds(&[], &[("DRAINIT_GRACE", "500ms")]);
    // A base delay above the max delay is capped, not refused.
    case delay_above_the_max(&["--backoff-delay", "1m"], &[]);
    case max_delay_variable_below_the_default_delay(&[], &[("DRAINIT_BACKOFF_MAX_DELAY", "0.5")]);
}

cases! {
    fn default_grace_is_orchestrator_timeout_minus_one_second(args: &[&str], env: &[(&str, &str)], want: &str) {
        let mut all: Vec<&str> = vec!["-v"];
        all.extend(args);
        let (code, stderr, _) = attempt(&all, env);
        assert_eq!(code, Some(0), "{stderr}");
        // The start-up line (-v) says which grace is in force.
        let graces: Vec<String> = parse_events(&stderr).iter().filter_map(|e| Some(e.get("grace")?.to_string())).collect();
        assert_eq!(graces, [want], "{args:?} {env:?}: {stderr}");
    }
    case docker_default(&[], &[], "9s");
    case by_flag(&["--orchestrator-timeout", "30s"], &[], "29s");
    case by_variable(&[], &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")], "4s");
}

#[test]
fn help_names_every_flag_and_variable() {
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
}

#[test]
fn version() {
    let out = std::process::Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("drainit "));
}
