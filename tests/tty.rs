//! On a terminal (issue 6): `docker run -it` behaves as if drainit were not
//! there. Each test runs under a real pseudo-terminal that this file opens
//! and drives from its master side, with every read bounded by poll and a
//! deadline, and a watchdog that SIGKILLs everything if a test overruns.
//!
//! The docker/runc set-up: drainit is PID 1 of a new PID namespace and the
//! leader of a session whose controlling terminal is the pty slave (on fds 0,
//! 1 and 2). The "typed at a shell" set-up: PID 1 of the namespace is an
//! interactive `sh -i` owning the terminal, and drainit is a command typed at
//! it (its foreground job, not a session leader).

mod common;
use common::*;

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A generous bound for one expected piece of output on a noisy machine.
const STEP: Duration = Duration::from_secs(20);
/// Past this, the watchdog kills the whole session.
const WATCHDOG: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------- the pty

/// A new pty pair, both ends close-on-exec (atomically: other tests fork
/// concurrently), the slave sized `rows` x `cols`.
fn open_pty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    // SAFETY: plain libc calls on fds this function owns; ptsname_r writes
    // at most buf.len() bytes into buf.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK);
        assert!(master >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = OwnedFd::from_raw_fd(master);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        let mut buf = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master.as_raw_fd(), buf.as_mut_ptr(), buf.len()), 0);
        let slave = libc::open(buf.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(slave >= 0, "open {:?}: {}", CStr::from_ptr(buf.as_ptr()), std::io::Error::last_os_error());
        let slave = OwnedFd::from_raw_fd(slave);
        set_size(&master, rows, cols);
        (master, slave)
    }
}

/// TIOCSWINSZ on the master: what docker does when the client's window
/// changes. The kernel then sends SIGWINCH to the foreground group.
fn set_size(master: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

/// The slave's device as /proc/PID/stat's tty_nr encodes it.
fn tty_nr(slave: &OwnedFd) -> i64 {
    // SAFETY: fstat writes one stat into a valid, zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(slave.as_raw_fd(), &mut st) }, 0);
    let (major, minor) = (libc::major(st.st_rdev) as i64, libc::minor(st.st_rdev) as i64);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

// ---------------------------------------------------------------- /proc

/// The fields of /proc/PID/stat the tests look at (pids in our namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    ppid: i32,
    pgrp: i32,
    session: i32,
    tty_nr: i64,
    tpgid: i32,
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let close = text.rfind(')')?;
    let f: Vec<&str> = text[close + 1..].split_whitespace().collect();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        tty_nr: f.get(4)?.parse().ok()?,
        tpgid: f.get(5)?.parse().ok()?,
    })
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The first descendant of `pid` (breadth first) whose comm is `name`.
fn descendant(pid: i32, name: &str) -> Option<i32> {
    let mut queue = vec![pid];
    while !queue.is_empty() {
        let mut next = Vec::new();
        for p in queue {
            for c in children(p) {
                if comm(c) == name {
                    return Some(c);
                }
                next.push(c);
            }
        }
        queue = next;
    }
    None
}

fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let mut found = None;
    wait_until(limit, || {
        found = f();
        found.is_some()
    });
    found
}

// ---------------------------------------------------------------- a session

/// Kills `pids` with SIGKILL unless dropped within `limit`.
struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
}

