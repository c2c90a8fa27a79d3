//! drainit's exit status: the contract's codes by name, the `--remap-exit`
//! table, and the one-line summary of how the container ended that goes to
//! the termination log.

use std::fmt;
use std::time::Duration;

use crate::duration;
use crate::reap::Outcome;
use crate::signals::{self, Signo};

/// A code drainit exits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub i32);

impl Code {
    /// Bad flags or environment: one line, and the worker never starts.
    pub const CONFIG: Code = Code(2);
    /// drainit itself failed (fork, signal setup).
    pub const FAILED: Code = Code(125);
    /// COMMAND was found but cannot be executed.
    pub const NOT_EXECUTABLE: Code = Code(126);
    /// COMMAND was not found.
    pub const NOT_FOUND: Code = Code(127);

    /// The shell's convention for a death by signal N (also: stop signal N
    /// while no worker ran).
    pub fn signal(sig: Signo) -> Code {
        Code(128 + sig)
    }
}

/// The `--remap-exit` table: FROM -> TO, each 0-255.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Remap {
    pairs: Vec<(u8, u8)>,
}

impl Remap {
    /// Build from `FROM:TO` texts. The same FROM twice is refused unless it
    /// names the same TO (a variable and its repetition in a flag agree).
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Remap, String> {
        let code = |part: &str, pair: &str| {
            part.trim()
                .parse::<u8>()
                .map_err(|_| format!("'{pair}': '{}' is not an exit code from 0 to 255", part.trim()))
        };
        let mut pairs: Vec<(u8, u8)> = Vec::new();
        for pair in texts {
            let (from, to) =
                pair.split_once(':').ok_or_else(|| format!("'{pair}' is not FROM:TO (for example 143:0)"))?;
            let (from, to) = (code(from, pair)?, code(to, pair)?);
            match pairs.iter().find(|(f, _)| *f == from) {
                Some((_, other)) if *other != to => {
                    return Err(format!("'{pair}': {from} is already remapped to {other}"));
                }
                Some(_) => {}
                None => pairs.push((from, to)),
            }
        }
        Ok(Remap { pairs })
    }

    /// The code to exit with instead of `code`, when the table names it.
    pub fn apply(&self, code: Code) -> Option<Code> {
        let from = u8::try_from(code.0).ok()?;
        self.pairs.iter().find(|(f, _)| *f == from).map(|(_, to)| Code(i32::from(*to)))
    }
}

/// How the container ended, for the termination log: one logfmt line, of
/// numbers and signal names only, so far below the 4096 bytes Kubernetes
/// reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub code: Code,
    pub remapped_from: Option<Code>,
    /// How the last worker ended; None when none ran.
    pub worker: Option<Outcome>,
    pub deadline_reached: bool,
    /// Processes alive when the deadline's SIGKILL went out.
    pub killed: usize,
    /// The stop signal and the time from it to drainit's exit.
    pub stop: Option<(Signo, Duration)>,
    pub attempts: u32,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "drainit: code={}", self.code.0)?;
        if let Some(from) = self.remapped_from {
            write!(f, " remapped_from={}", from.0)?;
        }
        match self.worker {
            Some(outcome) => write!(f, " worker={outcome}")?,
            None => f.write_str(" worker=none")?,
        }
        write!(f, " deadline_reached={} killed={}", u8::from(self.deadline_reached), self.killed)?;
        match self.stop {
            Some((sig, took)) => write!(f, " stop={} stop_took={}", signals::name(sig), duration::show(took))?,
            None => f.write_str(" stop=none")?,
        }
        write!(f, " attempts={}", self.attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remap_table() {
        let r = Remap::parse(["143:0", "130:0", "143:0"]).unwrap();
        assert_eq!(r.apply(Code(143)), Some(Code(0)));
        assert_eq!(r.apply(Code(130)), Some(Code(0)));
        assert_eq!(r.apply(Code(137)), None);
        assert_eq!(r.apply(Code(-1)), None);
    }

    #[test]
    fn remap_refusals() {
        for bad in ["143", "a:b", "256:0", "1:256", "-1:0", "143:0:1", "", ":0", "143:", "143:0,143:1"] {
            assert!(Remap::parse(bad.split(',')).is_err(), "{bad}");
        }
    }

    #[test]
    fn summary_line() {
        let s = Summary {
            code: Code(137),
            remapped_from: None,
            worker: Some(Outcome::Signaled(9)),
            deadline_reached: true,
            killed: 3,
            stop: Some((libc::SIGTERM, Duration::from_millis(29_000))),
            attempts: 1,
        };
        assert_eq!(
            s.to_string(),
            "drainit: code=137 worker=signal:SIGKILL deadline_reached=1 killed=3 stop=SIGTERM stop_took=29s attempts=1"
        );
        let s = Summary {
            code: Code(0),
            remapped_from: Some(Code(143)),
            worker: Some(Outcome::Exited(4)),
            deadline_reached: false,
            killed: 0,
            stop: None,
            attempts: 2,
        };
        assert_eq!(
            s.to_string(),
            "drainit: code=0 remapped_from=143 worker=exited:4 deadline_reached=0 killed=0 stop=none attempts=2"
        );
    }

    // Fuzzing (issue 26): see scripts/fuzz.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn fuzz_any_remap_list_is_refused_or_maps_within_0_to_255(
                list in prop::collection::vec(prop_oneof![any::<String>(), "[ ]?-?[0-9]{1,4}[ ]?:[ ]?-?[0-9]{1,4}(:[0-9])?"], 0..5),
            ) {
                if let Ok(remap) = Remap::parse(list.iter().map(String::as_str)) {
                    for code in -1..=300 {
                        if let Some(to) = remap.apply(Code(code)) {
                            prop_assert!((0..=255).contains(&code) && (0..=255).contains(&to.0), "{list:?}");
                        }
                    }
                }
            }

            #[test]
            fn fuzz_a_remap_table_does_what_it_says(pairs in prop::collection::btree_map(any::<u8>(), any::<u8>(), 0..8)) {
                let texts: Vec<String> = pairs.iter().map(|(f, t)| format!("{f}:{t}")).collect();
                let remap = Remap::parse(texts.iter().map(String::as_str)).unwrap();
                for code in 0..=255u8 {
                    let want = pairs.get(&code).map(|to| Code(i32::from(*to)));
                    prop_assert_eq!(remap.apply(Code(i32::from(code))), want);
                }
            }
        }
    }
}
