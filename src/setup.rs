//! From the configuration to the parts the loop runs: the programs, the
//! private directory, the notify socket and the worker's environment, the
//! files, who may notify, and what the lifecycle needs. Every decision
//! start-up makes once the configuration is read lives here; main only
//! calls the steps in order.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::Config;
use crate::custody::Custody;
use crate::environment;
use crate::event_loop::{Executor, Sources};
use crate::events::Event;
use crate::exit::Code;
use crate::files::{DrainFile, SafeFile};
use crate::memory;
use crate::notify::{Inbox, NotifySocket, Outer, Senders};
use crate::private_dir::{self, PrivateDir};
use crate::procs::Own;
use crate::reap;
use crate::retry_after::RetryAfter;
use crate::signals::SignalSource;
use crate::spawn::{Program, Spawner};
use crate::state::{self, Predecessor};
use crate::supervisor::Settings;
use crate::user;

/// What the loop runs on.
pub struct Parts {
    pub settings: Settings,
    /// The backoff's jitter differs from one drainit to the next.
    pub seed: u64,
    /// The predecessor died without its exit (`--state-dir`): sweep first.
    pub sweep: Option<Predecessor>,
    pub exec: Executor,
    pub sources: Sources,
}

/// Where drainit runs, as start-up found it.
pub struct Start {
    /// drainit's pid, as getpid says.
    pub me: i32,
    /// What /proc says of drainit itself, if it could be read.
    pub own: Option<Own>,
    pub mode: reap::Role,
    /// The worker gets drainit's terminal.
    pub take_tty: bool,
}

/// Why the worker cannot start: a configuration error, exit 2.
pub enum Refused {
    /// The command or the finish program (`exec_failed`-style event).
    Command(String),
    /// `--state-dir`: the line that says why.
    StateDir(String),
}

/// The parts, or why the command cannot run (a configuration error: exit
/// 2, the worker never started; nothing else was done yet then).
pub fn parts(config: Config, signals: SignalSource, start: Start) -> Result<Parts, Refused> {
    let (worker, finish) = programs(&config).map_err(Refused::Command)?;
    // Before the worker, and before anything it could see: a second
    // drainit on DIR, or a DIR that cannot be kept, is a refusal.
    let (state, verdict) = match config.state_dir.as_deref().map(|dir| state::setup(dir, start.me)).transpose() {
        Ok(opened) => opened.unzip(),
        Err(line) => return Err(Refused::StateDir(line)),
    };
    let notifying = config.watchdog.is_some() || config.ready_timeout.is_some() || config.ready_file.is_some();
    let private = private_dir(RetryAfter::wants_dir() || notifying);
    let retry_after = RetryAfter::new(private.as_ref());
    environment::retry_after_file(retry_after.path());
    let (notify, outer) = if notifying { notify_socket(&config, private.as_ref()) } else { (None, None) };
    let run_as = config.user.clone();
    if let Some(user) = &run_as {
        user::hand_over(user, private.as_ref().map(PrivateDir::path), notify.is_some());
    }
    let drain_file = config.drain_file.clone().map(DrainFile::new);
    if let Some(file) = &drain_file {
        file.remove_stale();
    }
    let ready_file = config.ready_file.clone().map(|path| SafeFile::new("ready_file", path));
    if let Some(file) = &ready_file {
        file.remove("stale: ");
    }
    let Start { me, own, mode, take_tty } = start;
    // /proc is our namespace's when it numbers us as getpid does: otherwise
    // (`unshare --pid` without `--mount-proc`) pids read there would name
    // other processes, and drainit must not signal them.
    let proc_self = own.map(|o| o.pid).filter(|pid| *pid == me);
    let senders = match mode {
        reap::Role::Pid1 => Senders::Namespace,
        _ => Senders::Descendants { me, proc_is_ours: proc_self.is_some() },
    };
    let watchdog_pid = notify.is_some() && config.watchdog.is_some();
    let termination_log = config.termination_log.clone();
    // The counter alone is looked for once the first child has started:
    // the look (some 40-90 µs of procfs and cgroupfs) then runs beside the
    // worker's start instead of before it. `--memory-stop` needs the limit
    // before the worker runs, so it looks now.
    let init = mode == reap::Role::Pid1;
    let (counter, usage) = if config.memory_stop.is_some() { memory::find_for_memory_stop(init) } else { (None, None) };
    let look_later = config.memory_stop.is_none().then_some(init);
    let mut settings = settings(config, finish.is_some(), notify.is_some(), outer.is_some());
    settings.oom_counter = counter.is_some();
    settings.memory_stop = settings.memory_stop.filter(|_| usage.is_some());
    let mut spawner = Spawner::new(take_tty, watchdog_pid);
    spawner.set_user(run_as);
    let exec = Executor {
        spawner,
        private,
        socket_in_private: notify.is_some(),
        ready_file,
        outer,
        notify_vars: notifying,
        worker,
        finish,
        retry_after,
        drain_file,
        termination_log,
        custody: Custody::new(mode, proc_self.is_some()),
        proc_self,
        usage,
        state,
        swept: None,
        attempt_slot: false,
        short_slice: false,
        proc_root: None,
    };
    let mut sources = Sources::new(signals, notify.map(|socket| Inbox::new(socket, senders)), counter);
    if let Some(init) = look_later {
        sources.find_counter_later(init);
    }
    let sweep = match verdict {
        Some(state::Verdict::Unclean(predecessor)) => Some(predecessor),
        _ => None,
    };
    Ok(Parts { settings, seed: seed(me), sweep, exec, sources })
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

/// The notify socket the worker is told of, and the outer socket drainit
/// keeps for itself when it was given one.
fn notify_socket(config: &Config, private: Option<&PrivateDir>) -> (Option<NotifySocket>, Option<Outer>) {
    let outer = Outer::from_env();
    let socket = private.and_then(|dir| {
        let path = dir.path().join(private_dir::NOTIFY_NAME);
        match NotifySocket::bind(&path) {
            Ok(socket) => Some((socket, path)),
            Err(e) => {
                Event::Failed { what: "notify_socket", error: e.desc().to_string() }.emit();
                None
            }
        }
    });
    environment::notify_socket(socket.as_ref().map(|(_, path)| path.as_path()), config.watchdog);
    (socket.map(|(socket, _)| socket), outer)
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
        oom_counter: false,
        oom_exit_code: config.oom_exit_code.map(|c| Code(i32::from(c))),
        memory_stop: config.memory_stop,
        memory_check: config.memory_check,
        stop_sequence: config.stop_sequence,
        watchdog_signal_given: config.watchdog_signal_given,
    }
}

fn seed(me: i32) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((me as u64) << 32)
}
