//! Configuration: flags and their environment variables, parsed and validated
//! before anything else happens. Any bad value is one line and exit 2, and the
//! worker is never started.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use crate::backoff;
use crate::signals::Rewrite;

const AFTER_HELP: &str = "\
DURATION is 500ms, 8s, 1m30s...; a bare number is seconds.
A flag beats its variable; an empty variable is an error.

The worker runs as the leader of a new session, with default signal
dispositions, an empty signal mask, and DRAINIT_ATTEMPT (1, 2, ...) and
DRAINIT_RETRY_AFTER_FILE in its environment. A worker that exits with a
backoff code may first write a DURATION to that file to choose its sleep.

Exit status: the worker's code; 128+N if it died of signal N (137 when the
deadline killed it) or if stop signal N arrived during a backoff sleep;
2 bad configuration; 126 COMMAND not executable; 127 COMMAND not found;
125 drainit itself failed.";

/// A PID-1 init for containers: forwards signals to the worker's process
/// group, SIGKILLs what is left when the grace deadline passes (before the
/// orchestrator's own SIGKILL), reaps every zombie, and restarts a worker that
/// asks to back off.
#[derive(Parser, Debug)]
#[command(name = "drainit", version, after_help = AFTER_HELP, override_usage = "drainit [OPTIONS] [--] COMMAND [ARGS...]")]
struct Cli {
    /// Time from the first stop signal (TERM, INT, QUIT) until drainit
    /// SIGKILLs whatever is left [default: orchestrator timeout minus 1s]
    #[arg(long, env = "DRAINIT_GRACE", value_name = "DURATION", allow_hyphen_values = true)]
    grace: Option<OsString>,

    /// The orchestrator's own SIGTERM-to-SIGKILL window (docker stop 10s,
    /// Kubernetes 30s, ECS 30s, Nomad 5s); the grace must end at least 1s
    /// before it [default: 10s]
    #[arg(long, env = "DRAINIT_ORCHESTRATOR_TIMEOUT", value_name = "DURATION", allow_hyphen_values = true)]
    orchestrator_timeout: Option<OsString>,

    /// Forward signal FROM as TO (TERM:QUIT); TO 0 drops it. Names with or
    /// without SIG, numbers, or RTMIN+N (RTMIN is 34). Repeatable; the
    /// variable is a comma list
    #[arg(long, env = "DRAINIT_REWRITE", value_name = "FROM:TO", action = ArgAction::Append, value_delimiter = ',')]
    rewrite: Vec<OsString>,

    /// Exit code by which the worker asks to be restarted later. Repeatable;
    /// the variable is a comma list [default: 75]
    #[arg(long = "backoff-exit-code", env = "DRAINIT_BACKOFF_EXIT_CODES", value_name = "CODE",
          action = ArgAction::Append, value_delimiter = ',', allow_hyphen_values = true)]
    backoff_exit_codes: Vec<OsString>,

    /// Base of the first sleep before a restart; it doubles each time, and
    /// each sleep is drawn from [base/2, base] [default: 1s]
    #[arg(long, env = "DRAINIT_BACKOFF_DELAY", value_name = "DURATION", allow_hyphen_values = true)]
    backoff_delay: Option<OsString>,

    /// Cap on one backoff sleep [default: 30s]
    #[arg(long, env = "DRAINIT_BACKOFF_MAX_DELAY", value_name = "DURATION", allow_hyphen_values = true)]
    backoff_max_delay: Option<OsString>,

    /// How long, from the first backoff exit, drainit keeps restarting; set it
    /// above the worker's lease stale threshold plus the max delay [default: 2m]
    #[arg(long, env = "DRAINIT_BACKOFF_TIMEOUT", value_name = "DURATION", allow_hyphen_values = true)]
    backoff_timeout: Option<OsString>,

    /// More logging (-v debug, -vv trace); beats DRAINIT_LOG, an env_logger
    /// filter [default: info]. RUST_LOG is the worker's and is not read
    #[arg(short = 'v', action = ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,

    /// Less logging (-q warnings and errors, -qq errors, -qqq nothing)
    #[arg(short = 'q', action = ArgAction::Count)]
    quiet: u8,

    /// The worker and its arguments, run with execvp semantics (PATH, no shell)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// The option values, checked to be UTF-8.
