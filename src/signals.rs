//! Signals: their names, the `--rewrite` table, and the signal source that the
//! event loop waits on (every signal blocked, taken with rt_sigtimedwait).

use std::os::fd::AsFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::sys;

/// A signal number. Real-time signals have no `nix::Signal` variant, and
/// drainit forwards them too, so numbers are the currency.
pub type Signo = i32;

pub const SIGTERM: Signo = libc::SIGTERM;
pub const SIGINT: Signo = libc::SIGINT;
pub const SIGQUIT: Signo = libc::SIGQUIT;
pub const SIGKILL: Signo = libc::SIGKILL;
pub const SIGCHLD: Signo = libc::SIGCHLD;

/// SIGTERM, SIGINT and SIGQUIT ask the container to stop: they start the
/// grace clock (judged before rewriting, per the contract).
pub fn is_stop(sig: Signo) -> bool {
    matches!(sig, SIGTERM | SIGINT | SIGQUIT)
}

/// `SIGTERM`, `SIGRTMIN+3`, or `SIG42` for a number no name fits.
pub fn name(sig: Signo) -> String {
    let (min, max) = (sys::SIGRTMIN, sys::SIGRTMAX);
    if let Ok(s) = Signal::try_from(sig) {
        s.as_str().to_string()
    } else if sig == min {
        "SIGRTMIN".to_string()
    } else if sig > min && sig <= max {
        format!("SIGRTMIN+{}", sig - min)
    } else {
        format!("SIG{sig}")
    }
}

/// Parse `TERM`, `SIGTERM`, `term`, `15`, `RTMIN+2` or `SIGRTMAX-1`.
/// `allow_zero` admits `0`, the rewrite target meaning "drop it".
pub fn parse(text: &str, allow_zero: bool) -> Result<Signo, String> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let (min, max) = (sys::SIGRTMIN, sys::SIGRTMAX);
    let sig = if let Ok(n) = bare.parse::<i32>() {
        n
    } else if let Some(rest) = bare.strip_prefix("RTMIN") {
        min + offset(rest, 1).ok_or_else(|| format!("'{t}' is not a signal"))?
    } else if let Some(rest) = bare.strip_prefix("RTMAX") {
        max + offset(rest, -1).ok_or_else(|| format!("'{t}' is not a signal"))?
    } else {
        format!("SIG{bare}").parse::<Signal>().map_err(|_| format!("'{t}' is not a signal name"))? as i32
    };
    if sig == 0 && allow_zero {
        return Ok(0);
    }
    if Signal::try_from(sig).is_err() && !(min..=max).contains(&sig) {
        return Err(format!("'{t}' is not a signal number this system has"));
    }
    Ok(sig)
}

/// "" or "+N" (sign 1) / "-N" (sign -1): the offset from RTMIN or RTMAX.
fn offset(rest: &str, sign: i32) -> Option<i32> {
    if rest.is_empty() {
        return Some(0);
    }
    let want = if sign > 0 { '+' } else { '-' };
    let n: i32 = rest.strip_prefix(want)?.parse().ok()?;
    (0..=32).contains(&n).then_some(n * sign)
}

/// The `--rewrite` table: what each received signal is forwarded as.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewrite {
    to: Vec<Signo>, // index: received signal; value: forwarded signal, 0 drops
}

impl Default for Rewrite {
    fn default() -> Self {
        Rewrite { to: (0..=sys::SIGRTMAX).collect() }
    }
}

impl Rewrite {
    /// Build from `FROM:TO` pairs. SIGKILL, SIGSTOP and SIGCHLD cannot be a
    /// FROM: drainit never receives the first two and consumes the third.
    pub fn parse<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<Rewrite, String> {
        let mut table = Rewrite::default();
        let mut seen = Vec::new();
        for pair in pairs {
            let (from, to) =
                pair.split_once(':').ok_or_else(|| format!("'{pair}' is not FROM:TO (for example TERM:QUIT)"))?;
            let from = parse(from, false).map_err(|e| format!("'{pair}': {e}"))?;
            let to = parse(to, true).map_err(|e| format!("'{pair}': {e}"))?;
            if matches!(from, SIGKILL | SIGCHLD) || from == libc::SIGSTOP {
                return Err(format!("'{pair}': {} cannot be rewritten, drainit never forwards it", name(from)));
            }
            if seen.contains(&from) {
                return Err(format!("'{pair}': {} is rewritten twice", name(from)));
            }
            seen.push(from);
            table.to[from as usize] = to;
        }
        Ok(table)
    }

