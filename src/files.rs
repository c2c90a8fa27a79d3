//! The files drainit writes for others to read: the drain file (a health
//! check fails on it while a stop is under way), the ready file, and the
//! termination log (Kubernetes shows it as the container's termination
//! message). drainit runs as root in most containers and the worker may be
//! able to write where these live, so no link at the file's own name is ever
//! followed, and nothing is written through one. A file that cannot be
//! written is one warning.
//!
//! Nor is a link on the way to it followed when the worker could have put
//! it there: a worker that owns a directory on the path could swap a part
//! of it for a link and have root create or unlink a file elsewhere. The
//! rule: a link in the path is followed only when it and the directory that
//! holds it belong to root (or to drainit's own user) and that directory is
//! writable by nobody else, so that no other user can have made or replaced
//! it; an administrator's `/var/run -> /run` passes. Any other link is one
//! warning and the file is skipped. The directory is resolved once, to an
//! fd, and the file is reached from it (`*at` calls): nothing swapped in
//! later is followed either. A path without links takes one openat2
//! (RESOLVE_NO_SYMLINKS); one with links, or a kernel without openat2, a
//! walk of its parts, each opened with O_NOFOLLOW.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, lstat};
use nix::unistd::{UnlinkatFlags, unlinkat, write};

use crate::events::Event;

fn skipped(what: &'static str, path: &Path, error: impl Into<String>) {
    Event::FileSkipped { what, path: path.display().to_string(), error: error.into() }.emit();
}

/// Links followed on one path at most, as the kernel's own limit.
const MAX_LINKS: usize = 40;

fn is(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind
}

/// Root, or drainit's own user: no one else's link is trusted.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Why a file's directory was not reached: the text of the warning, and
/// whether it is simply not there (nothing to remove then).
struct Unreached {
    missing: bool,
    why: String,
}

impl Unreached {
    fn errno(what: &dyn std::fmt::Display, e: Errno) -> Unreached {
        Unreached { missing: e == Errno::ENOENT, why: format!("{what}: {}", e.desc()) }
    }
}

impl From<String> for Unreached {
    fn from(why: String) -> Unreached {
        Unreached { missing: false, why }
    }
}

/// The directory that holds `path`'s last part, as an fd, and that part.
fn parent(path: &Path) -> Result<(OwnedFd, &OsStr), Unreached> {
    let name = match path.components().next_back() {
        Some(Component::Normal(name)) => name,
        _ => return Err("not a file's path".to_string().into()),
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    match openat2(AT_FDCWD, dir, how) {
        Ok(fd) => Ok((fd, name)),
        // A link on the way (ELOOP), or no openat2 here (ENOSYS; EPERM from
        // a seccomp filter that does not know it; E2BIG, EINVAL: an older
        // open_how): the walk decides.
        Err(Errno::ELOOP | Errno::ENOSYS | Errno::EPERM | Errno::E2BIG | Errno::EINVAL) => Ok((walk(dir)?, name)),
        Err(e) => Err(Unreached::errno(&dir.display(), e)),
    }
}

fn open_dir(at: impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(at, name, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

/// Resolve `dir` part by part from `/` (or the working directory),
/// following only the links the module's rule trusts.
fn walk(dir: &Path) -> Result<OwnedFd, Unreached> {
    let fail = Unreached::errno;
    let start = |absolute: bool| {
        let from = if absolute { Path::new("/") } else { Path::new(".") };
        open_dir(AT_FDCWD, from.as_os_str()).map_err(|e| fail(&from.display(), e))
    };
    // The parts still to resolve, the next one last.
    let mut todo: Vec<OsString> = Vec::new();
    let push = |todo: &mut Vec<OsString>, path: &Path| {
        let parts = path.components().filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        });
        let at = todo.len();
        todo.extend(parts);
        todo[at..].reverse();
    };
    push(&mut todo, dir);
    let mut fd = start(dir.is_absolute())?;
    let mut links = 0;
    while let Some(part) = todo.pop() {
        let st = fstatat(&fd, part.as_os_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| fail(&Path::new(&part).display(), e))?;
        if !is(&st, SFlag::S_IFLNK) {
            let next = open_dir(&fd, &part).map_err(|e| fail(&Path::new(&part).display(), e))?;
            // Swapped for a link since the stat: O_NOFOLLOW opened the link
            // itself, which is no directory.
            if !fstat(&next).is_ok_and(|st| is(&st, SFlag::S_IFDIR)) {
                return Err(format!("{}: changed while resolved", Path::new(&part).display()).into());
            }
            fd = next;
            continue;
        }
        let holder = fstat(&fd).map_err(|e| fail(&Path::new(&part).display(), e))?;
        let holder_safe = trusted_owner(holder.st_uid) && holder.st_mode & 0o022 == 0;
        if !holder_safe || !trusted_owner(st.st_uid) {
            return Err(format!(
                "{} is a symbolic link another user could have made or replaced; not followed",
                Path::new(&part).display()
            )
            .into());
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(fail(&dir.display(), Errno::ELOOP));
        }
        let target = readlinkat(&fd, part.as_os_str()).map_err(|e| fail(&Path::new(&part).display(), e))?;
        let target = PathBuf::from(target);
        if target.is_absolute() {
            fd = start(true)?;
        }
        push(&mut todo, &target);
    }
    Ok(fd)
}

/// A file that exists while something holds (the drain file while a stop
/// is under way, the ready file while the worker is ready): created empty
/// and exclusively, removed, never through a link.
#[derive(Debug)]
pub struct SafeFile {
    /// Its name in events (`drain_file`, `ready_file`).
    what: &'static str,
    path: PathBuf,
}

impl SafeFile {
    pub fn new(what: &'static str, path: PathBuf) -> SafeFile {
        SafeFile { what, path }
    }

    /// Create it, exclusively: whatever is at the path already (a file, a
    /// link planted by the worker) is left alone.
    pub fn create(&self) {
        let (dir, name) = match parent(&self.path) {
            Ok(found) => found,
            Err(u) => return skipped(self.what, &self.path, u.why),
        };
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(&dir, name, flags, Mode::from_bits_truncate(0o644)) {
            Ok(_) => {}
            Err(Errno::EEXIST) => skipped(self.what, &self.path, "a file or link is already there"),
            Err(e) => skipped(self.what, &self.path, e.desc()),
        }
    }

    /// Remove it (a link at its name is removed itself, never its target).
    /// `context` prefixes the warning when it cannot be removed.
    pub fn remove(&self, context: &str) {
        let why = match parent(&self.path) {
            Ok((dir, name)) => match unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => return,
                Err(e) => e.desc().to_string(),
            },
            // No directory, so no file in it.
            Err(u) if u.missing => return,
            Err(u) => u.why,
        };
        skipped(self.what, &self.path, format!("{context}{why}"));
    }
}

/// `--drain-file`: created empty when a stop is requested.
#[derive(Debug)]
pub struct DrainFile(SafeFile);

impl DrainFile {
    pub fn new(path: PathBuf) -> DrainFile {
        DrainFile(SafeFile::new("drain_file", path))
    }

    /// Remove one left from an earlier run: a restarted container keeps its
    /// filesystem, and a stale marker would fail every health check forever.
    pub fn remove_stale(&self) {
        self.0.remove("cannot remove the stale one: ");
    }

    /// Create it, exclusively (see `SafeFile::create`).
    pub fn create(&self) {
        self.0.create();
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
    let (dir, name) = match parent(path) {
        Ok(found) => found,
        Err(u) => return skipped(WHAT, path, u.why),
    };
    let flags = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = match openat(&dir, name, flags, Mode::empty()) {
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
