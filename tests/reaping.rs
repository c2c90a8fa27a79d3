//! Reaping: orphans that come to drainit (as PID 1 or as subreaper) are
//! reaped at once, and nothing is left when it exits.

mod common;
use common::*;

#[test]
fn double_forked_orphans_leave_no_zombie() {
    for mode in MODES {
        let dir = Scratch::new("orphans");
        let (pids, go) = (path_str(&dir.path("pids")), path_str(&dir.path("go")));
        // 20 orphans, each in a subshell that exits at once (double fork), that
        // live until told to go; the worker stays up meanwhile.
        let script = format!(
            "for i in $(seq 20); do (sh -c 'echo $$ >> {pids}; while [ ! -e {go} ]; do sleep 0.02; done' &); done; \
             trap 'exit 0' TERM; while :; do sleep 0.05; done"
        );
        let mut run = drainit(mode, with_sh(&["-v"], &script)).spawn();
        assert!(wait_until(secs(10), || dir.lines("pids").len() == 20), "{mode:?}: {}", run.log());
        std::fs::write(dir.path("go"), "").unwrap();
        // Each orphan was reparented to drainit, exited, and was reaped.
        assert!(
            wait_until(secs(10), || run.count_events("reaped") >= 20),
            "{mode:?}: reaped {} orphans; log:\n{}",
            run.count_events("reaped"),
            run.log()
        );
        assert!(wait_until(secs(5), || zombie_children(run.pid).is_empty()), "{mode:?}: zombies under drainit");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
    }
}

#[test]
fn orphans_of_the_worker_are_reaped_with_their_status() {
    let mut run =
        drainit(Mode::Pid1, with_sh(&["-v"], "(sh -c 'exit 9' &); (sh -c 'kill -USR1 $$' &); sleep 1")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let log = run.log();
    assert!(log.contains("code=9") && log.contains("signal=SIGUSR1 code=138"), "{log}");
}

#[test]
fn idle_drainit_does_not_wake_up() {
    let mut run = drainit(Mode::Subreaper, sh("sleep 30 & wait")).spawn();
    assert!(run.wait_log(&["event=child_started"], secs(10)));
    std::thread::sleep(ms(300));
    let switches = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", run.pid)).unwrap_or_default();
        status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let before = switches();
    std::thread::sleep(secs(2));
    let after = switches();
    assert_eq!(after - before, 0, "drainit woke {} times while idle", after - before);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(143));
}
