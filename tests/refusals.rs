//! Refusals that say what to change, and the settings that must not refuse
//! (as docker-init, an unknown DRAINIT_* variable): the contract's "A refusal
//! names what to change" and "As Docker's or Podman's init".

mod kit;
use kit::*;

cases! {
    fn refused_naming_what_to_change(args: &[&str], env: &[(&str, &str)], needle: &str) {
        assert_refused(args, env, needle);
    }
    case grace_names_both_settings_and_the_default(
        &["--grace", "10s"],
        &[],
        "--grace '10s': must end at least 1s before the orchestrator timeout, 10s (the default, docker stop's): \
        set --grace or DRAINIT_GRACE to at most 9s, or --orchestrator-timeout or DRAINIT_ORCHESTRATOR_TIMEOUT to at least 11s",
    );
    case grace_names_the_timeout_variable(
        &[],
        &[("DRAINIT_GRACE", "30s"), ("DRAINIT_ORCHESTRATOR_TIMEOUT", "30s")],
        "DRAINIT_GRACE '30s': must end at least 1s before the orchestrator timeout, 30s (from DRAINIT_ORCHESTRATOR_TIMEOUT)",
    );
    case mistyped_flag_gets_the_nearest(&["--grase", "5s"], &[], "did you mean '--grace'?");
    case mistyped_list_flag_gets_the_nearest(&["--backoff-exit-codes", "3"], &[], "did you mean '--backoff-exit-code'?");
    case none_with_codes_by_flag(&["--backoff-exit-code", "none", "--backoff-exit-code", "75"], &[], "'none'");
    case none_with_codes_by_variable(&[], &[("DRAINIT_BACKOFF_EXIT_CODES", "none,75")], "DRAINIT_BACKOFF_EXIT_CODES 'none'");
    // Defect 6: each of these made env_logger log nothing at all.
    case log_warning(&[], &[("DRAINIT_LOG", "warning")], "off, error, warn, info, debug, trace");
    case log_wran(&[], &[("DRAINIT_LOG", "wran")], "did you mean warn?");
    case log_verbose(&[], &[("DRAINIT_LOG", "verbose")], "DRAINIT_LOG 'verbose'");
    case log_other_module(&[], &[("DRAINIT_LOG", "info,hyper=debug")], "'hyper=debug'");
    case watchdog_zero(&["--watchdog", "0"], &[], "--watchdog '0': must be at least 1ms");
    case watchdog_variable_bad(&[], &[("DRAINIT_WATCHDOG", "often")], "DRAINIT_WATCHDOG 'often'");
    case ready_timeout_zero(&[], &[("DRAINIT_READY_TIMEOUT", "0s")], "DRAINIT_READY_TIMEOUT '0s'");
    case ready_file_empty(&[], &[("DRAINIT_READY_FILE", "")], "DRAINIT_READY_FILE is set but empty");
    case watchdog_signal_zero(&["--watchdog-signal", "0"], &[], "--watchdog-signal '0'");
    case watchdog_signal_unknown(&[], &[("DRAINIT_WATCHDOG_SIGNAL", "SIGNOPE")], "DRAINIT_WATCHDOG_SIGNAL 'SIGNOPE'");
}

/// Defect 7: a 100 KiB bad value once filled the 64 KiB log buffer, and the
/// only line out was `log_dropped`. The value is cut; the line gets out.
#[test]
fn a_huge_bad_value_is_cut_and_its_refusal_gets_out() {
    let huge = "x".repeat(100 * 1024);
    assert_refused(&["--grace", &huge], &[], "--grace 'xxxx");
    assert_refused(&[], &[("DRAINIT_REWRITE", &huge)], "DRAINIT_REWRITE 'xxxx");
    assert_refused(&[], &[("DRAINIT_LOG", &huge)], "DRAINIT_LOG 'xxxx");
    assert_refused(&[&format!("--{huge}")], &[], "unexpected argument");
    let mut run = drainit(Mode::Subreaper, ["--grace", &huge, "--", "true"]).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(2));
    let log = run.log();
    assert!(log.len() < 1024 && log.contains("x...'") && !log.contains("log_dropped"), "{log}");
}

