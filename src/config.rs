//! Configuration: flags and their environment variables, parsed and validated
//! before anything else happens. Any bad value is one line and exit 2, and the
//! worker is never started.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, value_parser};
use nix::errno::Errno;
use nix::unistd::AccessFlags;

use crate::backoff;
use crate::duration;
use crate::exit::Remap;
use crate::signals::{self, Rewrite, Signo};
use crate::stop_sequence::StopSequence;
use crate::user::{self, Credentials};

const AFTER_HELP: &str = "\
DURATION is 500ms, 8s, 1m30s...; a bare number is seconds.
A flag beats its variable; an empty variable is an error.

The worker runs as the leader of a new session, with default signal
dispositions, an empty signal mask, and DRAINIT_ATTEMPT (1, 2, ...) and
DRAINIT_RETRY_AFTER_FILE in its environment. A worker that exits with a
backoff code may first write a DURATION to that file to choose its sleep.

On a stop: the drain file is created, the stop signal waits out the stop
delay, then goes to the worker's group; at the grace deadline whatever is
left is SIGKILLed. Once the worker and its leftovers are gone, the finish
program runs (with DRAINIT_EXIT_CODE, DRAINIT_WORKER_STATUS,
DRAINIT_DEADLINE_REACHED, DRAINIT_STOP_SIGNAL, DRAINIT_ATTEMPT).

With --watchdog, --ready-timeout or --ready-file the worker gets
NOTIFY_SOCKET (systemd's notify protocol): READY=1 makes it ready,
WATCHDOG=1 pings; a missed ping or a late READY=1 stops it with the
watchdog signal.

Exit status: the worker's code; 128+N if it died of signal N (137 when the
deadline killed it) or if stop signal N arrived during a backoff sleep
(both subject to --remap-exit); 2 bad configuration; 126 COMMAND not
executable; 127 COMMAND not found; 125 drainit itself failed.

Two tools in the same binary, for the worker and for health checks:
  drainit --notify VAR=VALUE...  send one message to $NOTIFY_SOCKET (READY=1)
  drainit --probe                exit 0 while the worker is ready, not stopping";

const ABOUT: &str = "A PID-1 init for containers: forwards signals to the worker's process group, \
    SIGKILLs what is left when the grace deadline passes (before the orchestrator's own SIGKILL), reaps \
    every zombie, and restarts a worker that asks to back off";

/// An option that takes a value, from a flag or its variable. A table and
/// one loop rather than clap's derive, which expands to a builder chain and
/// a read-back per field, a sizeable part of the static binary.
struct Opt {
    /// How `parse` asks for the value, and what `origin` falls back to.
    id: &'static str,
    long: &'static str,
    env: &'static str,
    value_name: &'static str,
    /// Repeatable, and the variable is a comma list.
    list: bool,
    /// A value may start with '-': `--grace -1s` is a bad duration, not a
    /// missing value.
    hyphen: bool,
    help: &'static str,
}

const OPTIONS: [Opt; 23] = [
    Opt {
        id: "grace",
        long: "grace",
        env: "DRAINIT_GRACE",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "Time from the first stop signal (TERM, INT, QUIT) until drainit SIGKILLs whatever is left \
            [default: orchestrator timeout minus 1s]",
    },
    Opt {
        id: "orchestrator_timeout",
        long: "orchestrator-timeout",
        env: "DRAINIT_ORCHESTRATOR_TIMEOUT",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "The orchestrator's own SIGTERM-to-SIGKILL window (docker stop 10s, Kubernetes 30s, ECS 30s, \
            Nomad 5s); the grace must end at least 1s before it [default: 10s]",
    },
    Opt {
        id: "stop_delay",
        long: "stop-delay",
        env: "DRAINIT_STOP_DELAY",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "Hold the first stop signal this long before forwarding it, so that load balancers stop sending \
            work first; part of the grace, so it must be shorter [default: 0s]",
    },
    Opt {
        id: "drain_file",
        long: "drain-file",
        env: "DRAINIT_DRAIN_FILE",
        value_name: "PATH",
        list: false,
        hyphen: true,
        help: "A file created the moment a stop is requested (health checks fail on it); a stale one is \
            removed at start",
    },
    Opt {
        id: "rewrite",
        long: "rewrite",
        env: "DRAINIT_REWRITE",
        value_name: "FROM:TO",
        list: true,
        hyphen: false,
        help: "Forward signal FROM as TO (TERM:QUIT); TO 0 drops it. Names with or without SIG, numbers, or \
            RTMIN+N (RTMIN is 34). Repeatable; the variable is a comma list",
    },
    Opt {
        id: "backoff_exit_codes",
        long: "backoff-exit-code",
        env: "DRAINIT_BACKOFF_EXIT_CODES",
        value_name: "CODE",
        list: true,
        hyphen: true,
        help: "Exit code by which the worker asks to be restarted later; `none` turns restarts off. \
            Repeatable; the variable is a comma list [default: 75; none as docker-init or podman-init]",
    },
    Opt {
        id: "backoff_delay",
        long: "backoff-delay",
        env: "DRAINIT_BACKOFF_DELAY",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "Base of the first sleep before a restart; it doubles each time, and each sleep is drawn from \
            [base/2, base] [default: 1s]",
    },
    Opt {
        id: "backoff_max_delay",
        long: "backoff-max-delay",
        env: "DRAINIT_BACKOFF_MAX_DELAY",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "Cap on one backoff sleep (a base above it is capped) [default: 30s]",
    },
    Opt {
        id: "backoff_timeout",
        long: "backoff-timeout",
        env: "DRAINIT_BACKOFF_TIMEOUT",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "How long, from the first backoff exit, drainit keeps restarting; set it above the worker's \
            lease stale threshold. The last sleep is cut to end with it, for one more attempt [default: 2m]",
    },
    Opt {
        id: "finish",
        long: "finish",
        env: "DRAINIT_FINISH",
        value_name: "PATH",
        list: false,
        hyphen: true,
        help: "An executable drainit runs once, after the worker and everything left of it are gone, before \
            it exits: cleanup a SIGKILLed worker never ran",
    },
    Opt {
        id: "finish_timeout",
        long: "finish-timeout",
        env: "DRAINIT_FINISH_TIMEOUT",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "The most the finish program may take when no stop is under way (during a stop: until the \
            grace deadline) [default: 5s]",
    },
    Opt {
        id: "state_dir",
        long: "state-dir",
        env: "DRAINIT_STATE_DIR",
        value_name: "DIR",
        list: false,
        hyphen: true,
        help: "A directory that outlives the container's processes (a volume; a Docker container's own \
            filesystem): drainit keeps its record there and, when its predecessor died without its exit, runs \
            the finish program before the worker",
    },
    Opt {
        id: "remap_exit",
        long: "remap-exit",
        env: "DRAINIT_REMAP_EXIT",
        value_name: "FROM:TO",
        list: true,
        hyphen: true,
        help: "Exit with TO where drainit would exit with FROM after running the worker (143:0); codes 0-255. \
            Repeatable; the variable is a comma list",
    },
    Opt {
        id: "termination_log",
        long: "termination-log",
        env: "DRAINIT_TERMINATION_LOG",
        value_name: "PATH",
        list: false,
        hyphen: true,
        help: "Where to write a one-line summary at exit, when that file exists and is empty (Kubernetes \
            shows it); `off` disables [default: /dev/termination-log]",
    },
    Opt {
        id: "watchdog",
        long: "watchdog",
        env: "DRAINIT_WATCHDOG",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "Once armed (at the start, or at READY=1 with --ready-timeout), the worker must send WATCHDOG=1 \
            at least this often, or it is stopped",
    },
    Opt {
        id: "ready_timeout",
        long: "ready-timeout",
        env: "DRAINIT_READY_TIMEOUT",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "The worker must send READY=1 within this time of its start, or it is stopped",
    },
    Opt {
        id: "ready_file",
        long: "ready-file",
        env: "DRAINIT_READY_FILE",
        value_name: "PATH",
        list: false,
        hyphen: true,
        help: "A file that exists exactly while the worker is ready (readiness probes test it); a stale one \
            is removed at start",
    },
    Opt {
        id: "watchdog_signal",
        long: "watchdog-signal",
        env: "DRAINIT_WATCHDOG_SIGNAL",
        value_name: "SIGNAL",
        list: false,
        hyphen: true,
        help: "The signal that begins the stop when the watchdog or the ready timeout expires (QUIT or ABRT \
            make many runtimes dump their stacks first) [default: SIGTERM]",
    },
    Opt {
        id: "oom_exit_code",
        long: "oom-exit-code",
        env: "DRAINIT_OOM_EXIT_CODE",
        value_name: "CODE",
        list: false,
        hyphen: true,
        help: "Exit with CODE (0-255) where drainit would exit 137 because the kernel's OOM killer killed the \
            worker (before --remap-exit)",
    },
    Opt {
        id: "memory_stop",
        long: "memory-stop",
        env: "DRAINIT_MEMORY_STOP",
        value_name: "PERCENT",
        list: false,
        hyphen: true,
        help: "Stop the worker, as the watchdog does, once the container's working set reaches PERCENT \
            (1-99) of its memory limit",
    },
    Opt {
        id: "memory_check",
        long: "memory-check",
        env: "DRAINIT_MEMORY_CHECK",
        value_name: "DURATION",
        list: false,
        hyphen: true,
        help: "With --memory-stop: how often the working set is read besides every memory event (at least \
            10ms) [default: 1s]",
    },
    Opt {
        id: "user",
        long: "user",
        env: "DRAINIT_USER",
        value_name: "USER[:GROUP]",
        list: false,
        hyphen: true,
        help: "Run the worker and the finish program as USER (a name from the image's /etc/passwd, or a \
            number), with GROUP (name or number) as its group; drainit itself stays root",
    },
    Opt {
        id: "stop_sequence",
        long: "stop-sequence",
        env: "DRAINIT_STOP_SEQUENCE",
        value_name: "LIST",
        list: false,
        hyphen: true,
        help: "What the worker's group gets instead of the stop signal: SIGNAL or SIGNAL@OFFSET, comma \
            separated, offsets from when the stop signal would go out (TSTP,TERM@20s; TERM,INT@10s,QUIT@20s)",
    },
];

