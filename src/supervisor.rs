//! The lifecycle as an explicit state machine: starting, running, delaying a
//! stop, stopping with a deadline, draining what is left, sleeping before a
//! restart, finishing, done. Inputs are values (a signal number, a reaped
//! status, the answer to an action, the turn's `Now`); outputs are
//! `Action`s for the event loop to carry out. Nothing here makes a syscall,
//! so every transition is tested below as a table, without a process.

use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Decision, Jitter};
use crate::events::Event;
use crate::exit::{Code, Remap, Summary};
use crate::reap::Outcome;
use crate::signals::{self, Rewrite, SIGKILL, SIGTERM, Signo};

/// The time of one turn of the event loop, read at its first use and then
/// the same for every input of the turn. A signal that is only forwarded
/// never reads it, so the kill goes out before the clock is read: a read of
/// a clock that idled cold (the vDSO's data page, its cache lines) was ~2 us
/// of the forwarding latency (bench/RESULTS.md).
pub struct Now(Option<Instant>);

impl Now {
    pub fn unread() -> Now {
        Now(None)
    }

    #[cfg(test)]
    pub fn at(t: Instant) -> Now {
        Now(Some(t))
    }

    pub fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// What happened. Within one turn the event loop feeds them in this order,
/// which the transitions rely on: the answers to the actions of the input
/// before (`Spawned`, `SpawnFailed`, `RetryAfter`, `Killed`) come first, then
/// the signals read (each as it is read), then each reaped child, then
/// `Children` once a reaping round is complete, then `Tick`. So a signal
/// read in the same turn as the worker's exit is handled while the worker
/// still counts as running (it goes to what is left of its group). The
/// clock is read when an input first needs it (`Now`), at the latest by a
/// `Tick` with a deadline pending.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Answer to `Spawn` or `SpawnFinish`: the new process group's leader.
    Spawned(i32),
    /// Answer to `Spawn` or `SpawnFinish`: it could not start (the event
    /// loop has logged why).
    SpawnFailed(Code),
    Signal(Signo),
    Reaped(i32, Outcome),
    /// Answer to `ReadRetryAfter`: the sleep the worker asked for.
    RetryAfter(Option<Duration>),
    /// Answer to `Deadline`: how many processes the SIGKILL reached.
    Killed(usize),
    /// A reaping round is complete: whether drainit still has children.
    Children {
        left: bool,
    },
    /// The end of a turn: deadlines up to `now` are due (the clock is read
    /// only when one is pending).
    Tick,
}

/// What the event loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start attempt N of the worker; answered by `Spawned` / `SpawnFailed`.
    Spawn {
        attempt: u32,
    },
    /// Start the finish program; answered by `Spawned` / `SpawnFailed`.
    SpawnFinish(FinishEnv),
    /// Send to the current process group (the worker's, or the finish
    /// program's).
    Forward(Signo),
    /// Send to the group and everything else drainit answers for (as PID 1:
    /// the namespace; as subreaper: its descendants).
    SignalAll(Signo),
    /// The grace deadline passed: SIGKILL everything `SignalAll` reaches;
    /// answered by `Killed`.
    Deadline,
    /// Read (and remove) the worker's retry-after file; answered by `RetryAfter`.
    ReadRetryAfter,
    /// No restart can follow any more (a stop is under way): remove the
    /// retry-after file's directory now, while the worker stops, rather
    /// than on the exit path (an rmdir on a disk takes 0.2 ms and more).
    DropRetryAfter,
    /// Create the drain file, if one is configured.
    CreateDrainFile,
    Log(Event),
    /// Write the termination message and exit with `summary.code`.
    Exit(Summary),
}

/// What the finish program is told, in its environment.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishEnv {
    pub code: Code,
    pub worker: Outcome,
    pub deadline_reached: bool,
    pub stop: Option<Signo>,
    pub attempt: u32,
}

impl FinishEnv {
    /// The variables the contract names, with their values.
    pub fn vars(&self) -> [(&'static str, String); 5] {
        [
            ("DRAINIT_EXIT_CODE", self.code.0.to_string()),
            ("DRAINIT_WORKER_STATUS", self.worker.to_string()),
            ("DRAINIT_DEADLINE_REACHED", u8::from(self.deadline_reached).to_string()),
            ("DRAINIT_STOP_SIGNAL", self.stop.map_or_else(|| "none".to_string(), signals::name)),
            ("DRAINIT_ATTEMPT", self.attempt.to_string()),
        ]
    }
}

/// The code drainit will exit with, and what it was before `--remap-exit`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ending {
    code: Code,
    remapped_from: Option<Code>,
}

#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Waiting for the answer to `Spawn` (attempt `self.attempt`).
    Starting,
    Running {
        worker: i32,
    },
    /// A stop was requested; `held` reaches the worker at `until`.
    DelayingStop {
        worker: i32,
        held: Signo,
        until: Instant,
    },
    /// The stop went out; at `deadline` everything left is SIGKILLed.
    Stopping {
        worker: i32,
        deadline: Instant,
        killed: bool,
    },
    /// The worker (or the finish program) is gone; what it left was told to
    /// go, and drainit waits until it has no child (SIGKILL at `deadline`).
    Draining {
        deadline: Instant,
        killed: bool,
        then: Then,
    },
    Sleeping {
        until: Instant,
    },
    /// Waiting for the answer to `SpawnFinish`.
    StartingFinish {
        ending: Ending,
        bound: Instant,
    },
    /// The finish program runs; at `bound` it and what it started are SIGKILLed.
    Finishing {
        pid: i32,
        ending: Ending,
        bound: Instant,
        killed: bool,
    },
    Done,
}

