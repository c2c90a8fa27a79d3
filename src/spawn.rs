//! The only spawn: a program (the worker, or the finish program) becomes the
//! leader of a new session (its own process group, so the whole group can
//! be signalled), takes the terminal when there is one, gets an empty signal
//! mask, and execs with execvp semantics. An exec failure is reported by the
//! child itself (see `sys::spawn`), so that drainit can tell 127 (not found)
//! from 126 (not executable) from a worker that merely exited with those codes.

use std::cell::Cell;
use std::ffi::{CString, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::unistd::setsid;

use crate::events::Event;
use crate::exit::Code;
use crate::signals;
use crate::sys::{self, ChildStack, ExecArgs};
use crate::user::Credentials;

/// Why no program is running.
#[derive(Debug)]
pub enum SpawnError {
    Exec {
        errno: Errno,
    },
    /// `--user`: the child's switch failed at `call` (setgroups, setgid,
    /// setuid) and it ended before exec, with 126.
    User {
        call: &'static str,
        errno: Errno,
    },
    /// drainit's own step failed: "fork" (the clone that makes the child),
    /// or "stack" for the stack it starts on.
    Setup {
        what: &'static str,
        errno: Errno,
    },
}

impl SpawnError {
    pub fn code(&self) -> Code {
        match self {
            SpawnError::Exec { errno: Errno::ENOENT | Errno::ENOTDIR } => Code::NOT_FOUND,
            SpawnError::Exec { .. } | SpawnError::User { .. } => Code::NOT_EXECUTABLE,
            SpawnError::Setup { .. } => Code::FAILED,
        }
    }
}

/// A command line, prepared once (the child allocates nothing).
pub struct Program {
    name: String,
    exec: ExecArgs,
}

impl Program {
    pub fn new(argv: &[OsString]) -> Result<Program, String> {
        let args = argv
            .iter()
            .map(|arg| CString::new(arg.as_bytes()).map_err(|_| format!("argument {arg:?} holds a NUL byte")))
            .collect::<Result<Vec<_>, _>>()?;
        let name = argv.first().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Program { name, exec: ExecArgs::new(args) })
    }

    /// The event that says why this program (the finish program, when
    /// `finish`) did not start.
    pub fn failure_event(&self, err: &SpawnError, finish: bool) -> Event {
        match err {
            SpawnError::Exec { errno } if finish => {
                Event::FinishFailed { command: self.name.clone(), error: errno.desc().to_string() }
            }
            SpawnError::Exec { errno } => {
                Event::ExecFailed { command: self.name.clone(), error: errno.desc().to_string(), code: err.code().0 }
            }
            SpawnError::User { call, errno } if finish => {
                Event::FinishFailed { command: self.name.clone(), error: format!("{call}: {}", errno.desc()) }
            }
            SpawnError::User { call, errno } => Event::ExecFailed {
                command: self.name.clone(),
                error: format!("{call}: {}", errno.desc()),
                code: err.code().0,
            },
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

/// What every spawn shares: the stack children start on, and the terminal.
pub struct Spawner {
    stack: Option<ChildStack>,
    take_tty: bool,
    /// Write the child's pid into WATCHDOG_PID.
    watchdog_pid: bool,
    /// `--user`: whom the child becomes before exec.
    user: Option<Credentials>,
}

impl Spawner {
    pub fn new(take_tty: bool, watchdog_pid: bool) -> Spawner {
        Spawner { stack: None, take_tty, watchdog_pid, user: None }
    }

    /// Every program runs as `user` (the worker and the finish program).
    pub fn set_user(&mut self, user: Option<Credentials>) {
        self.user = user;
    }

    /// Start `program`; returns its pid (= its pgid). Variables it should
    /// see are set in drainit's own environment before (`environment`).
    pub fn spawn(&mut self, program: &Program) -> Result<i32, SpawnError> {
        let argc = program.exec.argc();
        if self.stack.as_ref().is_some_and(|s| !s.fits(argc)) {
            self.stack = None;
        }
        let stack = match &mut self.stack {
            Some(stack) => stack,
            None => {
                self.stack.insert(ChildStack::new(argc).map_err(|errno| SpawnError::Setup { what: "stack", errno })?)
            }
        };
        let (take_tty, watchdog_pid, user) = (self.take_tty, self.watchdog_pid, self.user.as_ref());
        // Written by the child when its switch of user fails (it shares
        // drainit's memory, and drainit sleeps until it exits).
        let switch_failed = Cell::new(None);
        let spawned = sys::spawn(stack, &program.exec, || child_setup(take_tty, watchdog_pid, user, &switch_failed))
            .map_err(|errno| SpawnError::Setup { what: "fork", errno })?;
        if let Some((call, errno)) = switch_failed.get() {
            let _ = nix::sys::wait::waitpid(spawned.pid, None);
            return Err(SpawnError::User { call, errno });
        }
        match spawned.exec_error {
            None => Ok(spawned.pid.as_raw()),
            Some(errno) => {
                // The child has _exited: collect it so it is not reported
                // later as an exit of the program.
                let _ = nix::sys::wait::waitpid(spawned.pid, None);
                Err(SpawnError::Exec { errno })
            }
        }
    }
}

/// In the child, before exec: syscalls only (it shares drainit's memory).
fn child_setup(
    take_tty: bool,
    watchdog_pid: bool,
    user: Option<&Credentials>,
    switch_failed: &Cell<Option<(&'static str, Errno)>>,
) {
    if watchdog_pid {
        crate::environment::fill_watchdog_pid();
    }
    // Cannot fail: a fresh child is never a process group leader.
    let _ = setsid();
    if take_tty {
        // Before exec, so the program's first instruction (and the first
        // keystroke) already finds its group in the foreground: the kernel
        // makes the session's group the terminal's foreground group here.
        // Without a stolen terminal (drainit detached from it in tty.rs) this
        // fails only when another session holds it (drainit typed at a
        // shell); the program then runs without a controlling terminal, as
        // under dumb-init. stdin() allocates nothing here: tty::hand_over,
        // which alone sets take_tty, created its buffer before.
        let _ = sys::set_controlling_tty(std::io::stdin().as_fd());
    }
    // Last of what needs root; a failure ends the child here: never an
    // exec as root by accident.
    if let Some(user) = user
        && let Err(failed) = sys::become_user(&user.groups, user.gid, user.uid)
    {
        switch_failed.set(Some(failed));
        sys::exit_now(Code::NOT_EXECUTABLE.0);
    }
    // Dispositions are already SIG_DFL (drainit reset them at startup and
    // never installs a handler); the mask is the last thing inherited.
    let _ = signals::unblock_all();
}