/// drainit's command line: the options, -v/-q, then the worker's command,
/// which takes everything after it (its own flags included).
pub(crate) fn command() -> Command {
    command_declaring(&|_| true, true)
}

/// `command()`, with only the variables `declare` names attached to their
/// options. clap reads a variable when it is attached (a search of the
/// whole environment each); parsing attaches only those present, which
/// parses the same and leaves the search to one pass over the environment.
/// Help, which lists every variable, comes from `command()`. Without
/// `texts`, the definition parses the same but has no help texts and value
/// names (clap copies each, on every start): help comes from `command()`,
/// and an error is rendered from a definition with them (`clap_error`).
fn command_declaring(declare: &dyn Fn(&str) -> bool, texts: bool) -> Command {
    let mut command = Command::new("drainit").version(env!("CARGO_PKG_VERSION"));
    if texts {
        command =
            command.about(ABOUT).after_help(AFTER_HELP).override_usage("drainit [OPTIONS] [--] COMMAND [ARGS...]");
    }
    for opt in &OPTIONS {
        let mut arg = Arg::new(opt.id).long(opt.long);
        if declare(opt.env) {
            arg = arg.env(opt.env);
        }
        if texts {
            arg = arg.value_name(opt.value_name).help(opt.help);
        }
        let arg = arg
            .value_parser(value_parser!(OsString))
            .allow_hyphen_values(opt.hyphen)
            .action(if opt.list { ArgAction::Append } else { ArgAction::Set })
            .value_delimiter(opt.list.then_some(','));
        command = command.arg(arg);
    }
    let help = |arg: Arg, text: &'static str| if texts { arg.help(text) } else { arg };
    let verbose = Arg::new("verbose").short('v').action(ArgAction::Count).conflicts_with("quiet");
    let quiet = Arg::new("quiet").short('q').action(ArgAction::Count);
    let mut worker = Arg::new("command")
        .value_parser(value_parser!(OsString))
        .action(ArgAction::Append)
        .required(true)
        .num_args(1..)
        .trailing_var_arg(true);
    if texts {
        worker = worker.value_name("COMMAND");
    }
    command
        .arg(help(
            verbose,
            "More logging (-v debug, -vv trace); beats DRAINIT_LOG, an env_logger filter [default: info]. \
            RUST_LOG is the worker's and is not read",
        ))
        .arg(help(quiet, "Less logging (-q warnings and errors, -qq errors, -qqq nothing)"))
        .arg(help(worker, "The worker and its arguments, run with execvp semantics (PATH, no shell)"))
}

/// Everything drainit runs with.
#[derive(Debug)]
pub struct Config {
    pub command: Vec<OsString>,
    pub grace: Duration,
    pub orchestrator_timeout: Duration,
    pub stop_delay: Duration,
    pub drain_file: Option<PathBuf>,
    pub rewrite: Rewrite,
    pub backoff: backoff::Policy,
    /// The finish program, as it is exec'd.
    pub finish: Option<OsString>,
    pub finish_timeout: Duration,
    /// Where drainit keeps its record (see state.rs).
    pub state_dir: Option<PathBuf>,
    pub remap: Remap,
    pub termination_log: Option<PathBuf>,
    pub log_filter: String,
    pub watchdog: Option<Duration>,
    pub ready_timeout: Option<Duration>,
    pub ready_file: Option<PathBuf>,
    /// Begins the stop when the watchdog or the ready timeout expires.
    pub watchdog_signal: Signo,
    /// `--oom-exit-code`.
    pub oom_exit_code: Option<u8>,
    /// `--memory-stop`: a percent of the limit, 1-99.
    pub memory_stop: Option<u8>,
    pub memory_check: Duration,
    /// `--watchdog-signal` was given (not the default).
    pub watchdog_signal_given: bool,
    /// `--user`, resolved against the image's /etc/passwd and /etc/group.
    pub user: Option<Credentials>,
    pub stop_sequence: Option<StopSequence>,
    /// `DRAINIT_*` variables that are none of drainit's, each with the
    /// nearest real one: (name, nearest), both ready for a logfmt line. To
    /// be warned about once the logger is up.
    pub unknown_vars: Vec<(String, String)>,
}

/// How parsing ended without a configuration.
#[derive(Debug)]
pub enum Halt {
    /// --help or --version: print this on stdout, exit 0.
    Info(String),
    /// One line for stderr (after `drainit: `); exit 2.
    Invalid(String),
}

