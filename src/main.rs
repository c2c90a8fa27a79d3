//! drainit: a PID-1 init for containers. main wires the parts, in order.

// PID 1 must not panic on anything the OS or the user hands it: no unwrap,
// expect or panic outside tests (checked by `cargo clippy` in CI; release
// builds abort on panic, so one would take the container down).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
// drainit's entry point is the C `main` in sys.rs, not std's.
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

use std::ffi::OsString;
use std::io::Write;
use std::process::exit;

/// Everything, in order; `sys::main`, drainit's entry point, calls it with
/// the command line.
fn run(args: Vec<OsString>) -> ! {
    // Block signals first: a SIGTERM that reaches PID 1 before it is blocked
    // and read would be discarded by the kernel (init ignores default actions).
    let signals = match signals::SignalSource::install() {
        Ok(signals) => signals,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drainit: error: cannot set up signals: {}", e.desc());
            exit(event_loop::FAILED);
        }
    };
    let config = match config::parse(args) {
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
    // Straight to _exit: a dynamically linked drainit spent ~17 µs of every
    // container stop in glibc's exit() on work drainit has no use for.
    sys::exit_now(event_loop::run(config, signals));
}