impl Watchdog {
    fn new(pids: Vec<i32>, limit: Duration) -> Watchdog {
        let (stop, stopped) = mpsc::channel::<()>();
        thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(limit) {
                eprintln!("tty watchdog: killing {pids:?} after {limit:?}");
                for pid in pids {
                    // SAFETY: kill with integer arguments.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        });
        Watchdog { stop: Some(stop) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.take(); // disconnects: the thread ends without killing
    }
}

/// A program run as PID 1 of a new PID (and mount) namespace, leader of a
/// new session whose controlling terminal is a fresh pty (its stdin, stdout
/// and stderr), the way runc starts a container's process for `docker run
/// -it`. The test holds the master.
struct Session {
    launcher: Child,
    /// PID 1 of the namespace, as we see it.
    pid1: i32,
    master: OwnedFd,
    tty_nr: i64,
    /// Everything read from the master so far.
    out: Vec<u8>,
    /// `expect` searches from here.
    mark: usize,
    code: Option<Option<i32>>,
    _dog: Watchdog,
}

impl Session {
    fn start(argv: &[&str]) -> Session {
        let (master, slave) = open_pty(24, 80);
        let tty_nr = tty_nr(&slave);
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("DRAINIT_") || k == "ENV" || k == "PS1" || k == "PS2" {
                cmd.env_remove(key);
            }
        }
        cmd.env("TERM", "dumb");
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        cmd.stdin(io(&slave)).stdout(io(&slave)).stderr(io(&slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe { cmd.pre_exec(enter_container) };
        let mut launcher = cmd.spawn().expect("start the pty launcher");
        drop(slave);
        let me = launcher.id() as i32;
        let pid1 = wait_for(secs(10), || children(me).first().copied());
        let Some(pid1) = pid1 else {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("no PID 1 under the launcher");
        };
        let _dog = Watchdog::new(vec![pid1, me], WATCHDOG);
        Session { launcher, pid1, master, tty_nr, out: Vec::new(), mark: 0, code: None, _dog }
    }

    fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    /// Read what is there, waiting until `until` for something to arrive.
    /// False at the deadline or at end of file (every slave fd closed).
    fn read_some(&mut self, until: Instant) -> bool {
        let left = until.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd { fd: self.master.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n <= 0 {
            return false;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: reads at most buf.len() bytes into buf (the fd is non-blocking).
        let got = unsafe { libc::read(self.master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if got > 0 {
            self.out.extend_from_slice(&buf[..got as usize]);
            true
        } else {
            // EAGAIN after a spurious wakeup: go on; EIO (hung up) or 0: done.
            got < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
        }
    }

    /// Wait for `needle` in the output after the last match; returns the
    /// output from there up to and including the match.
    fn expect(&mut self, needle: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            let text = self.transcript();
            if let Some(at) = text.get(self.mark..).and_then(|rest| rest.find(needle)) {
                let end = self.mark + at + needle.len();
                let seen = text[self.mark..end].to_string();
                self.mark = end;
                return seen;
            }
            if Instant::now() >= until || (!self.read_some(until) && Instant::now() < until && self.hung_up()) {
                panic!("no {needle:?} within {limit:?}; transcript:\n{}", self.transcript());
            }
        }
    }

    /// Whether every slave fd is closed (the session is over).
    fn hung_up(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.master.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut pfd, 1, 0) };
        pfd.revents & libc::POLLHUP != 0 && pfd.revents & libc::POLLIN == 0
    }

    /// Collect output for `d` (to see that something does NOT come).
    fn settle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if !self.read_some(until) && self.hung_up() {
                thread::sleep(ms(20));
            }
        }
    }

    /// Type `bytes` at the terminal.
    fn send(&mut self, bytes: &[u8]) {
        let until = Instant::now() + STEP;
        let mut done = 0;
        while done < bytes.len() {
            // SAFETY: writes from a valid slice.
            let n = unsafe { libc::write(self.master.as_raw_fd(), bytes[done..].as_ptr().cast(), bytes.len() - done) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            assert!(Instant::now() < until, "the terminal took no input for {STEP:?}:\n{}", self.transcript());
            // Input queue full: let the other side read (and keep reading
            // its output so that it cannot block on a full output queue).
            self.read_some(Instant::now() + ms(20));
        }
    }

    fn line(&mut self, text: &str) {
        self.send(format!("{text}\n").as_bytes());
    }

    fn resize(&self, rows: u16, cols: u16) {
        set_size(&self.master, rows, cols);
    }

    /// Wait for the launcher, which exits with PID 1's code (or dies of its
    /// signal); keeps reading the terminal meanwhile.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.launcher.try_wait().unwrap() {
                self.settle(ms(100));
                let code = status.code().or(status.signal().map(|s| 128 + s));
                self.code = Some(code);
                return code;
            }
            if Instant::now() >= until {
                panic!("PID 1 did not exit within {limit:?}; transcript:\n{}", self.transcript());
            }
            if !self.read_some(Instant::now() + ms(50)) {
                thread::sleep(ms(10));
            }
        }
    }

    /// The namespace's processes under PID 1: the first with this comm.
    fn find(&self, name: &str) -> i32 {
        wait_for(STEP, || descendant(self.pid1, name))
            .unwrap_or_else(|| panic!("no {name} under PID 1; transcript:\n{}", self.transcript()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if std::env::var_os("TTY_TRANSCRIPT").is_some() {
            eprintln!("---- transcript ----\n{}\n----", self.transcript());
        }
        if self.code.is_none() {
            // SIGKILL to a namespace's PID 1 kills the whole namespace.
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(self.pid1, libc::SIGKILL) };
            let _ = self.launcher.kill();
        }
        let _ = self.launcher.wait();
    }
}

/// In the launcher's child, after std has put the pty slave on fds 0-2:
/// new PID and mount namespaces with their own /proc, then, in PID 1 of
/// the namespace: a new session taking the slave as its controlling
/// terminal (which makes its group the foreground group). The process left
/// outside mirrors PID 1's exit status.
fn enter_container() -> std::io::Result<()> {
    // The launcher keeps nothing open: not std's exec-status pipe (spawn
    // would wait for it), not the slave (the master must see the hang-up
    // when the namespace is gone).
    let pid = fork_into_pid_namespace(0)?;
    if pid > 0 {
        mirror_exit(pid);
    }
    // SAFETY: plain syscalls with constant arguments.
    if unsafe { libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 } {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// drainit (with `-v`, so forwarded signals are logged) running `argv`.
fn drainit_on_tty(argv: &[&str]) -> Session {
    let mut all = vec![BIN, "-v", "--"];
    all.extend_from_slice(argv);
    Session::start(&all)
}

/// Interactive dash with a prompt that the tests can wait for.
const SHELL: [&str; 3] = ["sh", "-i", "-m"];
const PROMPT: &str = "tty$ ";

fn set_prompt(s: &mut Session) {
    s.line(&format!("PS1='{PROMPT}'"));
    s.expect(PROMPT, STEP);
}

fn count_lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().count()
}

// ---------------------------------------------------------------- the tests

/// The worker's first instruction already sees itself as the leader of a
/// session whose controlling terminal is the pty, its group the foreground
/// group: drainit sets this up before exec, not after (no race against the
/// first keystroke). drainit itself has given the terminal up.
#[test]
fn worker_owns_the_terminal_from_its_first_instruction() {
    let mut s = drainit_on_tty(&["sh", "-c", "echo STAT; cat /proc/$$/stat; echo TATS; exit 3"]);
    s.expect("STAT", STEP);
    let seen = s.expect("TATS", STEP);
    let line = seen.lines().find(|l| l.contains("(sh)")).unwrap_or_else(|| panic!("no stat line:\n{}", s.transcript()));
    let st = parse_stat(line).unwrap();
    // In the namespace's numbering the worker is PID 2 (drainit is 1).
    let pid: i32 = line.trim().split(' ').next().unwrap().parse().unwrap();
    assert_eq!((st.pgrp, st.session), (pid, pid), "worker leads its own session and group: {line}");
    assert_eq!(st.tty_nr, s.tty_nr, "the pty is the worker's controlling terminal: {line}");
    assert_eq!(st.tpgid, pid, "the worker's group is the foreground group at once: {line}");
    assert_eq!(s.wait(STEP), Some(3), "drainit exits with the worker's code:\n{}", s.transcript());
    assert!(s.transcript().contains("event=exit code=3"), "{}", s.transcript());
}

/// A restart (backoff) takes the terminal again: the previous worker's
/// session released it when its leader exited.
#[test]
fn a_restarted_worker_takes_the_terminal_again() {
    let mut s = Session::start(&[
        BIN,
        "--backoff-delay",
        "100ms",
        "--",
        "sh",
        "-c",
        "echo STAT$DRAINIT_ATTEMPT; cat /proc/$$/stat; echo TATS; [ $DRAINIT_ATTEMPT = 2 ] && exit 6; exit 75",
    ]);
    for attempt in 1..=2 {
        s.expect(&format!("STAT{attempt}"), STEP);
        let seen = s.expect("TATS", STEP);
        let line = seen.lines().find(|l| l.contains("(sh)")).unwrap_or_else(|| panic!("{}", s.transcript()));
        let st = parse_stat(line).unwrap();
        let pid: i32 = line.trim().split(' ').next().unwrap().parse().unwrap();
        assert_eq!((st.session, st.tty_nr, st.tpgid), (pid, s.tty_nr, pid), "attempt {attempt}: {line}");
    }
    assert_eq!(s.wait(STEP), Some(6), "{}", s.transcript());
}

/// A command typed at an interactive shell runs and prints; drainit holds no
/// terminal; `exit 3` ends drainit with 3.
#[test]
fn interactive_shell_runs_commands_and_exit_code_is_the_shells() {
    let mut s = drainit_on_tty(&SHELL);
    set_prompt(&mut s);
    s.line("echo M$((6*7))K");
    s.expect("M42K", STEP);
    s.expect(PROMPT, STEP);

    let sh = s.find("sh");
    let (worker, init) = (stat(sh).unwrap(), stat(s.pid1).unwrap());
    assert_eq!((worker.session, worker.pgrp), (sh, sh), "{worker:?}");
    assert_eq!(worker.tty_nr, s.tty_nr, "the shell's controlling terminal is the pty: {worker:?}");
    assert_eq!(worker.tpgid, sh, "the idle shell is the foreground group: {worker:?}");
    assert_eq!(init.tty_nr, 0, "drainit gave the terminal up: {init:?}");
    assert_eq!(init.session, s.pid1, "drainit stays a session leader: {init:?}");

    // The shell has job control (it could open /dev/tty and own it).
    s.line("sleep 100 & echo J$((1+1))B; jobs");
    s.expect("J2B", STEP);
    s.expect("sleep 100", STEP);
    s.expect(PROMPT, STEP);
    let sleep = s.find("sleep");
    assert_eq!(stat(sleep).unwrap().pgrp, sleep, "a background job gets its own group");
    s.line("kill %1; wait");
    s.expect(PROMPT, STEP);

    s.line("exit 3");
    assert_eq!(s.wait(STEP), Some(3), "{}", s.transcript());
    let text = s.transcript();
    assert!(text.contains("event=child_exited") && text.contains("event=exit code=3"), "{text}");
}

/// Ctrl-C goes from the terminal to the foreground job, once: drainit is not
/// in the foreground group, so it neither receives nor forwards a copy, and
/// no stop is requested. The shell survives.
#[test]
fn ctrl_c_interrupts_the_foreground_job_once() {
    let dir = Scratch::new("tty-intr");
    let (count, stop) = (dir.path("ints"), dir.path("stop"));
    let mut s = drainit_on_tty(&SHELL);
    set_prompt(&mut s);

    // (An interrupted job also interrupts the rest of its command line,
    // as in any shell with job control, so $? is asked for afterwards.)
    s.line("sleep 100");
    let sleep = s.find("sleep");
    assert!(wait_until(STEP, || stat(sleep).is_some_and(|st| st.tpgid == st.pgrp)), "sleep never foreground");
    s.send(b"\x03");
    s.expect(PROMPT, STEP);
    assert!(wait_until(STEP, || !alive(sleep)), "Ctrl-C ended sleep");
    s.line("echo after=$?");
    s.expect("after=130", STEP);
    s.expect(PROMPT, STEP);

    // A foreground job that counts every SIGINT it gets.
    s.line(&format!(
        "sh -c 'trap \"echo INT >> {c}\" INT; echo RE\"\"ADY; i=0; \
         while [ ! -e {stop} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo DO\"\"NE'",
        c = count.display(),
        stop = stop.display()
    ));
    s.expect("READY", STEP);
    s.send(b"\x03");
    assert!(wait_until(STEP, || count_lines(&count) >= 1), "no SIGINT counted:\n{}", s.transcript());
    s.settle(ms(700));
    assert_eq!(count_lines(&count), 1, "exactly one SIGINT reaches the job:\n{}", s.transcript());
    std::fs::write(&stop, "").unwrap();
    s.expect("DONE", STEP);
    s.expect(PROMPT, STEP);

    s.line("echo al\"\"ive");
    s.expect("alive", STEP);
    s.expect(PROMPT, STEP);
    let text = s.transcript();
    assert!(!text.contains("event=stop_requested"), "Ctrl-C is not a stop request for drainit:\n{text}");
    assert!(!text.contains("event=signal_forwarded"), "drainit forwards nothing:\n{text}");
    s.line("exit 0");
    assert_eq!(s.wait(STEP), Some(0), "{}", s.transcript());
}

/// Ctrl-Z suspends the foreground job, `fg` resumes it; drainit never stops
/// and forwards nothing.
#[test]
fn ctrl_z_then_fg() {
    let mut s = drainit_on_tty(&SHELL);
    set_prompt(&mut s);
    s.line("sleep 100");
    let sleep = s.find("sleep");
    assert!(wait_until(STEP, || stat(sleep).is_some_and(|st| st.tpgid == st.pgrp)), "sleep never foreground");
    s.send(b"\x1a");
    s.expect("Stopped", STEP);
    s.expect(PROMPT, STEP);
    let st = stat(sleep).unwrap();
    assert_eq!(st.state, 'T', "sleep is stopped: {st:?}");
    let sh = s.find("sh");
    assert_eq!(st.tpgid, sh, "the shell took the terminal back: {st:?}");
    assert_ne!(stat(s.pid1).unwrap().state, 'T', "drainit does not stop");

    s.line("jobs");
    s.expect("sleep 100", STEP);
    s.expect(PROMPT, STEP);
    s.line("fg");
    s.expect("sleep 100", STEP);
    assert!(
        wait_until(STEP, || stat(sleep).is_some_and(|st| st.state != 'T' && st.tpgid == sleep)),
        "fg resumes sleep in the foreground: {:?}\n{}",
        stat(sleep),
        s.transcript()
    );
    s.send(b"\x03");
    s.expect(PROMPT, STEP);
    assert!(wait_until(STEP, || !alive(sleep)), "Ctrl-C ended the resumed sleep");
    assert_ne!(stat(s.pid1).unwrap().state, 'T', "drainit does not stop");

    s.line("echo al\"\"ive");
    s.expect("alive", STEP);
    let text = s.transcript();
    assert!(!text.contains("event=signal_forwarded"), "drainit forwards nothing:\n{text}");
    s.line("exit 4");
    assert_eq!(s.wait(STEP), Some(4), "{}", s.transcript());
}

/// A resize of the terminal (TIOCSWINSZ on the master, as docker does)
/// reaches the foreground job as SIGWINCH and `stty size` sees it.
#[test]
fn resize_reaches_the_foreground_job() {
    let mut s = drainit_on_tty(&SHELL);
    set_prompt(&mut s);
    s.line("stty size");
    s.expect("24 80", STEP);
    s.expect(PROMPT, STEP);

    // A foreground job that prints the size when SIGWINCH comes, then ends.
    s.line(
        "sh -c 'trap \"echo WINCH; stty size; exit 0\" WINCH; echo RE\"\"ADY; i=0; \
         while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo NO\"\"WINCH'",
    );
    s.expect("READY", STEP);
    s.resize(50, 132);
    s.expect("WINCH", STEP);
    s.expect("50 132", STEP);
    s.expect(PROMPT, STEP);

    // And the shell itself, idle in the foreground, sees the new size.
    s.resize(33, 99);
    s.line("stty size");
    s.expect("33 99", STEP);
    s.expect(PROMPT, STEP);
    s.line("exit 0");
    assert_eq!(s.wait(STEP), Some(0), "{}", s.transcript());
}

/// Without a terminal (stdin /dev/null, the usual container) nothing of the
/// above happens: the worker is a session leader without a controlling
/// terminal, and everything works as before.
#[test]
fn without_a_terminal_nothing_changes() {
    for mode in MODES {
        let script = "cat /proc/$$/stat; if tty >/dev/null; then echo HAS_TTY; else echo NO_TTY; fi; \
                      if (exec 3</dev/tty) 2>/dev/null; then echo DEV_TTY; else echo NO_DEV_TTY; fi; exit 5";
        let mut run = drainit(mode, sh(script)).spawn();
        let ended = run.wait(secs(30));
        assert_eq!(ended.code, Some(5), "{mode:?}: {}", run.log());
        let out = run.stdout();
        let line = out.lines().find(|l| l.contains("(sh)")).unwrap_or_else(|| panic!("{mode:?}: {out}"));
        let st = parse_stat(line).unwrap();
        let pid: i32 = line.split(' ').next().unwrap().parse().unwrap();
        assert_eq!((st.session, st.pgrp), (pid, pid), "{mode:?}: {line}");
        assert_eq!(st.tty_nr, 0, "{mode:?}: no controlling terminal: {line}");
        assert_eq!(st.tpgid, -1, "{mode:?}: {line}");
        assert!(out.contains("NO_TTY") && out.contains("NO_DEV_TTY"), "{mode:?}: {out}");
        assert!(run.log().contains("event=exit code=5"), "{mode:?}: {}", run.log());
    }
}

/// drainit typed at an interactive shell: it is that shell's foreground job,
/// not a session leader, so the terminal stays the shell's session's and the
/// worker cannot take it (TIOCSCTTY fails; it runs without a controlling
/// terminal, still reading and writing the terminal). Ctrl-C, sent by the
/// terminal to drainit's group, is forwarded once to the worker's group (and
/// is a stop request); Ctrl-Z is forwarded too but cannot stop the worker,
/// whose group is orphaned, and drainit never stops. drainit ends with the
/// worker's code and the outer shell gets its terminal back.
#[test]
fn typed_at_a_shell_ctrl_c_is_forwarded_once() {
    let dir = Scratch::new("tty-nested");
    let (count, stop, stat_file) = (dir.path("ints"), dir.path("stop"), dir.path("stat"));
    let mut s = Session::start(&SHELL);
    set_prompt(&mut s);
    s.line(&format!(
        "{BIN} -v -- sh -c 'cat /proc/$$/stat > {st}; trap \"echo INT >> {c}\" INT; echo RE\"\"ADY; i=0; \
         while [ ! -e {stop} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 7'; echo code=$?",
        st = stat_file.display(),
        c = count.display(),
        stop = stop.display()
    ));
    s.expect("READY", STEP);
    let drainit = s.find("drainit");
    let worker = wait_for(STEP, || children(drainit).into_iter().find(|&c| comm(c) == "sh")).expect("the worker");
    let (d, w, outer) = (stat(drainit).unwrap(), stat(worker).unwrap(), stat(s.pid1).unwrap());
    assert_eq!(outer.tpgid, d.pgrp, "drainit is the outer shell's foreground job: {d:?} {outer:?}");
    assert_ne!(d.session, drainit, "drainit is not a session leader: {d:?}");
    assert_eq!(d.tty_nr, 0, "drainit let go of the terminal: {d:?}");
    assert_eq!((w.session, w.tty_nr), (worker, 0), "the worker has its own session, without the terminal: {w:?}");
    let inner = parse_stat(&std::fs::read_to_string(&stat_file).unwrap()).unwrap();
    assert_eq!(inner.tty_nr, 0, "from its first instruction: {inner:?}");

    s.send(b"\x03");
    assert!(wait_until(STEP, || count_lines(&count) >= 1), "no SIGINT counted:\n{}", s.transcript());
    s.expect("event=stop_requested signal=SIGINT", STEP);
    s.settle(ms(700));
    assert_eq!(count_lines(&count), 1, "exactly one SIGINT reaches the worker:\n{}", s.transcript());

    s.send(b"\x1a");
    s.expect("event=signal_forwarded signal=SIGTSTP", STEP);
    s.settle(ms(300));
    assert_ne!(stat(drainit).unwrap().state, 'T', "drainit does not stop");
    assert_ne!(stat(worker).unwrap().state, 'T', "an orphaned group ignores a forwarded SIGTSTP");

    std::fs::write(&stop, "").unwrap();
    s.expect("event=exit code=7", STEP);
    s.expect("code=7", STEP);
    s.expect(PROMPT, STEP);
    s.line("echo al\"\"ive");
    s.expect("alive", STEP);
    s.line("exit 0");
    assert_eq!(s.wait(STEP), Some(0), "{}", s.transcript());
}

/// Typed at a shell, Ctrl-C is a stop request like any SIGINT drainit gets:
/// a worker that survives it (an interactive shell does) is killed at the
/// grace deadline, and drainit ends with 137.
#[test]
fn typed_at_a_shell_ctrl_c_starts_the_grace_clock() {
    let mut s = Session::start(&SHELL);
    set_prompt(&mut s);
    s.line(&format!("{BIN} --grace 1s -- sh -i; echo code=$?"));
    s.expect("event=child_started", STEP);
    // The inner shell reads and writes the terminal without owning it.
    s.line("echo IN$((2+3))NER");
    s.expect("IN5NER", STEP);
    s.send(b"\x03");
    s.expect("event=stop_requested signal=SIGINT", STEP);
    s.expect("event=deadline_reached", STEP);
    s.expect("event=exit code=137", STEP);
    s.expect("code=137", STEP);
    s.expect(PROMPT, STEP);
    s.line("exit 0");
    assert_eq!(s.wait(STEP), Some(0), "{}", s.transcript());
}
