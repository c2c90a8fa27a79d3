//! The invocations of the binary that are tools, not an init: `drainit
//! --notify ASSIGNMENT...` (a notify client that waits until its message was
//! read) and `drainit --probe` (a readiness probe on the ready and drain
//! files). Both work where drainit is the only binary (`FROM scratch`): no
//! shell, no /proc, nothing but syscalls.

use std::ffi::{OsStr, OsString};
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, connect, send, sendmsg, setsockopt, socket,
    sockopt,
};
use nix::sys::stat::lstat;
use nix::sys::time::TimeVal;

use crate::notify;

/// How long `--notify` waits for its message to be read (its error texts
/// say it: "5s").
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The tool `args` (the whole command line) asks for, run to its exit code;
/// None when argv[1] names no tool (drainit is an init then).
pub fn dispatch(args: &[OsString]) -> Option<i32> {
    let tool = args.get(1)?.as_bytes();
    // The lengths first: an init's argv[1] ("--", a flag, the command)
    // rarely gets past them.
    if tool.len() != b"--notify".len() && tool.len() != b"--probe".len() {
        return None;
    }
    let rest = &args[2..];
    match tool {
        b"--notify" => Some(notify_tool(rest)),
        b"--probe" => Some(probe(rest)),
        _ => None,
    }
}

/// One line on stderr, `drainit: ` first; returns `code`. A stderr that
/// fails changes nothing.
fn say(code: i32, line: std::fmt::Arguments<'_>) -> i32 {
    let _ = writeln!(std::io::stderr(), "drainit: {line}");
    code
}

fn shown(s: &OsStr) -> std::borrow::Cow<'_, str> {
    s.to_string_lossy()
}

/// `drainit --notify ASSIGNMENT...`: 0 once the receiver has read the
/// message, 1 when there is none or it did not read it in time, 2 for bad
/// arguments (checked before anything is sent).
fn notify_tool(args: &[OsString]) -> i32 {
    if args.is_empty() {
        return say(2, format_args!("--notify needs at least one ASSIGNMENT (READY=1, WATCHDOG=1, STATUS=TEXT)"));
    }
    let mut message = Vec::new();
    for arg in args {
        let bytes = arg.as_bytes();
        // The receiver splits lines at a carriage return as at a newline
        // (systemd does): either would turn one argument into two
        // assignments. Such an argument is not shown: it would break the
        // line. (A NUL cannot reach argv.)
        let breaks = bytes.iter().any(|&b| b == b'\n' || b == b'\r');
        let why = match (bytes.contains(&b'='), breaks) {
            (false, false) => format_args!("'{}' is not an assignment VAR=VALUE", shown(arg)),
            (_, true) => format_args!(
                "an argument holds a newline or a carriage return: give each assignment as its own argument"
            ),
            (true, false) => {
                if !message.is_empty() {
                    message.push(b'\n');
                }
                message.extend_from_slice(bytes);
                continue;
            }
        };
        return say(2, format_args!("--notify: {why}"));
    }
    if message.len() > notify::MAX_MESSAGE {
        return say(2, format_args!("--notify: the message is more than the 4096 bytes a notify socket takes"));
    }
    let Some(value) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
        return say(1, format_args!("--notify: NOTIFY_SOCKET is not set: no one to notify"));
    };
    let why = match notify::address(&value) {
        None => Failure::Plain("is neither an absolute path nor @abstract"),
        Some(addr) => match send_and_wait(&message, &addr, Instant::now() + NOTIFY_TIMEOUT) {
            Ok(()) => return 0,
            Err(why) => why,
        },
    };
    say(1, format_args!("--notify: NOTIFY_SOCKET={}: {why}", shown(&value)))
}

/// Why `--notify` failed, shown after the socket's name. The texts say 5s:
/// NOTIFY_TIMEOUT.
enum Failure {
    Plain(&'static str),
    Errno(&'static str, Errno),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Plain(what) => f.write_str(what),
            Failure::Errno(what, e) => write!(f, "{what}: {}", e.desc()),
        }
    }
}

