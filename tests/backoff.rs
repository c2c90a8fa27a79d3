//! StartupBackoff: a worker that exits with a backoff code is restarted after
//! a jittered, doubling sleep (or the delay it asks for), until the budget
//! is spent; leftovers of an attempt are gone before the next one starts.

mod common;
use common::*;

use std::time::Duration;

/// The `delay=` of each `backoff` event, in order.
fn delays(run: &Running) -> Vec<Duration> {
    run.events().iter().filter(|e| e["event"] == "backoff").map(|e| parse_delay(&e["delay"])).collect()
}

fn parse_delay(text: &str) -> Duration {
    if let Some(n) = text.strip_suffix("ms") {
        ms(n.parse().unwrap())
    } else if let Some(n) = text.strip_suffix('s') {
        Duration::from_secs_f64(n.parse().unwrap())
    } else if let Some(n) = text.strip_suffix('m') {
        secs(60 * n.parse::<u64>().unwrap())
    } else {
        panic!("delay {text}")
    }
}

/// A worker that records each start (attempt and time) and exits with the
/// next code of `codes` (the last one repeats).
fn scripted(dir: &Scratch, codes: &[i32]) -> String {
    let starts = path_str(&dir.path("starts"));
    let list = codes.iter().map(i32::to_string).collect::<Vec<_>>().join(" ");
    format!(
        "echo \"$DRAINIT_ATTEMPT $(date +%s%N)\" >> {starts}; set -- {list}; \
         n=$DRAINIT_ATTEMPT; while [ $n -gt 1 ] && [ $# -gt 1 ]; do shift; n=$((n-1)); done; exit $1"
    )
}

/// (attempt, start time in ns) of each start.
fn starts(dir: &Scratch) -> Vec<(u32, u128)> {
    dir.lines("starts")
        .iter()
        .map(|l| {
            let (a, t) = l.split_once(' ').unwrap();
            (a.parse().unwrap(), t.parse().unwrap())
        })
        .collect()
}

#[test]
fn exits_75_twice_then_0() {
    for mode in MODES {
        let dir = Scratch::new("backoff");
        let options = ["--backoff-delay", "400ms", "--backoff-max-delay", "2s"];
        let mut run = drainit(mode, with_sh(&options, &scripted(&dir, &[75, 75, 0]))).spawn();
        let ended = run.wait(secs(20));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        let starts = starts(&dir);
        assert_eq!(starts.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3], "{mode:?}");
        let slept = delays(&run);
        assert_eq!(slept.len(), 2, "{}", run.log());
        // Jitter: each sleep is in [base/2, base]; the base doubles.
        assert!(slept[0] >= ms(200) && slept[0] <= ms(400), "{slept:?}");
        assert!(slept[1] >= ms(400) && slept[1] <= ms(800), "{slept:?}");
        // The restarts really waited that long (and not much longer).
        for (i, pair) in starts.windows(2).enumerate() {
            let gap = Duration::from_nanos((pair[1].1 - pair[0].1) as u64);
            assert!(gap >= slept[i] && gap < slept[i] + ms(1500), "{mode:?} gap {i}: {gap:?} for {:?}", slept[i]);
        }
        let log = run.log();
        assert!(log.contains("event=backoff attempt=1 code=75"), "{log}");
        assert!(log.contains("event=backoff attempt=2 code=75"), "{log}");
        assert!(log.contains("event=child_started pid=") && log.contains("attempt=3"), "{log}");
    }
}

#[test]
fn gives_up_when_the_budget_is_spent() {
    let dir = Scratch::new("exhaust");
    let options = ["--backoff-delay", "200ms", "--backoff-max-delay", "400ms", "--backoff-timeout", "2s"];
    let mut run = drainit(Mode::Subreaper, with_sh(&options, &scripted(&dir, &[75]))).spawn();
    let ended = run.wait(secs(20));
    assert_eq!(ended.code, Some(75), "{}", run.log());
    // Sleeps of 100-400ms go on while they end inside 2s of the first exit.
    assert!(ended.after >= ms(1500) && ended.after < ms(4000), "gave up after {:?}", ended.after);
    let exhausted = run.events().into_iter().find(|e| e["event"] == "backoff_exhausted").expect("backoff_exhausted");
    let attempts: usize = exhausted["attempts"].parse().unwrap();
    assert_eq!(attempts, starts(&dir).len(), "{}", run.log());
    assert!(parse_delay(&exhausted["elapsed"]) <= secs(2), "{exhausted:?}");
    assert!(run.log().ends_with("drainit: event=exit code=75\n"), "{}", run.log());
}

#[test]
fn retry_after_file_sets_the_exact_delay_and_is_removed() {
    let dir = Scratch::new("retry");
    let removed = path_str(&dir.path("removed"));
    let starts_file = path_str(&dir.path("starts"));
    let script = format!(
        "echo \"$DRAINIT_ATTEMPT $(date +%s%N)\" >> {starts_file}; \
         if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then echo 300ms > \"$DRAINIT_RETRY_AFTER_FILE\"; exit 75; fi; \
         [ -e \"$DRAINIT_RETRY_AFTER_FILE\" ] || touch {removed}; exit 0"
    );
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "5s"], &script)).spawn();
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert_eq!(delays(&run), [ms(300)], "{}", run.log());
    let starts = starts(&dir);
    let gap = Duration::from_nanos((starts[1].1 - starts[0].1) as u64);
    assert!(gap >= ms(300) && gap < ms(1500), "{gap:?}");
    assert!(dir.exists("removed"), "drainit removes the file after reading it");
}

