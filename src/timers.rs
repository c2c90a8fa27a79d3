//! Every deadline drainit keeps, as one table of named timers: the loop's
//! timeout is the table's next, and a timer that comes due is one input of
//! the supervisor. A new deadline is a new row here, not a field of a phase.

use std::time::Instant;

/// The named timers. The order is the order in which timers due at the same
/// instant fire: a held stop (and then a step of the stop sequence) goes out
/// before the grace deadline it belongs to is judged, and the kills before anything is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// The held stop signal reaches the worker's group.
    StopDelay,
    /// The next step of `--stop-sequence` reaches the worker's group.
    StopStep,
    /// The worker missed its `WATCHDOG=1`.
    Watchdog,
    /// The worker did not send `READY=1` in time.
    Ready,
    /// `--memory-check`: read the working set (drainit's one periodic
    /// wakeup, armed only with `--memory-stop` while the worker runs).
    MemoryCheck,
    /// The grace deadline: SIGKILL to whatever is left of the worker.
    Grace,
    /// The finish program's bound: SIGKILL to it and what it started.
    Finish,
    /// The end of a backoff sleep: the next attempt starts.
    Backoff,
}

impl Timer {
    pub const ALL: [Timer; 8] = [
        Timer::StopDelay,
        Timer::StopStep,
        Timer::Watchdog,
        Timer::Ready,
        Timer::MemoryCheck,
        Timer::Grace,
        Timer::Finish,
        Timer::Backoff,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// When each timer fires; a disarmed one has no instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timers {
    at: [Option<Instant>; Timer::ALL.len()],
    /// The soonest of `at`, kept as timers change: the loop asks for it
    /// every turn, a forwarded signal's among them, and timers change far
    /// less often.
    soonest: Option<Instant>,
}

impl Timers {
    pub fn arm(&mut self, timer: Timer, at: Instant) {
        self.set(timer, Some(at));
    }

    /// Arm `timer` at `at`, or keep it where it is when that is sooner.
    pub fn arm_by(&mut self, timer: Timer, at: Instant) {
        let at = self.get(timer).map_or(at, |now| now.min(at));
        self.set(timer, Some(at));
    }

    pub fn disarm(&mut self, timer: Timer) {
        if self.is_armed(timer) {
            self.set(timer, None);
        }
    }

    fn set(&mut self, timer: Timer, at: Option<Instant>) {
        self.at[timer.index()] = at;
        self.soonest = self.at.iter().flatten().min().copied();
    }

    pub fn get(&self, timer: Timer) -> Option<Instant> {
        self.at[timer.index()]
    }

    pub fn is_armed(&self, timer: Timer) -> bool {
        self.get(timer).is_some()
    }

    /// The soonest instant any timer fires at: the loop waits until then.
    pub fn next(&self) -> Option<Instant> {
        self.soonest
    }

    /// A timer due at `now` (the first in `Timer`'s order among the
    /// soonest) and the instant it was due at, disarmed: it fires once.
    pub fn take_due(&mut self, now: Instant) -> Option<(Timer, Instant)> {
        let soonest = self.next().filter(|at| *at <= now)?;
        let timer = Timer::ALL.into_iter().find(|t| self.get(*t) == Some(soonest))?;
        self.disarm(timer);
        Some((timer, soonest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// (armed as (timer, ms), now in ms) -> the timers that fire, in order.
    #[test]
    fn arm_disarm_due() {
        type Row = (&'static str, &'static [(Timer, u64)], &'static [Timer], u64, &'static [Timer]);
        let rows: &[Row] = &[
            ("nothing armed", &[], &[], 1000, &[]),
            ("not yet", &[(Timer::Grace, 500)], &[], 499, &[]),
            ("due at its instant", &[(Timer::Grace, 500)], &[], 500, &[Timer::Grace]),
            ("past", &[(Timer::Backoff, 10)], &[], 9000, &[Timer::Backoff]),
            ("disarmed", &[(Timer::Grace, 500)], &[Timer::Grace], 600, &[]),
            ("soonest first", &[(Timer::Backoff, 100), (Timer::Grace, 50)], &[], 200, &[Timer::Grace, Timer::Backoff]),
            (
                "same instant: the table's order",
                &[(Timer::Finish, 100), (Timer::Grace, 100), (Timer::StopStep, 100), (Timer::StopDelay, 100)],
                &[],
                100,
                &[Timer::StopDelay, Timer::StopStep, Timer::Grace, Timer::Finish],
            ),
            ("one of two due", &[(Timer::Watchdog, 100), (Timer::Ready, 300)], &[], 200, &[Timer::Watchdog]),
            ("re-armed: the last arm counts", &[(Timer::Grace, 100), (Timer::Grace, 900)], &[], 500, &[]),
        ];
        let t0 = Instant::now();
        for (name, armed, disarmed, now, fire) in rows {
            let mut timers = Timers::default();
            for (timer, at) in *armed {
                timers.arm(*timer, t0 + ms(*at));
            }
            for timer in *disarmed {
                timers.disarm(*timer);
            }
            let mut fired = Vec::new();
            while let Some((timer, _)) = timers.take_due(t0 + ms(*now)) {
                fired.push(timer);
            }
            assert_eq!(fired, *fire, "{name}");
            for timer in *fire {
                assert!(!timers.is_armed(*timer), "{name}: {timer:?} fires once");
            }
        }
    }

    #[test]
    fn next_is_the_soonest_armed() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        assert_eq!(timers.next(), None, "idle: the loop waits without a timeout");
        timers.arm(Timer::Backoff, t0 + ms(300));
        timers.arm(Timer::Watchdog, t0 + ms(200));
        assert_eq!(timers.next(), Some(t0 + ms(200)));
        timers.disarm(Timer::Watchdog);
        assert_eq!(timers.next(), Some(t0 + ms(300)));
    }

    #[test]
    fn arm_by_keeps_the_sooner() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        timers.arm_by(Timer::Finish, t0 + ms(300));
        assert_eq!(timers.get(Timer::Finish), Some(t0 + ms(300)), "unarmed: armed");
        timers.arm_by(Timer::Finish, t0 + ms(500));
        assert_eq!(timers.get(Timer::Finish), Some(t0 + ms(300)), "later: kept");
        timers.arm_by(Timer::Finish, t0 + ms(100));
        assert_eq!(timers.get(Timer::Finish), Some(t0 + ms(100)), "sooner: moved");
    }
}