impl fmt::Display for Halt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Halt::Info(text) => f.write_str(text),
            Halt::Invalid(line) => write!(f, "error: {line}"),
        }
    }
}

const LOG_VAR: &str = "DRAINIT_LOG";
const TERMINATION_LOG: &str = "/dev/termination-log";
const FINISH_TIMEOUT: Duration = Duration::from_secs(5);
const MEMORY_CHECK: Duration = Duration::from_secs(1);
/// A shorter check would make drainit's one periodic wakeup a busy one.
const MEMORY_CHECK_MIN: Duration = Duration::from_millis(10);
const ORCHESTRATOR_TIMEOUT: Duration = Duration::from_secs(10);

/// The margin drainit keeps before the orchestrator's SIGKILL.
const MARGIN: Duration = Duration::from_secs(1);

/// The build's commit, which cargo sets for build.rs's output and `cargo
/// test`: no typo.
const BUILD_COMMIT: &str = "DRAINIT_GIT_COMMIT";

/// The `DRAINIT_*` variables that are not settings: what drainit sets for
/// the worker and the finish program (a drainit started under another one
/// sees them), and the build's commit.
fn set_for_others() -> impl Iterator<Item = &'static str> {
    let own = crate::environment::TABLE.iter().map(|var| var.name).filter(|name| name.starts_with("DRAINIT_"));
    [BUILD_COMMIT].into_iter().chain(own)
}

/// The names under which dockerd and podman run their init: drainit stands
/// in front of images that never heard of it, so it restarts nothing unless
/// asked to (a worker that exits 75 by chance exits 75, as under tini).
const ENGINE_INIT_NAMES: [&str; 2] = ["docker-init", "podman-init"];

/// Parse and validate the command line and the environment.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Config, Halt> {
    parse_all(args.into_iter().collect()).map_err(|stop| match stop {
        Halt::Invalid(line) => Halt::Invalid(bounded(&line)),
        info => info,
    })
}

/// How much of one value a refusal shows.
const VALUE_SHOWN: usize = 256;
/// How long a refusal line gets: far below the log's 64 KiB buffer, so the
/// line that explains exit 2 always gets out.
const LINE_SHOWN: usize = 4096;

/// The refusal line, its values cut: every refusal quotes a value as 'TEXT',
/// and a value may be any length (a 100 KiB variable). Each quoted part is
/// cut to VALUE_SHOWN bytes; a value with quotes of its own may put its
/// text between them, so the parts outside are cut too (at a length no
/// message's own words reach), and the line as a whole at LINE_SHOWN.
fn bounded(line: &str) -> String {
    let mut out = String::with_capacity(line.len().min(LINE_SHOWN + 3));
    for (i, part) in line.split('\'').enumerate() {
        if i > 0 {
            out.push('\'');
        }
        out.push_str(&cut(part, if i % 2 == 1 { VALUE_SHOWN } else { 4 * VALUE_SHOWN }));
    }
    cut(&out, LINE_SHOWN).into_owned()
}

/// `text` up to `max` bytes (at a character's boundary), then `...`.
fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}...", &text[..end]).into()
}

