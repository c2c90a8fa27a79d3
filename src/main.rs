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
mod custody;
mod duration;
mod event_loop;
mod events;
mod exit;
mod files;
mod logging;
#[cfg(test)]
mod man_page;
mod procs;
mod reap;
mod retry_after;
mod signals;
mod spawn;
mod supervisor;
mod sys;
mod tty;

use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

use exit::Code;

#[global_allocator]
static ALLOCATOR: sys::Startup = sys::Startup;

/// How long drainit lets waiting log lines out before it exits anyway: the
/// exit code must not wait on a stalled log collector.
const EXIT_FLUSH: Duration = Duration::from_millis(100);

/// Everything, in order; `sys::main`, drainit's entry point, calls it with
/// the command line.
fn run(args: Vec<OsString>) -> ! {
    // Block signals first: a SIGTERM that reaches PID 1 before it is blocked
    // and read would be discarded by the kernel (init ignores default actions).
    let blocked = signals::block_all();
    let own = procs::own();
    signals::reset_ignored(own.map(|o| o.ignored));
    // Before any other fd is opened: it looks at what fd 2 is.
    logging::init();
    let me = nix::unistd::getpid().as_raw();
    let signals = match blocked.and_then(|()| signals::SignalSource::open(me)) {
        Ok(signals) => signals,
        Err(e) => fail(Code::FAILED, format_args!("error: cannot set up signals: {}", e.desc())),
    };
    logging::reopen();
    let config = match config::parse(args) {
        Ok(config) => config,
        Err(config::Stop::Info(text)) => {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout, "{}", text.trim_end()).and_then(|()| stdout.flush());
            sys::exit_now(0);
        }
        Err(invalid) => fail(Code::CONFIG, invalid),
    };
    logging::init_logger(&config.log_filter);
    exit(event_loop::run(config, signals, me, own))
}

/// One line on stderr, then exit with `code`.
fn fail(code: Code, line: impl Display) -> ! {
    logging::line(format_args!("{line}"));
    exit(code)
}

/// Straight to _exit, once the log lines had their chance: libc's exit()
/// does work (atexit handlers, destructors) drainit has no use for.
fn exit(code: Code) -> ! {
    logging::flush_before_exit(EXIT_FLUSH);
    sys::exit_now(code.0)
}
