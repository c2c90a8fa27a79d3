//! The processes drainit answers for, and how to reach them without ever
//! signalling a stranger: the current process group (the worker's, or the
//! finish program's) and every other descendant. Bookkeeping only: the event
//! loop reports what happened (a spawn, a reaped pid, the end of a reaping
//! round) and asks how to signal; no syscall is made here, so the pid-reuse
//! rules are tested as tables.
//!
//! The rule behind it: until drainit has reaped a group's leader, the
//! leader's pid (the group's id) cannot be reused, so `kill(-group)` is
//! exact. Once reaped, the number may name an unrelated group on the host;
//! what is left of the group is then found among drainit's descendants in
//! /proc, which is read only when it is our namespace's and only while
//! drainit has a child (every process drainit answers for outside the group
//! is a descendant, and a live descendant means a live child).

use crate::reap::{Left, Role};

#[derive(Clone, Debug, PartialEq)]
pub struct Custody {
    mode: Role,
    /// /proc is our PID namespace's: pids read there name our processes.
    proc_is_ours: bool,
    /// The current (or last) process group drainit started.
    group: Option<i32>,
    leader_reaped: bool,
    /// Whether the last reaping round left any child.
    children_left: bool,
    /// A SIGCHLD came, a loop error may have hidden one, or the last round
    /// stopped at its limit: reap in this turn (and wait no longer than that).
    reap: bool,
}

/// Who a signal for the current group goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupTarget {
    Nobody,
    /// `kill(-pgid)`: exact while the leader is unreaped.
    Group(i32),
    /// Each descendant whose process group is this one, found in /proc.
    Members(i32),
}

/// How to reach everything drainit answers for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Everyone {
    /// `kill(-pgid)` first (the group fork cannot outrun), when exact.
    pub group: Option<i32>,
    /// `kill(-1)`: as PID 1, every other process of the namespace.
    pub namespace: Namespace,
    pub descendants: Walk,
}

/// Whether `kill(-1)` goes out (as PID 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    No,
    Yes,
    /// Only when /proc lists a process besides drainit. With no child left
    /// and /proc the namespace's own, what is left can only be a process
    /// that entered by setns (`docker exec`): one read of /proc, whose
    /// size is the namespace's, finds it, where `kill(-1)` makes the kernel
    /// walk every task of the host.
    IfOthers,
}

/// What to do with /proc when reaching everyone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    Skip,
    /// Count the processes /proc lists (PID 1, after `kill(-1)`).
    Count,
    /// Signal each descendant as the walk finds it (and count them).
    Each,
}

impl Custody {
    pub fn new(mode: Role, proc_is_ours: bool) -> Custody {
        Custody { mode, proc_is_ours, group: None, leader_reaped: false, children_left: true, reap: false }
    }

    /// A new group was started with `pid` as its leader.
    pub fn started(&mut self, pid: i32) {
        self.group = Some(pid);
        self.leader_reaped = false;
        self.children_left = true;
    }

    /// The leader of the current process group (the worker, or the
    /// finish program), while it has not been reaped.
    pub fn leader(&self) -> Option<i32> {
        self.group.filter(|_| !self.leader_reaped)
    }

    pub fn sigchld(&mut self) {
        self.reap = true;
    }

    /// The wait or the signal read failed: a SIGCHLD may be hidden, so reap.
    pub fn loop_error(&mut self) {
        self.reap = true;
    }

    /// Whether to reap in this turn; taking it clears it.
    pub fn take_reap(&mut self) -> bool {
        std::mem::take(&mut self.reap)
    }

    /// Whether the next wait must not block (reaping stopped at its limit).
    pub fn reap_pending(&self) -> bool {
        self.reap
    }

    pub fn reaped(&mut self, pid: i32) {
        self.leader_reaped |= self.group == Some(pid);
    }

    /// A reaping round ended. Returns whether children are left, when the
    /// supervisor should hear it: only after a complete round (what is left
    /// then is alive, and a re-kill that walks /proc is not repeated for
    /// every batch of a stream of zombies), and only when something exited
    /// or nothing is left.
    pub fn round_ended(&mut self, exited: bool, left: Left) -> Option<bool> {
        self.reap |= left == Left::More;
        self.children_left = left != Left::Nothing;
        (left != Left::More && (exited || !self.children_left)).then_some(self.children_left)
    }

    pub fn group_target(&self) -> GroupTarget {
        match self.group {
            None => GroupTarget::Nobody,
            Some(group) if !self.leader_reaped => GroupTarget::Group(group),
            Some(group) if self.proc_is_ours && self.children_left => GroupTarget::Members(group),
            Some(_) => GroupTarget::Nobody,
        }
    }

    /// Whether `everyone` can ask for a look at the namespace (`IfOthers`).
    pub fn looks_at_namespace(&self) -> bool {
        self.mode == Role::Pid1 && self.proc_is_ours
    }

