//! The state directory (`--state-dir`): drainit's one record of its run,
//! kept where it outlives drainit, the lock that keeps a second drainit out
//! of it, and the verdict on the predecessor at start (none, clean,
//! unclean). The record says `running` from just before each attempt
//! starts and `exited` once drainit is done; a start that finds `running`
//! knows its predecessor died without its exit, and sweeps up after it.
//!
//! The worker may write in DIR too, and drainit is root: no link at a name
//! drainit uses there is ever followed (O_NOFOLLOW, every call relative to
//! the directory's fd), new files are created exclusively, and the record
//! replaces the old one by a rename, which replaces a planted link, never
//! writes through it. Each write is durable before drainit goes on: the new
//! file fsynced, renamed over the old, the directory fsynced; a kill at any
//! moment leaves the old record or the new one, never a torn one.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, Flock, FlockArg, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstat};
use nix::unistd::{AccessFlags, UnlinkatFlags, access, fsync, read, unlinkat, write};

use crate::events::Event;

use crate::environment::{
    ATTEMPT, DEADLINE_REACHED, EXIT_CODE, PREDECESSOR_PID_VAR, PREDECESSOR_STARTED_VAR, STOP_REASON, STOP_SIGNAL,
    WORKER_STATUS,
};

/// The lock file, held (flock) for drainit's whole run.
const LOCK: &str = "drainit.lock";
/// The record.
const RECORD: &str = "drainit.state";
/// The next record, before its rename over the old.
const NEXT: &str = "drainit.state.new";
/// The record's first line; the number is its format's version.
const MAGIC: &str = "drainit-state 1";
/// A record is a few dozen bytes; more is not one of drainit's.
const MAX_RECORD: usize = 512;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Entry {
    /// Attempt `attempt` of drainit `pid` started at `started` (unix ms).
    Running { attempt: u32, pid: i32, started: u64 },
    /// drainit `pid` exited with `code`.
    Exited { code: i32, pid: i32 },
}

impl Entry {
    /// The record's text: the version line, then one logfmt line.
    pub fn text(&self) -> String {
        match self {
            Entry::Running { attempt, pid, started } => format!(
                "{MAGIC}\nstate=running attempt={attempt} pid={pid} started={}.{:03}\n",
                started / 1000,
                started % 1000
            ),
            Entry::Exited { code, pid } => format!("{MAGIC}\nstate=exited code={code} pid={pid}\n"),
        }
    }

    /// Parse a record; Err says why it is not one.
    pub fn parse(bytes: &[u8]) -> Result<Entry, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
        let Some(body) = text.strip_suffix('\n') else {
            return Err(if text.is_empty() { "empty".into() } else { "no final newline (cut short)".into() });
        };
        let mut lines = body.split('\n');
        match lines.next() {
            Some(MAGIC) => {}
            Some(first) if first.starts_with("drainit-state ") => {
                return Err(format!("unknown version {:?}", first.trim_start_matches("drainit-state ")));
            }
            _ => return Err("not a drainit record".into()),
        }
        let (Some(line), None) = (lines.next(), lines.next()) else {
            return Err("not one line after the version".into());
        };
        let get =
            |key: &str| line.split(' ').find_map(|pair| pair.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')));
        let num = |key: &str| -> Result<i64, String> {
            let text = get(key).ok_or_else(|| format!("no {key}"))?;
            text.parse::<i64>().map_err(|_| format!("bad {key} {text:?}"))
        };
        let pid = i32::try_from(num("pid")?).map_err(|_| "bad pid".to_string())?;
        match get("state") {
            Some("running") => {
                let attempt = u32::try_from(num("attempt")?).map_err(|_| "bad attempt".to_string())?;
                let started = get("started").and_then(parse_stamp).ok_or_else(|| "bad started".to_string())?;
                Ok(Entry::Running { attempt, pid, started })
            }
            Some("exited") => {
                let code = i32::try_from(num("code")?).map_err(|_| "bad code".to_string())?;
                Ok(Entry::Exited { code, pid })
            }
            Some(other) => Err(format!("unknown state {other:?}")),
            None => Err("no state".into()),
        }
    }
}

