//! Hostile descendants: processes that escape the worker's group (own
//! sessions, double forks, one started by SIGTERM itself), a fork bomb at
//! shutdown, and an unrelated process group that reuses the worker's id. In
//! each case drainit exits with a truthful code, never panics or hangs,
//! leaves nothing it started behind, and signals nothing it did not start.
//!
//! Measurements go to stderr (`cargo test --test hostile -- --nocapture`).
//! DRAINIT_LONG=1 repeats the fork bomb five times per case.

mod kit;
use kit::*;

use std::time::{Duration, Instant};

const BOMB: &str = include_str!("kit/bomb.c");

per_mode! {
    /// A worker whose descendants leave its process group: A (own session,
    /// exits on SIGTERM), B (a double-forked daemon in its own session,
    /// ignores SIGTERM) and C (own session; SIGTERM makes it start D, a fresh
    /// session that ignores SIGTERM, and exit). The worker exits 0 as soon as
    /// A, B and C are up, leaving all of them to drainit.
    fn escapees_are_terminated(mode) {
        let dir = Scratch::new("escapees");
        let a = Recorder::new(&dir, "A").setsid();
        let b = Recorder::new(&dir, "B").orphan().setsid().term(Term::Ignore);
        let d = Recorder::new(&dir, "D").setsid().term(Term::Ignore);
        let c = Recorder::new(&dir, "C").setsid().child_on_stop(d.clone());
        let worker = Recorder::new(&dir, "w").child(a.clone()).child(b.clone()).child(c.clone()).exit_after(0, 0);
        let mut run = drainit(mode, worker.worker_with(&["--grace", "2s", "--orchestrator-timeout", "3s"])).spawn();
        assert!(d.wait_ready(secs(10)), "{mode:?}: C never got SIGTERM to start D; log:\n{}", run.log());
        // Every process drainit answers for, in the test's pid numbering.
        let mut pids = HOST.descendants(run.pid);
        if mode == Mode::Subreaper {
            pids.extend([&a, &b, &c, &d].iter().map(|r| r.pid().unwrap()));
        }
        let ended = run.wait(secs(15));
        let after_worker = since_exit(&worker);
        // Still alive, and still ours (its command line names the scratch
        // directory): a reused pid is not a leftover.
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive_as(p, &dir.str())).collect();
        eprintln!(
            "escapees {mode:?}: exit {:?} after {:?}; {} processes watched, {} alive after",
            ended.code,
            ended.after,
            pids.len(),
            left.len()
        );
        assert_eq!(ended.code, Some(0), "{mode:?}: the worker's code; log:\n{}", run.log());
        assert_eq!(a.exit_code(), Some(0), "{mode:?}: the escapee A never got drainit's SIGTERM");
        assert_eq!(run.count_events("deadline_reached"), 1, "{mode:?}: B and D ignore SIGTERM; log:\n{}", run.log());
        assert!(left.is_empty(), "{mode:?}: outlived drainit: {left:?}");
        assert!(
            after_worker >= secs(2) && after_worker < secs(3),
            "{mode:?}: exited {after_worker:?} after the worker: grace 2s, orchestrator timeout 3s"
        );
        check_log_end(&run.log(), 0).unwrap();
    }
}

/// How long drainit outlived `rec`'s own exit (as it noted it): call it
/// right after `run.wait`.
fn since_exit(rec: &Recorder) -> Duration {
    rec.since_end()
}

/// The orchestrator timeout of the fork bomb runs: its SIGKILL is the bound.
const BOMB_ORCHESTRATOR_TIMEOUT: Duration = Duration::from_secs(2);

/// How late drainit exits after a 300ms grace with a worker that only
/// ignores SIGTERM: the machine's lateness without a bomb, for the report.
fn deadline_lateness(mode: Mode, grace: Duration) -> Duration {
    let dir = Scratch::new("bomb-base");
    let rec = Recorder::new(&dir, "w").term(Term::Ignore);
    let mut run = drainit(mode, rec.worker_with(&["--grace", "300ms", "--orchestrator-timeout", "2s"])).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    let sent = Instant::now();
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(137), "{}", run.log());
    sent.elapsed().saturating_sub(grace)
}

