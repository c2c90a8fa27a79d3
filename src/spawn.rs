//! The only fork and exec: the worker becomes the leader of a new session
//! (its own process group, so the whole group can be signalled), takes the
//! terminal when there is one, gets an empty signal mask, and execs with
//! execvp semantics. An exec failure travels back over a close-on-exec pipe
//! so that drainit can tell 127 (not found) from 126 (not executable) from
//! a worker that merely exited with those codes.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::{ForkResult, pipe2, read, setsid, write};

use crate::events::Event;
use crate::retry_after;
use crate::signals;
use crate::sys::{self, ExecArgs};

pub const ATTEMPT_VAR: &str = "DRAINIT_ATTEMPT";

/// Why no worker is running.
#[derive(Debug)]
pub enum SpawnError {
    Exec {
        errno: Errno,
    },
    /// drainit's own step failed: "fork", or "pipe" for the exec report.
    Setup {
        what: &'static str,
        errno: Errno,
    },
}

impl SpawnError {
    /// 127 not found, 126 found but not executable, 125 drainit's own failure.
    pub fn code(&self) -> i32 {
        match self {
            SpawnError::Exec { errno: Errno::ENOENT | Errno::ENOTDIR } => 127,
            SpawnError::Exec { .. } => 126,
            SpawnError::Setup { .. } => 125,
        }
    }
}

/// Everything needed to start an attempt, prepared once.
pub struct Spawner {
    command: String,
    exec: ExecArgs,
    take_tty: bool,
}

impl Spawner {
    pub fn new(command: &[OsString], retry_after: &Path, take_tty: bool) -> Result<Spawner, String> {
        let argv = command
            .iter()
            .map(|arg| CString::new(arg.as_bytes()).map_err(|_| format!("argument {arg:?} holds a NUL byte")))
            .collect::<Result<Vec<_>, _>>()?;
        // The worker finds the file's path in the environment drainit passes on.
        sys::set_env(retry_after::VAR, retry_after.as_os_str());
        Ok(Spawner {
            command: command.first().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default(),
            exec: ExecArgs::new(argv),
            take_tty,
        })
    }

    /// Start attempt `attempt`; returns the worker's pid (= its pgid).
    pub fn spawn(&self, attempt: u32) -> Result<i32, SpawnError> {
        sys::set_env(ATTEMPT_VAR, attempt.to_string().as_ref());
        let (report_rx, report_tx) =
            pipe2(OFlag::O_CLOEXEC).map_err(|errno| SpawnError::Setup { what: "pipe", errno })?;

        match sys::fork().map_err(|errno| SpawnError::Setup { what: "fork", errno })? {
            ForkResult::Child => child(&self.exec, &report_tx, self.take_tty),
            ForkResult::Parent { child } => {
                drop(report_tx);
                match read_errno(&report_rx) {
                    None => Ok(child.as_raw()),
                    Some(errno) => {
                        // The child has _exited: collect it so it is not
                        // reported later as a worker exit.
                        let _ = nix::sys::wait::waitpid(child, None);
                        Err(SpawnError::Exec { errno })
                    }
                }
            }
        }
    }

    pub fn failure_event(&self, err: &SpawnError) -> Event {
        match err {
            SpawnError::Exec { errno } => {
                Event::ExecFailed { command: self.command.clone(), error: errno.desc().to_string(), code: err.code() }
            }
            SpawnError::Setup { what, errno } => {
                let error = match (*what, errno) {
                    ("fork", Errno::EAGAIN) => "the process limit is reached (RLIMIT_NPROC or pid_max)".to_string(),
                    _ => errno.desc().to_string(),
                };
                Event::Failed { what, error }
            }
        }
    }
}

/// In the child, until exec: only async-signal-safe calls, no allocation.
fn child(exec: &ExecArgs, report: &OwnedFd, take_tty: bool) -> ! {
    // Cannot fail: a fresh child of fork is never a process group leader.
    let _ = setsid();
    if take_tty {
        // Before exec, so the worker's first instruction (and the first
        // keystroke) already finds its group in the foreground: the kernel
        // makes the session's group the terminal's foreground group here.
        // Without a stolen terminal (drainit detached from it in tty.rs) this
        // fails only when another session holds it (drainit typed at a
        // shell); the worker then runs without a controlling terminal, as
        // under dumb-init. stdin() allocates nothing here: tty::hand_over,
        // which alone sets take_tty, created its buffer before the fork.
        let _ = sys::set_controlling_tty(std::io::stdin().as_fd());
    }
    // Dispositions are already SIG_DFL (drainit reset them at startup and
    // never installs a handler); the mask is the last thing inherited.
    let _ = signals::unblock_all();
    let errno = exec.exec();
    let _ = write(report, &(errno as i32).to_ne_bytes());
    sys::exit_child(if matches!(errno, Errno::ENOENT | Errno::ENOTDIR) { 127 } else { 126 })
}

/// End of file: exec succeeded. Four bytes: the errno of a failed exec.
fn read_errno(pipe: &OwnedFd) -> Option<Errno> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match read(pipe, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    (got == buf.len()).then(|| Errno::from_raw(i32::from_ne_bytes(buf)))
}
