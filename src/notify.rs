//! systemd's notify protocol, drainit's side of it, whole: the datagram
//! socket the worker notifies on (`NOTIFY_SOCKET`), the parser of its
//! messages, who may notify (`may_notify`), the inbox the event loop reads
//! (`Inbox`: the rejections counted, each assignment turned into the
//! supervisor's `Note`), the descriptors that ride along let go of without
//! blocking (`release`), and drainit's own client of a notify socket it
//! inherited (Podman's `--sdnotify=container`, a systemd unit: `Outer`, what
//! it is told). Nothing about readiness or the watchdog is decided here: the
//! supervisor decides on the notes.
//!
//! Nothing a sender chooses costs drainit without bound: a batch of
//! messages ends at the next deadline, a sender met before costs one /proc
//! read, and no close of a received descriptor can wait (docs/reliability.md
//! lists every such object).
//!
//! The protocol (sd_notify(3)): one datagram per message, newline-separated
//! `VAR=VALUE` assignments, at most 4096 bytes, the sender's pid attached by
//! the kernel (SCM_CREDENTIALS, which SO_PASSCRED on the receiving socket asks
//! for). File descriptors may ride along (SCM_RIGHTS); the receiver lets go
//! of those it has no use for, and a sender's `BARRIER=1` waits for exactly that
//! close (the last copy of a pipe's write end gone: POLLHUP on its read end).

use std::ffi::{CStr, OsStr};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, FcntlArg, OFlag, fcntl, openat};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrLike, SockaddrStorage, UnixAddr, bind,
    getsockname, recvmsg, sendto, setsockopt, socket, sockopt,
};
use nix::sys::stat::Mode;

use crate::events::{Event, Val};
use crate::supervisor::{Note, Tell};
use crate::sys;

/// The longest message: systemd's NOTIFY_BUFFER_MAX, which clients keep to.
pub const MAX_MESSAGE: usize = 4096;

/// The control buffer: room for the credentials and SCM_MAX_FD (253, the
/// kernel's limit per message) descriptors, so that the kernel never has to
/// cut it (MSG_CTRUNC): every descriptor sent reaches drainit, to be closed.
const CONTROL: usize = 2048;

/// How far up the parent chain a sender is followed before it is refused:
/// one /proc read per level, so this caps what one message can cost.
const MAX_DEPTH: usize = 1024;

/// Senders (and their ancestors) found to be drainit's descendants, kept so
/// that a sender's next message costs one /proc read, not one per level.
const KNOWN: usize = 256;

/// Received descriptors kept open (see `release`), at most.
const PARKED: usize = 256;

/// The smallest watchdog interval a worker may set: a smaller one counts
/// as this (the contract's floor; 0 µs would never expire, 1 µs would
/// expire on every turn).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// How long past the next deadline (or past its own start, when that was
/// later) a batch of messages may go on: time enough for a ping that waits
/// behind others to be read in the turn its watchdog comes due, never
/// enough to hold the deadline.
const PAST_DEADLINE: Duration = Duration::from_millis(5);

/// One assignment of a message, as the contract reads it; what it ignores
/// is `Other`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assignment<'a> {
    /// `READY=1`
    Ready,
    /// `RELOADING=1`
    Reloading,
    /// `STOPPING=1`
    Stopping,
    /// `WATCHDOG=1`
    Watchdog,
    /// `WATCHDOG=trigger`
    WatchdogTrigger,
    /// `WATCHDOG_USEC=N`, N > 0 microseconds.
    WatchdogUsec(u64),
    /// `EXTEND_TIMEOUT_USEC=N` microseconds.
    ExtendTimeoutUsec(u64),
    /// `STATUS=TEXT` (TEXT may be empty: the status is cleared). Text that is
    /// not UTF-8 is `Other`, as systemd ignores it.
    Status(&'a str),
    /// `BARRIER=1`: its descriptor is closed already, nothing else to do.
    Barrier,
    /// Anything else: `MAINPID=`, `FDSTORE=1`, unknown names, lines without
    /// `=`, `WATCHDOG_USEC=0`, numbers that do not parse.
    Other,
}

/// Why a message was dropped (`notify_rejected`'s `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// More than MAX_MESSAGE bytes.
    TooLong,
    /// A NUL byte anywhere.
    NulByte,
    /// The kernel attached no sender credentials.
    NoCredentials,
    /// The control data was cut (cannot happen with drainit's buffer; the
    /// message is dropped as systemd drops it).
    ControlTruncated,
    /// Credential pid 0: the sender is outside drainit's PID namespace.
    OutsideNamespace,
    /// The sender is not a descendant of drainit.
    NotDescendant,
    /// The sender exited before it could be checked.
    SenderGone,
    /// Not the worker, and /proc is not drainit's namespace's: its parents
    /// cannot be read.
    Unverifiable,
}

impl Reject {
    pub fn reason(self) -> &'static str {
        match self {
            Reject::TooLong => "too_long",
            Reject::NulByte => "nul_byte",
            Reject::NoCredentials => "no_credentials",
            Reject::ControlTruncated => "control_truncated",
            Reject::OutsideNamespace => "outside_namespace",
            Reject::NotDescendant => "not_a_descendant",
            Reject::SenderGone => "sender_gone",
            Reject::Unverifiable => "unverifiable",
        }
    }
}

/// Check a message whole (length, NUL bytes), then read its assignments
/// lazily, borrowing from `bytes`: nothing is allocated. A NUL byte
/// anywhere drops the message, as the contract says (systemd itself
/// forgives one at the very end).
/// Lines are split at `\n` and, as systemd splits them, `\r`; empty lines
/// are skipped.
pub fn parse(bytes: &[u8]) -> Result<Assignments<'_>, Reject> {
    if bytes.len() > MAX_MESSAGE {
        return Err(Reject::TooLong);
    }
    if bytes.contains(&0) {
        return Err(Reject::NulByte);
    }
    Ok(Assignments { rest: bytes })
}

