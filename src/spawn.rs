//! The only spawn: the worker becomes the leader of a new session (its own
//! process group, so the whole group can be signalled), takes the terminal
//! when there is one, gets an empty signal mask, and execs with execvp
//! semantics. An exec failure is reported by the child itself (see
//! `sys::spawn`), so that drainit can tell 127 (not found) from 126 (not
//! executable) from a worker that merely exited with those codes.

use std::ffi::{CString, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::setsid;

use crate::events::Event;
use crate::retry_after;
use crate::signals;
use crate::sys::{self, ChildStack, ExecArgs};

pub const ATTEMPT_VAR: &str = "DRAINIT_ATTEMPT";

/// Why no worker is running.
#[derive(Debug)]
pub enum SpawnError {
    Exec {
        errno: Errno,
    },
    /// drainit's own step failed: "fork" (the clone that makes the worker),
    /// or "stack" for the stack it starts on.
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
    stack: Option<ChildStack>,
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
            stack: None,
            exec: ExecArgs::new(argv),
            take_tty,
        })
    }

    /// Start attempt `attempt`; returns the worker's pid (= its pgid).
    pub fn spawn(&mut self, attempt: u32) -> Result<i32, SpawnError> {
        sys::set_env(ATTEMPT_VAR, attempt.to_string().as_ref());
        let stack = match &mut self.stack {
            Some(stack) => stack,
            None => self
                .stack
                .insert(ChildStack::new(self.exec.argc()).map_err(|errno| SpawnError::Setup { what: "stack", errno })?),
        };
        let take_tty = self.take_tty;
        let spawned = sys::spawn(stack, &self.exec, || child_setup(take_tty))
            .map_err(|errno| SpawnError::Setup { what: "fork", errno })?;
        match spawned.exec_error {
            None => Ok(spawned.pid.as_raw()),
            Some(errno) => {
                // The child has _exited: collect it so it is not reported
                // later as a worker exit.
                let _ = nix::sys::wait::waitpid(spawned.pid, None);
                Err(SpawnError::Exec { errno })
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

/// In the child, before exec: syscalls only (it shares drainit's memory).
fn child_setup(take_tty: bool) {
    // Cannot fail: a fresh child is never a process group leader.
    let _ = setsid();
    if take_tty {
        // Before exec, so the worker's first instruction (and the first
        // keystroke) already finds its group in the foreground: the kernel
        // makes the session's group the terminal's foreground group here.
        // Without a stolen terminal (drainit detached from it in tty.rs) this
        // fails only when another session holds it (drainit typed at a
        // shell); the worker then runs without a controlling terminal, as
        // under dumb-init. stdin() allocates nothing here: tty::hand_over,
        // which alone sets take_tty, created its buffer before.
        let _ = sys::set_controlling_tty(std::io::stdin().as_fd());
    }
    // Dispositions are already SIG_DFL (drainit reset them at startup and
    // never installs a handler); the mask is the last thing inherited.
    let _ = signals::unblock_all();
}
