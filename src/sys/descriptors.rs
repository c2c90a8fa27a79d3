//! Calls on descriptors that nix does not shape as drainit needs: fstat of
//! a maybe-closed fd, fds kept for life, the controlling-terminal ioctls,
//! a directory's entries read straight into a caller's buffer.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;

/// fstat(2) of a raw fd that may be closed (EBADF then): fd 2 at start,
/// before drainit may borrow it.
pub fn stat_fd(fd: RawFd) -> nix::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is valid for writes of a struct stat for the call; any
    // integer is a valid fd argument.
    Errno::result(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled st.
    Ok(unsafe { st.assume_init() })
}

/// An fd drainit keeps open for its whole life (stderr, and the log's own
/// description of it), borrowed for as long as drainit runs.
pub fn kept_fd(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: callers pass only fds that drainit never closes: 2, and the
    // one logging.rs opens once and leaks (into_raw_fd) for that purpose.
    // logging.rs asks for fd 2 only after `stat_fd(2)` found it open.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// TIOCSCTTY: make the terminal on `fd` the controlling terminal of the
/// calling session leader, without stealing it from another session.
pub fn set_controlling_tty(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal).
    Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) }).map(drop)
}

/// TIOCNOTTY: give up the controlling terminal on `fd`.
pub fn release_controlling_tty(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: TIOCNOTTY takes no argument.
    Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCNOTTY) }).map(drop)
}

/// Own a descriptor the kernel has just installed in drainit's table from a
/// received SCM_RIGHTS message: nothing else in drainit knows its number.
pub fn own_received(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: recvmsg installed fd for this message alone; the caller takes
    // it once, and nothing else closes or uses it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// getdents64(2): the next entries of the directory open on `fd`, as the
/// kernel lays them out (`linux_dirent64` records), into `buf`; the bytes
/// filled, 0 at the end. nix reads directories through libc's opendir,
/// whose DIR comes from malloc: at PID 1's exit that would be musl's heap
/// set-up (four syscalls) for one look at /proc.
pub fn dir_entries(fd: BorrowedFd<'_>, buf: &mut [u8]) -> nix::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes, which the kernel
    // fills with whole records at most.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    Errno::result(n).map(|n| n.unsigned_abs() as usize)
}
