//! drainit: a PID-1 init for containers. main wires the parts, in order.

// PID 1 must not panic on anything the OS or the user hands it: no unwrap,
// expect or panic outside tests (checked by `cargo clippy` in CI; release
// builds abort on panic, so one would take the container down).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
// drainit's entry point is the C `main` below, not std's.
#![cfg_attr(not(test), no_main)]
// The unit tests exercise the parts; the wiring below is only for the binary.
#![cfg_attr(test, allow(dead_code))]

mod backoff;
mod config;
mod event_loop;
mod events;
mod procs;
mod reap;
mod retry_after;
mod signals;
mod spawn;
mod supervisor;
mod sys;
mod tty;

use std::io::Write;
use std::process::exit;

/// Entered directly from libc, skipping std's runtime start-up: that asks
/// glibc for the main thread's stack bounds (pthread_getattr_np parses
/// /proc/self/maps: a sixth of drainit's start-up instructions) for stack
/// overflow reports, and installs SIGSEGV/SIGBUS/SIGPIPE dispositions that
/// drainit resets anyway. std still finds argv and the environment (glibc
/// hands them to its init hook).
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    run()
}

fn run() -> ! {
    // Block signals first: a SIGTERM that reaches PID 1 before it is blocked
    // and read would be discarded by the kernel (init ignores default actions).
    let signals = match signals::SignalSource::install() {
        Ok(signals) => signals,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drainit: error: cannot set up signals: {}", e.desc());
            exit(event_loop::FAILED);
        }
    };
    let config = match config::parse(std::env::args_os()) {
        Ok(config) => config,
        Err(stop @ config::Stop::Info(_)) => {
            let text = stop.to_string();
            let _ = writeln!(std::io::stdout(), "{}", text.trim_end());
            exit(0);
        }
        Err(stop @ config::Stop::Invalid(_)) => {
            let _ = writeln!(std::io::stderr(), "{stop}");
            exit(2);
        }
    };
    events::init_logger(&config.log_filter);
    exit(event_loop::run(config, signals));
}
