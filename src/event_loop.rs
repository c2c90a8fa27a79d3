//! The event loop: the edge where the supervisor's decisions meet syscalls.
//! Each turn blocks once on the signalfd, with a timeout that is the time
//! left to the nearest deadline (none when idle, so idle costs no wakeup),
//! then takes the pending signals and the exited children (a bounded batch
//! of each), checks the clock, and carries out what the supervisor asked for.

use std::collections::VecDeque;
use std::fs;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::unistd::Pid;

use crate::config::Config;
use crate::events::Event;
use crate::procs;
use crate::reap::{self, Left, Mode};
use crate::retry_after::RetryAfter;
use crate::signals::{SIGCHLD, SIGKILL, SignalSource, Signo};
use crate::spawn::Spawner;
use crate::supervisor::{self, Action, Supervisor};
use crate::sys;
use crate::tty;

/// drainit's own failure (fork, signal setup): the contract's 125.
pub const FAILED: i32 = 125;

const SIGNALS_PER_TURN: usize = 64;
const REAPED_PER_TURN: usize = 1024;

struct Edge {
    signals: SignalSource,
    spawner: Spawner,
    retry_after: RetryAfter,
    mode: Mode,
    /// The current (or last) worker's process group.
    group: Option<i32>,
    /// Whether drainit has reaped the worker. Until then the worker's pid
    /// (its group's id) cannot be reused, so `kill(-group)` is exact; after,
    /// the number may name an unrelated group, and what is left of the
    /// worker's is found in /proc instead.
    leader_reaped: bool,
    /// Our pid as /proc names it, when /proc belongs to our PID namespace.
    proc_self: Option<i32>,
    /// Whether the last round of reaping left any child. Every process
    /// drainit answers for outside the group is a descendant, and a live
    /// descendant means a live child: with none, /proc need not be read.
    children_left: bool,
    /// A SIGCHLD came, or the last round of reaping stopped at its limit:
    /// reap (at once, in the second case).
    reap_again: bool,
}

/// Run the worker to the end; returns drainit's exit code.
pub fn run(config: Config, signals: SignalSource) -> i32 {
    let mode = reap::setup();
    Event::Started { mode: mode.name(), grace: config.grace, orchestrator_timeout: config.orchestrator_timeout }.emit();
    let take_tty = tty::hand_over(&signals);
    let retry_after = RetryAfter::new();
    let spawner = match Spawner::new(&config.command, retry_after.path(), take_tty) {
        Ok(spawner) => spawner,
        Err(why) => {
            Event::Failed { what: "command", error: why }.emit();
            return 2;
        }
    };
    let policy = supervisor::Policy { grace: config.grace, rewrite: config.rewrite, backoff: config.backoff };
    let mut supervisor = Supervisor::new(policy, seed());
    let mut edge = Edge {
        signals,
        spawner,
        retry_after,
        mode,
        group: None,
        leader_reaped: false,
        proc_self: proc_self(),
        children_left: true,
        reap_again: false,
    };

    let code = match edge.run(&mut supervisor) {
        Err(code) => code,
        Ok(never) => match never {},
    };
    // drainit exits next: the kernel releases the signalfd, the worker's
    // stack and the heap in one go, faster than closing and unmapping them
    // one by one would (each container stop waits for this).
    std::mem::forget(edge);
    code
}

/// The event loop's ways out: drainit's exit code.
type Exit = Result<(), i32>;

impl Edge {
    /// The loop: one blocking wait per turn, then signals, then exits, then
    /// the clock. Ends only with drainit's exit code.
    fn run(&mut self, supervisor: &mut Supervisor) -> Result<std::convert::Infallible, i32> {
        let mut actions: VecDeque<Action> = supervisor.start().into();
        loop {
            self.carry_out(supervisor, &mut actions)?;
            self.wait(supervisor)?;
            let now = Instant::now();
            self.take_signals(supervisor, &mut actions, now)?;
            self.take_exits(supervisor, &mut actions, now)?;
            actions.extend(supervisor.timer(now));
        }
    }

    /// Block until a signal is pending or the nearest deadline; with no
    /// deadline, for as long as it takes (idle costs no wakeup).
    fn wait(&self, supervisor: &Supervisor) -> Exit {
        let timeout = if self.reap_again {
            Some(Duration::ZERO)
        } else {
            supervisor.next_deadline().map(|at| at.saturating_duration_since(Instant::now()))
        };
        self.signals.wait(timeout).map_err(|e| {
            Event::Failed { what: "ppoll", error: e.desc().to_string() }.emit();
            FAILED
        })
    }

    /// Hand the pending signals to the supervisor, a batch at most, so that
    /// senders that never stop cannot keep the loop from reaping and from the
    /// deadline. SIGCHLD only marks that children changed.
    fn take_signals(&mut self, supervisor: &mut Supervisor, actions: &mut VecDeque<Action>, now: Instant) -> Exit {
        let (mut batch, mut count) = ([0; SIGNALS_PER_TURN], 0);
        let drained = self.signals.drain(SIGNALS_PER_TURN, |sig| {
            if let Some(slot) = batch.get_mut(count) {
                *slot = sig;
                count += 1;
            }
        });
        if let Err(e) = drained {
            Event::Failed { what: "signalfd", error: e.desc().to_string() }.emit();
            return Err(FAILED);
        }
        for &sig in &batch[..count] {
            if sig == SIGCHLD {
                self.reap_again = true;
                continue;
            }
            actions.extend(supervisor.signal(sig, now));
            self.carry_out(supervisor, actions)?;
        }
        Ok(())
    }

