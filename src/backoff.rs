//! StartupBackoff as pure arithmetic: which exit codes ask for a restart, how
//! long to sleep before it, and when the budget is spent. Time and randomness
//! come in as values, so every rule is tested without a process or a clock.

use std::time::{Duration, Instant};

use crate::exit::Code;

/// The backoff settings, validated by config.rs.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Empty: no code asks for a restart, every exit is final (`none`).
    pub codes: Vec<u8>,
    pub delay: Duration,
    pub max_delay: Duration,
    pub timeout: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            codes: vec![75], // EX_TEMPFAIL
            delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            timeout: Duration::from_secs(120),
        }
    }
}

impl Policy {
    pub fn wants_restart(&self, code: Code) -> bool {
        u8::try_from(code.0).is_ok_and(|c| self.codes.contains(&c))
    }
}

/// What to do after a backoff exit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    Sleep(Duration),
    /// The budget was spent before this backoff exit.
    Exhausted {
        elapsed: Duration,
    },
}

/// The schedule's memory across attempts.
#[derive(Clone, Debug)]
pub struct Backoff {
    first_exit: Option<Instant>,
    base: Duration,
}

impl Backoff {
    pub fn new(policy: &Policy) -> Backoff {
        Backoff { first_exit: None, base: policy.delay.min(policy.max_delay) }
    }

    /// The sleep before the next attempt. `requested` is what the worker wrote
    /// to its retry-after file; `unit` is a uniform draw from [0, 1) that
    /// places the sleep in [base/2, base]. The base doubles on every call,
    /// capped at `max_delay`, whether or not the worker asked for a delay.
    ///
    /// The budget is used to its end: the lease the worker waits for may age
    /// out in its last second, so a sleep that would end past it is cut to
    /// end with it, and the worker tries once more then. A backoff exit
    /// after the budget is spent is final.
    pub fn next(&mut self, policy: &Policy, now: Instant, requested: Option<Duration>, unit: f64) -> Decision {
        let first = *self.first_exit.get_or_insert(now);
        let base = self.base;
        self.base = base.saturating_mul(2).min(policy.max_delay);
        let delay = match requested {
            Some(asked) => asked.min(policy.max_delay),
            None => base / 2 + (base / 2).mul_f64(unit.clamp(0.0, 1.0)),
        };
        let elapsed = now.saturating_duration_since(first);
        match policy.timeout.checked_sub(elapsed) {
            Some(left) if !left.is_zero() => Decision::Sleep(delay.min(left)),
            _ => Decision::Exhausted { elapsed },
        }
    }
}

/// A xorshift generator for jitter: spreading restarts needs no more than
/// that, and it keeps drainit free of a randomness dependency.
#[derive(Clone, Debug)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }

    /// A uniform draw from [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy(delay: u64, max: u64, timeout: u64) -> Policy {
        Policy { codes: vec![75], delay: ms(delay), max_delay: ms(max), timeout: ms(timeout) }
    }

    #[test]
    fn schedule_doubles_and_caps_with_jitter_in_half_to_full_base() {
        let p = policy(1000, 5000, 3_600_000);
        let t0 = Instant::now();
        // unit 0 gives base/2, unit just below 1 gives (almost) base.
        let bases = [1000, 2000, 4000, 5000, 5000];
        let mut low = Backoff::new(&p);
        let mut high = Backoff::new(&p);
        for base in bases {
            assert_eq!(low.next(&p, t0, None, 0.0), Decision::Sleep(ms(base / 2)));
            let Decision::Sleep(d) = high.next(&p, t0, None, 0.999_999) else { panic!() };
            assert!(d <= ms(base) && d > ms(base) - ms(1), "{d:?} for base {base}");
        }
    }

    #[test]
    fn requested_delay_wins_and_is_clamped_to_the_cap() {
        let p = policy(5000, 30_000, 3_600_000);
        let t0 = Instant::now();
        let mut b = Backoff::new(&p);
        assert_eq!(b.next(&p, t0, Some(ms(300)), 0.5), Decision::Sleep(ms(300)));
        assert_eq!(b.next(&p, t0, Some(ms(90_000)), 0.5), Decision::Sleep(ms(30_000)));
    }

    /// (elapsed since the first backoff exit, drawn sleep) -> decision, for a
    /// 2s budget: the last sleep is cut to end with the budget.
    #[test]
    fn the_budget_is_used_to_its_end() {
        let p = policy(800, 800, 2000);
        let t0 = Instant::now();
        for (at, want) in [
            (0, Decision::Sleep(ms(400))),
            (1600, Decision::Sleep(ms(400))),
            (1601, Decision::Sleep(ms(399))),
            (1999, Decision::Sleep(ms(1))),
            (2000, Decision::Exhausted { elapsed: ms(2000) }),
            (2500, Decision::Exhausted { elapsed: ms(2500) }),
        ] {
            let mut b = Backoff::new(&p);
            b.first_exit = Some(t0);
            assert_eq!(b.next(&p, t0 + ms(at), None, 0.0), want, "at {at}ms");
        }
    }

    #[test]
    fn a_base_above_the_cap_is_capped() {
        let p = policy(3000, 200, 3_600_000);
        let t0 = Instant::now();
        let mut b = Backoff::new(&p);
        assert_eq!(b.next(&p, t0, None, 0.0), Decision::Sleep(ms(100)));
        let Decision::Sleep(d) = b.next(&p, t0, None, 0.999_999) else { panic!() };
        assert!(d <= ms(200) && d > ms(199), "{d:?}");
    }

    #[test]
    fn zero_budget_exhausts_at_once() {
        let p = policy(1000, 1000, 0);
        let t0 = Instant::now();
        assert_eq!(Backoff::new(&p).next(&p, t0, None, 0.0), Decision::Exhausted { elapsed: ms(0) });
    }

    #[test]
    fn codes() {
        let p = Policy { codes: vec![75, 3], ..Policy::default() };
        assert!(p.wants_restart(Code(75)) && p.wants_restart(Code(3)));
        for other in [0, 1, 75 + 256, -1] {
            assert!(!p.wants_restart(Code(other)), "{other}");
        }
    }

    #[test]
    fn no_codes_restart_nothing() {
        let p = Policy { codes: Vec::new(), ..Policy::default() };
        for code in [0, 1, 75, 255, 256, -1] {
            assert!(!p.wants_restart(Code(code)), "{code}");
        }
    }

    #[test]
    fn jitter_is_uniform_enough_and_in_range() {
        let mut j = Jitter::new(42);
        let draws: Vec<f64> = (0..10_000).map(|_| j.unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }
}
