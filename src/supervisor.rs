//! The lifecycle as an explicit state machine: starting, running, stopping
//! with a deadline, draining what the worker left, backing off, exiting.
//! Every input is a value (a signal number, a reaped status, `now`), every
//! output an `Action` for the event loop to carry out, so each transition is
//! tested here without a process.

use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Decision, Jitter};
use crate::events::{Event, Outcome};
use crate::signals::{self, Rewrite, SIGKILL, SIGTERM, Signo};

/// What the event loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start attempt N; answer with `spawned` or `spawn_failed`.
    Spawn {
        attempt: u32,
    },
    /// Send to the worker's process group.
    Forward(Signo),
    /// Send to the group and everything else drainit is responsible for (as
    /// PID 1: the namespace; as subreaper: its descendants).
    SignalAll(Signo),
    /// The grace deadline passed: SIGKILL everything `SignalAll` reaches,
    /// and log `deadline_reached` with how many processes that was.
    Deadline,
    /// Read (and remove) the worker's retry-after file; answer with `retry_after`.
    ReadRetryAfter,
    Log(Event),
    Exit(i32),
}

#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Waiting for the event loop to answer `Spawn` (attempt `self.attempt`).
    Starting,
    Running {
        pid: i32,
        killed: bool,
    },
    /// The worker is gone; its leftovers were told to go, and drainit waits
    /// until it has no child left (or SIGKILLs them at the deadline).
    Draining {
        code: i32,
        deadline: Instant,
        killed: bool,
        then: Then,
    },
    Sleeping {
        until: Instant,
    },
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Then {
    Exit,
    /// The worker asked for a backoff with this code.
    Restart(i32),
}

/// Settings the lifecycle depends on.
#[derive(Clone, Debug)]
pub struct Policy {
    pub grace: Duration,
    pub rewrite: Rewrite,
    pub backoff: backoff::Policy,
}

#[derive(Debug)]
pub struct Supervisor {
    policy: Policy,
    phase: Phase,
    attempt: u32,
    /// When the grace clock, started by the first stop signal, runs out.
    stop_deadline: Option<Instant>,
    backoff: Backoff,
    jitter: Jitter,
    /// The worker's requested sleep, read from its retry-after file.
    requested: Option<Duration>,
}

impl Supervisor {
    pub fn new(policy: Policy, seed: u64) -> Supervisor {
        let backoff = Backoff::new(&policy.backoff);
        Supervisor {
            policy,
            phase: Phase::Starting,
            attempt: 1,
            stop_deadline: None,
            backoff,
            jitter: Jitter::new(seed),
            requested: None,
        }
    }

    pub fn start(&mut self) -> Vec<Action> {
        vec![Action::Spawn { attempt: self.attempt }]
    }

    pub fn spawned(&mut self, pid: i32) -> Vec<Action> {
        self.phase = Phase::Running { pid, killed: false };
        vec![Action::Log(Event::ChildStarted { pid, attempt: self.attempt })]
    }

    /// The command could not be executed (126/127) or fork failed (125).
    pub fn spawn_failed(&mut self, code: i32) -> Vec<Action> {
        self.finish(code)
    }

