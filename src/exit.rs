//! drainit's exit status: the contract's codes by name, the `--remap-exit`
//! table, and the one-line summary of how the container ended that goes to
//! the termination log.

use crate::signals::Signo;

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

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Signaled(Signo),
}

/// `exited:N` or `signal:NAME`, as the termination message and the finish
/// program's DRAINIT_WORKER_STATUS say it.
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Exited(code) => write!(f, "exited:{code}"),
            Outcome::Signaled(sig) => write!(f, "signal:{}", crate::signals::name(*sig)),
        }
    }
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
    pub fn code(self) -> Code {
        match self {
            Outcome::Exited(code) => Code(code),
            Outcome::Signaled(sig) => Code::signal(sig),
        }
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
