//! Shutdown: the grace clock, the deadline's SIGKILL, and what the worker
//! leaves behind when it exits.

mod kit;
use kit::*;

use std::time::{Duration, Instant};

/// How long drainit outlived the worker's own exit (as the worker noted
/// it): call it right after `run.wait`. Leftovers are killed at that exit
/// plus the grace; drainit must be gone before the orchestrator timeout
/// from it too (a stop that came with the exit would be SIGKILLed then).
fn since_worker_exit(worker: &Recorder) -> Duration {
    worker.since_end()
}

per_mode! {
    /// The worker records SIGTERM and runs on (as one that ignores it would):
    /// the deadline comes a grace after the SIGTERM reached it (the worker's
    /// stamp, not the test's view of a loaded machine), and drainit is gone
    /// before the orchestrator's SIGKILL (the test's clock: that is what the
    /// orchestrator sees).
    fn worker_ignoring_sigterm_is_killed_at_the_deadline(mode) {
        let dir = Scratch::new("deadline");
        let rec = Recorder::new(&dir, "w").term(Term::Record);
        let mut run = drainit(mode, rec.worker_with(&["--grace", "1s", "--orchestrator-timeout", "3s"])).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        let (sent, sent_ns) = (Instant::now(), monotonic_ns());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        let took = sent.elapsed();
        let gone = monotonic_ns();
        let log = run.log();
        assert_eq!(ended.code, Some(137), "{mode:?}: {log}");
        assert!(took < ms(3000), "{mode:?}: exited {took:?} after SIGTERM: past the orchestrator's SIGKILL at 3s");
        let got = rec.received_timed();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [libc::SIGTERM], "{mode:?}: {log}");
        // The grace counts from drainit's receipt of the SIGTERM, a moment
        // before the worker's stamp and after the test sent it: the bound
        // counts from the send (load only makes `gone` later).
        let lived = between(sent_ns, gone);
        assert!(lived >= ms(1000), "{mode:?}: gone {lived:?} after the SIGTERM was sent, grace 1s");
        assert!(between(sent_ns, got[0].1) < lived, "{mode:?}: the worker's stamp comes before drainit's end");
        let stop = run.event("stop_requested").expect(&log);
        assert_eq!((&stop["signal"], &stop["grace"]), ("SIGTERM", "1s"), "{log}");
        let deadline = run.event("deadline_reached").expect(&log);
        assert!(deadline.num("remaining") >= 1, "{log}");
        let exited = run.event("child_exited").expect(&log);
        assert_eq!((&exited["signal"], exited.num("code")), ("SIGKILL", 137), "{log}");
        check_log_end(&log, 137).unwrap();
    }
}

#[test]
fn a_second_stop_signal_does_not_move_the_deadline() {
    let dir = Scratch::new("second");
    let rec = Recorder::new(&dir, "w").term(Term::Record);
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--grace", "2s"])).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    let sent = Instant::now();
    run.signal(libc::SIGTERM);
    assert!(rec.wait_seen(libc::SIGTERM, secs(1)), "the first stop signal was forwarded: {}", run.log());
    // The second one comes 1s into the 2s grace (the scenario's timing, not a
    // wait): a deadline it restarted would end drainit 1s late.
    std::thread::sleep((sent + SECOND).saturating_duration_since(Instant::now()));
    let second = monotonic_ns();
    run.signal(libc::SIGINT);
    assert!(rec.wait_seen(libc::SIGINT, secs(1)), "the second stop signal was forwarded: {}", run.log());
    let ended = run.wait(secs(10));
    let gone = monotonic_ns();
    assert_eq!(ended.code, Some(137), "{}", run.log());
    assert_eq!(run.count_events("stop_requested"), 1, "{}", run.log());
    // Each forwarded once, in order, the second one when it was sent.
    let got = rec.received_timed();
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [libc::SIGTERM, libc::SIGINT], "{}", run.log());
    assert!(got[1].1 >= second, "{got:?}");
    // The worker's stamps: the deadline is the first SIGTERM's plus the grace,
    // not the second signal's (a restarted deadline ends drainit a grace after
    // the SIGINT reached the worker, or later).
    let (first, again) = (got[0].1, got[1].1);
    assert!(
        between(first, gone) >= ms(2000),
        "exited {:?} after the first SIGTERM reached the worker",
        between(first, gone)
    );
    assert!(
        between(again, gone) < ms(2000),
        "exited {:?} after the second signal reached the worker: the deadline moved",
        between(again, gone)
    );
}

per_mode! {
    fn orderly_stop_exits_with_the_workers_code_well_inside_the_grace(mode) {
        let dir = Scratch::new("orderly");
        // 300ms of cleanup after SIGTERM, then exit 0.
        let rec = Recorder::new(&dir, "w").linger(300);
        let mut run = drainit(mode, rec.worker_with(&["--grace", "5s"])).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert_eq!(rec.exit_code(), Some(0), "the worker finished its cleanup");
        assert_eq!(run.count_events("deadline_reached"), 0, "{}", run.log());
    }
}

per_mode! {
    fn worker_killed_by_the_forwarded_sigterm_gives_143(mode) {
        let dir = Scratch::new("143");
        let rec = Recorder::new(&dir, "w").term(Term::Default);
        let mut run = drainit(mode, rec.worker()).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(143), "{}", run.log());
    }
}

