//! Starting drainit (or any program): as PID 1 of a new PID and mount
//! namespace with its own /proc, or as a plain child of the test, with the
//! standard streams the test chooses.
//!
//! In a namespace, a launcher process stays outside and ends exactly as
//! PID 1 ended (its code, or its signal: util-linux `unshare` reports a
//! death by signal as 1), so the test sees drainit's real exit status.

use super::running::Running;
use super::{BIN, Mode};

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What one of the program's standard streams is.
#[derive(Debug)]
pub enum Io {
    /// A pipe that a thread of the test reads (stdout, stderr): `Running::log`
    /// and `Running::stdout`.
    Capture,
    /// /dev/null.
    Null,
    /// No fd at all.
    Closed,
    /// An fd the test opened: a pipe end nobody reads, a pty, a socket, a file.
    Fd(OwnedFd),
}

impl From<OwnedFd> for Io {
    fn from(fd: OwnedFd) -> Io {
        Io::Fd(fd)
    }
}

impl From<File> for Io {
    fn from(f: File) -> Io {
        Io::Fd(f.into())
    }
}

impl From<UnixStream> for Io {
    fn from(s: UnixStream) -> Io {
        Io::Fd(s.into())
    }
}

/// A pipe, (read end, write end), both close-on-exec.
pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills a two-int array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both fds are fresh and ours.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

type Hook = Box<dyn FnMut() -> Result<()> + Send + Sync>;

/// A run being prepared; `spawn` starts it.
pub struct Builder {
    pub(super) cmd: Command,
    pub(super) mode: Mode,
    stdio: [Io; 3],
    hooks: Vec<Hook>,
    only_stdio: bool,
    controlling_tty: bool,
    pub(super) private_ns: bool,
    pub(super) watchdog: Duration,
}

/// drainit with `args` (its options, `--`, the worker), in `mode`. Stdin is
/// /dev/null, stdout and stderr are captured, and nothing of the test's
/// environment that drainit or a worker would act on gets through (DRAINIT_*,
/// NOTIFY_SOCKET, WATCHDOG_*: the socket of whatever runs the tests would
/// get the worker's messages).
pub fn drainit<S: AsRef<OsStr>>(mode: Mode, args: impl IntoIterator<Item = S>) -> Builder {
    let mut argv = runner_argv();
    argv.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
    launch(mode, argv)
}

/// How drainit is started: `DRAINIT_TEST_RUNNER` (an emulator such as
/// `qemu-aarch64-static`, words split on spaces) before the binary, which
/// is `DRAINIT_TEST_BIN` when set (another architecture's release build),
/// else the one cargo built. No binfmt_misc: the runner is named here.
pub fn runner_argv() -> Vec<std::ffi::OsString> {
    let mut argv: Vec<std::ffi::OsString> = match std::env::var("DRAINIT_TEST_RUNNER") {
        Ok(runner) => runner.split_whitespace().map(Into::into).collect(),
        Err(_) => Vec::new(),
    };
    argv.push(std::env::var_os("DRAINIT_TEST_BIN").filter(|b| !b.is_empty()).unwrap_or_else(|| BIN.into()));
    argv
}

/// Remove from `cmd`'s environment every variable of the test's own whose
/// name starts with one of `prefixes`.
pub fn scrub_env(cmd: &mut Command, prefixes: &[&str]) {
    for (key, _) in std::env::vars_os() {
        if prefixes.iter().any(|p| key.to_string_lossy().starts_with(p)) {
            cmd.env_remove(key);
        }
    }
}

/// Any program (`argv[0]` is looked up in PATH), set up as [`drainit`] is.
pub fn launch<S: AsRef<OsStr>>(mode: Mode, argv: impl IntoIterator<Item = S>) -> Builder {
    let mut argv = argv.into_iter();
    let mut cmd = Command::new(argv.next().expect("a program"));
    cmd.args(argv);
    scrub_env(&mut cmd, &["DRAINIT_", "NOTIFY_SOCKET", "WATCHDOG_"]);
    Builder {
        cmd,
        mode,
        stdio: [Io::Null, Io::Capture, Io::Capture],
        hooks: Vec::new(),
        only_stdio: false,
        controlling_tty: false,
        private_ns: false,
        watchdog: Duration::from_secs(60),
    }
}

