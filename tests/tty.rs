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

mod kit;
use kit::*;

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A generous bound for one expected piece of output on a noisy machine.
const STEP: Duration = Duration::from_secs(20);
/// Past this, the run's watchdog kills the whole session.
const WATCHDOG: Duration = Duration::from_secs(120);

/// A program run as PID 1 of a new PID (and mount) namespace, leader of a
/// new session whose controlling terminal is a fresh pty (its stdin, stdout
/// and stderr), the way runc starts a container's process for `docker run
/// -it`. The test holds the master.
struct Session {
    run: Running,
    /// PID 1 of the namespace, as we see it.
    pid1: i32,
    master: OwnedFd,
    tty_nr: i64,
    /// Everything read from the master so far.
    out: Vec<u8>,
    /// `expect` searches from here.
    mark: usize,
}

impl Session {
    fn start(argv: &[&str]) -> Session {
        let (master, slave) = pty::open(24, 80);
        let tty_nr = pty::tty_nr(&slave);
        let io = || slave.try_clone().unwrap();
        let run = launch(Mode::Pid1, argv)
            .env_remove("ENV")
            .env_remove("PS1")
            .env_remove("PS2")
            .env("TERM", "dumb")
            .stdin(io())
            .stdout(io())
            .stderr(io())
            .controlling_tty()
            .watchdog(WATCHDOG)
            .spawn();
        assert!(run.pid > 0, "no PID 1 under the launcher");
        Session { pid1: run.pid, run, master, tty_nr, out: Vec::new(), mark: 0 }
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

    /// Collect output for `d`: a window in which something must NOT come.
    fn settle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if !self.read_some(until) && self.hung_up() {
                std::thread::sleep(ms(20));
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
        pty::set_size(&self.master, rows, cols);
    }

    /// Wait for PID 1's end (its code, or 128 + its signal); keeps reading
    /// the terminal meanwhile.
    fn wait(&mut self, limit: Duration) -> i32 {
        let until = Instant::now() + limit;
        loop {
            if let Some(ended) = self.run.poll_end() {
                self.settle(ms(100));
                return ended.shell_code();
            }
            if Instant::now() >= until {
                panic!("PID 1 did not exit within {limit:?}; transcript:\n{}", self.transcript());
            }
            self.read_some(Instant::now() + ms(50));
        }
    }

    /// The first process under PID 1 whose comm is `name`, as we see it.
    fn find(&self, name: &str) -> i32 {
        wait_for(STEP, || HOST.descendant_named(self.pid1, name))
            .unwrap_or_else(|| panic!("no {name} under PID 1; transcript:\n{}", self.transcript()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if std::env::var_os("TTY_TRANSCRIPT").is_some() {
            eprintln!("---- transcript ----\n{}\n----", self.transcript());
        }
    }
}

fn stat(pid: i32) -> Option<Stat> {
    HOST.stat(pid)
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
    let st = Stat::parse(line).unwrap();
    // In the namespace's numbering the worker is PID 2 (drainit is 1).
    let pid: i32 = line.trim().split(' ').next().unwrap().parse().unwrap();
    assert_eq!((st.pgrp, st.session), (pid, pid), "worker leads its own session and group: {line}");
    assert_eq!(st.tty_nr, s.tty_nr, "the pty is the worker's controlling terminal: {line}");
    assert_eq!(st.tpgid, pid, "the worker's group is the foreground group at once: {line}");
    assert_eq!(s.wait(STEP), 3, "drainit exits with the worker's code:\n{}", s.transcript());
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
        let st = Stat::parse(line).unwrap();
        let pid: i32 = line.trim().split(' ').next().unwrap().parse().unwrap();
        assert_eq!((st.session, st.tty_nr, st.tpgid), (pid, s.tty_nr, pid), "attempt {attempt}: {line}");
    }
    assert_eq!(s.wait(STEP), 6, "{}", s.transcript());
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
    assert_eq!(s.wait(STEP), 3, "{}", s.transcript());
    let text = s.transcript();
    assert!(text.contains("event=child_exited") && text.contains("event=exit code=3"), "{text}");
}

/// Ctrl-C goes from the terminal to the foreground job, once: drainit is not
/// in the foreground group, so it neither receives nor forwards a copy, and
/// no stop is requested. The shell survives.
#[test]
fn ctrl_c_interrupts_the_foreground_job_once() {
    let dir = Scratch::new("tty-intr");
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

    // A foreground job that counts every SIGINT it gets; SIGTERM ends it.
    let job = Recorder::new(&dir, "job");
    s.line(&job.argv().join(" "));
    assert!(job.wait_ready(STEP), "the job never started:\n{}", s.transcript());
    s.send(b"\x03");
    assert!(wait_until(STEP, || job.count(libc::SIGINT) >= 1), "no SIGINT counted:\n{}", s.transcript());
    s.settle(ms(700));
    assert_eq!(job.received_sequence(), [libc::SIGINT], "exactly one SIGINT reaches the job:\n{}", s.transcript());
    let pid = job.host_pid(s.pid1).expect("the job's pid");
    // SAFETY: kill with integers, to a process of this test's namespace.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    s.expect(PROMPT, STEP);
    assert_eq!(job.exit_code(), Some(0), "{}", s.transcript());

    s.line("echo al\"\"ive");
    s.expect("alive", STEP);
    s.expect(PROMPT, STEP);
    let text = s.transcript();
    assert!(!text.contains("event=stop_requested"), "Ctrl-C is not a stop request for drainit:\n{text}");
    assert!(!text.contains("event=signal_forwarded"), "drainit forwards nothing:\n{text}");
    s.line("exit 0");
    assert_eq!(s.wait(STEP), 0, "{}", s.transcript());
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
    assert_eq!(s.wait(STEP), 4, "{}", s.transcript());
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

    // A foreground job that notes the size when SIGWINCH comes, then ends.
    let dir = Scratch::new("tty-winch");
    let job = Recorder::new(&dir, "job").exit_on(libc::SIGWINCH);
    s.line(&job.argv().join(" "));
    assert!(job.wait_ready(STEP), "the job never started:\n{}", s.transcript());
    s.resize(50, 132);
    assert!(wait_until(STEP, || job.winsize() == Some((50, 132))), "{:?}:\n{}", job.winsize(), s.transcript());
    s.expect(PROMPT, STEP);
    assert_eq!(job.exit_code(), Some(0));

    // And the shell itself, idle in the foreground, sees the new size.
    s.resize(33, 99);
    s.line("stty size");
    s.expect("33 99", STEP);
    s.expect(PROMPT, STEP);
    s.line("exit 0");
    assert_eq!(s.wait(STEP), 0, "{}", s.transcript());
}

per_mode! {
    /// Without a terminal (stdin /dev/null, the usual container) nothing of
    /// the above happens: the worker is a session leader without a
    /// controlling terminal, and everything works as before.
    fn without_a_terminal_nothing_changes(mode) {
        let script = "cat /proc/$$/stat; if tty >/dev/null; then echo HAS_TTY; else echo NO_TTY; fi; \
                      if (exec 3</dev/tty) 2>/dev/null; then echo DEV_TTY; else echo NO_DEV_TTY; fi; exit 5";
        let mut run = drainit(mode, sh(script)).spawn();
        let ended = run.wait(secs(30));
        assert_eq!(ended.code, Some(5), "{mode:?}: {}", run.log());
        let out = run.stdout();
        let line = out.lines().find(|l| l.contains("(sh)")).unwrap_or_else(|| panic!("{mode:?}: {out}"));
        let st = Stat::parse(line).unwrap();
        assert_eq!((st.session, st.pgrp), (st.pid, st.pid), "{mode:?}: {line}");
        assert_eq!(st.tty_nr, 0, "{mode:?}: no controlling terminal: {line}");
        assert_eq!(st.tpgid, -1, "{mode:?}: {line}");
        assert!(out.contains("NO_TTY") && out.contains("NO_DEV_TTY"), "{mode:?}: {out}");
        check_log_end(&run.log(), 5).unwrap();
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
    // The worker counts SIGINTs, keeps SIGTSTP's default action (stop), and
    // exits 7 on SIGTERM (sent by the test, not by drainit).
    let rec = Recorder::new(&dir, "w").default(libc::SIGTSTP).code(7);
    let mut s = Session::start(&SHELL);
    set_prompt(&mut s);
    s.line(&format!("{BIN} -v -- {}; echo code=$?", rec.argv().join(" ")));
    assert!(rec.wait_ready(STEP), "the worker never started:\n{}", s.transcript());
    let drainit = s.find("drainit");
    let worker = wait_for(STEP, || HOST.children(drainit).first().copied()).expect("the worker");
    let (d, w, outer) = (stat(drainit).unwrap(), stat(worker).unwrap(), stat(s.pid1).unwrap());
    assert_eq!(outer.tpgid, d.pgrp, "drainit is the outer shell's foreground job: {d:?} {outer:?}");
    assert_ne!(d.session, drainit, "drainit is not a session leader: {d:?}");
    assert_eq!(d.tty_nr, 0, "drainit let go of the terminal: {d:?}");
    assert_eq!((w.session, w.tty_nr), (worker, 0), "the worker has its own session, without the terminal: {w:?}");
    let inner = rec.first_stat().unwrap();
    assert_eq!(inner.tty_nr, 0, "from its first instruction: {inner:?}");

    s.send(b"\x03");
    assert!(wait_until(STEP, || rec.count(libc::SIGINT) >= 1), "no SIGINT counted:\n{}", s.transcript());
    s.expect("event=stop_requested signal=SIGINT", STEP);
    s.settle(ms(700));
    assert_eq!(rec.received_sequence(), [libc::SIGINT], "exactly one SIGINT reaches the worker:\n{}", s.transcript());

    s.send(b"\x1a");
    s.expect("event=signal_forwarded signal=SIGTSTP", STEP);
    s.settle(ms(300));
    assert_ne!(stat(drainit).unwrap().state, 'T', "drainit does not stop");
    assert_ne!(stat(worker).unwrap().state, 'T', "an orphaned group ignores a forwarded SIGTSTP");

    // SAFETY: kill with integers, to a process of this test's namespace.
    unsafe { libc::kill(worker, libc::SIGTERM) };
    s.expect("event=exit code=7", STEP);
    s.expect("code=7", STEP);
    s.expect(PROMPT, STEP);
    s.line("echo al\"\"ive");
    s.expect("alive", STEP);
    s.line("exit 0");
    assert_eq!(s.wait(STEP), 0, "{}", s.transcript());
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
    assert_eq!(s.wait(STEP), 0, "{}", s.transcript());
}
