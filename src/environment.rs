//! The worker's and the finish program's environment: every variable
//! drainit sets or takes away for them, for whom, and when, in one table
//! (the contract's "What the worker sees" and the finish program's
//! variables), and the only writes of them. drainit writes them into its
//! own environment, which each child inherits through execvp: no copy of
//! the environment per spawn.

use std::path::Path;
use std::time::Duration;

use crate::record::Record;
use crate::signals;
use crate::state::Predecessor;
use crate::sys;

pub const ATTEMPT: &str = "DRAINIT_ATTEMPT";
pub const RETRY_AFTER_FILE: &str = "DRAINIT_RETRY_AFTER_FILE";
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";
pub const EXIT_CODE: &str = "DRAINIT_EXIT_CODE";
pub const WORKER_STATUS: &str = "DRAINIT_WORKER_STATUS";
pub const DEADLINE_REACHED: &str = "DRAINIT_DEADLINE_REACHED";
pub const STOP_SIGNAL: &str = "DRAINIT_STOP_SIGNAL";
pub const STOP_REASON: &str = "DRAINIT_STOP_REASON";
pub const WORKER_STATUS_TEXT: &str = "DRAINIT_WORKER_STATUS_TEXT";
pub const OOM_KILLS: &str = "DRAINIT_OOM_KILLS";
pub const PREDECESSOR_VAR: &str = "DRAINIT_PREDECESSOR";
pub const PREDECESSOR_PID_VAR: &str = "DRAINIT_PREDECESSOR_PID";
pub const PREDECESSOR_STARTED_VAR: &str = "DRAINIT_PREDECESSOR_STARTED";
pub const HOME: &str = "HOME";
pub const USER: &str = "USER";
pub const LOGNAME: &str = "LOGNAME";

/// Who a variable is set for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum For {
    Worker,
    Finish,
    /// The worker, and the finish program with its own value.
    Both,
}

/// One row: a variable, who it is for, when drainit sets it and when it
/// takes it away. The binary reads only the name (the when is for readers,
/// and for the test below, which checks docs/design.md's copy of the
/// table), so the binary carries no more than the names.
#[cfg_attr(not(test), allow(dead_code))]
pub struct Var {
    pub name: &'static str,
    pub target: For,
    #[cfg(test)]
    pub set: &'static str,
    #[cfg(test)]
    pub unset: &'static str,
}

/// Every variable drainit writes for its children; the functions below are
/// the only writers.
pub const TABLE: [Var; 18] = [
    Var {
        name: ATTEMPT,
        target: For::Both,
        #[cfg(test)]
        set: "before each spawn: the attempt (1, 2, ...); for the finish program, the last one",
        #[cfg(test)]
        unset: "never: an inherited one is overwritten",
    },
    Var {
        name: RETRY_AFTER_FILE,
        target: For::Worker,
        #[cfg(test)]
        set: "at start: the user's path kept, else the file in the private directory",
        #[cfg(test)]
        unset: "at start, an inherited empty one, when no private directory could be made",
    },
    Var {
        name: NOTIFY_SOCKET,
        target: For::Worker,
        #[cfg(test)]
        set: "at start, with --watchdog, --ready-timeout or --ready-file: drainit's socket",
        #[cfg(test)]
        unset: "at start then, an inherited one (it becomes drainit's outer socket: notify::Outer::from_env); \
                before the finish program, drainit's",
    },
    Var {
        name: WATCHDOG_USEC,
        target: For::Worker,
        #[cfg(test)]
        set: "at start, with --watchdog and drainit's socket: the interval in microseconds",
        #[cfg(test)]
        unset: "at start, an inherited one, with any of the three options; before the finish program, drainit's",
    },
    Var {
        name: WATCHDOG_PID,
        target: For::Worker,
        #[cfg(test)]
        set: "at start, as WATCHDOG_USEC: a slot the worker fills with its own pid before exec (sys::fill_number)",
        #[cfg(test)]
        unset: "as WATCHDOG_USEC",
    },
    Var {
        name: EXIT_CODE,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: the code drainit exits with",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: WORKER_STATUS,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: exited:N, signal:NAME, oom_kill or none; unknown for the sweep",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: DEADLINE_REACHED,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: 1 or 0",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: STOP_SIGNAL,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: the stop signal's name, or none",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: STOP_REASON,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: signal, watchdog, ready_timeout, memory, unclean_predecessor or none",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: WORKER_STATUS_TEXT,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program, when the worker sent a STATUS=",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: OOM_KILLS,
        target: For::Finish,
        #[cfg(test)]
        set: "before the finish program: the OOM kills during drainit's run, or unknown",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: PREDECESSOR_VAR,
        target: For::Worker,
        #[cfg(test)]
        set: "at start, with --state-dir: none, clean or unclean",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: PREDECESSOR_PID_VAR,
        target: For::Finish,
        #[cfg(test)]
        set: "before the sweep's finish program: the predecessor's pid",
        #[cfg(test)]
        unset: "before the worker's first start, with the sweep's other variables",
    },
    Var {
        name: PREDECESSOR_STARTED_VAR,
        target: For::Finish,
        #[cfg(test)]
        set: "before the sweep's finish program: when the predecessor's attempt started (unix seconds)",
        #[cfg(test)]
        unset: "as DRAINIT_PREDECESSOR_PID",
    },
    Var {
        name: HOME,
        target: For::Both,
        #[cfg(test)]
        set: "at start, with --user: the passwd entry's home, else /",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: USER,
        target: For::Both,
        #[cfg(test)]
        set: "at start, with --user: the passwd entry's name, else the number",
        #[cfg(test)]
        unset: "never",
    },
    Var {
        name: LOGNAME,
        target: For::Both,
        #[cfg(test)]
        set: "as USER",
        #[cfg(test)]
        unset: "never",
    },
];

