//! Reaping: drainit's registration as child subreaper (when it is not PID 1,
//! so that orphans come to it instead of to the real init), collecting every
//! exited child without blocking, and what its wait status says.
//!
//! A stop is never an exit. drainit waits without WUNTRACED, so the only
//! stops it sees are ptrace stops of a child that made drainit its tracer
//! (PTRACE_TRACEME, the common anti-debugging check, in the worker or in an
//! orphan that came to drainit): each signal sent to such a child stops it
//! and is reported here instead of delivered. drainit traces nothing, so it
//! lets the child go at once with the signal that stopped it, as a tracer
//! that does not trace would: the child then behaves as without drainit.

use nix::errno::Errno;

use crate::events::Event;
use crate::exit::Outcome;
use crate::sys;

/// How drainit inherits orphans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// PID 1 of a PID namespace: every orphan comes here, and `kill(-1)`
    /// reaches every other process of the namespace.
    Pid1,
    /// A registered child subreaper: orphaned descendants come here.
    Subreaper,
    /// Neither (the kernel refused PR_SET_CHILD_SUBREAPER): orphans escape
    /// to the real init.
    Plain,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Pid1 => "pid1",
            Role::Subreaper => "subreaper",
            Role::Plain => "plain",
        }
    }
}

/// How drainit inherits orphans: as PID 1, or registered as subreaper
/// (when the kernel allows it).
pub fn register(me: i32) -> Role {
    if me == 1 {
        return Role::Pid1;
    }
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => Role::Subreaper,
        Err(e) => {
            Event::SubreaperRefused { error: e.desc().to_string() }.emit();
            Role::Plain
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
            Ok(Some(w)) if libc::WIFSTOPPED(w.status) => let_go(w.pid, w.status),
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

/// Detach from a child in a ptrace stop, passing on what stopped it.
fn let_go(pid: nix::unistd::Pid, status: i32) {
    let sig = libc::WSTOPSIG(status);
    // An event stop (status >> 16) or a syscall stop (0x80) comes only with
    // ptrace options, which drainit never sets: nothing is waiting then.
    let pass = if status >> 16 != 0 || sig & 0x80 != 0 {
        0
    } else {
        match sys::ptrace_siginfo(pid) {
            // The SIGTRAP a traced exec raises in the child itself: only a
            // tracer sees it (untraced, there is none), and delivered it
            // would kill the program just exec'd.
            Ok((libc::SI_USER, from)) if sig == libc::SIGTRAP && from == pid.as_raw() => 0,
            Ok(_) => sig,
            // EINVAL: a group-stop, whose signal was already delivered (the
            // child stays stopped, as it would untraced). ESRCH: killed since.
            Err(_) => 0,
        }
    };
    match sys::ptrace_detach(pid, pass) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => Event::Failed { what: "ptrace_detach", error: e.desc().to_string() }.emit(),
    }
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
