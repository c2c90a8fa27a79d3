//! The processes drainit is responsible for, read from /proc: its
//! descendants. Needed where a process group does not reach: a descendant that
//! called setsid, counted and killed at the deadline.

use std::fs;

use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{Whence, lseek, read};

use crate::sys;

/// What /proc says of drainit itself, read once at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Own {
    /// Our pid in /proc's numbering: another than getpid's when /proc is
    /// another PID namespace's (`unshare --pid` without `--mount-proc`).
    pub pid: i32,
    /// Our pid in our own PID namespace, getpid's (NSpid's last: the line
    /// lists it in /proc's namespace and in each nested one down to ours;
    /// kernels before 4.1 have no such line).
    pub ns_pid: Option<i32>,
    /// The signals drainit inherited as ignored (bit signo - 1).
    pub ignored: u64,
}

/// Pid and SigIgn from /proc/self/status: three syscalls, where asking the
/// kernel for every signal's disposition would take 62. (drainit opens with
/// openat throughout: musl's open follows O_CLOEXEC with an fcntl, for
/// kernels older than 2.6.23.)
pub fn own() -> Option<Own> {
    let fd = openat(AT_FDCWD, "/proc/self/status", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 4096];
    let len = read(&fd, &mut buf).ok()?;
    parse_status(std::str::from_utf8(buf.get(..len)?).ok()?)
}

fn parse_status(text: &str) -> Option<Own> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let pid = field("Pid:")?.parse().ok()?;
    let ns_pid = field("NSpid:").and_then(|pids| pids.split_ascii_whitespace().next_back()?.parse().ok());
    let ignored = u64::from_str_radix(field("SigIgn:")?, 16).ok()?;
    Some(Own { pid, ns_pid, ignored })
}

/// Pids of every descendant of `root`. Racy by nature (processes come and go
/// while it reads), which is why the deadline kill repeats after each round
/// of reaping.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    walk(root, |pid| found.push(pid));
    found
}

/// Where /proc's root lists its processes: the kernel numbers its fixed
/// entries (some sixty) below this offset, then "self", "thread-self" and
/// a process each (FIRST_PROCESS_ENTRY, the same since Linux 2.6).
const FIRST_PROCESS_ENTRY: i64 = 256;

/// /proc's root, kept open for the look at the namespace as PID 1 (see
/// `ProcRoot::anyone_else`): opened and placed past the fixed entries once,
/// after the first spawn, rather than on the way out, where everything
/// drainit does stands between the worker's exit and drainit's.
pub struct ProcRoot {
    dir: OwnedFd,
    /// The offset is FIRST_PROCESS_ENTRY (the open's seek; later looks
    /// seek again).
    placed: bool,
}

impl ProcRoot {
    pub fn open() -> Option<ProcRoot> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dir = openat(AT_FDCWD, "/proc", flags, Mode::empty()).ok()?;
        let placed = lseek(&dir, FIRST_PROCESS_ENTRY, Whence::SeekSet).is_ok();
        Some(ProcRoot { dir, placed })
    }

    /// Whether /proc lists a process besides `me` (its pid there). As PID
    /// 1 with no child left, only a process that entered the namespace by
    /// setns (`docker exec`) can be there: this look costs the namespace's
    /// size, where a blind `kill(-1)` makes the kernel walk every task of
    /// the host (bench: some 55 µs of PID 1's exit on a quiet host with 70
    /// tasks). The fixed entries are skipped when the first entry past them
    /// is "self" (else the listing starts over from the top); no heap
    /// (libc's opendir would set up musl's). Yes when /proc cannot be read:
    /// kill(-1) then goes out as before.
    pub fn anyone_else(&mut self, me: i32) -> bool {
        let dir = &self.dir;
        let mut check_self =
            std::mem::take(&mut self.placed) || lseek(dir, FIRST_PROCESS_ENTRY, Whence::SeekSet).is_ok();
        let me = me.to_string();
        let mut buf = [0u8; 1024];
        loop {
            let len = match sys::dir_entries(dir.as_fd(), &mut buf) {
                Ok(0) if !check_self => return false,
                Ok(len) => len,
                Err(_) => return true,
            };
            let mut names = dirent_names(&buf[..len]).peekable();
            // Nothing, or not "self", past the fixed entries: not the layout
            // the seek assumed, so the whole listing is read instead.
            if std::mem::take(&mut check_self) && names.peek() != Some(&&b"self"[..]) {
                if lseek(dir, 0, Whence::SeekSet).is_err() {
                    return true;
                }
                continue;
            }
            if names.any(|name| name.iter().all(u8::is_ascii_digit) && name != me.as_bytes()) {
                return true;
            }
            if ends_listing(len, buf.len()) {
                return false;
            }
        }
    }
}

