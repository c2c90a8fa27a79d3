//! The memory cgroup at the edge: the OOM-kill counter (found at start,
//! held open, read again when it may have moved; on v2 also a source of
//! the one wait) and, with `--memory-stop`, the working set and the limit.
//! What the numbers mean is the supervisor's.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;

use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;

use crate::cgroup::{self, Place, Version};
use crate::events::Event;

/// The cgroup files drainit reads are a few lines; memory.stat is the
/// longest (some 40 lines), /proc/self/cgroup on a v1 host a dozen.
const BUF: usize = 4096;

/// The counter's files (`memory.events`: six lines; `memory.oom_control`:
/// three), read at start and after kills: a buffer that is not zeroed
/// 4 KiB at a time.
const COUNTER_BUF: usize = 512;

/// What `--memory-stop` needs at start, before the worker runs: the
/// counter and the working set's files; where they cannot be had,
/// `memory_stop_off` says why and the option stays off. (Without the
/// option the counter alone is looked for, after the first spawn:
/// `Counter::find`.)
pub fn find_for_memory_stop(init: bool) -> (Option<Counter>, Option<Usage>) {
    let counter = Counter::find(init);
    match Usage::open(counter.as_ref().map(|c| &c.dir)) {
        Ok(usage) => (counter, Some(usage)),
        Err(off) => {
            Event::MemoryStopOff { reason: off.reason() }.emit();
            (counter, None)
        }
    }
}

/// The longest cgroup directory path drainit looks in (kept inline, so
/// that finding the counter at start allocates nothing).
const PATH: usize = 256;

/// A memory cgroup's directory.
pub struct Dir {
    version: Version,
    path: [u8; PATH],
    len: usize,
}

impl Dir {
    fn new(place: Place<'_>) -> Option<Dir> {
        let mut dir = Dir { version: place.version, path: [0; PATH], len: 0 };
        dir.push(place.version.mount().as_bytes())?;
        if !place.path.is_empty() {
            dir.push(b"/")?;
            dir.push(place.path.as_bytes())?;
        }
        Some(dir)
    }

    /// A directory anywhere (the tests' fixture trees).
    #[cfg(test)]
    fn at(version: Version, path: &std::path::Path) -> Dir {
        let mut dir = Dir { version, path: [0; PATH], len: 0 };
        dir.push(path.as_os_str().as_encoded_bytes()).unwrap();
        dir
    }

    fn push(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len()).filter(|end| *end <= PATH)?;
        self.path.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(())
    }

    /// Open the file `name` in it.
    fn open(&self, name: &str) -> Option<File> {
        let mut path = Dir { version: self.version, path: self.path, len: self.len };
        path.push(b"/")?;
        path.push(name.as_bytes())?;
        open(path.path.get(..path.len)?)
    }
}

/// The OOM-kill counter of drainit's memory cgroup.
pub struct Counter {
    file: File,
    /// The count when drainit started, and when it was last read.
    start: u64,
    last: u64,
    dir: Dir,
}

impl Counter {
    /// Look for the counter where it is likeliest first. PID 1 (`init`) is
    /// a container's: its own cgroup is at the mount's root, one `open` on
    /// v2. Any other process is likelier one on a host, whose cgroup
    /// /proc/self/cgroup names: that first, the mount's root after (a
    /// container's process that is not its PID 1, a cgroup namespace's
    /// root). None where nothing is found or readable.
    pub fn find(init: bool) -> Option<Counter> {
        let root = || Counter::open(cgroup::MOUNT_ROOT_V2);
        if init && let Some(counter) = root() {
            return Some(counter);
        }
        Counter::named().or_else(|| if init { None } else { root() })
    }

    /// The counter of the cgroup /proc/self/cgroup names.
    fn named() -> Option<Counter> {
        let file = open(b"/proc/self/cgroup")?;
        let mut buf = [0u8; BUF];
        let text = pread(&file, &mut buf).ok()?;
        cgroup::places(text).into_iter().flatten().find_map(Counter::open)
    }

    fn open(place: Place<'_>) -> Option<Counter> {
        Counter::in_dir(Dir::new(place)?)
    }

    fn in_dir(dir: Dir) -> Option<Counter> {
        let file = dir.open(dir.version.counter())?;
        let start = count(&file)?;
        Some(Counter { file, start, last: start, dir })
    }

    /// On v2 the file wakes the wait when it changes (POLLPRI); v1 has no
    /// such notification without write access.
    pub fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        (self.dir.version == Version::V2).then(|| self.file.as_fd())
    }

    /// The kills since drainit started, when the count rose since the last
    /// read. Reading it also re-arms the v2 notification.
    pub fn rose(&mut self) -> Option<u64> {
        let now = count(&self.file)?;
        if now <= self.last {
            return None;
        }
        self.last = now;
        Some(now.saturating_sub(self.start))
    }
}

fn count(file: &File) -> Option<u64> {
    let mut buf = [0u8; COUNTER_BUF];
    let text = pread(file, &mut buf).ok()?;
    // A kernel without the line (v1 before 4.13) counts nothing.
    cgroup::keyed(text, "oom_kill")
}

