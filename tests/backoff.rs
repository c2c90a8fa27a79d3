//! StartupBackoff: a worker that exits with a backoff code is restarted after
//! a jittered, doubling sleep, until the budget is spent; leftovers of an
//! attempt are gone before the next one starts. (The delay a worker asks
//! for: tests/retry_after.rs.)

mod kit;
use kit::*;

use std::time::Duration;

/// The `delay=` of each `backoff` event, in order.
fn delays(run: &Running) -> Vec<Duration> {
    run.events().iter().filter(|e| e.name == "backoff").map(|e| e.duration("delay")).collect()
}

/// A worker that exits with `codes[n-1]` on attempt n, the last code on
/// every later attempt; each attempt's outputs in its own directory.
fn scripted(dir: &Scratch, codes: &[i32]) -> Recorder {
    let (last, each) = codes.split_last().unwrap();
    let mut rec = Recorder::new(dir, "w").per_attempt().exit_after(0, *last);
    for (i, &code) in each.iter().enumerate() {
        rec = rec.on_attempt(i as u32 + 1, |r| r.exit_after(0, code));
    }
    rec
}

/// When each attempt started (CLOCK_MONOTONIC ns), in order.
fn starts(rec: &Recorder) -> Vec<u128> {
    (1..).map_while(|n| rec.attempt(n).ready_ns()).collect()
}

fn gap(starts: &[u128], i: usize) -> Duration {
    between(starts[i], starts[i + 1])
}

per_mode! {
    fn exits_75_twice_then_0(mode) {
        let dir = Scratch::new("backoff");
        let rec = scripted(&dir, &[75, 75, 0]);
        let mut run = drainit(mode, rec.worker_with(&["--backoff-delay", "400ms", "--backoff-max-delay", "2s"])).spawn();
        let ended = run.wait(secs(20));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        let starts = starts(&rec);
        assert_eq!(starts.len(), 3, "{mode:?}: {}", run.log());
        let slept = delays(&run);
        assert_eq!(slept.len(), 2, "{}", run.log());
        // Jitter: each sleep is in [base/2, base]; the base doubles.
        assert!(slept[0] >= ms(200) && slept[0] <= ms(400), "{slept:?}");
        assert!(slept[1] >= ms(400) && slept[1] <= ms(800), "{slept:?}");
        // The restarts really waited that long (and not much longer).
        for (i, &sleep) in slept.iter().enumerate() {
            let gap = gap(&starts, i);
            assert!(gap >= sleep && gap < sleep + ms(1500), "{mode:?} gap {i}: {gap:?} for {sleep:?}");
        }
        let backoffs: Vec<(i64, i64)> =
            run.events().iter().filter(|e| e.name == "backoff").map(|e| (e.num("attempt"), e.num("code"))).collect();
        assert_eq!(backoffs, [(1, 75), (2, 75)], "{}", run.log());
        let attempts: Vec<i64> =
            run.events().iter().filter(|e| e.name == "child_started").map(|e| e.num("attempt")).collect();
        assert_eq!(attempts, [1, 2, 3], "{}", run.log());
    }
}

#[test]
fn gives_up_when_the_budget_is_spent() {
    let dir = Scratch::new("exhaust");
    let rec = scripted(&dir, &[75]);
    let budget = secs(2);
    let options = ["--backoff-delay", "200ms", "--backoff-max-delay", "400ms", "--backoff-timeout", "2s"];
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
    let ended = run.wait(secs(20));
    let log = run.log();
    assert_eq!(ended.code, Some(75), "{log}");
    let starts = starts(&rec);
    let exhausted = run.event("backoff_exhausted").expect("backoff_exhausted");
    assert_eq!(exhausted.num("attempts") as usize, starts.len(), "{log}");
    // The budget is used to its end: the sleep that would end past it is
    // cut to end with it, the worker tries once more then, and that
    // attempt's backoff exit is final.
    let elapsed = exhausted.duration("elapsed");
    assert!(elapsed >= budget && elapsed < budget + SECOND, "{exhausted:?}");
    let last_start = Duration::from_nanos((starts[starts.len() - 1] - starts[0]) as u64);
    assert!(last_start >= budget && last_start < budget + SECOND, "the last attempt began {last_start:?} in");
    let slept = delays(&run);
    assert_eq!(slept.len(), starts.len() - 1, "{log}");
    assert!(slept[..slept.len() - 1].iter().all(|d| *d >= ms(100) && *d <= ms(400)), "{slept:?}");
    assert!(*slept.last().unwrap() <= ms(400), "the last sleep is cut, never longer: {slept:?}");
    check_log_end(&log, 75).unwrap();
}

#[test]
fn a_base_delay_above_the_max_delay_is_capped() {
    let dir = Scratch::new("capped");
    let rec = scripted(&dir, &[75, 0]);
    let options = ["--backoff-delay", "1m", "--backoff-max-delay", "300ms"];
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let slept = delays(&run);
    assert!(slept.len() == 1 && slept[0] >= ms(150) && slept[0] <= ms(300), "drawn from [150ms, 300ms]: {slept:?}");
}