/// `ProcRoot::anyone_else` with /proc opened for it.
pub fn anyone_else(me: i32) -> bool {
    ProcRoot::open().is_none_or(|mut root| root.anyone_else(me))
}

/// The longest `linux_dirent64` record: its 19 header bytes and a name of
/// up to 255 bytes with its NUL, padded to 8.
const LONGEST_DIRENT: usize = 280;

/// Whether a getdents64 that filled `len` bytes of `room` read the last of
/// the listing: the kernel stops filling only at a record that does not
/// fit (or a signal, which drainit keeps blocked), so room left for the
/// longest one means there was no next. Saves the read that returns 0
/// from PID 1's exit.
fn ends_listing(len: usize, room: usize) -> bool {
    len + LONGEST_DIRENT <= room
}

/// The names in a buffer of `linux_dirent64` records (getdents64): inode
/// (8 bytes), offset (8), record length (2), type (1), then the name and
/// its NUL, padded to the record's length.
fn dirent_names(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let reclen = usize::from(u16::from_ne_bytes([*rest.get(16)?, *rest.get(17)?]));
        let record = rest.get(..reclen).filter(|_| reclen > 19)?;
        rest = &rest[reclen..];
        let name = &record[19..];
        Some(&name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())])
    })
}

/// How many processes /proc lists besides drainit: as PID 1 with the
/// namespace's own /proc, every one of them is a descendant. One directory
/// read, no file per process: cheap enough to count a fork bomb.
pub fn others() -> usize {
    fs::read_dir("/proc").map_or(0, |dir| {
        dir.filter(|e| {
            e.as_ref().is_ok_and(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        })
        .count()
        .saturating_sub(1)
    })
}

/// Call `visit` on each descendant of `root` as soon as it is found, before
/// its own children are read: a visit that SIGKILLs stops a process from
/// forking more while the walk goes on, so a fork bomb cannot outrun it.
/// Nothing is allocated per process (paths are built on the stack, pids go
/// straight into the queue): at a deadline this runs once per process of a
/// fork bomb, and musl's allocator makes syscalls of its own.
pub fn walk(root: i32, mut visit: impl FnMut(i32)) {
    let mut queue = vec![root];
    let mut buf = [0u8; 4096];
    let mut next = 0;
    while next < queue.len() {
        let parent = queue[next];
        let before = queue.len();
        if !children(parent, &mut buf, &mut queue) && parent == root {
            // No /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN off):
            // fall back to reading every process's parent link.
            return by_parent_links(root).into_iter().for_each(visit);
        }
        for &kid in &queue[before..] {
            visit(kid);
        }
        next += 1;
    }
}

/// A /proc path, built on the stack and NUL-terminated.
struct ProcPath {
    buf: [u8; 64],
    len: usize,
}

impl ProcPath {
    fn new(args: std::fmt::Arguments<'_>) -> Option<ProcPath> {
        let mut path = ProcPath { buf: [0; 64], len: 0 };
        std::fmt::Write::write_fmt(&mut path, args).ok()?;
        // Room for the NUL that ends it (the buffer is zeroed).
        (path.len < path.buf.len()).then_some(path)
    }

    fn c_str(&self) -> &std::ffi::CStr {
        std::ffi::CStr::from_bytes_until_nul(&self.buf).unwrap_or_default()
    }
}

impl std::fmt::Write for ProcPath {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Append the children of `pid` to `out`, from its threads' `children`
/// files; false when the kernel has no such file. A single-threaded
/// process (told by the link count of its task directory) costs four
/// syscalls, without listing the directory.
fn children(pid: i32, buf: &mut [u8], out: &mut Vec<i32>) -> bool {
    let Some(task) = ProcPath::new(format_args!("/proc/{pid}/task")) else { return false };
    let Ok(st) = nix::sys::stat::stat(task.c_str()) else { return false };
    if st.st_nlink.saturating_sub(2) <= 1 {
        let Some(path) = ProcPath::new(format_args!("/proc/{pid}/task/{pid}/children")) else { return false };
        return read_pids(path.c_str(), buf, out);
    }
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    let mut readable = false;
    for tid in tasks.flatten().filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok()) {
        if let Some(path) = ProcPath::new(format_args!("/proc/{pid}/task/{tid}/children")) {
            readable |= read_pids(path.c_str(), buf, out);
        }
    }
    readable
}

/// Append the pids listed in the `children` file at `path` to `out`. A read
/// that returns less than it had room for reached the end: no read is spent
/// on finding that out.
fn read_pids(path: &std::ffi::CStr, buf: &mut [u8], out: &mut Vec<i32>) -> bool {
    let Ok(fd) = openat(AT_FDCWD, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()) else { return false };
    let mut pid: Option<i32> = None;
    loop {
        let n = match nix::unistd::read(&fd, buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        };
        for &b in &buf[..n] {
            match b {
                b'0'..=b'9' => pid = Some(pid.unwrap_or(0).saturating_mul(10).saturating_add(i32::from(b - b'0'))),
                _ => out.extend(pid.take()),
            }
        }
        if n < buf.len() {
            out.extend(pid);
            return true;
        }
    }
}

/// The slow path: every process's parent pid from /proc/PID/stat.
fn by_parent_links(root: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let links: Vec<(i32, i32)> = dir
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent_pid = found[next];
        found.extend(links.iter().filter(|(_, ppid)| *ppid == parent_pid).map(|(pid, _)| *pid));
        next += 1;
    }
    found.remove(0);
    found
}