/// One warning naming the nearest real variable; the worker still starts.
#[test]
fn an_unknown_drainit_variable_is_one_warning() {
    let dir = Scratch::new("unknown-var");
    let marker = path_str(&dir.path("ran"));
    let mut run = drainit(Mode::Subreaper, ["--", "touch", &marker])
        .env("DRAINIT_GRACE_PERIOD", "5s")
        .env("DRAINIT_ATTEMPT", "3") // set by an outer drainit: no typo
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert!(dir.exists("ran"), "{}", run.log());
    let warnings: Vec<Event> = run.events().into_iter().filter(|e| e.name == "unknown_variable").collect();
    assert_eq!(warnings.len(), 1, "{}", run.log());
    assert_eq!(warnings[0].get("name"), Some("DRAINIT_GRACE_PERIOD"));
    assert_eq!(warnings[0].get("nearest"), Some("DRAINIT_GRACE"));

    // A 100 KiB name is one short line too.
    let name = format!("DRAINIT_{}", "G".repeat(100 * 1024));
    let mut run = drainit(Mode::Subreaper, ["--", "true"]).env(&name, "1").spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let warnings: Vec<Event> = run.events().into_iter().filter(|e| e.name == "unknown_variable").collect();
    assert_eq!(warnings.len(), 1, "{}", run.log());
    assert!(warnings[0].line.len() < 400 && warnings[0].line.contains("GGG..."), "{}", warnings[0].line);
    assert!(!run.log().contains("log_dropped"), "{}", run.log());
}

/// drainit under `name` (a link or a copy, as engines install it) in `dir`.
fn installed_as(dir: &Scratch, name: &str, copy: bool) -> String {
    let path = dir.path(name);
    if copy {
        std::fs::copy(BIN, &path).unwrap();
    } else {
        std::os::unix::fs::symlink(BIN, &path).unwrap();
    }
    path_str(&path)
}

cases! {
    /// In an engine's init slot a program that exits 75 by chance exits 75
    /// once, as under tini; DRAINIT_BACKOFF_EXIT_CODES turns restarts on.
    fn as_an_engine_init_75_is_final(name: &str, copy: bool) {
        let dir = Scratch::new("engine-init");
        let init = installed_as(&dir, name, copy);
        let script = r#"[ "$DRAINIT_ATTEMPT" = 1 ] && exit 75; exit 0"#;
        let argv = |init: &str| [init.to_string()].into_iter().chain(sh(script)).collect::<Vec<_>>();
        let mut run = launch(Mode::Subreaper, argv(&init)).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(75), "{}", run.log());
        assert_eq!(run.count_events("child_started"), 1, "{}", run.log());
        assert_eq!(run.count_events("backoff"), 0, "{}", run.log());

        let mut run = launch(Mode::Subreaper, argv(&init))
            .env("DRAINIT_BACKOFF_EXIT_CODES", "75")
            .env("DRAINIT_BACKOFF_DELAY", "50ms")
            .spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert_eq!(run.count_events("child_started"), 2, "{}", run.log());
        assert_eq!(run.count_events("backoff"), 1, "{}", run.log());
    }
    case docker_init_link("docker-init", false);
    case docker_init_copy("docker-init", true);
    case podman_init_link("podman-init", false);
}

#[test]
fn under_its_own_name_75_restarts() {
    let script = r#"[ "$DRAINIT_ATTEMPT" = 1 ] && exit 75; exit 0"#;
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "50ms"], script)).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(run.count_events("child_started"), 2, "{}", run.log());
}

#[test]
fn none_makes_every_exit_final() {
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-exit-code", "none"], "exit 75")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(75), "{}", run.log());
    assert_eq!(run.count_events("child_started"), 1, "{}", run.log());
    let mut run = drainit(Mode::Subreaper, sh("exit 75")).env("DRAINIT_BACKOFF_EXIT_CODES", "none").spawn();
    assert_eq!(run.wait(secs(10)).code, Some(75), "{}", run.log());
    assert_eq!(run.count_events("child_started"), 1, "{}", run.log());
}

#[test]
fn help_names_the_new_options_and_the_tools() {
    let out = std::process::Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--watchdog <DURATION>",
        "DRAINIT_WATCHDOG",
        "--ready-timeout",
        "DRAINIT_READY_TIMEOUT",
        "--ready-file",
        "DRAINIT_READY_FILE",
        "--watchdog-signal",
        "DRAINIT_WATCHDOG_SIGNAL",
        "drainit --notify VAR=VALUE...",
        "drainit --probe",
        "none",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}