/// What follows a drain.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Then {
    /// The worker asked for a backoff with this code.
    Restart(Code),
    /// The worker is done with this code: the finish program (if any), then exit.
    Finish(Code),
    /// The finish program is done: exit.
    Exit(Ending),
}

/// A stop request: the first stop signal and its grace deadline.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stop {
    signal: Signo,
    at: Instant,
    deadline: Instant,
}

/// Settings the lifecycle depends on.
#[derive(Clone, Debug)]
pub struct Policy {
    pub grace: Duration,
    pub orchestrator_timeout: Duration,
    pub rewrite: Rewrite,
    pub backoff: backoff::Policy,
    /// Zero: stop signals are forwarded at once.
    pub stop_delay: Duration,
    /// `--finish-timeout`, when a finish program is configured.
    pub finish_timeout: Option<Duration>,
    pub remap: Remap,
}

/// How long the finish program may still run once the grace deadline has
/// passed: up to this much before the orchestrator's SIGKILL.
const FINISH_MARGIN: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub struct Supervisor {
    policy: Policy,
    phase: Phase,
    attempt: u32,
    stop: Option<Stop>,
    backoff: Backoff,
    jitter: Jitter,
    /// The worker's requested sleep, read from its retry-after file.
    requested: Option<Duration>,
    /// How the last worker ended.
    worker: Option<Outcome>,
    deadline_reached: bool,
    killed: usize,
}

impl Supervisor {
    pub fn new(policy: Policy, seed: u64) -> Supervisor {
        let backoff = Backoff::new(&policy.backoff);
        Supervisor {
            policy,
            phase: Phase::Starting,
            attempt: 1,
            stop: None,
            backoff,
            jitter: Jitter::new(seed),
            requested: None,
            worker: None,
            deadline_reached: false,
            killed: 0,
        }
    }

    pub fn start(&mut self, out: &mut Vec<Action>) {
        out.push(Action::Spawn { attempt: self.attempt });
    }

