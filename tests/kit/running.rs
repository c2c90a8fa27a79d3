//! A started run: drainit's pid, its log, bounded waits for its end, and a
//! watchdog. Whatever the test does (forgets to wait, hangs, panics), the
//! run and everything it started are SIGKILLed: at the watchdog's limit, at
//! a `wait` that times out, or when the handle is dropped.

use super::events::{Event, parse_events};
use super::launch::{Builder, enter_with_pid};
use super::pidfd::Pidfd;
use super::procfs::{HOST, Procfs};
use super::{Mode, wait_for, wait_until};

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// From spawn to the moment the test saw the end.
    pub after: Duration,
}

impl Ended {
    /// The code a shell would report: the exit code, or 128 + the signal.
    pub fn shell_code(&self) -> i32 {
        self.code.unwrap_or_else(|| 128 + self.signal.unwrap_or(0))
    }
}

/// A pipe read to its end by a thread of the test.
struct Capture {
    text: Arc<Mutex<Vec<u8>>>,
    done: Option<mpsc::Receiver<()>>,
}

impl Capture {
    fn none() -> Capture {
        Capture { text: Arc::default(), done: None }
    }

    fn start(mut from: impl Read + Send + 'static) -> Capture {
        let text = Arc::new(Mutex::new(Vec::new()));
        let (tx, done) = mpsc::channel();
        let sink = Arc::clone(&text);
        thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(());
        });
        Capture { text, done: Some(done) }
    }

    fn get(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }

    /// Wait (bounded) until the reader has seen the pipe's end: then the
    /// text is whole. Err when something still holds the pipe open.
    fn join(&mut self, limit: Duration) -> Result<(), ()> {
        match self.done.take() {
            Some(done) => match done.recv_timeout(limit) {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => Ok(()),
                Err(RecvTimeoutError::Timeout) => Err(()),
            },
            None => Ok(()),
        }
    }
}

/// What to kill: the program, the processes above it (launcher, holder),
/// and, found at kill time, everything below it.
#[derive(Clone)]
struct Targets {
    pid: i32,
    program: Option<Arc<Pidfd>>,
    others: Vec<Arc<Pidfd>>,
}

impl Targets {
    /// SIGKILL everything, through pidfds (never a pid that was reused).
    /// Descendants first, a few rounds (they may be forking), then the
    /// program and the processes above it; in a namespace, killing its
    /// PID 1 takes everything in it.
    fn kill(&self) {
        if let Some(program) = &self.program {
            for _ in 0..3 {
                let below: Vec<Pidfd> =
                    HOST.descendants(self.pid).into_iter().filter_map(|p| Pidfd::try_open(p).ok()).collect();
                if below.is_empty() {
                    break;
                }
                for p in &below {
                    let _ = p.send(libc::SIGKILL);
                }
            }
            let _ = program.send(libc::SIGKILL);
        }
        for p in &self.others {
            let _ = p.send(libc::SIGKILL);
        }
    }
}

/// Kills its targets unless disarmed within its limit.
struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    fired: Arc<AtomicBool>,
    limit: Duration,
}

impl Watchdog {
    fn arm(targets: Targets, limit: Duration) -> Watchdog {
        let (stop, stopped) = mpsc::channel::<()>();
        let fired = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&fired);
        thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(limit) {
                flag.store(true, Ordering::SeqCst);
                eprintln!("watchdog: killing pid {} and what it started after {limit:?}", targets.pid);
                targets.kill();
            }
        });
        Watchdog { stop: Some(stop), fired, limit }
    }

    fn disarm(&mut self) {
        self.stop.take(); // disconnects: the thread ends without killing
    }
}

/// A running drainit (or other program started by the kit).
pub struct Running {
    /// The std child: the program itself, or its launcher.
    child: Child,
    mode: Mode,
    /// The program's pid as the test sees it; 0 if it ended before it was
    /// seen (an exec failure under a launcher).
    pub pid: i32,
    /// PID 1 of a private namespace (`Builder::private_pid_namespace`).
    pub holder: Option<i32>,
    /// The test's end of the holder's pipe: dropping it ends the namespace.
    hold: Option<OwnedFd>,
    targets: Targets,
    log: Capture,
    out: Capture,
    pub started: Instant,
    ended: Option<Ended>,
    dog: Watchdog,
}