/// `SECONDS.MMM` as unix milliseconds.
fn parse_stamp(text: &str) -> Option<u64> {
    let (secs, ms) = text.split_once('.')?;
    if ms.len() != 3 {
        return None;
    }
    secs.parse::<u64>().ok()?.checked_mul(1000)?.checked_add(ms.parse::<u64>().ok()?)
}

/// A predecessor that ended without its exit. Its fields are None when its
/// record could not be read (that counts as unclean too).
#[derive(Clone, Debug, PartialEq)]
pub struct Predecessor {
    pub attempt: Option<u32>,
    pub pid: Option<i32>,
    /// Unix milliseconds.
    pub started: Option<u64>,
}

impl Predecessor {
    /// What the sweep's finish program is told, in its environment.
    pub fn finish_vars(&self) -> [(&'static str, String); 8] {
        let known = |v: Option<String>| v.unwrap_or_else(|| "unknown".into());
        [
            (STOP_REASON, "unclean_predecessor".into()),
            (WORKER_STATUS, "unknown".into()),
            (EXIT_CODE, "unknown".into()),
            (DEADLINE_REACHED, "unknown".into()),
            (STOP_SIGNAL, "unknown".into()),
            (ATTEMPT, known(self.attempt.map(|a| a.to_string()))),
            (PREDECESSOR_PID_VAR, known(self.pid.map(|p| p.to_string()))),
            (PREDECESSOR_STARTED_VAR, known(self.started.map(|ms| (ms / 1000).to_string()))),
        ]
    }

    /// `unclean_predecessor`, its age counted to `now` (unix ms).
    pub fn event(&self, now: u64) -> Event {
        Event::UncleanPredecessor {
            attempt: self.attempt,
            pid: self.pid,
            age: self.started.map(|t| Duration::from_millis(now.saturating_sub(t))),
        }
    }
}

/// What a start finds in DIR.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// No record: the first run with this DIR.
    None,
    Clean,
    Unclean(Predecessor),
}

impl Verdict {
    /// The verdict on what was read: the record, or why it could not be.
    pub fn of(read: Result<Option<Entry>, String>) -> (Verdict, Option<String>) {
        match read {
            Ok(None) => (Verdict::None, None),
            Ok(Some(Entry::Exited { .. })) => (Verdict::Clean, None),
            Ok(Some(Entry::Running { attempt, pid, started })) => {
                (Verdict::Unclean(Predecessor { attempt: Some(attempt), pid: Some(pid), started: Some(started) }), None)
            }
            Err(why) => (Verdict::Unclean(Predecessor { attempt: None, pid: None, started: None }), Some(why)),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Verdict::None => "none",
            Verdict::Clean => "clean",
            Verdict::Unclean(_) => "unclean",
        }
    }
}

/// Unix milliseconds now (the wall clock: the record outlives this boot).
fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The state directory, open and locked for drainit's run.
pub struct StateDir {
    dir: OwnedFd,
    /// Held until drainit's exit releases it (the kernel does, however drainit ends).
    _lock: Flock<OwnedFd>,
    me: i32,
}

/// Open DIR, lock it, read the record: the state directory and the verdict
/// on the predecessor, with the events that say so logged; the worker's
/// variable is set. Err: the one line of a refusal (exit 2).
pub fn setup(path: &Path, me: i32) -> Result<(StateDir, Verdict), String> {
    let refuse = |why: String| format!("error: --state-dir (DRAINIT_STATE_DIR) '{}' {why}", path.display());
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let dir = openat(AT_FDCWD, path, flags, Mode::empty()).map_err(|e| {
        refuse(match e {
            Errno::ENOENT => "does not exist".into(),
            Errno::ENOTDIR => "is not a directory".into(),
            e => format!("cannot be opened: {}", e.desc()),
        })
    })?;
    // Root passes access() whatever the mode, but not on a read-only mount.
    access(path, AccessFlags::W_OK).map_err(|e| refuse(format!("is not writable: {}", e.desc())))?;
    let lock = match open_regular(&dir, LOCK, OFlag::O_RDWR | OFlag::O_CREAT) {
        // Something planted at the lock's name (a link, a FIFO) must not
        // keep drainit from starting: it goes, and the lock is made anew
        // (drainit's own lock file is always a regular file, never removed).
        Err(Unopened { planted: true, .. }) => unlinkat(&dir, LOCK, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| Unopened { planted: true, missing: false, why: e.desc().to_string() })
            .and_then(|()| open_regular(&dir, LOCK, OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL)),
        other => other,
    }
    .map_err(|e| refuse(format!("cannot hold its lock {LOCK}: {}", e.why)))?;
    let lock = Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
        Errno::EWOULDBLOCK => {
            refuse("is in use by another drainit (two drainits must not share a state directory)".into())
        }
        e => refuse(format!("cannot be locked: {}", e.desc())),
    })?;
    let state = StateDir { dir, _lock: lock, me };
    let (verdict, unreadable) = Verdict::of(state.read());
    if let Some(reason) = unreadable {
        Event::StateUnreadable { reason }.emit();
    }
    if let Verdict::Unclean(predecessor) = &verdict {
        predecessor.event(unix_ms()).emit();
    }
    crate::environment::predecessor(verdict.name());
    Ok((state, verdict))
}

