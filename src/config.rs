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
use crate::signals::Rewrite;

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

Exit status: the worker's code; 128+N if it died of signal N (137 when the
deadline killed it) or if stop signal N arrived during a backoff sleep
(both subject to --remap-exit); 2 bad configuration; 126 COMMAND not
executable; 127 COMMAND not found; 125 drainit itself failed.";

const ABOUT: &str = "A PID-1 init for containers: forwards signals to the worker's process group, \
    SIGKILLs what is left when the grace deadline passes (before the orchestrator's own SIGKILL), reaps \
    every zombie, and restarts a worker that asks to back off";

/// An option that takes a value, from a flag or its variable. A table and
/// one loop rather than clap's derive, which expands to a builder chain and
/// a read-back per field: the static binary is 32 KiB smaller.
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

const OPTIONS: [Opt; 13] = [
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
        help: "Exit code by which the worker asks to be restarted later. Repeatable; the variable is a comma \
            list [default: 75]",
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
];

/// drainit's command line: the options, -v/-q, then the worker's command,
/// which takes everything after it (its own flags included).
pub(crate) fn command() -> Command {
    let mut command = Command::new("drainit")
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .after_help(AFTER_HELP)
        .override_usage("drainit [OPTIONS] [--] COMMAND [ARGS...]");
    for opt in &OPTIONS {
        let arg = Arg::new(opt.id)
            .long(opt.long)
            .env(opt.env)
            .value_name(opt.value_name)
            .help(opt.help)
            .value_parser(value_parser!(OsString))
            .allow_hyphen_values(opt.hyphen)
            .action(if opt.list { ArgAction::Append } else { ArgAction::Set })
            .value_delimiter(opt.list.then_some(','));
        command = command.arg(arg);
    }
    command
        .arg(
            Arg::new("verbose")
                .short('v')
                .help(
                    "More logging (-v debug, -vv trace); beats DRAINIT_LOG, an env_logger filter [default: info]. \
                    RUST_LOG is the worker's and is not read",
                )
                .action(ArgAction::Count)
                .conflicts_with("quiet"),
        )
        .arg(
            Arg::new("quiet")
                .short('q')
                .help("Less logging (-q warnings and errors, -qq errors, -qqq nothing)")
                .action(ArgAction::Count),
        )
        .arg(
            Arg::new("command")
                .value_name("COMMAND")
                .help("The worker and its arguments, run with execvp semantics (PATH, no shell)")
                .value_parser(value_parser!(OsString))
                .action(ArgAction::Append)
                .required(true)
                .num_args(1..)
                .trailing_var_arg(true),
        )
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
    pub remap: Remap,
    pub termination_log: Option<PathBuf>,
    pub log_filter: String,
}

/// How parsing ended without a configuration.
#[derive(Debug)]
pub enum Stop {
    /// --help or --version: print this on stdout, exit 0.
    Info(String),
    /// One line for stderr (after `drainit: `); exit 2.
    Invalid(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Info(text) => f.write_str(text),
            Stop::Invalid(line) => write!(f, "error: {line}"),
        }
    }
}

const LOG_VAR: &str = "DRAINIT_LOG";
const TERMINATION_LOG: &str = "/dev/termination-log";
const FINISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The margin drainit keeps before the orchestrator's SIGKILL.
const MARGIN: Duration = Duration::from_secs(1);

