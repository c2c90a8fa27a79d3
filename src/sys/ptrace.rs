//! ptrace of a stopped child: what stopped it, and letting it go with any
//! signal (real-time ones too).

use std::mem::MaybeUninit;
use std::ptr;

use nix::errno::Errno;
use nix::unistd::Pid;

/// PTRACE_GETSIGINFO of a child stopped under ptrace: the si_code and the
/// sending pid of the signal that stopped it. EINVAL: a group-stop (no
/// signal is waiting to be delivered).
pub fn ptrace_siginfo(pid: Pid) -> nix::Result<(i32, i32)> {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t to `data`, a valid
    // writable one for the call; `addr` is ignored.
    let rc = unsafe {
        libc::ptrace(libc::PTRACE_GETSIGINFO, pid.as_raw(), ptr::null_mut::<libc::c_void>(), info.as_mut_ptr())
    };
    Errno::result(rc)?;
    // SAFETY: zeroed, then filled by the kernel; si_pid reads the sender
    // field, which is 0 or a pid for every kind of signal.
    let info = unsafe { info.assume_init() };
    // SAFETY: as above.
    Ok((info.si_code, unsafe { info.si_pid() }))
}

/// PTRACE_DETACH: stop tracing a child in a ptrace stop and let it run on,
/// delivering `signo` to it (0: none). nix's detach takes only its Signal
/// enum, which has no real-time signals.
pub fn ptrace_detach(pid: Pid, signo: i32) -> nix::Result<()> {
    // SAFETY: PTRACE_DETACH reads no memory: `addr` is ignored and `data`
    // is the signal number, passed as the pointer-sized value it expects.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_DETACH,
            pid.as_raw(),
            ptr::null_mut::<libc::c_void>(),
            signo as usize as *mut libc::c_void,
        )
    };
    Errno::result(rc).map(drop)
}