/// At start: the retry-after file the worker is told of, if any.
pub fn retry_after_file(path: Option<&Path>) {
    match path {
        Some(path) => sys::set_env(RETRY_AFTER_FILE, path.as_os_str()),
        None => unset_if_set(RETRY_AFTER_FILE),
    }
}

/// At start, when drainit reads notifications itself (after the outer
/// socket took an inherited NOTIFY_SOCKET): the inherited watchdog
/// variables go; drainit's socket, when it could bind one, and its
/// watchdog's, when configured, come.
pub fn notify_socket(socket: Option<&Path>, watchdog: Option<Duration>) {
    for var in [WATCHDOG_USEC, WATCHDOG_PID] {
        sys::unset_env(var);
    }
    let Some(path) = socket else { return };
    sys::set_env(NOTIFY_SOCKET, path.as_os_str());
    if let Some(interval) = watchdog {
        sys::set_env(WATCHDOG_USEC, interval.as_micros().to_string().as_ref());
        sys::set_env(WATCHDOG_PID, sys::NUMBER_SLOT.as_ref());
    }
}

/// Before spawn N of the worker: DRAINIT_ATTEMPT is a number slot, set
/// once (`slot`: it is set) and written over in place after, so that the
/// heap does not grow with every attempt (setenv keeps every value it
/// was given).
pub fn attempt(n: u32, slot: &mut bool) {
    if !*slot {
        sys::set_env(ATTEMPT, sys::NUMBER_SLOT.as_ref());
        *slot = true;
    }
    sys::fill_number(ATTEMPT.as_bytes(), n);
}

/// In the child, before exec, with a watchdog: WATCHDOG_PID becomes the
/// child's own pid (systemd's libraries compare it with theirs).
/// Async-signal-safe, allocates nothing.
pub fn fill_watchdog_pid() {
    sys::fill_number(WATCHDOG_PID.as_bytes(), nix::unistd::getpid().as_raw().unsigned_abs());
}

/// drainit's notify variables, the worker's alone: a finish program (the
/// final one or the sweep's) never sees them.
const WORKER_NOTIFY: [&str; 3] = [NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID];

/// Before the finish program: what drainit set for the worker alone goes
/// (`notify_vars`: drainit set the notify variables), the record's
/// variables come.
pub fn finish(record: &Record, notify_vars: bool) {
    for key in WORKER_NOTIFY.into_iter().filter(|_| notify_vars) {
        unset_if_set(key);
    }
    for (key, value) in finish_vars(record) {
        sys::set_env(key, value.as_ref());
    }
}

/// The finish program's variables, read off the record (as the termination
/// message is, so the two never disagree).
pub fn finish_vars(record: &Record) -> Vec<(&'static str, String)> {
    let stop = record.stop.as_ref();
    let mut vars = vec![
        (EXIT_CODE, record.code().0.to_string()),
        (WORKER_STATUS, record.worker_status()),
        (DEADLINE_REACHED, u8::from(record.deadline_reached).to_string()),
        (STOP_SIGNAL, stop.map_or_else(|| "none".to_string(), |s| signals::name(s.signal))),
        (STOP_REASON, stop.map_or("none", |s| s.reason.name()).to_string()),
        (ATTEMPT, record.attempt.to_string()),
        (OOM_KILLS, record.oom_kills.map_or_else(|| "unknown".to_string(), |n| n.to_string())),
    ];
    if let Some(status) = &record.status {
        vars.push((WORKER_STATUS_TEXT, status.clone()));
    }
    vars
}