struct Strings {
    grace: Option<String>,
    orchestrator_timeout: Option<String>,
    rewrite: Vec<String>,
    backoff_exit_codes: Vec<String>,
    backoff_delay: Option<String>,
    backoff_max_delay: Option<String>,
    backoff_timeout: Option<String>,
    log: Option<String>,
}

/// Everything drainit runs with.
#[derive(Debug)]
pub struct Config {
    pub command: Vec<OsString>,
    pub grace: Duration,
    pub orchestrator_timeout: Duration,
    pub rewrite: Rewrite,
    pub backoff: backoff::Policy,
    pub log_filter: String,
}

/// How parsing ended without a configuration.
#[derive(Debug)]
pub enum Stop {
    /// --help or --version: print this on stdout, exit 0.
    Info(String),
    /// One line for stderr; exit 2.
    Invalid(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Info(text) => f.write_str(text),
            Stop::Invalid(line) => write!(f, "drainit: error: {line}"),
        }
    }
}

const VARIABLES: &[&str] = &[
    "DRAINIT_GRACE",
    "DRAINIT_ORCHESTRATOR_TIMEOUT",
    "DRAINIT_REWRITE",
    "DRAINIT_BACKOFF_EXIT_CODES",
    "DRAINIT_BACKOFF_DELAY",
    "DRAINIT_BACKOFF_MAX_DELAY",
    "DRAINIT_BACKOFF_TIMEOUT",
    "DRAINIT_LOG",
];

