//! Signals at random moments of the lifecycle: before the worker is up, while
//! it runs, while it exits, during the grace deadline, during a backoff sleep.
//! Whatever the timing, drainit exits, its exit code is the one the contract
//! gives for what happened, nothing it started survives it, the log ends with
//! `event=exit code=N` for the real code N, and nothing panics.
//!
//! 16 cases by default (about 25s); PROPTEST_CASES=N for N, DRAINIT_LONG=1 for
//! 256. A failing case prints its parameters; rerun it with the same seed via
//! PROPTEST_RNG_SEED if needed.

mod common;
mod robust;
use common::*;
use robust::*;

use std::collections::HashMap;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

const GRACE_MS: u64 = 300;
/// The last moment a random signal is sent; a final SIGTERM follows at
/// FINAL_MS so that every case ends.
const WINDOW_MS: u64 = 800;
const FINAL_MS: u64 = 900;

#[derive(Clone, Copy, Debug)]
enum First {
    /// Exit 75 after `run_ms`, asking for `sleep_ms` in the retry-after file.
    Backoff { run_ms: u64, sleep_ms: u64 },
    /// Exit 3 after `run_ms`.
    Exit3 { run_ms: u64 },
    /// Run until a signal ends it.
    Run,
}

#[derive(Clone, Copy, Debug)]
enum OnTerm {
    /// A trap that records 0 and exits 0.
    Clean,
    /// trap '' TERM: only the deadline ends it.
    Ignore,
    /// Default action: dies of SIGTERM.
    Die,
}

#[derive(Clone, Copy, Debug)]
enum Leftover {
    None,
    /// A setsid'd child that exits on SIGTERM.
    Polite,
    /// A setsid'd child that ignores SIGTERM.
    Stubborn,
}

#[derive(Clone, Debug)]
struct Case {
    mode: Mode,
    first: First,
    on_term: OnTerm,
    leftover: Leftover,
    /// (ms after drainit has its signals blocked, signal)
    signals: Vec<(u64, i32)>,
}

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

fn case() -> impl Strategy<Value = Case> {
    let mode = prop_oneof![Just(Mode::Pid1), Just(Mode::Subreaper)];
    let first = prop_oneof![
        2 => (0u64..600, 50u64..400).prop_map(|(run_ms, sleep_ms)| First::Backoff { run_ms, sleep_ms }),
        1 => (0u64..600).prop_map(|run_ms| First::Exit3 { run_ms }),
        1 => Just(First::Run),
    ];
    let on_term = prop_oneof![Just(OnTerm::Clean), Just(OnTerm::Ignore), Just(OnTerm::Die)];
    let leftover = prop_oneof![Just(Leftover::None), Just(Leftover::Polite), Just(Leftover::Stubborn)];
    let signals =
        prop::collection::vec((0u64..=WINDOW_MS, prop::sample::select(&SIGNALS[..])), 0..4).prop_map(|mut v| {
            v.sort();
            v
        });
    (mode, first, on_term, leftover, signals).prop_map(|(mode, first, on_term, leftover, signals)| Case {
        mode,
        first,
        on_term,
        leftover,
        signals,
    })
}

/// The worker: records its pid (and its leftover's) in `pids`, and each exit
/// it chooses as "ATTEMPT CODE" in `status`.
fn script(c: &Case, dir: &Scratch) -> String {
    let (pids, status) = (path_str(&dir.path("pids")), path_str(&dir.path("status")));
    let trap = match c.on_term {
        OnTerm::Clean => format!("trap 'echo \"$a 0\" >> {status}; exit 0' TERM; "),
        OnTerm::Ignore => "trap '' TERM; ".to_string(),
        OnTerm::Die => String::new(),
    };
    let leftover = match c.leftover {
        Leftover::None => String::new(),
        Leftover::Polite => {
            format!("setsid sh -c 'echo $$ >> {pids}; trap \"exit 0\" TERM; while :; do sleep 0.05; done' & ")
        }
        Leftover::Stubborn => {
            format!("setsid sh -c 'echo $$ >> {pids}; trap \"\" TERM; while :; do sleep 0.05; done' & ")
        }
    };
    let first = match c.first {
        First::Backoff { run_ms, sleep_ms } => format!(
            "if [ $a = 1 ]; then sleep {}; echo \"$a 75\" >> {status}; echo {sleep_ms}ms > \"$DRAINIT_RETRY_AFTER_FILE\"; exit 75; fi; ",
            run_ms as f64 / 1000.0
        ),
        First::Exit3 { run_ms } => {
            format!("if [ $a = 1 ]; then sleep {}; echo \"$a 3\" >> {status}; exit 3; fi; ", run_ms as f64 / 1000.0)
        }
        First::Run => String::new(),
    };
    format!("a=$DRAINIT_ATTEMPT; {trap}echo $$ >> {pids}; {leftover}{first}while :; do sleep 0.05; done")
}

fn signo(name: &str) -> Option<i32> {
    Some(match name {
        "SIGTERM" => libc::SIGTERM,
        "SIGINT" => libc::SIGINT,
        "SIGQUIT" => libc::SIGQUIT,
        _ => return None,
    })
}

fn sig_blocked(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().any(|l| l.starts_with("SigBlk:") && !l.ends_with("0000000000000000"))
}