/// The assignments of a checked message, in the order they were sent.
#[derive(Clone, Debug)]
pub struct Assignments<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Assignments<'a> {
    type Item = Assignment<'a>;

    fn next(&mut self) -> Option<Assignment<'a>> {
        while !self.rest.is_empty() {
            let end = self.rest.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(self.rest.len());
            let line = &self.rest[..end];
            self.rest = self.rest.get(end + 1..).unwrap_or_default();
            if !line.is_empty() {
                return Some(assignment(line));
            }
        }
        None
    }
}

fn assignment(line: &[u8]) -> Assignment<'_> {
    let Some(eq) = line.iter().position(|&b| b == b'=') else { return Assignment::Other };
    let (name, value) = (&line[..eq], &line[eq + 1..]);
    match (name, value) {
        (b"READY", b"1") => Assignment::Ready,
        (b"RELOADING", b"1") => Assignment::Reloading,
        (b"STOPPING", b"1") => Assignment::Stopping,
        (b"WATCHDOG", b"1") => Assignment::Watchdog,
        (b"WATCHDOG", b"trigger") => Assignment::WatchdogTrigger,
        (b"BARRIER", b"1") => Assignment::Barrier,
        (b"WATCHDOG_USEC", v) => usec(v).filter(|n| *n > 0).map_or(Assignment::Other, Assignment::WatchdogUsec),
        (b"EXTEND_TIMEOUT_USEC", v) => usec(v).map_or(Assignment::Other, Assignment::ExtendTimeoutUsec),
        (b"STATUS", v) => std::str::from_utf8(v).map_or(Assignment::Other, Assignment::Status),
        _ => Assignment::Other,
    }
}

/// Decimal digits only (no sign, no spaces), within u64.
fn usec(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// One datagram, as `NotifySocket::drain` read it. Its descriptors, if it
/// carried any, are released (`release`) once `each` has returned.
#[derive(Clone, Debug)]
pub struct Message<'a> {
    /// The sender's pid as the kernel translated it into drainit's PID
    /// namespace (0: the sender is outside it); None without credentials.
    pub pid: Option<i32>,
    /// How many descriptors came with it (all released right after).
    #[allow(dead_code, reason = "read by the tests; the loop only closes them")]
    pub fds: usize,
    /// Its assignments, or why it is dropped. The sender is not checked
    /// here: see `may_notify`.
    pub body: Result<Assignments<'a>, Reject>,
}

impl<'a> Message<'a> {
    /// Its assignments, if its sender may notify (`may` judges a pid, as
    /// `may_notify`). The message's own faults come first: they need no
    /// /proc, and a sender that sent a bad message and exited is told by
    /// what was wrong with it, not by its absence.
    pub fn judged(self, may: impl FnOnce(i32) -> Result<(), Reject>) -> Result<Assignments<'a>, Reject> {
        let assignments = self.body?;
        may(self.pid.ok_or(Reject::NoCredentials)?)?;
        Ok(assignments)
    }
}

/// drainit's notify socket: datagrams, non-blocking, close-on-exec, bound at
/// a path in drainit's private directory (which removes it with the
/// directory). Wait for POLLIN on `as_fd()`, then `drain`.
pub struct NotifySocket {
    fd: OwnedFd,
    /// One byte more than a message may hold, to tell a message of exactly
    /// MAX_MESSAGE bytes from a longer one.
    data: Box<[u8; MAX_MESSAGE + 1]>,
    /// Where the kernel writes its cmsghdrs: aligned for them as every
    /// allocation is (malloc's 16 bytes; drainit's arena keeps to that).
    control: Box<[u8; CONTROL]>,
    /// Received descriptors whose close could block (see `release`).
    parked: Vec<OwnedFd>,
}