/// What the sweep changed in drainit's environment: each variable and the
/// value it had, put back before the worker's first start.
pub type Undo = Vec<(&'static str, Option<std::ffi::OsString>)>;

/// Before the sweep's finish program: as before the finish program, with
/// the predecessor's variables; returns what to put back for the worker.
pub fn sweep(predecessor: &Predecessor, notify_vars: bool) -> Undo {
    let mut undo = Vec::new();
    for key in WORKER_NOTIFY.into_iter().filter(|_| notify_vars) {
        if let Some(value) = std::env::var_os(key) {
            sys::unset_env(key);
            undo.push((key, Some(value)));
        }
    }
    for (key, value) in predecessor.finish_vars() {
        undo.push((key, std::env::var_os(key)));
        sys::set_env(key, value.as_ref());
    }
    undo
}

/// Before the worker's first start after the sweep: its environment back.
pub fn unsweep(undo: Undo) {
    for (key, value) in undo {
        match value {
            Some(value) => sys::set_env(key, &value),
            None => sys::unset_env(key),
        }
    }
}

/// At start, with `--state-dir`: what the worker is told of its predecessor.
pub fn predecessor(verdict: &str) {
    sys::set_env(PREDECESSOR_VAR, verdict.as_ref());
}

/// At start, with `--user`: the user's HOME, USER and LOGNAME, for the
/// worker and the finish program.
pub fn user(home: &std::ffi::OsStr, name: &std::ffi::OsStr) {
    sys::set_env(HOME, home);
    sys::set_env(USER, name);
    sys::set_env(LOGNAME, name);
}

fn unset_if_set(key: &str) {
    if std::env::var_os(key).is_some() {
        sys::unset_env(key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::record::tests::record;

    #[test]
    fn the_finish_programs_variables() {
        let mut r = record(Instant::now());
        let vars = finish_vars(&r);
        let get = |vars: &[(&str, String)], k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(get(&vars, "DRAINIT_EXIT_CODE").as_deref(), Some("137"));
        assert_eq!(get(&vars, "DRAINIT_WORKER_STATUS").as_deref(), Some("signal:SIGKILL"));
        assert_eq!(get(&vars, "DRAINIT_DEADLINE_REACHED").as_deref(), Some("1"));
        assert_eq!(get(&vars, "DRAINIT_STOP_SIGNAL").as_deref(), Some("SIGTERM"));
        assert_eq!(get(&vars, "DRAINIT_STOP_REASON").as_deref(), Some("signal"));
        assert_eq!(get(&vars, "DRAINIT_ATTEMPT").as_deref(), Some("1"));
        assert_eq!(get(&vars, "DRAINIT_WORKER_STATUS_TEXT"), None, "only once the worker sent one");
        r.status = Some("in_flight=3".into());
        r.stop = None;
        let vars = finish_vars(&r);
        assert_eq!(get(&vars, "DRAINIT_WORKER_STATUS_TEXT").as_deref(), Some("in_flight=3"));
        assert_eq!(get(&vars, "DRAINIT_STOP_SIGNAL").as_deref(), Some("none"));
        assert_eq!(get(&vars, "DRAINIT_STOP_REASON").as_deref(), Some("none"));
        assert_eq!(get(&vars, "DRAINIT_OOM_KILLS").as_deref(), Some("0"));
        (r.oom_kills, r.worker_oom) = (None, true);
        let vars = finish_vars(&r);
        assert_eq!(get(&vars, "DRAINIT_OOM_KILLS").as_deref(), Some("unknown"), "no counter found");
        assert_eq!(get(&vars, "DRAINIT_WORKER_STATUS").as_deref(), Some("oom_kill"));
    }

    #[test]
    fn every_variable_written_is_in_the_table() {
        let names: Vec<&str> = TABLE.iter().map(|v| v.name).collect();
        let mut r = record(Instant::now());
        r.status = Some("x".into());
        let swept = Predecessor { attempt: Some(2), pid: Some(1), started: Some(0) }.finish_vars();
        for (name, _) in finish_vars(&r).into_iter().chain(swept) {
            let row = TABLE.iter().find(|v| v.name == name).unwrap();
            assert_ne!(row.target, For::Worker, "{name} is set for the finish program");
        }
        for name in [ATTEMPT, RETRY_AFTER_FILE, NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID] {
            assert!(names.contains(&name), "{name}");
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "one row per variable");
    }

    /// docs/design.md shows this table as it is here.
    #[test]
    fn the_design_shows_this_table() {
        let design = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md")).unwrap();
        let mut want = String::from("| variable | for | set | taken away |\n|---|---|---|---|\n");
        for var in &TABLE {
            let target = match var.target {
                For::Worker => "worker",
                For::Finish => "finish program",
                For::Both => "both",
            };
            want += &format!("| `{}` | {target} | {} | {} |\n", var.name, var.set, var.unset);
        }
        assert!(design.contains(&want), "docs/design.md should hold:\n{want}");
    }
}
