//! The executor: carries out the supervisor's actions, where they meet the
//! system (spawns, kills, files, log lines), and answers those that ask.

use std::path::PathBuf;

use nix::unistd::Pid;

use crate::custody::{Custody, GroupTarget, Namespace, Walk};
use crate::environment;
use crate::events::Event;
use crate::exit::Code;
use crate::files::{self, DrainFile, SafeFile};
use crate::memory::Usage;
use crate::notify::Outer;
use crate::private_dir::PrivateDir;
use crate::procs;
use crate::retry_after::RetryAfter;
use crate::signals::{SIGKILL, Signo};
use crate::spawn::{Program, Spawner};
use crate::state::StateDir;
use crate::supervisor::{Action, Input};
use crate::sys;

/// Walks of /proc for one deadline SIGKILL as subreaper, at most.
const KILL_WALKS: usize = 3;

/// What carrying out one action led to.
pub enum Done {
    Nothing,
    Answer(Input),
    Exit(Code),
}

/// Everything the actions act on.
pub struct Executor {
    pub spawner: Spawner,
    pub worker: Program,
    pub finish: Option<Program>,
    pub retry_after: RetryAfter,
    /// Removed at exit, or once no restart follows when the notify socket
    /// does not live in it.
    pub private: Option<PrivateDir>,
    /// The worker's notify socket is bound in `private` (read until exit).
    pub socket_in_private: bool,
    pub drain_file: Option<DrainFile>,
    pub ready_file: Option<SafeFile>,
    /// The notify socket drainit was given itself (Podman, systemd).
    pub outer: Option<Outer>,
    /// drainit set NOTIFY_SOCKET (and the watchdog's variables) for the worker.
    pub notify_vars: bool,
    pub termination_log: Option<PathBuf>,
    pub custody: Custody,
    /// Our pid as /proc names it, when /proc belongs to our PID namespace.
    pub proc_self: Option<i32>,
    /// The memory cgroup's working set and limit, with `--memory-stop`.
    pub usage: Option<Usage>,
    /// `--state-dir`: the record, written before each attempt and at exit.
    pub state: Option<StateDir>,
    /// What the sweep changed in drainit's environment, to undo before the
    /// worker's first start: the sweep's own variables, and the worker's it
    /// took away (with their values).
    pub swept: Option<environment::Undo>,
    /// DRAINIT_ATTEMPT is a number slot (`sys::fill_number`) in drainit's
    /// environment.
    pub attempt_slot: bool,
    /// A stop has begun: the wait is to take the short slice.
    pub short_slice: bool,
    /// /proc's root as PID 1, opened after the first spawn.
    pub proc_root: Option<procs::ProcRoot>,
}

impl Executor {
    /// What is left until the first child has started: /proc's root, for
    /// the look at the namespace as PID 1.
    pub fn after_first_spawn(&mut self) {
        if self.custody.looks_at_namespace() {
            self.proc_root = procs::ProcRoot::open();
        }
    }

    pub fn carry_out(&mut self, action: Action) -> Done {
        match action {
            Action::Spawn { attempt } => {
                if let Some(undo) = self.swept.take() {
                    environment::unsweep(undo);
                }
                if let Some(state) = &self.state {
                    state.running(attempt);
                }
                self.retry_after.clear_before(attempt);
                environment::attempt(attempt, &mut self.attempt_slot);
                self.spawn(false)
            }
            Action::SpawnFinish(record) => {
                environment::finish(&record, self.notify_vars);
                // DRAINIT_ATTEMPT is the finish program's value now.
                self.attempt_slot = false;
                self.spawn(true)
            }
            Action::SpawnSweep(predecessor) => {
                // The worker's variables are not the finish program's; they
                // come back before the worker starts.
                self.swept = Some(environment::sweep(&predecessor, self.notify_vars));
                self.spawn(true)
            }
            Action::Forward(sig) => {
                self.forward(sig);
                Done::Nothing
            }
            Action::SignalAll(sig) => {
                self.signal_all(sig, false);
                Done::Nothing
            }
            Action::Deadline => Done::Answer(Input::Killed(self.signal_all(SIGKILL, true))),
            Action::ReadRetryAfter => Done::Answer(Input::RetryAfter(self.retry_after.take())),
            Action::ReadUsage => match &self.usage {
                Some(usage) => usage
                    .working_set()
                    .map_or(Done::Nothing, |used| Done::Answer(Input::Usage { used, limit: usage.limit })),
                None => Done::Nothing,
            },
            Action::CreateDrainFile => {
                if let Some(file) = &self.drain_file {
                    file.create();
                }
                Done::Nothing
            }
            Action::CreateReadyFile => {
                if let Some(file) = &self.ready_file {
                    file.create();
                }
                Done::Nothing
            }
            Action::RemoveReadyFile => {
                if let Some(file) = &self.ready_file {
                    file.remove("");
                }
                Done::Nothing
            }
            Action::NoRestart => {
                // On the way out: the deadline must win the CPU from here
                // (the wait takes the short slice before it next blocks).
                self.short_slice = true;
                // The directory's rmdir (a filesystem's, whatever $TMPDIR
                // is) runs now, after the forward and while the worker
                // handles its stop signal where it has a CPU of its own (on
                // drainit's, the woken worker often runs first), and never
                // ahead of the stop signal.
                if !self.socket_in_private
                    && let Some(dir) = self.private.take()
                {
                    dir.remove();
                }
                Done::Nothing
            }
            Action::Tell(tell) => {
                if let Some(outer) = &self.outer {
                    outer.tell(&tell);
                }
                Done::Nothing
            }
            Action::Log(event) => {
                event.emit();
                Done::Nothing
            }
            Action::Exit(record) => {
                if let Some(state) = &self.state {
                    state.exited(record.code().0);
                }
                if let Some(path) = &self.termination_log {
                    files::write_termination_log(path, &record);
                }
                if let Some(file) = &self.ready_file {
                    file.remove("");
                }
                if let Some(dir) = self.private.take() {
                    dir.remove();
                }
                Done::Exit(record.code())
            }
        }
    }

