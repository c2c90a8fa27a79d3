//! drainit: a PID-1 init for containers. main wires the parts, in order.

// PID 1 must not panic on anything the OS or the user hands it: no unwrap,
// expect or panic outside tests (checked by `cargo clippy` in CI; release
// builds abort on panic, so one would take the container down).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
// The unsafe boundary, enforced: only src/sys/ may hold unsafe code, and
// every unsafe block there says why it is sound.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
// drainit's entry point is the C `main` in sys/start.rs, not std's.
#![cfg_attr(not(test), no_main)]
// The unit tests exercise the parts; the wiring below is only for the binary.
#![cfg_attr(test, allow(dead_code))]

mod backoff;
mod cgroup;
mod config;
mod custody;
mod duration;
mod environment;
mod event_loop;
mod events;
mod exit;
mod files;
mod logging;
#[cfg(test)]
mod man_page;
mod memory;
mod notify;
mod private_dir;
mod procs;
mod readiness;
mod reap;
mod record;
mod retry_after;
mod setup;
mod signals;
mod spawn;
mod state;
mod stop_sequence;
mod supervisor;
#[allow(unsafe_code)]
mod sys;
mod timers;
mod tools;
mod tty;
mod user;

use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

use events::Event;
use exit::Code;
use supervisor::Supervisor;

#[global_allocator]
static ALLOCATOR: sys::Startup = sys::Startup;

/// How long drainit lets waiting log lines out before it exits anyway: the
/// exit code must not wait on a stalled log collector.
const EXIT_FLUSH: Duration = Duration::from_millis(100);

/// Everything, in order; `sys::main`, drainit's entry point, calls it with
/// the command line.
fn run(args: Vec<OsString>) -> ! {
    // `drainit --notify` and `drainit --probe` are tools, not an init: no
    // signal is blocked for them (a signal's default action is the right
    // end for a short-lived tool that never forks), and the init's start-up
    // pays one look at argv[1] for them.
    if let Some(code) = tools::dispatch(&args) {
        sys::exit_now(code);
    }
    // Block signals first: a SIGTERM that reaches PID 1 before it is blocked
    // and read would be discarded by the kernel (init ignores default actions).
    let blocked = signals::block_all();
    let own = procs::own();
    signals::reset_ignored(own.map(|o| o.ignored));
    // Before any other fd is opened: it looks at what fd 2 is.
    logging::init();
    // Our pid as /proc/self/status gave it, saving a getpid.
    let me = own.and_then(|o| o.ns_pid).unwrap_or_else(|| nix::unistd::getpid().as_raw());
    let signals = match blocked.and_then(|()| signals::SignalSource::open(me)) {
        Ok(signals) => signals,
        Err(e) => fail(Code::FAILED, format_args!("error: cannot set up signals: {}", e.desc())),
    };
    logging::reopen();
    let config = match config::parse(args) {
        Ok(config) => config,
        Err(config::Halt::Info(text)) => {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout, "{}", text.trim_end()).and_then(|()| stdout.flush());
            sys::exit_now(0);
        }
        Err(invalid) => fail(Code::CONFIG, invalid),
    };
    logging::init_logger(&config.log_filter);
    for (name, nearest) in &config.unknown_vars {
        log::warn!("event=unknown_variable name={} nearest={nearest}", events::Val(name));
    }
    // From here on the worker may start: a setup error is a line and an
    // exit code, never a panic.
    let mode = reap::register(me);
    Event::Started { mode: mode.name(), grace: config.grace, orchestrator_timeout: config.orchestrator_timeout }.emit();
    let take_tty = tty::hand_over(&signals);
    let parts = match setup::parts(config, signals, setup::Start { me, own, mode, take_tty }) {
        Ok(parts) => parts,
        Err(setup::Refused::Command(why)) => {
            Event::Failed { what: "command", error: why }.emit();
            exit(Code::CONFIG)
        }
        Err(setup::Refused::StateDir(line)) => fail(Code::CONFIG, line),
    };
    let setup::Parts { settings, seed, sweep, mut exec, mut sources } = parts;
    let mut supervisor = Supervisor::new(settings, seed);
    if let Some(predecessor) = sweep {
        supervisor.sweep_first(predecessor);
    }
    let code = event_loop::run(&mut supervisor, &mut exec, &mut sources);
    // drainit exits next: the kernel releases the signalfd, the child's
    // stack and the heap in one go, faster than dropping them one by one.
    std::mem::forget((exec, sources, supervisor));
    exit(code)
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
