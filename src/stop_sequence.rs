//! `--stop-sequence`: what the worker's group gets instead of the forwarded
//! stop signal, as a list of steps (`TSTP,TERM@20s`), each a signal and its
//! offset from the moment the stop signal would have gone out. Parsing and
//! the checks that need no other setting live here (pure); the check
//! against the grace and the stop delay is config's, which names them.

use std::time::Duration;

use crate::duration;
use crate::signals::{self, SIGKILL, Signo};

/// One step: `signal` goes out `offset` after the sequence begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub signal: Signo,
    pub offset: Duration,
}

/// The steps, offsets strictly increasing; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopSequence {
    steps: Vec<Step>,
}

impl StopSequence {
    /// A comma list of `SIGNAL` or `SIGNAL@OFFSET`. A step without an
    /// offset is at 0: only the first may go without one. On error, why,
    /// naming the step.
    pub fn parse(text: &str) -> Result<StopSequence, String> {
        let mut steps: Vec<Step> = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err("has an empty step; give SIGNAL or SIGNAL@OFFSET, e.g. TSTP,TERM@20s".to_string());
            }
            let (name, offset) = match part.split_once('@') {
                Some((name, offset)) => {
                    let offset = duration::parse(offset).map_err(|why| format!("step '{part}': {why}"))?;
                    (name, offset)
                }
                None => (part, Duration::ZERO),
            };
            let signal = signals::parse(name, true).map_err(|why| format!("step '{part}': {why}"))?;
            if signal == 0 {
                return Err(format!("step '{part}': 0 sends nothing; name a signal"));
            }
            if signal == SIGKILL {
                return Err(format!(
                    "step '{part}': SIGKILL is the grace deadline's, not a step (shorten --grace instead)"
                ));
            }
            if let Some(before) = steps.last()
                && offset <= before.offset
            {
                return Err(format!(
                    "step '{part}': offsets must increase; this one must come later than {} ({})",
                    duration::show(before.offset),
                    signals::name(before.signal)
                ));
            }
            steps.push(Step { signal, offset });
        }
        Ok(StopSequence { steps })
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The offset of the last step.
    pub fn last_offset(&self) -> Duration {
        self.steps.last().map_or(Duration::ZERO, |s| s.offset)
    }

    /// The sequence as it is logged and shown in refusals.
    #[cfg(test)]
    pub fn show(&self) -> String {
        let step = |s: &Step| match s.offset {
            d if d.is_zero() => signals::name(s.signal),
            d => format!("{}@{}", signals::name(s.signal), duration::show(d)),
        };
        self.steps.iter().map(step).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted() {
        let rows: &[(&str, &str)] = &[
            ("TSTP,TERM@20s", "SIGTSTP,SIGTERM@20s"),
            ("TERM,INT@10s,QUIT@20s", "SIGTERM,SIGINT@10s,SIGQUIT@20s"),
            ("SIGTERM", "SIGTERM"),
            (" tstp , term@1500ms ", "SIGTSTP,SIGTERM@1.5s"),
            ("15,2@3", "SIGTERM,SIGINT@3s"),
            ("USR1@2s,TERM@4s", "SIGUSR1@2s,SIGTERM@4s"),
            ("RTMIN+3,TERM@1m", "SIGRTMIN+3,SIGTERM@1m"),
        ];
        for (text, shown) in rows {
            let seq = StopSequence::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(seq.show(), *shown, "{text}");
        }
        assert_eq!(StopSequence::parse("TSTP,TERM@20s").unwrap().last_offset(), Duration::from_secs(20));
    }

    #[test]
    fn refused_with_the_step_named() {
        let rows: &[(&str, &str)] = &[
            ("", "empty step"),
            ("TSTP,", "empty step"),
            ("TERM,INT", "step 'INT': offsets must increase"),
            ("TERM@5s,INT@5s", "step 'INT@5s': offsets must increase"),
            ("TERM@5s,INT@2s", "step 'INT@2s': offsets must increase"),
            ("KILL", "step 'KILL': SIGKILL"),
            ("TERM,SIGKILL@5s", "step 'SIGKILL@5s': SIGKILL"),
            ("TERM,9@5s", "step '9@5s': SIGKILL"),
            ("0", "step '0'"),
            ("TERM,0@1s", "step '0@1s'"),
            ("NOPE", "step 'NOPE'"),
            ("TERM@soon", "step 'TERM@soon'"),
            ("TERM@-1s", "step 'TERM@-1s'"),
        ];
        for (text, want) in rows {
            let err = StopSequence::parse(text).expect_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