    fn spawn(&mut self, finish: bool) -> Done {
        let Some(program) = (if finish { self.finish.as_ref() } else { Some(&self.worker) }) else {
            return Done::Answer(Input::SpawnFailed(Code::FAILED));
        };
        match self.spawner.spawn(program) {
            Ok(pid) => {
                self.custody.started(pid);
                Done::Answer(Input::Spawned(pid))
            }
            Err(err) => {
                // The finish program's failure is logged, nothing more:
                // drainit's exit code stays.
                program.failure_event(&err, finish).emit();
                Done::Answer(Input::SpawnFailed(err.code()))
            }
        }
    }

    fn forward(&self, sig: Signo) {
        let sent = match self.custody.group_target() {
            GroupTarget::Nobody => false,
            // ESRCH: the group is gone already, which is fine.
            GroupTarget::Group(group) => sys::kill(Pid::from_raw(-group), sig).is_ok(),
            GroupTarget::Members(group) => {
                let me = self.proc_self.unwrap_or(0);
                let members: Vec<i32> =
                    procs::descendants(me).into_iter().filter(|pid| procs::group_of(*pid) == Some(group)).collect();
                for pid in &members {
                    let _ = sys::kill(Pid::from_raw(*pid), sig);
                }
                !members.is_empty()
            }
        };
        if sent {
            Event::Forwarded { signal: sig }.emit();
        }
    }

    /// The current group, and everything else drainit answers for, signalled
    /// as the walk through /proc finds it; the signals that fork cannot
    /// outrun go first. Returns how many processes that was, when `count`.
    fn signal_all(&mut self, sig: Signo, count: bool) -> usize {
        let everyone = self.custody.everyone(count);
        if let Some(group) = everyone.group {
            let _ = sys::kill(Pid::from_raw(-group), sig);
        }
        let namespace = match everyone.namespace {
            Namespace::No => false,
            Namespace::Yes => true,
            Namespace::IfOthers => {
                let me = self.proc_self.unwrap_or(1);
                self.proc_root.as_mut().map_or_else(|| procs::anyone_else(me), |root| root.anyone_else(me))
            }
        };
        if namespace {
            let _ = sys::kill(Pid::from_raw(-1), sig);
        }
        match (everyone.descendants, self.proc_self) {
            (Walk::Count, Some(_)) => procs::others(),
            (Walk::Each, Some(me)) if sig == SIGKILL => sys::first_in_line(|| kill_walk(me)),
            (Walk::Each, Some(me)) => {
                let mut found = 0;
                procs::walk(me, |pid| {
                    found += 1;
                    let _ = sys::kill(Pid::from_raw(pid), sig);
                });
                found
            }
            _ => 0,
        }
    }
}

/// The deadline's SIGKILL to every descendant of `me` (a subreaper's walk),
/// as each is found; how many that was.
fn kill_walk(me: i32) -> usize {
    // A SIGKILL walk goes again while it finds someone new: a process forks
    // until the kill lands, and the child of one that died before its
    // children were read went to drainit, whose children the walk read
    // first. A few times at most: between walks nothing is reaped, and a
    // bomb that outpaces them is left to the re-kill after each reaping
    // round. A BTreeSet: a HashSet would seed its hasher from getrandom.
    let mut reached = std::collections::BTreeSet::new();
    for _ in 0..KILL_WALKS {
        let before = reached.len();
        procs::walk(me, |pid| {
            if reached.insert(pid) {
                let _ = sys::kill(Pid::from_raw(pid), SIGKILL);
            }
        });
        if reached.len() == before {
            break;
        }
    }
    reached.len()
}
