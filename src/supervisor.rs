//! The lifecycle as an explicit state machine: starting, running, delaying a
//! stop, stopping with a deadline, draining what is left, sleeping before a
//! restart, finishing, done. Inputs are values (a signal number, a reaped
//! status, a notify message, a timer that came due, the answer to an
//! action, the turn's `Now`); outputs are `Action`s for the event loop to
//! carry out. Every deadline is a row of `Timers`, never a field of a phase;
//! what happened is kept in one `Record`. Nothing here makes a syscall, so
//! every transition is tested below as a table, without a process.

use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Decision, Jitter};
use crate::cgroup;
use crate::events::Event;
use crate::exit::{Code, Outcome, Remap};
use crate::readiness::Readiness;
use crate::record::{Ending, Record, StopReason, StopRequest};
use crate::signals::{self, Rewrite, SIGKILL, SIGTERM, Signo};
use crate::state::Predecessor;
use crate::stop_sequence::StopSequence;
use crate::timers::{Timer, Timers};

/// The time of one turn of the event loop, read at its first use and then
/// the same for every input of the turn. A signal that is only forwarded
/// never reads it, so the kill goes out before the clock is read.
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
/// the signals read (each as it is read), then the notify messages, then
/// each reaped child, then `Children` once a reaping round is complete, then
/// each timer that is due. So a signal read in the same turn as the worker's
/// exit is handled while the worker still counts as running (it goes to what
/// is left of its group), and a ping read in the turn its watchdog comes due
/// is seen before the watchdog is judged.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Answer to `Spawn`, `SpawnFinish` or `SpawnSweep`: the new process group's leader.
    Spawned(i32),
    /// Answer to `Spawn`, `SpawnFinish` or `SpawnSweep`: it could not start (the event
    /// loop has logged why).
    SpawnFailed(Code),
    Signal(Signo),
    /// A notify message's assignment, from a process drainit answers for.
    Notify(Note),
    Reaped(i32, Outcome),
    /// Answer to `ReadRetryAfter`: the sleep the worker asked for.
    RetryAfter(Option<Duration>),
    /// Answer to `Deadline`: how many processes the SIGKILL reached.
    Killed(usize),
    /// A reaping round is complete: whether drainit still has children.
    Children {
        left: bool,
    },
    /// A timer came due (`take_due`), at the instant it names.
    Timer(Timer, Instant),
    /// The cgroup's OOM-kill count rose: `total` kills since drainit
    /// started. Fed before the turn's reaped children, so that a worker the
    /// OOM killer took is known as such when it is reaped.
    OomKills(u64),
    /// The cgroup's `memory.events` changed (v2): a time to read the usage.
    MemoryEvent,
    /// Answer to `ReadUsage`: the working set and the limit, in bytes (no
    /// answer when it could not be read).
    Usage {
        used: u64,
        limit: u64,
    },
}

/// What a notify message can say to drainit (systemd's protocol).
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    Ready,
    Reloading,
    Stopping,
    /// `WATCHDOG=1`.
    Ping,
    /// `WATCHDOG=trigger`.
    Trigger,
    /// `WATCHDOG_USEC=N`.
    Interval(Duration),
    /// `EXTEND_TIMEOUT_USEC=N`.
    Extend(Duration),
    Status(String),
}

/// What drainit tells an outer notify socket (its own supervisor's).
#[derive(Clone, Debug, PartialEq)]
pub enum Tell {
    Ready,
    Reloading,
    Stopping,
    Watchdog,
    Status(String),
}