/// The process group of `pid`, from /proc/PID/stat.
pub fn group_of(pid: i32) -> Option<i32> {
    stat_field(pid, 2)
}

/// The parent pid from /proc/PID/stat ("pid (comm) state ppid ..."); comm
/// may hold spaces and parentheses, so read after the last ')'.
fn parent(pid: i32) -> Option<i32> {
    stat_field(pid, 1)
}

/// Field `n` after the command name: 0 state, 1 ppid, 2 pgrp, 3 session.
fn stat_field(pid: i32, n: usize) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(n)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirent(name: &str) -> Vec<u8> {
        let reclen = (19 + name.len() + 1).next_multiple_of(8);
        let mut record = vec![0u8; reclen];
        record[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        record[19..19 + name.len()].copy_from_slice(name.as_bytes());
        record
    }

    #[test]
    fn reads_names_off_dirent_records() {
        let buf: Vec<u8> = ["self", "thread-self", "1", "12345678"].iter().flat_map(|n| dirent(n)).collect();
        let names: Vec<&[u8]> = dirent_names(&buf).collect();
        assert_eq!(names, [&b"self"[..], b"thread-self", b"1", b"12345678"]);
        assert_eq!(dirent_names(&buf[..10]).count(), 0, "a cut record is not read");
        let mut bad = dirent("x");
        bad[16..18].copy_from_slice(&0u16.to_ne_bytes());
        assert_eq!(dirent_names(&bad).count(), 0, "a zero length ends the walk");
    }

    #[test]
    fn a_listing_ends_where_the_longest_record_still_had_room() {
        assert!(ends_listing(80, 1024), "self, thread-self and drainit: the end");
        assert!(ends_listing(744, 1024));
        assert!(!ends_listing(745, 1024), "the next record may not have fitted");
        assert!(!ends_listing(1020, 1024));
    }

    #[test]
    fn sees_this_process_and_others_in_proc() {
        let me = std::process::id() as i32;
        assert!(anyone_else(me), "the test runner's /proc lists more than the runner");
        assert!(anyone_else(i32::MAX), "and more than no one");
        let mut root = ProcRoot::open().unwrap();
        for look in 0..3 {
            assert!(root.anyone_else(me), "a kept root sees the same at look {look}");
        }
    }

    #[test]
    fn reads_pid_and_ignored_signals() {
        let text = "Name:\tx\nPid:\t42\nPPid:\t1\nSigBlk:\t0000000000000000\nSigIgn:\t0000000180000001\nSigCgt:\t0\n";
        assert_eq!(parse_status(text), Some(Own { pid: 42, ns_pid: None, ignored: 0x1_8000_0001 }));
        assert_eq!(parse_status("Pid:\t42\n"), None);
        let nested = "Pid:\t42\nNSpid:\t42\t7\t1\nSigIgn:\t0000000000000000\n";
        assert_eq!(parse_status(nested), Some(Own { pid: 42, ns_pid: Some(1), ignored: 0 }));
        let own = own().unwrap();
        assert_eq!(own.pid, std::process::id() as i32);
        assert_eq!(own.ns_pid, Some(std::process::id() as i32));
    }

    #[test]
    fn finds_a_child_and_grandchild_both_ways() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let me = std::process::id() as i32;
        let (fast, slow) = (descendants(me), by_parent_links(me));
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(grandchild), nix::sys::signal::SIGKILL);
        let _ = child.wait();
        for found in [fast, slow] {
            assert!(found.contains(&(child.id() as i32)) && found.contains(&grandchild), "{found:?}");
        }
    }
}
