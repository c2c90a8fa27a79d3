//! The test kit itself: the log parser, the recorder, the launcher's modes,
//! the choice of stderr, the watchdog. The other files trust these parts.

mod kit;
use kit::*;

use std::time::{Duration, Instant};

#[test]
fn logfmt_lines_with_quotes_and_escapes() {
    let e =
        Event::parse(r#"drainit: event=retry_after_invalid path="/tmp/x y" error="bad \"v\" a=b \\ \n" n=3"#).unwrap();
    assert_eq!(e.name, "retry_after_invalid");
    assert_eq!(&e["path"], "/tmp/x y");
    assert_eq!(&e["error"], "bad \"v\" a=b \\ \n");
    assert_eq!(e.num("n"), 3);
    assert_eq!(e.fields.len(), 4);
    assert_eq!(Event::parse("drainit: error: --grace 'x'"), None);
    assert_eq!(Event::parse(r#"drainit: event=x a="unterminated"#), None);
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Some(secs(120)));
    assert_eq!(parse_duration("300ms"), Some(ms(300)));
    assert!(check_log_end("drainit: event=exit code=3\n", 3).is_ok());
    assert!(check_log_end("drainit: event=exit code=3\n", 4).is_err());
    assert!(check_log_end("thread 'main' panicked\ndrainit: event=exit code=3\n", 3).is_err());
}

#[test]
fn stat_lines_with_odd_commands() {
    let s = Stat::parse("42 (a b) c) S 1 42 42 34816 42 4194304 0").unwrap();
    assert_eq!((s.pid, s.comm.as_str(), s.state, s.ppid, s.pgrp, s.session), (42, "a b) c", 'S', 1, 42, 42));
    assert_eq!((s.tty_nr, s.tpgid), (34816, 42));
}

per_mode! {
    /// The recorder as the worker: ready, its pid, every signal counted,
    /// SIGTERM ends it with its code after its linger.
    fn recorder_as_the_worker(mode) {
        let dir = Scratch::new("rec");
        let rec = Recorder::new(&dir, "w").code(5).linger(200);
        let mut run = drainit(mode, rec.worker()).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        let worker = run.wait_event("child_started", secs(5)).expect("child_started");
        assert_eq!(rec.pid(), Some(worker.num("pid") as i32));
        for sig in [libc::SIGUSR1, libc::SIGHUP, libc::SIGTSTP] {
            run.signal(sig);
            assert!(rec.wait_seen(sig, secs(5)), "{sig}: {:?}", rec.seen());
        }
        let sent = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(5), "{}", run.log());
        assert!(sent.elapsed() >= ms(200), "lingered 200ms: {:?}", sent.elapsed());
        assert_eq!(rec.exit_code(), Some(5));
        assert_eq!(rec.seen(), [libc::SIGHUP, libc::SIGUSR1, libc::SIGTERM, libc::SIGTSTP]);
        assert_eq!(rec.count(libc::SIGUSR1), 1);
        // The order they came in, each noted when it was taken.
        let timed = rec.received_timed();
        assert_eq!(rec.received_sequence(), [libc::SIGUSR1, libc::SIGHUP, libc::SIGTSTP, libc::SIGTERM]);
        assert!(timed.windows(2).all(|w| w[0].1 <= w[1].1), "{timed:?}");
        assert!(timed[0].1 >= rec.ready_ns().unwrap(), "{timed:?}");
    }
}

#[test]
fn recorder_children_orphans_and_attempts() {
    let dir = Scratch::new("rec-tree");
    let child = Recorder::new(&dir, "child").term(Term::Record);
    let orphan = Recorder::new(&dir, "orphan").setsid().orphan();
    let late = Recorder::new(&dir, "late").setsid().term(Term::Ignore);
    let worker = Recorder::new(&dir, "w")
        .per_attempt()
        .on_attempt(1, |r| r.exit_after(0, 75).retry_after("10ms"))
        .on_attempt(2, |r| r.child(child.clone()).child(orphan.clone()).child_on_stop(late.clone()));
    let mut run = drainit(Mode::Pid1, worker.worker_with(&["--grace", "2s"])).spawn();
    assert!(worker.attempt(2).wait_ready(secs(10)), "{}", run.log());
    assert_eq!(worker.attempt(1).exit_code(), Some(75));
    let backoff = run.event("backoff").expect("a backoff");
    assert_eq!(&backoff["delay"], "10ms", "{}", run.log());
    let ns = run.ns_proc();
    let (w, c, o) = (worker.attempt(2).pid().unwrap(), child.pid().unwrap(), orphan.pid().unwrap());
    // The orphan may note that it is ready before its parent has exited.
    let os = wait_for(secs(5), || ns.stat(o).filter(|s| s.ppid == 1)).unwrap_or_else(|| ns.stat(o).unwrap());
    let (ws, cs) = (ns.stat(w).unwrap(), ns.stat(c).unwrap());
    assert_eq!((cs.ppid, cs.pgrp), (w, ws.pgrp), "the child is in the worker's group");
    assert_eq!((os.ppid, os.session), (1, o), "the orphan went to PID 1, in its own session");
    run.signal(libc::SIGTERM);
    assert!(late.wait_ready(secs(5)), "started on the stop");
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert!(child.saw(libc::SIGTERM) && orphan.saw(libc::SIGTERM), "{:?} {:?}", child.seen(), orphan.seen());
    assert_eq!(run.count_events("child_started"), 2, "{}", run.log());
    let deadline = run.event("deadline_reached").expect("the TERM-recording child and the TERM-ignoring one");
    assert_eq!(deadline.num("remaining"), 2, "{}", run.log());
}

#[test]
fn stderr_as_the_test_chooses() {
    // A file.
    let dir = Scratch::new("stderr");
    let file = std::fs::File::create(dir.path("log")).unwrap();
    let mut run = drainit(Mode::Subreaper, sh("exit 3")).stderr(file).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(3));
    assert_eq!(run.log(), "", "not captured");
    check_log_end(&dir.read("log"), 3).unwrap();
    // Closed, /dev/null, a socket, a pipe nobody reads.
    let (sock, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let (_unread, pipe_in) = pipe();
    for io in [Io::Closed, Io::Null, Io::from(sock), Io::from(pipe_in)] {
        let what = format!("{io:?}");
        let mut run = drainit(Mode::Subreaper, sh("exit 4")).stderr(io).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(4), "{what}");
    }
    let mut got = String::new();
    std::io::Read::read_to_string(&mut &peer, &mut got).unwrap();
    check_log_end(&got, 4).unwrap();
}

