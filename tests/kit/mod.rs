//! The test kit: run the built drainit, drive it, and read what happened.
//! Every integration test file starts with `mod kit; use kit::*;`.
//!
//! - [`drainit`] / [`launch`] build a run ([`Builder`]): drainit (or any
//!   program) as PID 1 of a new PID + mount namespace with its own /proc
//!   ([`Mode::Pid1`]), or as a plain child of the test ([`Mode::Subreaper`]),
//!   optionally in a private PID namespace of its own whose pids the test
//!   hands out ([`Builder::private_pid_namespace`],
//!   [`Running::spawn_with_pid`]). Each of stdin, stdout and stderr is
//!   captured (stdout, stderr), /dev/null, closed, or an fd the test opened
//!   ([`Io`]: a [`pipe`] nobody reads, a [`pty`], a socket, a file):
//!   `.stderr(write_end)`. [`Builder::before_exec`] runs in the process that
//!   execs (PID 1 in a namespace).
//! - [`Running`] is the started run: `pid` (as the test sees it), `signal`
//!   (through a pidfd), `log` / `stdout` / `events` / `event` /
//!   `count_events`, `wait_log` / `wait_event`, `wait(limit)` for the end
//!   ([`Ended`]), `ns_proc` for /proc as the run's namespace sees it. A
//!   watchdog (60s, `Builder::watchdog`) SIGKILLs it and what it started
//!   past its limit; so does dropping it unfinished. Once it ended, its
//!   captured pipes are read to their end before `wait` returns.
//! - [`wait_until`] / [`wait_for`] are the bounded waits; assert the result.
//! - [`Recorder`] is the worker that records every signal it is sent
//!   (`sigrec.c`): the worker itself, a child or grandchild ([`Recorder::child`]),
//!   in its own session, an orphan, exiting on, ignoring, recording or dying
//!   of SIGTERM ([`Term`]), exiting by itself, per attempt; it notes its pid,
//!   readiness, the signals seen (counts, and their order:
//!   [`Recorder::received_sequence`]), and how it ended ([`End`]).
//! - [`Event`] parses drainit's logfmt lines ([`check_log_end`],
//!   [`one_clear_line`]) and other programs' (`Event::parse_tagged`);
//!   [`Procfs`] reads /proc ([`HOST`], or a namespace's; `alive_mentioning`
//!   finds what a test left behind by its scratch path);
//!   [`Cgroup`] is a v1 memory cgroup of the test's own (OOM kills);
//!   [`c_helper`] compiles the other C workers (bomb.c, orphans.c);
//!   [`is_static_elf`] tells a static binary from one that needs a loader;
//!   [`need_program`] finds a tool the test needs or fails naming its
//!   package (a missing tool is a failure, never a skip).
//! - [`per_mode!`] makes one `#[test]` per mode from one body, [`cases!`] one
//!   per row of a table (`per_mode!` takes rows too).
//!
//! A typical test:
//!
//! ```ignore
//! mod kit;
//! use kit::*;
//!
//! per_mode! {
//!     /// A worker that ignores SIGTERM is SIGKILLed at the deadline.
//!     fn sigterm_ignored_means_137(mode) {
//!         let dir = Scratch::new("deadline");
//!         let rec = Recorder::new(&dir, "w").term(Term::Ignore);
//!         let mut run = drainit(mode, rec.worker_with(&["--grace", "1s"])).spawn();
//!         assert!(rec.wait_ready(secs(10)), "{}", run.log());
//!         run.signal(libc::SIGTERM);
//!         let ended = run.wait(secs(10));
//!         assert_eq!(ended.code, Some(137), "{}", run.log());
//!         assert_eq!(run.count_events("deadline_reached"), 1);
//!     }
//! }
//!
//! cases! {
//!     fn stderr_nobody_reads(code: i32) {
//!         let (_unread, write_end) = pipe();
//!         let mut run = drainit(Mode::Subreaper, sh(&format!("exit {code}"))).stderr(write_end).spawn();
//!         assert_eq!(run.wait(secs(10)).code, Some(code));
//!     }
//!     case exit_0(0);
//!     case exit_3(3);
//! }
//! ```
#![allow(dead_code, unused_imports, unused_macros)]

mod cases;
mod cc;
mod cgroup;
mod elf;
mod events;
mod launch;
mod pidfd;
mod procfs;
pub mod pty;
mod recorder;
mod refusal;
mod running;
mod tools;