impl NotifySocket {
    /// Bind at `path` (absolute, at most 107 bytes). SO_PASSCRED is on before
    /// the socket has an address: no datagram can reach it without the
    /// sender's credentials.
    pub fn bind(path: &Path) -> nix::Result<NotifySocket> {
        let fd =
            socket(AddressFamily::Unix, SockType::Datagram, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
        setsockopt(&fd, sockopt::PassCred, &true)?;
        bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        Ok(NotifySocket {
            fd,
            data: Box::new([0; MAX_MESSAGE + 1]),
            control: Box::new([0; CONTROL]),
            parked: Vec::new(),
        })
    }

    /// Read every waiting datagram, at most `max`, and none once `until` has
    /// passed (judged between messages), calling `each` for every one in
    /// the order they came. Returns whether it stopped early (more may be
    /// waiting: a sender that floods the socket cannot hold the loop from
    /// its next deadline). Descriptors arrive close-on-exec
    /// (MSG_CMSG_CLOEXEC: none reaches a child, even for a moment) and are
    /// released (`release`) right after `each` returns, which answers a
    /// sender's `BARRIER=1`. Not before: a sender waiting on its barrier is
    /// then still alive while `each` checks who it is (closed first, it
    /// could exit and be judged gone). Nothing is allocated per datagram
    /// unless it carries descriptors.
    pub fn drain(
        &mut self,
        max: usize,
        until: Option<Instant>,
        mut each: impl FnMut(Message<'_>),
    ) -> nix::Result<bool> {
        let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
        for _ in 0..max {
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(true);
            }
            let mut held = Vec::new();
            let (len, got, pid) = {
                let mut iov = [IoSliceMut::new(&mut self.data[..])];
                let msg = match recvmsg::<()>(self.fd.as_raw_fd(), &mut iov, Some(&mut self.control[..]), flags) {
                    Ok(msg) => msg,
                    Err(Errno::EINTR) => continue,
                    Err(Errno::EAGAIN) => return Ok(false),
                    Err(e) => return Err(e),
                };
                let mut pid = None;
                // Err only on MSG_CTRUNC, which the buffer's size rules out.
                for cmsg in msg.cmsgs().into_iter().flatten() {
                    match cmsg {
                        ControlMessageOwned::ScmCredentials(cred) => pid = Some(cred.pid()),
                        ControlMessageOwned::ScmRights(received) => {
                            held.extend(received.into_iter().map(sys::own_received))
                        }
                        _ => {}
                    }
                }
                (msg.bytes, msg.flags, pid)
            };
            let body = if got.contains(MsgFlags::MSG_CTRUNC) {
                Err(Reject::ControlTruncated)
            } else if pid.is_none() {
                Err(Reject::NoCredentials)
            } else if got.contains(MsgFlags::MSG_TRUNC) {
                Err(Reject::TooLong)
            } else {
                parse(&self.data[..len])
            };
            each(Message { pid, fds: held.len(), body });
            for fd in held {
                release(fd, &mut self.parked);
            }
        }
        Ok(true)
    }
}

/// Let go of a descriptor a sender handed drainit, without ever blocking.
/// A close runs the file's flush and, for the last reference, its release,
/// in drainit, signals blocked: a TCP socket with `SO_LINGER` and unsent
/// data waits out its linger time there, a FUSE file waits for its daemon's
/// answer to FLUSH (the daemon may be the worker, which never answers), an
/// NFS file for its server. So:
/// - a pipe is closed at once (no flush; its release frees pages): the
///   barrier's pipe among them;
/// - a socket other than AF_UNIX has its linger turned off first, then is
///   closed: the kernel sends what is left in the background, as for any
///   socket without a linger time;
/// - anything else (files, directories, devices, AF_UNIX sockets, whose
///   queues may carry more descriptors, lingering sockets among them,
///   released in the closer's context) is kept open, close-on-exec, until
///   drainit exits, when everything it answers for is gone (a FUSE daemon
///   among them, whose files then fail at once). At most PARKED are kept;
///   past that, they are closed: a worker would need to hand over that many
///   descriptors it can make block, and the kept ones cannot exhaust
///   drainit's own descriptors (spawns, /proc).
fn release(fd: OwnedFd, parked: &mut Vec<OwnedFd>) {
    if fcntl(fd.as_fd(), FcntlArg::F_GETPIPE_SZ).is_ok() {
        return drop(fd);
    }
    if let Ok(addr) = getsockname::<SockaddrStorage>(fd.as_raw_fd())
        && addr.family() != Some(AddressFamily::Unix)
        && setsockopt(&fd, sockopt::Linger, &libc::linger { l_onoff: 0, l_linger: 0 }).is_ok()
    {
        return drop(fd);
    }
    if parked.len() < PARKED {
        parked.push(fd);
    }
}

impl AsFd for NotifySocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Who may notify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Senders {
    /// drainit is PID 1: every process of its PID namespace (the kernel
    /// gives a sender outside it pid 0).
    Namespace,
    /// Otherwise: the worker and drainit's other descendants, found by
    /// following parent links in /proc up to `me` (drainit's pid). When
    /// /proc is another namespace's (`proc_is_ours` false) its pids name
    /// other processes, and only the worker itself is known.
    Descendants { me: i32, proc_is_ours: bool },
}

/// What /proc says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc {
    /// Its parent, and its start time (with its pid, who it is: a pid
    /// reused by another process starts later).
    Is { parent: i32, start: u64 },
    /// No such process.
    Gone,
    /// Its entry could not be read (out of descriptors or memory).
    Unreadable,
}

/// Processes found to be drainit's descendants, by pid and start time. A
/// descendant stays one until it exits (an orphan is adopted by its nearest
/// subreaper ancestor: drainit or one of its own descendants), and its pid
/// with its start time is never another's. A ring: the oldest goes first.
#[derive(Clone, Debug, Default)]
pub struct Known {
    ring: Vec<(i32, u64)>,
    next: usize,
}

impl Known {
    fn has(&self, pid: i32, start: u64) -> bool {
        self.ring.contains(&(pid, start))
    }

    fn add(&mut self, pid: i32, start: u64) {
        if self.has(pid, start) {
            return;
        }
        if self.ring.len() < KNOWN {
            self.ring.push((pid, start));
        } else {
            self.ring[self.next] = (pid, start);
            self.next = (self.next + 1) % KNOWN;
        }
    }
}

/// Whether the process with credential pid `pid` may notify, `worker` being
/// the current worker's pid and `read` what /proc says of a process. Pure:
/// `Inbox` hands it /proc. A sender met before costs one read; a new one
/// at most two walks of MAX_DEPTH reads, and the chain it proves is kept.
pub fn may_notify(
    senders: Senders,
    worker: Option<i32>,
    pid: i32,
    known: &mut Known,
    mut read: impl FnMut(i32) -> Proc,
) -> Result<(), Reject> {
    if pid <= 0 {
        return Err(Reject::OutsideNamespace);
    }
    let me = match senders {
        Senders::Namespace => return Ok(()),
        Senders::Descendants { .. } if worker == Some(pid) => return Ok(()),
        Senders::Descendants { proc_is_ours: false, .. } => return Err(Reject::Unverifiable),
        Senders::Descendants { me, .. } => me,
    };
    // A process in the middle of the chain may exit while it is read: its
    // children then belong to drainit (the subreaper), so one more walk
    // from the start sees them as drainit's.
    // The sender and its nearest ancestors, remembered once proven.
    let mut chain = [(0, 0); 16];
    for _ in 0..2 {
        let mut at = pid;
        let mut seen = 0;
        for _ in 0..MAX_DEPTH {
            let (parent, start) = match read(at) {
                Proc::Is { parent, start } => (parent, start),
                Proc::Unreadable => return Err(Reject::Unverifiable),
                Proc::Gone if at == pid => return Err(Reject::SenderGone),
                Proc::Gone => break,
            };
            if seen < chain.len() {
                chain[seen] = (at, start);
                seen += 1;
            }
            if known.has(at, start) || parent == me {
                chain[..seen].iter().for_each(|&(p, s)| known.add(p, s));
                return Ok(());
            }
            if parent <= 1 {
                return Err(Reject::NotDescendant);
            }
            at = parent;
        }
    }
    Err(Reject::NotDescendant)
}

