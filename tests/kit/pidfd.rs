//! A pidfd: signals that reach only the process it was opened for, never a
//! later process that reuses the pid (a storm that outlives drainit must not
//! hit whatever the machine starts next).

pub struct Pidfd(i32);

impl Pidfd {
    pub fn open(pid: i32) -> Pidfd {
        Pidfd::try_open(pid).unwrap_or_else(|e| panic!("pidfd_open({pid}): {e}"))
    }

    /// Err once the process is gone (reaped).
    pub fn try_open(pid: i32) -> std::io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags; returns an fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(Pidfd(fd)) }
    }

    /// Send `sig`; Err(errno) (ESRCH once the process has exited and was reaped).
    pub fn send(&self, sig: i32) -> Result<(), i32> {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.0, sig, std::ptr::null::<u8>(), 0) };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
    }

    /// Whether the process has exited (the pidfd polls readable). True for
    /// a zombie too, unlike a failing kill: signals to a zombie succeed.
    pub fn exited(&self) -> bool {
        self.exits_within(0)
    }

    /// Wait up to `timeout_ms` for the process to exit; whether it did.
    pub fn exits_within(&self, timeout_ms: i32) -> bool {
        let mut fds = libc::pollfd { fd: self.0, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut fds, 1, timeout_ms) > 0 }
    }
}

impl Drop for Pidfd {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}
