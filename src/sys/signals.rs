//! Signals by raw number: masks and dispositions over the raw syscalls
//! (libc hides the ones it reserves), taking one, sending one.

use std::mem::MaybeUninit;
use std::ptr;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::SigSet;
use nix::sys::time::TimeSpec;
use nix::unistd::Pid;

/// The highest signal number on Linux.
pub const SIGRTMAX: i32 = 64;

/// The first real-time signal, as glibc, bash and `kill -l` number it (the
/// kernel's 32 and 33 are glibc's own). Fixed, not libc's SIGRTMIN(): musl
/// keeps 34 too and says 35, and `RTMIN+1` must name the same signal in
/// the glibc and the musl build, whatever libc the worker uses.
pub const SIGRTMIN: i32 = 34;

/// Set the disposition of the signals in `bits` (bit signo - 1) to SIG_DFL.
/// drainit never installs a handler (it takes signals with rt_sigtimedwait), and
/// a handler does not survive exec, so only what it inherited as ignored
/// needs undoing: an ignored SIGCHLD would make the kernel reap children
/// before drainit can read their status, and ignored dispositions survive
/// exec and would reach the worker. Children inherit the result, so the
/// worker starts with default dispositions without any work between spawn
/// and exec.
///
/// The raw syscall, because glibc's signal() refuses the two signals it
/// reserves (32 and 33), which a parent may still have left ignored (a
/// process supervisor can).
pub fn reset_signal_dispositions(bits: u64) {
    // The kernel's struct sigaction, all zero: handler SIG_DFL (0), no
    // flags, empty mask. 32 bytes covers the x86_64 layout (with
    // sa_restorer) and the generic one (without); zero reads the same in both.
    let default = [0u64; 4];
    for signo in 1..=SIGRTMAX {
        if signo == libc::SIGKILL || signo == libc::SIGSTOP || bits & (1 << (signo - 1)) == 0 {
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

/// Whether any signal is pending for drainit (blocked, so waiting to be
/// taken): rt_sigpending, which takes none of them. Errors count as yes.
pub fn any_pending() -> bool {
    let mut bits: u64 = 0;
    // SAFETY: the kernel writes its sigset (8 bytes, the size passed) into
    // `bits`, a u64 owned here and alive for the call.
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigpending, &raw mut bits, 8) };
    rc != 0 || bits != 0
}

/// Take one pending signal of `bits` (bit signo - 1), the lowest-numbered,
/// waiting for one at most `timeout` (None: as long as it takes): its number
/// and its sender's pid. EAGAIN when none came in time. The raw syscall, for
/// the reason `set_signal_mask` gives; the signals must be blocked (drainit
/// blocks every one at start), or they are delivered instead.
pub fn take_signal(bits: u64, timeout: Option<Duration>) -> nix::Result<(i32, i32)> {
    let timeout = timeout.map(TimeSpec::from);
    let timeout = timeout.as_ref().map_or(ptr::null(), |t| ptr::from_ref::<libc::timespec>(t.as_ref()));
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: the set is 8 readable bytes, the kernel's sigset (8 is its
    // size); `info` is a writable siginfo_t; the timeout is null or points
    // to a timespec alive for the call.
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigtimedwait, &raw const bits, info.as_mut_ptr(), timeout, 8) };
    let signo = Errno::result(rc)?;
    // SAFETY: zeroed, then filled by the kernel: every field is initialized;
    // si_pid reads the sender's pid, which the kernel sets for signals sent
    // by a process and for SIGCHLD (other kinds leave it 0 or a fault
    // address, never drainit's pid, which is all the caller compares).
    let pid = unsafe { info.assume_init_ref().si_pid() };
    Ok((signo as i32, pid))
}

/// kill(2) with a raw signal number. nix's `Signal` enum has no real-time
/// signals, and drainit forwards those too. Signal 0 only probes.
pub fn kill(pid: Pid, signo: i32) -> nix::Result<()> {
    // SAFETY: kill takes plain integers; an invalid number is EINVAL.
    Errno::result(unsafe { libc::kill(pid.as_raw(), signo) }).map(drop)
}
