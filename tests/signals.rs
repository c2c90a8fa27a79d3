//! Forwarding: every signal reaches the worker's whole process group (a
//! grandchild included), after --rewrite; none is lost, even one sent
//! before the worker exists.

mod common;
use common::*;

/// A worker whose grandchild records every signal in the list into `file`,
/// then says it is ready; SIGTERM makes both exit.
fn recorder(file: &str, ready: &str, sigs: &[&str]) -> String {
    let traps: String = sigs.iter().map(|s| format!("trap 'echo {s} >> {file}' {s}; ")).collect();
    format!(
        "sh -c \"{traps} trap 'echo TERM >> {file}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done\" & \
         trap '' {all}; trap 'wait; exit 0' TERM; wait; wait",
        all = sigs.join(" ")
    )
}

#[test]
fn signals_reach_a_grandchild_in_the_group() {
    for mode in MODES {
        let dir = Scratch::new("fwd");
        let (file, ready) = (path_str(&dir.path("got")), path_str(&dir.path("ready")));
        let mut run = drainit(mode, sh(&recorder(&file, &ready, &["HUP", "USR1", "USR2", "WINCH", "CONT"]))).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")), "{mode:?} worker not ready; {}", run.log());
        for (sig, name) in
            [(libc::SIGHUP, "HUP"), (libc::SIGUSR1, "USR1"), (libc::SIGUSR2, "USR2"), (libc::SIGWINCH, "WINCH")]
        {
            run.signal(sig);
            assert!(
                wait_until(secs(5), || dir.lines("got").contains(&name.to_string())),
                "{mode:?} {name} not seen; got {:?}; log:\n{}",
                dir.lines("got"),
                run.log()
            );
        }
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert!(dir.lines("got").contains(&"TERM".to_string()), "{:?}", dir.lines("got"));
        assert_eq!(run.count_events("stop_requested"), 1);
    }
}

#[test]
fn rewrite_term_to_int_and_drop() {
    for (options, expect) in [
        (vec!["--rewrite", "TERM:INT"], "INT"),
        (vec!["--rewrite=SIGTERM:2"], "INT"),
        (vec!["--rewrite", "USR1:0", "--rewrite", "TERM:USR2"], "USR2"),
    ] {
        let dir = Scratch::new("rewrite");
        let (file, ready) = (path_str(&dir.path("got")), path_str(&dir.path("ready")));
        let script = format!(
            "trap 'echo INT >> {file}; exit 0' INT; trap 'echo USR1 >> {file}' USR1; trap 'echo USR2 >> {file}; exit 0' USR2; \
             trap 'echo TERM >> {file}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done"
        );
        let mut run = drainit(Mode::Subreaper, with_sh(&options, &script)).spawn();
        assert!(wait_until(secs(10), || dir.exists("ready")));
        run.signal(libc::SIGUSR1);
        // The shell runs pending traps by signal number, so give USR1's
        // trap its turn before INT ends the worker.
        let dropped = options.contains(&"USR1:0");
        wait_until(if dropped { ms(300) } else { secs(5) }, || dir.read("got").contains("USR1"));
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{options:?}: {}", run.log());
        let got = dir.lines("got");
        assert!(got.contains(&expect.to_string()) && !got.contains(&"TERM".to_string()), "{options:?}: {got:?}");
        assert_eq!(got.contains(&"USR1".to_string()), !options.contains(&"USR1:0"), "{options:?}: {got:?}");
        // The stop clock starts on TERM even though INT/USR2 went out.
        assert!(run.log().contains("event=stop_requested signal=SIGTERM"), "{}", run.log());
    }
}

#[test]
fn rewrite_from_the_environment() {
    let dir = Scratch::new("rewrite-env");
    let (file, ready) = (path_str(&dir.path("got")), path_str(&dir.path("ready")));
    let script = format!("trap 'echo QUIT >> {file}; exit 0' QUIT; touch {ready}; while :; do sleep 0.05; done");
    let mut run = drainit(Mode::Subreaper, sh(&script)).env("DRAINIT_REWRITE", "TERM:QUIT,HUP:0").spawn();
    assert!(wait_until(secs(10), || dir.exists("ready")));
    run.signal(libc::SIGHUP);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(dir.lines("got"), vec!["QUIT"]);
}