/// Parse and validate the command line and the environment.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Config, Stop> {
    if let Some(var) = VARIABLES.iter().find(|v| std::env::var_os(v).is_some_and(|x| x.is_empty())) {
        return Err(Stop::Invalid(format!("{var} is set but empty; unset it or give it a value")));
    }
    let mut command = Cli::command();
    let matches = command.try_get_matches_from_mut(args).map_err(clap_error)?;
    let raw = Cli::from_arg_matches(&matches).map_err(clap_error)?;
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
    // Values arrive as OsString so that one that is not UTF-8 is named.
    let text = |value: OsString, id: &str| -> Result<String, Stop> {
        value.into_string().map_err(|bad| invalid(id, &bad.to_string_lossy(), "not valid UTF-8"))
    };
    let one = |value: Option<OsString>, id: &str| value.map(|v| text(v, id)).transpose();
    let many = |values: Vec<OsString>, id: &str| values.into_iter().map(|v| text(v, id)).collect::<Result<Vec<_>, _>>();
    let cli = Strings {
        grace: one(raw.grace, "grace")?,
        orchestrator_timeout: one(raw.orchestrator_timeout, "orchestrator_timeout")?,
        rewrite: many(raw.rewrite, "rewrite")?,
        backoff_exit_codes: many(raw.backoff_exit_codes, "backoff_exit_codes")?,
        backoff_delay: one(raw.backoff_delay, "backoff_delay")?,
        backoff_max_delay: one(raw.backoff_max_delay, "backoff_max_delay")?,
        backoff_timeout: one(raw.backoff_timeout, "backoff_timeout")?,
        log: match std::env::var_os("DRAINIT_LOG").map(OsString::into_string) {
            None => None,
            Some(Ok(filter)) => Some(filter),
            Some(Err(bad)) => {
                return Err(Stop::Invalid(format!("DRAINIT_LOG '{}': not valid UTF-8", bad.to_string_lossy())));
            }
        },
    };
    let duration = |value: &Option<String>, id: &str, default: Duration| match value {
        None => Ok(default),
        Some(text) => parse_duration(text).map_err(|why| invalid(id, text, &why)),
    };

    let orchestrator_timeout = duration(&cli.orchestrator_timeout, "orchestrator_timeout", Duration::from_secs(10))?;
    let margin = Duration::from_secs(1);
    let Some(latest) = orchestrator_timeout.checked_sub(margin) else {
        let text = cli.orchestrator_timeout.unwrap_or_default();
        return Err(invalid(
            "orchestrator_timeout",
            &text,
            "must be at least 1s, drainit needs 1s before the orchestrator's SIGKILL",
        ));
    };
    let grace = duration(&cli.grace, "grace", latest)?;
    if grace > latest {
        let why = format!(
            "must end at least 1s before the orchestrator timeout {}, so at most {}",
            crate::events::duration(orchestrator_timeout),
            crate::events::duration(latest),
        );
        return Err(invalid("grace", &cli.grace.unwrap_or_default(), &why));
    }

    let rewrite = Rewrite::parse(cli.rewrite.iter().map(String::as_str))
        .map_err(|why| Stop::Invalid(format!("{} {why}", origin("rewrite"))))?;

    let defaults = backoff::Policy::default();
    let codes = if cli.backoff_exit_codes.is_empty() {
        defaults.codes.clone()
    } else {
        cli.backoff_exit_codes
            .iter()
            .map(|text| match text.trim().parse::<u8>() {
                Ok(code) if code > 0 => Ok(code),
                _ => Err(invalid("backoff_exit_codes", text, "must be an exit code from 1 to 255")),
            })
            .collect::<Result<Vec<u8>, Stop>>()?
    };
    let delay = duration(&cli.backoff_delay, "backoff_delay", defaults.delay)?;
    let max_delay = duration(&cli.backoff_max_delay, "backoff_max_delay", defaults.max_delay)?;
    let timeout = duration(&cli.backoff_timeout, "backoff_timeout", defaults.timeout)?;
    if delay.is_zero() {
        return Err(invalid("backoff_delay", "0", "must be more than 0, or a failing worker restarts in a tight loop"));
    }
    if delay > max_delay {
        let what = match &cli.backoff_delay {
            Some(text) => format!("{} '{text}'", origin("backoff_delay")),
            None => format!("the default backoff delay {}", crate::events::duration(delay)),
        };
        return Err(Stop::Invalid(format!(
            "{what} is longer than the backoff max delay {}",
            crate::events::duration(max_delay)
        )));
    }

    let log_filter = log_filter(raw.verbose, raw.quiet, cli.log)?;
    Ok(Config {
        command: raw.command,
        grace,
        orchestrator_timeout,
        rewrite,
        backoff: backoff::Policy { codes, delay, max_delay, timeout },
        log_filter,
    })
}

/// The longest DURATION accepted: far beyond any orchestrator's window, and
/// small enough that `now + duration` can never overflow a clock.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// humantime syntax, or a bare (decimal) number of seconds; at most a year.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let is_number = !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') && t.matches('.').count() <= 1;
    let parsed = if is_number {
        t.parse::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| "not a number of seconds".to_string())?
    } else {
        humantime::parse_duration(t)
            .map_err(|_| "not a duration (examples: 500ms, 8s, 1m30s; a bare number is seconds)".to_string())?
    };
    if parsed > MAX_DURATION {
        return Err("longer than a year".to_string());
    }
    Ok(parsed)
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

fn clap_error(err: clap::Error) -> Stop {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Stop::Info(err.render().to_string()),
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
    fn durations() {
        let ms = Duration::from_millis;
        for (text, want) in [("8", ms(8000)), ("0.5", ms(500)), ("500ms", ms(500)), ("1m30s", ms(90_000)), ("0", ms(0))]
        {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for text in
            ["", "abc", "-1s", "-1", "1.2.3", "5 parsecs", "1e3", "366d", "10000000000000000000", "99999999999y"]
        {
            assert!(parse_duration(text).is_err(), "{text}");
        }
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
            &["--backoff-delay", "5s", "--backoff-max-delay", "1s", "true"],
            &["--bogus", "true"],
            &[],
        ] {
            match parse(args(bad)) {
                Err(Stop::Invalid(line)) => assert!(!line.contains('\n') && !line.is_empty(), "{bad:?}: {line}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
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
