//! The log lines: one event per line on stderr, `drainit: event=NAME k=v ...`
//! (logfmt). The names and keys of the contract's events are an interface;
//! scripts grep for them.

use std::fmt;
use std::time::Duration;

use log::Level;

use crate::duration::show as duration;
use crate::exit::Outcome;
use crate::signals::{self, Signo};

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    ChildStarted {
        pid: i32,
        attempt: u32,
    },
    StopRequested {
        signal: Signo,
        grace: Duration,
        /// The stop delay, when the signal is held before it is forwarded.
        delay: Option<Duration>,
        status: Option<String>,
    },
    /// The held stop signal (as rewritten) went out, `waited` after the request.
    StopForwarded {
        signal: Signo,
        waited: Duration,
        /// The step of `--stop-sequence` (1, 2, ...), when one is configured.
        step: Option<u32>,
    },
    ChildExited {
        pid: i32,
        outcome: Outcome,
        /// The OOM killer killed it.
        oom: bool,
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
        remapped_from: Option<i32>,
        status: Option<String>,
        /// OOM kills in drainit's cgroup during the run.
        oom_kills: u64,
    },
    /// The cgroup's OOM-kill count rose: by `count` since the last such
    /// event, `total` since drainit started.
    OomKill {
        count: u64,
        total: u64,
    },
    /// The working set reached `percent` of the limit: drainit stops the
    /// worker with `signal` (as it goes out).
    MemoryStop {
        used: u64,
        limit: u64,
        percent: u8,
        signal: Signo,
        status: Option<String>,
    },
    /// `--memory-stop` stays off: `no_cgroup`, `no_limit`, `unreadable`.
    MemoryStopOff {
        reason: &'static str,
    },
    /// The worker sent `READY=1`, `after` its start.
    Ready {
        pid: i32,
        after: Duration,
    },
    /// The worker is no longer ready: `reloading` or `stopping`.
    NotReady {
        reason: &'static str,
    },
    /// No `WATCHDOG=1` came for `since`; drainit stops the worker with `signal`.
    WatchdogExpired {
        interval: Duration,
        since: Duration,
        signal: Signo,
        status: Option<String>,
    },
    /// No `READY=1` came within `timeout`; drainit stops the worker with `signal`.
    ReadyTimeout {
        timeout: Duration,
        signal: Signo,
        status: Option<String>,
    },
    /// The watchdog's deadline had passed by more than an interval when
    /// drainit got to run: one fresh interval instead of a stop.
    WatchdogLate {
        late: Duration,
    },
    /// A notify message that was dropped: from whom (when known) and why.
    NotifyRejected {
        pid: Option<i32>,
        reason: &'static str,
        /// The first is a warning, the rest debug.
        first: bool,
    },
    /// The worker's `STATUS=` changed.
    Status {
        status: String,
    },
    FinishStarted {
        pid: i32,
    },
    FinishExited {
        pid: i32,
        outcome: Outcome,
        /// drainit killed it at its bound.
        timed_out: bool,
    },
    /// Log lines lost while stderr could not take them.
    LogDropped {
        lines: u64,
    },
    /// A file drainit writes for others (the drain file, the termination
    /// log) was not written, and why.
    FileSkipped {
        what: &'static str,
        path: String,
        error: String,
    },
    /// No directory for the retry-after file could be made.
    RetryAfterUnavailable {
        error: String,
    },
    /// The event loop's wait or signal read failed; the loop goes on.
    LoopError {
        what: &'static str,
        error: String,
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
    /// The finish program could not be executed (drainit's code stays).
    FinishFailed {
        command: String,
        error: String,
    },
    Failed {
        what: &'static str,
        error: String,
    },
    SubreaperRefused {
        error: String,
    },
    /// The state directory's record says its drainit died without its
    /// exit (None: unknown, the record could not be read).
    UncleanPredecessor {
        attempt: Option<u32>,
        pid: Option<i32>,
        age: Option<Duration>,
    },
    /// The state directory's record could not be read; counts as unclean.
    StateUnreadable {
        reason: String,
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
            Event::Reaped { .. } | Event::Forwarded { .. } | Event::Started { .. } | Event::Status { .. } => {
                Level::Debug
            }
            Event::NotifyRejected { first: false, .. } => Level::Debug,
            Event::DeadlineReached { .. }
            | Event::BackoffExhausted { .. }
            | Event::RetryAfterInvalid { .. }
            | Event::SubreaperRefused { .. }
            | Event::LogDropped { .. }
            | Event::FileSkipped { .. }
            | Event::RetryAfterUnavailable { .. }
            | Event::LoopError { .. }
            | Event::WatchdogExpired { .. }
            | Event::ReadyTimeout { .. }
            | Event::OomKill { .. }
            | Event::MemoryStop { .. }
            | Event::MemoryStopOff { .. }
            | Event::NotifyRejected { .. }
            | Event::UncleanPredecessor { .. }
            | Event::StateUnreadable { .. } => Level::Warn,
            Event::ExecFailed { .. } | Event::Failed { .. } | Event::FinishFailed { .. } => Level::Error,
            _ => Level::Info,
        }
    }

    pub fn emit(&self) {
        log::log!(self.level(), "{self}");
    }
}

