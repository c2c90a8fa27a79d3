//! The log lines: one event per line on stderr, `drainit: event=NAME k=v ...`
//! (logfmt). The names and keys of the contract's events are an interface;
//! scripts grep for them.

use std::fmt;
use std::io::Write;
use std::time::Duration;

use log::Level;

use crate::signals::{self, Signo};

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Signaled(Signo),
}

impl Outcome {
    /// Decode a raw waitpid status (stopped/continued never reach drainit:
    /// it waits without WUNTRACED/WCONTINUED).
    pub fn from_wait_status(status: i32) -> Outcome {
        if libc::WIFSIGNALED(status) {
            Outcome::Signaled(libc::WTERMSIG(status))
        } else {
            Outcome::Exited(libc::WEXITSTATUS(status))
        }
    }

    /// The shell convention drainit exits with: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            Outcome::Exited(code) => code,
            Outcome::Signaled(sig) => 128 + sig,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    ChildStarted {
        pid: i32,
        attempt: u32,
    },
    StopRequested {
        signal: Signo,
        grace: Duration,
    },
    ChildExited {
        pid: i32,
        outcome: Outcome,
    },
    DeadlineReached {
        remaining: usize,
    },
    Backoff {
        attempt: u32,
        code: i32,
        delay: Duration,
    },
    BackoffExhausted {
        attempts: u32,
        elapsed: Duration,
    },
    Exit {
        code: i32,
    },
    /// A process other than the worker was reaped (an orphan or leftover).
    Reaped {
        pid: i32,
        outcome: Outcome,
    },
    /// A signal (after rewriting) sent to the worker's process group.
    Forwarded {
        signal: Signo,
    },
    /// A signal drainit had no one to forward to (during a backoff sleep).
    SignalDropped {
        signal: Signo,
    },
    RetryAfterInvalid {
        path: String,
        error: String,
    },
    ExecFailed {
        command: String,
        error: String,
        code: i32,
    },
    Failed {
        what: &'static str,
        error: String,
    },
    SubreaperRefused {
        error: String,
    },
    Started {
        mode: &'static str,
        grace: Duration,
        orchestrator_timeout: Duration,
    },
}

impl Event {
    pub fn level(&self) -> Level {
        match self {
            Event::Reaped { .. } | Event::Forwarded { .. } | Event::Started { .. } => Level::Debug,
            Event::DeadlineReached { .. }
            | Event::BackoffExhausted { .. }
            | Event::RetryAfterInvalid { .. }
            | Event::SubreaperRefused { .. } => Level::Warn,
            Event::ExecFailed { .. } | Event::Failed { .. } => Level::Error,
            _ => Level::Info,
        }
    }

    pub fn emit(&self) {
        log::log!(self.level(), "{self}");
    }
}

/// `1.5s`, `300ms`, `2m`: short, unquoted in logfmt, readable.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{}s", ms / 1000, format!("{:03}", ms % 1000).trim_end_matches('0'))
    }
}

/// A logfmt value: quoted only when it must be.
struct Val<'a>(&'a str);

impl fmt::Display for Val<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() && !self.0.contains(|c: char| c.is_whitespace() || c == '"' || c == '=' || c.is_control())
        {
            return f.write_str(self.0);
        }
        f.write_str("\"")?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

