//! The only `unsafe` in drainit: the few libc calls that nix does not cover
//! in the shape drainit needs, a file per subject. Each wrapper is safe to
//! call and states the invariant that makes its `unsafe` block sound.

mod credentials;
mod descriptors;
mod process;
mod ptrace;
mod signals;
mod start;

pub use credentials::become_user;
pub use descriptors::{dir_entries, kept_fd, own_received, release_controlling_tty, set_controlling_tty, stat_fd};
pub use process::{
    ChildStack, ExecArgs, NUMBER_SLOT, exit_now, fill_number, first_in_line, set_env, short_slice, spawn, unset_env,
    wait_any_nohang,
};
pub use ptrace::{ptrace_detach, ptrace_siginfo};
pub use signals::{
    SIGRTMAX, SIGRTMIN, any_pending, kill, reset_signal_dispositions, set_signal_mask, signal_set, take_signal,
};
pub use start::Startup;