/// What the contract says drainit must exit with, given what the log says
/// happened; and every claim of the log checked against the worker's own
/// records and the signals actually sent.
fn truthful_code(events: &[HashMap<String, String>], status: &[String], sent: &[i32]) -> Result<i32, String> {
    let idx = |name: &str| events.iter().position(|e| e["event"] == name);
    let last = |name: &str| events.iter().rposition(|e| e["event"] == name);
    let first_stop = idx("stop_requested");
    if events.iter().filter(|e| e["event"] == "stop_requested").count() > 1 {
        return Err("the grace clock started twice".into());
    }
    // No restart after a stop.
    if let Some(stop) = first_stop
        && events[stop..].iter().any(|e| e["event"] == "child_started")
    {
        return Err("a worker started after a stop signal".into());
    }
    // Each worker exit is what the worker did.
    let attempt_of: HashMap<&str, &str> = events
        .iter()
        .filter(|e| e["event"] == "child_started")
        .map(|e| (e["pid"].as_str(), e["attempt"].as_str()))
        .collect();
    let deadline = idx("deadline_reached");
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e["event"] == "child_exited") {
        let attempt = attempt_of.get(e["pid"].as_str()).ok_or("child_exited for a pid never started")?;
        match e.get("signal") {
            None => {
                let line = format!("{attempt} {}", e["code"]);
                if !status.contains(&line) {
                    return Err(format!(
                        "log says attempt {attempt} exited {}, the worker recorded {status:?}",
                        e["code"]
                    ));
                }
            }
            Some(sig) if sig == "SIGKILL" => {
                if deadline.is_none_or(|d| d > i) {
                    return Err("a worker SIGKILLed without a deadline".into());
                }
            }
            Some(sig) => {
                let n: i32 = e["code"].parse::<i32>().map_err(|_| "bad code")? - 128;
                if !sent.contains(&n) {
                    return Err(format!("worker died of {sig}, which the test never sent"));
                }
            }
        }
    }
    let Some(ce) = last("child_exited") else {
        return Err("no child_exited".into());
    };
    let x: i32 = events[ce]["code"].parse().map_err(|_| "bad code")?;
    let after = &events[ce..];
    let stop_code = |from: usize| -> Result<i32, String> {
        let stop = events[from..]
            .iter()
            .find(|e| e["event"] == "stop_requested")
            .ok_or("no stop signal after the worker's exit")?;
        Ok(128 + signo(&stop["signal"]).ok_or("not a stop signal")?)
    };
    if after.iter().any(|e| e["event"] == "backoff_exhausted") {
        Ok(x)
    } else if let Some(b) = after.iter().position(|e| e["event"] == "backoff") {
        // Stopped during the sleep: 128 + the stop signal.
        stop_code(ce + b)
    } else if x == 75 && first_stop.is_none_or(|s| s > ce) {
        // Stopped while the backoff exit's leftovers drained.
        stop_code(ce)
    } else {
        Ok(x)
    }
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let dir = Scratch::new("timing");
    let options = [
        "--grace",
        "300ms",
        "--orchestrator-timeout",
        "2s",
        "--backoff-delay",
        "100ms",
        "--backoff-max-delay",
        "400ms",
        "--backoff-timeout",
        "10s",
    ];
    let mut run = drainit(c.mode, with_sh(&options, &script(c, &dir))).spawn();
    // Before drainit blocks its signals a signal would hit drainit itself,
    // not the worker-to-be; a worker that exits at once may end it first.
    prop_assert!(wait_until(secs(5), || sig_blocked(run.pid) || !alive(run.pid)), "drainit never blocked its signals");
    let t0 = Instant::now();
    let mut sent = Vec::new();
    // Through a pidfd: a signal sent after drainit is gone reaches nobody.
    if let Ok(pidfd) = Pidfd::try_open(run.pid) {
        for &(at, sig) in c.signals.iter().chain([(FINAL_MS, libc::SIGTERM)].iter()) {
            let due = t0 + ms(at);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if pidfd.exited() {
                break;
            }
            if pidfd.send(sig).is_ok() {
                sent.push(sig);
            }
        }
    }
    let ended = run.wait(secs(10));
    let took = t0.elapsed();
    let log = run.log();
    let code = ended
        .code
        .ok_or_else(|| TestCaseError::fail(format!("drainit died of signal {:?}; log:\n{log}", ended.signal)))?;
    check_log_end(&log, code).map_err(TestCaseError::fail)?;
    let status = dir.lines("status");
    let want =
        truthful_code(&run.events(), &status, &sent).map_err(|e| TestCaseError::fail(format!("{e}; log:\n{log}")))?;
    prop_assert_eq!(code, want, "exit code; worker recorded {:?}; log:\n{}", status, log);
    // The final SIGTERM at FINAL_MS ends everything by its deadline.
    let bound = ms(FINAL_MS + GRACE_MS) + ms(1500);
    prop_assert!(took < bound, "drainit took {:?} (bound {:?}); log:\n{}", took, bound, log);
    if c.mode == Mode::Subreaper {
        let marker = path_str(&dir.0);
        let left: Vec<i32> =
            dir.lines("pids").iter().filter_map(|p| p.trim().parse().ok()).filter(|&p| alive_as(p, &marker)).collect();
        prop_assert!(left.is_empty(), "outlived drainit: {:?}; log:\n{}", left, log);
    }
    Ok(())
}

fn cases() -> u32 {
    match std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if long_mode() => 256,
        None => 16,
    }
}

proptest! {
    #![proptest_config(Config {
        cases: cases(),
        // Each case is a real run of a second or so: shrink briefly, and keep
        // no regression file in the shared work tree.
        max_shrink_iters: 16,
        max_shrink_time: 30_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })]

    #[test]
    fn signals_at_random_moments_keep_every_promise(c in case()) {
        run_case(&c)?;
    }
}
