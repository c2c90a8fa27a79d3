//! A long run, bounded for CI: 1,000 attempts (999 restarts on the backoff
//! code) with the watchdog on, each attempt a real sd_notify client (the
//! Rust sd-notify crate, in this test binary run again as the worker) that
//! finds WATCHDOG_PID naming itself (the crate ignores a watchdog whose
//! WATCHDOG_PID is not its own) and pings; no watchdog stop; drainit's
//! descriptors and anonymous memory the same at attempts 400, 700 and
//! 1,000. A few seconds per mode; each mode is bounded at 240 s.

mod kit;
use kit::*;

use std::time::{Duration, Instant};

/// Attempts in all; the worker holds at each of SAMPLES while the test
/// reads drainit's descriptors and memory.
const ATTEMPTS: u32 = 1000;
/// Where the test samples drainit's descriptors and anonymous memory: the
/// first once the allocator has reached its steady state (its heap grows in
/// one step of a few pages over the first few hundred attempts, then stays),
/// the rest to show it stays there.
const SAMPLES: [u32; 3] = [400, 700, ATTEMPTS];

/// Code the worker exits with when its watchdog is not its own.
const NOT_MINE: i32 = 3;

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

per_mode! {
    fn a_thousand_watched_attempts_with_flat_descriptors_and_memory(mode) {
        let dir = Scratch::new("long-run");
        let me = std::env::current_exe().unwrap();
        let argv: Vec<String> = vec![
            "--watchdog".into(),
            "2s".into(),
            "--backoff-delay".into(),
            "1ms".into(),
            "--backoff-max-delay".into(),
            "1ms".into(),
            "--backoff-timeout".into(),
            "10m".into(),
            "--".into(),
            me.to_str().unwrap().into(),
            "--exact".into(),
            "long_run_worker".into(),
            "--ignored".into(),
            "--nocapture".into(),
            "--test-threads=1".into(),
        ];
        let started = Instant::now();
        let mut run = drainit(mode, argv).env("DRAINIT_TEST_LONG_RUN_WORKER", dir.str()).watchdog(secs(240)).spawn();
        let mut samples = Vec::new();
        for attempt in SAMPLES {
            let at = format!("at-{attempt}");
            assert!(wait_until(secs(200), || dir.exists(&at) || run.try_ended()), "{mode:?}: {}", run.log());
            assert!(dir.exists(&at), "{mode:?}: ended before attempt {attempt}: {}", run.log());
            samples.push((attempt, open_fds(run.pid), HOST.anon_kib(run.pid)));
            std::fs::write(dir.path(&format!("go-{attempt}")), "").unwrap();
        }
        let ended = run.wait(secs(30));
        let log = run.log();
        let tail: String = log.lines().rev().take(12).collect::<Vec<_>>().join("\n");
        assert_eq!(ended.code, Some(0), "{mode:?}: {NOT_MINE} means an attempt's WATCHDOG_PID was not its own: {tail}");
        assert_eq!(run.count_events("child_started"), ATTEMPTS as usize, "{mode:?}: {tail}");
        assert_eq!(run.count_events("watchdog_expired"), 0, "{mode:?}: {tail}");
        let (first, last) = (samples[0], samples[SAMPLES.len() - 1]);
        println!("{mode:?}: {ATTEMPTS} attempts in {:?}; (attempt, fds, anonymous KiB): {samples:?}", started.elapsed());
        assert_eq!(first.1, last.1, "{mode:?}: descriptors grew: {samples:?}");
        assert!(first.1 > 0 && first.2 > 0, "{mode:?}: {samples:?}");
        assert!(last.2 <= first.2 + 16, "{mode:?}: anonymous memory grew by more than 16 KiB: {samples:?}");
    }
}

/// The worker of the test above; does nothing unless run as that worker.
#[test]
#[ignore = "the worker of a_thousand_watched_attempts_with_flat_descriptors_and_memory"]
fn long_run_worker() {
    let Some(dir) = std::env::var_os("DRAINIT_TEST_LONG_RUN_WORKER") else { return };
    let dir = std::path::PathBuf::from(dir);
    use sd_notify::NotifyState;
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) {
        std::process::exit(NOT_MINE);
    }
    let ping = || sd_notify::notify(false, &[NotifyState::Watchdog]).is_ok();
    assert!(sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Watchdog]).is_ok());
    let attempt: u32 = std::env::var("DRAINIT_ATTEMPT").ok().and_then(|a| a.parse().ok()).unwrap_or(0);
    if SAMPLES.contains(&attempt) {
        std::fs::write(dir.join(format!("at-{attempt}")), "").unwrap();
        let go = dir.join(format!("go-{attempt}"));
        let end = Instant::now() + Duration::from_secs(60);
        while !go.exists() && Instant::now() < end {
            assert!(ping());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::process::exit(if attempt < ATTEMPTS { 75 } else { 0 });
}
