//! Pseudo-terminals: a test holds the master and gives the slave to a run
//! (`Io::Fd`), the way docker does for `docker run -it`.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A new pty pair (master, slave), both close-on-exec (atomically: other
/// tests fork concurrently), the master non-blocking, the slave sized
/// `rows` x `cols`.
pub fn open(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    // SAFETY: plain libc calls on fds this function owns; ptsname_r writes
    // at most buf.len() bytes into buf.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK);
        assert!(master >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = OwnedFd::from_raw_fd(master);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        let mut buf = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master.as_raw_fd(), buf.as_mut_ptr(), buf.len()), 0);
        let slave = libc::open(buf.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(slave >= 0, "open {:?}: {}", CStr::from_ptr(buf.as_ptr()), std::io::Error::last_os_error());
        let slave = OwnedFd::from_raw_fd(slave);
        set_size(&master, rows, cols);
        (master, slave)
    }
}

/// TIOCSWINSZ on the master: what docker does when the client's window
/// changes. The kernel then sends SIGWINCH to the foreground group.
pub fn set_size(master: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

/// The slave's device as /proc/PID/stat's tty_nr encodes it.
pub fn tty_nr(slave: &OwnedFd) -> i64 {
    // SAFETY: fstat writes one stat into a valid, zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(slave.as_raw_fd(), &mut st) }, 0);
    let (major, minor) = (libc::major(st.st_rdev) as i64, libc::minor(st.st_rdev) as i64);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}