    /// The signal to forward for `sig`, or None when the table drops it.
    pub fn apply(&self, sig: Signo) -> Option<Signo> {
        match self.to.get(sig as usize).copied().unwrap_or(sig) {
            0 => None,
            to => Some(to),
        }
    }
}

/// Every signal, as a mask for `sys::signal_set` (bit signo - 1). SIGKILL
/// and SIGSTOP in it are ignored by the kernel.
const ALL: u64 = u64::MAX;

/// Every signal blocked, taken with rt_sigtimedwait; a close-on-exec
/// signalfd for the waits that must watch stderr too.
pub struct SignalSource {
    fd: SignalFd,
    me: i32,
    /// What the next `drain` does, as the last `wait` found.
    next: Next,
}

/// While nothing but signals and the clock is waited for (no log line waits
/// for stderr), taking the first signal is the whole wait: one syscall per
/// wakeup, and the kernel wakes a task waiting in rt_sigtimedwait sooner than
/// one waiting on a signalfd (bench/RESULTS.md).
#[derive(Clone, Copy, Debug)]
enum Next {
    /// The first take waits, this long at most (None: until a signal comes;
    /// zero when ppoll found signals pending).
    Wait(Option<Duration>),
    /// ppoll returned for something else: nothing to take.
    Skip,
}

impl SignalSource {
    /// The signal source, once `block_all` has run; `me` is drainit's pid
    /// (signals it caused itself are skipped).
    pub fn open(me: i32) -> nix::Result<SignalSource> {
        let fd = SignalFd::with_flags(&sys::signal_set(ALL), SfdFlags::SFD_CLOEXEC)?;
        Ok(SignalSource { fd, me, next: Next::Skip })
    }

    /// Prepare a wait for signals alone: the first take of `drain` waits,
    /// until a signal is pending or `timeout` passes (None: forever).
    pub fn wait(&mut self, timeout: Option<Duration>) {
        self.next = Next::Wait(timeout);
    }

    /// The signalfd, for a ppoll over the signals and other sources.
    pub fn poll_fd(&self) -> PollFd<'_> {
        PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)
    }

    /// After such a ppoll: what its entry for `poll_fd` said (None: the
    /// ppoll failed or was interrupted).
    pub fn polled(&mut self, revents: Option<PollFlags>) {
        self.next = match revents {
            Some(r) if r.contains(PollFlags::POLLIN) => Next::Wait(Some(Duration::ZERO)),
            _ => Next::Skip,
        };
    }

    /// Take what is pending, at most `max` signals, calling `each` for every
    /// one as it is taken. The kernel hands out the lowest-numbered pending
    /// signal first, so a sender that re-raises SIGHUP faster than drainit
    /// takes it would starve every higher number (SIGCHLD and SIGTERM among
    /// them): one call takes each kind at most once, leaving out the kinds
    /// already taken, until none is left (real-time signals queue: the
    /// instances left behind wait for the next call, none is lost). Signals
    /// drainit caused itself are skipped: the kernel sends SIGPIPE, with
    /// drainit as the sender, when a log line meets a closed stderr pipe,
    /// and forwarding (then logging) it would raise the next one, forever.
    pub fn drain(&mut self, max: usize, mut each: impl FnMut(Signo)) -> nix::Result<()> {
        let mut timeout = match std::mem::replace(&mut self.next, Next::Skip) {
            Next::Skip => return Ok(()),
            Next::Wait(timeout) => timeout,
        };
        let mut taken: u64 = 0; // bit signo - 1
        for _ in 0..max {
            let (signo, pid) = match sys::take_signal(ALL & !taken, timeout) {
                Ok(got) => got,
                Err(Errno::EAGAIN | Errno::EINTR) => break,
                Err(e) => return Err(e),
            };
            timeout = Some(Duration::ZERO);
            taken |= 1u64.checked_shl((signo as u32).wrapping_sub(1)).unwrap_or(0);
            if pid != self.me {
                each(signo);
            }
        }
        Ok(())
    }

    /// Discard whatever of `sigs` is pending now (see tty.rs).
    pub fn discard(&self, sigs: &[Signal]) -> nix::Result<()> {
        let mut only = SigSet::empty();
        sigs.iter().for_each(|s| only.add(*s));
        let probe = SignalFd::with_flags(&only, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        while probe.read_signal()?.is_some() {}
        Ok(())
    }
}