/// The budget's last stretch, as the issue measures it: a worker that always
/// exits 75, a 1s budget, 800ms delays: the last attempt starts 1s after the
/// first backoff exit (not up to a whole delay early), then its 75 is final.
#[test]
fn the_last_attempt_starts_when_the_budget_ends() {
    let dir = Scratch::new("budget-end");
    let rec = scripted(&dir, &[75]);
    let options = ["--backoff-delay", "800ms", "--backoff-max-delay", "800ms", "--backoff-timeout", "1s"];
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
    assert_eq!(run.wait(secs(20)).code, Some(75), "{}", run.log());
    let starts = starts(&rec);
    let (_, first_exit) = rec.attempt(1).end().expect("attempt 1 noted its exit");
    let last = Duration::from_nanos((starts[starts.len() - 1] - first_exit) as u64);
    assert!(last >= ms(950) && last < ms(1300), "the last attempt started {last:?} after the first backoff exit");
    assert_eq!(run.count_events("backoff_exhausted"), 1, "{}", run.log());
    check_log_end(&run.log(), 75).unwrap();
}

cases! {
    /// `--backoff-max-delay 200ms` alone (the default base is 1s) or with a
    /// 3s base, by flag or variable: the one sleep is at most 200ms.
    fn the_cap_caps_the_first_sleep(options: &[&str], env: &[(&str, &str)]) {
        let dir = Scratch::new("cap");
        let rec = scripted(&dir, &[75, 0]);
        let mut b = drainit(Mode::Subreaper, rec.worker_with(options));
        for (k, v) in env {
            b = b.env(k, v);
        }
        let mut run = b.spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let slept = delays(&run);
        assert!(slept.len() == 1 && slept[0] >= ms(100) && slept[0] <= ms(200), "{slept:?}");
        let starts = starts(&rec);
        assert!(gap(&starts, 0) < ms(200) + SECOND, "the restart took {:?}", gap(&starts, 0));
    }
    case flag_alone(&["--backoff-max-delay", "200ms"], &[]);
    case flag_with_a_3s_base(&["--backoff-delay", "3s", "--backoff-max-delay", "200ms"], &[]);
    case variable_alone(&[], &[("DRAINIT_BACKOFF_MAX_DELAY", "200ms")]);
    case variables_with_a_3s_base(&[], &[("DRAINIT_BACKOFF_DELAY", "3s"), ("DRAINIT_BACKOFF_MAX_DELAY", "200ms")]);
}

per_mode! {
    fn sigterm_during_the_sleep_exits_143_at_once(mode) {
        let dir = Scratch::new("sleep-stop");
        let rec = scripted(&dir, &[75]);
        let options = ["--backoff-delay", "10s", "--backoff-max-delay", "10s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(run.wait_log(&["event=backoff attempt=1"], secs(10)), "{}", run.log());
        run.signal(libc::SIGHUP);
        assert!(run.wait_log(&["event=signal_dropped signal=SIGHUP"], secs(5)), "{}", run.log());
        let sent = std::time::Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(5));
        assert_eq!(ended.code, Some(143), "{mode:?}: {}", run.log());
        assert!(sent.elapsed() < ms(500), "{mode:?}: took {:?}", sent.elapsed());
        assert_eq!(starts(&rec).len(), 1, "no new attempt");
    }
}

per_mode! {
    fn leftovers_of_an_attempt_are_gone_before_the_next_starts(mode) {
        let dir = Scratch::new("leftovers");
        // Attempt 1 leaves two children, one ignoring SIGTERM, and exits 75.
        let polite = Recorder::new(&dir, "polite");
        let stubborn = Recorder::new(&dir, "stubborn").term(Term::Ignore);
        let rec = scripted(&dir, &[75, 0])
            .on_attempt(1, |r| r.child(polite.clone()).child(stubborn.clone()));
        let options = ["-v", "--grace", "1s", "--orchestrator-timeout", "3s", "--backoff-delay", "100ms"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: {log}");
        assert!(polite.saw(libc::SIGTERM), "{mode:?}: {:?}", polite.seen());
        // drainit reaped both (they were dead) before it started attempt 2.
        let events = run.events();
        let second = events.iter().position(|e| e.name == "child_started" && e.num("attempt") == 2).expect(&log);
        for left in [&polite, &stubborn] {
            let pid = left.pid().unwrap() as i64;
            let reaped = events.iter().position(|e| e.name == "reaped" && e.num("pid") == pid);
            assert!(reaped.is_some_and(|r| r < second), "{mode:?}: leftover {pid} not reaped before attempt 2: {log}");
        }
        let deadline = events.iter().position(|e| e.name == "deadline_reached");
        assert!(deadline.is_some_and(|d| d < second), "the TERM-ignoring one needed the deadline: {log}");
    }
}

#[test]
fn custom_codes_by_flag() {
    let dir = Scratch::new("codes");
    let rec = scripted(&dir, &[3, 4, 75]);
    let options = ["--backoff-exit-code", "3", "--backoff-exit-code", "4", "--backoff-delay", "50ms"];
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(75), "75 is no longer a backoff code: {}", run.log());
    assert_eq!(starts(&rec).len(), 3);
}

#[test]
fn custom_codes_by_variable() {
    let dir = Scratch::new("codes-env");
    let rec = scripted(&dir, &[9, 0]);
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--backoff-delay", "50ms"]))
        .env("DRAINIT_BACKOFF_EXIT_CODES", "9,10")
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(starts(&rec).len(), 2);
}

#[test]
fn stop_before_a_backoff_exit_means_no_restart() {
    let dir = Scratch::new("stop-then-75");
    let rec = Recorder::new(&dir, "w").code(75);
    let mut run = drainit(Mode::Subreaper, rec.worker()).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(75), "{}", run.log());
    assert_eq!(run.count_events("backoff"), 0, "{}", run.log());
}
