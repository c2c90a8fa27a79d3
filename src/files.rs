//! The files drainit writes for others to read: the drain file (a health
//! check fails on it while a stop is under way) and the termination log
//! (Kubernetes shows it as the container's termination message). drainit
//! runs as root in most containers and the worker may be able to write where
//! these live, so no link at either path is ever followed, and nothing is
//! written through one. A file that cannot be written is one warning.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat, lstat};
use nix::unistd::{unlink, write};

use crate::events::Event;

fn skipped(what: &'static str, path: &Path, error: impl Into<String>) {
    Event::FileSkipped { what, path: path.display().to_string(), error: error.into() }.emit();
}

/// `--drain-file`: created empty when a stop is requested.
#[derive(Debug)]
pub struct DrainFile(PathBuf);

impl DrainFile {
    pub fn new(path: PathBuf) -> DrainFile {
        DrainFile(path)
    }

    /// Remove one left from an earlier run: a restarted container keeps its
    /// filesystem, and a stale marker would fail every health check forever.
    /// unlink removes a link itself, never its target.
    pub fn remove_stale(&self) {
        match unlink(self.0.as_path()) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => skipped("drain_file", &self.0, format!("cannot remove the stale one: {}", e.desc())),
        }
    }

    /// Create it, exclusively: whatever is at the path already (a file, a
    /// link planted by the worker) is left alone.
    pub fn create(&self) {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(AT_FDCWD, self.0.as_path(), flags, Mode::from_bits_truncate(0o644)) {
            Ok(_) => {}
            Err(Errno::EEXIST) => skipped("drain_file", &self.0, "a file or link is already there"),
            Err(e) => skipped("drain_file", &self.0, e.desc()),
        }
    }
}

/// Write `line` to the termination log at `path` when it exists, is a
/// regular file (checked on the opened file) and is empty: a message the
/// worker wrote wins, and nothing is ever created. Never blocks: a FIFO at
/// the path is opened non-blocking and then refused.
pub fn write_termination_log(path: &Path, line: &dyn std::fmt::Display) {
    const WHAT: &str = "termination_log";
    // Outside Kubernetes the path is usually missing: say nothing then, and
    // need no fd to find that out (under a tight RLIMIT_NOFILE, an open
    // would fail with EMFILE first), nor format the line (a stop waits).
    if lstat(path).is_err_and(|e| e == Errno::ENOENT) {
        return;
    }
    let flags = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = match openat(AT_FDCWD, path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return,
        Err(Errno::ELOOP) => return skipped(WHAT, path, "a symbolic link, not followed"),
        Err(Errno::ENXIO) => return skipped(WHAT, path, "not a regular file (a FIFO or socket)"),
        Err(Errno::EISDIR) => return skipped(WHAT, path, "a directory"),
        Err(e) => return skipped(WHAT, path, e.desc()),
    };
    match fstat(&fd) {
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG => {
            skipped(WHAT, path, "not a regular file")
        }
        Ok(st) if st.st_size > 0 => {}
        Ok(_) => {
            let text = format!("{line}\n");
            if let Err(e) = write(&fd, text.as_bytes()) {
                skipped(WHAT, path, e.desc());
            }
        }
        Err(e) => skipped(WHAT, path, e.desc()),
    }
}