/// What the event loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start attempt N of the worker; answered by `Spawned` / `SpawnFailed`.
    Spawn {
        attempt: u32,
    },
    /// Start the finish program, its environment read off the record;
    /// answered by `Spawned` / `SpawnFailed`.
    SpawnFinish(Box<Record>),
    /// Start the finish program for a predecessor that died without its
    /// exit (the sweep, before the first attempt); answered by `Spawned` /
    /// `SpawnFailed`.
    SpawnSweep(Predecessor),
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
    /// Read the cgroup's working set; answered by `Usage`.
    ReadUsage,
    /// Create the drain file, if one is configured.
    CreateDrainFile,
    /// Create the ready file, if one is configured.
    CreateReadyFile,
    /// Remove the ready file, if one is configured.
    RemoveReadyFile,
    /// Send to the outer notify socket, if there is one.
    Tell(Tell),
    /// The stop has begun and no restart follows it: what only a restart
    /// reads (the retry-after file) is read no more, and drainit, on its
    /// way out, asks for the scheduler's shortest slice (its deadline must
    /// win the CPU). Comes after the stop signal when that goes out at
    /// once, so that what the loop does with it never delays the signal.
    NoRestart,
    Log(Event),
    /// Write the termination message and exit with the record's code.
    /// The record is boxed here and in `SpawnFinish`: every action is moved
    /// through the loop, a forward's among them, and the record is most of
    /// an action's size.
    Exit(Box<Record>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Waiting for the answer to `SpawnSweep`.
    StartingSweep,
    /// The finish program runs for the predecessor, before the first
    /// attempt; bounded as `Finishing` is.
    Sweeping {
        pid: i32,
    },
    /// Waiting for the answer to `Spawn` (attempt `record.attempt`).
    Starting,
    Running {
        worker: i32,
    },
    /// A stop was requested; `held` reaches the worker when `StopDelay` fires.
    DelayingStop {
        worker: i32,
        held: Signo,
    },
    /// The stop went out; when `Grace` fires, everything left is SIGKILLed.
    Stopping {
        worker: i32,
    },
    /// The worker (or the finish program) is gone; what it left was told to
    /// go, and drainit waits until it has no child.
    Draining {
        then: Then,
    },
    /// Until `Backoff` fires.
    Sleeping,
    /// Waiting for the answer to `SpawnFinish`.
    StartingFinish,
    /// The finish program runs; when `Finish` (or a stop's `Grace`) fires,
    /// it and what it started are SIGKILLed.
    Finishing {
        pid: i32,
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
    /// The finish program is done: exit with the record's ending.
    Exit,
    /// The sweep is done: the first attempt, or, after a stop, the exit.
    Start,
}

/// Settings the lifecycle depends on.
#[derive(Clone, Debug)]
pub struct Settings {
    pub grace: Duration,
    pub orchestrator_timeout: Duration,
    pub rewrite: Rewrite,
    pub backoff: backoff::Policy,
    /// Zero: stop signals are forwarded at once.
    pub stop_delay: Duration,
    /// `--finish-timeout`, when a finish program is configured.
    pub finish_timeout: Option<Duration>,
    pub remap: Remap,
    pub watchdog: Option<Duration>,
    pub ready_timeout: Option<Duration>,
    pub watchdog_signal: Signo,
    /// drainit has an outer notify socket to tell (`Tell` actions).
    pub outer: bool,
    /// The memory cgroup's OOM-kill counter was found (else its count is
    /// unknown).
    pub oom_counter: bool,
    /// `--oom-exit-code`.
    pub oom_exit_code: Option<Code>,
    /// `--memory-stop`'s percent, when a limit was found to take it of.
    pub memory_stop: Option<u8>,
    pub memory_check: Duration,
    /// `--stop-sequence`: its steps go out instead of the stop signal.
    pub stop_sequence: Option<StopSequence>,
    /// `--watchdog-signal` was given: with a stop sequence, a stop the
    /// watchdog or the ready timeout begins sends it as the first step.
    pub watchdog_signal_given: bool,
}

/// How long the finish program may still run once the grace deadline has
/// passed: up to this much before the orchestrator's SIGKILL.
const FINISH_MARGIN: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct Supervisor {
    settings: Settings,
    phase: Phase,
    timers: Timers,
    record: Record,
    backoff: Backoff,
    jitter: Jitter,
    /// The worker's requested sleep, read from its retry-after file.
    requested: Option<Duration>,
    /// What is left of the worker (or the finish program) gets SIGKILL
    /// now, not SIGTERM: its deadline or bound has passed.
    kill_sent: bool,
    /// The OOM-kill count rose while the current worker ran.
    oom_rose: bool,
    /// The reading that began a memory stop (`memory_stop`'s keys).
    over: (u64, u64),
    /// The predecessor to sweep up after, before the first attempt.
    sweep: Option<Predecessor>,
    /// The stop sequence under way: when it began (offsets count from
    /// then), the next step to send, and what its first step sends (the
    /// watchdog signal, for a stop the watchdog began). `Timer::StopStep`
    /// holds the next step's instant.
    sequence: Option<(Instant, usize, Option<Signo>)>,
    /// The running worker's readiness and watchdog.
    readiness: Readiness,
}

impl Supervisor {
    pub fn new(settings: Settings, seed: u64) -> Supervisor {
        let backoff = Backoff::new(&settings.backoff);
        let mut record = Record::new();
        record.oom_kills = settings.oom_counter.then_some(0);
        Supervisor {
            phase: Phase::Starting,
            timers: Timers::default(),
            record,
            backoff,
            jitter: Jitter::new(seed),
            requested: None,
            kill_sent: false,
            oom_rose: false,
            over: (0, 0),
            sweep: None,
            sequence: None,
            readiness: Readiness::new(&settings),
            settings,
        }
    }

    /// Begin with the sweep: the finish program, if there is one, runs for
    /// `predecessor` before the first attempt.
    pub fn sweep_first(&mut self, predecessor: Predecessor) {
        if self.settings.finish_timeout.is_some() {
            self.sweep = Some(predecessor);
        }
    }

    /// The OOM-kill counter was found after the start (its look waits for
    /// the first child): the count is known from now on, 0 so far.
    pub fn oom_counter_found(&mut self) {
        self.record.oom_kills.get_or_insert(0);
    }

    pub fn start(&mut self, out: &mut Vec<Action>) {
        match self.sweep.take() {
            Some(predecessor) => {
                self.phase = Phase::StartingSweep;
                out.push(Action::SpawnSweep(predecessor));
            }
            None => out.push(Action::Spawn { attempt: self.record.attempt }),
        }
    }

    /// When a timer fires next, if any is armed: the loop's timeout.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The next timer due at `now`, as an input (it fires once).
    pub fn take_due(&mut self, now: Instant) -> Option<Input> {
        self.timers.take_due(now).map(|(timer, at)| Input::Timer(timer, at))
    }

    pub fn handle(&mut self, input: Input, now: &mut Now, out: &mut Vec<Action>) {
        match input {
            Input::Signal(sig) => self.signal(sig, now, out),
            Input::Spawned(pid) => self.spawned(pid, now.get(), out),
            Input::SpawnFailed(code) => match self.phase {
                // drainit's own code, never remapped; the finish program
                // runs only when an earlier attempt did run a worker.
                Phase::Starting => self.finish(Ending::own(code), now.get(), out),
                Phase::StartingFinish => self.exit(now.get(), out),
                // The sweep's failure is logged; the worker starts anyway.
                Phase::StartingSweep => self.start_first(now.get(), out),
                _ => {}
            },
            Input::Notify(note) => self.note(note, now, out),
            Input::Reaped(pid, outcome) => self.reaped(pid, outcome, now.get(), out),
            Input::RetryAfter(requested) => self.requested = requested,
            Input::Killed(count) => {
                self.record.deadline_reached = true;
                self.record.killed = count;
                out.push(Action::Log(Event::DeadlineReached { remaining: count }));
            }
            Input::Children { left } => self.children(left, now.get(), out),
            Input::Timer(timer, at) => self.fire(timer, at, now.get(), out),
            Input::OomKills(total) => self.oom_kills(total, out),
            Input::MemoryEvent => self.read_usage(out),
            Input::Usage { used, limit } => self.usage(used, limit, now, out),
        }
    }

    /// The OOM killer took something in drainit's cgroup.
    fn oom_kills(&mut self, total: u64, out: &mut Vec<Action>) {
        let last = self.record.oom_kills.unwrap_or(0);
        if total <= last {
            return;
        }
        out.push(Action::Log(Event::OomKill { count: total - last, total }));
        self.record.oom_kills = Some(total);
        if matches!(self.phase, Phase::Running { .. } | Phase::DelayingStop { .. } | Phase::Stopping { .. }) {
            self.oom_rose = true;
        }
    }

    /// Memory is read while a worker runs and no stop is under way, and
    /// only with `--memory-stop`.
    fn read_usage(&mut self, out: &mut Vec<Action>) {
        if self.settings.memory_stop.is_some() && matches!(self.phase, Phase::Running { .. }) {
            out.push(Action::ReadUsage);
        }
    }

    fn usage(&mut self, used: u64, limit: u64, now: &mut Now, out: &mut Vec<Action>) {
        let Some(percent) = self.settings.memory_stop else { return };
        if matches!(self.phase, Phase::Running { .. }) && cgroup::over(used, limit, percent) {
            self.over = (used, limit);
            self.first_stop(SIGTERM, StopReason::Memory, now.get(), out);
        }
    }

    fn spawned(&mut self, pid: i32, now: Instant, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Starting => {
                self.phase = Phase::Running { worker: pid };
                out.push(Action::Log(Event::ChildStarted { pid, attempt: self.record.attempt }));
                self.oom_rose = false;
                if self.settings.memory_stop.is_some() {
                    self.timers.arm(Timer::MemoryCheck, now + self.settings.memory_check);
                }
                self.readiness.spawned(now, &mut self.timers);
            }
            Phase::StartingFinish => {
                self.phase = Phase::Finishing { pid };
                out.push(Action::Log(Event::FinishStarted { pid }));
            }
            Phase::StartingSweep => {
                self.phase = Phase::Sweeping { pid };
                out.push(Action::Log(Event::FinishStarted { pid }));
                if let Some(timeout) = self.settings.finish_timeout {
                    self.timers.arm(Timer::Finish, now + timeout);
                }
            }
            _ => {}
        }
    }

    /// The sweep is over: the first attempt starts, unless a stop came
    /// during it (then drainit exits 128+N, no worker having run).
    fn start_first(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.timers.disarm(Timer::Finish);
        self.kill_sent = false;
        match self.record.stop {
            Some(stop) => {
                self.record.ending = Some(Ending::own(Code::signal(stop.signal)));
                self.exit(now, out);
            }
            None => {
                self.phase = Phase::Starting;
                out.push(Action::Spawn { attempt: self.record.attempt });
            }
        }
    }

    fn signal(&mut self, sig: Signo, now: &mut Now, out: &mut Vec<Action>) {
        let first_stop = signals::is_stop(sig) && self.record.stop.is_none();
        match self.phase {
            _ if first_stop => self.first_stop(sig, StopReason::Signal, now.get(), out),
            // An impatient second stop ends the delay, and goes out itself;
            // the stop sequence, if any, begins then.
            Phase::DelayingStop { worker, held } if signals::is_stop(sig) => {
                let now = now.get();
                self.forward_stop(sig, worker, now, out);
                if self.settings.stop_sequence.is_some() {
                    self.begin_sequence(held, StopReason::Signal, now, out);
                }
            }
            Phase::Running { .. }
            | Phase::DelayingStop { .. }
            | Phase::Stopping { .. }
            | Phase::Draining { .. }
            | Phase::Finishing { .. }
            | Phase::Sweeping { .. } => self.forward(sig, out),
            Phase::Sleeping => out.push(Action::Log(Event::SignalDropped { signal: sig })),
            Phase::Starting | Phase::StartingFinish | Phase::StartingSweep | Phase::Done => {}
        }
    }

    /// The stop begins: a stop signal, the watchdog or the ready timeout.
    /// Its deadline bounds every phase from here on.
    fn first_stop(&mut self, sig: Signo, reason: StopReason, now: Instant, out: &mut Vec<Action>) {
        if self.phase == Phase::Done {
            return;
        }
        let delay = self.settings.stop_delay;
        let delayed = reason == StopReason::Signal && matches!(self.phase, Phase::Running { .. }) && !delay.is_zero();
        let status = self.record.status.clone();
        out.push(Action::Log(match reason {
            StopReason::Signal => Event::StopRequested {
                signal: sig,
                grace: self.settings.grace,
                delay: delayed.then_some(delay),
                status,
            },
            StopReason::Watchdog | StopReason::ReadyTimeout => self.readiness.stop_event(reason, sig, status, now),
            StopReason::Memory => Event::MemoryStop {
                used: self.over.0,
                limit: self.over.1,
                percent: self.settings.memory_stop.unwrap_or_default(),
                signal: self.settings.rewrite.apply(sig).unwrap_or(sig),
                status,
            },
        }));
        out.push(Action::CreateDrainFile);
        self.readiness.disarm(&mut self.timers, out);
        if self.settings.outer {
            out.push(Action::Tell(Tell::Stopping));
        }
        self.record.stop = Some(StopRequest { signal: sig, reason, at: now });
        self.timers.arm_by(Timer::Grace, now + self.settings.grace);
        self.timers.disarm(Timer::MemoryCheck);
        match self.phase {
            Phase::Running { worker } if delayed => {
                self.phase = Phase::DelayingStop { worker, held: sig };
                self.timers.arm(Timer::StopDelay, now + delay);
                out.push(Action::NoRestart);
            }
            Phase::Running { worker } => {
                self.phase = Phase::Stopping { worker };
                match self.settings.stop_sequence {
                    Some(_) => self.begin_sequence(sig, reason, now, out),
                    None => self.forward(sig, out),
                }
                out.push(Action::NoRestart);
            }
            Phase::Draining { then } => {
                if let Then::Restart(_) = then {
                    // No restart after a stop: end as if stopped while asleep.
                    self.phase = Phase::Draining { then: Then::Finish(Code::signal(sig)) };
                }
                self.forward(sig, out);
                out.push(Action::NoRestart);
            }
            Phase::Sleeping => {
                self.timers.disarm(Timer::Backoff);
                self.end(Code::signal(sig), now, out);
            }
            Phase::Finishing { .. } => self.forward(sig, out),
            // No worker follows the sweep now.
            Phase::Sweeping { .. } => {
                self.forward(sig, out);
                out.push(Action::NoRestart);
            }
            Phase::Starting
            | Phase::StartingSweep
            | Phase::StartingFinish
            | Phase::DelayingStop { .. }
            | Phase::Stopping { .. }
            | Phase::Done => {}
        }
    }

    /// The stop signal reaches the worker: the delay (if any) is over.
    fn forward_stop(&mut self, sig: Signo, worker: i32, now: Instant, out: &mut Vec<Action>) {
        let Some(stop) = self.record.stop else { return };
        self.timers.disarm(Timer::StopDelay);
        if let Some(to) = self.settings.rewrite.apply(sig) {
            out.push(Action::Forward(to));
            let waited = now.saturating_duration_since(stop.at);
            out.push(Action::Log(Event::StopForwarded { signal: to, waited, step: None }));
        }
        self.phase = Phase::Stopping { worker };
    }

    /// The stop sequence begins (at once, or at the end of the stop delay):
    /// the steps due now go out, and the next is armed. A stop the watchdog
    /// or the ready timeout began sends the watchdog signal (rewritten, as
    /// without a sequence) as its first step when `--watchdog-signal` was
    /// given.
    fn begin_sequence(&mut self, sig: Signo, reason: StopReason, now: Instant, out: &mut Vec<Action>) {
        let first = match reason {
            StopReason::Watchdog | StopReason::ReadyTimeout if self.settings.watchdog_signal_given => {
                Some(self.settings.rewrite.apply(sig))
            }
            _ => None,
        };
        self.sequence = Some((now, 0, first.map(|to| to.unwrap_or(0))));
        self.send_steps(now, out);
    }

    /// Every step of the sequence due at `now`, in order; then the next
    /// step's timer.
    fn send_steps(&mut self, now: Instant, out: &mut Vec<Action>) {
        let (Some((from, mut next, first)), Some(sequence), Some(stop)) =
            (self.sequence, self.settings.stop_sequence.as_ref(), self.record.stop)
        else {
            return;
        };
        let steps = sequence.steps();
        while let Some(step) = steps.get(next).filter(|s| from + s.offset <= now) {
            // A watchdog signal rewritten to 0 sends nothing, as without a
            // sequence.
            let signal = if next == 0 { first.unwrap_or(step.signal) } else { step.signal };
            next += 1;
            if signal != 0 {
                out.push(Action::Forward(signal));
                let waited = now.saturating_duration_since(stop.at);
                out.push(Action::Log(Event::StopForwarded { signal, waited, step: Some(next as u32) }));
            }
        }
        self.sequence = Some((from, next, first));
        match steps.get(next) {
            Some(step) => self.timers.arm(Timer::StopStep, from + step.offset),
            None => self.timers.disarm(Timer::StopStep),
        }
    }

    fn forward(&self, sig: Signo, out: &mut Vec<Action>) {
        if let Some(to) = self.settings.rewrite.apply(sig) {
            out.push(Action::Forward(to));
        }
    }

    /// A message from the worker's side. Readiness and the watchdog are the
    /// running worker's alone (`Readiness`): during a stop, or with no
    /// worker, only its status is kept.
    fn note(&mut self, note: Note, now: &mut Now, out: &mut Vec<Action>) {
        let running = match self.phase {
            Phase::Running { worker } => Some(worker),
            _ => None,
        };
        match note {
            // The worker's status: the finish program's is not (it runs
            // in its own session, after the worker).
            Note::Status(text)
                if self.record.status.as_deref() != Some(text.as_str())
                    && !matches!(
                        self.phase,
                        Phase::StartingFinish
                            | Phase::Finishing { .. }
                            | Phase::Draining { then: Then::Exit | Then::Start }
                            | Phase::StartingSweep
                            | Phase::Sweeping { .. }
                    ) =>
            {
                out.push(Action::Log(Event::Status { status: text.clone() }));
                if self.settings.outer {
                    out.push(Action::Tell(Tell::Status(text.clone())));
                }
                self.record.status = Some(text);
            }
            Note::Status(_) => {}
            note => {
                let Some(pid) = running else { return };
                if let Some(reason) = self.readiness.note(note, pid, now, &mut self.timers, out) {
                    self.expire(reason, now.get(), out);
                }
            }
        }
    }

    /// The watchdog or the ready timeout stops the worker: its signal at
    /// once (no stop delay), then everything a stop does.
    fn expire(&mut self, reason: StopReason, now: Instant, out: &mut Vec<Action>) {
        self.first_stop(self.settings.watchdog_signal, reason, now, out);
    }

    /// A child was reaped: the worker, the finish program, or an orphan.
    fn reaped(&mut self, pid: i32, outcome: Outcome, now: Instant, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Running { worker } | Phase::DelayingStop { worker, .. } | Phase::Stopping { worker }
                if pid == worker =>
            {
                self.worker_exited(pid, outcome, now, out)
            }
            Phase::Finishing { pid: finish } | Phase::Sweeping { pid: finish } if pid == finish => {
                out.push(Action::Log(Event::FinishExited { pid, outcome, timed_out: self.kill_sent }));
                let then = if matches!(self.phase, Phase::Sweeping { .. }) { Then::Start } else { Then::Exit };
                self.phase = Phase::Draining { then };
                out.push(Action::SignalAll(if self.kill_sent { SIGKILL } else { SIGTERM }));
            }
            _ => out.push(Action::Log(Event::Reaped { pid, outcome })),
        }
    }

    fn worker_exited(&mut self, pid: i32, outcome: Outcome, now: Instant, out: &mut Vec<Action>) {
        // A SIGKILL drainit did not send, while the OOM-kill count rose.
        let oom = outcome == Outcome::Signaled(SIGKILL) && self.oom_rose && !self.kill_sent;
        self.record.worker = Some(outcome);
        self.record.worker_oom = oom;
        out.push(Action::Log(Event::ChildExited { pid, outcome, oom }));
        self.readiness.disarm(&mut self.timers, out);
        // The worker's exit ends the stop delay and the stop sequence.
        for timer in [Timer::StopDelay, Timer::StopStep, Timer::MemoryCheck] {
            self.timers.disarm(timer);
        }
        let code = match self.settings.oom_exit_code {
            Some(code) if oom => code,
            _ => outcome.code(),
        };
        let then = match self.record.stop {
            None if self.settings.backoff.wants_restart(code) => {
                out.push(Action::ReadRetryAfter);
                Then::Restart(code)
            }
            None => Then::Finish(code),
            // A stop drainit began itself never ends in 0: restart policies
            // that act on failure must see one.
            Some(stop) if code == Code(0) && stop.reason != StopReason::Signal => {
                Then::Finish(Code::signal(stop.signal))
            }
            Some(_) => Then::Finish(code),
        };
        self.phase = Phase::Draining { then };
        // What is left keeps the deadline of the stop under way, or gets
        // the grace from now; a worker that exits during the stop delay
        // ends the delay, and its leftovers get the usual SIGTERM, not the
        // held signal. Past the deadline, the `Grace` timer that is due
        // fires in this turn and kills them.
        if self.record.stop.is_none() {
            self.timers.arm(Timer::Grace, now + self.settings.grace);
        }
        if self.kill_sent {
            out.push(Action::SignalAll(SIGKILL));
        } else if self.timers.get(Timer::Grace).is_some_and(|at| at > now) {
            out.push(Action::SignalAll(SIGTERM));
        }
    }

    fn children(&mut self, left: bool, now: Instant, out: &mut Vec<Action>) {
        let Phase::Draining { then } = self.phase else { return };
        if !left {
            // The leftovers' deadline is over; a stop's still bounds what
            // follows (the finish program).
            match self.record.stop {
                Some(stop) if stop.at + self.settings.grace > now => {
                    self.timers.arm(Timer::Grace, stop.at + self.settings.grace)
                }
                _ => self.timers.disarm(Timer::Grace),
            }
        }
        match (left, then) {
            // Past the deadline, anything reparented to drainit since the
            // SIGKILL (a subreaper's escapees) gets one too.
            (true, _) if self.kill_sent => out.push(Action::SignalAll(SIGKILL)),
            (true, _) => {}
            (false, Then::Restart(code)) => self.back_off(code, now, out),
            (false, Then::Finish(code)) => self.end(code, now, out),
            (false, Then::Exit) => self.exit(now, out),
            (false, Then::Start) => self.start_first(now, out),
        }
    }

    fn fire(&mut self, timer: Timer, at: Instant, now: Instant, out: &mut Vec<Action>) {
        match (timer, self.phase) {
            (Timer::StopDelay, Phase::DelayingStop { worker, held }) => {
                match self.settings.stop_sequence {
                    // The sequence goes out instead of the held signal.
                    Some(_) => {
                        self.timers.disarm(Timer::StopDelay);
                        self.phase = Phase::Stopping { worker };
                        self.begin_sequence(held, StopReason::Signal, now, out);
                    }
                    None => self.forward_stop(held, worker, now, out),
                }
            }
            (Timer::StopStep, Phase::Stopping { .. }) => self.send_steps(now, out),
            (Timer::Watchdog, Phase::Running { .. }) => {
                if let Some(reason) = self.readiness.watchdog_due(at, now, &mut self.timers, out) {
                    self.expire(reason, now, out);
                }
            }
            (Timer::Ready, Phase::Running { .. }) => self.expire(StopReason::ReadyTimeout, now, out),
            (Timer::MemoryCheck, Phase::Running { .. }) => {
                // From now, not from when it was due: one read per check,
                // however late drainit got to run.
                self.timers.arm(Timer::MemoryCheck, now + self.settings.memory_check);
                self.read_usage(out);
            }
            (Timer::Grace, Phase::Stopping { .. } | Phase::Draining { then: Then::Restart(_) | Then::Finish(_) }) => {
                self.timers.disarm(Timer::StopStep);
                self.kill_sent = true;
                out.push(Action::Deadline);
            }
            // The finish program's bound, or the deadline of a stop that
            // came while it ran: it and what it left are killed, no
            // `deadline_reached` (that is the worker's).
            (
                Timer::Grace | Timer::Finish,
                Phase::Finishing { .. } | Phase::Sweeping { .. } | Phase::Draining { then: Then::Exit | Then::Start },
            ) if !self.kill_sent => {
                self.kill_sent = true;
                out.push(Action::SignalAll(SIGKILL));
            }
            (Timer::Backoff, Phase::Sleeping) => {
                self.record.attempt += 1;
                self.kill_sent = false;
                self.phase = Phase::Starting;
                out.push(Action::Spawn { attempt: self.record.attempt });
            }
            _ => {}
        }
    }

    fn back_off(&mut self, code: Code, now: Instant, out: &mut Vec<Action>) {
        self.timers.disarm(Timer::Grace);
        let unit = self.jitter.unit();
        match self.backoff.next(&self.settings.backoff, now, self.requested.take(), unit) {
            Decision::Sleep(delay) => {
                self.phase = Phase::Sleeping;
                self.timers.arm(Timer::Backoff, now + delay);
                out.push(Action::Log(Event::Backoff { attempt: self.record.attempt, code: code.0, delay }));
            }
            Decision::Exhausted { elapsed } => {
                out.push(Action::Log(Event::BackoffExhausted { attempts: self.record.attempt, elapsed }));
                self.end(code, now, out);
            }
        }
    }

    /// drainit is done with the worker and will exit with `code`, remapped.
    fn end(&mut self, code: Code, now: Instant, out: &mut Vec<Action>) {
        let remapped = self.settings.remap.apply(code);
        self.finish(Ending { code: remapped.unwrap_or(code), remapped_from: remapped.map(|_| code) }, now, out);
    }

    /// drainit ends with `ending`: first the finish program, when there is
    /// one and a worker ran, its time bounded by the stop under way (its
    /// grace deadline, or the orchestrator's SIGKILL less a margin once
    /// that passed) or else by the finish timeout.
    fn finish(&mut self, ending: Ending, now: Instant, out: &mut Vec<Action>) {
        self.record.ending = Some(ending);
        let (Some(timeout), Some(_)) = (self.settings.finish_timeout, self.record.worker) else {
            return self.exit(now, out);
        };
        let bound = match self.record.stop {
            Some(stop) => (stop.at + self.settings.orchestrator_timeout).checked_sub(FINISH_MARGIN).unwrap_or(now),
            None => now + timeout,
        };
        self.timers.arm(Timer::Finish, bound);
        self.kill_sent = false;
        self.phase = Phase::StartingFinish;
        out.push(Action::SpawnFinish(Box::new(self.record.clone())));
    }

    fn exit(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.phase = Phase::Done;
        self.timers = Timers::default();
        self.record.exit_at = Some(now);
        let ending = self.record.ending.unwrap_or(Ending::own(Code::FAILED));
        out.push(Action::Log(Event::Exit {
            code: ending.code.0,
            remapped_from: ending.remapped_from.map(|c| c.0),
            status: self.record.status.clone(),
            oom_kills: self.record.oom_kills.unwrap_or(0),
        }));
        out.push(Action::Exit(Box::new(self.record.clone())));
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

    fn policy() -> Settings {
        Settings {
            grace: ms(5000),
            orchestrator_timeout: ms(7000),
            rewrite: Rewrite::default(),
            backoff: backoff::Policy { codes: vec![75], delay: ms(1000), max_delay: ms(4000), timeout: ms(10_000) },
            stop_delay: Duration::ZERO,
            finish_timeout: None,
            remap: Remap::default(),
            watchdog: None,
            ready_timeout: None,
            watchdog_signal: SIGTERM,
            outer: false,
            oom_counter: true,
            oom_exit_code: None,
            memory_stop: None,
            memory_check: ms(1000),
            stop_sequence: None,
            watchdog_signal_given: false,
        }
    }

    /// One step of a story: an input, or the clock (every timer due).
    #[derive(Clone, Debug)]
    enum Step {
        In(Input),
        Tick,
    }
    use Step::Tick;

    impl From<Input> for Step {
        fn from(input: Input) -> Step {
            Step::In(input)
        }
    }

    fn i(input: Input) -> Step {
        Step::In(input)
    }

    /// A supervisor and the instant its story starts at.
    struct Story {
        s: Supervisor,
        t: Instant,
    }

    impl Story {
        fn new(policy: Settings) -> Story {
            let mut s = Supervisor::new(policy, 7);
            let mut out = Vec::new();
            s.start(&mut out);
            assert_eq!(out, vec![Action::Spawn { attempt: 1 }]);
            Story { s, t: Instant::now() }
        }

        /// Take `step` at t + `at` ms: its actions.
        fn actions(&mut self, at: u64, step: impl Into<Step>) -> Vec<Action> {
            let now = self.t + ms(at);
            let mut out = Vec::new();
            match step.into() {
                Step::In(input) => self.s.handle(input, &mut Now::at(now), &mut out),
                // As the event loop does: every timer due, one at a time.
                Step::Tick => {
                    while let Some(due) = self.s.take_due(now) {
                        self.s.handle(due, &mut Now::at(now), &mut out);
                    }
                }
            }
            out
        }

        /// Take `step` at t + `at` ms; the actions, briefly.
        fn feed(&mut self, at: u64, step: impl Into<Step>) -> Vec<String> {
            self.actions(at, step).iter().map(brief).collect()
        }

        fn feed_all(&mut self, steps: &[(u64, Step)]) {
            for (at, step) in steps {
                self.feed(*at, step.clone());
            }
        }

        fn phase(&self) -> &'static str {
            match self.s.phase {
                Phase::StartingSweep => "starting_sweep",
                Phase::Sweeping { .. } => "sweeping",
                Phase::Starting => "starting",
                Phase::Running { .. } => "running",
                Phase::DelayingStop { .. } => "delaying_stop",
                Phase::Stopping { .. } => "stopping",
                Phase::Draining { .. } => "draining",
                Phase::Sleeping => "sleeping",
                Phase::StartingFinish => "starting_finish",
                Phase::Finishing { .. } => "finishing",
                Phase::Done => "done",
            }
        }

        fn deadline(&self) -> Option<Duration> {
            self.s.next_deadline().map(|d| d - self.t)
        }
    }

    /// One action, as the tables spell it: `forward SIGHUP`, `log stop_requested`.
    /// A row of a transition table: its name, the story it starts from,
    /// when the step comes (ms), the step, the actions it gives, the phase
    /// after it.
    type PhaseRow = (&'static str, fn() -> Story, u64, Step, &'static [&'static str], &'static str);

    fn check_phase_rows(rows: &[PhaseRow]) {
        for (name, start, at, step, actions, phase) in rows {
            let mut st = start();
            assert_eq!(st.feed(*at, step.clone()), *actions, "{name}: actions");
            assert_eq!(st.phase(), *phase, "{name}: phase");
        }
    }

    fn brief(a: &Action) -> String {
        match a {
            Action::Spawn { attempt } => format!("spawn {attempt}"),
            Action::SpawnFinish(record) => format!("spawn_finish code={}", record.code().0),
            Action::SpawnSweep(p) => format!("spawn_sweep attempt={:?}", p.attempt),
            Action::Forward(sig) => format!("forward {}", signals::name(*sig)),
            Action::SignalAll(sig) => format!("all {}", signals::name(*sig)),
            Action::Deadline => "deadline".into(),
            Action::ReadRetryAfter => "read_retry_after".into(),
            Action::ReadUsage => "read_usage".into(),
            Action::CreateDrainFile => "drain_file".into(),
            Action::CreateReadyFile => "ready_file".into(),
            Action::RemoveReadyFile => "ready_file_gone".into(),
            Action::Tell(t) => format!("tell {t:?}"),
            Action::NoRestart => "no_restart".into(),
            Action::Log(e) => {
                format!("log {}", e.to_string().split(' ').next().unwrap_or("").trim_start_matches("event="))
            }
            Action::Exit(record) => format!("exit {}", record.code().0),
        }
    }

    fn exited(code: i32) -> Outcome {
        Outcome::Exited(code)
    }

    // The named starting points of the table: each is reached from the
    // start by real inputs, at t + 0 unless said otherwise.
    fn running(p: Settings) -> Story {
        let mut st = Story::new(p);
        st.feed(0, Spawned(W));
        st
    }
    fn delaying() -> Story {
        let mut st = running(Settings { stop_delay: ms(2000), ..policy() });
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
    fn draining(p: Settings, code: i32) -> Story {
        let mut st = running(p);
        st.feed(0, Reaped(W, exited(code)));
        st
    }
    fn sleeping() -> Story {
        let mut st = draining(policy(), 75);
        st.feed_all(&[(0, i(RetryAfter(Some(ms(300))))), (0, i(Children { left: false }))]);
        st
    }
    fn with_finish() -> Settings {
        Settings { finish_timeout: Some(ms(3000)), ..policy() }
    }
    fn finishing() -> Story {
        let mut st = draining(with_finish(), 4);
        st.feed_all(&[(0, i(Children { left: false })), (0, i(Spawned(F)))]);
        st
    }

    fn predecessor() -> Predecessor {
        Predecessor { attempt: Some(3), pid: Some(1), started: Some(1000) }
    }
    /// A supervisor that begins with the sweep: its first actions checked.
    fn sweep_story(p: Settings) -> Story {
        let mut s = Supervisor::new(p, 7);
        s.sweep_first(predecessor());
        let mut out = Vec::new();
        s.start(&mut out);
        assert_eq!(out, vec![Action::SpawnSweep(predecessor())]);
        Story { s, t: Instant::now() }
    }
    fn sweeping() -> Story {
        let mut st = sweep_story(with_finish());
        st.feed(0, Spawned(F));
        st
    }
    fn swept() -> Story {
        let mut st = sweeping();
        st.feed(100, Reaped(F, exited(0)));
        st
    }
    fn stopped_sweeping() -> Story {
        let mut st = sweeping();
        st.feed(100, Signal(SIGTERM));
        st
    }

    /// The sweep: the finish program for a predecessor that died without
    /// its exit runs first, bounded by the finish timeout (3s) or a stop's
    /// grace (5s), and the worker starts after it and its leftovers, unless
    /// a stop came.
    #[test]
    fn the_sweep() {
        let rows: &[PhaseRow] = &[
            ("sweep started", || sweep_story(with_finish()), 0, i(Spawned(F)), &["log finish_started"], "sweeping"),
            (
                "sweep cannot start: the worker does",
                || sweep_story(with_finish()),
                0,
                i(SpawnFailed(Code(126))),
                &["spawn 1"],
                "starting",
            ),
            ("signal to the sweep", sweeping, 100, i(Signal(HUP)), &["forward SIGHUP"], "sweeping"),
            ("sweep exits", sweeping, 100, i(Reaped(F, exited(1))), &["log finish_exited", "all SIGTERM"], "draining"),
            ("sweep's leftovers live", swept, 200, i(Children { left: true }), &[], "draining"),
            ("sweep's leftovers gone: the worker", swept, 200, i(Children { left: false }), &["spawn 1"], "starting"),
            ("the worker after the sweep", swept, 200, i(Children { left: false }), &["spawn 1"], "starting"),
            ("sweep's bound", sweeping, 3000, Tick, &["all SIGKILL"], "sweeping"),
            ("sweep within its bound", sweeping, 2999, Tick, &[], "sweeping"),
            ("sweep's leftovers at its bound", swept, 3000, Tick, &["all SIGKILL"], "draining"),
            (
                "stop in the sweep",
                sweeping,
                100,
                i(Signal(SIGTERM)),
                &["log stop_requested", "drain_file", "forward SIGTERM", "no_restart"],
                "sweeping",
            ),
            (
                "stopped sweep exits",
                stopped_sweeping,
                200,
                i(Reaped(F, exited(0))),
                &["log finish_exited", "all SIGTERM"],
                "draining",
            ),
            (
                "no worker after a stop in the sweep",
                || {
                    let mut st = stopped_sweeping();
                    st.feed(200, Reaped(F, exited(0)));
                    st
                },
                300,
                i(Children { left: false }),
                &["log exit", "exit 143"],
                "done",
            ),
            ("a status is not the worker's", sweeping, 100, i(Notify(Note::Status("x".into()))), &[], "sweeping"),
        ];
        check_phase_rows(rows);
    }

    #[test]
    fn no_sweep_without_a_finish_program() {
        let mut s = Supervisor::new(policy(), 7);
        s.sweep_first(predecessor());
        let mut out = Vec::new();
        s.start(&mut out);
        assert_eq!(out, vec![Action::Spawn { attempt: 1 }]);
    }

    #[test]
    fn a_stop_in_the_sweep_bounds_it_by_the_grace() {
        // A finish timeout longer than the grace: the stop's deadline wins.
        let mut st = sweep_story(Settings { finish_timeout: Some(ms(60_000)), ..policy() });
        st.feed(0, Spawned(F));
        st.feed(1000, Signal(SIGINT));
        assert_eq!(st.deadline(), Some(ms(6000)), "stop + grace");
        assert_eq!(st.feed(6000, Tick), ["all SIGKILL"]);
        assert_eq!(st.feed(6001, Reaped(F, Outcome::Signaled(9))), ["log finish_exited", "all SIGKILL"]);
        assert_eq!(st.feed(6002, Children { left: false }), ["log exit", "exit 130"], "128+N, no worker");
    }

    #[test]
    fn the_sweep_is_not_remapped_and_the_worker_then_runs_as_usual() {
        let remap = Remap::parse(["143:0"]).unwrap();
        let mut st = sweep_story(Settings { remap: remap.clone(), ..with_finish() });
        st.feed(0, Spawned(F));
        st.feed(10, Signal(SIGTERM));
        st.feed(20, Reaped(F, exited(0)));
        assert_eq!(st.feed(30, Children { left: false }), ["log exit", "exit 143"], "no worker ran: not remapped");
        // Without a stop: the worker runs, and the finish program runs
        // again at the end, for this run's worker (one per death).
        let mut st = swept();
        st.feed(200, Children { left: false });
        assert_eq!(st.deadline(), None, "the sweep's bound is gone");
        st.feed(200, Spawned(W));
        st.feed(300, Reaped(W, exited(4)));
        assert_eq!(st.feed(300, Children { left: false }), ["spawn_finish code=4"]);
    }

    /// phase x input -> actions + phase. Times in ms after the story's start;
    /// the grace is 5s, the orchestrator timeout 7s, the stop delay (where
    /// set) 2s, the finish timeout (where set) 3s.
    #[test]
    fn transitions() {
        let rows: &[PhaseRow] = &[
            // starting
            ("first start", || Story::new(policy()), 0, i(Spawned(W)), &["log child_started"], "running"),
            ("exec failure", || Story::new(policy()), 0, i(SpawnFailed(Code(127))), &["log exit", "exit 127"], "done"),
            // running
            ("signal", || running(policy()), 0, i(Signal(HUP)), &["forward SIGHUP"], "running"),
            (
                "stop",
                || running(policy()),
                0,
                i(Signal(SIGTERM)),
                &["log stop_requested", "drain_file", "forward SIGTERM", "no_restart"],
                "stopping",
            ),
            (
                "stop, delayed",
                || running(Settings { stop_delay: ms(2000), ..policy() }),
                0,
                i(Signal(SIGINT)),
                &["log stop_requested", "drain_file", "no_restart"],
                "delaying_stop",
            ),
            (
                "exit",
                || running(policy()),
                0,
                i(Reaped(W, exited(3))),
                &["log child_exited", "all SIGTERM"],
                "draining",
            ),
            (
                "backoff exit",
                || running(policy()),
                0,
                i(Reaped(W, exited(75))),
                &["log child_exited", "read_retry_after", "all SIGTERM"],
                "draining",
            ),
            ("orphan", || running(policy()), 0, i(Reaped(ORPHAN, exited(0))), &["log reaped"], "running"),
            ("no deadline yet", || running(policy()), 60_000, Tick, &[], "running"),
            // delaying a stop
            ("signal in delay", delaying, 500, i(Signal(USR1)), &["forward SIGUSR1"], "delaying_stop"),
            ("second stop", delaying, 500, i(Signal(SIGTERM)), &["forward SIGTERM", "log stop_forwarded"], "stopping"),
            ("delay not over", delaying, 1999, Tick, &[], "delaying_stop"),
            ("delay over", delaying, 2000, Tick, &["forward SIGTERM", "log stop_forwarded"], "stopping"),
            ("exit in delay", delaying, 500, i(Reaped(W, exited(0))), &["log child_exited", "all SIGTERM"], "draining"),
            // stopping
            ("stop again", stopping, 100, i(Signal(SIGQUIT)), &["forward SIGQUIT"], "stopping"),
            ("before deadline", stopping, 4999, Tick, &[], "stopping"),
            ("deadline", stopping, 5000, Tick, &["deadline"], "stopping"),
            ("killed count", stopping, 5000, i(Killed(3)), &["log deadline_reached"], "stopping"),
            ("exit in stop", stopping, 100, i(Reaped(W, exited(0))), &["log child_exited", "all SIGTERM"], "draining"),
            (
                "killed worker",
                killed,
                5001,
                i(Reaped(W, Outcome::Signaled(9))),
                &["log child_exited", "all SIGKILL"],
                "draining",
            ),
            ("deadline once", killed, 6000, Tick, &[], "stopping"),
            // draining
            ("leftovers live", || draining(policy(), 3), 10, i(Children { left: true }), &[], "draining"),
            (
                "leftovers gone",
                || draining(policy(), 3),
                10,
                i(Children { left: false }),
                &["log exit", "exit 3"],
                "done",
            ),
            ("leftovers past deadline", || draining(policy(), 3), 5000, Tick, &["deadline"], "draining"),
            ("signal to leftovers", || draining(policy(), 3), 10, i(Signal(USR1)), &["forward SIGUSR1"], "draining"),
            (
                "stop while draining a backoff exit",
                || draining(policy(), 75),
                10,
                i(Signal(SIGINT)),
                &["log stop_requested", "drain_file", "forward SIGINT", "no_restart"],
                "draining",
            ),
            ("backoff", || draining(policy(), 75), 10, i(Children { left: false }), &["log backoff"], "sleeping"),
            (
                "to the finish program",
                || draining(with_finish(), 4),
                10,
                i(Children { left: false }),
                &["spawn_finish code=4"],
                "starting_finish",
            ),
            // sleeping
            ("signal in sleep", sleeping, 100, i(Signal(HUP)), &["log signal_dropped"], "sleeping"),
            (
                "stop in sleep",
                sleeping,
                100,
                i(Signal(SIGTERM)),
                &["log stop_requested", "drain_file", "log exit", "exit 143"],
                "done",
            ),
            ("wake", sleeping, 300, Tick, &["spawn 2"], "starting"),
            // finishing
            (
                "finish started",
                || {
                    let mut st = draining(with_finish(), 4);
                    st.feed(0, i(Children { left: false }));
                    st
                },
                0,
                i(Spawned(F)),
                &["log finish_started"],
                "finishing",
            ),
            (
                "finish cannot start",
                || {
                    let mut st = draining(with_finish(), 4);
                    st.feed(0, i(Children { left: false }));
                    st
                },
                0,
                i(SpawnFailed(Code(126))),
                &["log exit", "exit 4"],
                "done",
            ),
            (
                "finish exits",
                finishing,
                100,
                i(Reaped(F, exited(9))),
                &["log finish_exited", "all SIGTERM"],
                "draining",
            ),
            (
                "stop in finish",
                finishing,
                100,
                i(Signal(SIGTERM)),
                &["log stop_requested", "drain_file", "forward SIGTERM"],
                "finishing",
            ),
            ("finish bound", finishing, 3000, Tick, &["all SIGKILL"], "finishing"),
        ];
        check_phase_rows(rows);
    }

    #[test]
    fn rewriting_is_applied_after_the_stop_is_judged() {
        let mut st = running(Settings { rewrite: Rewrite::parse(["TERM:QUIT", "USR1:0"]).unwrap(), ..policy() });
        assert_eq!(st.feed(0, Signal(USR1)), Vec::<String>::new());
        assert_eq!(st.feed(0, Signal(SIGTERM)), ["log stop_requested", "drain_file", "forward SIGQUIT", "no_restart"]);
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
        let out = st.actions(2000, Tick);
        assert_eq!(
            out[1],
            Action::Log(Event::StopForwarded { signal: SIGTERM, waited: ms(2000), step: None }),
            "waited from the stop request"
        );
        assert_eq!(st.deadline(), Some(ms(5000)), "stop + grace, not stop + delay + grace");
        assert_eq!(st.feed(5000, Tick), ["deadline"]);
    }

    #[test]
    fn the_delay_is_logged_with_the_stop() {
        let mut st = running(Settings { stop_delay: ms(2000), ..policy() });
        let out = st.actions(0, Signal(SIGTERM));
        assert_eq!(
            out[0],
            Action::Log(Event::StopRequested { signal: SIGTERM, grace: ms(5000), delay: Some(ms(2000)), status: None })
        );
    }

    #[test]
    fn a_stop_after_the_worker_exited_is_not_delayed() {
        let mut st = draining(Settings { stop_delay: ms(2000), ..policy() }, 0);
        assert_eq!(st.feed(10, Signal(SIGTERM)), ["log stop_requested", "drain_file", "forward SIGTERM", "no_restart"]);
    }

    #[test]
    fn a_rewrite_that_drops_the_held_stop_sends_nothing() {
        let mut st =
            running(Settings { stop_delay: ms(1000), rewrite: Rewrite::parse(["TERM:0"]).unwrap(), ..policy() });
        st.feed(0, Signal(SIGTERM));
        assert_eq!(st.feed(1000, Tick), Vec::<String>::new());
        assert_eq!(st.phase(), "stopping");
    }

    #[test]
    fn deadline_kill_then_exit_with_the_workers_status() {
        let mut st = killed();
        st.feed(5001, Reaped(W, Outcome::Signaled(9)));
        let out = st.actions(5002, Children { left: false });
        assert_eq!(out[0], Action::Log(Event::Exit { code: 137, remapped_from: None, status: None, oom_kills: 0 }));
        let [_, Action::Exit(record)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!(
            record.to_string(),
            "drainit: code=137 worker=signal:SIGKILL deadline_reached=1 killed=2 stop=SIGTERM stop_took=5.002s attempts=1"
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
        // drainit ran late: the exit is read in the turn the deadline is due.
        let mut st = stopping();
        assert_eq!(st.feed(6000, Reaped(W, exited(0))), ["log child_exited"], "no SIGTERM: the kill is due");
        assert_eq!(st.feed(6000, Tick), ["deadline"]);
        assert_eq!(st.feed(6000, Killed(1)), ["log deadline_reached"]);
        assert_eq!(st.feed(6001, Children { left: true }), ["all SIGKILL"]);
    }

    #[test]
    fn backoff_restarts_after_leftovers_are_gone() {
        let mut st = draining(policy(), 75);
        st.feed(0, RetryAfter(None));
        assert_eq!(st.feed(0, Children { left: true }), Vec::<String>::new(), "no sleep while a leftover lives");
        let out = st.actions(10, Children { left: false });
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
        let out = st.actions(0, Children { left: false });
        assert_eq!(out, vec![Action::Log(Event::Backoff { attempt: 1, code: 75, delay: ms(300) })]);
    }

    #[test]
    fn the_backoff_budget_is_used_to_its_end() {
        // Budget 10s: sleeps of 4s at 0s and 4s, then one cut to 2s, then final.
        let mut st = running(policy());
        let mut now = 0;
        for (attempt, sleep) in [(1, 4000), (2, 4000), (3, 2000)] {
            st.feed_all(&[(now, i(Reaped(W, exited(75)))), (now, i(RetryAfter(Some(ms(4000)))))]);
            let out = st.actions(now, Children { left: false });
            assert_eq!(out, vec![Action::Log(Event::Backoff { attempt, code: 75, delay: ms(sleep) })]);
            now += sleep;
            st.feed_all(&[(now, Tick), (now, i(Spawned(W)))]);
        }
        st.feed_all(&[(now, i(Reaped(W, exited(75)))), (now, i(RetryAfter(None)))]);
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
        let mut st = running(Settings { grace: Duration::ZERO, ..policy() });
        st.feed(0, Signal(SIGTERM));
        assert_eq!(st.feed(0, Tick), ["deadline"]);
    }

    #[test]
    fn remapping_applies_to_what_the_worker_caused() {
        let remap = || Settings { remap: Remap::parse(["143:0", "127:1", "75:3"]).unwrap(), ..policy() };
        let mut st = running(remap());
        st.feed(0, Reaped(W, Outcome::Signaled(SIGTERM)));
        let out = st.actions(0, Children { left: false });
        assert_eq!(out[0], Action::Log(Event::Exit { code: 0, remapped_from: Some(143), status: None, oom_kills: 0 }));
        // Stop during a backoff sleep: 143, remapped.
        let mut st = draining(remap(), 75);
        st.feed_all(&[(0, i(RetryAfter(None))), (0, i(Children { left: false }))]);
        assert_eq!(st.feed(100, Signal(SIGTERM)), ["log stop_requested", "drain_file", "log exit", "exit 0"]);
        // An exec failure is drainit's own code: never remapped.
        let mut st = Story::new(remap());
        assert_eq!(st.feed(0, SpawnFailed(Code(127))), ["log exit", "exit 127"]);
    }

    #[test]
    fn the_finish_program_is_told_how_the_worker_ended() {
        let mut st = running(with_finish());
        st.feed_all(&[
            (0, i(Signal(SIGTERM))),
            (5000, Tick),
            (5000, i(Killed(1))),
            (5001, i(Reaped(W, Outcome::Signaled(9)))),
        ]);
        let out = st.actions(5002, Children { left: false });
        let [Action::SpawnFinish(record)] = out.as_slice() else { panic!("{out:?}") };
        let vars: Vec<String> =
            crate::environment::finish_vars(record).iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            vars,
            [
                "DRAINIT_EXIT_CODE=137",
                "DRAINIT_WORKER_STATUS=signal:SIGKILL",
                "DRAINIT_DEADLINE_REACHED=1",
                "DRAINIT_STOP_SIGNAL=SIGTERM",
                "DRAINIT_STOP_REASON=signal",
                "DRAINIT_ATTEMPT=1",
                "DRAINIT_OOM_KILLS=0"
            ]
        );
    }

    #[test]
    fn the_finish_program_runs_once_after_the_last_attempt() {
        let mut st = running(with_finish());
        st.feed_all(&[(0, i(Reaped(W, exited(75)))), (0, i(RetryAfter(Some(ms(100)))))]);
        assert_eq!(st.feed(0, Children { left: false }), ["log backoff"], "not between attempts");
        st.feed_all(&[(100, Tick), (100, i(Spawned(W + 1))), (200, i(Reaped(W + 1, exited(4))))]);
        assert_eq!(st.feed(200, Children { left: false }), ["spawn_finish code=4"]);
        st.feed_all(&[(200, i(Spawned(F))), (300, i(Reaped(F, exited(0))))]);
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
        st.feed_all(&[(0, i(Signal(SIGTERM))), (1000, i(Reaped(W, exited(0)))), (1000, i(Children { left: false }))]);
        st.feed(1000, Spawned(F));
        assert_eq!(st.deadline(), Some(ms(5000)));
        // The deadline already passed: orchestrator timeout (7s) minus 500ms.
        let mut st = killed();
        st.s.settings.finish_timeout = Some(ms(3000));
        st.feed_all(&[
            (5001, i(Reaped(W, Outcome::Signaled(9)))),
            (5002, i(Children { left: false })),
            (5002, i(Spawned(F))),
        ]);
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
        let out = st.actions(3001, Reaped(F, Outcome::Signaled(9)));
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

    /// Defect: a stop after the finish program exited left its leftovers to
    /// the finish timeout (30s), past the orchestrator's SIGKILL.
    #[test]
    fn a_stop_bounds_the_finish_programs_leftovers() {
        let mut st = running(Settings { finish_timeout: Some(ms(30_000)), ..policy() });
        st.feed_all(&[(0, i(Reaped(W, exited(0)))), (0, i(Children { left: false })), (0, i(Spawned(F)))]);
        assert_eq!(st.feed(100, Reaped(F, exited(0))), ["log finish_exited", "all SIGTERM"]);
        st.feed(1500, Signal(SIGTERM));
        assert_eq!(st.deadline(), Some(ms(6500)), "the stop's grace, not the finish bound");
        assert_eq!(st.feed(6500, Tick), ["all SIGKILL"]);
        assert_eq!(st.feed(6501, Children { left: false }), ["log exit", "exit 0"]);
    }

    /// Defect: a later attempt that cannot exec skipped the finish program,
    /// though an earlier attempt ran a worker.
    #[test]
    fn the_finish_program_runs_after_a_later_attempt_cannot_exec() {
        let mut st = running(with_finish());
        st.feed_all(&[
            (0, i(Reaped(W, exited(75)))),
            (0, i(RetryAfter(Some(ms(100))))),
            (0, i(Children { left: false })),
        ]);
        assert_eq!(st.feed(100, Tick), ["spawn 2"]);
        assert_eq!(
            st.feed(100, SpawnFailed(Code(127))),
            ["spawn_finish code=127"],
            "127 is drainit's own: not remapped"
        );
        st.feed(100, Spawned(F));
        st.feed(200, Reaped(F, exited(0)));
        assert_eq!(st.feed(200, Children { left: false }), ["log exit", "exit 127"]);
    }

    fn watched() -> Settings {
        Settings { watchdog: Some(ms(1000)), watchdog_signal: SIGQUIT, ..policy() }
    }
    fn ready_gated() -> Settings {
        Settings { ready_timeout: Some(ms(3000)), ..watched() }
    }
    fn note(n: Note) -> Input {
        Notify(n)
    }

    /// (settings, steps before) x input -> actions + phase, for readiness
    /// and the watchdog. Times in ms; the watchdog interval is 1s, its
    /// signal SIGQUIT, the ready timeout (where set) 3s, the grace 5s.
    #[test]
    fn readiness_and_the_watchdog() {
        type Row<'a> = (&'a str, fn() -> Settings, &'a [(u64, fn() -> Input)], u64, Step, &'a [&'a str], &'a str);
        let spawned: fn() -> Input = || Spawned(W);
        let ping: fn() -> Input = || note(Note::Ping);
        let ready: fn() -> Input = || note(Note::Ready);
        let rows: &[Row] = &[
            (
                "armed at the start: a missed ping stops",
                watched,
                &[(0, spawned)],
                1000,
                Tick,
                &["log watchdog_expired", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            ("not yet", watched, &[(0, spawned)], 999, Tick, &[], "running"),
            ("a ping moves the deadline", watched, &[(0, spawned), (800, ping)], 1000, Tick, &[], "running"),
            (
                "... to ping + interval",
                watched,
                &[(0, spawned), (800, ping)],
                1800,
                Tick,
                &["log watchdog_expired", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            (
                "a ping in the turn it is due counts",
                watched,
                &[(0, spawned)],
                1000,
                i(note(Note::Ping)),
                &[],
                "running",
            ),
            (
                "frozen drainit: one fresh interval",
                watched,
                &[(0, spawned)],
                2500,
                Tick,
                &["log watchdog_late"],
                "running",
            ),
            (
                "trigger",
                watched,
                &[(0, spawned)],
                10,
                i(note(Note::Trigger)),
                &["log watchdog_expired", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            (
                "STOPPING=1 disarms it",
                watched,
                &[(0, spawned), (10, || note(Note::Stopping))],
                5000,
                Tick,
                &[],
                "running",
            ),
            (
                "WATCHDOG_USEC moves the deadline",
                watched,
                &[(0, spawned), (500, || note(Note::Interval(ms(2000))))],
                2000,
                Tick,
                &[],
                "running",
            ),
            (
                "... to now + N",
                watched,
                &[(0, spawned), (500, || note(Note::Interval(ms(2000))))],
                2500,
                Tick,
                &["log watchdog_expired", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            ("ready", watched, &[(0, spawned)], 10, i(note(Note::Ready)), &["log ready", "ready_file"], "running"),
            ("ready once", watched, &[(0, spawned), (10, ready)], 20, i(note(Note::Ready)), &[], "running"),
            (
                "reloading: not ready",
                watched,
                &[(0, spawned), (10, ready)],
                20,
                i(note(Note::Reloading)),
                &["ready_file_gone", "log not_ready"],
                "running",
            ),
            (
                "ready timeout",
                ready_gated,
                &[(0, spawned)],
                3000,
                Tick,
                &["log ready_timeout", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            ("no watchdog before ready", ready_gated, &[(0, spawned)], 2999, Tick, &[], "running"),
            ("ready arms the watchdog", ready_gated, &[(0, spawned), (2000, ready)], 2999, Tick, &[], "running"),
            (
                "... from then",
                ready_gated,
                &[(0, spawned), (2000, ready)],
                3000,
                Tick,
                &["log watchdog_expired", "drain_file", "ready_file_gone", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            (
                "EXTEND_TIMEOUT_USEC before ready",
                ready_gated,
                &[(0, spawned), (2500, || note(Note::Extend(ms(2000))))],
                3000,
                Tick,
                &[],
                "running",
            ),
            (
                "... moves the ready deadline",
                ready_gated,
                &[(0, spawned), (2500, || note(Note::Extend(ms(2000))))],
                4500,
                Tick,
                &["log ready_timeout", "drain_file", "forward SIGQUIT", "no_restart"],
                "stopping",
            ),
            (
                "a stop removes the ready file and disarms",
                watched,
                &[(0, spawned), (10, ready)],
                20,
                i(Signal(SIGTERM)),
                &["log stop_requested", "drain_file", "ready_file_gone", "forward SIGTERM", "no_restart"],
                "stopping",
            ),
            (
                "no watchdog during a stop",
                watched,
                &[(0, spawned), (10, || Signal(SIGTERM))],
                1500,
                Tick,
                &[],
                "stopping",
            ),
            (
                "an exit removes the ready file",
                watched,
                &[(0, spawned), (10, ready)],
                20,
                i(Reaped(W, exited(3))),
                &["log child_exited", "ready_file_gone", "all SIGTERM"],
                "draining",
            ),
            (
                "status is kept and logged",
                watched,
                &[(0, spawned)],
                20,
                i(note(Note::Status("in_flight=3".into()))),
                &["log status"],
                "running",
            ),
        ];
        for (name, settings, before, at, step, want, phase) in rows {
            let mut st = Story::new(settings());
            for (t, input) in *before {
                st.feed(*t, Step::Tick);
                st.feed(*t, input());
            }
            assert_eq!(st.feed(*at, step.clone()), *want, "{name}: actions");
            assert_eq!(st.phase(), *phase, "{name}: phase");
        }
    }

    #[test]
    fn a_stop_drainit_began_never_exits_0_and_never_restarts() {
        let mut st = Story::new(watched());
        st.feed(0, Spawned(W));
        st.feed(1000, Tick);
        assert_eq!(st.feed(1200, Reaped(W, exited(0))), ["log child_exited", "all SIGTERM"]);
        assert_eq!(st.feed(1200, Children { left: false }), ["log exit", "exit 131"], "128 + SIGQUIT");
        let mut st = Story::new(watched());
        st.feed(0, Spawned(W));
        st.feed(1000, Tick);
        st.feed(1200, Reaped(W, exited(75)));
        assert_eq!(st.feed(1200, Children { left: false }), ["log exit", "exit 75"], "a backoff code is final");
    }

    fn memory_stop() -> Settings {
        Settings { memory_stop: Some(90), memory_check: ms(1000), ..policy() }
    }
    fn memory_stopping() -> Story {
        let mut st = running(memory_stop());
        st.feed(0, Signal(SIGTERM));
        st
    }
    fn oom_rose() -> Story {
        let mut st = running(policy());
        st.feed(0, OomKills(1));
        st
    }
    fn killed_oom_rose() -> Story {
        let mut st = killed();
        st.feed(5000, OomKills(1));
        st
    }
    fn memory_sleeping() -> Story {
        let mut st = running(memory_stop());
        st.feed(0, Reaped(W, exited(75)));
        st.feed_all(&[(0, i(RetryAfter(Some(ms(300))))), (0, i(Children { left: false }))]);
        st
    }

    /// The memory inputs: phase x input -> actions + phase. `--memory-stop
    /// 90` and a check every second where set.
    #[test]
    fn memory_transitions() {
        let stop: &[&str] = &["log memory_stop", "drain_file", "forward SIGTERM", "no_restart"];
        let rows: &[PhaseRow] = &[
            ("the check comes due: one read", || running(memory_stop()), 1000, Tick, &["read_usage"], "running"),
            ("a memory event: one read", || running(memory_stop()), 10, i(MemoryEvent), &["read_usage"], "running"),
            ("no option: an event reads nothing", || running(policy()), 10, i(MemoryEvent), &[], "running"),
            ("under the percent", || running(memory_stop()), 10, i(Usage { used: 89, limit: 100 }), &[], "running"),
            (
                "at the percent: a stop",
                || running(memory_stop()),
                10,
                i(Usage { used: 90, limit: 100 }),
                stop,
                "stopping",
            ),
            ("a stop came first: no read", memory_stopping, 10, i(MemoryEvent), &[], "stopping"),
            ("a stop came first: no check", memory_stopping, 1000, Tick, &[], "stopping"),
            (
                "a stop came first: a reading changes nothing",
                memory_stopping,
                10,
                i(Usage { used: 100, limit: 100 }),
                &[],
                "stopping",
            ),
            ("asleep: no read", memory_sleeping, 10, i(MemoryEvent), &[], "sleeping"),
            ("an OOM kill is told", || running(policy()), 10, i(OomKills(1)), &["log oom_kill"], "running"),
            ("told once", oom_rose, 10, i(OomKills(1)), &[], "running"),
            (
                "the worker's SIGKILL after the count rose",
                oom_rose,
                10,
                i(Reaped(W, Outcome::Signaled(SIGKILL))),
                &["log child_exited", "all SIGTERM"],
                "draining",
            ),
            ("an OOM kill while asleep is told", sleeping, 10, i(OomKills(2)), &["log oom_kill"], "sleeping"),
        ];
        check_phase_rows(rows);
    }

    /// The worker's end, told: `oom=1` only for a SIGKILL drainit did not
    /// send while the count rose; its code, `--oom-exit-code`, then remapped.
    #[test]
    fn an_oom_killed_worker() {
        let sigkill = Outcome::Signaled(SIGKILL);
        let oom_line = |st: &mut Story, outcome| {
            let out = st.actions(10, Reaped(W, outcome));
            out.iter()
                .find_map(|a| match a {
                    Action::Log(e @ Event::ChildExited { .. }) => Some(e.to_string()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        assert!(oom_line(&mut oom_rose(), sigkill).ends_with(" oom=1"));
        assert!(!oom_line(&mut running(policy()), sigkill).contains("oom"), "no count rose");
        assert!(!oom_line(&mut oom_rose(), exited(3)).contains("oom"), "a child's kill: exit 3");
        assert!(!oom_line(&mut killed_oom_rose(), sigkill).contains("oom"), "drainit's own SIGKILL");
        let rows: [(&str, Option<Code>, Remap, i32); 3] = [
            ("137", None, Remap::default(), 137),
            ("--oom-exit-code", Some(Code(3)), Remap::default(), 3),
            ("then --remap-exit", Some(Code(3)), Remap::parse(["3:4", "137:5"]).unwrap(), 4),
        ];
        for (name, oom_exit_code, remap, code) in rows {
            let mut st = Story::new(Settings { oom_exit_code, remap, ..with_finish() });
            st.feed(0, Spawned(W));
            st.feed(0, OomKills(1));
            st.feed(10, Reaped(W, sigkill));
            let out = st.actions(10, Children { left: false });
            let Some(Action::SpawnFinish(record)) = out.first() else { panic!("{name}: {out:?}") };
            assert_eq!(record.code(), Code(code), "{name}");
            let vars = crate::environment::finish_vars(record);
            assert!(vars.contains(&("DRAINIT_WORKER_STATUS", "oom_kill".into())), "{name}: {vars:?}");
            assert!(vars.contains(&("DRAINIT_OOM_KILLS", "1".into())), "{name}");
        }
        let mut st = Story::new(Settings { oom_counter: false, ..with_finish() });
        st.feed(0, Spawned(W));
        st.feed(10, Reaped(W, exited(0)));
        let out = st.actions(10, Children { left: false });
        let Some(Action::SpawnFinish(record)) = out.first() else { panic!("{out:?}") };
        assert!(
            crate::environment::finish_vars(record).contains(&("DRAINIT_OOM_KILLS", "unknown".into())),
            "no counter found"
        );
        // Found after the first spawn (its look waits for it): counted from
        // then, and a count already told is not reset by a late call.
        for (told, want) in [(None, "0"), (Some(2), "2")] {
            let mut st = Story::new(Settings { oom_counter: false, ..with_finish() });
            st.s.oom_counter_found();
            st.feed(0, Spawned(W));
            if let Some(n) = told {
                st.feed(5, OomKills(n));
                st.s.oom_counter_found();
            }
            st.feed(10, Reaped(W, exited(0)));
            let out = st.actions(10, Children { left: false });
            let Some(Action::SpawnFinish(record)) = out.first() else { panic!("{out:?}") };
            let vars = crate::environment::finish_vars(record);
            assert!(vars.contains(&("DRAINIT_OOM_KILLS", want.into())), "{told:?}: {vars:?}");
        }
    }

    #[test]
    fn the_memory_check_is_the_one_periodic_wakeup_and_only_with_the_option() {
        let st = running(policy());
        assert_eq!(st.deadline(), None, "no option: no timer while the worker runs");
        let mut st = running(memory_stop());
        assert_eq!(st.deadline(), Some(ms(1000)));
        st.feed(1300, Tick);
        assert_eq!(st.deadline(), Some(ms(2300)), "re-armed from when it ran");
        st.feed(1400, Signal(SIGTERM));
        assert_eq!(st.deadline(), Some(ms(6400)), "a stop: only its grace is left");
        let mut st = running(memory_stop());
        st.feed(10, Reaped(W, exited(75)));
        assert_eq!(st.s.timers.get(crate::timers::Timer::MemoryCheck), None, "no worker, no check");
    }

    #[test]
    fn a_memory_stop_is_the_watchdogs_stop() {
        let mut st = running(Settings { rewrite: Rewrite::parse(["TERM:QUIT"]).unwrap(), ..memory_stop() });
        let out = st.actions(10, Usage { used: 95 << 20, limit: 100 << 20 });
        assert_eq!(
            out[0],
            Action::Log(Event::MemoryStop {
                used: 95 << 20,
                limit: 100 << 20,
                percent: 90,
                signal: SIGQUIT,
                status: None
            }),
            "the signal as it goes out"
        );
        assert_eq!(st.feed(20, Reaped(W, exited(0))), ["log child_exited", "all SIGTERM"]);
        let out = st.actions(20, Children { left: false });
        let Some(Action::Exit(record)) = out.get(1) else { panic!("{out:?}") };
        assert_eq!(record.code(), Code(143), "never 0: 128 + SIGTERM");
        assert!(record.to_string().contains(" reason=memory"), "{record}");
        let mut st = running(Settings { finish_timeout: Some(ms(3000)), ..memory_stop() });
        st.feed(10, Usage { used: 90, limit: 100 });
        st.feed(20, Reaped(W, exited(75)));
        let out = st.actions(20, Children { left: false });
        let Some(Action::SpawnFinish(record)) = out.first() else { panic!("no restart: {out:?}") };
        assert!(crate::environment::finish_vars(record).contains(&("DRAINIT_STOP_REASON", "memory".into())));
    }

    #[test]
    fn the_watchdog_is_rearmed_for_every_attempt() {
        let mut st = Story::new(watched());
        st.feed(0, Spawned(W));
        st.feed(500, note(Note::Interval(ms(4000))));
        st.feed_all(&[
            (600, i(Reaped(W, exited(75)))),
            (600, i(RetryAfter(Some(ms(100))))),
            (600, i(Children { left: false })),
        ]);
        assert_eq!(st.deadline(), Some(ms(700)), "no watchdog while asleep");
        st.feed_all(&[(700, Tick), (700, i(Spawned(W + 1)))]);
        assert_eq!(st.deadline(), Some(ms(1700)), "the configured interval again, from the new start");
    }

    #[test]
    fn the_watchdog_event_says_interval_and_since() {
        let mut st = Story::new(watched());
        st.feed(0, Spawned(W));
        st.feed(300, note(Note::Ping));
        st.feed(900, note(Note::Status("job=7".into())));
        let out = st.actions(1300, Tick);
        assert_eq!(
            out[0],
            Action::Log(Event::WatchdogExpired {
                interval: ms(1000),
                since: ms(1000),
                signal: SIGQUIT,
                status: Some("job=7".into())
            })
        );
        st.feed(1400, Reaped(W, Outcome::Signaled(SIGQUIT)));
        let out = st.actions(1400, Children { left: false });
        let [_, Action::Exit(record)] = out.as_slice() else { panic!("{out:?}") };
        assert!(record.to_string().ends_with("attempts=1 reason=watchdog status=\"job=7\""), "{record}");
    }

    #[test]
    fn after_a_late_grant_since_still_counts_from_the_last_ping() {
        let mut st = Story::new(watched());
        st.feed(0, Spawned(W));
        st.feed(300, note(Note::Ping));
        assert_eq!(st.feed(3000, Tick), ["log watchdog_late"], "due at 1300, drainit ran at 3000");
        let out = st.actions(4000, Tick);
        let Action::Log(Event::WatchdogExpired { since, .. }) = &out[0] else { panic!("{out:?}") };
        assert_eq!(*since, ms(3700));
    }

    #[test]
    fn the_outer_socket_is_told() {
        let mut st = Story::new(Settings { outer: true, ..watched() });
        st.feed(0, Spawned(W));
        assert_eq!(st.feed(10, note(Note::Ready)), ["log ready", "ready_file", "tell Ready"]);
        assert_eq!(st.feed(20, note(Note::Ping)), ["tell Watchdog"]);
        assert_eq!(st.feed(30, note(Note::Reloading)), ["ready_file_gone", "log not_ready", "tell Reloading"]);
        assert_eq!(
            st.feed(40, note(Note::Ready)),
            ["log ready", "ready_file", "tell Ready"],
            "again after RELOADING=1"
        );
        st.feed(45, note(Note::Ping));
        assert_eq!(st.feed(46, note(Note::Ready)), Vec::<String>::new(), "but not twice in a row");
        assert_eq!(st.feed(50, note(Note::Status("a".into()))), ["log status", "tell Status(\"a\")"]);
        assert_eq!(
            st.feed(60, Signal(SIGTERM)),
            ["log stop_requested", "drain_file", "ready_file_gone", "tell Stopping", "forward SIGTERM", "no_restart"]
        );
    }

    fn sequence(text: &str, p: Settings) -> Settings {
        Settings { stop_sequence: Some(StopSequence::parse(text).unwrap()), ..p }
    }
    fn sidekiq() -> Settings {
        sequence("TSTP,TERM@2s", policy())
    }
    fn postgres() -> Settings {
        sequence("TERM,INT@1s,QUIT@3s", policy())
    }

    /// The stop sequence's steps among `out`: (signal, step, waited in ms),
    /// each checked to be the `stop_forwarded` that follows its forward.
    fn steps(out: &[Action]) -> Vec<(String, u32, u128)> {
        let mut steps = Vec::new();
        for (i, a) in out.iter().enumerate() {
            if let Action::Log(Event::StopForwarded { signal, waited, step: Some(step) }) = a {
                assert_eq!(out[i - 1], Action::Forward(*signal), "the step's forward comes first: {out:?}");
                steps.push((signals::name(*signal), *step, waited.as_millis()));
            }
        }
        steps
    }
    fn step(sig: &str, n: u32, waited: u128) -> (String, u32, u128) {
        (sig.to_string(), n, waited)
    }

    /// A story's inputs at t + ms -> the steps that go out, and what else
    /// is forwarded; the grace is 5s.
    #[test]
    fn stop_sequences() {
        type Row = (&'static str, Settings, Vec<(u64, Step)>, Vec<(&'static str, u32, u128)>);
        let rows: Vec<Row> = vec![
            (
                "sidekiq: quiet at once, shut down at the offset",
                sidekiq(),
                vec![(0, Step::In(Signal(SIGTERM))), (1999, Tick), (2000, Tick)],
                vec![("SIGTSTP", 1, 0), ("SIGTERM", 2, 2000)],
            ),
            (
                "postgres: smart, fast, immediate",
                postgres(),
                vec![(0, Step::In(Signal(SIGTERM))), (1000, Tick), (3000, Tick)],
                vec![("SIGTERM", 1, 0), ("SIGINT", 2, 1000), ("SIGQUIT", 3, 3000)],
            ),
            (
                "a late turn sends every step due, in order",
                postgres(),
                vec![(0, Step::In(Signal(SIGTERM))), (3500, Tick)],
                vec![("SIGTERM", 1, 0), ("SIGINT", 2, 3500), ("SIGQUIT", 3, 3500)],
            ),
            (
                "any stop signal begins it",
                sidekiq(),
                vec![(0, Step::In(Signal(SIGINT))), (2000, Tick)],
                vec![("SIGTSTP", 1, 0), ("SIGTERM", 2, 2000)],
            ),
            (
                "a first step with an offset: nothing at once",
                sequence("TSTP@1s,TERM@2s", policy()),
                vec![(0, Step::In(Signal(SIGTERM))), (1000, Tick), (2000, Tick)],
                vec![("SIGTSTP", 1, 1000), ("SIGTERM", 2, 2000)],
            ),
            (
                "after the stop delay: offsets from its end",
                Settings { stop_delay: ms(1000), ..sidekiq() },
                vec![(0, Step::In(Signal(SIGTERM))), (999, Tick), (1000, Tick), (2999, Tick), (3000, Tick)],
                vec![("SIGTSTP", 1, 1000), ("SIGTERM", 2, 3000)],
            ),
            (
                "the worker's exit ends it",
                postgres(),
                vec![(0, Step::In(Signal(SIGTERM))), (500, Step::In(Reaped(W, exited(0)))), (1000, Tick), (3000, Tick)],
                vec![("SIGTERM", 1, 0)],
            ),
            (
                "the worker's exit during the delay: no step at all",
                Settings { stop_delay: ms(1000), ..sidekiq() },
                vec![(0, Step::In(Signal(SIGTERM))), (500, Step::In(Reaped(W, exited(0)))), (1000, Tick), (3000, Tick)],
                vec![],
            ),
            (
                "the watchdog's stop runs it",
                sequence("TSTP,TERM@2s", Settings { watchdog_signal: SIGTERM, ..watched() }),
                vec![(1000, Tick), (3000, Tick)],
                vec![("SIGTSTP", 1, 0), ("SIGTERM", 2, 2000)],
            ),
            (
                "with --watchdog-signal given, the watchdog's stop sends it first",
                sequence("TSTP,TERM@2s", Settings { watchdog_signal_given: true, ..watched() }),
                vec![(1000, Tick), (3000, Tick)],
                vec![("SIGQUIT", 1, 0), ("SIGTERM", 2, 2000)],
            ),
            (
                "the ready timeout's stop too",
                sequence("TSTP,TERM@1s", Settings { watchdog_signal_given: true, ..ready_gated() }),
                vec![(3000, Tick), (4000, Tick)],
                vec![("SIGQUIT", 1, 0), ("SIGTERM", 2, 1000)],
            ),
            (
                "a stop signal's stop ignores --watchdog-signal",
                sequence("TSTP,TERM@2s", Settings { watchdog_signal_given: true, ..watched() }),
                vec![(500, Step::In(Signal(SIGTERM))), (2500, Tick)],
                vec![("SIGTSTP", 1, 0), ("SIGTERM", 2, 2000)],
            ),
        ];
        for (name, settings, inputs, want) in rows {
            let mut st = running(settings);
            let mut got = Vec::new();
            for (at, input) in &inputs {
                got.extend(steps(&st.actions(*at, input.clone())));
            }
            let want: Vec<_> = want.iter().map(|(s, n, w)| step(s, *n, *w)).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn the_first_step_goes_out_in_the_stops_turn_before_no_restart() {
        let mut st = running(sidekiq());
        assert_eq!(
            st.feed(0, Signal(SIGTERM)),
            ["log stop_requested", "drain_file", "forward SIGTSTP", "log stop_forwarded", "no_restart"]
        );
        assert_eq!(st.phase(), "stopping");
        assert_eq!(st.deadline(), Some(ms(2000)), "the next step is the next timer");
        assert_eq!(st.s.timers.get(crate::timers::Timer::StopStep), Some(st.t + ms(2000)));
        assert_eq!(st.s.timers.get(crate::timers::Timer::Grace), Some(st.t + ms(5000)));
        assert_eq!(st.feed(2000, Tick), ["forward SIGTERM", "log stop_forwarded"]);
        assert_eq!(st.deadline(), Some(ms(5000)), "after the last step: the grace deadline");
        assert_eq!(st.feed(5000, Tick), ["deadline"]);
    }

    #[test]
    fn a_second_stop_goes_out_at_once_and_the_sequence_goes_on() {
        let mut st = running(sidekiq());
        st.feed(0, Signal(SIGTERM));
        assert_eq!(st.feed(500, Signal(SIGTERM)), ["forward SIGTERM"]);
        assert_eq!(st.feed(700, Signal(SIGINT)), ["forward SIGINT"]);
        assert_eq!(steps(&st.actions(2000, Tick)), [step("SIGTERM", 2, 2000)]);
    }

    #[test]
    fn a_second_stop_during_the_delay_goes_out_and_begins_the_sequence() {
        let mut st = running(Settings { stop_delay: ms(1000), ..sidekiq() });
        st.feed(0, Signal(SIGTERM));
        let out = st.actions(400, Signal(SIGINT));
        assert_eq!(out[0], Action::Forward(SIGINT), "the second stop itself, at once: {out:?}");
        assert_eq!(steps(&out), [step("SIGTSTP", 1, 400)]);
        assert_eq!(st.deadline(), Some(ms(2400)), "offsets from the delay's early end");
        assert_eq!(steps(&st.actions(2400, Tick)), [step("SIGTERM", 2, 2400)]);
    }

    #[test]
    fn steps_replace_the_rewritten_stop_signal_others_are_rewritten_as_usual() {
        let rewrite = Rewrite::parse(["TERM:QUIT", "HUP:USR1"]).unwrap();
        let mut st = running(Settings { rewrite, ..sidekiq() });
        assert_eq!(steps(&st.actions(0, Signal(SIGTERM))), [step("SIGTSTP", 1, 0)]);
        assert_eq!(st.feed(100, Signal(HUP)), ["forward SIGUSR1"]);
        assert_eq!(st.feed(200, Signal(SIGTERM)), ["forward SIGQUIT"], "a second stop: rewritten, as always");
        assert_eq!(steps(&st.actions(2000, Tick)), [step("SIGTERM", 2, 2000)], "steps are not rewritten");
    }

    #[test]
    fn without_a_worker_a_stop_is_forwarded_as_usual() {
        // The worker exited; what it left gets the stop signal, not the steps.
        let mut st = draining(sidekiq(), 75);
        assert_eq!(st.feed(10, Signal(SIGTERM)), ["log stop_requested", "drain_file", "forward SIGTERM", "no_restart"]);
        assert!(!st.s.timers.is_armed(crate::timers::Timer::StopStep));
    }

    /// The supervisor explored: every sequence of inputs a real run can
    /// produce, up to DEPTH inputs, from the start, each checked against
    /// the contract's promises at every step. The world is modelled as
    /// little as the promises need: the worker, what it left, the finish
    /// program (alive or not), and the clock; the executor's answers are
    /// fed as the loop feeds them (a spawn may succeed or fail, a kill
    /// reaches what lives).
    mod explore {
        use super::*;

        /// Inputs per path; DRAINIT_EXPLORE_DEPTH for more.
        const DEPTH: usize = 6;

        #[derive(Clone)]
        struct World {
            s: Supervisor,
            t: Instant,
            t0: Instant,
            worker: Option<i32>,
            worker_ran: bool,
            leftovers: u32,
            finish: Option<i32>,
            finish_runs: u32,
            /// The sweep's runs of the finish program (for the predecessor).
            sweep_runs: u32,
            /// A stop came during the sweep, before any worker.
            stopped_sweeping: Option<Signo>,
            next_pid: i32,
            stop_at: Option<Instant>,
            /// A SIGKILL went out to everything alive (which then dies and
            /// forks no more) since the last spawn.
            killed_since_stop: bool,
            spawns_after_stop: u32,
            /// The supervisor said no restart follows.
            no_restart: bool,
            /// The worker's last outcome, and whether drainit slept when a stop came.
            last: Option<Outcome>,
            stopped_asleep: Option<Signo>,
            exited: Option<Code>,
            failed_spawn: Option<Code>,
            break_exec: bool,
            /// The working set is past `--memory-stop`'s percent.
            over: bool,
            /// OOM kills so far, and whether one came since the last spawn.
            oom_kills: u64,
            oom_since_spawn: bool,
            /// The worker's last death was the OOM killer's.
            last_oom: bool,
            /// The last step of the stop sequence that went out.
            last_step: u32,
        }

        #[derive(Clone, Copy, Debug)]
        enum Ext {
            Term,
            Usr1,
            WorkerExits(i32),
            WorkerKilledBySignal,
            LeaveChild,
            LeftoverDies,
            FinishExits,
            Children,
            Tick,
            TickLate,
            Ready,
            Ping,
            Trigger,
            BreakExec,
            /// The memory cgroup: an OOM kill counted, an event, the
            /// working set climbing past the percent.
            OomKill,
            MemoryEvent,
            OverLimit,
        }

        const ALPHABET: [Ext; 15] = [
            Ext::Term,
            Ext::Usr1,
            Ext::WorkerExits(0),
            Ext::WorkerExits(75),
            Ext::WorkerKilledBySignal,
            Ext::LeaveChild,
            Ext::LeftoverDies,
            Ext::FinishExits,
            Ext::Children,
            Ext::Tick,
            Ext::TickLate,
            Ext::Ready,
            Ext::Ping,
            Ext::Trigger,
            Ext::BreakExec,
        ];

        /// With `--memory-stop`, the memory inputs instead of the notify
        /// ones (readiness is explored in its own configurations): the
        /// states to explore stay as many.
        fn alphabet(settings: &Settings) -> Vec<Ext> {
            if settings.memory_stop.is_none() {
                return ALPHABET.to_vec();
            }
            let notify = |e: &Ext| matches!(e, Ext::Ready | Ext::Ping | Ext::Trigger);
            ALPHABET
                .into_iter()
                .filter(|e| !notify(e))
                .chain([Ext::OomKill, Ext::MemoryEvent, Ext::OverLimit])
                .collect()
        }

        impl World {
            fn alive(&self) -> bool {
                self.worker.is_some() || self.leftovers > 0 || self.finish.is_some()
            }

            /// Feed one input, then carry out its actions as the loop does,
            /// answering each (`spawn_ok` decides spawns). Checks every
            /// promise on the way.
            fn feed(&mut self, input: Input, spawn_ok: bool, path: &[String]) {
                let mut queue = vec![input];
                while let Some(input) = queue.pop() {
                    let mut out = Vec::new();
                    self.s.handle(input, &mut Now::at(self.t), &mut out);
                    for action in out {
                        if let Some(answer) = self.act(action, spawn_ok, path) {
                            queue.insert(0, answer);
                        }
                    }
                }
                self.check(path);
            }

            fn act(&mut self, action: Action, spawn_ok: bool, path: &[String]) -> Option<Input> {
                let fail = |what: &str| panic!("{what}\npath: {path:#?}");
                match action {
                    Action::Spawn { .. } => {
                        if self.alive() {
                            fail("a restart while something of the last attempt lives");
                        }
                        if self.stop_at.is_some() {
                            self.spawns_after_stop += 1;
                        }
                        if self.no_restart {
                            fail("a start after no_restart");
                        }
                        if !spawn_ok || std::mem::take(&mut self.break_exec) {
                            self.failed_spawn = Some(Code(127));
                            return Some(SpawnFailed(Code(127)));
                        }
                        self.next_pid += 1;
                        self.killed_since_stop = false;
                        self.oom_since_spawn = false;
                        self.worker = Some(self.next_pid);
                        self.worker_ran = true;
                        Some(Spawned(self.next_pid))
                    }
                    Action::SpawnSweep(_) => {
                        if self.alive() || self.worker_ran {
                            fail("the sweep after something of this run started");
                        }
                        self.sweep_runs += 1;
                        if !spawn_ok {
                            return Some(SpawnFailed(Code(126)));
                        }
                        self.next_pid += 1;
                        self.finish = Some(self.next_pid);
                        Some(Spawned(self.next_pid))
                    }
                    Action::SpawnFinish(_) => {
                        if self.worker.is_some() || self.leftovers > 0 {
                            fail("the finish program while the worker's group lives");
                        }
                        if !self.worker_ran {
                            fail("the finish program though no worker ran");
                        }
                        self.finish_runs += 1;
                        self.killed_since_stop = false;
                        self.next_pid += 1;
                        self.finish = Some(self.next_pid);
                        Some(Spawned(self.next_pid))
                    }
                    Action::Deadline => {
                        let n = u32::from(self.worker.is_some()) + self.leftovers;
                        self.kill_all();
                        Some(Killed(n as usize))
                    }
                    Action::SignalAll(SIGKILL) => {
                        self.kill_all();
                        None
                    }
                    Action::ReadRetryAfter => {
                        if self.no_restart {
                            fail("the retry-after file read after no_restart");
                        }
                        Some(RetryAfter(None))
                    }
                    Action::NoRestart => {
                        if self.stop_at.is_none() {
                            fail("no_restart before a stop");
                        }
                        self.no_restart = true;
                        None
                    }
                    Action::Exit(record) => {
                        if self.alive() {
                            fail("exit while a process drainit answers for lives");
                        }
                        self.exited = Some(record.code());
                        None
                    }
                    Action::ReadUsage => {
                        if self.stop_at.is_some() {
                            fail("memory read after a stop began");
                        }
                        if self.s.settings.memory_stop.is_none() {
                            fail("memory read without --memory-stop");
                        }
                        if self.worker.is_none() {
                            fail("memory read with no worker running");
                        }
                        Some(Usage { used: if self.over { 95 } else { 50 }, limit: 100 })
                    }
                    Action::Log(Event::ChildExited { oom: true, .. }) => {
                        if !self.oom_since_spawn || self.killed_since_stop {
                            fail("oom=1 without a count that rose, or after drainit's own SIGKILL");
                        }
                        None
                    }
                    Action::Log(Event::MemoryStop { .. }) if !self.over => fail("a memory stop under the percent"),
                    // A step goes to the running worker, in order, before
                    // the deadline's SIGKILL.
                    Action::Log(Event::StopForwarded { step: Some(n), .. }) => {
                        if self.worker.is_none() {
                            fail("a step of the stop sequence after the worker's exit");
                        }
                        if self.stop_at.is_none() || self.killed_since_stop {
                            fail("a step of the stop sequence outside a stop, or after the deadline");
                        }
                        if n != self.last_step + 1 {
                            fail("the steps of the stop sequence out of order");
                        }
                        self.last_step = n;
                        None
                    }
                    Action::Log(
                        Event::StopRequested { .. }
                        | Event::WatchdogExpired { .. }
                        | Event::ReadyTimeout { .. }
                        | Event::MemoryStop { .. },
                    ) => {
                        if self.stop_at.is_none() {
                            self.stop_at = Some(self.t);
                        }
                        None
                    }
                    _ => None,
                }
            }

            /// SIGKILL reaches everything; what dies is reaped by later
            /// inputs (`WorkerKilledBySignal`, `LeftoverDies`, ...).
            fn kill_all(&mut self) {
                self.killed_since_stop = true;
            }

            fn check(&self, path: &[String]) {
                let fail = |what: String| panic!("{what}\npath: {path:#?}");
                if self.finish_runs > 1 || self.sweep_runs > 1 {
                    fail("the finish program ran twice for one death".into());
                }
                if self.spawns_after_stop > 0 {
                    fail("a restart after a stop".into());
                }
                // No phase outlives the stop: while something lives, a
                // timer is armed no later than the orchestrator's SIGKILL
                // (less the finish margin), or the SIGKILL went out.
                if let Some(stop) = self.stop_at
                    && self.alive()
                    && !self.killed_since_stop
                {
                    let limit = stop + ms(7000) - FINISH_MARGIN;
                    match self.s.next_deadline() {
                        Some(at) if at <= limit => {}
                        other => {
                            fail(format!("a stop at {:?} leaves {other:?} past {:?}", stop - self.t0, limit - self.t0))
                        }
                    }
                }
                // The sequence goes on while the worker runs: its next
                // step is armed until the last went out.
                let steps = self.s.settings.stop_sequence.as_ref().map_or(0, |q| q.steps().len()) as u32;
                if matches!(self.s.phase, Phase::Stopping { .. })
                    && steps > 0
                    && self.last_step < steps
                    && !self.killed_since_stop
                    && !self.s.timers.is_armed(crate::timers::Timer::StopStep)
                {
                    fail(format!("the stop sequence stalled after step {}", self.last_step));
                }
                if let Some(code) = self.exited {
                    let want = match (self.last, self.stopped_asleep) {
                        _ if !self.worker_ran => self.stopped_sweeping.map(Code::signal).or(self.failed_spawn),
                        (_, Some(sig)) => Some(Code::signal(sig)),
                        (_, None) if self.failed_spawn.is_some() => self.failed_spawn,
                        (Some(_), None) if self.last_oom && self.s.settings.oom_exit_code.is_some() => {
                            self.s.settings.oom_exit_code
                        }
                        (Some(o), None) => Some(o.code()),
                        (None, None) => None,
                    };
                    // A stop drainit began itself never ends in 0.
                    let own_stop = self.s.record.stop.filter(|s| s.reason != StopReason::Signal);
                    let want = match want {
                        Some(Code(0)) if let Some(stop) = own_stop => Some(Code::signal(stop.signal)),
                        want => want,
                    };
                    if Some(code) != want {
                        fail(format!("exit {code:?}, the contract's table says {want:?}"));
                    }
                }
            }
        }

        impl World {
            fn new(settings: Settings, spawn_ok: bool, sweep: bool) -> World {
                let t0 = Instant::now();
                let mut s = Supervisor::new(settings, 7);
                if sweep {
                    s.sweep_first(Predecessor { attempt: Some(2), pid: Some(1), started: None });
                }
                let mut w = World {
                    s,
                    t: t0,
                    t0,
                    worker: None,
                    worker_ran: false,
                    leftovers: 0,
                    finish: None,
                    finish_runs: 0,
                    sweep_runs: 0,
                    stopped_sweeping: None,
                    next_pid: 100,
                    stop_at: None,
                    killed_since_stop: false,
                    spawns_after_stop: 0,
                    no_restart: false,
                    last: None,
                    stopped_asleep: None,
                    exited: None,
                    failed_spawn: None,
                    break_exec: false,
                    over: false,
                    oom_kills: 0,
                    oom_since_spawn: false,
                    last_oom: false,
                    last_step: 0,
                };
                let mut out = Vec::new();
                w.s.start(&mut out);
                let answer = w.act(out.remove(0), spawn_ok, &[]);
                if let Some(answer) = answer {
                    w.feed(answer, spawn_ok, &[]);
                }
                w
            }

            /// `ext` as the loop would feed it here, if it can happen now.
            fn step(&mut self, ext: Ext, path: &[String]) -> bool {
                if self.exited.is_some() {
                    return false;
                }
                let no_worker_but_restart_pending = matches!(self.s.phase, Phase::Sleeping)
                    || matches!(self.s.phase, Phase::Draining { then: Then::Restart(_) });
                let input = match ext {
                    Ext::Term => {
                        if self.s.record.stop.is_none() && no_worker_but_restart_pending {
                            self.stopped_asleep = Some(SIGTERM);
                        }
                        if self.s.record.stop.is_none() && !self.worker_ran {
                            self.stopped_sweeping = Some(SIGTERM);
                        }
                        Signal(SIGTERM)
                    }
                    Ext::Usr1 => Signal(libc::SIGUSR1),
                    Ext::WorkerExits(_) | Ext::WorkerKilledBySignal if self.worker.is_some() => {
                        let outcome = match ext {
                            Ext::WorkerExits(code) => Outcome::Exited(code),
                            _ => Outcome::Signaled(libc::SIGKILL),
                        };
                        self.last = Some(outcome);
                        self.last_oom =
                            matches!(ext, Ext::WorkerKilledBySignal) && self.oom_since_spawn && !self.killed_since_stop;
                        Reaped(self.worker.take().unwrap_or_default(), outcome)
                    }
                    Ext::LeaveChild
                        if (self.worker.is_some() || self.finish.is_some())
                            && self.leftovers == 0
                            && !self.killed_since_stop =>
                    {
                        self.leftovers += 1;
                        return true;
                    }
                    Ext::LeftoverDies if self.leftovers > 0 => {
                        self.leftovers -= 1;
                        Reaped(999, Outcome::Exited(0))
                    }
                    Ext::FinishExits if self.finish.is_some() => {
                        Reaped(self.finish.take().unwrap_or_default(), Outcome::Exited(0))
                    }
                    Ext::Children => Children { left: self.alive() },
                    Ext::Tick | Ext::TickLate => {
                        let Some(at) = self.s.next_deadline() else { return false };
                        self.t = if matches!(ext, Ext::TickLate) { at + ms(10_000) } else { at };
                        while let Some(due) = self.s.take_due(self.t) {
                            self.feed(due, true, path);
                        }
                        return true;
                    }
                    Ext::Ready => Notify(Note::Ready),
                    Ext::Ping => Notify(Note::Ping),
                    Ext::Trigger => Notify(Note::Trigger),
                    Ext::BreakExec if !self.break_exec => {
                        self.break_exec = true;
                        return true;
                    }
                    Ext::OomKill => {
                        self.oom_kills += 1;
                        self.oom_since_spawn = true;
                        OomKills(self.oom_kills)
                    }
                    Ext::MemoryEvent => MemoryEvent,
                    Ext::OverLimit if !self.over => {
                        self.over = true;
                        return true;
                    }
                    _ => return false,
                };
                self.feed(input, true, path);
                true
            }
        }

        fn explore(w: &World, depth: usize, path: &mut Vec<String>, states: &mut u64) {
            *states += 1;
            if depth == 0 {
                return;
            }
            for ext in alphabet(&w.s.settings) {
                let mut next = w.clone();
                path.push(format!("{ext:?} at {:?}", w.t - w.t0));
                if next.step(ext, path) {
                    explore(&next, depth - 1, path, states);
                }
                path.pop();
            }
        }

        #[test]
        fn every_state_keeps_every_promise() {
            let depth = std::env::var("DRAINIT_EXPLORE_DEPTH").ok().and_then(|d| d.parse().ok()).unwrap_or(DEPTH);
            let configs: [(&str, Settings, bool); 8] = [
                ("plain", policy(), false),
                (
                    "stop sequence, stop delay, finish program",
                    Settings { stop_delay: ms(1000), ..sequence("TSTP,TERM@2s,QUIT@3500ms", with_finish()) },
                    false,
                ),
                (
                    "stop sequence, watchdog signal",
                    sequence("TSTP,TERM@1s", Settings { watchdog_signal_given: true, ..ready_gated() }),
                    false,
                ),
                ("stop delay, finish program", Settings { stop_delay: ms(2000), ..with_finish() }, false),
                ("watchdog, finish program", Settings { finish_timeout: Some(ms(30_000)), ..watched() }, false),
                ("ready timeout", Settings { watchdog_signal: SIGTERM, ..ready_gated() }, false),
                (
                    "memory stop, stop sequence, OOM exit code, finish program",
                    sequence(
                        "TSTP,TERM@1s",
                        Settings { memory_stop: Some(90), oom_exit_code: Some(Code(3)), ..with_finish() },
                    ),
                    false,
                ),
                ("the sweep first, finish program", with_finish(), true),
            ];
            let mut total = 0;
            for (name, settings, sweep) in configs {
                for spawn_ok in [true, false] {
                    let mut states = 0;
                    explore(&World::new(settings.clone(), spawn_ok, sweep), depth, &mut Vec::new(), &mut states);
                    eprintln!(
                        "explored {name} (first spawn {}): {states} states, depth {depth}",
                        if spawn_ok { "ok" } else { "fails" }
                    );
                    total += states;
                }
            }
            eprintln!("explored {total} states in all");
        }
    }
}