impl Builder {
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Builder {
        self.cmd.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Builder {
        self.cmd.env_remove(key);
        self
    }

    /// Remove every variable of the test's environment whose name starts
    /// with `prefix` (a program's own settings, `LEASE_`).
    pub fn env_remove_prefix(mut self, prefix: &str) -> Builder {
        scrub_env(&mut self.cmd, &[prefix]);
        self
    }

    /// The working directory the program starts in.
    pub fn current_dir(mut self, dir: impl AsRef<std::path::Path>) -> Builder {
        self.cmd.current_dir(dir);
        self
    }

    pub fn stdin(mut self, io: impl Into<Io>) -> Builder {
        self.stdio[0] = io.into();
        self
    }

    pub fn stdout(mut self, io: impl Into<Io>) -> Builder {
        self.stdio[1] = io.into();
        self
    }

    pub fn stderr(mut self, io: impl Into<Io>) -> Builder {
        self.stdio[2] = io.into();
        self
    }

    /// Run `f` in the process that is about to exec the program (PID 1 of
    /// the namespace in [`Mode::Pid1`]), after its streams are set up. `f`
    /// runs after fork: only async-signal-safe calls.
    pub fn before_exec(mut self, f: impl FnMut() -> Result<()> + Send + Sync + 'static) -> Builder {
        self.hooks.push(Box::new(f));
        self
    }

    /// Exec the program with nothing open but fds 0, 1 and 2.
    pub fn only_stdio(mut self) -> Builder {
        self.only_stdio = true;
        self
    }

    /// Make the program the leader of a new session whose controlling
    /// terminal is its stdin (a pty slave), as runc does for `docker run -it`.
    pub fn controlling_tty(mut self) -> Builder {
        self.controlling_tty = true;
        self
    }

    /// [`Mode::Subreaper`] only: run inside a PID (and mount) namespace of
    /// its own whose PID 1 is a holder that keeps the namespace until the
    /// `Running` is dropped. Pids there are the test's to choose
    /// (`Running::spawn_with_pid`) and nothing else on the machine takes them.
    pub fn private_pid_namespace(mut self) -> Builder {
        assert_eq!(self.mode, Mode::Subreaper, "a private namespace is for a subreaper drainit");
        self.private_ns = true;
        self
    }

    /// Kill the run (and what it started) if it still runs after `limit`
    /// (default 60s).
    pub fn watchdog(mut self, limit: Duration) -> Builder {
        self.watchdog = limit;
        self
    }

    pub fn spawn(mut self) -> Running {
        let stdio = std::mem::replace(&mut self.stdio, [Io::Null, Io::Null, Io::Null]);
        let mut closed = Vec::new();
        for (fd, io) in stdio.into_iter().enumerate() {
            let stdio = match io {
                Io::Capture => {
                    assert!(fd > 0, "stdin cannot be captured");
                    Stdio::piped()
                }
                Io::Null => Stdio::null(),
                Io::Closed => {
                    closed.push(fd as RawFd);
                    Stdio::null()
                }
                Io::Fd(owned) => Stdio::from(owned),
            };
            match fd {
                0 => self.cmd.stdin(stdio),
                1 => self.cmd.stdout(stdio),
                _ => self.cmd.stderr(stdio),
            };
        }
        let mut hold = None;
        // SAFETY (every pre_exec below): the closures make only
        // async-signal-safe calls (unshare, fork, mount, waitpid, read,
        // write, close, _exit, setsid, ioctl) between fork and exec.
        unsafe {
            match (self.mode, self.private_ns) {
                (Mode::Pid1, _) => {
                    self.cmd.pre_exec(enter_pid1);
                }
                (Mode::Subreaper, true) => {
                    let (read, write) = pipe();
                    let fd = read.as_raw_fd();
                    self.cmd.pre_exec(move || enter_private_namespace(fd));
                    hold = Some((read, write));
                }
                (Mode::Subreaper, false) => {}
            }
            if self.controlling_tty {
                self.cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                        return Err(Error::last_os_error());
                    }
                    Ok(())
                });
            }
            if !closed.is_empty() {
                self.cmd.pre_exec(move || {
                    for fd in &closed {
                        libc::close(*fd);
                    }
                    Ok(())
                });
            }
            if self.only_stdio {
                self.cmd.pre_exec(|| {
                    // std's exec-status pipe goes too: a failed exec is then
                    // not reported as such, only as the child's exit.
                    libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0);
                    Ok(())
                });
            }
            for hook in std::mem::take(&mut self.hooks) {
                self.cmd.pre_exec(hook);
            }
        }
        Running::start(self, hold)
    }
}