/// Parse and validate the command line and the environment.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Config, Stop> {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut command = command();
    // Every option's variable, as clap declares it, and the log filter's.
    let variables = command.get_arguments().filter_map(|a| a.get_env()).chain([std::ffi::OsStr::new(LOG_VAR)]);
    if let Some(var) = variables.into_iter().find(|v| std::env::var_os(v).is_some_and(|x| x.is_empty())) {
        return Err(Stop::Invalid(format!("{} is set but empty; unset it or give it a value", var.to_string_lossy())));
    }
    let matches = command.try_get_matches_from_mut(&args).map_err(|e| clap_error(e, args.first()))?;
    // Name a value by its origin in errors: the flag, or the variable.
    let origin = |id: &str| -> String {
        let arg = command.get_arguments().find(|a| a.get_id() == id);
        let name = match matches.value_source(id) {
            Some(ValueSource::EnvVariable) => arg.and_then(|a| a.get_env()).map(|v| v.to_string_lossy().into_owned()),
            _ => arg.and_then(|a| a.get_long()).map(|l| format!("--{l}")),
        };
        name.unwrap_or_else(|| id.to_string())
    };
    let invalid = |id: &str, text: &str, why: &str| Stop::Invalid(format!("{} '{text}': {why}", origin(id)));
    // Values are read in place, not removed from `matches`: `origin` still
    // asks where each came from. They are OsString so that one that is not
    // UTF-8 is named.
    let text = |value: OsString, id: &str| -> Result<String, Stop> {
        value.into_string().map_err(|bad| invalid(id, &bad.to_string_lossy(), "not valid UTF-8"))
    };
    let one = |id: &str| matches.get_one::<OsString>(id).cloned().map(|v| text(v, id)).transpose();
    let many = |id: &str| -> Result<Vec<String>, Stop> {
        matches.get_many::<OsString>(id).into_iter().flatten().cloned().map(|v| text(v, id)).collect()
    };
    let duration = |id: &str, default: Duration| -> Result<(Duration, String), Stop> {
        match one(id)? {
            None => Ok((default, duration::show(default))),
            Some(text) => duration::parse(&text).map(|d| (d, text.clone())).map_err(|why| invalid(id, &text, &why)),
        }
    };
    let path = |id: &str| match matches.get_one::<OsString>(id) {
        Some(p) if p.is_empty() => Err(invalid(id, "", "must not be empty")),
        other => Ok(other.cloned()),
    };

    let (orchestrator_timeout, timeout_text) = duration("orchestrator_timeout", Duration::from_secs(10))?;
    let Some(latest) = orchestrator_timeout.checked_sub(MARGIN) else {
        let why = "must be at least 1s, drainit needs 1s before the orchestrator's SIGKILL";
        return Err(invalid("orchestrator_timeout", &timeout_text, why));
    };
    let (grace, grace_text) = duration("grace", latest)?;
    if grace > latest {
        let why = format!(
            "must end at least 1s before the orchestrator timeout {}, so at most {}",
            duration::show(orchestrator_timeout),
            duration::show(latest),
        );
        return Err(invalid("grace", &grace_text, &why));
    }
    let (stop_delay, delay_text) = duration("stop_delay", Duration::ZERO)?;
    if !stop_delay.is_zero() && stop_delay >= grace {
        let why = format!("must be shorter than the grace {}, which it is part of", duration::show(grace));
        return Err(invalid("stop_delay", &delay_text, &why));
    }
    let drain_file = path("drain_file")?.map(PathBuf::from);

    let rewrite = Rewrite::parse(many("rewrite")?.iter().map(String::as_str))
        .map_err(|why| Stop::Invalid(format!("{} {why}", origin("rewrite"))))?;

    let defaults = backoff::Policy::default();
    let codes = many("backoff_exit_codes")?;
    let codes = if codes.is_empty() {
        defaults.codes.clone()
    } else {
        codes
            .iter()
            .map(|text| match text.trim().parse::<u8>() {
                Ok(code) if code > 0 => Ok(code),
                _ => Err(invalid("backoff_exit_codes", text, "must be an exit code from 1 to 255")),
            })
            .collect::<Result<Vec<u8>, Stop>>()?
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
    let remap = Remap::parse(many("remap_exit")?.iter().map(String::as_str))
        .map_err(|why| Stop::Invalid(format!("{} {why}", origin("remap_exit"))))?;
    let termination_log = match path("termination_log")? {
        Some(p) if p == "off" => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(PathBuf::from(TERMINATION_LOG)),
    };

    let log = match std::env::var_os(LOG_VAR).map(OsString::into_string) {
        None => None,
        Some(Ok(filter)) => Some(filter),
        Some(Err(bad)) => {
            return Err(Stop::Invalid(format!("{LOG_VAR} '{}': not valid UTF-8", bad.to_string_lossy())));
        }
    };
    let log_filter = log_filter(matches.get_count("verbose"), matches.get_count("quiet"), log)?;
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
        remap,
        termination_log,
        log_filter,
    })
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

