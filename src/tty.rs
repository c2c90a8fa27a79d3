//! The terminal, when drainit's stdin is one (`docker run -it`): drainit gives
//! it up so that the worker's new session can take it as its controlling
//! terminal and be its foreground group, so Ctrl-C, Ctrl-Z and resizes reach
//! the worker's jobs directly, as they would without drainit.

use std::os::fd::AsFd;

use nix::sys::signal::Signal;
use nix::unistd::{getpid, getsid};

use crate::signals::SignalSource;
use crate::sys;

/// Release drainit's controlling terminal, if stdin is one. Returns whether
/// the worker should take it.
pub fn hand_over(signals: &SignalSource) -> bool {
    let stdin = std::io::stdin();
    if !crate::spawn::stdin_is_terminal() {
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
