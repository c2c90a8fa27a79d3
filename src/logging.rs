//! drainit's own log lines, written to stderr without ever blocking: a log
//! collector that stalls (a blocking log driver, a full disk, a terminal
//! paused with Ctrl-S) must not stop the deadline, forwarding or reaping.
//!
//! The worker shares stderr's open file description, and O_NONBLOCK is a
//! flag of the description: setting it would hand the worker EAGAIN. So
//! drainit finds a path of its own to the same destination, by kind:
//! - pipe or FIFO, terminal: a new description of the same pipe or terminal,
//!   opened through /proc/self/fd/2 with O_NONBLOCK (drainit's alone);
//! - socket: each send with MSG_DONTWAIT (a flag of the call, not the file);
//! - regular file, /dev/null and other devices: a plain write, which never
//!   waits for a reader (a file on a hung network filesystem still can: no
//!   non-blocking write exists for files, and a thread is not worth it);
//! - closed: nothing is written.
//!
//! A line that cannot be written at once waits, in order, in a buffer of at
//! most 64 KiB; the event loop waits for stderr to drain along with its
//! signals. Beyond the bound lines are dropped and counted, and the next line
//! that gets out is preceded by `event=log_dropped lines=N`.

use std::fmt::{self, Write as _};
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{LevelFilter, Log, Metadata, Record};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::socket::{MsgFlags, send};
use nix::sys::stat::{Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{isatty, write};

use crate::events::Event;
use crate::sys;

/// The most that may wait for stderr.
const LIMIT: usize = 64 * 1024;

/// How drainit reaches stderr's destination.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// A description of its own, non-blocking, kept open for drainit's life.
    Own(RawFd),
    /// A pipe, FIFO or terminal, to reopen (`reopen`); plain writes till then.
    Reopen,
    Socket,
    /// Plain writes to fd 2: its writes never wait for a reader.
    Direct,
    Closed,
}

const STDERR: RawFd = 2;

struct Sink {
    path: Route,
    /// Lines not yet written, in order, from `start` on.
    pending: Vec<u8>,
    start: usize,
    dropped: u64,
}

static SINK: Mutex<Sink> = Mutex::new(Sink { path: Route::Direct, pending: Vec::new(), start: 0, dropped: 0 });

fn sink() -> std::sync::MutexGuard<'static, Sink> {
    // drainit has one thread, and panics abort: the lock is never poisoned.
    SINK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Decide how to reach stderr. Must run before drainit opens any other fd:
/// with fd 2 closed, the next fd opened would take its number.
pub fn init() {
    sink().path = classify();
}

fn classify() -> Route {
    let Ok(stat) = sys::stat_fd(STDERR) else { return Route::Closed };
    let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFSOCK {
        return Route::Socket;
    }
    if kind == SFlag::S_IFIFO || kind == SFlag::S_IFCHR && isatty(sys::kept_fd(STDERR)).unwrap_or(false) {
        return Route::Reopen;
    }
    Route::Direct
}

/// Open drainit's own description of a pipe, FIFO or terminal on stderr:
/// after the signalfd, which needs an fd more, so that a tight
/// RLIMIT_NOFILE costs the non-blocking log and not drainit. Without a free
/// fd, without /proc, or when a pipe's reader is already gone (ENXIO): the
/// plain writes, which block only behind a reader that stalls.
pub fn reopen() {
    let mut sink = sink();
    if !matches!(sink.path, Route::Reopen) {
        return;
    }
    let flags = OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    sink.path = match openat(AT_FDCWD, "/proc/self/fd/2", flags, Mode::empty()) {
        Ok(fd) => Route::Own(fd.into_raw_fd()),
        Err(_) => Route::Direct,
    };
}

