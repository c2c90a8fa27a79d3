//! The stop delay and the drain file: the first stop signal starts the
//! grace clock and creates the drain file at once, and reaches the worker
//! only the delay later; other signals, a second stop, the worker's own
//! exit and the deadline behave as the contract says.

mod kit;
use kit::*;

use std::time::Instant;

per_mode! {
    /// The worker hears SIGTERM the delay after drainit did, and drainit
    /// says when it went out.
    fn the_stop_reaches_the_worker_after_the_delay(mode) {
        let dir = Scratch::new("delay");
        let rec = Recorder::new(&dir, "w");
        let mut run = drainit(mode, rec.worker_with(&["--stop-delay", "1s", "--grace", "5s"])).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = monotonic_ns();
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        // One SIGTERM, the delay after drainit's.
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [libc::SIGTERM], "{}", run.log());
        let after = between(sent, got[0].1);
        assert!(after >= secs(1) && after < ms(1300), "SIGTERM reached the worker {after:?} after drainit");
        let requested = run.event("stop_requested").expect("stop_requested");
        assert_eq!((&requested["signal"], &requested["delay"]), ("SIGTERM", "1s"));
        let forwarded = run.event("stop_forwarded").expect("stop_forwarded");
        assert_eq!(&forwarded["signal"], "SIGTERM");
        assert!(forwarded.duration("waited") >= secs(1), "{}", forwarded.line);
    }
}

per_mode! {
    /// During the delay another signal goes to the worker at once.
    fn other_signals_are_forwarded_during_the_delay(mode) {
        let dir = Scratch::new("delay-usr1");
        let rec = Recorder::new(&dir, "w");
        let mut run = drainit(mode, rec.worker_with(&["--stop-delay", "3s", "--grace", "5s"])).spawn();
        assert!(rec.wait_ready(secs(10)));
        let stop = monotonic_ns();
        run.signal(libc::SIGTERM);
        assert!(run.wait_event("stop_requested", secs(5)).is_some());
        let sent = monotonic_ns();
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(2)), "{:?}", rec.received_sequence());
        assert_eq!(run.wait(secs(10)).code, Some(0));
        // SIGUSR1 at once, SIGTERM (once) only when the delay is over.
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [libc::SIGUSR1, libc::SIGTERM], "{}", run.log());
        assert!(between(sent, got[0].1) < secs(1), "USR1 took {:?}", between(sent, got[0].1));
        assert!(between(stop, got[1].1) >= secs(3), "SIGTERM went out {:?} after the stop", between(stop, got[1].1));
    }
}

per_mode! {
    /// A second stop signal ends the delay and goes out at once.
    fn a_second_stop_cuts_the_delay(mode) {
        let dir = Scratch::new("delay-twice");
        let rec = Recorder::new(&dir, "w");
        let mut run = drainit(mode, rec.worker_with(&["--stop-delay", "5s", "--grace", "8s"])).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(libc::SIGTERM);
        assert!(run.wait_event("stop_requested", secs(5)).is_some());
        let second = Instant::now();
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert!(second.elapsed() < secs(2), "the worker ended {:?} after the second SIGTERM", second.elapsed());
        assert_eq!(rec.received_sequence(), [libc::SIGTERM], "{}", run.log());
        assert_eq!(run.count_events("stop_requested"), 1);
        assert_eq!(run.count_events("stop_forwarded"), 1);
    }
}

per_mode! {
    /// A worker that exits by itself during the delay ends it: drainit exits
    /// at once with the worker's code, and forwards no stop.
    fn the_workers_exit_ends_the_delay(mode) {
        let dir = Scratch::new("delay-exit");
        let rec = Recorder::new(&dir, "w").exit_after(500, 3);
        let mut run = drainit(mode, rec.worker_with(&["--stop-delay", "5s", "--grace", "8s"])).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(libc::SIGTERM);
        let sent = Instant::now();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(3), "{}", run.log());
        assert!(sent.elapsed() < secs(3), "drainit waited the delay out: {:?}", sent.elapsed());
        assert_eq!(run.count_events("stop_forwarded"), 0, "{}", run.log());
        assert_eq!(rec.received_sequence(), [], "no stop reaches a worker that ended the delay");
    }
}

per_mode! {
    /// The deadline is stop + grace, not stop + delay + grace.
    fn the_deadline_counts_from_the_stop(mode) {
        let dir = Scratch::new("delay-deadline");
        let rec = Recorder::new(&dir, "w").term(Term::Record);
        let options = ["--stop-delay", "1s", "--grace", "2s", "--orchestrator-timeout", "3s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let took = sent.elapsed();
        let gone = monotonic_ns();
        assert_eq!(ended.code, Some(137), "{}", run.log());
        // The orchestrator's SIGKILL comes 3s after the stop, on its clock.
        assert!(took >= secs(2) && took < secs(3), "drainit exited {took:?} after SIGTERM: past the orchestrator's SIGKILL");
        // The worker's stamp: the delayed SIGTERM reached it 1s into the
        // stop, so the deadline (stop + grace) is 1s after that; one counted
        // from the delay's end would be 2s after it.
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [libc::SIGTERM], "{}", run.log());
        let after = between(got[0].1, gone);
        assert!(after >= ms(900) && after < secs(2), "drainit exited {after:?} after the delayed SIGTERM reached the worker");
    }
}