/// unshare(CLONE_NEWPID | CLONE_NEWNS) and fork. In the child (PID 1 of the
/// new namespace; returns 0) / is made private and a fresh /proc mounted;
/// the parent gets the child's pid. Async-signal-safe.
pub fn fork_into_pid_namespace() -> Result<i32> {
    // SAFETY: plain syscalls with valid constant arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
            return Err(Error::last_os_error());
        }
        let pid = libc::fork();
        if pid != 0 {
            return if pid < 0 { Err(Error::last_os_error()) } else { Ok(pid) };
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

/// The launcher of [`Mode::Pid1`]: the namespace's PID 1 goes on to exec;
/// this process keeps no fd (a pipe's reader sees its end when the
/// namespace's processes are gone) and mirrors PID 1's end.
fn enter_pid1() -> Result<()> {
    let pid = fork_into_pid_namespace()?;
    if pid > 0 {
        close_from(0);
        mirror_exit(pid);
    }
    Ok(())
}

/// The launcher of a private namespace: PID 1 there is a holder that
/// forks the program (a subreaper drainit, not PID 1), sends its wait status
/// to this launcher, and keeps the namespace until `hold` reads EOF (the
/// test dropped its end). This launcher ends as the program ended.
fn enter_private_namespace(hold: RawFd) -> Result<()> {
    let mut status_pipe = [0; 2];
    // SAFETY: plain syscalls on fds this function owns; status is a local.
    unsafe {
        if libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(Error::last_os_error());
        }
        let [from_holder, to_launcher] = status_pipe;
        let holder = fork_into_pid_namespace()?;
        if holder > 0 {
            libc::close(to_launcher);
            if from_holder > 0 {
                libc::syscall(libc::SYS_close_range, 0, from_holder - 1, 0);
            }
            libc::syscall(libc::SYS_close_range, from_holder + 1, u32::MAX, 0);
            let mut status = 0i32;
            let got = loop {
                let n = libc::read(from_holder, (&raw mut status).cast(), 4);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            if got != 4 {
                // The holder died without a word: end as it did.
                mirror_exit(holder);
            }
            exit_as(status);
        }
        let program = libc::fork();
        if program < 0 {
            return Err(Error::last_os_error());
        }
        if program == 0 {
            return Ok(()); // exec: `hold` and the pipe are close-on-exec
        }
        libc::close(from_holder);
        close_from_except(&[to_launcher, hold]);
        let status = wait_status(program);
        libc::write(to_launcher, (&raw const status).cast(), 4);
        libc::close(to_launcher);
        let mut byte = 0u8;
        while libc::read(hold, (&raw mut byte).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
        libc::_exit(0);
    }
}

/// In a pre_exec closure: enter the PID namespace held by `holder` (a host
/// pid), take `want` as the next pid there (ns_last_pid: nothing else
/// forks in a private namespace unless the test does) and exec as the
/// leader of a new process group whose id is `want`. Two launchers stay
/// outside, mirroring the program's end; exit 97 if the pid was taken.
pub fn enter_with_pid(cmd: &mut Command, holder: i32, want: i32) {
    let ns = CString::new(format!("/proc/{holder}/ns/pid")).unwrap();
    let last = format!("{}", want - 1);
    // SAFETY: only async-signal-safe calls; the strings live in the closure.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWPID) != 0 {
                return Err(Error::last_os_error());
            }
            libc::close(fd);
            let inside = libc::fork();
            if inside != 0 {
                if inside < 0 {
                    return Err(Error::last_os_error());
                }
                close_from(0);
                mirror_exit(inside);
            }
            // In the namespace now: the next pid there is ours to set.
            let f = libc::open(c"/proc/sys/kernel/ns_last_pid".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if f < 0 || libc::write(f, last.as_ptr().cast(), last.len()) != last.len() as isize {
                libc::_exit(96);
            }
            libc::close(f);
            let program = libc::fork();
            if program != 0 {
                if program < 0 {
                    libc::_exit(96);
                }
                close_from(0);
                mirror_exit(program);
            }
            if libc::getpid() != want || libc::setpgid(0, 0) != 0 {
                libc::_exit(97);
            }
            Ok(())
        });
    }
}

/// In a pre_exec closure: become a child subreaper and fork; the program
/// runs in the child, under this process, which stays as its parent (a
/// subreaper above it, as a nested init or a supervisor would be) and ends
/// as it ends. Async-signal-safe.
pub fn under_a_subreaper() -> Result<()> {
    // SAFETY: plain syscalls with constant arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(Error::last_os_error());
        }
        let pid = libc::fork();
        if pid < 0 {
            return Err(Error::last_os_error());
        }
        if pid > 0 {
            close_from(0);
            mirror_exit(pid);
        }
    }
    Ok(())
}

fn close_from(fd: u32) {
    // SAFETY: close_range takes integers.
    unsafe { libc::syscall(libc::SYS_close_range, fd, u32::MAX, 0) };
}

/// Close every fd but `keep`.
fn close_from_except(keep: &[RawFd]) {
    let mut next = 0;
    let mut sorted = [RawFd::MAX; 4];
    sorted[..keep.len()].copy_from_slice(keep);
    sorted.sort_unstable();
    for &k in sorted.iter().filter(|&&k| k != RawFd::MAX) {
        if k > next {
            // SAFETY: close_range takes integers.
            unsafe { libc::syscall(libc::SYS_close_range, next, k - 1, 0) };
        }
        next = k + 1;
    }
    close_from(next as u32);
}

/// waitpid(pid) through EINTR; the raw status (125 << 8 if it fails).
fn wait_status(pid: i32) -> i32 {
    // SAFETY: plain syscalls; status is a valid local.
    unsafe {
        // A test may have set SIGCHLD to SIG_IGN for drainit to undo; the
        // launcher needs its child's status.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                return 125 << 8;
            }
        }
        status
    }
}

/// Wait for `pid` and end this process the same way: its exit code, or its
/// signal. Async-signal-safe; never returns.
pub fn mirror_exit(pid: i32) -> ! {
    exit_as(wait_status(pid))
}

/// End this process as a process with wait status `status` ended.
fn exit_as(status: i32) -> ! {
    // SAFETY: plain syscalls with integer or valid local arguments.
    unsafe {
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
