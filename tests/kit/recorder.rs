//! The signal recorder (`sigrec.c`), the worker every test uses to see what
//! reached it. A `Recorder` is a directory: the test writes the recorder's
//! config there (through the builder methods) and reads back what it saw.
//!
//! ```ignore
//! let rec = Recorder::new(&dir, "w").term(Term::Record);
//! let mut run = drainit(mode, rec.worker()).spawn();
//! assert!(rec.wait_ready(secs(10)));
//! run.signal(libc::SIGUSR1);
//! assert!(rec.wait_seen(libc::SIGUSR1, secs(5)), "{:?}", rec.seen());
//! run.signal(libc::SIGTERM);
//! run.wait(secs(10));
//! assert_eq!(rec.received_sequence(), [libc::SIGUSR1, libc::SIGTERM]);
//! ```

use super::cc::c_helper;
use super::procfs::{HOST, Stat};
use super::{Scratch, path_str, wait_until};

use std::path::{Path, PathBuf};
use std::time::Duration;

const SIGREC: &str = include_str!("sigrec.c");

/// What SIGTERM does to a recorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    /// Recorded, then the recorder exits (with its `code`, after `linger`).
    Exit,
    /// Recorded only: the recorder runs on.
    Record,
    /// SIG_IGN: not even recorded.
    Ignore,
    /// The default action: the recorder dies of it.
    Default,
}

/// How a recorder ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Code(i32),
    Signal(i32),
}

/// One recorder: its directory and its configuration.
#[derive(Clone, Debug)]
pub struct Recorder {
    dir: PathBuf,
    config: Vec<String>,
    /// Recorders this one starts (their configs are written with its own).
    children: Vec<Recorder>,
    prefix: Option<u32>,
}

impl Recorder {
    /// A recorder living in `scratch/name` (created), which names it in
    /// every process list: its command line is `sigrec DIR`.
    pub fn new(scratch: &Scratch, name: &str) -> Recorder {
        Recorder::at(&scratch.path(name))
    }

    pub fn at(dir: &Path) -> Recorder {
        std::fs::create_dir_all(dir).unwrap();
        Recorder { dir: dir.to_path_buf(), config: Vec::new(), children: Vec::new(), prefix: None }
    }

    /// The compiled recorder.
    pub fn program() -> PathBuf {
        c_helper("sigrec", SIGREC)
    }

    fn set(mut self, line: String) -> Recorder {
        let line = match self.prefix {
            Some(n) => format!("@{n} {line}"),
            None => line,
        };
        self.config.push(line);
        self
    }

    pub fn term(self, t: Term) -> Recorder {
        let word = match t {
            Term::Exit => "exit",
            Term::Record => "record",
            Term::Ignore => "ignore",
            Term::Default => "default",
        };
        self.set(format!("term {word}"))
    }

    /// `sig` ends the recorder too (as SIGTERM does with `Term::Exit`).
    pub fn exit_on(self, sig: i32) -> Recorder {
        self.set(format!("exit_on {sig}"))
    }

    /// `sig` is recorded, then kills the recorder (its default action), which
    /// notes that in [`Recorder::end`] first.
    pub fn die_on(self, sig: i32) -> Recorder {
        self.set(format!("die_on {sig}"))
    }

    /// `sig` keeps its default action (and is not recorded).
    pub fn default(self, sig: i32) -> Recorder {
        self.set(format!("default {sig}"))
    }

    /// The exit code when a signal ends the recorder (default 0).
    pub fn code(self, code: i32) -> Recorder {
        self.set(format!("code {code}"))
    }

    /// After an ending signal, record `ms` more, then exit (a cleanup).
    pub fn linger(self, ms: u64) -> Recorder {
        self.set(format!("linger {ms}"))
    }

    /// Exit with `code` by itself `ms` after it is ready.
    pub fn exit_after(self, ms: u64, code: i32) -> Recorder {
        self.set(format!("exit_after {ms} {code}"))
    }