#[test]
fn a_retry_after_file_left_from_before_does_not_count() {
    // drainit removes the file before every attempt (not when it exits): a
    // value a worker left behind, in this run or an earlier one, is never
    // read for a later backoff exit.
    let dir = Scratch::new("leftover");
    let file = dir.path("retry-after");
    std::fs::write(&file, "10ms").unwrap();
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "400ms"], &scripted(&dir, &[75, 0])))
        .env("DRAINIT_RETRY_AFTER_FILE", path_str(&file))
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let delays = delays(&run);
    assert!(delays.len() == 1 && delays[0] >= ms(200), "the normal delay, not 10ms: {delays:?}\n{}", run.log());
}

#[test]
fn retry_after_is_clamped_to_the_max_delay() {
    let dir = Scratch::new("clamp");
    let script = format!(
        "{}; [ \"$DRAINIT_ATTEMPT\" = 1 ] && echo 1h > \"$DRAINIT_RETRY_AFTER_FILE\" && exit 75; exit 0",
        scripted(&dir, &[0]).split("; set --").next().unwrap()
    );
    let mut run =
        drainit(Mode::Subreaper, with_sh(&["--backoff-max-delay", "500ms", "--backoff-delay", "100ms"], &script))
            .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(delays(&run), [ms(500)]);
}

#[test]
fn garbage_in_the_retry_after_file_warns_and_uses_the_normal_delay() {
    let dir = Scratch::new("garbage");
    let script = "[ \"$DRAINIT_ATTEMPT\" = 1 ] && echo 'soon-ish' > \"$DRAINIT_RETRY_AFTER_FILE\" && exit 75; exit 0";
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "200ms"], script)).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let log = run.log();
    assert!(log.contains("event=retry_after_invalid") && log.contains("soon-ish"), "{log}");
    let slept = delays(&run);
    assert!(slept.len() == 1 && slept[0] >= ms(100) && slept[0] <= ms(200), "{slept:?}");
    drop(dir);
}

#[test]
fn sigterm_during_the_sleep_exits_143_at_once() {
    for mode in MODES {
        let dir = Scratch::new("sleep-stop");
        let mut run =
            drainit(mode, with_sh(&["--backoff-delay", "10s", "--backoff-max-delay", "10s"], &scripted(&dir, &[75])))
                .spawn();
        assert!(run.wait_log(&["event=backoff attempt=1"], secs(10)), "{}", run.log());
        run.signal(libc::SIGHUP);
        assert!(run.wait_log(&["event=signal_dropped signal=SIGHUP"], secs(5)), "{}", run.log());
        let sent = std::time::Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(5));
        assert_eq!(ended.code, Some(143), "{mode:?}: {}", run.log());
        assert!(sent.elapsed() < ms(500), "{mode:?}: took {:?}", sent.elapsed());
        assert_eq!(starts(&dir).len(), 1, "no new attempt");
    }
}

#[test]
fn leftovers_of_an_attempt_are_gone_before_the_next_starts() {
    for mode in MODES {
        let dir = Scratch::new("leftovers");
        let (log, pids) = (path_str(&dir.path("log")), path_str(&dir.path("pids")));
        // Attempt 1 leaves two background children, one ignoring SIGTERM,
        // that write "alive" every 20ms; attempt 2 records when it starts.
        let script = format!(
            "if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then \
               sh -c 'echo $$ >> {pids}; while :; do echo alive >> {log}; sleep 0.02; done' & \
               sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do echo alive >> {log}; sleep 0.02; done' & \
               while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done; exit 75; \
             fi; echo attempt2 >> {log}; exit 0"
        );
        let options = ["--grace", "1s", "--orchestrator-timeout", "3s", "--backoff-delay", "100ms"];
        let mut run = drainit(mode, with_sh(&options, &script)).spawn();
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        let lines = dir.lines("log");
        let at = lines.iter().position(|l| l == "attempt2").expect("attempt 2 ran");
        assert!(!lines[at + 1..].contains(&"alive".to_string()), "{mode:?}: a leftover ran during attempt 2");
        for pid in dir.lines("pids") {
            assert!(!alive(pid.parse().unwrap()) || mode == Mode::Pid1, "{mode:?}: leftover {pid} alive");
        }
        assert!(
            run.log().contains("event=deadline_reached"),
            "the TERM-ignoring one needed the deadline: {}",
            run.log()
        );
    }
}

#[test]
fn custom_codes_by_flag_and_variable() {
    let dir = Scratch::new("codes");
    let mut run = drainit(
        Mode::Subreaper,
        with_sh(
            &["--backoff-exit-code", "3", "--backoff-exit-code", "4", "--backoff-delay", "50ms"],
            &scripted(&dir, &[3, 4, 75]),
        ),
    )
    .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(75), "75 is no longer a backoff code: {}", run.log());
    assert_eq!(starts(&dir).len(), 3);

    let dir = Scratch::new("codes-env");
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "50ms"], &scripted(&dir, &[9, 0])))
        .env("DRAINIT_BACKOFF_EXIT_CODES", "9,10")
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(starts(&dir).len(), 2);
}

#[test]
fn stop_before_a_backoff_exit_means_no_restart() {
    let dir = Scratch::new("stop-then-75");
    let ready = path_str(&dir.path("ready"));
    let script = format!("trap 'exit 75' TERM; touch {ready}; while :; do sleep 0.05; done");
    let mut run = drainit(Mode::Subreaper, sh(&script)).spawn();
    assert!(wait_until(secs(10), || dir.exists("ready")));
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(75), "{}", run.log());
    assert_eq!(run.count_events("backoff"), 0);
}
