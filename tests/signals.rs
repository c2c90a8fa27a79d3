//! Forwarding: every signal reaches the worker's whole process group (a
//! grandchild included), after --rewrite; none is lost, even one sent
//! before the worker exists; drainit's own SIGPIPE is never forwarded.

mod kit;
use kit::*;

per_mode! {
    fn signals_reach_a_grandchild_in_the_group(mode) {
        let dir = Scratch::new("fwd");
        let grandchild = Recorder::new(&dir, "g");
        let worker = Recorder::new(&dir, "w").child(grandchild.clone());
        let mut run = drainit(mode, worker.worker()).spawn();
        assert!(worker.wait_ready(secs(10)), "{mode:?} worker not ready; {}", run.log());
        for sig in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGWINCH] {
            run.signal(sig);
            assert!(
                grandchild.wait_seen(sig, secs(5)) && worker.wait_seen(sig, secs(5)),
                "{mode:?} {sig} not seen; got {:?}; log:\n{}",
                grandchild.seen(),
                run.log()
            );
        }
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        // Each forwarded once, in the order sent (each was seen before the
        // next went out). The grandchild, left over once the worker exits,
        // may get drainit's leftover SIGTERM as well.
        let want = [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGWINCH, libc::SIGTERM];
        assert_eq!(worker.received_sequence(), want, "{mode:?}: the worker; log:\n{}", run.log());
        let g = grandchild.received_sequence();
        assert!(
            g.starts_with(&want) && g[want.len()..].iter().all(|&s| s == libc::SIGTERM),
            "{mode:?}: the grandchild got {g:?}, not {want:?}; log:\n{}",
            run.log()
        );
        assert_eq!(run.count_events("stop_requested"), 1);
    }
}

cases! {
    /// SIGTERM goes out as `expect`, SIGUSR1 goes out unless dropped; the
    /// grace clock starts on SIGTERM all the same.
    fn rewrite_term(options: &[&str], expect: i32, usr1_dropped: bool) {
        let dir = Scratch::new("rewrite");
        let rec = Recorder::new(&dir, "w").exit_on(libc::SIGINT).exit_on(libc::SIGUSR2);
        let mut run = drainit(Mode::Subreaper, rec.worker_with(options)).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        run.signal(libc::SIGUSR1);
        assert!(usr1_dropped || rec.wait_seen(libc::SIGUSR1, secs(5)), "{options:?}: {:?}", rec.received_sequence());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{options:?}: {}", run.log());
        // The whole sequence: SIGUSR1 once unless dropped, then SIGTERM only
        // as rewritten, never as itself as well.
        let want: &[i32] = if usr1_dropped { &[expect] } else { &[libc::SIGUSR1, expect] };
        assert_eq!(rec.received_sequence(), want, "{options:?}: {}", run.log());
        let stop = run.event("stop_requested").unwrap_or_else(|| panic!("{}", run.log()));
        assert_eq!(&stop["signal"], "SIGTERM", "{}", run.log());
    }
    case to_int(&["--rewrite", "TERM:INT"], libc::SIGINT, false);
    case to_number(&["--rewrite=SIGTERM:2"], libc::SIGINT, false);
    case to_usr2_dropping_usr1(&["--rewrite", "USR1:0", "--rewrite", "TERM:USR2"], libc::SIGUSR2, true);
}

#[test]
fn rewrite_from_the_environment() {
    let dir = Scratch::new("rewrite-env");
    let rec = Recorder::new(&dir, "w").exit_on(libc::SIGQUIT);
    let mut run = drainit(Mode::Subreaper, rec.worker()).env("DRAINIT_REWRITE", "TERM:QUIT,HUP:0").spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    run.signal(libc::SIGHUP);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(rec.received_sequence(), [libc::SIGQUIT], "HUP dropped, TERM as QUIT: {}", run.log());
}

per_mode! {
    /// The worker's default action for SIGUSR1 is to die: whether the signal
    /// lands before or after the fork, it must reach the worker: drainit
    /// exits 138, or the recorder (if already set up) records it.
    fn signal_sent_right_after_start_is_not_lost(mode) {
        for round in 0..10 {
            let dir = Scratch::new("early");
            let rec = Recorder::new(&dir, "w").exit_on(libc::SIGUSR1);
            let mut run = drainit(mode, rec.worker()).spawn();
            // Send as soon as drainit has its signals blocked (before that, a
            // signal would hit drainit itself, not the worker-to-be).
            assert!(wait_until(secs(5), || HOST.blocks_signals(run.pid)), "drainit never blocked signals");
            run.signal(libc::SIGUSR1);
            let ended = run.wait(secs(10));
            let recorded = rec.saw(libc::SIGUSR1);
            assert!(
                ended.code == Some(138) || ended.code == Some(0) && recorded,
                "{mode:?} round {round}: {ended:?} recorded={recorded}\n{}",
                run.log()
            );
        }
    }
}

cases! {
    /// 32 and 33 are glibc's own, 34 musl's: drainit still blocks and
    /// forwards them, whichever libc it was built with; none may end drainit.
    fn real_time_signal_is_forwarded(sig: i32) {
        let dir = Scratch::new("rt");
        let rec = Recorder::new(&dir, "w").default(sig);
        let mut run = drainit(Mode::Subreaper, rec.worker()).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        run.signal(sig);
        assert_eq!(run.wait(secs(10)).code, Some(128 + sig), "signal {sig}: {}", run.log());
    }
    case sig32(32);
    case sig33(33);
    case sig34(34);
    case sig37(37);
    case sig64(64);
}

#[test]
fn tstp_is_forwarded_and_drainit_never_stops() {
    let dir = Scratch::new("tstp");
    let rec = Recorder::new(&dir, "w").term(Term::Default);
    let mut run = drainit(Mode::Subreaper, rec.worker()).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    let stops = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];
    for sig in stops {
        run.signal(sig);
    }
    assert!(wait_until(secs(5), || stops.iter().all(|s| rec.saw(*s))), "{:?}", rec.seen());
    let state = HOST.stat(run.pid).unwrap().state;
    assert_ne!(state, 'T', "drainit stopped");
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(128 + libc::SIGTERM));
}

per_mode! {
    /// A log line written to a pipe nobody reads any more makes the kernel
    /// send drainit SIGPIPE (from itself). That signal is drainit's own
    /// business: forwarding it would kill a worker that never wrote to a
    /// pipe (and, logged, loop forever).
    fn a_broken_log_pipe_does_not_kill_the_worker(mode) {
        let dir = Scratch::new("sigpipe");
        let rec = Recorder::new(&dir, "w").default(libc::SIGPIPE).code(7);
        let (read_end, write_end) = pipe();
        drop(read_end);
        let mut run = drainit(mode, rec.worker_with(&["-v"])).stderr(write_end).spawn();
        assert!(rec.wait_ready(secs(10)));
        // Each forward is logged (-v): a SIGPIPE drainit handles before the
        // next signal, as it comes first (13 < 28). Two markers: once the
        // second is in, the first one's SIGPIPE has been dealt with.
        for n in 1..=2 {
            run.signal(libc::SIGWINCH);
            assert!(wait_until(secs(5), || rec.count(libc::SIGWINCH) == n), "{mode:?}: {:?}", rec.counts());
        }
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(7), "{mode:?}: SIGPIPE reached the worker");
        assert_eq!(rec.received_sequence(), [libc::SIGWINCH, libc::SIGWINCH, libc::SIGTERM], "{mode:?}");
    }
}
