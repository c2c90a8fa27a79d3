//! Signals at random moments of the lifecycle: before the worker is up, while
//! it runs, while it exits, during the grace deadline, during a backoff sleep.
//! Whatever the timing, drainit exits, its exit code is the one the case's
//! own inputs call for (what the worker was told to do, what it recorded it
//! did, which signals the test sent and when), nothing it started survives
//! it, the log ends with `event=exit code=N` for the real code N, and nothing
//! panics.
//!
//! 16 cases per mode by default (each a real run of a second or so, the two
//! modes in parallel); PROPTEST_CASES=N for N per mode,
//! DRAINIT_LONG=1 for 128. Each case prints a line (`--nocapture`): what it
//! drew, what it sent, how it ended. A failing case prints its parameters; rerun
//! it with the same seed via PROPTEST_RNG_SEED if needed.

mod kit;
use kit::*;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

const GRACE_MS: u64 = 300;
const ORCHESTRATOR_TIMEOUT_MS: u64 = 2000;
/// The last moment a random signal is sent; a final SIGTERM follows at
/// FINAL_MS so that every case ends.
const WINDOW_MS: u64 = 800;
const FINAL_MS: u64 = 900;
/// Two events closer than this (a signal sent, the worker's exit) may reach
/// drainit in either order: both outcomes are accepted.
const RACE_NS: u128 = 200_000_000;

#[derive(Clone, Copy, Debug)]
enum First {
    /// Exit with the backoff code after `run_ms`, asking for `sleep_ms`.
    Backoff { run_ms: u64, sleep_ms: u64 },
    /// Exit 3 after `run_ms`.
    Exit3 { run_ms: u64 },
    /// Run until a signal ends it.
    Run,
}

#[derive(Clone, Copy, Debug)]
enum OnTerm {
    /// Exit 0.
    Clean,
    /// SIG_IGN: only the deadline ends it.
    Ignore,
    /// Die of it.
    Die,
}

#[derive(Clone, Copy, Debug)]
enum Leftover {
    None,
    /// A child in its own session that exits on SIGTERM.
    Polite,
    /// A child in its own session that ignores SIGTERM.
    Stubborn,
}

#[derive(Clone, Debug)]
struct Case {
    mode: Mode,
    /// The one code by which the worker asks to be restarted (--backoff-exit-code).
    backoff_code: i32,
    first: First,
    on_term: OnTerm,
    leftover: Leftover,
    /// (ms after drainit has its signals blocked, signal)
    signals: Vec<(u64, i32)>,
}

const STOPS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT];

const SIGNALS: [i32; 9] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGALRM,
];

/// Signals whose default action ends a process (the others: WINCH, CONT).
fn lethal_by_default(sig: i32) -> bool {
    !matches!(sig, libc::SIGWINCH | libc::SIGCONT)
}

fn case(mode: Mode) -> impl Strategy<Value = Case> {
    let first = prop_oneof![
        2 => (0u64..600, 50u64..400).prop_map(|(run_ms, sleep_ms)| First::Backoff { run_ms, sleep_ms }),
        1 => (0u64..600).prop_map(|run_ms| First::Exit3 { run_ms }),
        1 => Just(First::Run),
    ];
    let on_term = prop_oneof![Just(OnTerm::Clean), Just(OnTerm::Ignore), Just(OnTerm::Die)];
    let leftover = prop_oneof![Just(Leftover::None), Just(Leftover::Polite), Just(Leftover::Stubborn)];
    // Every signal that kills by default ends the worker at once, so those
    // are drawn less often than the stop signals (SIGTERM most: it alone
    // leads to the deadline) and the two that leave it running: a few
    // cases per mode then reach every path (deadline, backoff sleep,
    // restart, exit race), not mostly "the first signal killed it".
    let signal = prop_oneof![
        4 => Just(libc::SIGTERM),
        1 => Just(libc::SIGINT),
        1 => Just(libc::SIGQUIT),
        2 => Just(libc::SIGWINCH),
        2 => Just(libc::SIGCONT),
        1 => prop::sample::select(vec![libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM]),
    ];
    let signals = prop::collection::vec((0u64..=WINDOW_MS, signal), 0..4).prop_map(|mut v| {
        v.sort();
        v
    });
    // Codes 4..=125: none is 0, 3, or a death by signal (128+N).
    (4i32..=125, first, on_term, leftover, signals).prop_map(
        move |(backoff_code, first, on_term, leftover, signals)| Case {
            mode,
            backoff_code,
            first,
            on_term,
            leftover,
            signals,
        },
    )
}