fn outcome(f: &mut fmt::Formatter<'_>, o: Outcome) -> fmt::Result {
    match o {
        Outcome::Exited(code) => write!(f, " code={code}"),
        Outcome::Signaled(sig) => write!(f, " signal={} code={}", signals::name(sig), o.code()),
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::ChildStarted { pid, attempt } => write!(f, "event=child_started pid={pid} attempt={attempt}"),
            Event::StopRequested { signal, grace } => {
                write!(f, "event=stop_requested signal={} grace={}", signals::name(*signal), duration(*grace))
            }
            Event::ChildExited { pid, outcome: o } => {
                write!(f, "event=child_exited pid={pid}")?;
                outcome(f, *o)
            }
            Event::DeadlineReached { remaining } => write!(f, "event=deadline_reached remaining={remaining}"),
            Event::Backoff { attempt, code, delay } => {
                write!(f, "event=backoff attempt={attempt} code={code} delay={}", duration(*delay))
            }
            Event::BackoffExhausted { attempts, elapsed } => {
                write!(f, "event=backoff_exhausted attempts={attempts} elapsed={}", duration(*elapsed))
            }
            Event::Exit { code } => write!(f, "event=exit code={code}"),
            Event::Reaped { pid, outcome: o } => {
                write!(f, "event=reaped pid={pid}")?;
                outcome(f, *o)
            }
            Event::Forwarded { signal } => write!(f, "event=signal_forwarded signal={}", signals::name(*signal)),
            Event::SignalDropped { signal } => {
                write!(f, "event=signal_dropped signal={} reason=no_worker", signals::name(*signal))
            }
            Event::RetryAfterInvalid { path, error } => {
                write!(f, "event=retry_after_invalid path={} error={}", Val(path), Val(error))
            }
            Event::ExecFailed { command, error, code } => {
                write!(f, "event=exec_failed command={} error={} code={code}", Val(command), Val(error))
            }
            Event::Failed { what, error } => write!(f, "event=failed what={what} error={}", Val(error)),
            Event::SubreaperRefused { error } => write!(f, "event=subreaper_refused error={}", Val(error)),
            Event::Started { mode, grace, orchestrator_timeout } => write!(
                f,
                "event=drainit_started mode={mode} grace={} orchestrator_timeout={}",
                duration(*grace),
                duration(*orchestrator_timeout)
            ),
        }
    }
}

/// env_logger writing `drainit: ` + the event, nothing else. Write errors
/// (stderr closed, /dev/full) are dropped: losing a log line must never
/// take PID 1 down.
pub fn init_logger(filter: &str) {
    env_logger::Builder::new()
        .parse_filters(filter)
        .format(|buf, record| writeln!(buf, "drainit: {}", record.args()))
        .target(env_logger::Target::Stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_lines() {
        let ms = Duration::from_millis;
        for (event, line) in [
            (Event::ChildStarted { pid: 7, attempt: 1 }, "event=child_started pid=7 attempt=1"),
            (
                Event::StopRequested { signal: libc::SIGTERM, grace: ms(9000) },
                "event=stop_requested signal=SIGTERM grace=9s",
            ),
            (Event::ChildExited { pid: 7, outcome: Outcome::Exited(3) }, "event=child_exited pid=7 code=3"),
            (
                Event::ChildExited { pid: 7, outcome: Outcome::Signaled(9) },
                "event=child_exited pid=7 signal=SIGKILL code=137",
            ),
            (Event::DeadlineReached { remaining: 2 }, "event=deadline_reached remaining=2"),
            (Event::Backoff { attempt: 1, code: 75, delay: ms(1500) }, "event=backoff attempt=1 code=75 delay=1.5s"),
            (Event::Backoff { attempt: 2, code: 75, delay: ms(300) }, "event=backoff attempt=2 code=75 delay=300ms"),
            (
                Event::BackoffExhausted { attempts: 4, elapsed: ms(120_000) },
                "event=backoff_exhausted attempts=4 elapsed=2m",
            ),
            (Event::Exit { code: 143 }, "event=exit code=143"),
            (
                Event::RetryAfterInvalid { path: "/tmp/x y".into(), error: "bad \"v\"".into() },
                "event=retry_after_invalid path=\"/tmp/x y\" error=\"bad \\\"v\\\"\"",
            ),
        ] {
            assert_eq!(event.to_string(), line);
        }
    }

    #[test]
    fn outcome_from_status() {
        assert_eq!(Outcome::from_wait_status(42 << 8), Outcome::Exited(42));
        assert_eq!(Outcome::from_wait_status(9), Outcome::Signaled(9));
        assert_eq!(Outcome::from_wait_status(9).code(), 137);
        assert_eq!(Outcome::from_wait_status(0x80 | 11).code(), 139); // core dumped
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(duration(ms(0)), "0ms");
        assert_eq!(duration(ms(1010)), "1.01s");
        assert_eq!(duration(ms(90_000)), "90s");
        assert_eq!(duration(ms(29_000)), "29s");
    }
}