/// Why a name in DIR was not opened; `planted`: something other than a
/// regular file is there.
struct Unopened {
    planted: bool,
    missing: bool,
    why: String,
}

/// `name` in `dir`, opened without following a link, and only if it is a
/// regular file (a FIFO or a device planted there is not opened for real:
/// O_NONBLOCK, then checked).
fn open_regular(dir: &OwnedFd, name: &str, flags: OFlag) -> Result<OwnedFd, Unopened> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o600)).map_err(|e| match e {
        Errno::ELOOP => Unopened { planted: true, missing: false, why: "is a link".into() },
        e => Unopened { planted: false, missing: e == Errno::ENOENT, why: e.desc().into() },
    })?;
    let st = fstat(&fd).map_err(|e| Unopened { planted: false, missing: false, why: e.desc().into() })?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(Unopened { planted: true, missing: false, why: "is not a regular file".into() });
    }
    Ok(fd)
}

impl StateDir {
    /// The record as it is now: None when there is none.
    fn read(&self) -> Result<Option<Entry>, String> {
        let fd = match open_regular(&self.dir, RECORD, OFlag::O_RDONLY) {
            Err(Unopened { missing: true, .. }) => return Ok(None),
            other => other.map_err(|e| format!("{RECORD} {}", e.why))?,
        };
        let mut buf = [0u8; MAX_RECORD + 1];
        let mut len = 0;
        while len < buf.len() {
            match read(fd.as_fd(), &mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) => return Err(format!("{RECORD}: {}", e.desc())),
            }
        }
        if len > MAX_RECORD {
            return Err(format!("{RECORD} is longer than {MAX_RECORD} bytes"));
        }
        Entry::parse(&buf[..len]).map(Some).map_err(|why| format!("{RECORD}: {why}"))
    }

    /// Before attempt `attempt` starts.
    pub fn running(&self, attempt: u32) {
        self.put(Entry::Running { attempt, pid: self.me, started: unix_ms() });
    }

    /// At drainit's exit.
    pub fn exited(&self, code: i32) {
        self.put(Entry::Exited { code, pid: self.me });
    }

    /// Replace the record, durably; a failure is one warning (the worker
    /// runs on: a missed record costs a sweep, not the container).
    fn put(&self, entry: Entry) {
        if let Err(error) = self.replace(entry.text().as_bytes()) {
            Event::Failed { what: "state_write", error }.emit();
        }
    }

    fn replace(&self, bytes: &[u8]) -> Result<(), String> {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o644);
        let fd = match openat(&self.dir, NEXT, flags, mode) {
            // Left by a drainit killed mid-write, or planted: the name goes
            // (unlinkat removes a link, never what it points to).
            Err(Errno::EEXIST) => {
                unlinkat(&self.dir, NEXT, UnlinkatFlags::NoRemoveDir).map_err(|e| format!("{NEXT}: {}", e.desc()))?;
                openat(&self.dir, NEXT, flags, mode)
            }
            other => other,
        }
        .map_err(|e| format!("{NEXT}: {}", e.desc()))?;
        let mut done = 0;
        while done < bytes.len() {
            done += write(&fd, &bytes[done..]).map_err(|e| format!("{NEXT}: {}", e.desc()))?;
        }
        fsync(&fd).map_err(|e| format!("{NEXT}: fsync: {}", e.desc()))?;
        drop(fd);
        renameat(&self.dir, NEXT, &self.dir, RECORD).map_err(|e| format!("{RECORD}: rename: {}", e.desc()))?;
        fsync(&self.dir).map_err(|e| format!("fsync of the directory: {}", e.desc()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        for entry in [
            Entry::Running { attempt: 3, pid: 1, started: 1_733_000_000_123 },
            Entry::Running { attempt: 1, pid: 4_194_304, started: 5 },
            Entry::Exited { code: 143, pid: 1 },
            Entry::Exited { code: -1, pid: 7 },
        ] {
            assert_eq!(Entry::parse(entry.text().as_bytes()), Ok(entry), "{}", entry.text());
        }
        assert_eq!(
            Entry::Running { attempt: 3, pid: 1, started: 1_733_000_000_023 }.text(),
            "drainit-state 1\nstate=running attempt=3 pid=1 started=1733000000.023\n"
        );
    }

    #[test]
    fn what_is_not_a_record_says_why() {
        let bad: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"drainit-state 1\nstate=running attempt=3 pid=1 started=1.000", "cut short"),
            (b"drainit-state 1\nstate=running attempt=3 pid=1", "cut short"),
            (b"drainit-state 2\nstate=exited code=0 pid=1\n", "unknown version \"2\""),
            (b"hello\n", "not a drainit record"),
            (b"drainit-state 1\n", "not one line"),
            (b"drainit-state 1\nstate=exited code=0 pid=1\nmore\n", "not one line"),
            (b"drainit-state 1\nstate=exited pid=1\n", "no code"),
            (b"drainit-state 1\nstate=running attempt=x pid=1 started=1.000\n", "bad attempt"),
            (b"drainit-state 1\nstate=running attempt=1 pid=1 started=1\n", "bad started"),
            (b"drainit-state 1\nstate=sleeping pid=1\n", "unknown state"),
            (b"drainit-state 1\nstate=exited code=0 pid=\xff\n", "not text"),
        ];
        for (bytes, why) in bad {
            match Entry::parse(bytes) {
                Err(e) => assert!(e.contains(why), "{:?}: {e}", String::from_utf8_lossy(bytes)),
                Ok(e) => panic!("{:?} parsed as {e:?}", String::from_utf8_lossy(bytes)),
            }
        }
    }

    #[test]
    fn unknown_keys_are_read_past() {
        let text = b"drainit-state 1\nstate=exited code=0 pid=1 host=x\n";
        assert_eq!(Entry::parse(text), Ok(Entry::Exited { code: 0, pid: 1 }));
    }

    #[test]
    fn the_verdict() {
        let running = Entry::Running { attempt: 2, pid: 1, started: 9000 };
        let p = Predecessor { attempt: Some(2), pid: Some(1), started: Some(9000) };
        let unknown = Predecessor { attempt: None, pid: None, started: None };
        assert_eq!(Verdict::of(Ok(None)), (Verdict::None, None));
        assert_eq!(Verdict::of(Ok(Some(Entry::Exited { code: 0, pid: 1 }))), (Verdict::Clean, None));
        assert_eq!(Verdict::of(Ok(Some(running))), (Verdict::Unclean(p.clone()), None));
        assert_eq!(Verdict::of(Err("empty".into())), (Verdict::Unclean(unknown.clone()), Some("empty".into())));
        assert_eq!(
            p.event(12_500).to_string(),
            "event=unclean_predecessor attempt=2 pid=1 age=3.5s",
            "age: from the attempt's start"
        );
        assert_eq!(
            unknown.event(12_500).to_string(),
            "event=unclean_predecessor attempt=unknown pid=unknown age=unknown"
        );
    }

    #[test]
    fn the_sweeps_variables() {
        let p = Predecessor { attempt: Some(2), pid: Some(1), started: Some(1_733_000_000_999) };
        let vars = p.finish_vars();
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("DRAINIT_STOP_REASON"), Some("unclean_predecessor"));
        assert_eq!(get("DRAINIT_WORKER_STATUS"), Some("unknown"));
        assert_eq!(get("DRAINIT_ATTEMPT"), Some("2"));
        assert_eq!(get("DRAINIT_PREDECESSOR_PID"), Some("1"));
        assert_eq!(get("DRAINIT_PREDECESSOR_STARTED"), Some("1733000000"));
    }
}