/// The worker: a recorder per attempt, dying of every signal that kills by
/// default (noting it first), reacting to SIGTERM as `on_term` says,
/// starting `leftover` each attempt, and on attempt 1 doing what `first` says.
fn worker(c: &Case, dir: &Scratch) -> Recorder {
    let mut w = Recorder::new(dir, "w").per_attempt();
    for sig in SIGNALS.into_iter().filter(|&s| lethal_by_default(s) && s != libc::SIGTERM) {
        w = w.die_on(sig);
    }
    w = match c.on_term {
        OnTerm::Clean => w.term(Term::Exit).code(0),
        OnTerm::Ignore => w.term(Term::Ignore),
        OnTerm::Die => w.term(Term::Record).die_on(libc::SIGTERM),
    };
    let left = Recorder::new(dir, "left").per_attempt().setsid();
    w = match c.leftover {
        Leftover::None => w,
        Leftover::Polite => w.child(left),
        Leftover::Stubborn => w.child(left.term(Term::Ignore)),
    };
    let code = c.backoff_code;
    match c.first {
        First::Backoff { run_ms, sleep_ms } => {
            w.on_attempt(1, |r| r.exit_after(run_ms, code).retry_after(&format!("{sleep_ms}ms")))
        }
        First::Exit3 { run_ms } => w.on_attempt(1, |r| r.exit_after(run_ms, 3)),
        First::Run => w,
    }
}

/// One attempt as the worker noted it: when it was ready, how and when it
/// ended (None: it did not get that far, or it died of a signal before it
/// could note anything: SIGKILL, or one that came before it was set up).
#[derive(Clone, Copy, Debug)]
struct Attempt {
    ready: Option<u128>,
    end: Option<(End, u128)>,
}

/// What the test knows once drainit has exited: its inputs, the signals it
/// actually sent (CLOCK_MONOTONIC ns), and each attempt's own records.
struct Facts<'a> {
    case: &'a Case,
    sent: Vec<(i32, u128)>,
    /// Each attempt drainit started.
    attempts: Vec<Attempt>,
}