/// What /proc/PID/stat says of `pid`, without allocating (a sender may ping
/// every few milliseconds). `spare` is a descriptor held for this read:
/// when drainit has none left (a message's descriptors may fill its
/// table), it is given up for the moment of the read, so that a live
/// sender is not judged gone for want of a descriptor.
fn read_proc(pid: i32, spare: &mut Option<OwnedFd>) -> Proc {
    let mut path = [0u8; 32];
    let room = {
        let mut rest = &mut path[..];
        if std::io::Write::write_fmt(&mut rest, format_args!("/proc/{pid}/stat")).is_err() {
            return Proc::Gone;
        }
        rest.len()
    };
    // The path ends in a NUL when it left room for one (the buffer is zeroed).
    let Some(path) = CStr::from_bytes_until_nul(&path).ok().filter(|_| room > 0) else { return Proc::Gone };
    let open = || openat(AT_FDCWD, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty());
    let read = |fd: OwnedFd| {
        // What is needed comes within the first few hundred bytes (the
        // command name is at most 64); a read cut short still holds the
        // command name's closing parenthesis (what follows it is numbers).
        let mut buf = [0u8; 1024];
        match nix::unistd::read(&fd, &mut buf) {
            Ok(n) => stat_fields(&buf[..n]).map_or(Proc::Gone, |(parent, start)| Proc::Is { parent, start }),
            Err(Errno::ESRCH) => Proc::Gone,
            Err(_) => Proc::Unreadable,
        }
    };
    let opened = match open() {
        Err(Errno::EMFILE | Errno::ENFILE) if spare.is_some() => {
            drop(spare.take());
            // Read and closed before the spare is taken again: its number
            // is the one the read used.
            let read = open().map(read);
            *spare = spare_fd();
            read
        }
        other => other.map(read),
    };
    match opened {
        Ok(proc) => proc,
        Err(Errno::ENOENT | Errno::ESRCH) => Proc::Gone,
        Err(_) => Proc::Unreadable,
    }
}

/// A descriptor kept in reserve for `read_proc`.
fn spare_fd() -> Option<OwnedFd> {
    openat(AT_FDCWD, c"/", OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).ok()
}

/// The parent of `pid`, as `read_proc` finds it.
#[cfg(test)]
fn parent_pid(pid: i32) -> Option<i32> {
    match read_proc(pid, &mut None) {
        Proc::Is { parent, .. } => Some(parent),
        _ => None,
    }
}

/// The ppid and starttime fields of a /proc/PID/stat line ("pid (comm)
/// state ppid ... starttime ..."); comm may hold spaces and parentheses, so
/// read after the last ')'.
fn stat_fields(stat: &[u8]) -> Option<(i32, u64)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let after = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = after.split_ascii_whitespace();
    let parent = fields.nth(1)?.parse().ok()?;
    // starttime is field 22; state (3) is the first after the name.
    let start = fields.nth(22 - 5)?.parse().ok()?;
    Some((parent, start))
}

/// drainit's end of the worker's notify socket as the event loop meets it:
/// the socket, who may send, what each message means to the supervisor,
/// and how many were dropped.
pub struct Inbox {
    socket: NotifySocket,
    senders: Senders,
    known: Known,
    spare: Option<OwnedFd>,
    /// Messages dropped so far: the first is a warning, the rest debug.
    rejected: u64,
}

impl Inbox {
    pub fn new(socket: NotifySocket, senders: Senders) -> Inbox {
        Inbox { socket, senders, known: Known::default(), spare: spare_fd(), rejected: 0 }
    }

    /// The waiting messages, from processes drainit answers for (`worker`:
    /// the current group's leader), as notes for the supervisor, at most
    /// `max`. The batch ends a little past `deadline` (the supervisor's
    /// next), judged between messages: whatever senders do, the deadline
    /// is judged on time.
    pub fn notes(&mut self, worker: Option<i32>, max: usize, deadline: Option<Instant>, each: &mut dyn FnMut(Note)) {
        let until = deadline.map(|d| d.max(Instant::now()) + PAST_DEADLINE);
        let Inbox { socket, senders, known, spare, rejected } = self;
        let read = socket.drain(max, until, |message| {
            let pid = message.pid;
            let checked = message.judged(|pid| may_notify(*senders, worker, pid, known, |p| read_proc(p, spare)));
            match checked {
                Ok(assignments) => assignments.filter_map(note).for_each(&mut *each),
                Err(why) => {
                    Event::NotifyRejected { pid, reason: why.reason(), first: *rejected == 0 }.emit();
                    *rejected += 1;
                }
            }
        });
        if let Err(e) = read {
            Event::LoopError { what: "recvmsg", error: e.desc().to_string() }.emit();
        }
    }
}

impl AsFd for Inbox {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// What an assignment says to the supervisor, if anything.
fn note(assignment: Assignment<'_>) -> Option<Note> {
    Some(match assignment {
        Assignment::Ready => Note::Ready,
        Assignment::Reloading => Note::Reloading,
        Assignment::Stopping => Note::Stopping,
        Assignment::Watchdog => Note::Ping,
        Assignment::WatchdogTrigger => Note::Trigger,
        Assignment::WatchdogUsec(n) => Note::Interval(Duration::from_micros(n).max(MIN_INTERVAL)),
        Assignment::ExtendTimeoutUsec(n) => Note::Extend(Duration::from_micros(n)),
        Assignment::Status(text) => Note::Status(text.to_string()),
        Assignment::Barrier | Assignment::Other => return None,
    })
}

/// The address a `NOTIFY_SOCKET` value names: an absolute path, or `@name`
/// in Linux's abstract namespace. None for anything else (systemd's
/// `vsock:` addresses among them).
pub fn address(value: &OsStr) -> Option<UnixAddr> {
    match value.as_bytes() {
        [b'@', name @ ..] if !name.is_empty() => UnixAddr::new_abstract(name).ok(),
        path @ [b'/', ..] => UnixAddr::new(path).ok(),
        _ => None,
    }
}

/// drainit's own client of the notify socket it inherited.
pub struct Outer {
    fd: OwnedFd,
    addr: UnixAddr,
    /// A send failed once already: later failures are not logged.
    failed: std::cell::Cell<bool>,
}

impl Outer {
    /// Take `NOTIFY_SOCKET` out of drainit's environment (the worker must
    /// get drainit's own socket, or none) and open a client for it. None
    /// when it is unset or names no usable address (logged). Call it only
    /// when drainit reads notifications itself: otherwise the variable
    /// reaches the worker unchanged, per the contract.
    pub fn from_env() -> Option<Outer> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        sys::unset_env("NOTIFY_SOCKET");
        let Some(addr) = address(&value) else {
            log::warn!(
                "event=outer_notify_unusable socket={} error=\"neither an absolute path nor @abstract\"",
                Val(&value.to_string_lossy())
            );
            return None;
        };
        let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
        match socket(AddressFamily::Unix, SockType::Datagram, flags, None) {
            Ok(fd) => Some(Outer { fd, addr, failed: std::cell::Cell::new(false) }),
            Err(e) => {
                log::warn!("event=outer_notify_unusable socket={} error={:?}", Val(&value.to_string_lossy()), e.desc());
                None
            }
        }
    }

