//! The event loop: it waits, takes, and carries out; the supervisor decides.
//! Each turn blocks once (in rt_sigtimedwait for the first signal; while log
//! lines wait for stderr, in ppoll on the signalfd and stderr) with a timeout
//! that is the time left to the supervisor's next deadline: none when idle,
//! so idle costs no wakeup. Then it takes the turn's inputs in the order the
//! supervisor relies on (signals, each reaped child, the end of the reaping
//! round, the clock), a bounded batch of each, one at a time. Each signal is
//! handled as it is taken, and one the supervisor says is only forwarded
//! (`only_forwarded`) is sent there and then: the shortest path from the
//! wait to the worker's group. An action's answer (a spawned pid, a
//! retry-after value, a kill count) is fed next, before the next input.
//!
//! Loop errors: setup may fail (drainit exits 2 or 125 before the worker
//! starts), but once the worker runs, an error from the wait or the take
//! (ENOMEM under memory pressure is the plausible one) is a warning, once
//! per streak, and the turn goes on as if a child might have exited: it
//! reaps and reads the clock, so reaping and the deadline still hold. Exiting
//! instead would kill the container, and with it the worker it protects.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::unistd::Pid;

use crate::config::Config;
use crate::custody::{Custody, GroupTarget, Walk};
use crate::events::Event;
use crate::exit::Code;
use crate::files::{self, DrainFile};
use crate::logging;
use crate::procs;
use crate::reap::{self, Left, Outcome};
use crate::retry_after::{self, RetryAfter};
use crate::signals::{SIGCHLD, SIGKILL, SignalSource, Signo};
use crate::spawn::{Program, Spawner};
use crate::supervisor::{self, Action, Input, Now, Supervisor};
use crate::sys;
use crate::tty;

const SIGNALS_PER_TURN: usize = 64;
const REAPED_PER_TURN: usize = 1024;
/// Walks of /proc for one deadline SIGKILL as subreaper, at most.
const KILL_WALKS: usize = 3;

/// The variable that tells the worker which attempt it is.
const ATTEMPT_VAR: &str = "DRAINIT_ATTEMPT";