    /// When `Tick` must come next, if any deadline is pending.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::DelayingStop { until, .. } | Phase::Sleeping { until } => Some(until),
            Phase::Stopping { deadline, killed: false, .. } | Phase::Draining { deadline, killed: false, .. } => {
                Some(deadline)
            }
            Phase::Finishing { bound, killed: false, .. } => Some(bound),
            _ => None,
        }
    }

    pub fn handle(&mut self, input: Input, now: &mut Now, out: &mut Vec<Action>) {
        match input {
            Input::Spawned(pid) => self.spawned(pid, out),
            Input::SpawnFailed(code) => match self.phase {
                // No worker ran: drainit's own code, never remapped, no finish program.
                Phase::Starting => self.exit(Ending { code, remapped_from: None }, now.get(), out),
                Phase::StartingFinish { ending, .. } => self.exit(ending, now.get(), out),
                _ => {}
            },
            Input::Signal(sig) => self.signal(sig, now, out),
            Input::Reaped(pid, outcome) => self.reaped(pid, outcome, now.get(), out),
            Input::RetryAfter(requested) => self.requested = requested,
            Input::Killed(count) => {
                self.deadline_reached = true;
                self.killed = count;
                out.push(Action::Log(Event::DeadlineReached { remaining: count }));
            }
            Input::Children { left } => self.children(left, now.get(), out),
            // Without a deadline a tick has nothing to do, and the clock is
            // not read: the turn of a forward ends sooner, and the worker,
            // perhaps woken on this CPU, runs sooner.
            Input::Tick if self.next_deadline().is_none() => {}
            Input::Tick => self.tick(now.get(), out),
        }
    }

    fn spawned(&mut self, pid: i32, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Starting => {
                self.phase = Phase::Running { worker: pid };
                out.push(Action::Log(Event::ChildStarted { pid, attempt: self.attempt }));
            }
            Phase::StartingFinish { ending, bound } => {
                self.phase = Phase::Finishing { pid, ending, bound, killed: false };
                out.push(Action::Log(Event::FinishStarted { pid }));
            }
            _ => {}
        }
    }

    /// What `sig` is rewritten to when forwarding it is all there is to do
    /// (Some(None): --rewrite drops it); None when `handle` must decide: a
    /// first stop, a stop during the delay, no worker or finish program to
    /// receive it. The event loop sends these the moment it reads them.
    pub fn only_forwarded(&self, sig: Signo) -> Option<Option<Signo>> {
        let stop = signals::is_stop(sig);
        match self.phase {
            _ if stop && self.stop.is_none() => None,
            Phase::DelayingStop { .. } if stop => None,
            Phase::Running { .. }
            | Phase::DelayingStop { .. }
            | Phase::Stopping { .. }
            | Phase::Draining { .. }
            | Phase::Finishing { .. } => Some(self.policy.rewrite.apply(sig)),
            Phase::Sleeping { .. } | Phase::Starting | Phase::StartingFinish { .. } | Phase::Done => None,
        }
    }

    fn signal(&mut self, sig: Signo, now: &mut Now, out: &mut Vec<Action>) {
        if let Some(to) = self.only_forwarded(sig) {
            out.extend(to.map(Action::Forward));
            return;
        }
        if signals::is_stop(sig) && self.stop.is_none() {
            return self.first_stop(sig, now.get(), out);
        }
        match self.phase {
            Phase::DelayingStop { worker, .. } => {
                // An impatient second stop ends the delay, and goes out itself.
                self.forward_stop(sig, worker, now.get(), out);
            }
            Phase::Sleeping { .. } => out.push(Action::Log(Event::SignalDropped { signal: sig })),
            _ => {}
        }
    }

    fn first_stop(&mut self, sig: Signo, now: Instant, out: &mut Vec<Action>) {
        let stop = Stop { signal: sig, at: now, deadline: now + self.policy.grace };
        self.stop = Some(stop);
        let delay = self.policy.stop_delay;
        let delayed = matches!(self.phase, Phase::Running { .. }) && !delay.is_zero();
        let event = Event::StopRequested { signal: sig, grace: self.policy.grace, delay: delayed.then_some(delay) };
        out.extend([Action::Log(event), Action::CreateDrainFile]);
        match &mut self.phase {
            Phase::Running { worker } if delayed => {
                self.phase = Phase::DelayingStop { worker: *worker, held: sig, until: now + delay };
            }
            Phase::Running { worker } => {
                self.phase = Phase::Stopping { worker: *worker, deadline: stop.deadline, killed: false };
                self.forward(sig, out);
            }
            Phase::Draining { then, .. } => {
                if let Then::Restart(_) = then {
                    // No restart after a stop: end as if stopped while asleep.
                    *then = Then::Finish(Code::signal(sig));
                }
                self.forward(sig, out);
            }
            Phase::Sleeping { .. } => self.end(Code::signal(sig), now, out),
            Phase::Finishing { bound, .. } => {
                *bound = (*bound).min(stop.deadline);
                self.forward(sig, out);
            }
            Phase::Starting | Phase::StartingFinish { .. } | Phase::DelayingStop { .. } => {}
            Phase::Stopping { .. } | Phase::Done => {}
        }
        // After the signal: the kill goes out first.
        if !matches!(self.phase, Phase::Done) {
            out.push(Action::DropRetryAfter);
        }
    }

    /// The stop signal reaches the worker: the delay (if any) is over.
    fn forward_stop(&mut self, sig: Signo, worker: i32, now: Instant, out: &mut Vec<Action>) {
        let Some(stop) = self.stop else { return };
        if let Some(to) = self.policy.rewrite.apply(sig) {
            out.push(Action::Forward(to));
            out.push(Action::Log(Event::StopForwarded { signal: to, waited: now.saturating_duration_since(stop.at) }));
        }
        self.phase = Phase::Stopping { worker, deadline: stop.deadline, killed: false };
    }

    fn forward(&self, sig: Signo, out: &mut Vec<Action>) {
        if let Some(to) = self.policy.rewrite.apply(sig) {
            out.push(Action::Forward(to));
        }
    }

    /// A child was reaped: the worker, the finish program, or an orphan.
    fn reaped(&mut self, pid: i32, outcome: Outcome, now: Instant, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Running { worker } | Phase::DelayingStop { worker, .. } | Phase::Stopping { worker, .. }
                if pid == worker =>
            {
                self.worker_exited(pid, outcome, now, out)
            }
            Phase::Finishing { pid: finish, ending, bound, killed } if pid == finish => {
                out.push(Action::Log(Event::FinishExited { pid, outcome, timed_out: killed }));
                self.phase = Phase::Draining { deadline: bound, killed, then: Then::Exit(ending) };
                out.push(Action::SignalAll(if killed { SIGKILL } else { SIGTERM }));
            }
            _ => out.push(Action::Log(Event::Reaped { pid, outcome })),
        }
    }

    fn worker_exited(&mut self, pid: i32, outcome: Outcome, now: Instant, out: &mut Vec<Action>) {
        self.worker = Some(outcome);
        out.push(Action::Log(Event::ChildExited { pid, outcome }));
        let code = outcome.code();
        let Some(stop) = self.stop else {
            let deadline = now + self.policy.grace;
            if self.policy.backoff.wants_restart(code) {
                self.phase = Phase::Draining { deadline, killed: false, then: Then::Restart(code) };
                out.push(Action::ReadRetryAfter);
            } else {
                self.phase = Phase::Draining { deadline, killed: false, then: Then::Finish(code) };
            }
            out.push(Action::SignalAll(SIGTERM));
            return;
        };
        // What is left keeps the deadline of the stop under way; a worker
        // that exits during the stop delay ends the delay, and its leftovers
        // get the usual SIGTERM, not the held signal.
        let killed = matches!(self.phase, Phase::Stopping { killed: true, .. }) || stop.deadline <= now;
        self.phase = Phase::Draining { deadline: stop.deadline, killed, then: Then::Finish(code) };
        out.push(Action::SignalAll(if killed { SIGKILL } else { SIGTERM }));
    }

    fn children(&mut self, left: bool, now: Instant, out: &mut Vec<Action>) {
        let Phase::Draining { killed, then, .. } = self.phase else { return };
        match (left, then) {
            // Past the deadline, anything reparented to drainit since the
            // SIGKILL (a subreaper's escapees) gets one too.
            (true, _) if killed => out.push(Action::SignalAll(SIGKILL)),
            (true, _) => {}
            (false, Then::Restart(code)) => self.back_off(code, now, out),
            (false, Then::Finish(code)) => self.end(code, now, out),
            (false, Then::Exit(ending)) => self.exit(ending, now, out),
        }
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        match &mut self.phase {
            Phase::DelayingStop { worker, held, until } if *until <= now => {
                let (worker, held) = (*worker, *held);
                self.forward_stop(held, worker, now, out);
                self.tick(now, out);
            }
            Phase::Stopping { deadline, killed: killed @ false, .. } if *deadline <= now => {
                *killed = true;
                out.push(Action::Deadline);
            }
            Phase::Draining { deadline, killed: killed @ false, then } if *deadline <= now => {
                *killed = true;
                // The finish program's leftovers are past its bound, not the grace.
                out.push(if let Then::Exit(_) = then { Action::SignalAll(SIGKILL) } else { Action::Deadline });
            }
            Phase::Finishing { bound, killed: killed @ false, .. } if *bound <= now => {
                *killed = true;
                out.push(Action::SignalAll(SIGKILL));
            }
            Phase::Sleeping { until } if *until <= now => {
                self.attempt += 1;
                self.phase = Phase::Starting;
                out.push(Action::Spawn { attempt: self.attempt });
            }
            _ => {}
        }
    }

    fn back_off(&mut self, code: Code, now: Instant, out: &mut Vec<Action>) {
        let unit = self.jitter.unit();
        match self.backoff.next(&self.policy.backoff, now, self.requested.take(), unit) {
            Decision::Sleep(delay) => {
                self.phase = Phase::Sleeping { until: now + delay };
                out.push(Action::Log(Event::Backoff { attempt: self.attempt, code: code.0, delay }));
            }
            Decision::Exhausted { elapsed } => {
                out.push(Action::Log(Event::BackoffExhausted { attempts: self.attempt, elapsed }));
                self.end(code, now, out);
            }
        }
    }

    /// drainit is done with the worker and will exit with `code` (remapped):
    /// first the finish program, when there is one.
    fn end(&mut self, code: Code, now: Instant, out: &mut Vec<Action>) {
        let remapped = self.policy.remap.apply(code);
        let ending = Ending { code: remapped.unwrap_or(code), remapped_from: remapped.map(|_| code) };
        let (Some(timeout), Some(worker)) = (self.policy.finish_timeout, self.worker) else {
            return self.exit(ending, now, out);
        };
        let bound = match self.stop {
            Some(stop) if stop.deadline > now => stop.deadline,
            Some(stop) => (stop.at + self.policy.orchestrator_timeout).checked_sub(FINISH_MARGIN).unwrap_or(now),
            None => now + timeout,
        };
        self.phase = Phase::StartingFinish { ending, bound };
        out.push(Action::SpawnFinish(FinishEnv {
            code: ending.code,
            worker,
            deadline_reached: self.deadline_reached,
            stop: self.stop.map(|s| s.signal),
            attempt: self.attempt,
        }));
    }

    fn exit(&mut self, ending: Ending, now: Instant, out: &mut Vec<Action>) {
        self.phase = Phase::Done;
        let Ending { code, remapped_from } = ending;
        out.push(Action::Log(Event::Exit { code: code.0, remapped_from: remapped_from.map(|c| c.0) }));
        out.push(Action::Exit(Summary {
            code,
            remapped_from,
            worker: self.worker,
            deadline_reached: self.deadline_reached,
            killed: self.killed,
            stop: self.stop.map(|s| (s.signal, now.saturating_duration_since(s.at))),
            attempts: self.attempt,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{SIGINT, SIGQUIT};
    use Input::*;

    const W: i32 = 100;
    const F: i32 = 200;
    const ORPHAN: i32 = 555;
    const HUP: i32 = libc::SIGHUP;
    const USR1: i32 = libc::SIGUSR1;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy() -> Policy {
        Policy {
            grace: ms(5000),
            orchestrator_timeout: ms(7000),
            rewrite: Rewrite::default(),
            backoff: backoff::Policy { codes: vec![75], delay: ms(1000), max_delay: ms(4000), timeout: ms(10_000) },
            stop_delay: Duration::ZERO,
            finish_timeout: None,
            remap: Remap::default(),
        }
    }

    /// A supervisor and the instant its story starts at.
    struct Story {
        s: Supervisor,
        t: Instant,
    }

    impl Story {
        fn new(policy: Policy) -> Story {
            let mut s = Supervisor::new(policy, 7);
            let mut out = Vec::new();
            s.start(&mut out);
            assert_eq!(out, vec![Action::Spawn { attempt: 1 }]);
            Story { s, t: Instant::now() }
        }

        /// Feed `input` at t + `at` ms; the actions, briefly.
        fn feed(&mut self, at: u64, input: Input) -> Vec<String> {
            let mut out = Vec::new();
            self.s.handle(input, &mut Now::at(self.t + ms(at)), &mut out);
            out.iter().map(brief).collect()
        }

        fn feed_all(&mut self, steps: &[(u64, Input)]) {
            for (at, input) in steps {
                self.feed(*at, input.clone());
            }
        }

        fn phase(&self) -> &'static str {
            match self.s.phase {
                Phase::Starting => "starting",
                Phase::Running { .. } => "running",
                Phase::DelayingStop { .. } => "delaying_stop",
                Phase::Stopping { .. } => "stopping",
                Phase::Draining { .. } => "draining",
                Phase::Sleeping { .. } => "sleeping",
                Phase::StartingFinish { .. } => "starting_finish",
                Phase::Finishing { .. } => "finishing",
                Phase::Done => "done",
            }
        }

        fn deadline(&self) -> Option<Duration> {
            self.s.next_deadline().map(|d| d - self.t)
        }
    }

    /// One action, as the tables spell it: `forward SIGHUP`, `log stop_requested`.
    fn brief(a: &Action) -> String {
        match a {
            Action::Spawn { attempt } => format!("spawn {attempt}"),
            Action::SpawnFinish(env) => format!("spawn_finish code={}", env.code.0),
            Action::Forward(sig) => format!("forward {}", signals::name(*sig)),
            Action::SignalAll(sig) => format!("all {}", signals::name(*sig)),
            Action::Deadline => "deadline".into(),
            Action::ReadRetryAfter => "read_retry_after".into(),
            Action::DropRetryAfter => "drop_retry_after".into(),
            Action::CreateDrainFile => "drain_file".into(),
            Action::Log(e) => {
                format!("log {}", e.to_string().split(' ').next().unwrap_or("").trim_start_matches("event="))
            }
            Action::Exit(s) => format!("exit {}", s.code.0),
        }
    }

    fn exited(code: i32) -> Outcome {
        Outcome::Exited(code)
    }

    // The named starting points of the table: each is reached from the
    // start by real inputs, at t + 0 unless said otherwise.
    fn running(p: Policy) -> Story {
        let mut st = Story::new(p);
        st.feed(0, Spawned(W));
        st
    }
    fn delaying() -> Story {
        let mut st = running(Policy { stop_delay: ms(2000), ..policy() });
        st.feed(0, Signal(SIGTERM));
        st
    }
    fn stopping() -> Story {
        let mut st = running(policy());
        st.feed(0, Signal(SIGTERM));
        st
    }
    fn killed() -> Story {
        let mut st = stopping();
        st.feed(5000, Tick);
        st.feed(5000, Killed(2));
        st
    }
    fn draining(p: Policy, code: i32) -> Story {
        let mut st = running(p);
        st.feed(0, Reaped(W, exited(code)));
        st
    }
    fn sleeping() -> Story {
        let mut st = draining(policy(), 75);
        st.feed_all(&[(0, RetryAfter(Some(ms(300)))), (0, Children { left: false })]);
        st
    }
    fn with_finish() -> Policy {
        Policy { finish_timeout: Some(ms(3000)), ..policy() }
    }
    fn finishing() -> Story {
        let mut st = draining(with_finish(), 4);
        st.feed_all(&[(0, Children { left: false }), (0, Spawned(F))]);
        st
    }

    /// The event loop sends what `only_forwarded` names without feeding the
    /// signal, so `handle` must do nothing more with it: no other action,
    /// no change of phase (the table above says which phases forward what).
    #[test]
    fn a_plain_forward_is_all_handle_does_with_the_signal() {
        fn rewriting() -> Policy {
            Policy { rewrite: Rewrite::parse(["USR2:0", "TERM:QUIT", "HUP:INT"]).unwrap(), ..policy() }
        }
        type Start = (&'static str, fn() -> Story);
        let starts: &[Start] = &[
            ("starting", || Story::new(policy())),
            ("running", || running(policy())),
            ("running, rewriting", || running(rewriting())),
            ("delaying", delaying),
            ("stopping", stopping),
            ("killed", killed),
            ("draining", || draining(policy(), 3)),
            ("draining a backoff exit", || draining(policy(), 75)),
            ("sleeping", sleeping),
            ("finishing", finishing),
        ];
        for (name, start) in starts {
            for sig in [HUP, SIGINT, SIGQUIT, SIGTERM, USR1, libc::SIGUSR2, libc::SIGWINCH, 40, 64] {
                let mut st = start();
                let plain = st.s.only_forwarded(sig);
                let (before, actions) = (st.phase(), st.feed(10, Signal(sig)));
                if let Some(to) = plain {
                    let want: Vec<String> = to.map(|to| format!("forward {}", signals::name(to))).into_iter().collect();
                    assert_eq!(actions, want, "{name}, {}", signals::name(sig));
                    assert_eq!(st.phase(), before, "{name}, {}: a plain forward changed the phase", signals::name(sig));
                }
            }
        }
    }

    /// phase x input -> actions + phase. Times in ms after the story's start;
    /// the grace is 5s, the orchestrator timeout 7s, the stop delay (where
    /// set) 2s, the finish timeout (where set) 3s.
    #[test]
    fn transitions() {
        type Row = (&'static str, fn() -> Story, u64, Input, &'static [&'static str], &'static str);
        let rows: &[Row] = &[
            // starting
            ("first start", || Story::new(policy()), 0, Spawned(W), &["log child_started"], "running"),
            ("exec failure", || Story::new(policy()), 0, SpawnFailed(Code(127)), &["log exit", "exit 127"], "done"),
            // running
            ("signal", || running(policy()), 0, Signal(HUP), &["forward SIGHUP"], "running"),
            (
                "stop",
                || running(policy()),
                0,
                Signal(SIGTERM),
                &["log stop_requested", "drain_file", "forward SIGTERM", "drop_retry_after"],
                "stopping",
            ),
            (
                "stop, delayed",
                || running(Policy { stop_delay: ms(2000), ..policy() }),
                0,
                Signal(SIGINT),
                &["log stop_requested", "drain_file", "drop_retry_after"],
                "delaying_stop",
            ),
            ("exit", || running(policy()), 0, Reaped(W, exited(3)), &["log child_exited", "all SIGTERM"], "draining"),
            (
                "backoff exit",
                || running(policy()),
                0,
                Reaped(W, exited(75)),
                &["log child_exited", "read_retry_after", "all SIGTERM"],
                "draining",
            ),
            ("orphan", || running(policy()), 0, Reaped(ORPHAN, exited(0)), &["log reaped"], "running"),
            ("no deadline yet", || running(policy()), 60_000, Tick, &[], "running"),
            // delaying a stop
            ("signal in delay", delaying, 500, Signal(USR1), &["forward SIGUSR1"], "delaying_stop"),
            ("second stop", delaying, 500, Signal(SIGTERM), &["forward SIGTERM", "log stop_forwarded"], "stopping"),
            ("delay not over", delaying, 1999, Tick, &[], "delaying_stop"),
            ("delay over", delaying, 2000, Tick, &["forward SIGTERM", "log stop_forwarded"], "stopping"),
            ("exit in delay", delaying, 500, Reaped(W, exited(0)), &["log child_exited", "all SIGTERM"], "draining"),
            // stopping
            ("stop again", stopping, 100, Signal(SIGQUIT), &["forward SIGQUIT"], "stopping"),
            ("before deadline", stopping, 4999, Tick, &[], "stopping"),
            ("deadline", stopping, 5000, Tick, &["deadline"], "stopping"),
            ("killed count", stopping, 5000, Killed(3), &["log deadline_reached"], "stopping"),
            ("exit in stop", stopping, 100, Reaped(W, exited(0)), &["log child_exited", "all SIGTERM"], "draining"),
            (
                "killed worker",
                killed,
                5001,
                Reaped(W, Outcome::Signaled(9)),
                &["log child_exited", "all SIGKILL"],
                "draining",
            ),
            ("deadline once", killed, 6000, Tick, &[], "stopping"),
            // draining
            ("leftovers live", || draining(policy(), 3), 10, Children { left: true }, &[], "draining"),
            ("leftovers gone", || draining(policy(), 3), 10, Children { left: false }, &["log exit", "exit 3"], "done"),
            ("leftovers past deadline", || draining(policy(), 3), 5000, Tick, &["deadline"], "draining"),
            ("signal to leftovers", || draining(policy(), 3), 10, Signal(USR1), &["forward SIGUSR1"], "draining"),
            (
                "stop while draining a backoff exit",
                || draining(policy(), 75),
                10,
                Signal(SIGINT),
                &["log stop_requested", "drain_file", "forward SIGINT", "drop_retry_after"],
                "draining",
            ),
            ("backoff", || draining(policy(), 75), 10, Children { left: false }, &["log backoff"], "sleeping"),
            (
                "to the finish program",
                || draining(with_finish(), 4),
                10,
                Children { left: false },
                &["spawn_finish code=4"],
                "starting_finish",
            ),
            // sleeping
            ("signal in sleep", sleeping, 100, Signal(HUP), &["log signal_dropped"], "sleeping"),
            (
                "stop in sleep",
                sleeping,
                100,
                Signal(SIGTERM),
                &["log stop_requested", "drain_file", "log exit", "exit 143"],
                "done",
            ),
            ("wake", sleeping, 300, Tick, &["spawn 2"], "starting"),
            // finishing
            (
                "finish started",
                || {
                    let mut st = draining(with_finish(), 4);
                    st.feed(0, Children { left: false });
                    st
                },
                0,
                Spawned(F),
                &["log finish_started"],
                "finishing",
            ),
            (
                "finish cannot start",
                || {
                    let mut st = draining(with_finish(), 4);
                    st.feed(0, Children { left: false });
                    st
                },
                0,
                SpawnFailed(Code(126)),
                &["log exit", "exit 4"],
                "done",
            ),
            ("finish exits", finishing, 100, Reaped(F, exited(9)), &["log finish_exited", "all SIGTERM"], "draining"),
            (
                "stop in finish",
                finishing,
                100,
                Signal(SIGTERM),
                &["log stop_requested", "drain_file", "forward SIGTERM", "drop_retry_after"],
                "finishing",
            ),
            ("finish bound", finishing, 3000, Tick, &["all SIGKILL"], "finishing"),
        ];
        for (name, start, at, input, want, phase) in rows {
            let mut st = start();
            let got = st.feed(*at, input.clone());
            assert_eq!(got, *want, "{name}: actions");
            assert_eq!(st.phase(), *phase, "{name}: phase");
        }
    }

    #[test]
    fn rewriting_is_applied_after_the_stop_is_judged() {
        let mut st = running(Policy { rewrite: Rewrite::parse(["TERM:QUIT", "USR1:0"]).unwrap(), ..policy() });
        assert_eq!(st.feed(0, Signal(USR1)), Vec::<String>::new());
        assert_eq!(
            st.feed(0, Signal(SIGTERM)),
            ["log stop_requested", "drain_file", "forward SIGQUIT", "drop_retry_after"]
        );
        assert_eq!(st.deadline(), Some(ms(5000)));
    }

    #[test]
    fn the_grace_clock_starts_once() {
        let mut st = stopping();
        assert_eq!(st.feed(3000, Signal(SIGINT)), ["forward SIGINT"], "forwarded, not logged, no new drain file");
        assert_eq!(st.deadline(), Some(ms(5000)));
    }

    #[test]
    fn a_stop_delay_keeps_the_deadline_of_the_stop() {
        let mut st = delaying();
        assert_eq!(st.deadline(), Some(ms(2000)), "the delay's own timer");
        let mut out = Vec::new();
        st.s.handle(Tick, &mut Now::at(st.t + ms(2000)), &mut out);
        assert_eq!(
            out[1],
            Action::Log(Event::StopForwarded { signal: SIGTERM, waited: ms(2000) }),
            "waited from the stop request"
        );
        assert_eq!(st.deadline(), Some(ms(5000)), "stop + grace, not stop + delay + grace");
        assert_eq!(st.feed(5000, Tick), ["deadline"]);
    }

    #[test]
    fn the_delay_is_logged_with_the_stop() {
        let mut st = running(Policy { stop_delay: ms(2000), ..policy() });
        let mut out = Vec::new();
        st.s.handle(Signal(SIGTERM), &mut Now::at(st.t), &mut out);
        assert_eq!(
            out[0],
            Action::Log(Event::StopRequested { signal: SIGTERM, grace: ms(5000), delay: Some(ms(2000)) })
        );
    }

    #[test]
    fn a_stop_after_the_worker_exited_is_not_delayed() {
        let mut st = draining(Policy { stop_delay: ms(2000), ..policy() }, 0);
        assert_eq!(
            st.feed(10, Signal(SIGTERM)),
            ["log stop_requested", "drain_file", "forward SIGTERM", "drop_retry_after"]
        );
    }

    #[test]
    fn a_rewrite_that_drops_the_held_stop_sends_nothing() {
        let mut st = running(Policy { stop_delay: ms(1000), rewrite: Rewrite::parse(["TERM:0"]).unwrap(), ..policy() });
        st.feed(0, Signal(SIGTERM));
        assert_eq!(st.feed(1000, Tick), Vec::<String>::new());
        assert_eq!(st.phase(), "stopping");
    }

    #[test]
    fn deadline_kill_then_exit_with_the_workers_status() {
        let mut st = killed();
        st.feed(5001, Reaped(W, Outcome::Signaled(9)));
        let mut out = Vec::new();
        st.s.handle(Children { left: false }, &mut Now::at(st.t + ms(5002)), &mut out);
        assert_eq!(out[0], Action::Log(Event::Exit { code: 137, remapped_from: None }));
        assert_eq!(
            out[1],
            Action::Exit(Summary {
                code: Code(137),
                remapped_from: None,
                worker: Some(Outcome::Signaled(9)),
                deadline_reached: true,
                killed: 2,
                stop: Some((SIGTERM, ms(5002))),
                attempts: 1,
            })
        );
    }

    #[test]
    fn leftovers_get_term_then_kill_at_exit_plus_grace() {
        let mut st = draining(policy(), 3);
        assert_eq!(st.deadline(), Some(ms(5000)));
        assert_eq!(st.feed(5000, Tick), ["deadline"]);
        assert_eq!(st.feed(5001, Children { left: true }), ["all SIGKILL"], "reparented escapees");
        assert_eq!(st.feed(5002, Children { left: false }), ["log exit", "exit 3"], "the worker's code, not 137");
    }

    #[test]
    fn leftovers_keep_the_deadline_of_a_stop_under_way() {
        let mut st = stopping();
        st.feed(1000, Reaped(W, exited(0)));
        assert_eq!(st.deadline(), Some(ms(5000)));
    }

    #[test]
    fn a_worker_exit_after_the_deadline_kills_its_leftovers_at_once() {
        let mut st = stopping();
        assert_eq!(st.feed(6000, Reaped(W, exited(0))), ["log child_exited", "all SIGKILL"]);
    }

    #[test]
    fn backoff_restarts_after_leftovers_are_gone() {
        let mut st = draining(policy(), 75);
        st.feed(0, RetryAfter(None));
        assert_eq!(st.feed(0, Children { left: true }), Vec::<String>::new(), "no sleep while a leftover lives");
        let mut out = Vec::new();
        st.s.handle(Children { left: false }, &mut Now::at(st.t + ms(10)), &mut out);
        let [Action::Log(Event::Backoff { attempt: 1, code: 75, delay })] = out.as_slice() else { panic!("{out:?}") };
        assert!(*delay >= ms(500) && *delay <= ms(1000));
        let wake = 10 + delay.as_millis() as u64;
        assert_eq!(st.deadline(), Some(ms(wake)));
        assert_eq!(st.feed(wake, Tick), ["spawn 2"]);
        assert_eq!(st.feed(wake, Spawned(W + 1)), ["log child_started"]);
        st.feed(wake + 100, Reaped(W + 1, exited(0)));
        assert_eq!(st.feed(wake + 100, Children { left: false }), ["log exit", "exit 0"]);
    }

    #[test]
    fn retry_after_sets_the_exact_sleep() {
        let mut st = draining(policy(), 75);
        st.feed(0, RetryAfter(Some(ms(300))));
        let mut out = Vec::new();
        st.s.handle(Children { left: false }, &mut Now::at(st.t), &mut out);
        assert_eq!(out, vec![Action::Log(Event::Backoff { attempt: 1, code: 75, delay: ms(300) })]);
    }

    #[test]
    fn the_backoff_budget_is_used_to_its_end() {
        // Budget 10s: sleeps of 4s at 0s and 4s, then one cut to 2s, then final.
        let mut st = running(policy());
        let mut now = 0;
        for (attempt, sleep) in [(1, 4000), (2, 4000), (3, 2000)] {
            st.feed_all(&[(now, Reaped(W, exited(75))), (now, RetryAfter(Some(ms(4000))))]);
            let mut out = Vec::new();
            st.s.handle(Children { left: false }, &mut Now::at(st.t + ms(now)), &mut out);
            assert_eq!(out, vec![Action::Log(Event::Backoff { attempt, code: 75, delay: ms(sleep) })]);
            now += sleep;
            st.feed_all(&[(now, Tick), (now, Spawned(W))]);
        }
        st.feed_all(&[(now, Reaped(W, exited(75))), (now, RetryAfter(None))]);
        assert_eq!(st.feed(now, Children { left: false }), ["log backoff_exhausted", "log exit", "exit 75"]);
    }

    #[test]
    fn a_backoff_code_after_a_stop_is_final() {
        let mut st = stopping();
        assert_eq!(st.feed(10, Reaped(W, exited(75))), ["log child_exited", "all SIGTERM"]);
        assert_eq!(st.feed(10, Children { left: false }), ["log exit", "exit 75"]);
    }

    #[test]
    fn a_stop_while_draining_a_backoff_exit_ends_with_its_code() {
        let mut st = draining(policy(), 75);
        st.feed(10, Signal(SIGINT));
        assert_eq!(st.feed(10, Children { left: false }), ["log exit", "exit 130"]);
    }

    #[test]
    fn zero_grace_kills_on_the_first_tick() {
        let mut st = running(Policy { grace: Duration::ZERO, ..policy() });
        st.feed(0, Signal(SIGTERM));
        assert_eq!(st.feed(0, Tick), ["deadline"]);
    }

    #[test]
    fn remapping_applies_to_what_the_worker_caused() {
        let remap = || Policy { remap: Remap::parse(["143:0", "127:1", "75:3"]).unwrap(), ..policy() };
        let mut st = running(remap());
        st.feed(0, Reaped(W, Outcome::Signaled(SIGTERM)));
        let mut out = Vec::new();
        st.s.handle(Children { left: false }, &mut Now::at(st.t), &mut out);
        assert_eq!(out[0], Action::Log(Event::Exit { code: 0, remapped_from: Some(143) }));
        // Stop during a backoff sleep: 143, remapped.
        let mut st = draining(remap(), 75);
        st.feed_all(&[(0, RetryAfter(None)), (0, Children { left: false })]);
        assert_eq!(st.feed(100, Signal(SIGTERM)), ["log stop_requested", "drain_file", "log exit", "exit 0"]);
        // An exec failure is drainit's own code: never remapped.
        let mut st = Story::new(remap());
        assert_eq!(st.feed(0, SpawnFailed(Code(127))), ["log exit", "exit 127"]);
    }

    #[test]
    fn the_finish_program_is_told_how_the_worker_ended() {
        let mut st = running(with_finish());
        st.feed_all(&[(0, Signal(SIGTERM)), (5000, Tick), (5000, Killed(1)), (5001, Reaped(W, Outcome::Signaled(9)))]);
        let mut out = Vec::new();
        st.s.handle(Children { left: false }, &mut Now::at(st.t + ms(5002)), &mut out);
        assert_eq!(
            out,
            vec![Action::SpawnFinish(FinishEnv {
                code: Code(137),
                worker: Outcome::Signaled(9),
                deadline_reached: true,
                stop: Some(SIGTERM),
                attempt: 1,
            })]
        );
    }

    #[test]
    fn the_finish_program_runs_once_after_the_last_attempt() {
        let mut st = running(with_finish());
        st.feed_all(&[(0, Reaped(W, exited(75))), (0, RetryAfter(Some(ms(100))))]);
        assert_eq!(st.feed(0, Children { left: false }), ["log backoff"], "not between attempts");
        st.feed_all(&[(100, Tick), (100, Spawned(W + 1)), (200, Reaped(W + 1, exited(4)))]);
        assert_eq!(st.feed(200, Children { left: false }), ["spawn_finish code=4"]);
        st.feed_all(&[(200, Spawned(F)), (300, Reaped(F, exited(0)))]);
        assert_eq!(st.feed(300, Children { left: false }), ["log exit", "exit 4"], "its own code changes nothing");
    }

    /// (stop, when the worker's drain ends) -> the finish program's bound.
    #[test]
    fn the_finish_programs_bound() {
        // No stop: the finish timeout (3s) from its start.
        let st = finishing();
        assert_eq!(st.deadline(), Some(ms(3000)));
        // A stop under way: its grace deadline.
        let mut st = running(with_finish());
        st.feed_all(&[(0, Signal(SIGTERM)), (1000, Reaped(W, exited(0))), (1000, Children { left: false })]);
        st.feed(1000, Spawned(F));
        assert_eq!(st.deadline(), Some(ms(5000)));
        // The deadline already passed: orchestrator timeout (7s) minus 500ms.
        let mut st = killed();
        st.s.policy.finish_timeout = Some(ms(3000));
        st.feed_all(&[(5001, Reaped(W, Outcome::Signaled(9))), (5002, Children { left: false }), (5002, Spawned(F))]);
        assert_eq!(st.deadline(), Some(ms(6500)));
        // A stop while it runs: the earlier of its bound and the grace deadline.
        let mut st = finishing();
        st.feed(100, Signal(SIGTERM));
        assert_eq!(st.deadline(), Some(ms(3000)));
    }

    #[test]
    fn a_finish_program_killed_at_its_bound_says_so() {
        let mut st = finishing();
        st.feed(3000, Tick);
        let mut out = Vec::new();
        st.s.handle(Reaped(F, Outcome::Signaled(9)), &mut Now::at(st.t + ms(3001)), &mut out);
        assert_eq!(out[0], Action::Log(Event::FinishExited { pid: F, outcome: Outcome::Signaled(9), timed_out: true }));
        assert_eq!(st.feed(3001, Children { left: true }), ["all SIGKILL"]);
        assert_eq!(st.feed(3002, Children { left: false }), ["log exit", "exit 4"]);
    }

    #[test]
    fn the_finish_programs_leftovers_are_killed_at_its_bound_without_a_deadline_event() {
        let mut st = finishing();
        st.feed(100, Reaped(F, exited(0)));
        assert_eq!(st.feed(3000, Tick), ["all SIGKILL"]);
    }

    #[test]
    fn no_finish_program_when_no_worker_ran() {
        let mut st = Story::new(with_finish());
        assert_eq!(st.feed(0, SpawnFailed(Code(126))), ["log exit", "exit 126"]);
    }
}
