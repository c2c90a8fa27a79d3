//! The terminal, when drainit's stdin is one (`docker run -it`): drainit gives
//! it up so that the worker's new session can take it as its controlling
//! terminal and be its foreground group, so Ctrl-C, Ctrl-Z and resizes reach
//! the worker's jobs directly, as they would without drainit. drainit is then
//! in no foreground group: it never gets (so never forwards a second copy of)
//! a signal the terminal sends, and having no terminal it is never stopped by
//! SIGTTIN/SIGTTOU (it blocks every signal anyway).
//!
//! When drainit is not a session leader (typed at an interactive shell), the
//! terminal stays with that shell's session: the worker's TIOCSCTTY fails and
//! it runs without a controlling terminal, while drainit remains the shell's
//! foreground job and forwards what the terminal sends it (Ctrl-C: a SIGINT,
//! which is also a stop request) to the worker's group, once.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::signal::Signal;
use nix::unistd::{getpid, getsid};

use crate::signals::SignalSource;
use crate::sys;

/// Release drainit's controlling terminal, if stdin is one. Returns whether
/// the worker should take it.
pub fn hand_over(signals: &SignalSource) -> bool {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return false;
    }
    let leader = getsid(None).is_ok_and(|sid| sid == getpid());
    if sys::release_controlling_tty(stdin.as_fd()).is_ok() && leader {
        // A session leader that lets go of its terminal makes the kernel send
        // SIGHUP and SIGCONT to the terminal's foreground group, drainit's
        // own. They are blocked, so they are pending now; forwarding them
        // would hang up the worker before it starts (dumb-init issue #136).
        let _ = signals.discard(&[Signal::SIGHUP, Signal::SIGCONT]);
    }
    true
}
