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
mod notify;
mod procs;
mod readiness;
mod reap;
mod record;
mod retry_after;
mod signals;
mod spawn;
mod supervisor;
#[allow(unsafe_code)]
mod sys;
mod timers;
mod tools;
mod tty;

use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use config::Config;
use custody::Custody;
use event_loop::{Executor, Sources};
use events::Event;
use exit::Code;
use files::{DrainFile, SafeFile};
use notify::{NotifySocket, Outer, Senders};
use retry_after::{PrivateDir, RetryAfter};
use spawn::{Program, Spawner};
use supervisor::{Settings, Supervisor};

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
    let me = nix::unistd::getpid().as_raw();
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
        log::warn!("event=unknown_variable name={name} nearest={nearest}");
    }
    // From here on the worker may start: a setup error is a line and an
    // exit code, never a panic.
    let mode = reap::setup(me);
    Event::Started { mode: mode.name(), grace: config.grace, orchestrator_timeout: config.orchestrator_timeout }.emit();
    let take_tty = tty::hand_over(&signals);
    let (worker, finish) = match programs(&config) {
        Ok(programs) => programs,
        Err(why) => {
            Event::Failed { what: "command", error: why }.emit();
            exit(Code::CONFIG)
        }
    };
    let notifying = config.watchdog.is_some() || config.ready_timeout.is_some() || config.ready_file.is_some();
    let private = private_dir(RetryAfter::wants_dir() || notifying);
    let retry_after = RetryAfter::new(private.as_ref());
    if let Some(path) = retry_after.path() {
        // The worker finds the path in the environment it inherits.
        sys::set_env(retry_after::VAR, path.as_os_str());
    }
    let (notify, outer) = if notifying { readiness(&config, private.as_ref()) } else { (None, None) };
    let drain_file = config.drain_file.clone().map(DrainFile::new);
    if let Some(file) = &drain_file {
        file.remove_stale();
    }
    let ready_file = config.ready_file.clone().map(|path| SafeFile::new("ready_file", path));
    if let Some(file) = &ready_file {
        file.remove("stale: ");
    }
    // /proc is our namespace's when it numbers us as getpid does: otherwise
    // (`unshare --pid` without `--mount-proc`) pids read there would name
    // other processes, and drainit must not signal them.
    let proc_self = own.map(|o| o.pid).filter(|pid| *pid == me);
    let termination_log = config.termination_log.clone();
    let senders = match mode {
        reap::Role::Pid1 => Senders::Namespace,
        _ => Senders::Descendants { me, proc_is_ours: proc_self.is_some() },
    };
    let watchdog_pid = notify.is_some() && config.watchdog.is_some();
    let mut supervisor =
        Supervisor::new(settings(config, finish.is_some(), notify.is_some(), outer.is_some()), seed(me));
    let mut exec = Executor {
        spawner: Spawner::new(take_tty, watchdog_pid),
        private,
        socket_in_private: notify.is_some(),
        ready_file,
        outer,
        worker_vars: notifying,
        worker,
        finish,
        retry_after,
        drain_file,
        termination_log,
        custody: Custody::new(mode, proc_self.is_some()),
        proc_self,
    };
    let mut sources = Sources { signals, notify, senders, rejected: 0 };
    let code = event_loop::run(&mut supervisor, &mut exec, &mut sources);
    // drainit exits next: the kernel releases the signalfd, the child's
    // stack and the heap in one go, faster than dropping them one by one.
    std::mem::forget((exec, sources, supervisor));
    exit(code)
}

fn programs(config: &Config) -> Result<(Program, Option<Program>), String> {
    let worker = Program::new(&config.command)?;
    let finish = config.finish.as_ref().map(|path| Program::new(std::slice::from_ref(path))).transpose()?;
    Ok((worker, finish))
}

/// drainit's private directory, when something needs it; where none can be
/// made, one warning, and the variables that need it are not set.
fn private_dir(wanted: bool) -> Option<PrivateDir> {
    if !wanted {
        return None;
    }
    PrivateDir::create().map_err(|error| Event::RetryAfterUnavailable { error }.emit()).ok()
}

/// The notify socket the worker is told of, systemd's variables, and the
/// outer socket drainit keeps for itself when it was given one.
fn readiness(config: &Config, private: Option<&PrivateDir>) -> (Option<NotifySocket>, Option<Outer>) {
    let outer = Outer::from_env();
    for var in ["WATCHDOG_USEC", "WATCHDOG_PID"] {
        sys::unset_env(var);
    }
    let Some(dir) = private else { return (None, outer) };
    let path = dir.path().join(retry_after::NOTIFY_NAME);
    let socket = match NotifySocket::bind(&path) {
        Ok(socket) => socket,
        Err(e) => {
            Event::Failed { what: "notify_socket", error: e.desc().to_string() }.emit();
            return (None, outer);
        }
    };
    sys::set_env("NOTIFY_SOCKET", path.as_os_str());
    if let Some(interval) = config.watchdog {
        sys::set_env("WATCHDOG_USEC", interval.as_micros().to_string().as_ref());
        // Its value is the worker's own pid, written in the child.
        sys::set_env("WATCHDOG_PID", sys::WATCHDOG_PID_SLOT.as_ref());
    }
    (Some(socket), outer)
}

/// What the lifecycle needs of the configuration. Without a notify socket
/// (no private directory could be made: warned already) the worker cannot
/// ping nor say it is ready, so neither timer may stop it.
fn settings(config: Config, finish: bool, socket: bool, outer: bool) -> Settings {
    Settings {
        grace: config.grace,
        orchestrator_timeout: config.orchestrator_timeout,
        rewrite: config.rewrite,
        backoff: config.backoff,
        stop_delay: config.stop_delay,
        finish_timeout: finish.then_some(config.finish_timeout),
        remap: config.remap,
        watchdog: config.watchdog.filter(|_| socket),
        ready_timeout: config.ready_timeout.filter(|_| socket),
        watchdog_signal: config.watchdog_signal,
        outer,
    }
}

/// The backoff's jitter differs from one drainit to the next.
fn seed(me: i32) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((me as u64) << 32)
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
