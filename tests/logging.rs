//! drainit's log lines never block it: with its stderr stalled (a pipe or
//! FIFO nobody reads, a terminal stopped with Ctrl-S, a socket whose peer
//! never reads), the deadline, forwarding and reaping go on; what waits
//! comes out in order once the reader resumes, with `log_dropped` counting
//! what did not fit; the worker's stderr stays blocking for the worker.

mod kit;
use kit::*;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

/// What drainit's stderr is.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Pipe,
    Fifo,
    Pty,
    Socket,
}

/// A destination that takes nothing: drainit's end, and what the test
/// holds to read it (and, for the terminal, to restart its output).
struct Stalled {
    drainits: Option<OwnedFd>,
    reader: OwnedFd,
    /// The terminal's slave, for TCOON.
    tty: Option<OwnedFd>,
    _dir: Option<Scratch>,
}

fn set_nonblocking(fd: &OwnedFd, on: bool) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags), 0);
    }
}

/// Write into `fd` until it takes no more (before drainit gets it: the
/// description is shared, so O_NONBLOCK is set and cleared again here).
fn fill(fd: &OwnedFd) {
    set_nonblocking(fd, true);
    let chunk = [b'#'; 4096];
    let mut total = 0;
    loop {
        // SAFETY: writing a valid buffer to an fd we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        total += n as usize;
    }
    assert!(total > 0, "could not fill the destination");
    set_nonblocking(fd, false);
}

fn stalled(kind: Kind) -> Stalled {
    match kind {
        Kind::Pipe => {
            let (reader, writer) = pipe();
            fill(&writer);
            Stalled { drainits: Some(writer), reader, tty: None, _dir: None }
        }
        Kind::Fifo => {
            let dir = Scratch::new("fifo");
            let path = dir.path("log");
            let c = std::ffi::CString::new(path_str(&path)).unwrap();
            // SAFETY: mkfifo and open with a valid path.
            let (reader, writer) = unsafe {
                assert_eq!(libc::mkfifo(c.as_ptr(), 0o600), 0);
                let r = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC);
                let w = libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                assert!(r >= 0 && w >= 0);
                (std::os::fd::FromRawFd::from_raw_fd(r), std::os::fd::FromRawFd::from_raw_fd(w))
            };
            fill(&writer);
            Stalled { drainits: Some(writer), reader, tty: None, _dir: Some(dir) }
        }
        Kind::Pty => {
            let (master, slave) = pty::open(24, 80);
            // Ctrl-S: the terminal's output stops, writers to it wait.
            // SAFETY: tcflow on a terminal fd we own.
            assert_eq!(unsafe { libc::tcflow(slave.as_raw_fd(), libc::TCOOFF) }, 0);
            let tty = slave.try_clone().unwrap();
            Stalled { drainits: Some(slave), reader: master, tty: Some(tty), _dir: None }
        }
        Kind::Socket => {
            let (drainits, peer) = UnixStream::pair().unwrap();
            let drainits: OwnedFd = drainits.into();
            fill(&drainits);
            Stalled { drainits: Some(drainits), reader: peer.into(), tty: None, _dir: None }
        }
    }
}

impl Stalled {
    /// Let the destination drain from now on: everything read goes to the
    /// returned buffer, until the last writer is gone.
    fn resume(&mut self) -> Arc<Mutex<Vec<u8>>> {
        if let Some(tty) = &self.tty {
            // SAFETY: tcflow on a terminal fd we own.
            assert_eq!(unsafe { libc::tcflow(tty.as_raw_fd(), libc::TCOON) }, 0);
        }
        // The test's copy of the slave would keep the master from EOF.
        self.tty = None;
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&got);
        let reader = self.reader.try_clone().unwrap();
        set_nonblocking(&reader, false);
        thread::spawn(move || {
            let mut file = std::fs::File::from(reader);
            let mut buf = [0u8; 65536];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        got
    }
}

/// drainit's lines in what the destination delivered: the worker's filler
/// ('#', never in drainit's lines) and a terminal's '\r' removed.
fn drainit_lines(bytes: &[u8]) -> Vec<String> {
    let text: String = String::from_utf8_lossy(bytes).chars().filter(|c| *c != '#' && *c != '\r').collect();
    text.lines().filter(|l| l.starts_with("drainit: event=")).map(str::to_string).collect()
}

/// The worker: a recorder (`rec`) that also keeps writing to its stderr,
/// from a subshell that ignores what the test sends, so that it stays
/// blocked on the stalled destination.
fn worker(rec: &Recorder, options: &[&str]) -> Vec<String> {
    let sigrec = rec.argv();
    let script = format!(
        "(trap '' TERM USR1 35; head -c 400000 /dev/zero | tr '\\0' '#' >&2) & exec {} {}",
        sigrec[0], sigrec[1]
    );
    options.iter().map(|s| s.to_string()).chain(sh(&script)).collect()
}

per_mode! {
    /// With stderr taking nothing from the first line on, a SIGTERM-ignoring
    /// worker is still SIGKILLed at the deadline, a signal still reaches it,
    /// an orphan is still reaped, and drainit exits 137 on time.
    fn the_deadline_holds_while_stderr_stalls(mode, kind: Kind) {
        let dir = Scratch::new("stall");
        let orphan = Recorder::new(&dir, "orphan").orphan().exit_after(300, 0);
        let rec = Recorder::new(&dir, "w").term(Term::Ignore).child(orphan.clone());
        let mut stalled = stalled(kind);
        let options = ["-v", "--grace", "1s", "--orchestrator-timeout", "3s"];
        let mut run = drainit(mode, worker(&rec, &options)).stderr(stalled.drainits.take().unwrap()).spawn();
        assert!(rec.wait_ready(secs(10)), "the worker never became ready");
        let orphan_pid = orphan.pid().expect("the orphan's pid");
        let procs = run.ns_proc();
        let stop = Instant::now();
        run.signal(libc::SIGTERM);
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(2)), "USR1 did not reach the worker: {:?}", rec.seen());
        assert!(
            wait_until(secs(3), || !procs.exists(orphan_pid)) || run.try_ended(),
            "the orphan {orphan_pid} was not reaped while stderr stalled"
        );
        let ended = run.wait(secs(5));
        let took = stop.elapsed();
        assert_eq!(ended.code, Some(137), "{kind:?}");
        assert!(took < ms(1300), "{kind:?}: drainit exited {took:?} after SIGTERM, grace 1s");
    }
    case pipe(Kind::Pipe);
    case fifo(Kind::Fifo);
    case pty(Kind::Pty);
    case socket(Kind::Socket);
}

