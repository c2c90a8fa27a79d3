//! One record of the run: the attempt, the stop, how the worker ended, the
//! deadline, the worker's last status and the code drainit ends with. The
//! supervisor keeps it; the termination message and the finish program's
//! environment (`environment::finish`) are both read off it, so the two
//! never disagree.

use std::fmt;
use std::time::Instant;

use crate::duration;
use crate::events::Val;
use crate::exit::{Code, Outcome};
use crate::signals::{self, Signo};

/// The longest `STATUS=` text the termination message repeats.
const STATUS_IN_SUMMARY: usize = 256;

/// Why a stop began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop signal arrived (the orchestrator's, mostly).
    Signal,
    /// drainit stopped the worker: it missed its watchdog ping.
    Watchdog,
    /// drainit stopped the worker: it was not ready in time.
    ReadyTimeout,
    /// drainit stopped the worker: its cgroup's working set neared the limit.
    Memory,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Signal => "signal",
            StopReason::Watchdog => "watchdog",
            StopReason::ReadyTimeout => "ready_timeout",
            StopReason::Memory => "memory",
        }
    }
}

/// The stop under way: its signal (before rewriting), why, and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StopRequest {
    pub signal: Signo,
    pub reason: StopReason,
    pub at: Instant,
}

/// The code drainit exits with, and what it was before `--remap-exit`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ending {
    pub code: Code,
    pub remapped_from: Option<Code>,
}

impl Ending {
    /// A code that is drainit's own, never remapped.
    pub fn own(code: Code) -> Ending {
        Ending { code, remapped_from: None }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub attempt: u32,
    pub stop: Option<StopRequest>,
    /// How the last worker ended; None while none has.
    pub worker: Option<Outcome>,
    pub deadline_reached: bool,
    /// Processes alive when the deadline's SIGKILL went out.
    pub killed: usize,
    /// The worker's last `STATUS=`.
    pub status: Option<String>,
    /// Set once drainit knows how it ends.
    pub ending: Option<Ending>,
    /// When drainit exits (for how long the stop took).
    pub exit_at: Option<Instant>,
    /// OOM kills in drainit's cgroup since it started; None: no counter.
    pub oom_kills: Option<u64>,
    /// The last worker was killed by the OOM killer.
    pub worker_oom: bool,
}

impl Record {
    pub fn new() -> Record {
        Record {
            attempt: 1,
            stop: None,
            worker: None,
            deadline_reached: false,
            killed: 0,
            status: None,
            ending: None,
            exit_at: None,
            oom_kills: None,
            worker_oom: false,
        }
    }

    /// How the last worker ended, as the finish program and the
    /// termination message say it.
    pub fn worker_status(&self) -> String {
        match self.worker {
            Some(_) if self.worker_oom => "oom_kill".to_string(),
            Some(outcome) => outcome.to_string(),
            None => "none".to_string(),
        }
    }

    pub fn code(&self) -> Code {
        self.ending.map_or(Code::FAILED, |e| e.code)
    }
}

/// The termination message: one logfmt line, of at most 4096 bytes (the
/// status, the only text of the worker's in it, is cut to 256).
impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ending = self.ending.unwrap_or(Ending::own(Code::FAILED));
        write!(f, "drainit: code={}", ending.code.0)?;
        if let Some(from) = ending.remapped_from {
            write!(f, " remapped_from={}", from.0)?;
        }
        write!(f, " worker={}", self.worker_status())?;
        write!(f, " deadline_reached={} killed={}", u8::from(self.deadline_reached), self.killed)?;
        match (self.stop, self.exit_at) {
            (Some(stop), Some(end)) => write!(
                f,
                " stop={} stop_took={}",
                signals::name(stop.signal),
                duration::show(end.saturating_duration_since(stop.at))
            )?,
            (Some(stop), None) => write!(f, " stop={}", signals::name(stop.signal))?,
            (None, _) => f.write_str(" stop=none")?,
        }
        write!(f, " attempts={}", self.attempt)?;
        if let Some(stop) = self.stop.filter(|s| s.reason != StopReason::Signal) {
            write!(f, " reason={}", stop.reason.name())?;
        }
        if let Some(n) = self.oom_kills.filter(|n| *n > 0) {
            write!(f, " oom_kills={n}")?;
        }
        if let Some(status) = &self.status {
            write!(f, " status={}", Val(cut(status, STATUS_IN_SUMMARY)))?;
        }
        Ok(())
    }
}

/// The longest prefix of `text` of at most `max` bytes, cut at a character.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::time::Duration;

    /// A run SIGTERMed at `t0` whose worker the deadline killed 29 s later.
    pub fn record(t0: Instant) -> Record {
        Record {
            attempt: 1,
            stop: Some(StopRequest { signal: libc::SIGTERM, reason: StopReason::Signal, at: t0 }),
            worker: Some(Outcome::Signaled(9)),
            deadline_reached: true,
            killed: 3,
            status: None,
            ending: Some(Ending::own(Code(137))),
            exit_at: Some(t0 + Duration::from_millis(29_000)),
            oom_kills: Some(0),
            worker_oom: false,
        }
    }

    #[test]
    fn the_termination_message() {
        let t0 = Instant::now();
        assert_eq!(
            record(t0).to_string(),
            "drainit: code=137 worker=signal:SIGKILL deadline_reached=1 killed=3 stop=SIGTERM stop_took=29s attempts=1"
        );
        let r = Record {
            attempt: 2,
            ending: Some(Ending { code: Code(0), remapped_from: Some(Code(143)) }),
            worker: Some(Outcome::Exited(4)),
            ..Record::new()
        };
        assert_eq!(
            r.to_string(),
            "drainit: code=0 remapped_from=143 worker=exited:4 deadline_reached=0 killed=0 stop=none attempts=2"
        );
        let mut r = record(t0);
        r.stop = Some(StopRequest { signal: libc::SIGQUIT, reason: StopReason::Watchdog, at: t0 });
        r.status = Some("in_flight=3 \"job\" ".repeat(40));
        let line = r.to_string();
        assert!(line.contains(" stop=SIGQUIT stop_took=29s attempts=1 reason=watchdog status=\"in_flight=3"), "{line}");
        let status = line.split_once(" status=").map(|(_, s)| s).unwrap_or_default();
        assert!(status.len() <= STATUS_IN_SUMMARY + 2 + 40, "cut to 256 bytes before quoting: {}", status.len());
        let mut r = record(t0);
        r.stop = Some(StopRequest { signal: libc::SIGTERM, reason: StopReason::Memory, at: t0 });
        (r.worker, r.worker_oom, r.oom_kills, r.deadline_reached, r.killed) =
            (Some(Outcome::Signaled(9)), true, Some(2), false, 0);
        assert_eq!(
            r.to_string(),
            "drainit: code=137 worker=oom_kill deadline_reached=0 killed=0 stop=SIGTERM stop_took=29s attempts=1 \
             reason=memory oom_kills=2"
        );
    }

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("aé", 3), "aé");
    }
}