per_mode! {
    /// The drain file: a stale one is removed at start, it is absent while
    /// the worker runs, and there before the worker hears SIGTERM, with or
    /// without a delay.
    fn the_drain_file_marks_the_stop(mode, delay: &str) {
        let dir = Scratch::new("drain-file");
        let drain = dir.path("draining");
        std::fs::write(&drain, "stale").unwrap();
        let seen = dir.path("seen-at-term");
        let script = format!(
            "trap 'if test -e {d}; then echo present; else echo absent; fi > {s}; exit 0' TERM; \
             touch {r}; while :; do sleep 0.05; done",
            d = path_str(&drain),
            s = path_str(&seen),
            r = path_str(&dir.path("ready")),
        );
        let options = ["--drain-file", &path_str(&drain), "--stop-delay", delay, "--grace", "5s"];
        let mut run = drainit(mode, with_sh(&options, &script)).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")), "{}", run.log());
        assert!(!drain.exists(), "the stale drain file is still there while the worker runs");
        run.signal(libc::SIGTERM);
        assert!(wait_until(secs(5), || drain.exists()), "no drain file after the stop request");
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert_eq!(dir.read("seen-at-term").trim(), "present");
        assert_eq!(std::fs::read(&drain).unwrap(), b"", "the drain file is empty");
    }
    case no_delay("0s");
    case with_delay("1s");
}

per_mode! {
    /// Whatever is at the drain file's path at stop time (a file, a link the
    /// worker planted) is left alone: one warning, nothing written through it.
    fn a_drain_file_already_there_is_never_written_through(mode) {
        let dir = Scratch::new("drain-link");
        let drain = dir.path("draining");
        let target = dir.path("target");
        let script = format!("ln -s {} {}; touch {}; exec sleep 30", path_str(&target), path_str(&drain), path_str(&dir.path("ready")));
        let mut run = drainit(mode, with_sh(&["--drain-file", &path_str(&drain)], &script)).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(143));
        assert!(!target.exists(), "drainit created the link's target");
        let warning = run.event("file_skipped").unwrap_or_else(|| panic!("no warning:\n{}", run.log()));
        assert_eq!(&warning["what"], "drain_file");
        assert_eq!(run.count_events("file_skipped"), 1);
    }
}

/// A drain file drainit cannot create is one warning, nothing more.
#[test]
fn an_impossible_drain_file_is_one_warning() {
    let mut run =
        drainit(Mode::Subreaper, with_sh(&["--drain-file", "/nonexistent/dir/draining"], "exec sleep 30")).spawn();
    assert!(run.wait_event("child_started", secs(10)).is_some());
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(143));
    assert_eq!(run.count_events("file_skipped"), 1, "{}", run.log());
}

cases! {
    /// Bad stop delays: one line, exit 2, no worker.
    fn refused(args: &[&str], env: &[(&str, &str)], needle: &str) {
        assert_refused(args, env, needle);
    }
    case delay_equal_to_the_default_grace(&["--stop-delay", "9s"], &[], "--stop-delay '9s': must be shorter than the grace, 9s");
    case delay_longer_than_the_grace(&["--stop-delay", "3s", "--grace", "2s"], &[], "shorter than the grace, 2s");
    case variable_equal_to_the_grace(&[], &[("DRAINIT_STOP_DELAY", "2s"), ("DRAINIT_GRACE", "2s")], "DRAINIT_STOP_DELAY '2s'");
    case not_a_duration(&["--stop-delay", "soon"], &[], "--stop-delay 'soon'");
    case variable_not_a_duration(&[], &[("DRAINIT_STOP_DELAY", "-1s")], "DRAINIT_STOP_DELAY '-1s'");
    case empty_variable(&[], &[("DRAINIT_STOP_DELAY", "")], "DRAINIT_STOP_DELAY is set but empty");
    case empty_drain_file(&["--drain-file", ""], &[], "--drain-file '': must not be empty");
    case empty_drain_file_variable(&[], &[("DRAINIT_DRAIN_FILE", "")], "DRAINIT_DRAIN_FILE is set but empty");
}

/// With the defaults (grace 9s) a 5s delay is accepted and leaves 4s.
#[test]
fn a_delay_shorter_than_the_grace_is_accepted() {
    let mut run = drainit(Mode::Subreaper, ["--stop-delay", "5s", "--", "true"]).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let mut run = drainit(Mode::Subreaper, ["--", "true"]).env("DRAINIT_STOP_DELAY", "8.5").spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
}
