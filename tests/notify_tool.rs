//! The tools in the binary: `drainit --notify` against datagram sockets the
//! test owns (one that reads and closes what it gets, one that never reads),
//! its argument checks, and `drainit --probe` across the states of the ready
//! and drain files. At the end, the client-library tests (Python's sdnotify,
//! Rust's sd-notify crate, `drainit --notify` itself) against drainit's own
//! notify socket.

mod kit;
use kit::*;

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

/// `drainit ARGS` as a tool: none of the variables it reads inherited from
/// the test's environment, stderr captured.
fn tool(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("DRAINIT_READY_FILE")
        .env_remove("DRAINIT_DRAIN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Wait at most `limit` for `child` to end; kill it past that.
fn finish(mut child: Child, limit: Duration) -> (ExitStatus, String, String) {
    let ended = wait_for(limit, || child.try_wait().unwrap());
    if ended.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(ended.is_some(), "still running after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
    (out.status, String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let (status, _, stderr) = finish(cmd.spawn().unwrap(), secs(10));
    (status.code(), stderr)
}

/// One datagram read from `socket` (waiting at most 10 s): its text and the
/// fds that came with it, owned by the test now.
fn receive(socket: &UnixDatagram) -> (String, Vec<OwnedFd>) {
    socket.set_read_timeout(Some(secs(10))).unwrap();
    let mut buf = [0u8; 8192];
    let mut control = nix::cmsg_space!([RawFd; 16]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC).unwrap();
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(got) = cmsg {
            // SAFETY: the kernel just installed these fds for this process.
            fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let len = msg.bytes;
    (String::from_utf8_lossy(&buf[..len]).into(), fds)
}

/// Nothing is waiting on `socket`.
fn nothing_sent(socket: &UnixDatagram) -> bool {
    socket.set_nonblocking(true).unwrap();
    let got = socket.recv(&mut [0u8; 16]);
    socket.set_nonblocking(false).unwrap();
    got.is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A receiver that reads both datagrams and closes the fd: the tool sees the
/// barrier answered and exits 0 only then.
fn notify_and_answer(socket: &UnixDatagram, address: &str, args: &[&str], want: &str) {
    let mut argv = vec!["--notify"];
    argv.extend_from_slice(args);
    let child = tool(&argv).env("NOTIFY_SOCKET", address).spawn().unwrap();
    let (text, fds) = receive(socket);
    assert_eq!(text, want, "the assignments, one per line, in one datagram");
    assert!(fds.is_empty(), "the assignments travel without fds (systemd warns about fds)");
    let (barrier, fds) = receive(socket);
    assert_eq!(barrier, "BARRIER=1", "then a barrier on its own, as sd_notify_barrier sends it");
    assert_eq!(fds.len(), 1, "with one fd: the pipe's write end");
    let mut child = child;
    assert!(child.try_wait().unwrap().is_none(), "the tool waits while the fd is open");
    drop(fds);
    let (status, stdout, stderr) = finish(child, secs(10));
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", ""));
}

#[test]
fn notify_is_read_then_exits_0() {
    let dir = Scratch::new("notify-read");
    let path = dir.path("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let address = path.to_str().unwrap();
    notify_and_answer(&socket, address, &["READY=1"], "READY=1");
    notify_and_answer(
        &socket,
        address,
        &["WATCHDOG=1", "STATUS=in_flight=3", "X=a b"],
        "WATCHDOG=1\nSTATUS=in_flight=3\nX=a b",
    );
}

#[test]
fn notify_reaches_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("drainit-notify-tool-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    notify_and_answer(&socket, &format!("@{name}"), &["READY=1", "STATUS=up"], "READY=1\nSTATUS=up");
}

/// `drainit --notify READY=1` to `path`, which is never read: it gives up
/// at its bound (5 s), with exit 1 and one line, not before and not much
/// after. Returns that line.
fn notify_gives_up_at_its_bound(path: &std::path::Path) -> String {
    let start = Instant::now();
    let child = tool(&["--notify", "READY=1"]).env("NOTIFY_SOCKET", path).spawn().unwrap();
    let (status, _, stderr) = finish(child, secs(15));
    let took = start.elapsed();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(took >= Duration::from_millis(4900) && took < secs(8), "gave up after {took:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

/// A receiver that never reads: the message is delivered, the barrier is
/// never answered.
#[test]
fn notify_not_read_fails_within_its_bound() {
    let dir = Scratch::new("notify-unread");
    let path = dir.path("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let stderr = notify_gives_up_at_its_bound(&path);
    assert!(stderr.contains("not read within 5s"), "{stderr}");
    assert!(!nothing_sent(&socket), "the message itself was delivered");
}

/// A receiver whose queue is full (it never reads, and others filled it):
/// the send itself waits at most the bound.
#[test]
fn notify_to_a_full_queue_fails_within_its_bound() {
    let dir = Scratch::new("notify-full");
    let path = dir.path("notify");
    let _socket = UnixDatagram::bind(&path).unwrap();
    let filler = UnixDatagram::unbound().unwrap();
    filler.connect(&path).unwrap();
    filler.set_nonblocking(true).unwrap();
    let mut queued = 0;
    while filler.send(b"STATUS=filler").is_ok() {
        queued += 1;
        assert!(queued < 100_000, "the queue never filled");
    }
    let stderr = notify_gives_up_at_its_bound(&path);
    assert!(stderr.contains("was not delivered within 5s"), "{stderr}");
}

#[test]
fn notify_refuses_bad_arguments_with_2_before_sending() {
    let dir = Scratch::new("notify-bad");
    let path = dir.path("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let long = format!("STATUS={}", "x".repeat(5000));
    for (args, needle) in [
        (vec!["--notify"], "at least one"),
        (vec!["--notify", "READY"], "'READY' is not an assignment"),
        (vec!["--notify", "READY=1", "WATCHDOG"], "'WATCHDOG' is not an assignment"),
        (vec!["--notify", "STATUS=a\nREADY=1"], "newline"),
        (vec!["--notify", "STATUS=job 42\rWATCHDOG=trigger"], "carriage return"),
        (vec!["--notify", &long], "more than the 4096"),
    ] {
        let (code, stderr) = run(tool(&args).env("NOTIFY_SOCKET", &path));
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(nothing_sent(&socket), "{args:?}: nothing sent");
    }
}

#[test]
fn notify_without_a_reachable_socket_exits_1() {
    let dir = Scratch::new("notify-none");
    let missing = dir.path("missing");
    let plain = dir.path("plain");
    std::fs::write(&plain, "").unwrap();
    let unbound = dir.path("gone");
    drop(UnixDatagram::bind(&unbound).unwrap());
    for (value, needle) in [
        (None, "NOTIFY_SOCKET is not set"),
        (Some(""), "NOTIFY_SOCKET is not set"),
        (Some("relative/path"), "neither an absolute path nor @abstract"),
        (Some("@"), "neither an absolute path nor @abstract"),
        (Some(missing.to_str().unwrap()), "cannot reach it"),
        (Some(plain.to_str().unwrap()), "cannot reach it"),
        (Some(unbound.to_str().unwrap()), "cannot reach it"),
        (Some("@drainit-nobody-listens-here"), "cannot reach it"),
    ] {
        let mut cmd = tool(&["--notify", "READY=1"]);
        if let Some(value) = value {
            cmd.env("NOTIFY_SOCKET", value);
        }
        let start = Instant::now();
        let (code, stderr) = run(&mut cmd);
        assert_eq!(code, Some(1), "{value:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{value:?}: {stderr}");
        assert!(stderr.contains(needle), "{value:?}: {stderr}");
        assert!(start.elapsed() < secs(3), "{value:?}: fails at once, without waiting out the bound");
    }
}

/// Nothing of the tool needs /proc: it works with an empty one (as in a
/// `FROM scratch` image, where drainit is the only file).
#[test]
fn notify_and_probe_need_no_proc() {
    let dir = Scratch::new("notify-noproc");
    let path = dir.path("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let ready = dir.path("ready");
    std::fs::write(&ready, "").unwrap();
    let hide_proc = |argv: &[&str]| {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--", "sh", "-c", "mount -t tmpfs none /proc && exec \"$0\" \"$@\"", BIN])
            .args(argv)
            .env("NOTIFY_SOCKET", &path)
            .env("DRAINIT_READY_FILE", &ready)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let child = hide_proc(&["--notify", "READY=1"]).spawn().unwrap();
    assert_eq!(receive(&socket).0, "READY=1");
    drop(receive(&socket));
    let (status, _, stderr) = finish(child, secs(10));
    assert_eq!(status.code(), Some(0), "{stderr}");
    let (code, stderr) = run(&mut hide_proc(&["--probe"]));
    assert_eq!(code, Some(0), "{stderr}");
}

/// (ready file, drain variable, drain file) -> probe's code.
#[test]
fn probe_across_the_file_states() {
    let dir = Scratch::new("probe");
    let ready = dir.path("ready");
    let drain = dir.path("drain");
    let nowhere = dir.path("nowhere");
    let probe = |drain_var: Option<&Path>| {
        let mut cmd = tool(&["--probe"]);
        cmd.env("DRAINIT_READY_FILE", &ready);
        if let Some(d) = drain_var {
            cmd.env("DRAINIT_DRAIN_FILE", d);
        }
        run(&mut cmd)
    };
    let set = |path: &Path, what: &str| {
        let _ = std::fs::remove_file(path);
        match what {
            "file" => std::fs::write(path, "").unwrap(),
            "dangling link" => std::os::unix::fs::symlink(&nowhere, path).unwrap(),
            _ => {}
        }
    };
    for (ready_is, drain_var, drain_is, want) in [
        ("none", None, "none", 1),
        ("file", None, "none", 0),
        ("dangling link", None, "none", 0),
        ("file", Some(&drain), "none", 0),
        ("file", Some(&drain), "file", 1),
        ("file", Some(&drain), "dangling link", 1),
        ("none", Some(&drain), "file", 1),
        ("none", Some(&drain), "none", 1),
    ] {
        set(&ready, ready_is);
        set(&drain, drain_is);
        let (code, stderr) = probe(drain_var.map(|p| p.as_path()));
        let case = format!("ready={ready_is} drain_var={} drain={drain_is}", drain_var.is_some());
        assert_eq!(code, Some(want), "{case}: {stderr}");
        assert_eq!(stderr.lines().count(), usize::from(want != 0), "{case}: {stderr}");
    }
}

#[test]
fn probe_without_a_ready_file_or_with_arguments_exits_2() {
    let (code, stderr) = run(&mut tool(&["--probe"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("DRAINIT_READY_FILE is not set") && stderr.lines().count() == 1, "{stderr}");
    let (code, stderr) = run(tool(&["--probe"]).env("DRAINIT_READY_FILE", ""));
    assert_eq!(code, Some(2), "an empty variable is as unset: {stderr}");
    let (code, stderr) = run(tool(&["--probe", "x"]).env("DRAINIT_READY_FILE", "/r"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no arguments"), "{stderr}");
}

/// Only argv[1] makes a tool: after `--` (or anywhere else) the words are
/// the worker's.
#[test]
fn a_tool_name_elsewhere_is_the_command_line() {
    let (code, stderr) = run(&mut tool(&["--", "sh", "-c", "exit 3", "--probe"]));
    assert_eq!(code, Some(3), "{stderr}");
}

// The client libraries against drainit's own notify socket.

/// The worker's readiness, sent by `script` (a shell command line), reaches
/// drainit: the ready file appears, `ready` is logged, and the last
/// STATUS= is in `stop_requested`.
fn ready_through(mode: Mode, tag: &str, worker: &[&str], status: &str) {
    let dir = Scratch::new(tag);
    let ready = dir.path("ready");
    let mut args: Vec<String> = vec!["--ready-file".into(), ready.to_str().unwrap().into(), "--".into()];
    args.extend(worker.iter().map(|s| s.to_string()));
    let mut run = drainit(mode, args).spawn();
    assert!(wait_until(secs(10), || ready.exists()), "{mode:?}: never ready: {}", run.log());
    assert!(run.wait_event("ready", secs(5)).is_some(), "{mode:?}: {}", run.log());
    run.signal(libc::SIGTERM);
    let ended = run.wait(secs(15));
    assert_eq!(ended.code, Some(143), "{mode:?}: {}", run.log());
    let stop = run.event("stop_requested").unwrap();
    assert_eq!(stop.get("status"), Some(status), "{mode:?}: {}", run.log());
}

#[test]
fn python_sdnotify_makes_the_worker_ready() {
    let script = "import sdnotify, time\nn = sdnotify.SystemdNotifier()\nn.notify('STATUS=warm')\nn.notify('READY=1')\ntime.sleep(60)";
    for mode in MODES {
        ready_through(mode, "sdnotify-py", &["python3", "-c", script], "warm");
    }
}

#[test]
fn drainit_notify_makes_the_worker_ready() {
    let script = format!("'{BIN}' --notify STATUS=in_flight=3 READY=1 && exec sleep 60");
    for mode in MODES {
        ready_through(mode, "notify-tool", &["sh", "-c", &script], "in_flight=3");
    }
}

/// The Rust sd-notify crate, in a worker that is this test binary run again
/// (`--exact sd_notify_crate_worker`): ready, then watchdog pings within
/// the interval the crate reads from WATCHDOG_USEC/WATCHDOG_PID, then a
/// clean exit: no `watchdog_expired`, code 0.
#[test]
fn rust_sd_notify_crate_keeps_the_watchdog_fed() {
    let me = std::env::current_exe().unwrap();
    for mode in MODES {
        let dir = Scratch::new("sdnotify-rs");
        let ready = dir.path("ready");
        let argv: Vec<String> = vec![
            "--watchdog".into(),
            "1s".into(),
            "--ready-file".into(),
            ready.to_str().unwrap().into(),
            "--".into(),
            me.to_str().unwrap().into(),
            "--exact".into(),
            "sd_notify_crate_worker".into(),
            "--ignored".into(),
            "--nocapture".into(),
        ];
        let mut run = drainit(mode, argv).env("DRAINIT_TEST_SD_NOTIFY_WORKER", "1").spawn();
        assert!(wait_until(secs(10), || ready.exists()), "{mode:?}: never ready: {}", run.log());
        let ended = run.wait(secs(20));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert_eq!(run.count_events("watchdog_expired"), 0, "{mode:?}: {}", run.log());
    }
}

/// The worker of the test above; does nothing unless run as that worker.
#[test]
#[ignore = "the worker of rust_sd_notify_crate_keeps_the_watchdog_fed"]
fn sd_notify_crate_worker() {
    if std::env::var_os("DRAINIT_TEST_SD_NOTIFY_WORKER").is_none() {
        return;
    }
    use sd_notify::NotifyState;
    let mut usec = 0;
    assert!(sd_notify::watchdog_enabled(false, &mut usec), "WATCHDOG_USEC and WATCHDOG_PID name this process");
    assert_eq!(usec, 1_000_000);
    sd_notify::notify(false, &[NotifyState::Status("serving"), NotifyState::Ready]).unwrap();
    // Three intervals, pinged at a quarter of one: drainit must not expire.
    let end = Instant::now() + Duration::from_micros(3 * usec);
    while Instant::now() < end {
        sd_notify::notify(false, &[NotifyState::Watchdog]).unwrap();
        std::thread::sleep(Duration::from_micros(usec / 4));
    }
}