    /// When `timer` must run next, if any deadline is pending.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running { killed: false, .. } => self.stop_deadline,
            Phase::Draining { deadline, killed: false, .. } => Some(deadline),
            Phase::Sleeping { until } => Some(until),
            _ => None,
        }
    }

    pub fn signal(&mut self, sig: Signo, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let first_stop = signals::is_stop(sig) && self.stop_deadline.is_none();
        if first_stop {
            self.stop_deadline = Some(now + self.policy.grace);
            out.push(Action::Log(Event::StopRequested { signal: sig, grace: self.policy.grace }));
        }
        if let Phase::Draining { code, then: then @ Then::Restart(_), .. } = &mut self.phase
            && first_stop
        {
            // No restart after a stop: end as if stopped while asleep.
            *then = Then::Exit;
            *code = 128 + sig;
        }
        match self.phase {
            Phase::Running { .. } | Phase::Draining { .. } => {
                if let Some(to) = self.policy.rewrite.apply(sig) {
                    out.push(Action::Forward(to));
                }
            }
            Phase::Sleeping { .. } if signals::is_stop(sig) => out.extend(self.finish(128 + sig)),
            Phase::Sleeping { .. } => out.push(Action::Log(Event::SignalDropped { signal: sig })),
            Phase::Starting | Phase::Done => {}
        }
        out
    }

    /// A child was reaped: the worker, or an orphan drainit inherited.
    pub fn reaped(&mut self, pid: i32, outcome: Outcome, now: Instant) -> Vec<Action> {
        let Phase::Running { pid: worker, killed } = self.phase else {
            return vec![Action::Log(Event::Reaped { pid, outcome })];
        };
        if pid != worker {
            return vec![Action::Log(Event::Reaped { pid, outcome })];
        }
        let code = outcome.code();
        let mut out = vec![Action::Log(Event::ChildExited { pid, outcome })];
        if self.stop_deadline.is_none() && self.policy.backoff.wants_restart(code) {
            self.phase =
                Phase::Draining { code, deadline: now + self.policy.grace, killed: false, then: Then::Restart(code) };
            out.extend([Action::ReadRetryAfter, Action::SignalAll(SIGTERM)]);
            return out;
        }
        let deadline = self.stop_deadline.unwrap_or(now + self.policy.grace);
        let killed = killed || deadline <= now;
        self.phase = Phase::Draining { code, deadline, killed, then: Then::Exit };
        out.push(Action::SignalAll(if killed { SIGKILL } else { SIGTERM }));
        out
    }

    /// What the worker asked for in its retry-after file.
    pub fn retry_after(&mut self, requested: Option<Duration>) {
        self.requested = requested;
    }

    /// After a round of reaping: whether drainit still has children.
    pub fn children(&mut self, left: bool, now: Instant) -> Vec<Action> {
        let Phase::Draining { code, killed, then, .. } = self.phase else {
            return Vec::new();
        };
        match (left, then) {
            // Past the deadline, anything reparented to drainit since the
            // SIGKILL (a subreaper's escapees) gets one too.
            (true, _) if killed => vec![Action::SignalAll(SIGKILL)],
            (true, _) => Vec::new(),
            (false, Then::Exit) => self.finish(code),
            (false, Then::Restart(code)) => self.back_off(code, now),
        }
    }

    pub fn timer(&mut self, now: Instant) -> Vec<Action> {
        match &mut self.phase {
            Phase::Running { killed: killed @ false, .. } if self.stop_deadline.is_some_and(|d| d <= now) => {
                *killed = true;
                vec![Action::Deadline]
            }
            Phase::Draining { deadline, killed: killed @ false, .. } if *deadline <= now => {
                *killed = true;
                vec![Action::Deadline]
            }
            Phase::Sleeping { until } if *until <= now => {
                self.attempt += 1;
                self.phase = Phase::Starting;
                vec![Action::Spawn { attempt: self.attempt }]
            }
            _ => Vec::new(),
        }
    }

    fn back_off(&mut self, code: i32, now: Instant) -> Vec<Action> {
        let unit = self.jitter.unit();
        match self.backoff.next(&self.policy.backoff, now, self.requested.take(), unit) {
            Decision::Sleep(delay) => {
                self.phase = Phase::Sleeping { until: now + delay };
                vec![Action::Log(Event::Backoff { attempt: self.attempt, code, delay })]
            }
            Decision::Exhausted { elapsed } => {
                let mut out = vec![Action::Log(Event::BackoffExhausted { attempts: self.attempt, elapsed })];
                out.extend(self.finish(code));
                out
            }
        }
    }

    fn finish(&mut self, code: i32) -> Vec<Action> {
        self.phase = Phase::Done;
        vec![Action::Log(Event::Exit { code }), Action::Exit(code)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{SIGINT, SIGQUIT};
    use Action::*;

    const W: i32 = 100;
    const HUP: i32 = libc::SIGHUP;
    const USR1: i32 = libc::SIGUSR1;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn sup(rewrite: &[&str]) -> (Supervisor, Instant) {
        let policy = Policy {
            grace: ms(5000),
            rewrite: Rewrite::parse(rewrite.iter().copied()).unwrap(),
            backoff: backoff::Policy { codes: vec![75], delay: ms(1000), max_delay: ms(4000), timeout: ms(10_000) },
        };
        let mut s = Supervisor::new(policy, 7);
        assert_eq!(s.start(), vec![Spawn { attempt: 1 }]);
        assert_eq!(s.spawned(W), vec![Log(Event::ChildStarted { pid: W, attempt: 1 })]);
        (s, Instant::now())
    }

    fn exited(code: i32) -> Outcome {
        Outcome::Exited(code)
    }

    /// Keep only what reaches processes or ends drainit.
    fn effects(actions: Vec<Action>) -> Vec<Action> {
        actions.into_iter().filter(|a| !matches!(a, Log(_))).collect()
    }

    fn logs(actions: &[Action]) -> Vec<Event> {
        actions.iter().filter_map(|a| if let Log(e) = a { Some(e.clone()) } else { None }).collect()
    }

    #[test]
    fn forwards_every_signal_after_rewriting() {
        let (mut s, t) = sup(&["TERM:QUIT", "USR1:0"]);
        for (sig, want) in [(HUP, vec![Forward(HUP)]), (USR1, vec![]), (libc::SIGWINCH, vec![Forward(libc::SIGWINCH)])]
        {
            assert_eq!(effects(s.signal(sig, t)), want);
        }
        // A stop signal is judged before rewriting: TERM starts the clock and goes out as QUIT.
        let out = s.signal(SIGTERM, t);
        assert_eq!(logs(&out), vec![Event::StopRequested { signal: SIGTERM, grace: ms(5000) }]);
        assert_eq!(effects(out), vec![Forward(SIGQUIT)]);
        assert_eq!(s.next_deadline(), Some(t + ms(5000)));
    }

    #[test]
    fn grace_clock_starts_once() {
        let (mut s, t) = sup(&[]);
        s.signal(SIGINT, t);
        let out = s.signal(SIGTERM, t + ms(3000));
        assert_eq!(out, vec![Forward(SIGTERM)], "forwarded again, not logged, deadline kept");
        assert_eq!(s.next_deadline(), Some(t + ms(5000)));
    }

    #[test]
    fn clean_exit_after_stop() {
        let (mut s, t) = sup(&[]);
        s.signal(SIGTERM, t);
        assert_eq!(s.timer(t + ms(100)), vec![]);
        let out = s.reaped(W, exited(0), t + ms(200));
        assert_eq!(logs(&out), vec![Event::ChildExited { pid: W, outcome: exited(0) }]);
        assert_eq!(effects(out), vec![SignalAll(SIGTERM)]);
        assert_eq!(effects(s.children(false, t + ms(200))), vec![Exit(0)]);
    }

    #[test]
    fn deadline_kills_then_exits_with_the_workers_status() {
        let (mut s, t) = sup(&[]);
        s.signal(SIGTERM, t);
        assert_eq!(s.timer(t + ms(4999)), vec![]);
        assert_eq!(s.timer(t + ms(5000)), vec![Deadline]);
        assert_eq!(s.next_deadline(), None);
        assert_eq!(s.timer(t + ms(6000)), vec![], "deadline fires once");
        assert_eq!(effects(s.reaped(W, Outcome::Signaled(9), t + ms(5001))), vec![SignalAll(SIGKILL)]);
        let out = s.children(false, t + ms(5002));
        assert_eq!(out, vec![Log(Event::Exit { code: 137 }), Exit(137)]);
    }

    #[test]
    fn leftovers_get_term_then_kill_at_exit_plus_grace() {
        let (mut s, t) = sup(&[]);
        assert_eq!(effects(s.reaped(W, exited(3), t)), vec![SignalAll(SIGTERM)]);
        assert_eq!(s.children(true, t), vec![]);
        assert_eq!(s.next_deadline(), Some(t + ms(5000)));
        assert_eq!(s.timer(t + ms(5000)), vec![Deadline]);
        assert_eq!(s.children(true, t + ms(5001)), vec![SignalAll(SIGKILL)]);
        assert_eq!(effects(s.children(false, t + ms(5002))), vec![Exit(3)], "the worker's code, not 137");
    }

    #[test]
    fn leftovers_keep_the_deadline_of_a_stop_under_way() {
        let (mut s, t) = sup(&[]);
        s.signal(SIGTERM, t);
        s.reaped(W, exited(0), t + ms(1000));
        assert_eq!(s.next_deadline(), Some(t + ms(5000)));
    }

    #[test]
    fn orphans_are_reaped_and_logged_but_change_nothing() {
        let (mut s, t) = sup(&[]);
        let out = s.reaped(555, Outcome::Signaled(15), t);
        assert_eq!(out, vec![Log(Event::Reaped { pid: 555, outcome: Outcome::Signaled(15) })]);
        assert_eq!(s.children(true, t), vec![]);
        assert_eq!(effects(s.signal(HUP, t)), vec![Forward(HUP)]);
    }

    #[test]
    fn signals_after_the_worker_exit_still_reach_its_group() {
        let (mut s, t) = sup(&[]);
        s.reaped(W, exited(0), t);
        assert_eq!(effects(s.signal(USR1, t)), vec![Forward(USR1)]);
    }

    #[test]
    fn backoff_restarts_after_leftovers_are_gone() {
        let (mut s, t) = sup(&[]);
        let out = s.reaped(W, exited(75), t);
        assert_eq!(effects(out), vec![ReadRetryAfter, SignalAll(SIGTERM)]);
        s.retry_after(None);
        assert_eq!(s.children(true, t), vec![], "no sleep while a leftover lives");
        let out = s.children(false, t + ms(10));
        let [Log(Event::Backoff { attempt: 1, code: 75, delay })] = out.as_slice() else { panic!("{out:?}") };
        assert!(*delay >= ms(500) && *delay <= ms(1000));
        assert_eq!(s.next_deadline(), Some(t + ms(10) + *delay));
        assert_eq!(s.timer(t + ms(10) + *delay), vec![Spawn { attempt: 2 }]);
        assert_eq!(s.spawned(W + 1), vec![Log(Event::ChildStarted { pid: W + 1, attempt: 2 })]);
        s.reaped(W + 1, exited(0), t + ms(2000));
        assert_eq!(effects(s.children(false, t + ms(2000))), vec![Exit(0)]);
    }

    #[test]
    fn retry_after_sets_the_exact_sleep() {
        let (mut s, t) = sup(&[]);
        s.reaped(W, exited(75), t);
        s.retry_after(Some(ms(300)));
        let out = s.children(false, t);
        assert_eq!(out, vec![Log(Event::Backoff { attempt: 1, code: 75, delay: ms(300) })]);
    }

    #[test]
    fn backoff_budget_runs_out() {
        let (mut s, t) = sup(&[]);
        let mut now = t;
        for attempt in 1..=2 {
            s.reaped(W, exited(75), now);
            s.retry_after(Some(ms(4000)));
            let out = s.children(false, now);
            assert!(matches!(out[..], [Log(Event::Backoff { .. })]), "attempt {attempt}: {out:?}");
            now += ms(4000);
            assert_eq!(s.timer(now), vec![Spawn { attempt: attempt + 1 }]);
            s.spawned(W);
        }
        // 8s after the first backoff exit a 4s sleep would end at 12s > 10s.
        s.reaped(W, exited(75), now);
        s.retry_after(Some(ms(4000)));
        let out = s.children(false, now);
        assert_eq!(
            out,
            vec![
                Log(Event::BackoffExhausted { attempts: 3, elapsed: ms(8000) }),
                Log(Event::Exit { code: 75 }),
                Exit(75)
            ]
        );
    }

    #[test]
    fn stop_during_sleep_exits_at_once_and_other_signals_are_dropped() {
        let (mut s, t) = sup(&[]);
        s.reaped(W, exited(75), t);
        s.children(false, t);
        assert_eq!(s.signal(HUP, t), vec![Log(Event::SignalDropped { signal: HUP })]);
        let out = s.signal(SIGTERM, t);
        assert_eq!(effects(out), vec![Exit(143)]);
        assert_eq!(s.timer(t + ms(60_000)), vec![], "no restart after exit");
    }

    #[test]
    fn stop_while_draining_a_backoff_exit_does_not_restart() {
        let (mut s, t) = sup(&[]);
        s.reaped(W, exited(75), t);
        assert_eq!(effects(s.signal(SIGINT, t)), vec![Forward(SIGINT)]);
        assert_eq!(effects(s.children(false, t)), vec![Exit(130)]);
    }

    #[test]
    fn backoff_code_after_a_stop_is_final() {
        let (mut s, t) = sup(&[]);
        s.signal(SIGTERM, t);
        assert_eq!(effects(s.reaped(W, exited(75), t)), vec![SignalAll(SIGTERM)]);
        assert_eq!(effects(s.children(false, t)), vec![Exit(75)]);
    }

    #[test]
    fn zero_grace_kills_on_the_first_timer_check() {
        let (mut s, t) = sup(&[]);
        s.policy.grace = Duration::ZERO;
        s.signal(SIGTERM, t);
        assert_eq!(s.timer(t), vec![Deadline]);
    }

    #[test]
    fn spawn_failure_exits_with_its_code() {
        let policy = Policy { grace: ms(1), rewrite: Rewrite::default(), backoff: backoff::Policy::default() };
        let mut s = Supervisor::new(policy, 1);
        s.start();
        assert_eq!(s.spawn_failed(127), vec![Log(Event::Exit { code: 127 }), Exit(127)]);
    }
}