    /// Just before `exit_after`'s exit, write `text` to $DRAINIT_RETRY_AFTER_FILE.
    pub fn retry_after(self, text: &str) -> Recorder {
        self.set(format!("retry_after {text}"))
    }

    /// Leave drainit's process group and session (setsid) first.
    pub fn setsid(self) -> Recorder {
        self.set("setsid".into())
    }

    /// Double fork: the process started exits once the recorder is ready.
    pub fn orphan(self) -> Recorder {
        self.set("orphan".into())
    }

    /// Start `child` (in this recorder's group unless it says `setsid`) and
    /// wait until it is ready, before being ready.
    pub fn child(mut self, child: Recorder) -> Recorder {
        let line = format!("child {}", path_str(&child.dir));
        self.children.push(child);
        self.set(line)
    }

    /// Start `child` when an ending signal comes, before exiting.
    pub fn child_on_stop(mut self, child: Recorder) -> Recorder {
        let line = format!("child_on_stop {}", path_str(&child.dir));
        self.children.push(child);
        self.set(line)
    }

    /// Outputs go to DIR/attempt-N: read them with [`Recorder::attempt`].
    pub fn per_attempt(self) -> Recorder {
        self.set("per_attempt".into())
    }

    /// Settings that apply only when DRAINIT_ATTEMPT is `n`.
    pub fn on_attempt(mut self, n: u32, settings: impl FnOnce(Recorder) -> Recorder) -> Recorder {
        let outer = self.prefix.replace(n);
        self = settings(self);
        self.prefix = outer;
        self
    }

    /// Write the configs (this one's and its children's); the command line.
    pub fn argv(&self) -> Vec<String> {
        self.write();
        vec![path_str(&Recorder::program()), path_str(&self.dir)]
    }

    fn write(&self) {
        std::fs::write(self.dir.join("config"), self.config.join("\n") + "\n").unwrap();
        for c in &self.children {
            c.write();
        }
    }

    /// `-- sigrec DIR`: drainit's arguments for this recorder as the worker.
    pub fn worker(&self) -> Vec<String> {
        self.worker_with(&[])
    }

    /// drainit's `options`, then this recorder as the worker.
    pub fn worker_with(&self, options: &[&str]) -> Vec<String> {
        options.iter().map(|s| s.to_string()).chain(["--".to_string()]).chain(self.argv()).collect()
    }

