//! Reaping: drainit's registration as child subreaper (when it is not PID 1,
//! so that orphans come to it instead of to the real init), collecting every
//! exited child without blocking, and what its wait status says.

use nix::errno::Errno;

use crate::events::Event;
use crate::exit::Outcome;
use crate::sys;

/// How drainit inherits orphans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a PID namespace: every orphan comes here, and `kill(-1)`
    /// reaches every other process of the namespace.
    Pid1,
    /// A registered child subreaper: orphaned descendants come here.
    Subreaper,
    /// Neither (the kernel refused PR_SET_CHILD_SUBREAPER): orphans escape
    /// to the real init.
    Plain,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Pid1 => "pid1",
            Mode::Subreaper => "subreaper",
            Mode::Plain => "plain",
        }
    }
}

/// Decide the mode, registering as subreaper when not PID 1.
pub fn setup(me: i32) -> Mode {
    if me == 1 {
        return Mode::Pid1;
    }
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => Mode::Subreaper,
        Err(e) => {
            Event::SubreaperRefused { error: e.desc().to_string() }.emit();
            Mode::Plain
        }
    }
}

/// What a round of reaping left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// No child at all.
    Nothing,
    /// Children that have not exited.
    Running,
    /// The round stopped at its limit with exited children still waiting.
    More,
}

/// Reap up to `max` exited children, calling `on_exit` for each; never
/// blocks. The limit keeps a stream of exiting orphans (a fork bomb as PID
/// 1) from holding the event loop away from its deadline.
pub fn reap_pending(max: usize, mut on_exit: impl FnMut(i32, Outcome)) -> Left {
    for _ in 0..max {
        match sys::wait_any_nohang() {
            Ok(Some(w)) => on_exit(w.pid.as_raw(), Outcome::from_wait_status(w.status)),
            Ok(None) => return Left::Running,
            Err(Errno::ECHILD) => return Left::Nothing,
            Err(Errno::EINTR) => {}
            Err(e) => {
                // Not expected from waitpid(-1, WNOHANG); say so, assume
                // children remain (the next SIGCHLD retries).
                Event::Failed { what: "waitpid", error: e.desc().to_string() }.emit();
                return Left::Running;
            }
        }
    }
    Left::More
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Code;

    #[test]
    fn outcome_from_status() {
        assert_eq!(Outcome::from_wait_status(42 << 8), Outcome::Exited(42));
        assert_eq!(Outcome::from_wait_status(9), Outcome::Signaled(9));
        assert_eq!(Outcome::from_wait_status(9).code(), Code(137));
        assert_eq!(Outcome::from_wait_status(0x80 | 11).code(), Code(139)); // core dumped
    }
}