per_mode! {
    /// Lines that waited come out in order once the reader resumes; those
    /// beyond the 64 KiB bound are counted, and the count precedes the next
    /// line that gets out.
    fn waiting_lines_come_out_in_order_with_the_count_of_the_dropped(mode, kind: Kind) {
        const STORM: u64 = 2000;
        let dir = Scratch::new("drain");
        let rec = Recorder::new(&dir, "w").term(Term::Ignore);
        let mut stalled = stalled(kind);
        // -v: each forwarded signal is a line (signal_forwarded, debug).
        let options = ["-v", "--grace", "3s", "--orchestrator-timeout", "5s"];
        let mut run = drainit(mode, worker(&rec, &options)).stderr(stalled.drainits.take().unwrap()).spawn();
        assert!(rec.wait_ready(secs(10)), "the worker never became ready");
        run.signal(libc::SIGTERM);
        // drainit numbers real-time signals as glibc does (RTMIN is 34, in
        // every build): 35 is its SIGRTMIN+1, the signal the worker ignores.
        let rt = 35;
        for _ in 0..STORM {
            run.signal(rt);
        }
        assert!(
            wait_until(secs(10), || rec.count(rt) == STORM),
            "the worker saw {} of {STORM} signals",
            rec.count(rt)
        );
        let got = stalled.resume();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(137));
        assert!(
            wait_until(secs(5), || drainit_lines(&got.lock().unwrap()).last().is_some_and(|l| l.contains("event=exit"))),
            "{kind:?}: the exit line never arrived"
        );
        let lines = drainit_lines(&got.lock().unwrap());
        let events: Vec<Event> = lines.iter().filter_map(|l| Event::parse(l)).collect();
        let names: Vec<&str> = events
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| ["child_started", "stop_requested", "log_dropped", "deadline_reached", "child_exited", "exit"].contains(n))
            .collect();
        assert_eq!(
            names,
            ["child_started", "stop_requested", "log_dropped", "deadline_reached", "child_exited", "exit"],
            "{kind:?}: {} lines", lines.len()
        );
        let dropped = events.iter().find(|e| e.name == "log_dropped").map_or(0, |e| e.num("lines"));
        let forwarded = events.iter().filter(|e| e.name == "signal_forwarded" && e.get("signal") == Some("SIGRTMIN+1")).count();
        assert_eq!(forwarded as i64 + dropped, STORM as i64, "{kind:?}: every forward is a line, written or counted");
        assert!(dropped > 0, "{kind:?}: {STORM} lines fit in 64 KiB?");
        let waited: usize = lines.iter().take_while(|l| !l.contains("event=log_dropped")).map(|l| l.len() + 1).sum();
        assert!(waited <= 64 * 1024, "{kind:?}: {waited} bytes waited, more than the bound");
    }
    case pipe(Kind::Pipe);
    case pty(Kind::Pty);
    case socket(Kind::Socket);
}

/// O_NONBLOCK in /proc/PID/fdinfo/FD's flags.
fn nonblocking(procs: &Procfs, pid: i32, fd: i32) -> bool {
    let info = std::fs::read_to_string(format!("{}/{pid}/fdinfo/{fd}", procs.root)).unwrap_or_default();
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).map(str::trim).unwrap_or("0");
    i64::from_str_radix(flags, 8).unwrap() & i64::from(libc::O_NONBLOCK) != 0
}

per_mode! {
    /// The worker's stderr, the same pipe as drainit's, stays blocking: it
    /// writes 1 MB through a slowly drained pipe without an EAGAIN.
    fn the_workers_stderr_stays_blocking(mode) {
        let dir = Scratch::new("blocking");
        let (reader, writer) = pipe();
        let done = dir.path("done");
        let script = format!(
            "head -c 1048576 /dev/zero | tr '\\0' '#' >&2; echo $? > {}; exec sleep 30",
            path_str(&done)
        );
        let mut run = drainit(mode, sh(&script)).stderr(writer).spawn();
        let mut file = std::fs::File::from(reader);
        let mut total = 0;
        let mut buf = [0u8; 4096];
        while !dir.exists("done") || total < 1 << 20 {
            let n = file.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += buf[..n].iter().filter(|b| **b == b'#').count();
            // The slow reader (the scenario): the worker's writes must block, not fail.
            thread::sleep(ms(1));
            assert!(run.started.elapsed() < secs(30), "1 MB did not get through in 30s");
        }
        assert_eq!(dir.read("done").trim(), "0", "the worker's write failed (EAGAIN?)");
        assert_eq!(total, 1 << 20);
        let procs = run.ns_proc();
        let drainit_pid = if mode == Mode::Pid1 { 1 } else { run.pid };
        let sleeper =
            wait_for(secs(5), || procs.descendant_named(drainit_pid, "sleep")).expect("the worker's sleep");
        assert!(!nonblocking(&procs, sleeper, 2), "the worker's stderr is O_NONBLOCK");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(143));
    }
}
