//! Test support: run the built drainit as PID 1 of a new PID namespace or as
//! a plain child (subreaper), capture its log, signal it, and wait for things
//! with a deadline. Every wait here is bounded; a test that would hang fails.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_drainit");

/// How drainit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a fresh PID and mount namespace with its own /proc.
    Pid1,
    /// A plain child of the test: drainit registers as child subreaper.
    Subreaper,
}

pub const MODES: [Mode; 2] = [Mode::Pid1, Mode::Subreaper];

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
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Poll `cond` every 10ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

pub struct Builder {
    cmd: Command,
    mode: Mode,
}

/// drainit with `args` (its options, `--`, the worker), in `mode`.
pub fn drainit<S: AsRef<OsStr>>(mode: Mode, args: impl IntoIterator<Item = S>) -> Builder {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DRAINIT_") {
            cmd.env_remove(key);
        }
    }
    Builder { cmd, mode }
}

impl Builder {
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Builder {
        self.cmd.env(key, value);
        self
    }

    /// Change the process before it execs drainit (runs in the forked child).
    pub fn before_exec(mut self, f: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> Builder {
        // SAFETY: callers pass closures that make only async-signal-safe calls.
        unsafe { self.cmd.pre_exec(f) };
        self
    }

    /// Start drainit with nothing open but stdin, stdout and stderr.
    pub fn only_stdio(self) -> Builder {
        self.before_exec(|| {
            // SAFETY: close_range takes integers; std's exec-status pipe goes
            // too, which only means a failed exec is not reported as such.
            unsafe { libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0) };
            Ok(())
        })
    }

    pub fn spawn(mut self) -> Running {
        if self.mode == Mode::Pid1 {
            // SAFETY: only async-signal-safe calls (unshare, fork, mount,
            // waitpid, _exit) between fork and exec.
            unsafe { self.cmd.pre_exec(enter_pid_namespace) };
        }
        let started = Instant::now();
        let mut child = self.cmd.spawn().expect("spawn drainit");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        let reader = thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let out_sink = Arc::clone(&out);
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut out = out_sink.lock().unwrap();
                out.push_str(&line);
                out.push('\n');
            }
        });
        let pid = match self.mode {
            Mode::Subreaper => child.id() as i32,
            Mode::Pid1 => {
                let path = format!("/proc/{0}/task/{0}/children", child.id());
                let mut found = None;
                let mut ended = false;
                wait_until(Duration::from_secs(10), || {
                    found = std::fs::read_to_string(&path).ok().and_then(|s| s.split_whitespace().next()?.parse().ok());
                    // A drainit that exits at once (exec failure, bad flags)
                    // may be gone before it is seen: then there is nothing
                    // left to signal, and `pid` stays 0.
                    ended = found.is_none() && child.try_wait().is_ok_and(|s| s.is_some());
                    found.is_some() || ended
                });
                assert!(found.is_some() || ended, "the PID-1 drainit never appeared under its launcher");
                found.unwrap_or(0)
            }
        };
        Running { child, pid, log, out, reader: Some(reader), started, status: None }
    }
}

/// In the child of the test, before exec: enter new PID and mount
/// namespaces, fork, and let the child (PID 1 there) go on to exec drainit
/// with its own /proc. This process stays behind, mirroring PID 1's status,
/// so the test sees drainit's exact exit code (util-linux unshare reports a
/// death by signal as 1).
fn enter_pid_namespace() -> std::io::Result<()> {
    // Keeps only stdio: std's exec-status pipe must not stay open, or
    // spawn() would wait for it.
    let pid = fork_into_pid_namespace(3)?;
    if pid > 0 {
        mirror_exit(pid);
    }
    Ok(())
}

