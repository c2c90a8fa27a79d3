//! Calls on descriptors that nix does not shape as drainit needs: fstat of
//! a maybe-closed fd, fds kept for life, sendmsg with SCM_RIGHTS, the
//! controlling-terminal ioctls.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr;

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

/// sendmsg(2) of `buf` with the descriptors `fds` attached (SCM_RIGHTS, at
/// most the kernel's 253), on a connected socket, without SIGPIPE. By hand,
/// not nix's sendmsg: that builds the control message in a Vec<u8>, which
/// drainit's allocator (`Startup`) aligns as a byte buffer, while a cmsghdr
/// needs 8 bytes.
pub fn send_with_fds(sock: BorrowedFd<'_>, buf: &[u8], fds: &[RawFd]) -> nix::Result<usize> {
    #[repr(C, align(8))]
    struct Control([u8; 1088]);
    let mut control = Control([0; 1088]);
    let data = u32::try_from(size_of_val(fds)).map_err(|_| Errno::EINVAL)?;
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, len) = unsafe { (libc::CMSG_SPACE(data), libc::CMSG_LEN(data)) };
    if fds.is_empty() || space as usize > size_of::<Control>() {
        return Err(Errno::EINVAL);
    }
    let mut iov = libc::iovec { iov_base: buf.as_ptr().cast_mut().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain integers and pointers (musl's has padding
    // fields): all zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer is 8-aligned and holds CMSG_SPACE of the
    // fds (checked above), so CMSG_FIRSTHDR points into it with room for the
    // header and every fd; it lives on this stack frame for the whole call.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
    }
    // SAFETY: msg points to the iovec (buf, valid for reads of its length)
    // and the control buffer above, both alive for the call; the kernel
    // only reads them.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL) };
    Errno::result(n).map(|n| n as usize)
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