impl Running {
    pub(super) fn start(mut b: Builder, hold: Option<(OwnedFd, OwnedFd)>) -> Running {
        let started = Instant::now();
        let mut child = b.cmd.spawn().unwrap_or_else(|e| panic!("spawn {:?}: {e}", b.cmd.get_program()));
        // The holder's end was inherited by the launcher; the test keeps the
        // write end only.
        let hold = hold.map(|(read, write)| {
            drop(read);
            write
        });
        let log = child.stderr.take().map_or_else(Capture::none, Capture::start);
        let out = child.stdout.take().map_or_else(Capture::none, Capture::start);
        let launcher = child.id() as i32;
        let launcher_fd = Arc::new(Pidfd::open(launcher));
        // Find the program under its launcher(s); one that exits at once
        // (exec failure, bad flags) may be gone before it is seen.
        let depth = match (b.mode, b.private_ns) {
            (Mode::Subreaper, false) => 0,
            (Mode::Pid1, _) => 1,
            (Mode::Subreaper, true) => 2,
        };
        let mut chain = vec![launcher];
        while chain.len() <= depth {
            let parent = *chain.last().unwrap();
            let found = wait_for(Duration::from_secs(10), || {
                if let Some(&c) = HOST.children(parent).first() {
                    return Some(Some(c));
                }
                launcher_fd.exited().then_some(None)
            });
            match found {
                Some(Some(c)) => chain.push(c),
                Some(None) => break,
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("nothing appeared under pid {parent} within 10s");
                }
            }
        }
        let pid = if chain.len() == depth + 1 { *chain.last().unwrap() } else { 0 };
        let holder = if b.private_ns { chain.get(1).copied() } else { None };
        let program = if pid > 0 { Pidfd::try_open(pid).ok().map(Arc::new) } else { None };
        let mut others: Vec<Arc<Pidfd>> =
            holder.and_then(|h| Pidfd::try_open(h).ok()).map(Arc::new).into_iter().collect();
        others.push(launcher_fd);
        let targets = Targets { pid, program, others };
        let dog = Watchdog::arm(targets.clone(), b.watchdog);
        Running { child, mode: b.mode, pid, holder, hold, targets, log, out, started, ended: None, dog }
    }

    /// Send `sig` to the program (never to a process that reused its pid).
    pub fn signal(&self, sig: i32) {
        let program = self.targets.program.as_ref().expect("the program exited before it was seen");
        match program.send(sig) {
            Ok(()) | Err(libc::ESRCH) => {}
            Err(e) => panic!("signal {sig} to {}: errno {e}", self.pid),
        }
    }

    /// The program's pidfd, opened when the run was started: it never
    /// signals a process that reused the pid, and tells a zombie from a
    /// live process (`exited`). Panics if the program ended before it was
    /// seen.
    pub fn pidfd(&self) -> &Pidfd {
        self.targets.program.as_ref().expect("the program exited before it was seen")
    }

    /// drainit's stderr so far (whole once `wait` returned).
    pub fn log(&self) -> String {
        self.log.get()
    }

    /// The stdout so far (whole once `wait` returned).
    pub fn stdout(&self) -> String {
        self.out.get()
    }

    /// The events in the log so far.
    pub fn events(&self) -> Vec<Event> {
        parse_events(&self.log())
    }

    /// The first event named `name`, if any yet.
    pub fn event(&self, name: &str) -> Option<Event> {
        self.events().into_iter().find(|e| e.name == name)
    }

    pub fn count_events(&self, name: &str) -> usize {
        self.events().iter().filter(|e| e.name == name).count()
    }

    /// Wait for an event named `name`.
    #[must_use = "a wait's result must be used"]
    pub fn wait_event(&self, name: &str, limit: Duration) -> Option<Event> {
        wait_for(limit, || self.event(name))
    }

    /// Wait for a log line containing every one of `parts`.
    #[must_use = "assert the result: an unchecked wait is a hidden sleep"]
    pub fn wait_log(&self, parts: &[&str], limit: Duration) -> bool {
        wait_until(limit, || self.log().lines().any(|l| parts.iter().all(|p| l.contains(p))))
    }

    /// /proc as the program's namespace sees it: pids there are the ones
    /// the log and the worker print.
    pub fn ns_proc(&self) -> Procfs {
        match (self.mode, self.holder) {
            (_, Some(holder)) => Procfs::of_root(holder),
            (Mode::Pid1, None) => Procfs::of_root(self.pid),
            (Mode::Subreaper, None) => HOST,
        }
    }

    /// Start `argv` inside the private namespace as the leader of a new
    /// process group whose pid and pgid are `want` (free by then), unrelated
    /// to drainit. The returned child (outside) ends as the program does;
    /// 97 means the pid was taken.
    pub fn spawn_with_pid(&self, want: i32, argv: &[String]) -> Child {
        let holder = self.holder.expect("spawn_with_pid needs private_pid_namespace()");
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(std::process::Stdio::null());
        enter_with_pid(&mut cmd, holder, want);
        cmd.spawn().expect("spawn into the namespace")
    }

    /// The end, if the program has ended; never blocks.
    pub fn poll_end(&mut self) -> Option<Ended> {
        if self.ended.is_none() {
            let status = self.child.try_wait().unwrap()?;
            self.finish(status);
        }
        self.ended
    }

    pub fn try_ended(&mut self) -> bool {
        self.poll_end().is_some()
    }

    /// Wait for the end; past `limit` kill everything and panic with the log.
    pub fn wait(&mut self, limit: Duration) -> Ended {
        let mut end = None;
        if !wait_until(limit, || {
            end = self.poll_end();
            end.is_some()
        }) {
            let log = self.log();
            self.kill();
            panic!("pid {} did not exit within {limit:?}; log:\n{log}", self.pid);
        }
        end.unwrap()
    }

    fn finish(&mut self, status: ExitStatus) {
        let after = self.started.elapsed();
        self.dog.disarm();
        self.ended = Some(Ended { code: status.code(), signal: status.signal(), after });
        if self.dog.fired.load(Ordering::SeqCst) {
            panic!("the watchdog killed pid {} after {:?}; log:\n{}", self.pid, self.dog.limit, self.log());
        }
        // Once the program has ended nothing of it may hold its stdout or
        // stderr: a pipe still open is something left running.
        for name in ["stderr", "stdout"] {
            let capture = if name == "stderr" { &mut self.log } else { &mut self.out };
            if capture.join(Duration::from_secs(5)).is_err() {
                self.targets.kill();
                panic!(
                    "pid {} ended but its {name} stayed open 5s: something it started still runs; log:\n{}",
                    self.pid,
                    self.log.get()
                );
            }
        }
    }

    /// SIGKILL the program and everything it started; reap the child.
    pub fn kill(&mut self) {
        self.dog.disarm();
        self.targets.kill();
        let _ = self.child.wait();
        self.ended.get_or_insert(Ended { code: None, signal: Some(libc::SIGKILL), after: self.started.elapsed() });
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.ended.is_none() {
            self.kill();
        }
        self.hold.take(); // the private namespace's holder exits
    }
}