/// The kernel, as the event loop meets it: a wait, the pending signals, the
/// exited children. A trait so that a test can inject the errors the real
/// calls might return.
pub trait Os {
    /// Block until a signal, `timeout`, or `stderr` writable; whether stderr is.
    fn wait(&mut self, timeout: Option<Duration>, stderr: Option<BorrowedFd<'_>>) -> nix::Result<bool>;
    fn signals(&mut self, max: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()>;
    fn reap(&mut self, max: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left;
}

impl Os for SignalSource {
    fn wait(&mut self, timeout: Option<Duration>, stderr: Option<BorrowedFd<'_>>) -> nix::Result<bool> {
        SignalSource::wait(self, timeout, stderr)
    }

    fn signals(&mut self, max: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()> {
        self.drain(max, each)
    }

    fn reap(&mut self, max: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left {
        reap::reap_pending(max, each)
    }
}

/// Run the worker to the end; returns drainit's exit code.
/// `me` is drainit's pid; `own`, what /proc said of it at start.
pub fn run(config: Config, mut signals: SignalSource, me: i32, own: Option<procs::Own>) -> Code {
    let mode = reap::setup(me);
    Event::Started { mode: mode.name(), grace: config.grace, orchestrator_timeout: config.orchestrator_timeout }.emit();
    let take_tty = tty::hand_over(&signals);
    let (worker, finish) = match programs(&config) {
        Ok(programs) => programs,
        Err(why) => {
            Event::Failed { what: "command", error: why }.emit();
            return Code::CONFIG;
        }
    };
    let retry_after = RetryAfter::new();
    if let Some(path) = retry_after.path() {
        // The worker finds the path in the environment it inherits.
        sys::set_env(retry_after::VAR, path.as_os_str());
    }
    let drain_file = config.drain_file.map(DrainFile::new);
    if let Some(file) = &drain_file {
        file.remove_stale();
    }
    // /proc is our namespace's when it numbers us as getpid does: otherwise
    // (`unshare --pid` without `--mount-proc`) pids read there would name
    // other processes, and drainit must not signal them.
    let proc_self = own.map(|o| o.pid).filter(|pid| *pid == me);
    let policy = supervisor::Policy {
        grace: config.grace,
        orchestrator_timeout: config.orchestrator_timeout,
        rewrite: config.rewrite,
        backoff: config.backoff,
        stop_delay: config.stop_delay,
        finish_timeout: finish.as_ref().map(|_| config.finish_timeout),
        remap: config.remap,
    };
    let mut supervisor = Supervisor::new(policy, seed(me));
    let mut exec = Executor {
        spawner: Spawner::new(take_tty),
        worker,
        finish,
        retry_after,
        drain_file,
        termination_log: config.termination_log,
        custody: Custody::new(mode, proc_self.is_some()),
        proc_self,
    };
    let mut turns = Turns::default();
    let code = turns.run(&mut supervisor, &mut exec, &mut signals);
    // drainit exits next: the kernel releases the signalfd, the child's
    // stack and the heap in one go, faster than dropping them one by one
    // would (each container stop waits for this).
    std::mem::forget((exec, turns, signals));
    code
}

fn programs(config: &Config) -> Result<(Program, Option<Program>), String> {
    let worker = Program::new(&config.command)?;
    let finish = config.finish.as_ref().map(|path| Program::new(std::slice::from_ref(path))).transpose()?;
    Ok((worker, finish))
}

/// The turns of the loop: what one turn gathered, and what is being fed.
#[derive(Default)]
struct Turns {
    gather: Gather,
    /// Answers to actions, fed before the next gathered input.
    queue: VecDeque<Input>,
    actions: Vec<Action>,
}

impl Turns {
    fn run<O: Os>(&mut self, supervisor: &mut Supervisor, exec: &mut Executor, os: &mut O) -> Code {
        supervisor.start(&mut self.actions);
        if let Some(code) = self.carry_out(supervisor, exec, &mut Now::unread()) {
            return code;
        }
        loop {
            self.gather.wait(os, &mut exec.custody, supervisor.next_deadline());
            let mut now = Now::unread();
            // Each signal is handled as it is read: a forward goes out with
            // the least work ahead of it (each step before the kill touches
            // cache lines that went cold while drainit slept).
            let mut exit = None;
            // Taken (for the callback to borrow self) and put back, so that
            // its allocations serve every turn.
            let mut gather = std::mem::take(&mut self.gather);
            let read = gather.signals(os, &mut |sig| {
                if exit.is_none() {
                    exit = self.signal(sig, supervisor, exec, &mut now);
                }
            });
            if let Some(code) = exit {
                return code;
            }
            gather.rest(os, &mut exec.custody, read);
            for input in gather.inputs.drain(..) {
                supervisor.handle(input, &mut now, &mut self.actions);
                if let Some(code) = self.carry_out(supervisor, exec, &mut now) {
                    return code;
                }
            }
            self.gather = gather;
        }
    }

    /// One signal, as read: a plain forward is sent at once; anything else
    /// is the supervisor's input. Some(code): drainit exits now.
    fn signal(&mut self, sig: Signo, supervisor: &mut Supervisor, exec: &mut Executor, now: &mut Now) -> Option<Code> {
        match supervisor.only_forwarded(sig) {
            Some(to) => {
                if let Some(to) = to {
                    exec.forward(to);
                }
                None
            }
            None => {
                supervisor.handle(Input::Signal(sig), now, &mut self.actions);
                self.carry_out(supervisor, exec, now)
            }
        }
    }

    /// Carry out the actions of the input just fed, and feed each answer
    /// right after it. Some(code): drainit exits now.
    fn carry_out(&mut self, supervisor: &mut Supervisor, exec: &mut Executor, now: &mut Now) -> Option<Code> {
        loop {
            for action in self.actions.drain(..) {
                match exec.carry_out(action) {
                    Done::Nothing => {}
                    Done::Answer(input) => self.queue.push_back(input),
                    Done::Exit(code) => return Some(code),
                }
            }
            let input = self.queue.pop_front()?;
            supervisor.handle(input, now, &mut self.actions);
        }
    }
}

/// What one turn gathers besides its signals, in the supervisor's order:
/// each reaped child, the end of the reaping round, the clock (`Tick`).
#[derive(Default)]
struct Gather {
    inputs: Vec<Input>,
    sigchld: bool,
    /// Loop errors in a row: the first of a streak is logged.
    errors: u32,
    /// `errors` when the turn began.
    before: u32,
}

impl Gather {
    /// Block until a signal, the next deadline, or stderr can take the
    /// lines that wait for it.
    fn wait<O: Os>(&mut self, os: &mut O, custody: &mut Custody, deadline: Option<Instant>) {
        self.before = self.errors;
        let timeout = if custody.reap_pending() {
            Some(Duration::ZERO)
        } else {
            deadline.map(|at| at.saturating_duration_since(Instant::now()))
        };
        match os.wait(timeout, logging::waiting_fd()) {
            Ok(true) => logging::flush(),
            Ok(false) => {}
            Err(e) => self.loop_error("ppoll", e, custody),
        }
    }

    /// The signals pending, a bounded batch (senders that never stop must
    /// not keep the loop from reaping and from the deadline), each passed
    /// to `each` as it is read; SIGCHLD is only noted.
    fn signals<O: Os>(&mut self, os: &mut O, each: &mut dyn FnMut(Signo)) -> nix::Result<()> {
        let sigchld = &mut self.sigchld;
        os.signals(SIGNALS_PER_TURN, &mut |sig| {
            if sig == SIGCHLD {
                *sigchld = true;
            } else {
                each(sig);
            }
        })
    }

    /// The rest of the turn, after its signals (`read`: how reading them
    /// went): a bounded batch of reaped children, then the clock.
    fn rest<O: Os>(&mut self, os: &mut O, custody: &mut Custody, read: nix::Result<()>) {
        if std::mem::take(&mut self.sigchld) {
            custody.sigchld();
        }
        if let Err(e) = read {
            self.loop_error("rt_sigtimedwait", e, custody);
        }
        if self.errors == self.before {
            // A turn without an error ends a streak.
            self.errors = 0;
        }
        if custody.take_reap() {
            let inputs = &mut self.inputs;
            let left = os.reap(REAPED_PER_TURN, &mut |pid, outcome| {
                custody.reaped(pid);
                inputs.push(Input::Reaped(pid, outcome));
            });
            if let Some(left) = custody.round_ended(!self.inputs.is_empty(), left) {
                self.inputs.push(Input::Children { left });
            }
        }
        self.inputs.push(Input::Tick);
    }

    fn loop_error(&mut self, what: &'static str, error: Errno, custody: &mut Custody) {
        if self.errors == 0 {
            Event::LoopError { what, error: error.desc().to_string() }.emit();
        }
        self.errors = self.errors.saturating_add(1);
        custody.loop_error();
    }
}

/// What carrying out one action led to.
enum Done {
    Nothing,
    Answer(Input),
    Exit(Code),
}

/// Carries out the supervisor's actions: where they meet the system.
struct Executor {
    spawner: Spawner,
    worker: Program,
    finish: Option<Program>,
    retry_after: RetryAfter,
    drain_file: Option<DrainFile>,
    termination_log: Option<std::path::PathBuf>,
    custody: Custody,
    /// Our pid as /proc names it, when /proc belongs to our PID namespace.
    proc_self: Option<i32>,
}

impl Executor {
    fn carry_out(&mut self, action: Action) -> Done {
        match action {
            Action::Spawn { attempt } => {
                self.retry_after.clear_before(attempt);
                sys::set_env(ATTEMPT_VAR, attempt.to_string().as_ref());
                self.spawn(false)
            }
            Action::SpawnFinish(env) => {
                for (key, value) in env.vars() {
                    sys::set_env(key, value.as_ref());
                }
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
            Action::DropRetryAfter => {
                self.retry_after.remove_dir();
                Done::Nothing
            }
            Action::CreateDrainFile => {
                if let Some(file) = &self.drain_file {
                    file.create();
                }
                Done::Nothing
            }
            Action::Log(event) => {
                event.emit();
                Done::Nothing
            }
            Action::Exit(summary) => {
                if let Some(path) = &self.termination_log {
                    files::write_termination_log(path, &summary);
                }
                self.retry_after.remove_dir();
                Done::Exit(summary.code)
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
                let event = program.failure_event(&err);
                if finish {
                    // Logged, nothing more: drainit's exit code stays.
                    Event::Failed { what: "finish", error: event.to_string() }.emit();
                } else {
                    event.emit();
                }
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
    fn signal_all(&self, sig: Signo, count: bool) -> usize {
        let everyone = self.custody.everyone(count);
        if let Some(group) = everyone.group {
            let _ = sys::kill(Pid::from_raw(-group), sig);
        }
        if everyone.namespace {
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
    // A SIGKILL walk goes again while it finds someone new: a
    // process forks until the kill lands, and the child of one
    // that died before its children were read went to drainit,
    // whose children the walk read first. A few times at most:
    // between walks nothing is reaped, and a bomb that outpaces
    // them is left to the re-kill after each reaping round.
    // A BTreeSet: a HashSet would seed its hasher from getrandom.
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

fn seed(me: i32) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((me as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reap::Mode;

    /// An Os that fails as told and never touches a real process.
    struct Failing {
        wait: Option<Errno>,
        read: Option<Errno>,
        pending: Vec<Signo>,
        exited: Vec<(i32, Outcome)>,
        waits: Vec<Option<Duration>>,
    }

    impl Os for Failing {
        fn wait(&mut self, timeout: Option<Duration>, _: Option<BorrowedFd<'_>>) -> nix::Result<bool> {
            self.waits.push(timeout);
            self.wait.map_or(Ok(false), Err)
        }

        fn signals(&mut self, _: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()> {
            self.pending.drain(..).for_each(each);
            self.read.map_or(Ok(()), Err)
        }

        fn reap(&mut self, _: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left {
            self.exited.drain(..).for_each(|(pid, o)| each(pid, o));
            Left::Running
        }
    }

    fn os(wait: Option<Errno>, read: Option<Errno>) -> Failing {
        Failing { wait, read, pending: vec![], exited: vec![], waits: vec![] }
    }

    /// One turn as `Turns::run` gathers it, the signals recorded as inputs
    /// where run handles them as read.
    fn turn(gather: &mut Gather, os: &mut Failing, custody: &mut Custody, deadline: Option<Instant>) -> Vec<Input> {
        gather.wait(os, custody, deadline);
        let mut inputs = Vec::new();
        let read = gather.signals(os, &mut |sig| inputs.push(Input::Signal(sig)));
        gather.rest(os, custody, read);
        inputs.append(&mut gather.inputs);
        inputs
    }

    #[test]
    fn a_failed_wait_is_survived_and_reaps() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Mode::Pid1, true);
        custody.started(10);
        let mut os = os(Some(Errno::ENOMEM), None);
        os.pending = vec![libc::SIGUSR1];
        os.exited = vec![(10, Outcome::Exited(0))];
        assert_eq!(
            turn(&mut gather, &mut os, &mut custody, None),
            vec![
                Input::Signal(libc::SIGUSR1),
                Input::Reaped(10, Outcome::Exited(0)),
                Input::Children { left: true },
                Input::Tick
            ],
            "a SIGCHLD the error may have hidden is assumed: the round reaps"
        );
        assert_eq!(gather.errors, 1);
        // The streak goes on (logged once), then a good wait ends it.
        turn(&mut gather, &mut os, &mut custody, None);
        assert_eq!(gather.errors, 2);
        os.wait = None;
        let inputs = turn(&mut gather, &mut os, &mut custody, None);
        assert_eq!(gather.errors, 0);
        assert_eq!(inputs, vec![Input::Tick], "no SIGCHLD, no error: no reaping round");
    }

    #[test]
    fn a_failed_signal_read_keeps_what_it_read_and_reaps() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Mode::Subreaper, true);
        let mut os = os(None, Some(Errno::EINVAL));
        os.pending = vec![libc::SIGTERM];
        os.exited = vec![(7, Outcome::Exited(1))];
        assert_eq!(
            turn(&mut gather, &mut os, &mut custody, None),
            vec![
                Input::Signal(libc::SIGTERM),
                Input::Reaped(7, Outcome::Exited(1)),
                Input::Children { left: true },
                Input::Tick
            ]
        );
        assert_eq!(gather.errors, 1);
    }

    #[test]
    fn the_wait_is_as_long_as_the_next_deadline_and_zero_while_reaping_is_behind() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Mode::Pid1, true);
        let mut os = os(None, None);
        turn(&mut gather, &mut os, &mut custody, None);
        let soon = Instant::now() + Duration::from_secs(5);
        turn(&mut gather, &mut os, &mut custody, Some(soon));
        custody.round_ended(true, Left::More);
        turn(&mut gather, &mut os, &mut custody, Some(soon));
        assert_eq!(os.waits[0], None, "idle: no timeout, no wakeup");
        assert!(os.waits[1].is_some_and(|t| t > Duration::from_secs(4) && t <= Duration::from_secs(5)));
        assert_eq!(os.waits[2], Some(Duration::ZERO));
    }
}