    /// The outputs of attempt `n` (with `per_attempt`).
    pub fn attempt(&self, n: u32) -> Recorder {
        Recorder::at(&self.dir.join(format!("attempt-{n}")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(name)).ok()
    }

    pub fn is_ready(&self) -> bool {
        self.dir.join("ready").exists()
    }

    #[must_use = "assert the result: an unchecked wait is a hidden sleep"]
    pub fn wait_ready(&self, limit: Duration) -> bool {
        wait_until(limit, || self.is_ready())
    }

    /// When it became ready: CLOCK_MONOTONIC in ns (compare two of them).
    pub fn ready_ns(&self) -> Option<u128> {
        self.read("ready")?.trim().parse().ok()
    }

    /// Its pid, in its own namespace's numbering.
    pub fn pid(&self) -> Option<i32> {
        self.read("pid")?.trim().parse().ok()
    }

    /// Its pid as the test sees it: the process under `ancestor` (a host
    /// pid) whose command line names this recorder's directory.
    pub fn host_pid(&self, ancestor: i32) -> Option<i32> {
        let dir = path_str(&self.dir);
        HOST.descendants(ancestor).into_iter().find(|&p| HOST.cmdline(p).get(1) == Some(&dir) && HOST.alive(p))
    }

    /// (signal, how many times) for each signal received so far.
    pub fn counts(&self) -> Vec<(i32, u64)> {
        let text = self.read("seen").unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (sig, n) = l.split_once(' ')?;
                Some((sig.parse().ok()?, n.parse().ok()?))
            })
            .collect()
    }

    /// The signals received so far, in ascending order.
    pub fn seen(&self) -> Vec<i32> {
        self.counts().into_iter().map(|(s, _)| s).collect()
    }

    pub fn saw(&self, sig: i32) -> bool {
        self.seen().contains(&sig)
    }

    pub fn count(&self, sig: i32) -> u64 {
        self.counts().into_iter().find(|(s, _)| *s == sig).map_or(0, |(_, n)| n)
    }

    #[must_use = "assert the result: an unchecked wait is a hidden sleep"]
    pub fn wait_seen(&self, sig: i32, limit: Duration) -> bool {
        wait_until(limit, || self.saw(sig))
    }

    /// Every signal received so far, in the order the recorder took them,
    /// with when (CLOCK_MONOTONIC ns, as [`super::monotonic_ns`]). Arrival
    /// order for signals that come one at a time; signals pending together
    /// come out lowest-numbered first (the kernel's order, see sigrec.c).
    pub fn received_timed(&self) -> Vec<(i32, u128)> {
        let text = self.read("sequence").unwrap_or_default();
        // Only whole lines: the recorder may be appending.
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        whole
            .lines()
            .map(|l| {
                let (sig, at) = l.split_once(' ').unwrap_or_else(|| panic!("sequence line {l:?}"));
                (sig.parse().unwrap(), at.parse().unwrap())
            })
            .collect()
    }

    /// [`Recorder::received_timed`] without the times: compare it with the
    /// sequence the test expects (`assert_eq!(rec.received_sequence(), [..])`).
    pub fn received_sequence(&self) -> Vec<i32> {
        self.received_timed().into_iter().map(|(s, _)| s).collect()
    }

    /// Wait until the recorder has received at least `n` signals; the
    /// sequence then (shorter than `n` when the wait timed out: assert it).
    #[must_use = "compare the sequence: an unchecked wait is a hidden sleep"]
    pub fn wait_received(&self, n: usize, limit: Duration) -> Vec<i32> {
        let mut seq = Vec::new();
        let _ = wait_until(limit, || {
            seq = self.received_sequence();
            seq.len() >= n
        });
        seq
    }

    /// The code it exited with by itself (an ending signal or exit_after).
    pub fn exit_code(&self) -> Option<i32> {
        match self.end()? {
            (End::Code(code), _) => Some(code),
            (End::Signal(_), _) => None,
        }
    }

    /// How it ended, as it noted just before, and when (CLOCK_MONOTONIC ns).
    /// None while it runs, or when it died without a word (SIGKILL, or a
    /// signal that came before it was set up).
    pub fn end(&self) -> Option<(End, u128)> {
        let text = self.read("exit")?;
        let mut lines = text.lines();
        let how = lines.next()?;
        let at = lines.next()?.parse().ok()?;
        let end = match how.strip_prefix("signal ") {
            Some(sig) => End::Signal(sig.parse().ok()?),
            None => End::Code(how.parse().ok()?),
        };
        Some((end, at))
    }

    /// How long ago it noted its end (call it right after the run's
    /// `wait`: how long drainit outlived the worker); panics when it noted
    /// none.
    pub fn since_end(&self) -> Duration {
        let (_, at) = self.end().expect("the recorder noted its end");
        super::between(at, super::monotonic_ns())
    }

    /// Its terminal's size at the last SIGWINCH.
    pub fn winsize(&self) -> Option<(u16, u16)> {
        let text = self.read("winsize")?;
        let (rows, cols) = text.trim().split_once(' ')?;
        Some((rows.parse().ok()?, cols.parse().ok()?))
    }

    /// /proc/self/stat as its first instruction saw it.
    pub fn first_stat(&self) -> Option<Stat> {
        Stat::parse(&self.read("stat")?)
    }
}
