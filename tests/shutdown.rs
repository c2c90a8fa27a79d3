//! Shutdown: the grace clock, the deadline's SIGKILL, and what the worker
//! leaves behind when it exits.

mod common;
use common::*;

#[test]
fn worker_ignoring_sigterm_is_killed_at_the_deadline() {
    for mode in MODES {
        let dir = Scratch::new("deadline");
        let ready = path_str(&dir.path("ready"));
        let mut run = drainit(
            mode,
            with_sh(
                &["--grace", "1s", "--orchestrator-timeout", "3s"],
                &format!("trap '' TERM; touch {ready}; while :; do sleep 0.05; done"),
            ),
        )
        .spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")));
        let sent = std::time::Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let took = sent.elapsed();
        assert_eq!(ended.code, Some(137), "{mode:?}: {}", run.log());
        assert!(took >= ms(1000) && took < ms(2500), "{mode:?}: exited {took:?} after SIGTERM");
        let log = run.log();
        assert!(log.contains("event=stop_requested signal=SIGTERM grace=1s"), "{log}");
        let deadline = run.events().into_iter().find(|e| e["event"] == "deadline_reached").expect(&log);
        assert!(deadline["remaining"].parse::<usize>().unwrap() >= 1, "{log}");
        assert!(log.contains("signal=SIGKILL code=137") && log.contains("event=exit code=137"), "{log}");
    }
}

#[test]
fn a_second_stop_signal_does_not_move_the_deadline() {
    let dir = Scratch::new("second");
    let ready = path_str(&dir.path("ready"));
    let mut run = drainit(
        Mode::Subreaper,
        with_sh(&["--grace", "1500ms"], &format!("trap '' TERM INT; touch {ready}; while :; do sleep 0.05; done")),
    )
    .spawn();
    assert!(wait_until(secs(10), || dir.exists("ready")));
    let sent = std::time::Instant::now();
    run.signal(libc::SIGTERM);
    std::thread::sleep(ms(700));
    run.signal(libc::SIGINT);
    let ended = run.wait(secs(10));
    let took = sent.elapsed();
    assert_eq!(ended.code, Some(137));
    assert!(took >= ms(1500) && took < ms(3000), "exited {took:?} after the first SIGTERM");
    assert_eq!(run.count_events("stop_requested"), 1, "{}", run.log());
}

#[test]
fn orderly_stop_exits_with_the_workers_code_well_inside_the_grace() {
    for mode in MODES {
        let dir = Scratch::new("orderly");
        let (ready, done) = (path_str(&dir.path("ready")), path_str(&dir.path("done")));
        let script =
            format!("trap 'sleep 0.3; touch {done}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done");
        let mut run = drainit(mode, with_sh(&["--grace", "5s"], &script)).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")));
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert!(dir.exists("done"));
        assert_eq!(run.count_events("deadline_reached"), 0, "{}", run.log());
    }
}

#[test]
fn worker_killed_by_the_forwarded_sigterm_gives_143() {
    let mut run = drainit(Mode::Pid1, sh("sleep 30 & wait")).spawn();
    assert!(run.wait_log(&["event=child_started"], secs(10)));
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(143), "{}", run.log());
}

#[test]
fn leftovers_get_sigterm_and_are_waited_for() {
    for mode in MODES {
        let dir = Scratch::new("leftover");
        let (up, cleaned) = (path_str(&dir.path("up")), path_str(&dir.path("cleaned")));
        // The worker leaves a child that needs 500ms to clean up after SIGTERM.
        let script = format!(
            "sh -c \"trap 'sleep 0.5; touch {cleaned}; exit 0' TERM; touch {up}; while :; do sleep 0.05; done\" & \
             while [ ! -e {up} ]; do sleep 0.01; done; exit 3"
        );
        let mut run = drainit(mode, with_sh(&["--grace", "5s"], &script)).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(3), "{mode:?}: the worker's code; {}", run.log());
        assert!(dir.exists("cleaned"), "{mode:?}: the leftover finished its cleanup before drainit exited");
        assert_eq!(run.count_events("deadline_reached"), 0, "{}", run.log());
    }
}

#[test]
fn leftovers_ignoring_sigterm_are_killed_at_exit_plus_grace() {
    for mode in MODES {
        let dir = Scratch::new("stubborn");
        let (up, pidfile) = (path_str(&dir.path("up")), path_str(&dir.path("pid")));
        let script = format!(
            "sh -c \"trap '' TERM; echo \\$\\$ > {pidfile}; touch {up}; while :; do sleep 0.05; done\" & \
             while [ ! -e {up} ]; do sleep 0.01; done; exit 0"
        );
        let mut run = drainit(mode, with_sh(&["--grace", "1s", "--orchestrator-timeout", "2s"], &script)).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: the worker's code, not 137; {}", run.log());
        assert!(ended.after >= ms(1000), "{mode:?}: waited the grace: {:?}", ended.after);
        assert_eq!(run.count_events("deadline_reached"), 1, "{}", run.log());
        if mode == Mode::Subreaper {
            let pid: i32 = dir.read("pid").trim().parse().unwrap();
            assert!(!alive(pid), "the leftover {pid} outlived drainit");
        }
    }
}

#[test]
fn subreaper_kills_a_descendant_that_left_the_group() {
    let dir = Scratch::new("escapee");
    let (up, pidfile) = (path_str(&dir.path("up")), path_str(&dir.path("pid")));
    let script = format!(
        "setsid sh -c \"trap '' TERM; echo \\$\\$ > {pidfile}; touch {up}; while :; do sleep 0.05; done\" & \
         while [ ! -e {up} ]; do sleep 0.01; done; exit 0"
    );
    let mut run =
        drainit(Mode::Subreaper, with_sh(&["--grace", "1s", "--orchestrator-timeout", "2s"], &script)).spawn();
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(0), "{}", run.log());
    let pid: i32 = dir.read("pid").trim().parse().unwrap();
    assert!(!alive(pid), "the escapee {pid} outlived drainit: {}", run.log());
}

#[test]
fn pid1_kills_every_process_in_the_namespace() {
    let dir = Scratch::new("ns");
    let up = path_str(&dir.path("up"));
    // A daemon that double-forks and leaves the session, ignoring SIGTERM.
    let script = format!(
        "(setsid sh -c \"trap '' TERM; touch {up}; while :; do sleep 0.05; done\" &) ; \
         while [ ! -e {up} ]; do sleep 0.01; done; exit 4"
    );
    let mut run = drainit(Mode::Pid1, with_sh(&["--grace", "1s", "--orchestrator-timeout", "2s"], &script)).spawn();
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(4), "{}", run.log());
    assert_eq!(run.count_events("deadline_reached"), 1, "{}", run.log());
}