/// Block every signal: first thing, before any spawn. A signal that arrives
/// before the worker exists then waits to be taken and is
/// forwarded once it does.
pub fn block_all() -> nix::Result<()> {
    sys::set_signal_mask(&sys::signal_set(ALL))
}

/// Reset the dispositions drainit inherited as ignored (`ignored`, bit
/// signo - 1; every signal's when unknown).
pub fn reset_ignored(ignored: Option<u64>) {
    sys::reset_signal_dispositions(ignored.unwrap_or(ALL));
}

/// Restore an empty mask: in the worker-to-be, just before exec.
pub fn unblock_all() -> nix::Result<()> {
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_numbers_and_real_time() {
        for (text, want) in [
            ("TERM", libc::SIGTERM),
            ("SIGTERM", libc::SIGTERM),
            ("term", libc::SIGTERM),
            ("15", libc::SIGTERM),
            ("hup", libc::SIGHUP),
            ("SIGUSR1", libc::SIGUSR1),
            ("WINCH", libc::SIGWINCH),
            ("RTMIN", 34),
            ("SIGRTMIN+2", 36),
            ("RTMAX-1", 63),
            ("64", 64),
        ] {
            assert_eq!(parse(text, false), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_unknown_and_out_of_range() {
        for text in ["", "FOO", "SIGFOO", "0", "-1", "65", "32", "RTMIN+99", "RTMIN-1", "TERM2"] {
            assert!(parse(text, false).is_err(), "{text}");
        }
        assert_eq!(parse("0", true), Ok(0));
    }

    #[test]
    fn names_round_trip() {
        for sig in (1..=sys::SIGRTMAX).filter(|s| !(32..sys::SIGRTMIN).contains(s)) {
            assert_eq!(parse(&name(sig), false), Ok(sig), "{}", name(sig));
        }
    }

    /// A flood, made exact: each time SIGHUP is taken it is raised again, so
    /// it is pending at every take. The SIGTERM behind it is still taken in
    /// the same call, and the call ends (an init taking the lowest pending
    /// signal of the whole set each time would take SIGHUP `max` times).
    #[test]
    fn a_signal_raised_again_at_each_take_holds_back_none_above_it() {
        use nix::sys::signal::{pthread_sigmask, raise};
        let both = sys::signal_set(1 << (libc::SIGHUP - 1) | 1 << (SIGTERM - 1));
        // This test's thread only: the harness's other threads are untouched.
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&both), None).unwrap();
        // raise() signals the calling thread; `me` 0, so that they count.
        let mut source = SignalSource::open(0).unwrap();
        raise(Signal::SIGTERM).unwrap();
        raise(Signal::SIGHUP).unwrap();
        source.next = Next::Wait(Some(Duration::ZERO));
        let mut taken = Vec::new();
        source
            .drain(64, |sig| {
                taken.push(sig);
                if sig == libc::SIGHUP {
                    raise(Signal::SIGHUP).unwrap();
                }
            })
            .unwrap();
        assert_eq!(taken, [libc::SIGHUP, SIGTERM]);
        // The last SIGHUP raised is left for the next call.
        assert_eq!(sys::take_signal(1 << (libc::SIGHUP - 1), Some(Duration::ZERO)).map(|(s, _)| s), Ok(libc::SIGHUP));
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&both), None).unwrap();
    }

    #[test]
    fn rewrite_table() {
        let rw = Rewrite::parse(["TERM:QUIT", "SIGUSR1:0"]).unwrap();
        assert_eq!(rw.apply(SIGTERM), Some(SIGQUIT));
        assert_eq!(rw.apply(libc::SIGUSR1), None);
        assert_eq!(rw.apply(libc::SIGHUP), Some(libc::SIGHUP));
        for bad in ["TERM", "TERM:", ":QUIT", "KILL:TERM", "CHLD:TERM", "STOP:TERM", "TERM:FOO", "TERM:QUIT,TERM:INT"] {
            assert!(Rewrite::parse(bad.split(',')).is_err(), "{bad}");
        }
    }

    // Fuzzing (issue 26): see scripts/fuzz.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        /// A signal drainit can send (or 0, where allowed).
        fn sendable(sig: Signo) -> bool {
            Signal::try_from(sig).is_ok() || (sys::SIGRTMIN..=sys::SIGRTMAX).contains(&sig)
        }

        fn signal_text() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "(SIG|sig)?(RTMIN|RTMAX|rtmin|TERM|HUP|KILL|STOP|CHLD)?[+-]?[0-9]{0,12}",
                "[ ]?-?[0-9]{1,12}[ ]?",
            ]
        }

        fn list_text() -> impl Strategy<Value = Vec<String>> {
            prop::collection::vec(
                prop_oneof![any::<String>(), (signal_text(), signal_text()).prop_map(|(a, b)| format!("{a}:{b}"))],
                0..5,
            )
        }

        proptest! {
            #[test]
            fn fuzz_a_parsed_signal_exists(text in signal_text(), zero in any::<bool>()) {
                if let Ok(sig) = parse(&text, zero) {
                    prop_assert!(sendable(sig) || zero && sig == 0, "{text:?}: {sig}");
                }
            }

            #[test]
            fn fuzz_names_round_trip(
                sig in prop::sample::select((1..=sys::SIGRTMAX).filter(|s| sendable(*s)).collect::<Vec<_>>()),
                sig_prefix in any::<bool>(),
                lower in any::<bool>(),
            ) {
                let name = name(sig);
                let name = if sig_prefix { name } else { name["SIG".len()..].to_string() };
                let name = if lower { name.to_ascii_lowercase() } else { name };
                prop_assert_eq!(parse(&name, false), Ok(sig), "{}", name);
            }

            #[test]
            fn fuzz_a_parsed_rewrite_forwards_only_real_signals(list in list_text()) {
                if let Ok(table) = Rewrite::parse(list.iter().map(String::as_str)) {
                    for sig in -2..=sys::SIGRTMAX + 2 {
                        if let Some(to) = table.apply(sig) {
                            prop_assert!(to == sig || sendable(to), "{list:?}: {sig} -> {to}");
                        }
                    }
                }
            }

            #[test]
            fn fuzz_a_rewrite_table_does_what_it_says(pairs in prop::collection::btree_map(1..=sys::SIGRTMAX, 0..=sys::SIGRTMAX, 0..8)) {
                let pairs: Vec<(Signo, Signo)> = pairs
                    .into_iter()
                    .filter(|(from, to)| sendable(*from) && (*to == 0 || sendable(*to)))
                    .filter(|(from, _)| !matches!(*from, SIGKILL | SIGCHLD | libc::SIGSTOP))
                    .collect();
                let texts: Vec<String> = pairs.iter().map(|(f, t)| format!("{}:{}", name(*f), if *t == 0 { "0".into() } else { name(*t) })).collect();
                let table = Rewrite::parse(texts.iter().map(String::as_str)).unwrap();
                for (from, to) in pairs {
                    prop_assert_eq!(table.apply(from), (to != 0).then_some(to));
                }
            }
        }
    }
}