impl Sink {
    fn fd(&self) -> Option<BorrowedFd<'static>> {
        match self.path {
            Route::Own(fd) => Some(sys::kept_fd(fd)),
            Route::Socket | Route::Direct | Route::Reopen => Some(sys::kept_fd(STDERR)),
            Route::Closed => None,
        }
    }

    fn waiting(&self) -> bool {
        self.start < self.pending.len()
    }

    fn write_some(&self, buf: &[u8]) -> nix::Result<usize> {
        match self.path {
            Route::Own(fd) => write(sys::kept_fd(fd), buf),
            // Without waiting (a flag of this call only: the socket's file
            // description, shared with the worker, stays blocking), and
            // without SIGPIPE.
            Route::Socket => send(STDERR, buf, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL),
            Route::Direct | Route::Reopen => write(sys::kept_fd(STDERR), buf),
            Route::Closed => Ok(buf.len()),
        }
    }

    /// Add one line (`drainit: ` + text + newline), or count it as dropped.
    fn push(&mut self, text: fmt::Arguments<'_>) {
        if matches!(self.path, Route::Closed) {
            return;
        }
        let waiting = self.waiting();
        if self.start > 0 {
            self.pending.drain(..self.start);
            self.start = 0;
        }
        let before = self.pending.len();
        if self.dropped > 0 {
            let _ = writeln!(Text(&mut self.pending), "drainit: {}", Event::LogDropped { lines: self.dropped });
        }
        let _ = writeln!(Text(&mut self.pending), "drainit: {text}");
        if self.pending.len() > LIMIT {
            self.pending.truncate(before);
            self.dropped += 1;
            return;
        }
        self.dropped = 0;
        // While earlier lines wait, the event loop writes when stderr drains.
        if !waiting {
            self.flush();
        }
    }

    /// Write what waits, as far as stderr takes it now.
    fn flush(&mut self) {
        while self.waiting() {
            match self.write_some(&self.pending[self.start..]) {
                Ok(n) => self.start += n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    // The reader is gone (EPIPE, a hung-up terminal) or the
                    // disk is full: these lines cannot be written.
                    let lost = self.pending[self.start..].iter().filter(|b| **b == b'\n').count();
                    self.dropped += lost as u64;
                    break;
                }
            }
        }
        self.pending.clear();
        self.start = 0;
    }
}

/// `fmt::Write` into the byte buffer (lines are UTF-8).
struct Text<'a>(&'a mut Vec<u8>);

impl fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Write one line now, or queue it: for messages outside the log filter
/// (configuration errors).
pub fn line(text: fmt::Arguments<'_>) {
    sink().push(text);
}

/// The fd to wait on for POLLOUT while lines wait; None when nothing waits.
pub fn waiting_fd() -> Option<BorrowedFd<'static>> {
    let sink = sink();
    sink.waiting().then(|| sink.fd()).flatten()
}

/// stderr can take more (or failed): write what waits.
pub fn flush() {
    sink().flush();
}

/// Before exit: let what waits out for at most `limit`, then give up on it.
/// A count of dropped lines goes out last, if anything can.
pub fn flush_before_exit(limit: Duration) {
    let end = Instant::now() + limit;
    let mut sink = sink();
    if sink.dropped > 0 && !matches!(sink.path, Route::Closed) {
        let lines = std::mem::take(&mut sink.dropped);
        let _ = writeln!(Text(&mut sink.pending), "drainit: {}", Event::LogDropped { lines });
    }
    loop {
        sink.flush();
        let left = end.saturating_duration_since(Instant::now());
        let (true, Some(fd), false) = (sink.waiting(), sink.fd(), left.is_zero()) else { return };
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        if let Err(e) = ppoll(&mut fds, Some(TimeSpec::from(left)), None)
            && e != Errno::EINTR
        {
            return;
        }
    }
}

/// The `log` front end: DRAINIT_LOG's filter, lines into the sink.
struct Logger(env_logger::Logger);

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if self.0.matches(record) {
            line(*record.args());
        }
    }

    fn flush(&self) {}
}

/// Install the logger with an env_logger filter (`info`, `drainit=debug`).
pub fn init_logger(filter: &str) {
    let logger = env_logger::Builder::new().parse_filters(filter).build();
    let max: LevelFilter = logger.filter();
    if log::set_boxed_logger(Box::new(Logger(logger))).is_ok() {
        log::set_max_level(max);
    }
}