per_mode! {
    /// A worker that answers SIGTERM with a fork bomb, in its group or
    /// leaving it with setsid: the deadline still ends everything.
    fn fork_bomb_after_sigterm_is_ended_by_the_deadline(mode, how: &str) {
        let _heavy = heavy();
        let bomb = c_helper("bomb", BOMB);
        // A short grace: the bomb is capped at 8,000 forks (pid_max is 32,768
        // on a shared machine) at 10 per ms, so it is still forking at the
        // deadline.
        let grace = ms(300);
        let baseline = deadline_lateness(mode, grace);
        for round in 0..if long_mode() { 5 } else { 1 } {
            let dir = Scratch::new("bomb");
            let (ready, forks) = (path_str(&dir.path("ready")), path_str(&dir.path("forks")));
            let args = ["--grace", "300ms", "--orchestrator-timeout", "2s", "--", &path_str(&bomb), "200", "8000", how];
            let mut run = drainit(mode, args.iter().copied().chain([ready.as_str(), forks.as_str()])).spawn();
            assert!(wait_until(secs(10), || dir.exists("ready")), "{mode:?}: bomb not ready; {}", run.log());
            let sent = Instant::now();
            run.signal(libc::SIGTERM);
            // When the deadline_reached line shows up (after the deadline's
            // SIGKILLs went out) splits the lateness into "until the kill"
            // and "reaping after it".
            let mut killed_at = None;
            // Whether the bomb forked at all, as seen from here: its own
            // report can come too late when hundreds of bomb processes
            // compete for 2 cores (the reporter is preempted for the whole
            // grace), so the test also looks for a second bomb process.
            let mut most_seen = 0;
            let ended = wait_until(secs(15), || {
                if killed_at.is_none() && run.log().contains("event=deadline_reached") {
                    killed_at = Some(sent.elapsed());
                }
                if most_seen < 2 && killed_at.is_none() {
                    most_seen = most_seen.max(HOST.running(&bomb).len());
                }
                run.try_ended()
            });
            let took = sent.elapsed();
            let left = HOST.running(&bomb);
            for p in &left {
                // SAFETY: kill with integers; clean up before failing.
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            assert!(ended, "{mode:?}/{how}: drainit still runs 15s after SIGTERM; log:\n{}", run.log());
            let ended = run.wait(secs(1));
            let late = took.saturating_sub(grace);
            eprintln!(
                "fork bomb {mode:?}/{how} round {round}: {} forks after SIGTERM; deadline_reached logged {killed_at:?} \
                 after SIGTERM; exit {:?} {took:?} after SIGTERM (grace {grace:?}, late by {late:?}; without a bomb: \
                 {baseline:?}); {} bomb processes left",
                dir.read("forks").trim(),
                ended.code,
                left.len()
            );
            // Or drainit's own count at the deadline: with thousands of bomb
            // processes this test's thread may not run between the SIGTERM
            // and the deadline_reached line at all.
            let alive_at_deadline = run.event("deadline_reached").map_or(0, |e| e.num("remaining"));
            assert!(
                dir.read("forks").trim().parse::<u64>().unwrap_or(0) > 0 || most_seen > 1 || alive_at_deadline > 1,
                "the bomb never forked; log:\n{}",
                run.log()
            );
            assert_eq!(ended.code, Some(137), "{mode:?}/{how}: the deadline killed the worker; log:\n{}", run.log());
            assert!(took >= grace - ms(20), "{mode:?}/{how}: exited {took:?} after SIGTERM, before the grace");
            // With hundreds of runnable bomb processes on shared cores
            // drainit waits for a CPU before and after its kill, so it may
            // end well after its own deadline (the measured lateness is
            // printed), but never after the orchestrator's SIGKILL: past it,
            // drainit's exit code, finish program and termination message
            // would be lost.
            assert!(
                took < BOMB_ORCHESTRATOR_TIMEOUT,
                "{mode:?}/{how}: exited {took:?} after SIGTERM ({late:?} after the deadline): the orchestrator \
                 would have SIGKILLed it at {BOMB_ORCHESTRATOR_TIMEOUT:?}"
            );
            assert!(left.is_empty(), "{mode:?}/{how}: {} bomb processes outlived drainit", left.len());
            check_log_end(&run.log(), 137).unwrap();
        }
    }
    case in_the_group("group");
    case in_new_sessions("setsid");
}

/// As a subreaper drainit shares pid numbers with every process around it.
/// Once the worker's group is gone, its id can name a new, unrelated group;
/// drainit must not forward signals to it, nor SIGTERM or SIGKILL it. The
/// run has a PID namespace of its own (drainit is not PID 1 there), so the
/// test can hand the worker's pid to an unrelated recorder deterministically.
#[test]
fn subreaper_never_signals_a_reused_group_id() {
    let dir = Scratch::new("reuse");
    // The worker leaves an escapee (own session, ignores SIGTERM) so that
    // drainit waits the whole grace after the worker is gone.
    let escapee = Recorder::new(&dir, "esc").setsid().term(Term::Ignore);
    let worker = Recorder::new(&dir, "w").child(escapee.clone()).exit_after(0, 0);
    let mut run = drainit(Mode::Subreaper, worker.worker_with(&["--grace", "3s", "--orchestrator-timeout", "4s"]))
        .private_pid_namespace()
        .spawn();
    let ns = run.ns_proc();
    assert!(run.wait_log(&["event=child_exited"], secs(10)), "{}", run.log());
    let pid = run.event("child_started").expect("child_started").num("pid") as i32;
    assert!(
        wait_until(secs(5), || !ns.exists(pid) && ns.group(pid).is_empty()),
        "the worker's group {pid} lingers: {:?}",
        ns.group(pid)
    );
    // An unrelated process group with the worker's id: a recorder that
    // records every signal and survives SIGTERM.
    let victim = Recorder::new(&dir, "victim").term(Term::Record);
    let mut outside = run.spawn_with_pid(pid, &victim.argv());
    assert!(victim.wait_ready(secs(10)), "could not start pid {pid} in the namespace: {:?}", outside.try_wait());
    assert_eq!(ns.stat(pid).map(|s| (s.pid, s.pgrp)), Some((pid, pid)), "the victim leads group {pid}");
    // A signal forwarded now may only reach what is left of the worker's
    // group (nothing), never the new group with the same id.
    run.signal(libc::SIGHUP);
    let ended = run.wait(secs(10));
    let after_worker = since_exit(&worker);
    assert!(
        after_worker >= secs(3) && after_worker < secs(4),
        "exited {after_worker:?} after the worker: grace 3s, orchestrator timeout 4s"
    );
    eprintln!("reuse: worker pid {pid} reused by an unrelated group; it saw {:?}", victim.seen());
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert_eq!(run.count_events("deadline_reached"), 1, "{}", run.log());
    assert!(!ns.alive(escapee.pid().unwrap()), "the escapee outlived drainit");
    assert!(ns.alive(pid), "drainit killed the unrelated process group {pid}; log:\n{}", run.log());
    assert_eq!(victim.seen(), [], "drainit signalled the unrelated process group {pid}; log:\n{}", run.log());
    drop(run);
    let _ = outside.wait();
}