fn parse_all(args: Vec<OsString>) -> Result<Config, Halt> {
    // drainit's own variables, read in one pass (the first of a name, as
    // getenv finds it).
    let mut own: Vec<(OsString, OsString)> = Vec::new();
    for (name, value) in std::env::vars_os() {
        if name.as_bytes().starts_with(b"DRAINIT_") && !own.iter().any(|(n, _)| *n == name) {
            own.push((name, value));
        }
    }
    let own_var = |name: &str| -> Option<&OsString> { own.iter().find(|(n, _)| n == name).map(|(_, v)| v) };
    // Every option's variable, and the log filter's, in the options' order.
    let variables = OPTIONS.iter().map(|o| o.env).chain([LOG_VAR]);
    if let Some(var) = variables.into_iter().find(|v| own_var(v).is_some_and(|x| x.is_empty())) {
        return Err(Halt::Invalid(format!("{var} is set but empty; unset it or give it a value")));
    }
    let declare = |var: &str| own_var(var).is_some();
    let mut command = command_declaring(&declare, false);
    let matches = command.try_get_matches_from_mut(&args).map_err(|e| clap_error(e, &args, &declare))?;
    // Name a value by its origin in errors: the flag, or the variable.
    let origin = |id: &str| -> String {
        let arg = command.get_arguments().find(|a| a.get_id() == id);
        let name = match matches.value_source(id) {
            Some(ValueSource::EnvVariable) => arg.and_then(|a| a.get_env()).map(|v| v.to_string_lossy().into_owned()),
            _ => arg.and_then(|a| a.get_long()).map(|l| format!("--{l}")),
        };
        name.unwrap_or_else(|| id.to_string())
    };
    // Both ways to set an option, for a refusal that says what to change.
    let setting = |id: &str| -> String {
        let opt = OPTIONS.iter().find(|o| o.id == id);
        opt.map_or_else(|| id.to_string(), |o| format!("--{} or {}", o.long, o.env))
    };
    let invalid = |id: &str, text: &str, why: &str| Halt::Invalid(format!("{} '{text}': {why}", origin(id)));
    // Values are read in place, not removed from `matches`: `origin` still
    // asks where each came from. They are OsString so that one that is not
    // UTF-8 is named.
    let text = |value: OsString, id: &str| -> Result<String, Halt> {
        value.into_string().map_err(|bad| invalid(id, &bad.to_string_lossy(), "not valid UTF-8"))
    };
    let one = |id: &str| matches.get_one::<OsString>(id).cloned().map(|v| text(v, id)).transpose();
    let many = |id: &str| -> Result<Vec<String>, Halt> {
        matches.get_many::<OsString>(id).into_iter().flatten().cloned().map(|v| text(v, id)).collect()
    };
    let given = |id: &str| -> Result<Option<(Duration, String)>, Halt> {
        match one(id)? {
            None => Ok(None),
            Some(text) => {
                duration::parse(&text).map(|d| Some((d, text.clone()))).map_err(|why| invalid(id, &text, &why))
            }
        }
    };
    let duration = |id: &str, default: Duration| -> Result<(Duration, String), Halt> {
        Ok(given(id)?.unwrap_or_else(|| (default, duration::show(default))))
    };
    // 1 ms at least: below it the timer could never be met (0 µs told to
    // the worker) or would fire on every turn.
    let at_least_1ms = |id: &str| -> Result<Option<Duration>, Halt> {
        match given(id)? {
            Some((d, text)) if d < Duration::from_millis(1) => Err(invalid(id, &text, "must be at least 1ms")),
            other => Ok(other.map(|(d, _)| d)),
        }
    };
    let path = |id: &str| match matches.get_one::<OsString>(id) {
        Some(p) if p.is_empty() => Err(invalid(id, "", "must not be empty")),
        other => Ok(other.cloned()),
    };

    let (orchestrator_timeout, timeout_text) = duration("orchestrator_timeout", ORCHESTRATOR_TIMEOUT)?;
    let Some(latest) = orchestrator_timeout.checked_sub(MARGIN) else {
        let why = "must be at least 1s, drainit needs 1s before the orchestrator's SIGKILL";
        return Err(invalid("orchestrator_timeout", &timeout_text, why));
    };
    let (grace, grace_text) = duration("grace", latest)?;
    if grace > latest {
        let timeout_from = match matches.value_source("orchestrator_timeout") {
            Some(ValueSource::EnvVariable | ValueSource::CommandLine) => {
                format!("from {}", origin("orchestrator_timeout"))
            }
            _ => "the default, docker stop's".to_string(),
        };
        let why = format!(
            "must end at least 1s before the orchestrator timeout, {} ({timeout_from}): set {} to at most {}, \
            or {} to at least {}",
            duration::show(orchestrator_timeout),
            setting("grace"),
            duration::show(latest),
            setting("orchestrator_timeout"),
            duration::show(grace.saturating_add(MARGIN)),
        );
        return Err(invalid("grace", &grace_text, &why));
    }
    let (stop_delay, delay_text) = duration("stop_delay", Duration::ZERO)?;
    if !stop_delay.is_zero() && stop_delay >= grace {
        let why = format!(
            "must be shorter than the grace, {} ({}), which it is part of",
            duration::show(grace),
            match matches.value_source("grace") {
                Some(ValueSource::EnvVariable | ValueSource::CommandLine) => format!("from {}", origin("grace")),
                _ => "the default: the orchestrator timeout minus 1s".to_string(),
            },
        );
        return Err(invalid("stop_delay", &delay_text, &why));
    }
    let drain_file = path("drain_file")?.map(PathBuf::from);

    let rewrite = Rewrite::parse(many("rewrite")?.iter().map(String::as_str))
        .map_err(|why| Halt::Invalid(format!("{} {why}", origin("rewrite"))))?;

    let defaults = backoff::Policy::default();
    let codes = many("backoff_exit_codes")?;
    let codes = if codes.is_empty() {
        // Under an engine's name only DRAINIT_BACKOFF_EXIT_CODES (or the
        // flag, which beats it) turns restarts on.
        if engine_init(args.first()) { Vec::new() } else { defaults.codes.clone() }
    } else {
        backoff_codes(&codes).map_err(|(text, why)| invalid("backoff_exit_codes", text, why))?
    };
    let (delay, _) = duration("backoff_delay", defaults.delay)?;
    let (max_delay, _) = duration("backoff_max_delay", defaults.max_delay)?;
    let (timeout, _) = duration("backoff_timeout", defaults.timeout)?;
    if delay.is_zero() {
        return Err(invalid("backoff_delay", "0", "must be more than 0, or a failing worker restarts in a tight loop"));
    }
    if max_delay.is_zero() {
        return Err(invalid(
            "backoff_max_delay",
            "0",
            "must be more than 0, or a failing worker restarts in a tight loop",
        ));
    }

    let finish = match path("finish")? {
        Some(p) => Some(executable(&p).map_err(|why| invalid("finish", &p.to_string_lossy(), why))?),
        None => None,
    };
    let (finish_timeout, _) = duration("finish_timeout", FINISH_TIMEOUT)?;
    let state_dir = path("state_dir")?.map(PathBuf::from);
    let remap = Remap::parse(many("remap_exit")?.iter().map(String::as_str))
        .map_err(|why| Halt::Invalid(format!("{} {why}", origin("remap_exit"))))?;
    let termination_log = match path("termination_log")? {
        Some(p) if p == "off" => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(PathBuf::from(TERMINATION_LOG)),
    };

    let watchdog = at_least_1ms("watchdog")?;
    let ready_timeout = at_least_1ms("ready_timeout")?;
    let ready_file = path("ready_file")?.map(PathBuf::from);
    let watchdog_signal_text = one("watchdog_signal")?;
    let watchdog_signal_given = watchdog_signal_text.is_some();
    let watchdog_signal = match watchdog_signal_text {
        None => signals::SIGTERM,
        Some(text) if text.trim() == "0" => {
            return Err(invalid("watchdog_signal", &text, "0 sends nothing; name the signal that begins the stop"));
        }
        Some(text) => {
            signals::parse(&text, false).map_err(|why| Halt::Invalid(format!("{} {why}", origin("watchdog_signal"))))?
        }
    };

    let oom_exit_code = match one("oom_exit_code")? {
        None => None,
        Some(text) => Some(text.trim().parse::<u8>().map_err(|_| {
            invalid(
                "oom_exit_code",
                &text,
                &format!("must be an exit code, 0-255 (set by {})", setting("oom_exit_code")),
            )
        })?),
    };
    let memory_stop = match one("memory_stop")? {
        None => None,
        Some(text) => {
            let number = text.trim().strip_suffix('%').unwrap_or(text.trim()).trim();
            match number.parse::<u8>() {
                Ok(percent @ 1..=99) => Some(percent),
                _ => {
                    let why =
                        format!("must be a percent of the memory limit, 1-99 (set by {})", setting("memory_stop"));
                    return Err(invalid("memory_stop", &text, &why));
                }
            }
        }
    };
    let (memory_check, check_text) = duration("memory_check", MEMORY_CHECK)?;
    if memory_check < MEMORY_CHECK_MIN {
        let why = format!("must be at least 10ms (set by {})", setting("memory_check"));
        return Err(invalid("memory_check", &check_text, &why));
    }
    let user = match one("user")? {
        None => None,
        Some(text) => {
            Some(user::load(&text, nix::unistd::geteuid().as_raw()).map_err(|why| invalid("user", &text, &why))?)
        }
    };
    let stop_sequence = match one("stop_sequence")? {
        None => None,
        Some(text) => {
            let sequence = StopSequence::parse(&text).map_err(|why| invalid("stop_sequence", &text, &why))?;
            let last = stop_delay.saturating_add(sequence.last_offset());
            if last >= grace {
                let why = format!(
                    "its last step goes out {} after the stop (the stop delay, {}, plus its offset, {}), which \
                    must be before the grace deadline, {} ({}): shorten {}, shorten {}, or lengthen {}",
                    duration::show(last),
                    duration::show(stop_delay),
                    duration::show(sequence.last_offset()),
                    duration::show(grace),
                    match matches.value_source("grace") {
                        Some(ValueSource::EnvVariable | ValueSource::CommandLine) =>
                            format!("from {}", origin("grace")),
                        _ => "the default: the orchestrator timeout minus 1s".to_string(),
                    },
                    setting("stop_sequence"),
                    setting("stop_delay"),
                    setting("grace"),
                );
                return Err(invalid("stop_sequence", &text, &why));
            }
            Some(sequence)
        }
    };

    let log = match own_var(LOG_VAR).cloned().map(OsString::into_string) {
        None => None,
        Some(Ok(filter)) => Some(filter),
        Some(Err(bad)) => {
            return Err(Halt::Invalid(format!("{LOG_VAR} '{}': not valid UTF-8", bad.to_string_lossy())));
        }
    };
    let log_filter = log_filter(matches.get_count("verbose"), matches.get_count("quiet"), log)?;

    let known: Vec<&str> = OPTIONS.iter().map(|o| o.env).chain([LOG_VAR]).chain(set_for_others()).collect();
    let unknown_vars = own
        .iter()
        .map(|(name, _)| name)
        .filter_map(|name| {
            let name = shown_name(name.as_bytes());
            let nearest = nearest_variable(&name, &known)?;
            Some((name, nearest.to_string()))
        })
        .collect();

    Ok(Config {
        command: matches.get_many::<OsString>("command").into_iter().flatten().cloned().collect(),
        grace,
        orchestrator_timeout,
        stop_delay,
        drain_file,
        rewrite,
        backoff: backoff::Policy { codes, delay, max_delay, timeout },
        finish,
        finish_timeout,
        state_dir,
        remap,
        termination_log,
        log_filter,
        watchdog,
        ready_timeout,
        ready_file,
        watchdog_signal,
        oom_exit_code,
        memory_stop,
        memory_check,
        watchdog_signal_given,
        user,
        stop_sequence,
        unknown_vars,
    })
}