    /// `count`: the caller needs to know how many processes were reached.
    pub fn everyone(&self, count: bool) -> Everyone {
        let descendants = match (self.proc_is_ours && self.children_left, self.mode) {
            (false, _) => Walk::Skip,
            (true, Role::Pid1) if count => Walk::Count,
            (true, Role::Pid1) => Walk::Skip,
            (true, Role::Subreaper | Role::Plain) => Walk::Each,
        };
        let namespace = match self.mode {
            _ if self.looks_at_namespace() && !self.children_left => Namespace::IfOthers,
            Role::Pid1 => Namespace::Yes,
            Role::Subreaper | Role::Plain => Namespace::No,
        };
        Everyone { group: self.group.filter(|_| !self.leader_reaped), namespace, descendants }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GroupTarget::*;
    use Namespace::*;
    use Walk::*;

    const G: i32 = 40;

    fn custody(mode: Role, proc_is_ours: bool) -> Custody {
        let mut c = Custody::new(mode, proc_is_ours);
        c.started(G);
        c
    }

    /// (mode, /proc ours, leader reaped, children left) -> group target.
    #[test]
    fn group_target_table() {
        for (mode, ours, reaped, left, want) in [
            (Role::Subreaper, true, false, Left::Running, Group(G)),
            (Role::Subreaper, false, false, Left::Running, Group(G)),
            (Role::Subreaper, true, true, Left::Running, Members(G)),
            (Role::Subreaper, true, true, Left::Nothing, Nobody),
            (Role::Subreaper, false, true, Left::Running, Nobody),
            (Role::Pid1, true, true, Left::Running, Members(G)),
            (Role::Pid1, true, false, Left::Nothing, Group(G)),
        ] {
            let mut c = custody(mode, ours);
            if reaped {
                c.reaped(G);
            }
            c.round_ended(reaped, left);
            assert_eq!(c.group_target(), want, "{mode:?} ours={ours} reaped={reaped} {left:?}");
        }
        assert_eq!(Custody::new(Role::Pid1, true).group_target(), Nobody, "before the first spawn");
    }

    /// (mode, /proc ours, leader reaped, children left, count) -> everyone.
    #[test]
    fn everyone_table() {
        for (mode, ours, reaped, left, count, group, namespace, walk) in [
            (Role::Pid1, true, false, Left::Running, true, Some(G), Yes, Count),
            (Role::Pid1, true, false, Left::Running, false, Some(G), Yes, Skip),
            (Role::Pid1, true, true, Left::Running, true, None, Yes, Count),
            (Role::Pid1, true, true, Left::Nothing, true, None, IfOthers, Skip),
            (Role::Pid1, false, true, Left::Nothing, true, None, Yes, Skip),
            (Role::Pid1, false, false, Left::Running, true, Some(G), Yes, Skip),
            (Role::Subreaper, true, false, Left::Running, false, Some(G), No, Each),
            (Role::Subreaper, true, true, Left::Running, true, None, No, Each),
            (Role::Subreaper, true, true, Left::Nothing, true, None, No, Skip),
            (Role::Subreaper, false, true, Left::Running, true, None, No, Skip),
            (Role::Plain, true, false, Left::Running, true, Some(G), No, Each),
        ] {
            let mut c = custody(mode, ours);
            if reaped {
                c.reaped(G);
            }
            c.round_ended(reaped, left);
            assert_eq!(
                c.everyone(count),
                Everyone { group, namespace, descendants: walk },
                "{mode:?} ours={ours} reaped={reaped} {left:?} count={count}"
            );
        }
    }

    #[test]
    fn a_new_group_is_exact_again() {
        let mut c = custody(Role::Subreaper, true);
        c.reaped(G);
        c.round_ended(true, Left::Nothing);
        c.started(G + 1);
        assert_eq!(c.group_target(), Group(G + 1));
        assert_eq!(c.everyone(false).descendants, Each, "a new child exists");
    }

    #[test]
    fn only_the_leader_makes_the_group_inexact() {
        let mut c = custody(Role::Subreaper, true);
        c.reaped(G + 7);
        assert_eq!(c.group_target(), Group(G));
    }

    /// (exited something, left) -> what the supervisor hears, and whether
    /// to reap again at once.
    #[test]
    fn reaping_rounds_table() {
        for (exited, left, told, again) in [
            (true, Left::Running, Some(true), false),
            (true, Left::Nothing, Some(false), false),
            (false, Left::Nothing, Some(false), false),
            (false, Left::Running, None, false),
            (true, Left::More, None, true),
        ] {
            let mut c = custody(Role::Pid1, true);
            assert_eq!(c.round_ended(exited, left), told, "exited={exited} {left:?}");
            assert_eq!(c.reap_pending(), again);
            assert_eq!(c.take_reap(), again);
            assert!(!c.reap_pending());
        }
    }

    #[test]
    fn sigchld_and_loop_errors_ask_for_a_round() {
        let mut c = custody(Role::Pid1, true);
        assert!(!c.take_reap());
        c.sigchld();
        assert!(c.take_reap());
        c.loop_error();
        assert!(c.take_reap());
    }
}