#[test]
fn a_private_namespace_hands_out_the_pid_the_test_asks_for() {
    let dir = Scratch::new("private-ns");
    let rec = Recorder::new(&dir, "w");
    let mut run = drainit(Mode::Subreaper, rec.worker()).private_pid_namespace().spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    let ns = run.ns_proc();
    let worker = rec.pid().unwrap();
    assert_eq!(ns.stat(worker).unwrap().ppid, 2, "drainit is pid 2 under the holder");
    let victim = Recorder::new(&dir, "victim").term(Term::Record);
    let mut child = run.spawn_with_pid(40, &victim.argv());
    assert!(victim.wait_ready(secs(10)), "exit {:?}", child.try_wait());
    assert_eq!(victim.pid(), Some(40));
    assert_eq!(ns.stat(40).unwrap().pgrp, 40);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert!(ns.alive(40), "the namespace lives until the handle is dropped");
    drop(run);
    let mut status = None;
    assert!(wait_until(secs(10), || {
        status = child.try_wait().unwrap();
        status.is_some()
    }));
}

#[test]
fn the_watchdog_kills_a_run_that_overstays() {
    let dir = Scratch::new("watchdog");
    let rec = Recorder::new(&dir, "w").setsid().orphan().term(Term::Ignore);
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--grace", "5s"])).watchdog(ms(500)).spawn();
    assert!(rec.wait_ready(secs(10)));
    let leftover = rec.pid().unwrap();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.wait(secs(10))));
    let message = *failed.expect_err("the watchdog's kill is a failure").downcast::<String>().unwrap();
    assert!(message.contains("watchdog"), "{message}");
    assert!(wait_until(secs(5), || !alive(leftover)), "the worker's orphan was killed too");
}

/// A tool the suite needs and the machine lacks fails the test, naming the
/// package to install; it never passes silently.
#[test]
#[should_panic(expected = "apt-get install -y no-such-package")]
fn a_missing_tool_fails_naming_its_package() {
    let _ = need_program("drainit-no-such-tool", "no-such-package");
}

#[test]
fn tagged_events_and_logfmt() {
    let log = "lease-worker: event=release outcome=released token=2\ndrainit: event=exit code=0\n";
    let worker = parse_events_tagged("lease-worker", log);
    assert_eq!(worker.len(), 1);
    assert_eq!((&worker[0]["outcome"], worker[0].num("token")), ("released", 2));
    assert_eq!(parse_events(log).len(), 1, "drainit's own lines only");
    assert_eq!(logfmt(r#"a=1 b="x \"y\"""#).unwrap(), [("a".into(), "1".into()), ("b".into(), "x \"y\"".into())]);
}