/// The backoff codes, each 1-255, or `none` alone: no code restarts. On
/// error, the value to show and why.
fn backoff_codes(texts: &[String]) -> Result<Vec<u8>, (&str, &'static str)> {
    let is_none = |t: &String| t.trim().eq_ignore_ascii_case("none");
    if let Some(none) = texts.iter().find(|t| is_none(t)) {
        if texts.len() > 1 {
            return Err((none.as_str(), "turns restarts off, so it cannot go with exit codes"));
        }
        return Ok(Vec::new());
    }
    texts
        .iter()
        .map(|text| match text.trim().parse::<u8>() {
            Ok(code) if code > 0 => Ok(code),
            _ => Err((text.as_str(), "must be an exit code from 1 to 255, or none")),
        })
        .collect()
}

/// For a `DRAINIT_*` variable that is none of `known`: the known one it is
/// most likely a typo of. None when it is one of them.
fn nearest_variable<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    if known.contains(&name) {
        return None;
    }
    // The prefix is common to all: compare what follows it, in either case.
    let tail = |v: &str| v.get("DRAINIT_".len()..).unwrap_or("").to_ascii_uppercase();
    let wanted = tail(name);
    let score = |v: &&str| strsim::jaro_winkler(&wanted, &tail(v));
    known.iter().copied().max_by(|a, b| score(a).total_cmp(&score(b)))
}

/// A variable's name for a log line: cut to VALUE_SHOWN bytes, and each
/// byte that is not a letter, digit or `_` shown as `?`, so that it needs no
/// logfmt quoting (names are that in practice; the few others still warn).
fn shown_name(name: &[u8]) -> String {
    let mut shown: String = name
        .iter()
        .take(VALUE_SHOWN)
        .map(|&b| if b.is_ascii_alphanumeric() || b == b'_' { char::from(b) } else { '?' })
        .collect();
    if name.len() > VALUE_SHOWN {
        shown.push_str("...");
    }
    shown
}

/// The finish program must be there now, not fail at 3 a.m. after the
/// worker died: an executable regular file (a link to one is fine). The
/// path is exec'd as given; one without a slash means the file here.
fn executable(path: &OsString) -> Result<OsString, &'static str> {
    match std::fs::metadata(path) {
        Err(e) => return Err(e.raw_os_error().map_or("cannot be read", |n| Errno::from_raw(n).desc())),
        Ok(m) if !m.is_file() => return Err("not a regular file"),
        Ok(_) => {}
    }
    if nix::unistd::access(path.as_os_str(), AccessFlags::X_OK).is_err() {
        return Err("not executable");
    }
    if path.as_bytes().contains(&b'/') {
        return Ok(path.clone());
    }
    let mut here = OsString::from("./");
    here.push(path);
    Ok(here)
}

/// argv[0]'s file name (of a copy or a link), `drainit` when there is none.
fn invoked_as(argv0: Option<&OsString>) -> &std::ffi::OsStr {
    argv0.map_or(std::ffi::OsStr::new("drainit"), |a| Path::new(a).file_name().unwrap_or(a.as_os_str()))
}

/// Whether drainit runs in an engine's init slot (ENGINE_INIT_NAMES).
fn engine_init(argv0: Option<&OsString>) -> bool {
    let name = invoked_as(argv0);
    ENGINE_INIT_NAMES.iter().any(|n| name == *n)
}

