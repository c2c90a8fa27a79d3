//! `--stop-sequence`: the steps reach the worker's group in order, each at
//! its offset from when the stop signal would have gone out, instead of
//! the stop signal; a second stop goes out at once and the sequence goes
//! on; the worker's exit ends it; a stop drainit begins runs it too; bad
//! sequences are refused at start. Workers: a Sidekiq-like one (TSTP stops
//! fetching, TERM drains) and a PostgreSQL-like one (TERM smart, INT fast,
//! QUIT immediate). Order and spacing come from the recorder's own
//! monotonic stamps.

mod kit;
use kit::*;

use std::time::Duration;

const TSTP: i32 = libc::SIGTSTP;
const TERM: i32 = libc::SIGTERM;
const INT: i32 = libc::SIGINT;
const QUIT: i32 = libc::SIGQUIT;

/// Sidekiq: TSTP is recorded (it stops fetching), TERM ends it after a
/// short drain.
fn sidekiq(dir: &Scratch) -> Recorder {
    Recorder::new(dir, "sidekiq").linger(100)
}

/// PostgreSQL: TERM (smart) and INT (fast) are recorded and it runs on;
/// QUIT (immediate) ends it.
fn postgres(dir: &Scratch) -> Recorder {
    Recorder::new(dir, "postgres").term(Term::Record).exit_on(QUIT)
}

/// The time between two recorder stamps.
fn between(from: u128, to: u128) -> Duration {
    Duration::from_nanos(to.saturating_sub(from) as u64)
}

/// The `stop_forwarded` events of a run: (signal, step).
fn steps(run: &Running) -> Vec<(String, String)> {
    run.events()
        .into_iter()
        .filter(|e| e.name == "stop_forwarded")
        .map(|e| (e["signal"].to_string(), e.get("step").unwrap_or("-").to_string()))
        .collect()
}

fn step(signal: &str, n: &str) -> (String, String) {
    (signal.to_string(), n.to_string())
}