#[test]
fn signal_sent_right_after_start_is_not_lost() {
    // The worker's default action for SIGUSR1 is to die; whether the signal
    // lands before or after the fork, it must reach the worker: drainit exits
    // 138, or the worker's trap (if already set) records it.
    for mode in MODES {
        for round in 0..10 {
            let dir = Scratch::new("early");
            let file = path_str(&dir.path("got"));
            let mut run = drainit(mode, sh(&format!("trap 'echo USR1 > {file}; exit 0' USR1; sleep 5 & wait"))).spawn();
            // Send as soon as drainit has its signals blocked (before that, a
            // signal would hit drainit itself, not the worker-to-be).
            assert!(wait_until(secs(5), || sig_blocked(run.pid)), "drainit never blocked signals");
            run.signal(libc::SIGUSR1);
            let ended = run.wait(secs(10));
            let recorded = dir.read("got").contains("USR1");
            assert!(
                ended.code == Some(138) || ended.code == Some(0) && recorded,
                "{mode:?} round {round}: {ended:?} recorded={recorded}\n{}",
                run.log()
            );
        }
    }
}

fn sig_blocked(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().any(|l| l.starts_with("SigBlk:") && !l.ends_with("0000000000000000"))
}

#[test]
fn real_time_signals_are_forwarded() {
    // 32 and 33 are glibc's own, 34 musl's: drainit still blocks and
    // forwards them, whichever libc it was built with; none may end drainit.
    for sig in [32, 33, 34, 34 + 3, 64] {
        let mut run = drainit(Mode::Subreaper, sh("sleep 5 & wait")).spawn();
        assert!(run.wait_log(&["event=child_started"], secs(10)));
        run.signal(sig);
        assert_eq!(run.wait(secs(10)).code, Some(128 + sig), "signal {sig}: {}", run.log());
    }
}

#[test]
fn tstp_is_forwarded_and_drainit_never_stops() {
    let dir = Scratch::new("tstp");
    let (file, ready) = (path_str(&dir.path("got")), path_str(&dir.path("ready")));
    let script = format!(
        "trap 'echo TSTP >> {file}' TSTP; trap 'echo TTIN >> {file}' TTIN; trap 'echo TTOU >> {file}' TTOU; \
         touch {ready}; while :; do sleep 0.05; done"
    );
    let mut run = drainit(Mode::Subreaper, sh(&script)).spawn();
    assert!(wait_until(secs(10), || dir.exists("ready")));
    for sig in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
        run.signal(sig);
    }
    assert!(wait_until(secs(5), || dir.lines("got").len() == 3), "{:?}", dir.lines("got"));
    let state = std::fs::read_to_string(format!("/proc/{}/stat", run.pid)).unwrap();
    assert!(!state.contains(") T"), "drainit stopped: {state}");
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(128 + libc::SIGTERM));
}

#[test]
fn a_closed_stderr_pipe_does_not_feed_drainit_its_own_sigpipe() {
    // Each log line to a closed pipe makes the kernel send drainit SIGPIPE
    // (from itself); forwarding and logging that would loop forever.
    let mut fds = [0; 2];
    // SAFETY: pipe with a valid two-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[1] is a pipe end this test owns; Stdio takes it over.
    let write_end = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    // SAFETY: closing the read end this test owns.
    unsafe { libc::close(fds[0]) };
    let mut child = std::process::Command::new(BIN)
        .args(["-v", "--", "sh", "-c", "sleep 0.3; exit 7"])
        .stderr(std::process::Stdio::from(write_end))
        .spawn()
        .unwrap();
    let mut status = None;
    wait_until(secs(10), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
    }
    assert_eq!(status.and_then(|s| s.code()), Some(7));
}