/// Send `message`, then a `BARRIER=1` message carrying a pipe's write end,
/// and wait until the receiver has closed it (POLLHUP on the read end): it
/// has read both, in order (datagrams on a socket are read in the order
/// sent). The barrier goes on its own, as sd_notify_barrier(3) sends it:
/// systemd drops a message that holds `BARRIER=1` among other assignments,
/// and warns about descriptors on any other; drainit closes descriptors on
/// every message. Everything, the sends too, ends by `deadline`.
fn send_and_wait(message: &[u8], addr: &UnixAddr, deadline: Instant) -> Result<(), Failure> {
    let fd = socket(AddressFamily::Unix, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| Failure::Errno("no socket", e))?;
    connect(fd.as_raw_fd(), addr).map_err(|e| Failure::Errno("cannot reach it", e))?;
    // Connected, a send waits while the receiver's queue is full; the send
    // timeout bounds that wait (0 would mean forever: at least 1 ms).
    let send_within = |full: &'static str, failed: &'static str, f: &dyn Fn() -> nix::Result<usize>| {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let tv = TimeVal::new(left.as_secs() as _, left.subsec_micros() as _);
        setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(|e| Failure::Errno("cannot set a send timeout", e))?;
        loop {
            match f() {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Err(Failure::Plain(full)),
                Err(e) => return Err(Failure::Errno(failed, e)),
            }
        }
    };
    send_within(
        "the message was not delivered within 5s: the receiver's queue stayed full",
        "the message was not delivered",
        &|| send(fd.as_raw_fd(), message, MsgFlags::MSG_NOSIGNAL),
    )?;
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Failure::Errno("no pipe", e))?;
    send_within(
        "the barrier was not delivered within 5s: the receiver's queue stayed full",
        "the barrier was not delivered",
        &|| {
            let barrier = [IoSlice::new(b"BARRIER=1")];
            let fds = [write_end.as_raw_fd()];
            sendmsg::<()>(fd.as_raw_fd(), &barrier, &[ControlMessage::ScmRights(&fds)], MsgFlags::MSG_NOSIGNAL, None)
        },
    )?;
    // The message in flight holds the only other copy.
    drop(write_end);
    loop {
        // Rounded up: a wait cut to 0 ms before the deadline would spin.
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_secs().saturating_mul(1000) + u64::from(left.subsec_nanos().div_ceil(1_000_000));
        let mut fds = [PollFd::new(read_end.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)) {
            Ok(_) if fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLHUP)) => return Ok(()),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(Failure::Errno("cannot wait for the receiver", e)),
        }
        if Instant::now() >= deadline {
            return Err(Failure::Plain("the message was not read within 5s"));
        }
    }
}

/// `drainit --probe`: 0 when the ready file exists and the drain file (if
/// named) does not. Never follows a link: a link at the ready file's path
/// is something there; at the drain file's, a stop under way.
fn probe(args: &[OsString]) -> i32 {
    if let Some(extra) = args.first() {
        return say(2, format_args!("--probe takes no arguments, got '{}'", shown(extra)));
    }
    let Some(ready) = std::env::var_os("DRAINIT_READY_FILE").filter(|v| !v.is_empty()) else {
        return say(2, format_args!("--probe: DRAINIT_READY_FILE is not set: no ready file to look at"));
    };
    match lstat(ready.as_os_str()) {
        Ok(_) => {}
        Err(Errno::ENOENT) => return say(1, format_args!("not ready: {} does not exist", shown(&ready))),
        Err(e) => return say(1, format_args!("cannot tell: {}: {}", shown(&ready), e.desc())),
    }
    if let Some(drain) = std::env::var_os("DRAINIT_DRAIN_FILE").filter(|v| !v.is_empty()) {
        match lstat(drain.as_os_str()) {
            Ok(_) => return say(1, format_args!("stopping: {} exists", shown(&drain))),
            Err(Errno::ENOENT) => {}
            Err(e) => return say(1, format_args!("cannot tell: {}: {}", shown(&drain), e.desc())),
        }
    }
    0
}
