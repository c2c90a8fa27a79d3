//! The wait: one blocking call per turn on every source drainit listens to
//! (its signals; stderr while log lines wait for it), with a timeout that is
//! the time left to the supervisor's next timer (none when idle, so idle
//! costs no wakeup), then the turn's inputs gathered in the order the
//! supervisor relies on: the signals (each handed on as it is taken), each
//! reaped child, the end of the reaping round. A bounded batch of each, so
//! that senders that never stop cannot keep the loop from the deadline.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use crate::custody::Custody;
use crate::events::Event;
use crate::exit::Outcome;
use crate::logging;
use crate::memory::Counter;
use crate::notify::Inbox;
use crate::reap::{self, Left};
use crate::signals::{SIGCHLD, SIGKILL, SignalSource, Signo};
use crate::supervisor::Input;
use crate::sys;

const SIGNALS_PER_TURN: usize = 64;
const REAPED_PER_TURN: usize = 1024;

/// Which sources besides the signals a wait found ready.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ready {
    /// stderr can take more of the waiting log lines (or failed).
    pub stderr: bool,
    /// Notify messages wait.
    pub notify: bool,
    /// The memory cgroup's events changed (v2).
    pub memory: bool,
}

const NOTES_PER_TURN: usize = 1024;

/// The kernel, as the event loop meets it: a wait, the pending signals, the
/// exited children. A trait so that a test can inject the errors the real
/// calls might return.
pub trait Os {
    /// Block until a signal, `timeout`, or `stderr` writable.
    fn wait(&mut self, timeout: Option<Duration>, stderr: Option<BorrowedFd<'_>>) -> nix::Result<Ready>;
    fn signals(&mut self, max: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()>;
    fn reap(&mut self, max: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left;
    /// The waiting notify messages, from processes drainit answers for
    /// (`worker`: the current group's leader), as inputs, the batch ending
    /// about `deadline` (the next timer's).
    fn notes(&mut self, worker: Option<i32>, max: usize, deadline: Option<Instant>, each: &mut dyn FnMut(Input));
    /// The OOM kills since drainit started, when the count rose since the
    /// last read (which also re-arms the v2 notification).
    fn oom_kills(&mut self) -> Option<u64> {
        None
    }
    /// Look for the OOM-kill counter, where that was left until the first
    /// child had started; whether one was found.
    fn find_counter(&mut self) -> bool {
        false
    }
    /// Whether a signal waits to be taken (rt_sigpending: none is taken).
    fn signals_pending(&mut self) -> bool;
    /// Take the shortest time slice for the rest of the run (`sys::short_slice`).
    fn short_slice(&mut self);
}

/// What drainit listens to.
pub struct Sources {
    signals: SignalSource,
    /// The worker's notify socket, with the readiness options.
    notify: Option<Inbox>,
    /// The memory cgroup's OOM-kill counter, when one was found.
    memory: Option<Counter>,
    /// A source besides stderr has a descriptor to wait on: it has for the
    /// whole run (from the counter's late look on), or never, so it is
    /// found then rather than every turn.
    polled: bool,
    /// The counter is to be looked for after the first spawn (as PID 1 or
    /// not: `memory::Counter::find`'s order).
    later: Option<bool>,
}

/// A source of the wait besides the signals, a row each: what it waits
/// for, and which flag of `Ready` it sets. A new source is a row here and
/// a line in `Sources::fd`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    Stderr,
    Notify,
    /// cgroup v2's `memory.events`: a change is POLLPRI (kernfs_notify).
    Memory,
}

impl Source {
    const ALL: [Source; 3] = [Source::Stderr, Source::Notify, Source::Memory];

    fn events(self) -> PollFlags {
        match self {
            Source::Stderr => PollFlags::POLLOUT,
            Source::Notify => PollFlags::POLLIN,
            Source::Memory => PollFlags::POLLPRI,
        }
    }

    fn mark(self, ready: &mut Ready) {
        match self {
            Source::Stderr => ready.stderr = true,
            Source::Notify => ready.notify = true,
            Source::Memory => ready.memory = true,
        }
    }
}

impl Sources {
    pub fn new(signals: SignalSource, notify: Option<Inbox>, memory: Option<Counter>) -> Sources {
        let mut sources = Sources { signals, notify, memory, polled: false, later: None };
        sources.polled = sources.any_polled();
        sources
    }

    fn any_polled(&self) -> bool {
        Source::ALL.into_iter().any(|source| self.fd(source, None).is_some())
    }

    /// Leave the counter's look until the first child has started.
    pub fn find_counter_later(&mut self, init: bool) {
        self.later = Some(init);
    }

    /// The descriptor of `source`, when it is present this turn.
    fn fd<'a>(&'a self, source: Source, stderr: Option<BorrowedFd<'a>>) -> Option<BorrowedFd<'a>> {
        match source {
            Source::Stderr => stderr,
            Source::Notify => self.notify.as_ref().map(|n| n.as_fd()),
            Source::Memory => self.memory.as_ref().and_then(Counter::poll_fd),
        }
    }
}

impl Os for Sources {
    fn wait(&mut self, timeout: Option<Duration>, stderr: Option<BorrowedFd<'_>>) -> nix::Result<Ready> {
        if stderr.is_none() && !self.polled {
            // Signals alone: the first take is the wait. (`polled`, not a
            // walk over the table: this is every forward's turn.)
            self.signals.wait(timeout);
            return Ok(Ready::default());
        }
        let sig = self.signals.poll_fd();
        // The signalfd first, then each source present, in the table's order.
        let mut fds: [PollFd<'_>; 1 + Source::ALL.len()] = std::array::from_fn(|_| sig.clone());
        let mut rows = [Source::Stderr; Source::ALL.len()];
        let mut n = 1;
        for source in Source::ALL {
            if let Some(fd) = self.fd(source, stderr) {
                fds[n] = PollFd::new(fd, source.events());
                rows[n - 1] = source;
                n += 1;
            }
        }
        let polled = ppoll(&mut fds[..n], timeout.map(TimeSpec::from), None);
        let mut ready = Ready::default();
        for (fd, source) in fds[1..n].iter().zip(rows) {
            if fd.revents().is_some_and(|r| !r.is_empty()) {
                source.mark(&mut ready);
            }
        }
        let signals = fds[0].revents();
        match polled {
            Ok(_) => self.signals.polled(signals),
            Err(e) => {
                self.signals.polled(None);
                if e != Errno::EINTR {
                    return Err(e);
                }
            }
        }
        Ok(ready)
    }

    fn signals(&mut self, max: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()> {
        self.signals.drain(max, each)
    }

    fn reap(&mut self, max: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left {
        reap::reap_pending(max, each)
    }

    fn oom_kills(&mut self) -> Option<u64> {
        self.memory.as_mut().and_then(Counter::rose)
    }

    fn signals_pending(&mut self) -> bool {
        sys::any_pending()
    }

    fn short_slice(&mut self) {
        sys::short_slice();
    }

    fn find_counter(&mut self) -> bool {
        let Some(init) = self.later.take() else { return false };
        self.memory = Counter::find(init);
        self.polled = self.any_polled();
        self.memory.is_some()
    }

    fn notes(&mut self, worker: Option<i32>, max: usize, deadline: Option<Instant>, each: &mut dyn FnMut(Input)) {
        if let Some(inbox) = &mut self.notify {
            inbox.notes(worker, max, deadline, &mut |note| each(Input::Notify(note)));
        }
    }
}

/// What one turn gathers besides its signals, in the supervisor's order.
#[derive(Default)]
pub struct Gather {
    pub inputs: Vec<Input>,
    sigchld: bool,
    /// Loop errors in a row: the first of a streak is logged.
    errors: u32,
    /// `errors` when the turn began.
    before: u32,
    /// The signal take failed this turn.
    take_failed: Option<Errno>,
    /// What the wait found ready, each flag taken where it is handled
    /// (kept whole: one store in every turn, a forward's among them).
    ready: Ready,
    slice: Slice,
}

/// The short time slice of a stop (`Os::short_slice`: the deadline must win
/// the CPU from then on), taken as drainit is about to block rather than
/// as the stop begins: on a shared CPU the worker woken by the stop signal
/// runs first (started with setsid, it has a scheduler autogroup of its
/// own, whose wakeup wins the CPU) and often dies before drainit goes on;
/// a turn that finds it gone exits without the slice's two syscalls. A
/// turn with work waiting defers it once; the wait after that takes it
/// whatever comes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Slice {
    #[default]
    Default,
    Wanted,
    Due,
    Short,
}

impl Slice {
    fn before_wait<O: Os>(self, os: &mut O, blocking: bool) -> Slice {
        match self {
            Slice::Wanted if blocking && !os.signals_pending() => {
                os.short_slice();
                Slice::Short
            }
            Slice::Wanted => Slice::Due,
            Slice::Due => {
                os.short_slice();
                Slice::Short
            }
            other => other,
        }
    }
}

impl Gather {
    /// Block until a signal, the next deadline, or stderr can take the
    /// lines that wait for it; `stopping`: a stop began in the last turn
    /// (the short slice is wanted).
    pub fn wait<O: Os>(&mut self, os: &mut O, custody: &mut Custody, stopping: bool, deadline: Option<Instant>) {
        self.before = self.errors;
        let timeout = if custody.reap_pending() {
            Some(Duration::ZERO)
        } else {
            deadline.map(|at| at.saturating_duration_since(Instant::now()))
        };
        if stopping && self.slice == Slice::Default {
            self.slice = Slice::Wanted;
        }
        self.slice = self.slice.before_wait(os, timeout != Some(Duration::ZERO));
        match os.wait(timeout, logging::waiting_fd()) {
            Ok(ready) => {
                if ready.stderr {
                    logging::flush();
                }
                self.ready = ready;
            }
            Err(e) => self.loop_error("ppoll", e, custody),
        }
    }

    /// The signals pending, each passed to `each` as it is taken; SIGCHLD
    /// is only noted.
    pub fn signals<O: Os>(&mut self, os: &mut O, each: &mut dyn FnMut(Signo)) {
        let sigchld = &mut self.sigchld;
        let read = os.signals(SIGNALS_PER_TURN, &mut |sig| {
            if sig == SIGCHLD {
                *sigchld = true;
            } else {
                each(sig);
            }
        });
        self.take_failed = read.err();
    }

    /// The notify messages waiting, after the signals and before the
    /// reaped children: a ping read in the turn its watchdog comes due
    /// is seen first.
    pub fn notes<O: Os>(&mut self, os: &mut O, custody: &Custody, deadline: impl FnOnce() -> Option<Instant>) {
        if std::mem::take(&mut self.ready.notify) {
            let inputs = &mut self.inputs;
            os.notes(custody.leader(), NOTES_PER_TURN, deadline(), &mut |input| inputs.push(input));
        }
    }

    /// The rest of the turn, after its signals: a bounded batch of reaped
    /// children and the end of the round, into `inputs`, the OOM-kill count
    /// before them when it rose, and the memory event after them.
    pub fn reaped<O: Os>(&mut self, os: &mut O, custody: &mut Custody) {
        if std::mem::take(&mut self.sigchld) {
            custody.sigchld();
        }
        if let Some(e) = self.take_failed.take() {
            self.loop_error("rt_sigtimedwait", e, custody);
        }
        if self.errors == self.before {
            // A turn without an error ends a streak.
            self.errors = 0;
        }
        let first_reaped = self.inputs.len();
        // When the OOM-kill count may have moved: a child died of SIGKILL
        // (v1 has no other notification), or none is left (what follows is
        // a restart, the finish program or the exit, which tell the count).
        let event = std::mem::take(&mut self.ready.memory);
        let mut count_moved = event;
        if custody.take_reap() {
            let inputs = &mut self.inputs;
            let left = os.reap(REAPED_PER_TURN, &mut |pid, outcome| {
                custody.reaped(pid);
                count_moved |= outcome == Outcome::Signaled(SIGKILL);
                inputs.push(Input::Reaped(pid, outcome));
            });
            if let Some(left) = custody.round_ended(!self.inputs.is_empty(), left) {
                count_moved |= !left;
                self.inputs.push(Input::Children { left });
            }
        }
        // An event moves the count too: one test in a forward's turn.
        if count_moved {
            if let Some(total) = os.oom_kills() {
                self.inputs.insert(first_reaped, Input::OomKills(total));
            }
            if event {
                // A time to read the usage: the supervisor decides whether to.
                self.inputs.push(Input::MemoryEvent);
            }
        }
    }

    fn loop_error(&mut self, what: &'static str, error: Errno, custody: &mut Custody) {
        if self.errors == 0 {
            Event::LoopError { what, error: error.desc().to_string() }.emit();
        }
        self.errors = self.errors.saturating_add(1);
        custody.loop_error();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reap::Role;

    /// An Os that fails as told and never touches a real process.
    struct Failing {
        wait: Option<Errno>,
        read: Option<Errno>,
        pending: Vec<Signo>,
        exited: Vec<(i32, Outcome)>,
        waits: Vec<Option<Duration>>,
        /// The OOM-kill count each read finds, and the reads.
        oom: Option<u64>,
        oom_reads: usize,
        memory_ready: bool,
        /// What `signals_pending` answers, and the short slices taken.
        signals_pending: bool,
        slices: usize,
    }

    impl Os for Failing {
        fn wait(&mut self, timeout: Option<Duration>, _: Option<BorrowedFd<'_>>) -> nix::Result<Ready> {
            self.waits.push(timeout);
            let ready = Ready { memory: std::mem::take(&mut self.memory_ready), ..Ready::default() };
            self.wait.map_or(Ok(ready), Err)
        }

        fn signals(&mut self, _: usize, each: &mut dyn FnMut(Signo)) -> nix::Result<()> {
            self.pending.drain(..).for_each(each);
            self.read.map_or(Ok(()), Err)
        }

        fn reap(&mut self, _: usize, each: &mut dyn FnMut(i32, Outcome)) -> Left {
            self.exited.drain(..).for_each(|(pid, o)| each(pid, o));
            Left::Running
        }

        fn notes(&mut self, _: Option<i32>, _: usize, _: Option<Instant>, _: &mut dyn FnMut(Input)) {}

        fn oom_kills(&mut self) -> Option<u64> {
            self.oom_reads += 1;
            self.oom.take()
        }

        fn signals_pending(&mut self) -> bool {
            self.signals_pending
        }

        fn short_slice(&mut self) {
            self.slices += 1;
        }
    }

    fn os(wait: Option<Errno>, read: Option<Errno>) -> Failing {
        Failing {
            wait,
            read,
            pending: vec![],
            exited: vec![],
            waits: vec![],
            oom: None,
            oom_reads: 0,
            memory_ready: false,
            signals_pending: false,
            slices: 0,
        }
    }

    /// One turn as the loop gathers it, the signals recorded as inputs
    /// where the loop hands them on as taken.
    fn turn(gather: &mut Gather, os: &mut Failing, custody: &mut Custody, deadline: Option<Instant>) -> Vec<Input> {
        gather.wait(os, custody, false, deadline);
        let mut inputs = Vec::new();
        gather.signals(os, &mut |sig| inputs.push(Input::Signal(sig)));
        gather.reaped(os, custody);
        inputs.append(&mut gather.inputs);
        inputs
    }

    #[test]
    fn a_failed_wait_is_survived_and_reaps() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Role::Pid1, true);
        custody.started(10);
        let mut os = os(Some(Errno::ENOMEM), None);
        os.pending = vec![libc::SIGUSR1];
        os.exited = vec![(10, Outcome::Exited(0))];
        assert_eq!(
            turn(&mut gather, &mut os, &mut custody, None),
            vec![Input::Signal(libc::SIGUSR1), Input::Reaped(10, Outcome::Exited(0)), Input::Children { left: true }],
            "a SIGCHLD the error may have hidden is assumed: the round reaps"
        );
        assert_eq!(gather.errors, 1);
        // The streak goes on (logged once), then a good wait ends it.
        turn(&mut gather, &mut os, &mut custody, None);
        assert_eq!(gather.errors, 2);
        os.wait = None;
        let inputs = turn(&mut gather, &mut os, &mut custody, None);
        assert_eq!(gather.errors, 0);
        assert_eq!(inputs, vec![], "no SIGCHLD, no error: no reaping round");
    }

    /// The OOM-kill count is read when it may have moved (a child's
    /// SIGKILL, no child left, a memory event) and fed before the turn's
    /// reaped children; a memory event is fed after them.
    #[test]
    fn the_oom_count_comes_before_the_reaped_and_the_memory_event_after() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Role::Subreaper, true);
        custody.started(10);
        let mut os = os(None, None);
        os.pending = vec![SIGCHLD];
        os.exited = vec![(10, Outcome::Signaled(SIGKILL))];
        os.oom = Some(1);
        assert_eq!(
            turn(&mut gather, &mut os, &mut custody, None),
            vec![Input::OomKills(1), Input::Reaped(10, Outcome::Signaled(SIGKILL)), Input::Children { left: true }]
        );
        os.pending = vec![SIGCHLD];
        os.exited = vec![(11, Outcome::Exited(0))];
        turn(&mut gather, &mut os, &mut custody, None);
        assert_eq!(os.oom_reads, 1, "an exit that is no SIGKILL, children left: no read");
        os.memory_ready = true;
        os.oom = Some(2);
        assert_eq!(turn(&mut gather, &mut os, &mut custody, None), vec![Input::OomKills(2), Input::MemoryEvent]);
    }

    #[test]
    fn a_failed_signal_read_keeps_what_it_read_and_reaps() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Role::Subreaper, true);
        let mut os = os(None, Some(Errno::EINVAL));
        os.pending = vec![libc::SIGTERM];
        os.exited = vec![(7, Outcome::Exited(1))];
        assert_eq!(
            turn(&mut gather, &mut os, &mut custody, None),
            vec![Input::Signal(libc::SIGTERM), Input::Reaped(7, Outcome::Exited(1)), Input::Children { left: true }]
        );
        assert_eq!(gather.errors, 1);
    }

    #[test]
    fn the_wait_is_as_long_as_the_next_deadline_and_zero_while_reaping_is_behind() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Role::Pid1, true);
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

    /// The short slice, as the wait before each turn meets it: (state,
    /// the wait blocks, a signal is pending) -> (slices taken, state after).
    #[test]
    fn the_short_slice_is_taken_before_drainit_blocks() {
        use Slice::*;
        let table = [
            (Default, true, false, 0, Default),
            (Wanted, true, false, 1, Short),
            (Wanted, true, true, 0, Due),
            (Wanted, false, false, 0, Due),
            (Due, true, true, 1, Short),
            (Due, false, false, 1, Short),
            (Short, true, false, 0, Short),
        ];
        for (state, blocking, pending, taken, after) in table {
            let mut os = os(None, None);
            os.signals_pending = pending;
            assert_eq!(state.before_wait(&mut os, blocking), after, "{state:?} blocking={blocking} pending={pending}");
            assert_eq!(os.slices, taken, "{state:?} blocking={blocking} pending={pending}");
        }
    }

    /// A stop whose worker is gone before drainit waits again ends without
    /// the slice; one that goes on takes it at the wait that would block,
    /// once.
    #[test]
    fn a_stop_takes_the_slice_once_and_only_when_it_waits() {
        let mut gather = Gather::default();
        let mut custody = Custody::new(Role::Pid1, true);
        let mut os = os(None, None);
        os.signals_pending = true;
        gather.wait(&mut os, &mut custody, true, None);
        assert_eq!(os.slices, 0, "the worker's SIGCHLD is pending: its turn comes first");
        gather.wait(&mut os, &mut custody, false, None);
        assert_eq!(os.slices, 1, "the next wait takes it whatever comes");
        os.signals_pending = false;
        gather.wait(&mut os, &mut custody, true, None);
        gather.wait(&mut os, &mut custody, false, None);
        assert_eq!(os.slices, 1, "once in a run");
    }
}
