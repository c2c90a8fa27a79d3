//! Support for the robustness tests (storm.rs, hostile.rs, timing_property.rs):
//! small C workers compiled at test time, /proc readers (RSS, descendants,
//! process state) and the log checks every scenario shares. tests/common is
//! the launcher; this adds only what the hostile scenarios need.
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Compile `source` (C) into an executable named after `name` and a hash of
/// the source, under cargo's per-target scratch directory; compiled once,
/// shared by every test (and every later run) that asks for the same source.
pub fn c_helper(name: &str, source: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut hasher = DefaultHasher::new();
    source.hash(&mut hasher);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("drainit-helpers");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(format!("{name}-{:016x}", hasher.finish()));
    if exe.exists() {
        return exe;
    }
    let src = dir.join(format!("{name}-{}.c", std::process::id()));
    std::fs::write(&src, source).unwrap();
    let tmp = dir.join(format!("{name}-{}.tmp", std::process::id()));
    let out = Command::new("gcc").args(["-O2", "-Wall", "-o"]).arg(&tmp).arg(&src).output().expect("gcc");
    assert!(out.status.success(), "gcc {name}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &exe).unwrap();
    let _ = std::fs::remove_file(&src);
    exe
}

/// (VmRSS, VmHWM) of `pid` in KiB.
pub fn memory_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Every descendant of `pid` in our view of /proc (children files).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut found = vec![pid];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) {
            for task in tasks.flatten() {
                let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                found.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
        next += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` exists at all (alive or zombie).
pub fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The invariants every scenario shares: no panic text, and the last line
/// is `event=exit code=N` with N drainit's real exit code.
pub fn check_log_end(log: &str, code: i32) -> Result<(), String> {
    if log.contains("panicked") || log.contains("RUST_BACKTRACE") {
        return Err(format!("panic text in the log:\n{log}"));
    }
    let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    if last != format!("drainit: event=exit code={code}") {
        return Err(format!("last line {last:?} is not event=exit code={code}; log:\n{log}"));
    }
    Ok(())
}

/// Events as (name, line) in order, for sequence checks.
pub fn event_names(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.strip_prefix("drainit: event="))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

/// DRAINIT_LONG=1 turns on the long modes.
pub fn long_mode() -> bool {
    std::env::var_os("DRAINIT_LONG").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A number from the environment, or `default`.
pub fn env_number(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn elapsed_ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Serialize the heavy scenarios of one test binary: on two shared cores, a
/// zombie storm next to a fork bomb would measure each other.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pidfd: signals that can only reach the process it was opened for, never
/// a later process that reuses the pid (a storm that outlives drainit must
/// not hit whatever the machine starts next).
pub struct Pidfd(i32);

impl Pidfd {
    pub fn open(pid: i32) -> Pidfd {
        Pidfd::try_open(pid).unwrap_or_else(|e| panic!("pidfd_open({pid}): {e}"))
    }

    /// None once the process is gone (reaped).
    pub fn try_open(pid: i32) -> std::io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags; returns an fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(Pidfd(fd)) }
    }

    /// Send `sig`; Err(errno) (ESRCH once the process has exited).
    pub fn send(&self, sig: i32) -> Result<(), i32> {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.0, sig, std::ptr::null::<u8>(), 0) };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
    }

    /// Whether the process has exited (the pidfd polls readable). True for
    /// a zombie too, unlike a failing kill: signals to a zombie succeed.
    pub fn exited(&self) -> bool {
        self.exits_within(0)
    }

    /// Wait up to `timeout_ms` for the process to exit; whether it did.
    pub fn exits_within(&self, timeout_ms: i32) -> bool {
        let mut fds = libc::pollfd { fd: self.0, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut fds, 1, timeout_ms) > 0 }
    }
}

impl Drop for Pidfd {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}

/// Whether `pid` is alive and still the process we mean: its command line
/// holds `marker` (a scratch path). On a busy machine (pid_max 32768) a pid
/// can name a stranger soon after its process is gone.
pub fn alive_as(pid: i32, marker: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat.rfind(')').is_some_and(|c| stat[c + 1..].trim_start().starts_with('Z'));
    !zombie && String::from_utf8_lossy(&cmdline).contains(marker)
}