/// A logfmt value: quoted only when it must be.
pub struct Val<'a>(pub &'a str);

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
                '\t' => f.write_str("\\t")?,
                // ESC, BEL, CR, DEL, C1 (U+0080..U+009F, CSI among them):
                // a terminal would act on them; a worker's STATUS= could
                // erase or forge lines.
                c if c.is_control() => write!(f, "\\x{:02x}", u32::from(c))?,
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

fn outcome(f: &mut fmt::Formatter<'_>, o: Outcome) -> fmt::Result {
    match o {
        Outcome::Exited(code) => write!(f, " code={code}"),
        Outcome::Signaled(sig) => write!(f, " signal={} code={}", signals::name(sig), o.code().0),
    }
}

/// ` status=...` once the worker has sent a `STATUS=`.
fn status(f: &mut fmt::Formatter<'_>, status: &Option<String>) -> fmt::Result {
    match status {
        Some(text) => write!(f, " status={}", Val(text)),
        None => Ok(()),
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::ChildStarted { pid, attempt } => write!(f, "event=child_started pid={pid} attempt={attempt}"),
            Event::StopRequested { signal, grace, delay, status: s } => {
                write!(f, "event=stop_requested signal={} grace={}", signals::name(*signal), duration(*grace))?;
                if let Some(delay) = delay {
                    write!(f, " delay={}", duration(*delay))?;
                }
                status(f, s)
            }
            Event::StopForwarded { signal, waited, step } => {
                write!(f, "event=stop_forwarded signal={} waited={}", signals::name(*signal), duration(*waited))?;
                match step {
                    Some(step) => write!(f, " step={step}"),
                    None => Ok(()),
                }
            }
            Event::ChildExited { pid, outcome: o, oom } => {
                write!(f, "event=child_exited pid={pid}")?;
                outcome(f, *o)?;
                if *oom {
                    f.write_str(" oom=1")?;
                }
                Ok(())
            }
            Event::DeadlineReached { remaining } => write!(f, "event=deadline_reached remaining={remaining}"),
            Event::Backoff { attempt, code, delay } => {
                write!(f, "event=backoff attempt={attempt} code={code} delay={}", duration(*delay))
            }
            Event::BackoffExhausted { attempts, elapsed } => {
                write!(f, "event=backoff_exhausted attempts={attempts} elapsed={}", duration(*elapsed))
            }
            Event::Exit { code, remapped_from, status: s, oom_kills } => {
                write!(f, "event=exit code={code}")?;
                if let Some(from) = remapped_from {
                    write!(f, " remapped_from={from}")?;
                }
                if *oom_kills > 0 {
                    write!(f, " oom_kills={oom_kills}")?;
                }
                status(f, s)
            }
            Event::OomKill { count, total } => write!(f, "event=oom_kill count={count} total={total}"),
            Event::MemoryStop { used, limit, percent, signal, status: s } => {
                write!(
                    f,
                    "event=memory_stop used={used} limit={limit} percent={percent} signal={}",
                    signals::name(*signal)
                )?;
                status(f, s)
            }
            Event::MemoryStopOff { reason } => write!(f, "event=memory_stop_off reason={reason}"),
            Event::Ready { pid, after } => write!(f, "event=ready pid={pid} after={}", duration(*after)),
            Event::NotReady { reason } => write!(f, "event=not_ready reason={reason}"),
            Event::WatchdogExpired { interval, since, signal, status: s } => {
                write!(
                    f,
                    "event=watchdog_expired interval={} since={} signal={}",
                    duration(*interval),
                    duration(*since),
                    signals::name(*signal)
                )?;
                status(f, s)
            }
            Event::ReadyTimeout { timeout, signal, status: s } => {
                write!(f, "event=ready_timeout timeout={} signal={}", duration(*timeout), signals::name(*signal))?;
                status(f, s)
            }
            Event::WatchdogLate { late } => write!(f, "event=watchdog_late late={}", duration(*late)),
            Event::NotifyRejected { pid, reason, .. } => {
                f.write_str("event=notify_rejected")?;
                if let Some(pid) = pid {
                    write!(f, " pid={pid}")?;
                }
                write!(f, " reason={reason}")
            }
            Event::Status { status: s } => write!(f, "event=status status={}", Val(s)),
            Event::FinishStarted { pid } => write!(f, "event=finish_started pid={pid}"),
            Event::FinishExited { pid, outcome: o, timed_out } => {
                write!(f, "event=finish_exited pid={pid}")?;
                outcome(f, *o)?;
                write!(f, " timed_out={}", u8::from(*timed_out))
            }
            Event::LogDropped { lines } => write!(f, "event=log_dropped lines={lines}"),
            Event::FileSkipped { what, path, error } => {
                write!(f, "event=file_skipped what={what} path={} error={}", Val(path), Val(error))
            }
            Event::RetryAfterUnavailable { error } => {
                write!(f, "event=retry_after_unavailable error={}", Val(error))
            }
            Event::LoopError { what, error } => write!(f, "event=loop_error what={what} error={}", Val(error)),
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
            Event::FinishFailed { command, error } => {
                write!(f, "event=finish_failed command={} error={}", Val(command), Val(error))
            }
            Event::Failed { what, error } => write!(f, "event=failed what={what} error={}", Val(error)),
            Event::SubreaperRefused { error } => write!(f, "event=subreaper_refused error={}", Val(error)),
            Event::UncleanPredecessor { attempt, pid, age } => {
                let known = |v: Option<String>| v.unwrap_or_else(|| "unknown".into());
                write!(
                    f,
                    "event=unclean_predecessor attempt={} pid={} age={}",
                    known(attempt.map(|a| a.to_string())),
                    known(pid.map(|p| p.to_string())),
                    known(age.map(duration)),
                )
            }
            Event::StateUnreadable { reason } => write!(f, "event=state_unreadable reason={}", Val(reason)),
            Event::Started { mode, grace, orchestrator_timeout } => write!(
                f,
                "event=drainit_started mode={mode} grace={} orchestrator_timeout={}",
                duration(*grace),
                duration(*orchestrator_timeout)
            ),
        }
    }
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
                Event::StopRequested { signal: libc::SIGTERM, grace: ms(9000), delay: None, status: None },
                "event=stop_requested signal=SIGTERM grace=9s",
            ),
            (
                Event::StopRequested {
                    signal: libc::SIGTERM,
                    grace: ms(9000),
                    delay: Some(ms(5000)),
                    status: Some("in_flight=3".into()),
                },
                "event=stop_requested signal=SIGTERM grace=9s delay=5s status=\"in_flight=3\"",
            ),
            (
                Event::StopForwarded { signal: libc::SIGQUIT, waited: ms(5003), step: None },
                "event=stop_forwarded signal=SIGQUIT waited=5.003s",
            ),
            (Event::ChildExited { pid: 7, outcome: Outcome::Exited(3), oom: false }, "event=child_exited pid=7 code=3"),
            (
                Event::StopForwarded { signal: libc::SIGTSTP, waited: ms(2000), step: Some(1) },
                "event=stop_forwarded signal=SIGTSTP waited=2s step=1",
            ),
            (
                Event::ChildExited { pid: 7, outcome: Outcome::Signaled(9), oom: false },
                "event=child_exited pid=7 signal=SIGKILL code=137",
            ),
            (
                Event::ChildExited { pid: 7, outcome: Outcome::Signaled(9), oom: true },
                "event=child_exited pid=7 signal=SIGKILL code=137 oom=1",
            ),
            (Event::OomKill { count: 1, total: 3 }, "event=oom_kill count=1 total=3"),
            (
                Event::MemoryStop { used: 60, limit: 64, percent: 90, signal: libc::SIGTERM, status: None },
                "event=memory_stop used=60 limit=64 percent=90 signal=SIGTERM",
            ),
            (Event::MemoryStopOff { reason: "no_limit" }, "event=memory_stop_off reason=no_limit"),
            (Event::DeadlineReached { remaining: 2 }, "event=deadline_reached remaining=2"),
            (Event::Backoff { attempt: 1, code: 75, delay: ms(1500) }, "event=backoff attempt=1 code=75 delay=1.5s"),
            (Event::Backoff { attempt: 2, code: 75, delay: ms(300) }, "event=backoff attempt=2 code=75 delay=300ms"),
            (
                Event::BackoffExhausted { attempts: 4, elapsed: ms(120_000) },
                "event=backoff_exhausted attempts=4 elapsed=2m",
            ),
            (Event::Exit { code: 143, remapped_from: None, status: None, oom_kills: 0 }, "event=exit code=143"),
            (
                Event::Exit { code: 137, remapped_from: None, status: None, oom_kills: 2 },
                "event=exit code=137 oom_kills=2",
            ),
            (
                Event::Exit { code: 0, remapped_from: Some(143), status: Some("two jobs".into()), oom_kills: 0 },
                "event=exit code=0 remapped_from=143 status=\"two jobs\"",
            ),
            (Event::Ready { pid: 7, after: ms(1500) }, "event=ready pid=7 after=1.5s"),
            (Event::NotReady { reason: "reloading" }, "event=not_ready reason=reloading"),
            (
                Event::WatchdogExpired { interval: ms(2000), since: ms(2004), signal: libc::SIGQUIT, status: None },
                "event=watchdog_expired interval=2s since=2.004s signal=SIGQUIT",
            ),
            (
                Event::ReadyTimeout { timeout: ms(5000), signal: libc::SIGTERM, status: Some("db".into()) },
                "event=ready_timeout timeout=5s signal=SIGTERM status=db",
            ),
            (Event::WatchdogLate { late: ms(7000) }, "event=watchdog_late late=7s"),
            (
                Event::NotifyRejected { pid: Some(9), reason: "not_ours", first: true },
                "event=notify_rejected pid=9 reason=not_ours",
            ),
            (Event::FinishStarted { pid: 9 }, "event=finish_started pid=9"),
            (
                Event::FinishExited { pid: 9, outcome: Outcome::Signaled(9), timed_out: true },
                "event=finish_exited pid=9 signal=SIGKILL code=137 timed_out=1",
            ),
            (
                Event::FinishExited { pid: 9, outcome: Outcome::Exited(0), timed_out: false },
                "event=finish_exited pid=9 code=0 timed_out=0",
            ),
            (Event::LogDropped { lines: 12 }, "event=log_dropped lines=12"),
            (
                Event::RetryAfterInvalid { path: "/tmp/x y".into(), error: "bad \"v\"".into() },
                "event=retry_after_invalid path=\"/tmp/x y\" error=\"bad \\\"v\\\"\"",
            ),
        ] {
            assert_eq!(event.to_string(), line);
        }
    }
}