impl Facts<'_> {
    fn first_stop(&self) -> Option<(i32, u128)> {
        self.sent.iter().copied().find(|(s, _)| STOPS.contains(s))
    }

    /// The exit codes drainit may give, derived from the facts alone; Err
    /// when the facts contradict each other.
    fn allowed_codes(&self) -> Result<Vec<i32>, String> {
        let b = self.case.backoff_code;
        let last = self.attempts.len();
        let Attempt { ready, end } = *self.attempts.last().ok_or("no attempt")?;
        let stop = self.first_stop();
        for (n, Attempt { end, .. }) in self.attempts.iter().enumerate().take(last - 1) {
            // Only a backoff exit with no stop before it leads to a restart.
            let (End::Code(code), at) = end.ok_or(format!("attempt {} left no record but was restarted", n + 1))?
            else {
                return Err(format!("attempt {} died of a signal but was restarted", n + 1));
            };
            if code != b {
                return Err(format!("attempt {} exited {code}, not {b}, and was restarted", n + 1));
            }
            if stop.is_some_and(|(_, s)| s + RACE_NS < at) {
                return Err(format!("attempt {} was restarted after a stop signal", n + 1));
            }
        }
        match end {
            // A backoff exit that was not restarted: a stop came before it
            // (drainit exits with it) or during the drain or sleep after it
            // (128 + the stop signal).
            Some((End::Code(code), at)) if code == b => {
                let (sig, s) = stop.ok_or("a backoff exit with neither a restart nor a stop")?;
                let mut codes = Vec::new();
                if s < at + RACE_NS {
                    codes.push(b);
                }
                if s + RACE_NS > at {
                    codes.push(128 + sig);
                }
                Ok(codes)
            }
            Some((End::Code(code), _)) => Ok(vec![code]),
            Some((End::Signal(sig), _)) => {
                if !self.sent.iter().any(|(s, _)| *s == sig) {
                    return Err(format!("the worker died of {sig}, which the test never sent"));
                }
                Ok(vec![128 + sig])
            }
            // Died without a word: the deadline's SIGKILL (after a stop), or
            // a signal that came before the worker was set up.
            None => {
                let mut codes: Vec<i32> = stop.map(|_| 137).into_iter().collect();
                let previous_end = self.attempts.iter().rev().nth(1).and_then(|a| a.end.map(|(_, at)| at));
                codes.extend(
                    self.sent
                        .iter()
                        .filter(|(sig, at)| {
                            lethal_by_default(*sig)
                                && ready.is_none_or(|r| *at < r + RACE_NS)
                                && previous_end.is_none_or(|p| *at + RACE_NS > p)
                        })
                        .map(|(sig, _)| 128 + sig),
                );
                Ok(codes)
            }
        }
    }
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let dir = Scratch::new("timing");
    let w = worker(c, &dir);
    let code = c.backoff_code.to_string();
    let (grace, timeout) = (format!("{GRACE_MS}ms"), format!("{ORCHESTRATOR_TIMEOUT_MS}ms"));
    let options = [
        "--grace",
        &grace,
        "--orchestrator-timeout",
        &timeout,
        "--backoff-exit-code",
        &code,
        "--backoff-delay",
        "100ms",
        "--backoff-max-delay",
        "400ms",
        "--backoff-timeout",
        "10s",
    ];
    let mut run = drainit(c.mode, w.worker_with(&options)).spawn();
    // Before drainit blocks its signals a signal would hit drainit itself,
    // not the worker-to-be; a worker that exits at once may end it first.
    prop_assert!(
        wait_until(secs(5), || HOST.blocks_signals(run.pid) || !alive(run.pid)),
        "drainit never blocked its signals"
    );
    let t0 = std::time::Instant::now();
    let mut sent = Vec::new();
    // Through the run's own pidfd, opened when it started (there is no path
    // that sends nothing): a signal sent after drainit is gone reaches
    // nobody, and a zombie drainit is known to be gone.
    for &(at, sig) in c.signals.iter().chain([(FINAL_MS, libc::SIGTERM)].iter()) {
        // The case's own schedule, not a wait.
        std::thread::sleep((t0 + ms(at)).saturating_duration_since(std::time::Instant::now()));
        if run.pidfd().exited() {
            break;
        }
        let before = monotonic_ns();
        match run.pidfd().send(sig) {
            Ok(()) => sent.push((sig, before)),
            // Gone between the check and the send.
            Err(libc::ESRCH) => break,
            Err(e) => return Err(TestCaseError::fail(format!("sending {sig} to drainit: errno {e}"))),
        }
    }
    let ended = run.wait(secs(10));
    let gone = monotonic_ns();
    let log = run.log();
    let code = ended
        .code
        .ok_or_else(|| TestCaseError::fail(format!("drainit died of signal {:?}; log:\n{log}", ended.signal)))?;
    check_log_end(&log, code).map_err(TestCaseError::fail)?;
    let events = run.events();
    prop_assert!(run.count_events("stop_requested") <= 1, "the grace clock started twice; log:\n{}", log);
    let started = events.iter().filter(|e| e.name == "child_started").count();
    let facts = Facts {
        case: c,
        sent,
        attempts: (1..=started as u32)
            .map(|n| Attempt { ready: w.attempt(n).ready_ns(), end: w.attempt(n).end() })
            .collect(),
    };
    eprintln!(
        "timing {:?}: {:?} {:?} {:?}: sent {:?}, {} attempts, exit {}",
        c.mode,
        c.first,
        c.on_term,
        c.leftover,
        facts.sent.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        started,
        code
    );
    let allowed = facts.allowed_codes().map_err(|e| TestCaseError::fail(format!("{e}; log:\n{log}")))?;
    prop_assert!(
        allowed.contains(&code),
        "exit {} where the facts allow {:?}; sent {:?}; attempts {:?}; log:\n{}",
        code,
        allowed,
        facts.sent,
        facts.attempts,
        log
    );
    // Once a stop signal went out, drainit is gone before the
    // orchestrator's SIGKILL (the final SIGTERM at FINAL_MS makes sure one
    // does, unless drainit ended before).
    if let Some((sig, at)) = facts.first_stop() {
        let took = between(at, gone);
        prop_assert!(
            took < ms(ORCHESTRATOR_TIMEOUT_MS),
            "drainit exited {:?} after the first stop ({}), past the orchestrator's SIGKILL at {}ms; log:\n{}",
            took,
            sig,
            ORCHESTRATOR_TIMEOUT_MS,
            log
        );
    }
    if c.mode == Mode::Subreaper {
        let pids = (1..=started as u32)
            .flat_map(|n| [w.attempt(n).pid(), Recorder::new(&dir, "left").attempt(n).pid()])
            .flatten();
        let left: Vec<i32> = pids.filter(|&p| alive_as(p, &dir.str())).collect();
        prop_assert!(left.is_empty(), "outlived drainit: {:?}; log:\n{}", left, log);
    }
    Ok(())
}

fn cases() -> u32 {
    match std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if long_mode() => 128,
        None => 16,
    }
}

fn config() -> Config {
    Config {
        cases: cases(),
        // Each case is a real run of a second or so: shrink briefly, and keep
        // no regression file in the shared work tree.
        max_shrink_iters: 16,
        max_shrink_time: 30_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn signals_at_random_moments_keep_every_promise_as_pid1(c in case(Mode::Pid1)) {
        run_case(&c)?;
    }

    #[test]
    fn signals_at_random_moments_keep_every_promise_as_subreaper(c in case(Mode::Subreaper)) {
        run_case(&c)?;
    }
}