    /// Tell the outer socket what the supervisor says it must hear.
    pub fn tell(&self, tell: &Tell) {
        match tell {
            Tell::Ready => self.send("READY=1"),
            Tell::Reloading => self.send("RELOADING=1"),
            Tell::Stopping => self.send("STOPPING=1"),
            Tell::Watchdog => self.send("WATCHDOG=1"),
            Tell::Status(text) => self.send(&format!("STATUS={text}")),
        }
    }

    /// Send `text` as one message, never waiting (a receiver whose queue is
    /// full loses it) and without SIGPIPE. The first failure is logged,
    /// later ones are not.
    pub fn send(&self, text: &str) {
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        if let Err(e) = sendto(self.fd.as_raw_fd(), text.as_bytes(), &self.addr, flags)
            && !self.failed.replace(true)
        {
            log::warn!("event=outer_notify_failed error={:?}", e.desc());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    use Assignment::*;
    use proptest::prelude::*;

    type Parsed<'a> = Result<Vec<Assignment<'a>>, Reject>;

    fn all(bytes: &[u8]) -> Parsed<'_> {
        parse(bytes).map(Iterator::collect)
    }

    #[test]
    fn parse_table() {
        let long = vec![b'x'; MAX_MESSAGE + 1];
        let full = [b"STATUS=".as_slice(), &[b'y'; MAX_MESSAGE - 7]].concat();
        let cases: &[(&[u8], Parsed<'_>)] = &[
            (b"READY=1", Ok(vec![Ready])),
            (b"READY=1\n", Ok(vec![Ready])),
            (b"READY=1\0", Err(Reject::NulByte)),
            (b"READY=1\0\0", Err(Reject::NulByte)),
            (b"READY=\x001", Err(Reject::NulByte)),
            (b"\0", Err(Reject::NulByte)),
            (b"", Ok(vec![])),
            (b"\n\n", Ok(vec![])),
            (b"READY=1\r\nSTATUS=a b\r\n", Ok(vec![Ready, Status("a b")])),
            (b"READY=0", Ok(vec![Other])),
            (b"READY", Ok(vec![Other])),
            (b"ready=1", Ok(vec![Other])),
            (b" READY=1", Ok(vec![Other])),
            (b"RELOADING=1\nSTOPPING=1", Ok(vec![Reloading, Stopping])),
            (b"WATCHDOG=1\nWATCHDOG=trigger\nWATCHDOG=0", Ok(vec![Watchdog, WatchdogTrigger, Other])),
            (b"WATCHDOG_USEC=5000000", Ok(vec![WatchdogUsec(5_000_000)])),
            (b"WATCHDOG_USEC=0", Ok(vec![Other])),
            (b"WATCHDOG_USEC=", Ok(vec![Other])),
            (b"WATCHDOG_USEC=+5", Ok(vec![Other])),
            (b"WATCHDOG_USEC=-5", Ok(vec![Other])),
            (b"WATCHDOG_USEC= 5", Ok(vec![Other])),
            (b"WATCHDOG_USEC=5s", Ok(vec![Other])),
            (b"WATCHDOG_USEC=18446744073709551615", Ok(vec![WatchdogUsec(u64::MAX)])),
            (b"WATCHDOG_USEC=18446744073709551616", Ok(vec![Other])),
            (b"EXTEND_TIMEOUT_USEC=0", Ok(vec![ExtendTimeoutUsec(0)])),
            (b"EXTEND_TIMEOUT_USEC=30000000", Ok(vec![ExtendTimeoutUsec(30_000_000)])),
            (b"EXTEND_TIMEOUT_USEC=x", Ok(vec![Other])),
            (b"STATUS=", Ok(vec![Status("")])),
            (b"STATUS=in_flight=3", Ok(vec![Status("in_flight=3")])),
            (b"STATUS=caf\xc3\xa9", Ok(vec![Status("caf\u{e9}")])),
            (b"STATUS=\xff", Ok(vec![Other])),
            (b"BARRIER=1", Ok(vec![Barrier])),
            (b"MAINPID=42\nFDSTORE=1\nERRNO=2\nX=y\n=1", Ok(vec![Other, Other, Other, Other, Other])),
            (&full, Ok(vec![Status(std::str::from_utf8(&full[7..]).unwrap())])),
            (&long, Err(Reject::TooLong)),
        ];
        for (bytes, want) in cases {
            assert_eq!(&all(bytes), want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn reasons_are_distinct_logfmt_words() {
        use Reject::*;
        let all = [
            TooLong,
            NulByte,
            NoCredentials,
            ControlTruncated,
            OutsideNamespace,
            NotDescendant,
            SenderGone,
            Unverifiable,
        ];
        let mut words: Vec<_> = all.iter().map(|r| r.reason()).collect();
        assert!(words.iter().all(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        words.sort();
        words.dedup();
        assert_eq!(words.len(), all.len());
    }

    /// An assignment as a test generates it, and the line that sends it.
    #[derive(Clone, Debug)]
    enum Gen {
        Known(Assignment<'static>),
        Status(String),
        Other(&'static str),
    }

    impl Gen {
        fn line(&self) -> String {
            match self {
                Gen::Known(Ready) => "READY=1".into(),
                Gen::Known(Reloading) => "RELOADING=1".into(),
                Gen::Known(Stopping) => "STOPPING=1".into(),
                Gen::Known(Watchdog) => "WATCHDOG=1".into(),
                Gen::Known(WatchdogTrigger) => "WATCHDOG=trigger".into(),
                Gen::Known(Barrier) => "BARRIER=1".into(),
                Gen::Known(WatchdogUsec(n)) => format!("WATCHDOG_USEC={n}"),
                Gen::Known(ExtendTimeoutUsec(n)) => format!("EXTEND_TIMEOUT_USEC={n}"),
                Gen::Known(other) => unreachable!("{other:?}"),
                Gen::Status(text) => format!("STATUS={text}"),
                Gen::Other(line) => (*line).into(),
            }
        }

        fn want(&self) -> Assignment<'_> {
            match self {
                Gen::Known(a) => a.clone(),
                Gen::Status(text) => Status(text),
                Gen::Other(_) => Other,
            }
        }
    }

    fn gen_assignment() -> impl Strategy<Value = Gen> {
        prop_oneof![
            prop_oneof![
                Just(Ready),
                Just(Reloading),
                Just(Stopping),
                Just(Watchdog),
                Just(WatchdogTrigger),
                Just(Barrier),
                (1..=u64::MAX).prop_map(WatchdogUsec),
                any::<u64>().prop_map(ExtendTimeoutUsec),
            ]
            .prop_map(Gen::Known),
            "[^\n\r\0]{0,40}".prop_map(Gen::Status),
            prop::sample::select(vec![
                "MAINPID=42",
                "FDSTORE=1",
                "READY=0",
                "WATCHDOG_USEC=0",
                "WATCHDOG_USEC=soon",
                "EXTEND_TIMEOUT_USEC=-1",
                "NO_EQUALS",
                "=1",
                "X_Y=z",
            ])
            .prop_map(Gen::Other),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256),
            ..ProptestConfig::default()
        })]

        /// Whatever the bytes, the parser answers (no panic), and refuses
        /// exactly what is too long or holds a NUL byte anywhere.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..5000)) {
            let got = all(&bytes);
            let nul = bytes.contains(&0);
            match got {
                Err(Reject::TooLong) => prop_assert!(bytes.len() > MAX_MESSAGE),
                Err(Reject::NulByte) => prop_assert!(bytes.len() <= MAX_MESSAGE && nul),
                Err(other) => prop_assert!(false, "{:?}", other),
                Ok(_) => prop_assert!(bytes.len() <= MAX_MESSAGE && !nul),
            }
        }

        /// A well-formed message parses back to what was generated, in order,
        /// with or without a trailing newline.
        #[test]
        fn generated_messages_parse_back(gens in prop::collection::vec(gen_assignment(), 0..20), trailing in any::<bool>()) {
            let mut text = gens.iter().map(Gen::line).collect::<Vec<_>>().join("\n");
            if trailing {
                text.push('\n');
            }
            let want: Vec<_> = gens.iter().map(Gen::want).collect();
            prop_assert_eq!(all(text.as_bytes()), Ok(want));
        }
    }

    const ME: i32 = 100;

    /// pid -> parent, for a tree: 100 (drainit) > 200 (worker) > 300 > 400;
    /// 100 > 250 (another child of drainit); 1 > 50 > 60 (strangers);
    /// 400's parent is unreadable when `gone` holds it.
    fn tree(gone: &'static [i32]) -> impl FnMut(i32) -> Proc {
        move |pid| {
            if gone.contains(&pid) {
                return Proc::Gone;
            }
            let parent = match pid {
                100 => 1,
                200 | 250 => ME,
                300 => 200,
                400 => 300,
                50 => 1,
                60 => 50,
                _ => return Proc::Gone,
            };
            Proc::Is { parent, start: 7 }
        }
    }

    #[test]
    fn sender_table() {
        let sub = Senders::Descendants { me: ME, proc_is_ours: true };
        let foreign = Senders::Descendants { me: ME, proc_is_ours: false };
        for (senders, worker, pid, gone, want) in [
            (Senders::Namespace, Some(200), 200, &[][..], Ok(())),
            (Senders::Namespace, Some(200), 60, &[], Ok(())),
            (Senders::Namespace, None, 4242, &[], Ok(())),
            (Senders::Namespace, Some(200), 0, &[], Err(Reject::OutsideNamespace)),
            (sub, Some(200), 0, &[], Err(Reject::OutsideNamespace)),
            (sub, Some(200), 200, &[200], Ok(())),
            (sub, Some(200), 400, &[], Ok(())),
            (sub, Some(200), 250, &[], Ok(())),
            (sub, None, 300, &[], Ok(())),
            (sub, Some(200), 60, &[], Err(Reject::NotDescendant)),
            (sub, Some(200), 50, &[], Err(Reject::NotDescendant)),
            (sub, Some(200), ME, &[], Err(Reject::NotDescendant)),
            (sub, Some(200), 4242, &[], Err(Reject::SenderGone)),
            (sub, Some(200), 400, &[300], Err(Reject::NotDescendant)),
            (foreign, Some(200), 200, &[], Ok(())),
            (foreign, Some(200), 400, &[], Err(Reject::Unverifiable)),
            (foreign, Some(200), 0, &[], Err(Reject::OutsideNamespace)),
        ] {
            let mut known = Known::default();
            assert_eq!(
                may_notify(senders, worker, pid, &mut known, tree(gone)),
                want,
                "{senders:?} worker={worker:?} pid={pid}"
            );
        }
    }

    #[test]
    fn a_parent_that_exits_mid_walk_hands_its_child_to_drainit() {
        // 400's parent 300 is read once, then it is gone and 400 is drainit's.
        let mut reads = 0;
        let parent_of = |pid| match pid {
            400 => {
                reads += 1;
                Proc::Is { parent: if reads == 1 { 300 } else { ME }, start: 1 }
            }
            _ => Proc::Gone,
        };
        let sub = Senders::Descendants { me: ME, proc_is_ours: true };
        assert_eq!(may_notify(sub, Some(200), 400, &mut Known::default(), parent_of), Ok(()));
    }

    #[test]
    fn a_parent_cycle_ends() {
        let sub = Senders::Descendants { me: ME, proc_is_ours: true };
        let cycle = |pid| Proc::Is { parent: if pid == 7 { 8 } else { 7 }, start: 0 };
        assert_eq!(may_notify(sub, None, 7, &mut Known::default(), cycle), Err(Reject::NotDescendant));
    }

    #[test]
    fn stat_lines() {
        let tail = "0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5555 1000 1";
        assert_eq!(stat_fields(format!("42 (sh) S 7 42 42 {tail}").as_bytes()), Some((7, 5555)));
        assert_eq!(stat_fields(format!("42 (a) b) (c) R 9 1 1 {tail}").as_bytes()), Some((9, 5555)));
        assert_eq!(stat_fields(b"42 (sh) S 7 42 42"), None, "cut before starttime");
        assert_eq!(stat_fields(b"42 (x"), None);
        let me = std::process::id() as i32;
        assert_eq!(parent_pid(me), Some(nix::unistd::getppid().as_raw()));
        assert_eq!(parent_pid(i32::MAX), None);
    }

    #[test]
    fn check_sender_reads_proc() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id() as i32;
        let sub = Senders::Descendants { me, proc_is_ours: true };
        let kid = child.id() as i32;
        let check = |pid| may_notify(sub, None, pid, &mut Known::default(), |p| read_proc(p, &mut None));
        let got = check(kid);
        let stranger = check(nix::unistd::getppid().as_raw());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(got, Ok(()));
        assert_eq!(stranger, Err(Reject::NotDescendant));
    }

    #[test]
    fn addresses() {
        let a = address(OsStr::new("/run/x.sock")).unwrap();
        assert_eq!(a.path(), Some(Path::new("/run/x.sock")));
        let a = address(OsStr::new("@/org/x")).unwrap();
        assert_eq!(a.as_abstract(), Some(&b"/org/x"[..]));
        for bad in ["", "@", "relative", "vsock:2:1234", &format!("/{}", "x".repeat(200))] {
            assert!(address(OsStr::new(bad)).is_none(), "{bad}");
        }
    }

    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("drainit-notify-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_message_is_judged_by_its_faults_before_its_sender() {
        let judge = |pid, body: Result<&'static [u8], Reject>, sender| {
            let mut asked = None;
            let message = Message { pid, fds: 0, body: body.and_then(parse) };
            let got = message.judged(|p| {
                asked = Some(p);
                sender
            });
            (got.map(|a| a.count()), asked)
        };
        let gone = Err(Reject::SenderGone);
        assert_eq!(judge(Some(7), Ok(b"READY=1\nSTATUS=a\0b"), gone), (Err(Reject::NulByte), None));
        assert_eq!(judge(Some(7), Err(Reject::TooLong), gone), (Err(Reject::TooLong), None));
        assert_eq!(judge(None, Err(Reject::NoCredentials), Ok(())), (Err(Reject::NoCredentials), None));
        assert_eq!(judge(Some(7), Ok(b"READY=1"), gone), (Err(Reject::SenderGone), Some(7)));
        assert_eq!(judge(Some(7), Ok(b"READY=1\nSTATUS=up"), Ok(())), (Ok(2), Some(7)));
    }

    /// What drain() reported, owned.
    #[derive(Debug, PartialEq)]
    struct Got {
        pid: Option<i32>,
        fds: usize,
        body: Result<Vec<String>, Reject>,
    }

    fn drain_all(socket: &mut NotifySocket) -> Vec<Got> {
        let mut got = Vec::new();
        let more = socket
            .drain(64, None, |m| {
                let body = m.body.map(|a| a.map(|a| format!("{a:?}")).collect());
                got.push(Got { pid: m.pid, fds: m.fds, body });
            })
            .unwrap();
        assert!(!more);
        got
    }

    fn send_with_fds(to: &Path, bytes: &[u8], fds: &[i32]) {
        let tx = UnixDatagram::unbound().unwrap();
        tx.connect(to).unwrap();
        let iov = [std::io::IoSlice::new(bytes)];
        let rights = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        nix::sys::socket::sendmsg::<()>(tx.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None).unwrap();
    }

    /// Whether the pipe whose read end is `r` has no write end left open
    /// anywhere (POLLHUP): how a sender's BARRIER=1 learns it was read.
    fn hung_up(r: &OwnedFd) -> bool {
        hung_up_within(r, nix::poll::PollTimeout::ZERO)
    }

    /// `hung_up`, waiting up to 5 s for it: another test of this binary may
    /// have forked and not exec'd yet, and its child holds a copy of every
    /// descriptor (close-on-exec or not) until its exec.
    fn hangs_up(r: &OwnedFd) -> bool {
        hung_up_within(r, nix::poll::PollTimeout::from(5000u16))
    }

    fn hung_up_within(r: &OwnedFd, timeout: nix::poll::PollTimeout) -> bool {
        let mut fds = [nix::poll::PollFd::new(r.as_fd(), nix::poll::PollFlags::empty())];
        nix::poll::poll(&mut fds, timeout).unwrap();
        fds[0].revents().is_some_and(|e| e.contains(nix::poll::PollFlags::POLLHUP))
    }

    #[test]
    fn socket_reads_credentials_and_closes_every_fd() {
        let dir = Dir::new("socket");
        let path = dir.0.join("notify");
        let mut socket = NotifySocket::bind(&path).unwrap();
        let me = Some(std::process::id() as i32);
        assert_eq!(drain_all(&mut socket), vec![], "nothing waiting: EAGAIN, at once");

        let tx = UnixDatagram::unbound().unwrap();
        tx.send_to(b"READY=1\nSTATUS=up", &path).unwrap();
        tx.send_to(b"WATCHDOG=1", &path).unwrap();
        tx.send_to(&vec![b'x'; MAX_MESSAGE + 1], &path).unwrap();
        tx.send_to(&vec![b'x'; 3 * MAX_MESSAGE], &path).unwrap();
        tx.send_to(b"READY=\x001", &path).unwrap();
        assert_eq!(
            drain_all(&mut socket),
            vec![
                Got { pid: me, fds: 0, body: Ok(vec!["Ready".into(), "Status(\"up\")".into()]) },
                Got { pid: me, fds: 0, body: Ok(vec!["Watchdog".into()]) },
                Got { pid: me, fds: 0, body: Err(Reject::TooLong) },
                Got { pid: me, fds: 0, body: Err(Reject::TooLong) },
                Got { pid: me, fds: 0, body: Err(Reject::NulByte) },
            ]
        );

        // A barrier: the write end travels with the message; once drain has
        // closed the copy it received, no write end is left.
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        send_with_fds(&path, b"BARRIER=1", &[w.as_raw_fd()]);
        drop(w);
        assert!(!hung_up(&r), "the queued message holds the write end");
        let mut open_while_judged = None;
        socket.drain(64, None, |m| open_while_judged = Some((m.fds, hung_up(&r)))).unwrap();
        assert_eq!(open_while_judged, Some((1, false)), "the sender still waits while its message is judged");
        assert!(hangs_up(&r), "drain closed the write end it received");

        // The kernel's most (253) on a refused message: every copy closed.
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let copies = vec![w.as_raw_fd(); 253];
        send_with_fds(&path, b"READY=\x001", &copies);
        drop(w);
        assert_eq!(drain_all(&mut socket), vec![Got { pid: me, fds: 253, body: Err(Reject::NulByte) }]);
        assert!(hangs_up(&r), "all 253 received copies closed");
    }

    /// A received descriptor is let go of without waiting: a TCP socket
    /// with a linger time and unsent data is closed at once, a pipe too
    /// (the barrier), and what could block in close is kept.
    #[test]
    fn release_never_waits() {
        use std::io::Write;
        use std::net::{TcpListener, TcpStream};
        let srv = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(srv.local_addr().unwrap()).unwrap();
        setsockopt(&c, sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 5 }).unwrap();
        c.set_nonblocking(true).unwrap();
        let chunk = vec![0u8; 65536];
        while (&c).write(&chunk).is_ok() {}
        let mut parked = Vec::new();
        let t = Instant::now();
        release(OwnedFd::from(c), &mut parked);
        assert!(t.elapsed() < Duration::from_secs(2), "waited {:?} in close", t.elapsed());
        assert!(parked.is_empty(), "a TCP socket is closed");
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        release(w, &mut parked);
        assert!(hangs_up(&r) && parked.is_empty(), "a pipe is closed");
        release(OwnedFd::from(std::fs::File::open("/proc/self/stat").unwrap()), &mut parked);
        release(OwnedFd::from(UnixDatagram::pair().unwrap().0), &mut parked);
        assert_eq!(parked.len(), 2, "a file and an AF_UNIX socket are kept");
        for _ in 0..PARKED {
            release(OwnedFd::from(std::fs::File::open("/proc/self/stat").unwrap()), &mut parked);
        }
        assert_eq!(parked.len(), PARKED, "at most PARKED kept");
        drop(srv);
    }

    /// The kernel gives the sender's pid in the receiver's PID namespace: a
    /// sender that is pid 1 of a namespace below drainit's arrives with the
    /// pid drainit knows it by. (One outside drainit's namespace arrives as
    /// pid 0, which `may_notify` refuses; a test of that would need drainit's
    /// side in a namespace of its own.)
    #[test]
    fn credentials_are_in_the_receivers_namespace() {
        let dir = Dir::new("pidns");
        let path = dir.0.join("notify");
        let mut socket = NotifySocket::bind(&path).unwrap();
        let send = "import os, socket, sys\n\
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
                    s.sendto(b'STATUS=%d' % os.getpid(), sys.argv[1])";
        let out = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--", "python3", "-c", send])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut got = None;
        socket
            .drain(8, None, |m| {
                let status = m.body.unwrap().next();
                got = Some((m.pid, status.map(|s| format!("{s:?}"))));
            })
            .unwrap();
        let (pid, status) = got.expect("the message arrived");
        assert_eq!(status.as_deref(), Some("Status(\"1\")"), "pid 1 in its own namespace");
        assert!(pid.is_some_and(|p| p > 1 && p != std::process::id() as i32), "{pid:?}: translated");
    }

    #[test]
    fn drain_stops_at_max() {
        let dir = Dir::new("max");
        let path = dir.0.join("notify");
        let mut socket = NotifySocket::bind(&path).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        for _ in 0..3 {
            tx.send_to(b"WATCHDOG=1", &path).unwrap();
        }
        let mut n = 0;
        assert!(socket.drain(2, None, |_| n += 1).unwrap(), "stopped at max");
        assert!(!socket.drain(2, None, |_| n += 1).unwrap(), "emptied");
        assert_eq!(n, 3);
    }

    #[test]
    fn bind_refuses_a_taken_or_impossible_path() {
        let dir = Dir::new("bind");
        let path = dir.0.join("notify");
        let _first = NotifySocket::bind(&path).unwrap();
        assert_eq!(NotifySocket::bind(&path).err(), Some(Errno::EADDRINUSE));
        assert!(NotifySocket::bind(&dir.0.join("x".repeat(200))).is_err());
    }

    #[test]
    fn outer_sends_to_path_and_abstract() {
        let dir = Dir::new("outer");
        let path = dir.0.join("outer");
        let rx = UnixDatagram::bind(&path).unwrap();
        let name = format!("drainit-outer-test-{}", std::process::id());
        let abs = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        };
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        abs.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        // Tests run on threads of one process: the environment is shared,
        // so this is the only test that touches NOTIFY_SOCKET.
        for (value, socket) in [(path.as_os_str().to_owned(), &rx), (format!("@{name}").into(), &abs)] {
            sys::set_env("NOTIFY_SOCKET", &value);
            let outer = Outer::from_env().unwrap();
            assert!(std::env::var_os("NOTIFY_SOCKET").is_none(), "taken out of the environment");
            outer.send("READY=1\nSTATUS=x");
            let mut buf = [0u8; 64];
            let n = socket.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");
        }
        drop(rx);
        sys::set_env("NOTIFY_SOCKET", path.as_os_str());
        let outer = Outer::from_env().unwrap();
        outer.send("READY=1");
        outer.send("READY=1");
        assert!(outer.failed.get(), "a receiver gone is a failure, not a block or a panic");
        sys::set_env("NOTIFY_SOCKET", OsStr::new("relative"));
        assert!(Outer::from_env().is_none());
        assert!(std::env::var_os("NOTIFY_SOCKET").is_none());
        assert!(Outer::from_env().is_none(), "unset");
    }
}