    /// Reap what has exited (a batch at most, for the same reason) and tell
    /// the supervisor. A turn without SIGCHLD costs no waitpid.
    fn take_exits(&mut self, supervisor: &mut Supervisor, actions: &mut VecDeque<Action>, now: Instant) -> Exit {
        if !std::mem::take(&mut self.reap_again) {
            return Ok(());
        }
        let mut exited = Vec::new();
        let left = reap::reap_pending(REAPED_PER_TURN, |pid, outcome| exited.push((pid, outcome)));
        self.reap_again = left == Left::More;
        self.children_left = left != Left::Nothing;
        for (pid, outcome) in exited.iter().copied() {
            self.leader_reaped |= self.group == Some(pid);
            actions.extend(supervisor.reaped(pid, outcome, now));
            self.carry_out(supervisor, actions)?;
        }
        // Only after a complete round: what is left then is alive, and a
        // walk of /proc (to re-kill after the deadline) is not repeated for
        // every batch of a stream of zombies.
        if left != Left::More && (!exited.is_empty() || !self.children_left) {
            actions.extend(supervisor.children(self.children_left, now));
        }
        Ok(())
    }

    /// Carry out actions in order (some feed answers back to the
    /// supervisor, which may queue more). Err: drainit exits with that code.
    fn carry_out(&mut self, supervisor: &mut Supervisor, actions: &mut VecDeque<Action>) -> Exit {
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Spawn { attempt } => {
                    self.retry_after.clear();
                    match self.spawner.spawn(attempt) {
                        Ok(pid) => {
                            self.group = Some(pid);
                            self.leader_reaped = false;
                            self.children_left = true;
                            actions.extend(supervisor.spawned(pid));
                        }
                        Err(err) => {
                            self.spawner.failure_event(&err).emit();
                            actions.extend(supervisor.spawn_failed(err.code()));
                        }
                    }
                }
                Action::Forward(sig) => self.forward(sig),
                Action::SignalAll(sig) => {
                    self.signal_all(sig, false);
                }
                Action::Deadline => {
                    let remaining = self.signal_all(SIGKILL, true);
                    Event::DeadlineReached { remaining }.emit();
                }
                Action::ReadRetryAfter => supervisor.retry_after(self.retry_after.take()),
                Action::Log(event) => event.emit(),
                // The retry-after file is cleared before every attempt, so
                // one the worker left behind can never count: no unlink on
                // the way out, where every container stop would wait for it.
                Action::Exit(code) => return Err(code),
            }
        }
        Ok(())
    }

    fn forward(&self, sig: Signo) {
        if self.signal_group(sig) {
            Event::Forwarded { signal: sig }.emit();
        }
    }

    /// Signal what is alive of the worker's process group; whether anything was.
    fn signal_group(&self, sig: Signo) -> bool {
        let Some(group) = self.group else { return false };
        if !self.leader_reaped {
            // ESRCH: the group is gone already, which is fine.
            return sys::kill(Pid::from_raw(-group), sig).is_ok();
        }
        let members: Vec<i32> =
            self.descendants().into_iter().filter(|pid| procs::group_of(*pid) == Some(group)).collect();
        for pid in &members {
            let _ = sys::kill(Pid::from_raw(*pid), sig);
        }
        !members.is_empty()
    }

    /// The worker's group, and everything else drainit answers for: the
    /// whole namespace as PID 1 (`kill(-1)`), every descendant otherwise
    /// (even one that left the group with setsid), signalled as the walk
    /// through /proc finds it. The signals that fork cannot outrun go first.
    /// Returns how many processes that was, when `count`.
    fn signal_all(&self, sig: Signo, count: bool) -> usize {
        if let (Some(group), false) = (self.group, self.leader_reaped) {
            let _ = sys::kill(Pid::from_raw(-group), sig);
        }
        if self.mode == Mode::Pid1 {
            let _ = sys::kill(Pid::from_raw(-1), sig);
        }
        let (Some(me), true) = (self.proc_self, self.children_left) else { return 0 };
        if self.mode == Mode::Pid1 {
            return if count { procs::others() } else { 0 };
        }
        let mut found = 0;
        procs::walk(me, |pid| {
            found += 1;
            let _ = sys::kill(Pid::from_raw(pid), sig);
        });
        found
    }

    /// Processes still alive that drainit answers for, as /proc tells.
    fn descendants(&self) -> Vec<i32> {
        match self.proc_self {
            Some(me) if self.children_left => procs::descendants(me),
            _ => Vec::new(),
        }
    }
}

/// Our pid in /proc's numbering, or None when /proc is another namespace's
/// (`unshare --pid` without `--mount-proc`): pids read there would name
/// other processes, so drainit must not signal them.
fn proc_self() -> Option<i32> {
    let me: i32 = fs::read_link("/proc/self").ok()?.to_str()?.parse().ok()?;
    (me == std::process::id() as i32).then_some(me)
}

fn seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}