/// What `--version` prints. Under the name `docker-init` (Docker's init
/// slot), the one line dockerd parses (`parseInitVersion`): `tini version
/// VERSION - git.ID`, split on " - " and the ID's one ".", so neither part
/// may hold those; `docker info` shows the ID. Under any other name,
/// `drainit VERSION`.
pub fn version_line(argv0: Option<&OsString>) -> String {
    const VERSION: &str = env!("CARGO_PKG_VERSION");
    let name = argv0.map(|a| Path::new(a).file_name().unwrap_or(a.as_os_str()).to_os_string());
    if name.as_deref() != Some(std::ffi::OsStr::new("docker-init")) {
        return format!("drainit {VERSION}");
    }
    let id = format!("drainit-{}", VERSION.replace('.', "_"));
    match option_env!("DRAINIT_GIT_COMMIT").filter(|c| !c.is_empty()) {
        Some(commit) => format!("tini version drainit-{VERSION} - git.{id}-{commit}"),
        None => format!("tini version drainit-{VERSION} - git.{id}"),
    }
}

/// -v/-q beat DRAINIT_LOG, which beats the default `info`.
fn log_filter(verbose: u8, quiet: u8, var: Option<String>) -> Result<String, Stop> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    if verbose > 0 || quiet > 0 {
        let level = (3 + i32::from(verbose) - i32::from(quiet)).clamp(0, 5);
        return Ok(LEVELS[level as usize].to_string());
    }
    let Some(filter) = var else {
        return Ok("info".to_string());
    };
    // env_logger would ignore a bad directive with a warning; refuse it instead.
    for directive in filter.split(',') {
        let level = directive.rsplit_once('=').map_or(directive, |(_, level)| level).trim();
        let known = LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level));
        let module_only = !directive.contains('=')
            && !level.is_empty()
            && level.chars().all(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if !known && !module_only || directive.trim().is_empty() {
            return Err(Stop::Invalid(format!(
                "DRAINIT_LOG '{filter}': '{directive}' is not a level (off, error, warn, info, debug, trace) or module=level"
            )));
        }
    }
    Ok(filter)
}

fn clap_error(err: clap::Error, argv0: Option<&OsString>) -> Stop {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp => Stop::Info(err.render().to_string()),
        ErrorKind::DisplayVersion => Stop::Info(version_line(argv0)),
        _ => {
            // clap's message may span lines up to the first blank one.
            let text = err.render().to_string();
            let lines: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            Stop::Invalid(lines.join(" ").trim_start_matches("error: ").to_string() + " (see drainit --help)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("drainit").chain(list.iter().copied()).map(OsString::from).collect()
    }

    #[test]
    fn log_filters() {
        assert_eq!(log_filter(0, 0, None).ok().as_deref(), Some("info"));
        assert_eq!(log_filter(1, 0, Some("off".into())).ok().as_deref(), Some("debug"));
        assert_eq!(log_filter(0, 2, None).ok().as_deref(), Some("error"));
        assert_eq!(log_filter(0, 9, None).ok().as_deref(), Some("off"));
        assert_eq!(log_filter(0, 0, Some("drainit=debug".into())).ok().as_deref(), Some("drainit=debug"));
        assert!(log_filter(0, 0, Some("drainit=loud".into())).is_err());
        assert!(log_filter(0, 0, Some("info,".into())).is_err());
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
                Err(Stop::Invalid(line)) => assert!(!line.contains('\n') && !line.is_empty(), "{bad:?}: {line}"),
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
                "drain_file" | "termination_log" => "",
                "rewrite" | "remap_exit" => "x",
                "backoff_exit_codes" => "0",
                "finish" => "/nonexistent",
                _ => "abc",
            };
            let flag = format!("--{}", opt.long);
            match parse(args(&[&flag, bad, "true"])) {
                Err(Stop::Invalid(line)) => assert!(line.starts_with(&format!("{flag} '{bad}'")), "{line}"),
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
}
