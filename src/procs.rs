//! The processes drainit is responsible for, read from /proc: its
//! descendants. Needed where a process group does not reach: a descendant that
//! called setsid, counted and killed at the deadline.

use std::fs;

use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::read;

/// What /proc says of drainit itself, read once at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Own {
    /// Our pid in /proc's numbering: another than getpid's when /proc is
    /// another PID namespace's (`unshare --pid` without `--mount-proc`).
    pub pid: i32,
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
    let ignored = u64::from_str_radix(field("SigIgn:")?, 16).ok()?;
    Some(Own { pid, ignored })
}

/// Pids of every descendant of `root`. Racy by nature (processes come and go
/// while it reads), which is why the deadline kill repeats after each round
/// of reaping.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    walk(root, |pid| found.push(pid));
    found
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
pub fn walk(root: i32, mut visit: impl FnMut(i32)) {
    let mut queue = vec![root];
    let mut next = 0;
    while next < queue.len() {
        let parent = queue[next];
        match children(parent) {
            Some(kids) => {
                for kid in kids {
                    visit(kid);
                    queue.push(kid);
                }
            }
            // No /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN off):
            // fall back to reading every process's parent link.
            None if parent == root => return by_parent_links(root).into_iter().for_each(visit),
            None => {}
        }
        next += 1;
    }
}

/// The children of `pid`, from its threads' `children` files. None when the
/// kernel has no such file. A single-threaded process (told by the link
/// count of its task directory) costs four syscalls, without listing the
/// directory: at the deadline this runs once per process of a fork bomb.
fn children(pid: i32) -> Option<Vec<i32>> {
    let threads = nix::sys::stat::stat(format!("/proc/{pid}/task").as_str()).ok()?.st_nlink.saturating_sub(2);
    let mut kids = Vec::new();
    if threads <= 1 {
        read_pids(&format!("/proc/{pid}/task/{pid}/children"), &mut kids)?;
        return Some(kids);
    }
    let mut readable = false;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        readable |= read_pids(&task.path().join("children").to_string_lossy(), &mut kids).is_some();
    }
    readable.then_some(kids)
}

/// Append the pids listed in `path` (a `children` file) to `out`.
fn read_pids(path: &str, out: &mut Vec<i32>) -> Option<()> {
    let fd = openat(AT_FDCWD, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 4096];
    let mut pending = Vec::new();
    loop {
        match nix::unistd::read(&fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
    out.extend(
        pending.split(|b| b.is_ascii_whitespace()).filter_map(|w| std::str::from_utf8(w).ok()?.parse::<i32>().ok()),
    );
    Some(())
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

    #[test]
    fn reads_pid_and_ignored_signals() {
        let text = "Name:\tx\nPid:\t42\nPPid:\t1\nSigBlk:\t0000000000000000\nSigIgn:\t0000000180000001\nSigCgt:\t0\n";
        assert_eq!(parse_status(text), Some(Own { pid: 42, ignored: 0x1_8000_0001 }));
        assert_eq!(parse_status("Pid:\t42\n"), None);
        let own = own().unwrap();
        assert_eq!(own.pid, std::process::id() as i32);
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