per_mode! {
    /// Sidekiq: TSTP at once, TERM at its offset, nothing else.
    fn sidekiq_is_quieted_then_stopped(mode) {
        let dir = Scratch::new("seq-sidekiq");
        let rec = sidekiq(&dir);
        let options = ["--stop-sequence", "TSTP,TERM@1s", "--grace", "4s", "--orchestrator-timeout", "5s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = monotonic_ns();
        run.signal(TERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [TSTP, TERM], "{}", run.log());
        // Offsets count from drainit's receipt of the stop, which follows
        // `sent`: a step never reaches the worker before sent + offset.
        assert!(between(sent, got[0].1) < between(got[0].1, got[1].1), "TSTP went out at once: {got:?}");
        assert!(between(sent, got[1].1) >= secs(1), "TERM before its offset: {got:?}");
        assert_eq!(steps(&run), [step("SIGTSTP", "1"), step("SIGTERM", "2")], "{}", run.log());
        let second = run.events().into_iter().filter(|e| e.name == "stop_forwarded").nth(1).unwrap();
        assert!(second.duration("waited") >= secs(1), "{}", second.line);
    }
}

per_mode! {
    /// After a stop delay: the offsets count from the delay's end.
    fn sidekiq_after_the_stop_delay(mode) {
        let dir = Scratch::new("seq-delay");
        let rec = sidekiq(&dir);
        let options = ["--stop-delay", "500ms", "--stop-sequence", "TSTP,TERM@1s", "--grace", "4s"];
        let mut run = drainit(mode, rec.worker_with(&[&options[..], &["--orchestrator-timeout", "5s"]].concat())).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = monotonic_ns();
        run.signal(TERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [TSTP, TERM], "{}", run.log());
        assert!(between(sent, got[0].1) >= ms(500), "TSTP before the delay's end: {:?}", between(sent, got[0].1));
        assert!(between(sent, got[1].1) >= ms(1500), "TERM before delay + offset: {got:?}");
        assert_eq!(steps(&run), [step("SIGTSTP", "1"), step("SIGTERM", "2")], "{}", run.log());
    }
}

per_mode! {
    /// PostgreSQL: smart, fast, immediate, in order, each at its offset;
    /// the worker ends at QUIT, its exit code 0.
    fn postgres_smart_fast_immediate(mode) {
        let dir = Scratch::new("seq-postgres");
        let rec = postgres(&dir);
        let options = ["--stop-sequence", "TERM,INT@500ms,QUIT@1s", "--grace", "4s", "--orchestrator-timeout", "5s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = monotonic_ns();
        run.signal(TERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [TERM, INT, QUIT], "{}", run.log());
        assert!(between(sent, got[1].1) >= ms(500), "INT before its offset: {got:?}");
        assert!(between(sent, got[2].1) >= secs(1), "QUIT before its offset: {got:?}");
        assert_eq!(
            steps(&run),
            [step("SIGTERM", "1"), step("SIGINT", "2"), step("SIGQUIT", "3")],
            "{}",
            run.log()
        );
        assert_eq!(run.count_events("deadline_reached"), 0);
    }
}

per_mode! {
    /// A second stop signal during the sequence reaches the worker at once
    /// (as always), and the sequence goes on.
    fn a_second_stop_goes_out_and_the_sequence_goes_on(mode) {
        let dir = Scratch::new("seq-second");
        let rec = postgres(&dir);
        let options = ["--stop-sequence", "TERM,INT@2s,QUIT@3s", "--grace", "5s", "--orchestrator-timeout", "6s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = monotonic_ns();
        run.signal(TERM);
        assert_eq!(rec.wait_received(1, secs(5)), [TERM], "{}", run.log());
        run.signal(INT);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [TERM, INT, INT, QUIT], "{}", run.log());
        // The second stop came before step 2's offset; step 2 kept it.
        assert!(between(got[0].1, got[1].1) < between(got[0].1, got[2].1), "{got:?}");
        assert!(between(sent, got[2].1) >= secs(2), "step 2 before its offset: {got:?}");
        assert!(between(sent, got[3].1) >= secs(3), "step 3 before its offset: {got:?}");
        assert_eq!(run.count_events("stop_requested"), 1);
    }
}

per_mode! {
    /// The worker's exit ends the sequence: no later step goes out.
    fn the_workers_exit_ends_the_sequence(mode) {
        let dir = Scratch::new("seq-exit");
        // A PostgreSQL that has no clients: smart shutdown ends it at once.
        let rec = Recorder::new(&dir, "postgres").code(0);
        let options = ["--stop-sequence", "TERM,INT@1s,QUIT@2s", "--grace", "4s", "--orchestrator-timeout", "5s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(TERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert_eq!(rec.received_sequence(), [TERM]);
        assert_eq!(steps(&run), [step("SIGTERM", "1")], "{}", run.log());
    }
}

per_mode! {
    /// A stop the watchdog begins runs the sequence; with --watchdog-signal
    /// given, that signal is its first step.
    fn the_watchdogs_stop_runs_the_sequence(mode, watchdog_signal: Option<&str>, first: i32) {
        let dir = Scratch::new("seq-watchdog");
        // A worker that never pings: the watchdog expires (after the
        // recorder took over its signals: TSTP would stop a process that
        // had not yet).
        let rec = sidekiq(&dir).exit_on(QUIT);
        let mut options = vec!["--watchdog", "1s", "--stop-sequence", "TSTP,TERM@1s", "--grace", "4s"];
        options.extend(["--orchestrator-timeout", "5s"]);
        if let Some(sig) = watchdog_signal {
            options.extend(["--watchdog-signal", sig]);
        }
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let ended = run.wait(secs(10));
        assert!(run.event("watchdog_expired").is_some(), "{}", run.log());
        let got = rec.received_sequence();
        assert_eq!(got.first(), Some(&first), "{}", run.log());
        let first_name = if first == TSTP { "SIGTSTP" } else { "SIGQUIT" };
        assert_eq!(steps(&run)[0], step(first_name, "1"), "{}", run.log());
        if first == TSTP {
            // The sequence ran to its end: TERM at its offset ended the worker.
            assert_eq!(got, [TSTP, TERM], "{}", run.log());
            assert_eq!(ended.code, Some(128 + TERM), "never 0 after a watchdog stop: {}", run.log());
        } else {
            // QUIT ends this worker: the sequence ends with it.
            assert_eq!(got, [QUIT], "{}", run.log());
            assert_eq!(ended.code, Some(128 + QUIT), "{}", run.log());
        }
    }
    case sequence_as_given(None, TSTP);
    case watchdog_signal_first(Some("QUIT"), QUIT);
}

per_mode! {
    /// Other signals are forwarded and rewritten as usual during the
    /// sequence; the steps replace the rewritten stop signal.
    fn other_signals_are_rewritten_as_usual(mode) {
        let dir = Scratch::new("seq-rewrite");
        let rec = postgres(&dir);
        let options = [
            "--stop-sequence", "TERM,QUIT@2s", "--rewrite", "TERM:INT", "--rewrite", "HUP:USR1",
            "--grace", "4s", "--orchestrator-timeout", "5s",
        ];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(TERM);
        assert_eq!(rec.wait_received(1, secs(5)), [TERM], "the step, not the rewritten TERM: {}", run.log());
        run.signal(libc::SIGHUP);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert_eq!(rec.received_sequence(), [TERM, libc::SIGUSR1, QUIT], "{}", run.log());
    }
}

#[test]
fn bad_sequences_are_refused_naming_the_settings() {
    type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let rows: &[Row] = &[
        (&["--stop-sequence", "TERM,KILL@2s"], &[], "--stop-sequence 'TERM,KILL@2s'"),
        (&["--stop-sequence", "TERM,0@2s"], &[], "0 sends nothing"),
        (&["--stop-sequence", "TERM,INT@5s,QUIT@3s"], &[], "offsets must increase"),
        (&["--stop-sequence", "TERM,INT"], &[], "offsets must increase"),
        (&["--stop-sequence", "TSTP,TERM@soon"], &[], "TERM@soon"),
        (&[], &[("DRAINIT_STOP_SEQUENCE", "TSTP,BOGUS@1s")], "DRAINIT_STOP_SEQUENCE 'TSTP,BOGUS@1s'"),
        // The last step must go out before the grace deadline (9s by default).
        (&["--stop-sequence", "TSTP,TERM@9s"], &[], "--grace or DRAINIT_GRACE"),
        (&["--stop-sequence", "TSTP,TERM@20s", "--grace", "20s", "--orchestrator-timeout", "30s"], &[], "20s"),
        (
            &["--stop-sequence", "TSTP,TERM@5s", "--stop-delay", "4s", "--grace", "9s"],
            &[],
            "--stop-delay or DRAINIT_STOP_DELAY",
        ),
        (&["--grace", "5s"], &[("DRAINIT_STOP_SEQUENCE", "TSTP,TERM@5s")], "--stop-sequence or DRAINIT_STOP_SEQUENCE"),
    ];
    for (args, env, needle) in rows {
        assert_refused(args, env, needle);
    }
}
