//! The only `unsafe` in drainit: the few libc calls that nix does not cover
//! in the shape drainit needs. Each wrapper is safe to call and states the
//! invariant that makes its `unsafe` block sound.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

use nix::errno::Errno;
use nix::sys::signal::SigSet;
use nix::unistd::{ForkResult, Pid};

/// drainit's entry point, called by libc's start-up code. Starting here
/// rather than in std's `main` skips std's runtime start-up: that asks libc
/// for the main thread's stack bounds (glibc parses /proc/self/maps: a sixth
/// of drainit's start-up instructions) for stack overflow reports, and
/// installs SIGSEGV/SIGBUS/SIGPIPE dispositions that drainit resets anyway.
/// The arguments come from here, not from std: std finds them by itself on
/// glibc, but on musl only when it owns `main`.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    use std::os::unix::ffi::OsStrExt;
    let args = (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| {
            // SAFETY: C's start-up passes argc pointers in argv, each to a
            // NUL-terminated string that lives as long as the process.
            let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
            std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string()
        })
        .collect();
    crate::run(args)
}

/// fork(2).
pub fn fork() -> nix::Result<ForkResult> {
    // SAFETY: drainit never starts a thread, so the child is a complete copy
    // of a single-threaded process: no lock can be held by a thread that does
    // not exist in the child. The child still only runs async-signal-safe
    // calls (see spawn.rs) so that this stays true if a thread is ever added.
    unsafe { nix::unistd::fork() }
}

/// The argument vector for execvp, built before fork so that the child
/// allocates nothing (nix's execvp collects its pointers into a Vec).
pub struct ExecArgs {
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
}

impl ExecArgs {
    pub fn new(argv: Vec<CString>) -> ExecArgs {
        // The pointers point into the CStrings' heap buffers, which do not
        // move when the Vec holding the CStrings moves into the struct.
        let argv_ptrs = argv.iter().map(|a| a.as_ptr()).chain([ptr::null()]).collect();
        ExecArgs { _argv: argv, argv_ptrs }
    }

    /// execvp(3) with drainit's environment: returns only on failure, with
    /// its errno. Async-signal-safe.
    pub fn exec(&self) -> Errno {
        // SAFETY: argv_ptrs is a null-terminated array of pointers to
        // NUL-terminated strings owned by self, alive for the whole call; it
        // holds at least the program name (config requires COMMAND).
        unsafe { libc::execvp(self.argv_ptrs[0], self.argv_ptrs.as_ptr()) };
        Errno::last()
    }
}

/// Set a variable in drainit's own environment, which the worker inherits
/// through execvp: no copy of the environment per attempt.
pub fn set_env(key: &str, value: &std::ffi::OsStr) {
    // SAFETY: setenv is unsound only against a concurrent reader in another
    // thread; drainit never starts a thread.
    unsafe { std::env::set_var(key, value) };
}

/// _exit(2): leave a forked child without running the parent's atexit
/// handlers or flushing its stdio buffers.
pub fn exit_child(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns.
    unsafe { libc::_exit(code) }
}

/// kill(2) with a raw signal number. nix's `Signal` enum has no real-time
/// signals, and drainit forwards those too. Signal 0 only probes.
pub fn kill(pid: Pid, signo: i32) -> nix::Result<()> {
    // SAFETY: kill takes plain integers; an invalid number is EINVAL.
    Errno::result(unsafe { libc::kill(pid.as_raw(), signo) }).map(drop)
}

/// What waitpid reported: the pid and the raw status word.
pub struct Waited {
    pub pid: Pid,
    pub status: i32,
}

/// waitpid(-1, WNOHANG). `Ok(None)`: children exist, none has exited yet.
/// nix's waitpid cannot decode a death by a real-time signal (it returns
/// EINVAL after the child has already been reaped), so the status stays raw.
pub fn wait_any_nohang() -> nix::Result<Option<Waited>> {
    let mut status: libc::c_int = 0;
    // SAFETY: status is a valid, writable c_int for the duration of the call.
    let pid = Errno::result(unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) })?;
    Ok((pid > 0).then(|| Waited { pid: Pid::from_raw(pid), status }))
}

/// The highest signal number on Linux.
pub const SIGRTMAX: i32 = 64;

/// The first real-time signal, as glibc, bash and `kill -l` number it (the
/// kernel's 32 and 33 are glibc's own). Fixed, not libc's SIGRTMIN(): musl
/// keeps 34 too and says 35, and `RTMIN+1` must name the same signal in
/// the glibc and the musl build, whatever libc the worker uses.
pub const SIGRTMIN: i32 = 34;

/// Set every signal's disposition to SIG_DFL. drainit never installs a
/// handler (it reads signals from a signalfd), so this undoes only what it
/// inherited: an ignored SIGCHLD would make the kernel reap children before
/// drainit can read their status, and ignored dispositions survive exec and
/// would reach the worker. Children inherit the result, so the worker starts
/// with default dispositions without any work between fork and exec.
///
/// The raw syscall, because glibc's signal() refuses the two signals it
/// reserves (32 and 33), which a parent may still have left ignored (seen:
/// an agent runner does).
pub fn reset_signal_dispositions() {
    // The kernel's struct sigaction, all zero: handler SIG_DFL (0), no
    // flags, empty mask. 32 bytes covers the x86_64 layout (with
    // sa_restorer) and the generic one (without); zero reads the same in both.
    let default = [0u64; 4];
    for signo in 1..=SIGRTMAX {
        if signo == libc::SIGKILL || signo == libc::SIGSTOP {
            continue;
        }
        // SAFETY: the new action points to 32 readable bytes that stay alive
        // for the call; the old action is not requested (null); 8 is the
        // kernel's sigset size on Linux.
        unsafe { libc::syscall(libc::SYS_rt_sigaction, signo, default.as_ptr(), std::ptr::null_mut::<u8>(), 8) };
    }
}

/// The signals whose bit (1 << (signo - 1)) is set in `bits`. Built by
/// hand: libc's sigaddset and sigfillset leave out the signals libc keeps
/// for itself (glibc 32 and 33, musl 32 to 34), and drainit must block and
/// read those too, or a `kill -34` would end it instead of reaching the
/// worker.
pub fn signal_set(bits: u64) -> SigSet {
    const { assert!(size_of::<libc::sigset_t>() >= 8 && cfg!(target_endian = "little")) };
    let mut set = *SigSet::empty().as_ref();
    // SAFETY: sigset_t (glibc and musl alike) is an array of unsigned longs
    // holding the kernel's mask first: on a little-endian target its first
    // 8 bytes are signals 1 to 64, bit signo - 1, and it has at least 8
    // bytes (checked above). The write stays inside `set`, owned here.
    unsafe { ptr::write_unaligned((&raw mut set).cast::<u64>(), bits) };
    // SAFETY: every bit pattern of the mask is a valid set of signals.
    unsafe { SigSet::from_sigset_t_unchecked(set) }
}

/// Replace the calling thread's signal mask with `set`, through the raw
/// syscall: glibc's sigprocmask quietly leaves 32 and 33 unblocked.
pub fn set_signal_mask(set: &SigSet) -> nix::Result<()> {
    // SAFETY: the new mask points to a sigset_t alive for the call, whose
    // first 8 bytes are the kernel's mask (see signal_set); the old mask is
    // not requested; 8 is the kernel's sigset size.
    let rc =
        unsafe { libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, set.as_ref(), ptr::null_mut::<u8>(), 8) };
    Errno::result(rc).map(drop)
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