/// unshare(CLONE_NEWPID | CLONE_NEWNS) and fork. In the child (PID 1 of the
/// new namespace, returns 0) / is made private and a fresh /proc mounted; the
/// parent (returns the child's pid) closes every fd from `keep_below` on.
/// Async-signal-safe: for pre_exec closures.
pub fn fork_into_pid_namespace(keep_below: u32) -> std::io::Result<i32> {
    use std::io::Error;
    // SAFETY: plain syscalls with valid constant arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
            return Err(Error::last_os_error());
        }
        let pid = libc::fork();
        if pid < 0 {
            return Err(Error::last_os_error());
        }
        if pid > 0 {
            libc::syscall(libc::SYS_close_range, keep_below, u32::MAX, 0);
            return Ok(pid);
        }
        let none = c"none".as_ptr();
        if libc::mount(none, c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0
            || libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), 0, std::ptr::null()) != 0
        {
            return Err(Error::last_os_error());
        }
        Ok(0)
    }
}

/// Wait for `pid` and end this process the same way: its exit code, or its
/// signal. Async-signal-safe; never returns.
pub fn mirror_exit(pid: i32) -> ! {
    // SAFETY: plain syscalls; status is a valid local.
    unsafe {
        // A test may have set SIGCHLD to SIG_IGN for drainit to undo; the
        // launcher needs its child's status.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(125);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::raise(sig);
        libc::_exit(128 + sig);
    }
}

pub struct Running {
    child: Child,
    /// drainit's pid as this test sees it.
    pub pid: i32,
    log: Arc<Mutex<String>>,
    out: Arc<Mutex<String>>,
    reader: Option<thread::JoinHandle<()>>,
    pub started: Instant,
    status: Option<ExitStatus>,
}

/// How drainit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub after: Duration,
}

impl Running {
    pub fn signal(&self, sig: i32) {
        assert!(self.pid > 0, "drainit had already exited");
        // SAFETY: kill with integer arguments.
        unsafe { libc::kill(self.pid, sig) };
    }

    /// drainit's stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The worker's stdout so far.
    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Wait for a log line containing every one of `parts`.
    pub fn wait_log(&self, parts: &[&str], limit: Duration) -> bool {
        wait_until(limit, || self.log().lines().any(|l| parts.iter().all(|p| l.contains(p))))
    }

    /// Wait for drainit to exit; panics (after killing it) past `limit`.
    pub fn wait(&mut self, limit: Duration) -> Ended {
        let mut status = None;
        let ok = wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        if !ok {
            let log = self.log();
            self.kill();
            panic!("drainit did not exit within {limit:?}; log:\n{log}");
        }
        let after = self.started.elapsed();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let status = status.unwrap();
        self.status = Some(status);
        Ended { code: status.code(), signal: status.signal(), after }
    }

    pub fn try_ended(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn kill(&mut self) {
        if self.pid > 0 {
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Events in the log, each as its key=value map (plus "event").
    pub fn events(&self) -> Vec<HashMap<String, String>> {
        parse_events(&self.log())
    }

    pub fn count_events(&self, name: &str) -> usize {
        self.events().iter().filter(|e| e["event"] == name).count()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill();
        }
    }
}

/// `drainit: event=x a=1 b="two words"` lines as maps.
pub fn parse_events(log: &str) -> Vec<HashMap<String, String>> {
    log.lines()
        .filter_map(|l| l.strip_prefix("drainit: "))
        .filter(|l| l.starts_with("event="))
        .map(|l| {
            let mut map = HashMap::new();
            let mut rest = l;
            while let Some((key, after)) = rest.split_once('=') {
                let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
                    let end = quoted.find('"').unwrap_or(quoted.len());
                    (&quoted[..end], quoted.get(end + 1..).unwrap_or(""))
                } else {
                    after.split_once(' ').unwrap_or((after, ""))
                };
                map.insert(key.trim().to_string(), value.to_string());
                rest = tail.trim_start();
            }
            map
        })
        .collect()
}

/// Pids whose parent is `pid` and whose state is zombie, from /proc.
pub fn zombie_children(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let Some(close) = stat.rfind(')') else { return false };
            let mut fields = stat[close + 1..].split_whitespace();
            let state = fields.next().unwrap_or("");
            let ppid: i32 = fields.next().and_then(|x| x.parse().ok()).unwrap_or(0);
            ppid == pid && state == "Z"
        })
        .collect()
}

/// Whether a process with this pid is alive (not a zombie) in our view.
pub fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').is_some_and(|c| !stat[c + 1..].trim_start().starts_with('Z'))
}

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