pub(crate) use cases::{cases, per_mode};
pub use cc::c_helper;
pub use cgroup::Cgroup;
pub use elf::is_static_elf;
pub use events::{
    Event, check_log_end, event_names, logfmt, one_clear_line, parse_duration, parse_events, parse_events_tagged,
};
pub use launch::{Builder, Io, drainit, enter_with_pid, launch, pipe, runner_argv, scrub_env, under_a_subreaper};
pub use pidfd::Pidfd;
pub use procfs::{HOST, Procfs, Stat, alive, alive_as, exists};
pub use recorder::{End, Recorder, Term};
pub use refusal::assert_refused;
pub use running::{Ended, Running};
pub use tools::{find_program, need_program};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_drainit");

/// Under an emulator (`DRAINIT_TEST_RUNNER`, e.g. qemu-user running the
/// aarch64 build), a test that needs what the emulator cannot do returns
/// early through this: it prints why, so the skip shows in the test output
/// (`--nocapture`) and in scripts/check-release's summary.
pub fn skip_under_runner(what: &str) -> bool {
    match std::env::var("DRAINIT_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            println!("SKIPPED under {runner}: {what}");
            eprintln!("SKIPPED under {runner}: {what}");
            true
        }
        _ => false,
    }
}

/// How drainit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a fresh PID and mount namespace with its own /proc.
    Pid1,
    /// A plain child of the test: drainit registers as child subreaper.
    Subreaper,
}

pub const MODES: [Mode; 2] = [Mode::Pid1, Mode::Subreaper];

/// Poll `cond` every 10ms until it holds (true) or `limit` passes (false).
/// The only wait in the tests: assert its result, or it is a hidden sleep.
#[must_use = "assert the result: an unchecked wait is a hidden sleep"]
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_until`] for a value: the first `Some` that `f` returns.
#[must_use = "a wait's result must be used"]
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let mut found = None;
    let _ = wait_until(limit, || {
        found = f();
        found.is_some()
    });
    found
}

/// Make the calling thread SCHED_FIFO (the lowest real-time priority): a
/// test's instrument (the thread that notes when drainit exits) must see
/// the moment it happens, not when a storm's senders or a fork bomb's
/// processes, which share the machine's two cores with it, leave it a
/// turn. Processes it starts after do not inherit it (SCHED_RESET_ON_FORK):
/// drainit is measured at its own priority. Whether it took (root, or
/// RLIMIT_RTPRIO).
pub fn realtime() -> bool {
    // SAFETY: sched_param is plain integers (musl's has more fields than
    // glibc's): all zero is a valid value.
    let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
    param.sched_priority = 1;
    // SAFETY: sched_setscheduler reads param, valid for the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0 }
}

/// CLOCK_MONOTONIC in ns: the clock of the recorder's timestamps.
pub fn monotonic_ns() -> u128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

/// From monotonic stamp `from` to `to` (the recorder's, or
/// [`monotonic_ns`]), as a Duration; zero when `to` is the earlier.
pub fn between(from: u128, to: u128) -> Duration {
    Duration::from_nanos(to.saturating_sub(from) as u64)
}

/// A scratch directory for one test, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "drainit-test-{}-{}-{}",
            tag,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The file's contents, or "" while it does not exist.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    pub fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    pub fn lines(&self, name: &str) -> Vec<String> {
        self.read(name).lines().map(str::to_string).collect()
    }

    /// The directory as a string (it names this test's processes: a marker
    /// for [`alive_as`]).
    pub fn str(&self) -> String {
        path_str(&self.0)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `-- sh -c script`.
pub fn sh(script: &str) -> Vec<String> {
    vec!["--".into(), "sh".into(), "-c".into(), script.into()]
}

/// Options, then `-- sh -c script`.
pub fn with_sh(options: &[&str], script: &str) -> Vec<String> {
    options.iter().map(|s| s.to_string()).chain(sh(script)).collect()
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}

pub const SECOND: Duration = Duration::from_secs(1);

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// DRAINIT_LONG=1 turns on the long modes of the robustness tests.
pub fn long_mode() -> bool {
    std::env::var_os("DRAINIT_LONG").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Serialize the heavy scenarios of one test binary: on two shared cores, a
/// zombie storm next to a fork bomb would measure each other.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}
