//! Reaping: orphans that come to drainit (as PID 1 or as subreaper) are
//! reaped at once, and nothing is left when it exits.

mod kit;
use kit::*;

per_mode! {
    fn double_forked_orphans_leave_no_zombie(mode) {
        let dir = Scratch::new("orphans");
        // 20 orphans (double forks) that exit by themselves soon after they
        // are up; the worker stays up until SIGTERM.
        let mut worker = Recorder::new(&dir, "w");
        for i in 0..20 {
            worker = worker.child(Recorder::new(&dir, &format!("o{i}")).orphan().exit_after(100, 0));
        }
        let mut run = drainit(mode, worker.worker_with(&["-v"])).spawn();
        assert!(worker.wait_ready(secs(20)), "{mode:?}: {}", run.log());
        // Each orphan was reparented to drainit, exited, and was reaped.
        assert!(
            wait_until(secs(10), || run.count_events("reaped") >= 20),
            "{mode:?}: reaped {} orphans; log:\n{}",
            run.count_events("reaped"),
            run.log()
        );
        assert!(wait_until(secs(5), || HOST.zombie_children(run.pid).is_empty()), "{mode:?}: zombies under drainit");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
    }
}

per_mode! {
    fn orphans_of_the_worker_are_reaped_with_their_status(mode) {
        let dir = Scratch::new("status");
        let rec = Recorder::new(&dir, "w");
        // Two orphans: one exits 9, one dies of SIGUSR1; then the worker
        // becomes the recorder and waits for SIGTERM.
        let script = format!(
            "(sh -c 'exit 9' &); (sh -c 'kill -USR1 $$' &); exec {}",
            rec.argv().join(" ")
        );
        let mut run = drainit(mode, with_sh(&["-v"], &script)).spawn();
        let statuses = |run: &Running| -> Vec<(String, String)> {
            run.events()
                .iter()
                .filter(|e| e.name == "reaped")
                .map(|e| (e.get("signal").unwrap_or("").to_string(), e["code"].to_string()))
                .collect()
        };
        let want = |s: &[(String, String)]| {
            s.contains(&(String::new(), "9".into())) && s.contains(&("SIGUSR1".into(), "138".into()))
        };
        assert!(wait_until(secs(10), || want(&statuses(&run))), "{mode:?}: {:?}\n{}", statuses(&run), run.log());
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    }
}

#[test]
fn idle_drainit_does_not_wake_up() {
    idle_without_wakeups(&[]);
}

/// With the readiness options: the notify socket and the watchdog's timer
/// in the same wait, and still no wakeup while no message comes.
#[test]
fn idle_drainit_with_the_watchdog_does_not_wake_up() {
    let dir = Scratch::new("idle-wd");
    let ready = path_str(&dir.path("ready"));
    idle_without_wakeups(&["--watchdog", "1h", "--ready-timeout", "1h", "--ready-file", &ready]);
}

fn idle_without_wakeups(options: &[&str]) {
    let dir = Scratch::new("idle");
    let rec = Recorder::new(&dir, "w").term(Term::Default);
    let mut run = drainit(Mode::Subreaper, rec.worker_with(options)).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    // Settled: no switch for 200ms (start-up is over), then a 2s window.
    let switches = || HOST.ctxt_switches(run.pid);
    let mut last = (switches(), std::time::Instant::now());
    let settled = wait_until(secs(5), || {
        let now = switches();
        if now != last.0 {
            last = (now, std::time::Instant::now());
        }
        last.1.elapsed() >= ms(200)
    });
    assert!(settled, "drainit never settled: {} switches", switches());
    let before = switches();
    // The idle window itself (the scenario, not a wait): nothing may wake
    // drainit in it.
    std::thread::sleep(secs(2));
    let after = switches();
    assert_eq!(after - before, 0, "drainit woke {} times while idle", after - before);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(143));
}