/// What `--version` prints. Under the name `docker-init` (Docker's init
/// slot), the one line dockerd parses (`parseInitVersion`): `tini version
/// VERSION - git.ID`, split on " - " and the ID's one ".", so neither part
/// may hold those; `docker info` shows the ID. Under any other name,
/// `drainit VERSION`.
pub fn version_line(argv0: Option<&OsString>) -> String {
    const VERSION: &str = env!("CARGO_PKG_VERSION");
    if invoked_as(argv0) != "docker-init" {
        return format!("drainit {VERSION}");
    }
    let id = format!("drainit-{}", VERSION.replace('.', "_"));
    match option_env!("DRAINIT_GIT_COMMIT").filter(|c| !c.is_empty()) {
        Some(commit) => format!("tini version drainit-{VERSION} - git.{id}-{commit}"),
        None => format!("tini version drainit-{VERSION} - git.{id}"),
    }
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// -v/-q beat DRAINIT_LOG, which beats the default `info`.
fn log_filter(verbose: u8, quiet: u8, var: Option<String>) -> Result<String, Halt> {
    if verbose > 0 || quiet > 0 {
        let level = (3 + i32::from(verbose) - i32::from(quiet)).clamp(0, 5);
        return Ok(LEVELS[level as usize].to_string());
    }
    let Some(filter) = var else {
        return Ok("info".to_string());
    };
    // env_logger takes a word that is not a level for a module name
    // (`warning`) and then logs nothing at all, the deadline's warning
    // included: only levels, for everything or for drainit's own modules.
    // What env_logger gets is rebuilt from what was checked.
    let mut directives = Vec::new();
    for directive in filter.split(',') {
        let (module, level) = match directive.split_once('=') {
            Some((module, level)) => (Some(module.trim()), level.trim()),
            None => (None, directive.trim()),
        };
        let known = LEVELS.iter().find(|l| l.eq_ignore_ascii_case(level));
        match (known, module) {
            (Some(level), None) => directives.push(level.to_string()),
            (Some(level), Some(module)) if drainit_module(module) => directives.push(format!("{module}={level}")),
            _ => {
                let near = LEVELS.iter().find(|l| strsim::jaro_winkler(&level.to_ascii_lowercase(), l) > 0.8);
                return Err(Halt::Invalid(format!(
                    "{LOG_VAR} '{filter}': '{directive}' is not a level ({}) or drainit=LEVEL{}",
                    LEVELS.join(", "),
                    near.map_or(String::new(), |l| format!("; did you mean {l}?")),
                )));
            }
        }
    }
    Ok(directives.join(","))
}

/// `drainit` or one of its modules (`drainit::supervisor`): the targets of
/// drainit's own log records.
fn drainit_module(module: &str) -> bool {
    let mut parts = module.split("::");
    parts.next() == Some("drainit")
        && parts.all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

fn clap_error(err: clap::Error, args: &[OsString], declare: &dyn Fn(&str) -> bool) -> Halt {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let argv0 = args.first();
    match err.kind() {
        // From the whole definition, which lists every variable (parsing
        // attached only those set); -h and --help print the same.
        ErrorKind::DisplayHelp => Halt::Info(command().render_help().to_string()),
        ErrorKind::DisplayVersion => Halt::Info(version_line(argv0)),
        _ => {
            // The same error, from the definition with value names (the
            // parse ran without them): `--grace <DURATION>`, not `<grace>`.
            // An unknown flag's message names no value, and its nearest
            // flag is worked out once (a 100 KiB typo takes a while).
            let err = match err.kind() {
                ErrorKind::UnknownArgument => err,
                _ => command_declaring(declare, true).try_get_matches_from(args).err().unwrap_or(err),
            };
            // clap's message may span lines up to the first blank one.
            let text = err.render().to_string();
            let lines: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let mut line = lines.join(" ").trim_start_matches("error: ").to_string();
            // The nearest real flag to a mistyped one, which clap renders
            // as a tip below the blank line.
            if let Some(ContextValue::String(flag)) = err.get(ContextKind::SuggestedArg) {
                line = format!("{line}; did you mean '{flag}'?");
            }
            Halt::Invalid(line + " (see drainit --help)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("drainit").chain(list.iter().copied()).map(OsString::from).collect()
    }

    use log::LevelFilter;

    #[test]
    fn log_filters() {
        assert_eq!(log_filter(0, 0, None).ok().as_deref(), Some("info"));
        assert_eq!(log_filter(1, 0, Some("off".into())).ok().as_deref(), Some("debug"));
        assert_eq!(log_filter(0, 2, None).ok().as_deref(), Some("error"));
        assert_eq!(log_filter(0, 9, None).ok().as_deref(), Some("off"));
        for (var, want) in [
            ("drainit=debug", "drainit=debug"),
            ("WARN", "warn"),
            (" info , drainit::supervisor = TRACE", "info,drainit::supervisor=trace"),
            ("off,drainit=error", "off,drainit=error"),
        ] {
            assert_eq!(log_filter(0, 0, Some(var.into())).ok().as_deref(), Some(want), "{var}");
        }
        // Defect 6: env_logger takes any other word for a module name and
        // then logs nothing, the deadline's warning included.
        for bad in [
            "drainit=loud",
            "info,",
            "warning",
            "wran",
            "verbose",
            "drainit",
            "DRAINIT=debug",
            "other=info",
            "drainit::=info",
            "info/regex",
            "=info",
        ] {
            match log_filter(0, 0, Some(bad.into())) {
                Err(Halt::Invalid(line)) => {
                    assert!(line.contains("off, error, warn, info, debug, trace"), "{bad}: {line}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Found by fuzzing, in the property's model: as env_logger reads a
        // list, a later directive for the same module replaces an earlier one.
        let logger = env_logger::Builder::new().parse_filters("warn,off").build();
        assert_eq!(logger.filter(), LevelFilter::Off);
        let Err(Halt::Invalid(line)) = log_filter(0, 0, Some("warning".into())) else { panic!() };
        assert!(line.ends_with("did you mean warn?"), "{line}");
    }

    #[test]
    fn backoff_code_lists() {
        let list = |l: &[&str]| {
            let texts: Vec<String> = l.iter().map(|s| s.to_string()).collect();
            backoff_codes(&texts).map_err(|(text, _)| text.to_string())
        };
        assert_eq!(list(&["75", " 3 "]), Ok(vec![75, 3]));
        assert_eq!(list(&["none"]), Ok(vec![]));
        assert_eq!(list(&[" NONE "]), Ok(vec![]));
        assert_eq!(list(&["75", "none"]), Err("none".to_string()));
        assert_eq!(list(&["0"]), Err("0".to_string()));
        assert!(list(&["nothing"]).is_err());
    }

    #[test]
    fn none_turns_restarts_off() {
        let c = parse(args(&["--backoff-exit-code", "none", "true"])).unwrap();
        assert!(c.backoff.codes.is_empty());
        assert!(!c.backoff.wants_restart(crate::exit::Code(75)));
        for bad in [
            &["--backoff-exit-code", "none", "--backoff-exit-code", "75", "true"][..],
            &["--backoff-exit-code", "75,none", "true"],
        ] {
            let Err(Halt::Invalid(line)) = parse(args(bad)) else { panic!("{bad:?}") };
            assert!(line.starts_with("--backoff-exit-code 'none'"), "{line}");
        }
    }

    #[test]
    fn engine_init_names_restart_nothing_by_default() {
        let named = |argv0: &str, rest: &[&str]| {
            let all = std::iter::once(argv0).chain(rest.iter().copied()).map(OsString::from);
            parse(all).unwrap().backoff.codes
        };
        for argv0 in ["docker-init", "/sbin/docker-init", "/run/podman-init", "podman-init"] {
            assert_eq!(named(argv0, &["--", "true"]), Vec::<u8>::new(), "{argv0}");
            assert_eq!(named(argv0, &["--backoff-exit-code", "75", "--", "true"]), vec![75], "{argv0}");
        }
        for argv0 in ["drainit", "/sbin/docker-init-old", "tini", "/docker-init/drainit"] {
            assert_eq!(named(argv0, &["--", "true"]), vec![75], "{argv0}");
        }
    }

    #[test]
    fn memory_options() {
        let c = parse(args(&["true"])).unwrap();
        assert_eq!((c.oom_exit_code, c.memory_stop, c.memory_check), (None, None, Duration::from_secs(1)));
        let c =
            parse(args(&["--oom-exit-code", "3", "--memory-stop", "90%", "--memory-check", "10ms", "true"])).unwrap();
        assert_eq!((c.oom_exit_code, c.memory_stop, c.memory_check), (Some(3), Some(90), Duration::from_millis(10)));
        for (bad, flag, var) in [
            (&["--memory-stop", "0", "true"][..], "--memory-stop", "DRAINIT_MEMORY_STOP"),
            (&["--memory-stop", "100", "true"], "--memory-stop", "DRAINIT_MEMORY_STOP"),
            (&["--memory-stop", "abc", "true"], "--memory-stop", "DRAINIT_MEMORY_STOP"),
            (&["--memory-check", "9ms", "--memory-stop", "50", "true"], "--memory-check", "DRAINIT_MEMORY_CHECK"),
            (&["--oom-exit-code", "256", "true"], "--oom-exit-code", "DRAINIT_OOM_EXIT_CODE"),
        ] {
            let Err(Halt::Invalid(line)) = parse(args(bad)) else { panic!("{bad:?} accepted") };
            assert!(line.contains(flag) && line.contains(var) && !line.contains('\n'), "{bad:?}: {line}");
        }
    }

    #[test]
    fn watchdog_options() {
        let c = parse(args(&["true"])).unwrap();
        assert_eq!((c.watchdog, c.ready_timeout, c.ready_file), (None, None, None));
        assert_eq!(c.watchdog_signal, libc::SIGTERM);
        let c = parse(args(&[
            "--watchdog",
            "2s",
            "--ready-timeout",
            "500ms",
            "--ready-file",
            "/run/ready",
            "--watchdog-signal",
            "quit",
            "true",
        ]))
        .unwrap();
        assert_eq!(c.watchdog, Some(Duration::from_secs(2)));
        assert_eq!(c.ready_timeout, Some(Duration::from_millis(500)));
        assert_eq!(c.ready_file, Some(PathBuf::from("/run/ready")));
        assert_eq!(c.watchdog_signal, libc::SIGQUIT);
        for (sig, want) in [("6", libc::SIGABRT), ("SIGABRT", libc::SIGABRT), ("RTMIN+1", 35)] {
            assert_eq!(parse(args(&["--watchdog-signal", sig, "true"])).unwrap().watchdog_signal, want);
        }
        for bad in [
            &["--watchdog", "0", "true"][..],
            &["--watchdog", "0s", "true"],
            &["--ready-timeout", "0ms", "true"],
            &["--ready-timeout", "-1s", "true"],
            &["--watchdog", "1ns", "true"],
            &["--watchdog", "999us", "true"],
            &["--ready-timeout", "999999ns", "true"],
            &["--watchdog-signal", "0", "true"],
            &["--watchdog-signal", "SIGNOPE", "true"],
            &["--watchdog-signal", "65", "true"],
            &["--ready-file", "", "true"],
        ] {
            match parse(args(bad)) {
                Err(Halt::Invalid(line)) => assert!(line.starts_with(&format!("{} '", bad[0])), "{bad:?}: {line}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_mistyped_flag_is_answered_with_the_nearest() {
        for (typo, near) in [
            ("--grase", "'--grace'"),
            ("--backoff-exit-codes", "'--backoff-exit-code'"),
            ("--watchdog-sig", "'--watchdog-signal'"),
        ] {
            let Err(Halt::Invalid(line)) = parse(args(&[typo, "1", "true"])) else { panic!("{typo}") };
            assert!(line.contains(&format!("did you mean {near}?")) && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn a_grace_too_long_names_both_settings_and_the_timeout_s_origin() {
        let refusal = |a: &[&str]| match parse(args(a)) {
            Err(Halt::Invalid(line)) => line,
            other => panic!("{a:?}: {other:?}"),
        };
        let line = refusal(&["--grace", "10s", "true"]);
        for needle in [
            "--grace '10s'",
            "10s (the default, docker stop's)",
            "--grace or DRAINIT_GRACE to at most 9s",
            "--orchestrator-timeout or DRAINIT_ORCHESTRATOR_TIMEOUT to at least 11s",
        ] {
            assert!(line.contains(needle), "{needle}: {line}");
        }
        assert_eq!(bounded(&line), line, "its own words are never cut");
        let line = refusal(&["--grace", "1m", "--orchestrator-timeout", "30s", "true"]);
        assert!(line.contains("30s (from --orchestrator-timeout)") && line.contains("at most 29s"), "{line}");
        assert!(line.contains("at least 1m1s") || line.contains("at least 61s"), "{line}");
    }

    #[test]
    fn refusals_cut_what_they_show() {
        let huge = "x".repeat(100 * 1024);
        for bad in [
            vec!["--grace", &huge, "true"],
            vec!["--rewrite", &huge, "true"],
            vec!["--remap-exit", &huge, "true"],
            vec!["--watchdog-signal", &huge, "true"],
            vec!["--finish", &huge, "true"],
        ] {
            let Err(Halt::Invalid(line)) = parse(args(&bad)) else { panic!("{}", bad[0]) };
            assert!(line.len() < 1024 && line.starts_with(bad[0]) && line.contains("x..."), "{line}");
        }
        let flag = format!("--{huge}");
        let Err(Halt::Invalid(line)) = parse(args(&[&flag, "true"])) else { panic!() };
        assert!(line.len() < 1024 && line.ends_with("(see drainit --help)"), "{line}");
        // A value with quotes of its own still cannot make the line long.
        let quoted = format!("'{}'{}", "y".repeat(70_000), "'".repeat(70_000));
        assert!(bounded(&format!("--grace '{quoted}': not a duration")).len() <= LINE_SHOWN + 3);
        // Characters are never split.
        let wide = "é".repeat(1000);
        assert!(bounded(&format!("v '{wide}'")).ends_with("é...'"));
        assert_eq!(bounded("--grace 'abc': not a duration"), "--grace 'abc': not a duration");
    }

    #[test]
    fn an_unknown_variable_is_matched_to_the_nearest() {
        let known: Vec<&str> = OPTIONS.iter().map(|o| o.env).chain([LOG_VAR]).chain(set_for_others()).collect();
        for (typo, want) in [
            ("DRAINIT_GRACE_PERIOD", "DRAINIT_GRACE"),
            ("DRAINIT_BACKOFF_EXIT_CODE", "DRAINIT_BACKOFF_EXIT_CODES"),
            ("DRAINIT_LOG_LEVEL", "DRAINIT_LOG"),
            ("DRAINIT_grace", "DRAINIT_GRACE"),
            ("DRAINIT_WATCHDOG_SEC", "DRAINIT_WATCHDOG"),
            ("DRAINIT_READYFILE", "DRAINIT_READY_FILE"),
            ("DRAINIT_ORCHESTRATOR_TIMEOUTS", "DRAINIT_ORCHESTRATOR_TIMEOUT"),
            ("DRAINIT_REMAP_EXITS", "DRAINIT_REMAP_EXIT"),
        ] {
            assert_eq!(nearest_variable(typo, &known), Some(want), "{typo}");
        }
        for name in known.iter().copied() {
            assert_eq!(nearest_variable(name, &known), None, "{name}");
        }
        assert!(nearest_variable("DRAINIT_", &known).is_some());
        assert_eq!(shown_name(b"DRAINIT_X_1"), "DRAINIT_X_1");
        assert_eq!(shown_name("DRAINIT_A B\"=é".as_bytes()), "DRAINIT_A?B????");
        assert_eq!(shown_name(&[b'D'; 300]).len(), VALUE_SHOWN + 3);
    }

    // Only flag paths here: the environment is process-wide and tests run in
    // parallel. tests/config.rs covers the variables with real processes.
    #[test]
    fn grace_defaults_to_timeout_minus_one_second() {
        let c = parse(args(&["--orchestrator-timeout", "30s", "--", "true"])).unwrap();
        assert_eq!(c.grace, Duration::from_secs(29));
        assert_eq!(c.command, vec![OsString::from("true")]);
    }

    #[test]
    fn rejects_bad_values_with_one_line() {
        for bad in [
            &["--grace", "abc", "true"][..],
            &["--grace", "-1s", "true"],
            &["--grace=10s", "true"],
            &["--orchestrator-timeout", "500ms", "true"],
            &["--rewrite", "TERM:NOPE", "true"],
            &["--backoff-exit-code", "0", "true"],
            &["--backoff-exit-code", "256", "true"],
            &["--stop-delay", "9s", "true"],
            &["--remap-exit", "143", "true"],
            &["--finish", "/nonexistent", "true"],
            &["--bogus", "true"],
            &[],
        ] {
            match parse(args(bad)) {
                Err(Halt::Invalid(line)) => assert!(!line.contains('\n') && !line.is_empty(), "{bad:?}: {line}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    // In a release build clap answers an id it does not know with no value,
    // so a typo between OPTIONS and `parse` would drop the option silently.
    #[test]
    fn every_option_is_read_and_named_by_its_flag() {
        for opt in &OPTIONS {
            let bad = match opt.id {
                "drain_file" | "termination_log" | "ready_file" | "state_dir" => "",
                "rewrite" | "remap_exit" => "x",
                "backoff_exit_codes" => "0",
                "finish" => "/nonexistent",
                _ => "abc",
            };
            let flag = format!("--{}", opt.long);
            match parse(args(&[&flag, bad, "true"])) {
                Err(Halt::Invalid(line)) => assert!(line.starts_with(&format!("{flag} '{bad}'")), "{line}"),
                other => panic!("{flag} {bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn new_options_and_their_defaults() {
        let c = parse(args(&["true"])).unwrap();
        assert_eq!((c.stop_delay, c.drain_file, c.finish), (Duration::ZERO, None, None));
        assert_eq!(c.finish_timeout, Duration::from_secs(5));
        assert_eq!(c.termination_log, Some(PathBuf::from("/dev/termination-log")));
        let c = parse(args(&[
            "--stop-delay",
            "5s",
            "--drain-file",
            "/run/draining",
            "--finish",
            "/bin/true",
            "--finish-timeout",
            "1s",
            "--remap-exit",
            "143:0",
            "--termination-log",
            "off",
            "true",
        ]))
        .unwrap();
        assert_eq!(c.stop_delay, Duration::from_secs(5), "grace 9s leaves the worker 4s");
        assert_eq!(c.drain_file, Some(PathBuf::from("/run/draining")));
        assert_eq!(c.finish, Some(OsString::from("/bin/true")));
        assert_eq!(c.termination_log, None);
        assert_eq!(c.remap.apply(crate::exit::Code(143)), Some(crate::exit::Code(0)));
    }

    #[test]
    fn a_backoff_base_above_the_cap_is_capped_not_refused() {
        let c = parse(args(&["--backoff-delay", "3s", "--backoff-max-delay", "200ms", "true"])).unwrap();
        assert_eq!((c.backoff.delay, c.backoff.max_delay), (Duration::from_secs(3), Duration::from_millis(200)));
        assert!(parse(args(&["--backoff-max-delay", "500ms", "true"])).is_ok());
    }

    #[test]
    fn a_finish_program_without_a_slash_is_the_file_here() {
        let here = std::env::current_dir().unwrap();
        let name = format!("drainit-finish-test-{}", std::process::id());
        let path = here.join(&name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let c = parse(args(&["--finish", &name, "true"]));
        let _ = std::fs::remove_file(&path);
        assert_eq!(c.unwrap().finish, Some(OsString::from(format!("./{name}"))));
    }

    #[test]
    fn the_version_line_depends_on_the_name() {
        let line = version_line(Some(&OsString::from("/usr/local/libexec/docker/docker-init")));
        // dockerd's parseInitVersion: split on " - ", then the ID on ".".
        let (version, git) = line.split_once(" - ").unwrap();
        assert_eq!(version, format!("tini version drainit-{}", env!("CARGO_PKG_VERSION")));
        let id = git.strip_prefix("git.").unwrap();
        assert!(!id.contains('.') && !id.contains(" - ") && id.starts_with("drainit-"), "{id}");
        assert_eq!(line.matches(" - ").count(), 1);
        assert_eq!(version_line(Some(&OsString::from("drainit"))), format!("drainit {}", env!("CARGO_PKG_VERSION")));
        assert_eq!(version_line(Some(&OsString::from("/sbin/docker-init-old"))).split(' ').next(), Some("drainit"));
        assert_eq!(version_line(None).split(' ').next(), Some("drainit"));
    }

    #[test]
    fn command_keeps_its_own_flags() {
        let c = parse(args(&["-q", "sh", "-c", "exit 3", "--grace", "x"])).unwrap();
        assert_eq!(c.command, args(&["sh", "-c", "exit 3", "--grace", "x"])[1..].to_vec());
        assert_eq!(c.log_filter, "warn");
    }

    #[test]
    fn help_lists_every_variable_though_parsing_attaches_only_those_set() {
        for help in ["-h", "--help"] {
            let Err(Halt::Info(text)) = parse(args(&["--grace", "5s", help])) else { panic!("{help}: no help") };
            for opt in &OPTIONS {
                assert!(text.contains(&format!("[env: {}=", opt.env)), "{help}: {} missing", opt.env);
            }
        }
        let parsing = command_declaring(&|var| var == "DRAINIT_GRACE", false);
        let attached: Vec<_> = parsing.get_arguments().filter_map(|a| a.get_env()).collect();
        assert_eq!(attached, ["DRAINIT_GRACE"]);
    }

    #[test]
    fn repeatable_flags() {
        let c = parse(args(&[
            "--rewrite",
            "TERM:QUIT",
            "--rewrite",
            "USR1:0,HUP:INT",
            "--backoff-exit-code",
            "3",
            "--backoff-exit-code",
            "75",
            "x",
        ]))
        .unwrap();
        assert_eq!(c.rewrite.apply(libc::SIGHUP), Some(libc::SIGINT));
        assert_eq!(c.rewrite.apply(libc::SIGUSR1), None);
        assert_eq!(c.backoff.codes, vec![3, 75]);
    }

    // Fuzzing (issue 26): see scripts/fuzz.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        fn directive() -> impl Strategy<Value = String> {
            let level = prop_oneof![prop::sample::select(LEVELS.to_vec()).prop_map(String::from), "[a-zA-Z]{0,8}"];
            let module = prop_oneof![Just(None), "(drainit|drainit::[a-z_]{1,8}|[a-z:]{0,10})".prop_map(Some)];
            (module, level, " {0,1}").prop_map(|(m, l, pad)| match m {
                Some(m) => format!("{pad}{m}{pad}={pad}{l}"),
                None => format!("{pad}{l}{pad}"),
            })
        }

        proptest! {
            #[test]
            fn fuzz_backoff_codes(texts in prop::collection::vec(prop_oneof![any::<String>(), "[ ]?(none|NONE|-?[0-9]{1,4})[ ]?"], 1..5)) {
                if let Ok(codes) = backoff_codes(&texts) {
                    prop_assert!(codes.iter().all(|c| *c > 0), "{texts:?}");
                    prop_assert_eq!(codes.is_empty(), texts.len() == 1 && texts[0].trim().eq_ignore_ascii_case("none"));
                }
            }

            /// Defect 6: env_logger must read every accepted directive as a
            /// level, none as a module name (which makes its most verbose
            /// level trace and logs nothing of drainit's).
            #[test]
            fn fuzz_an_accepted_log_filter_is_levels_only(
                filter in prop_oneof![any::<String>(), prop::collection::vec(directive(), 1..4).prop_map(|d| d.join(","))],
            ) {
                let Ok(accepted) = log_filter(0, 0, Some(filter.clone())) else { return Ok(()) };
                // As env_logger reads it: for each module (or none), the
                // last directive wins.
                let mut last: Vec<(Option<&str>, usize)> = Vec::new();
                for d in accepted.split(',') {
                    let (module, level) = d.split_once('=').map_or((None, d), |(m, l)| (Some(m), l));
                    let level = LEVELS.iter().position(|k| *k == level).unwrap();
                    last.retain(|(m, _)| *m != module);
                    last.push((module, level));
                }
                let most = LEVELS[last.iter().map(|(_, l)| *l).max().unwrap()];
                let logger = env_logger::Builder::new().parse_filters(&accepted).build();
                prop_assert_eq!(logger.filter().to_string().to_ascii_lowercase(), most, "{:?} -> {:?}", filter, accepted);
            }

            #[test]
            fn fuzz_bounded_keeps_lines_short(parts in prop::collection::vec(prop_oneof!["[^']{0,600}", Just("'".to_string())], 0..40)) {
                let line = parts.concat();
                let out = bounded(&line);
                prop_assert!(out.len() <= LINE_SHOWN + 3);
                if line.len() <= VALUE_SHOWN {
                    prop_assert_eq!(out, line);
                }
            }
        }
    }
}