/// The working set and the limit, for `--memory-stop`.
pub struct Usage {
    usage: File,
    stat: File,
    version: Version,
    pub limit: u64,
}

/// Why `--memory-stop` stays off (`memory_stop_off`'s reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Off {
    NoCgroup,
    NoLimit,
    Unreadable,
}

impl Off {
    pub fn reason(self) -> &'static str {
        match self {
            Off::NoCgroup => "no_cgroup",
            Off::NoLimit => "no_limit",
            Off::Unreadable => "unreadable",
        }
    }
}

impl Usage {
    /// The files of the cgroup the counter was found in, and its limit.
    pub fn open(dir: Option<&Dir>) -> Result<Usage, Off> {
        let dir = dir.ok_or(Off::NoCgroup)?;
        let version = dir.version;
        let open = |name: &str| dir.open(name).ok_or(Off::Unreadable);
        let (usage, stat) = (open(version.usage())?, open("memory.stat")?);
        let mut buf = [0u8; BUF];
        let limit = pread(&open(version.limit())?, &mut buf).map_err(|_| Off::Unreadable)?.to_string();
        let machine = nix::sys::sysinfo::sysinfo().map_or(0, |s| s.ram_total());
        let limit = cgroup::limit(&limit, machine).ok_or(Off::NoLimit)?;
        let usage = Usage { usage, stat, version, limit };
        usage.working_set().ok_or(Off::Unreadable)?;
        Ok(usage)
    }

    /// The working set as the kubelet computes it: the usage less the
    /// inactive page cache.
    pub fn working_set(&self) -> Option<u64> {
        let mut buf = [0u8; BUF];
        let used = cgroup::number(pread(&self.usage, &mut buf).ok()?)?;
        let inactive = cgroup::keyed(pread(&self.stat, &mut buf).ok()?, self.version.inactive_file()).unwrap_or(0);
        Some(used.saturating_sub(inactive))
    }
}

/// The file's text from its start, as much as `buf` holds. cgroupfs and
/// procfs give all they have to one read that has room for it: a short
/// read is the end (no second read to find it).
fn pread<'a>(file: &File, buf: &'a mut [u8]) -> io::Result<&'a str> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            got => n += got,
        }
        if n < buf.len() {
            break;
        }
    }
    std::str::from_utf8(&buf[..n]).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// Open for reading, close-on-exec, in one call (std's `File::open` adds
/// an fcntl on musl).
fn open(path: &[u8]) -> Option<File> {
    let fd = openat(AT_FDCWD, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    Some(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup directory as a fixture tree in a temp dir.
    fn tree(files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("drainit-memory-{}-{:p}", std::process::id(), files));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn the_counter_counts_from_the_start() {
        let dir = tree(&[("memory.events", "oom 1\noom_kill 4\n")]);
        let mut counter = Counter::in_dir(Dir::at(Version::V2, &dir)).unwrap();
        assert!(counter.poll_fd().is_some(), "v2: a source of the wait");
        assert_eq!(counter.rose(), None, "nothing new");
        std::fs::write(dir.join("memory.events"), "oom 2\noom_kill 6\n").unwrap();
        assert_eq!(counter.rose(), Some(2), "two since the start");
        assert_eq!(counter.rose(), None, "told once");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn paths_are_built_inline() {
        let dir = Dir::new(Place { version: Version::V1, path: "docker/abc" }).unwrap();
        assert_eq!(&dir.path[..dir.len], b"/sys/fs/cgroup/memory/docker/abc");
        let root = Dir::new(cgroup::MOUNT_ROOT_V2).unwrap();
        assert_eq!(&root.path[..root.len], b"/sys/fs/cgroup");
        assert!(Dir::new(Place { version: Version::V2, path: &"x".repeat(PATH) }).is_none(), "too long: not found");
    }

    #[test]
    fn v1_has_no_source() {
        let dir = tree(&[("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")]);
        let counter = Counter::in_dir(Dir::at(Version::V1, &dir)).unwrap();
        assert!(counter.poll_fd().is_none());
        assert!(Counter::in_dir(Dir::at(Version::V2, &dir)).is_none(), "no such file");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_working_set_and_why_it_is_off() {
        let files = [
            ("memory.current", "1000000\n"),
            ("memory.stat", "anon 10\ninactive_file 300000\n"),
            ("memory.max", "2000000\n"),
        ];
        let dir = tree(&files);
        let place = Dir::at(Version::V2, &dir);
        let usage = Usage::open(Some(&place)).unwrap();
        assert_eq!((usage.working_set(), usage.limit), (Some(700_000), 2_000_000));
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert_eq!(Usage::open(Some(&place)).err(), Some(Off::NoLimit));
        std::fs::remove_file(dir.join("memory.current")).unwrap();
        assert_eq!(Usage::open(Some(&place)).err(), Some(Off::Unreadable));
        assert_eq!(Usage::open(None).err(), Some(Off::NoCgroup));
        let _ = std::fs::remove_dir_all(dir);
    }
}