per_mode! {
    fn leftovers_get_sigterm_and_are_waited_for(mode) {
        let dir = Scratch::new("leftover");
        // The worker exits 3 once its child is up; the child needs 500ms to
        // clean up after SIGTERM.
        let leftover = Recorder::new(&dir, "left").linger(500);
        let worker = Recorder::new(&dir, "w").child(leftover.clone()).exit_after(0, 3);
        let mut run = drainit(mode, worker.worker_with(&["--grace", "5s"])).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(3), "{mode:?}: the worker's code; {}", run.log());
        assert!(leftover.saw(libc::SIGTERM), "{mode:?}: {:?}", leftover.seen());
        assert_eq!(leftover.exit_code(), Some(0), "{mode:?}: the leftover finished its cleanup before drainit exited");
        assert_eq!(run.count_events("deadline_reached"), 0, "{}", run.log());
    }
}

per_mode! {
    fn leftovers_ignoring_sigterm_are_killed_at_exit_plus_grace(mode) {
        let dir = Scratch::new("stubborn");
        let leftover = Recorder::new(&dir, "left").term(Term::Ignore);
        let worker = Recorder::new(&dir, "w").child(leftover.clone()).exit_after(0, 0);
        let mut run =
            drainit(mode, worker.worker_with(&["--grace", "1s", "--orchestrator-timeout", "2s"])).spawn();
        let ended = run.wait(secs(10));
        let after = since_worker_exit(&worker);
        assert_eq!(ended.code, Some(0), "{mode:?}: the worker's code, not 137; {}", run.log());
        assert!(after >= ms(1000) && after < secs(2), "{mode:?}: exited {after:?} after the worker, grace 1s, timeout 2s");
        assert_eq!(run.count_events("deadline_reached"), 1, "{}", run.log());
        if mode == Mode::Subreaper {
            let pid = leftover.pid().unwrap();
            assert!(!alive_as(pid, &dir.str()), "the leftover {pid} outlived drainit");
        }
    }
}

#[test]
fn subreaper_kills_a_descendant_that_left_the_group() {
    let dir = Scratch::new("escapee");
    let escapee = Recorder::new(&dir, "esc").setsid().term(Term::Ignore);
    let worker = Recorder::new(&dir, "w").child(escapee.clone()).exit_after(0, 0);
    let mut run =
        drainit(Mode::Subreaper, worker.worker_with(&["--grace", "1s", "--orchestrator-timeout", "2s"])).spawn();
    let ended = run.wait(secs(10));
    let after = since_worker_exit(&worker);
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert!(after >= ms(1000) && after < secs(2), "exited {after:?} after the worker, grace 1s, timeout 2s");
    let pid = escapee.pid().unwrap();
    assert!(!alive_as(pid, &dir.str()), "the escapee {pid} outlived drainit: {}", run.log());
}

#[test]
fn pid1_kills_every_process_in_the_namespace() {
    let dir = Scratch::new("ns");
    // A daemon that double-forks and leaves the session, ignoring SIGTERM.
    let daemon = Recorder::new(&dir, "daemon").orphan().setsid().term(Term::Ignore);
    let worker = Recorder::new(&dir, "w").child(daemon).exit_after(0, 4);
    let mut run = drainit(Mode::Pid1, worker.worker_with(&["--grace", "1s", "--orchestrator-timeout", "2s"])).spawn();
    let ended = run.wait(secs(10));
    let after = since_worker_exit(&worker);
    assert_eq!(ended.code, Some(4), "{}", run.log());
    assert!(after >= ms(1000) && after < secs(2), "exited {after:?} after the worker, grace 1s, timeout 2s");
    assert_eq!(run.count_events("deadline_reached"), 1, "{}", run.log());
}

/// As PID 1, a process that entered the namespace by setns (`docker exec`)
/// is not drainit's child, yet it is in the namespace: when the worker
/// exits, it gets SIGTERM (the kernel's SIGKILL at PID 1's exit is not the
/// contract's SIGTERM): drainit's `kill(-1)` reaches it even when drainit
/// has no child left. The finish program (run after the SIGTERM went
/// out) waits, bounded, for the entered process to record it: drainit's
/// exit would otherwise SIGKILL it before its handler ran.
#[test]
fn a_process_that_entered_the_namespace_gets_sigterm_when_the_worker_exits() {
    let dir = Scratch::new("entered");
    let entered = Recorder::new(&dir, "entered").term(Term::Record);
    let finish = dir.path("finish");
    let sequence = entered.dir().join("sequence");
    std::fs::write(
        &finish,
        format!(
            "#!/bin/sh\ni=0\nwhile [ ! -s '{}' ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n",
            sequence.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&finish, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let worker = Recorder::new(&dir, "w").exit_after(1500, 0);
    let finish = path_str(&finish);
    let options = ["--grace", "2s", "--orchestrator-timeout", "10s", "--finish", &finish, "--finish-timeout", "8s"];
    let mut run = drainit(Mode::Pid1, worker.worker_with(&options)).spawn();
    assert!(worker.wait_ready(secs(10)), "{}", run.log());
    let mut cmd = std::process::Command::new(&entered.argv()[0]);
    cmd.args(&entered.argv()[1..]).stdin(std::process::Stdio::null());
    enter_with_pid(&mut cmd, run.pid, 50);
    let mut outside = cmd.spawn().expect("spawn into drainit's namespace");
    assert!(entered.wait_ready(secs(10)), "could not enter the namespace: {:?}", outside.try_wait());
    let ended = run.wait(secs(15));
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert_eq!(entered.seen(), [libc::SIGTERM], "the entered process; log:\n{}", run.log());
    let _ = outside.wait();
}
