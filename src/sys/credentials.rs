//! The child's switch to another user (`--user`): groups, gid, uid.

use nix::errno::Errno;

/// In the child of `spawn`, before exec: the supplementary groups, then
/// the gid, then the uid, each checked; on failure, the call that failed
/// and why (the caller ends the child: it must never exec as root by
/// accident). Raw syscalls, not libc's wrappers: those may synchronise
/// the ids across threads (musl's `__synccall`, glibc's setxid), work for
/// a process with threads that this child, sharing drainit's memory, must
/// not start. The kernel's calls change this process alone. Allocates
/// nothing; async-signal-safe.
pub fn become_user(groups: &[libc::gid_t], gid: libc::gid_t, uid: libc::uid_t) -> Result<(), (&'static str, Errno)> {
    #[cfg(any(target_arch = "x86", target_arch = "arm"))]
    let (sys_setgroups, sys_setgid, sys_setuid) = (libc::SYS_setgroups32, libc::SYS_setgid32, libc::SYS_setuid32);
    #[cfg(not(any(target_arch = "x86", target_arch = "arm")))]
    let (sys_setgroups, sys_setgid, sys_setuid) = (libc::SYS_setgroups, libc::SYS_setgid, libc::SYS_setuid);
    // SAFETY: setgroups reads `groups.len()` gids from the pointer, a live
    // slice of gid_t (the kernel's 32-bit gid on every syscall used here).
    let set = unsafe { libc::syscall(sys_setgroups, groups.len(), groups.as_ptr()) };
    Errno::result(set).map_err(|e| ("setgroups", e))?;
    // SAFETY: setgid takes an integer.
    Errno::result(unsafe { libc::syscall(sys_setgid, gid) }).map_err(|e| ("setgid", e))?;
    // SAFETY: setuid takes an integer.
    Errno::result(unsafe { libc::syscall(sys_setuid, uid) }).map_err(|e| ("setuid", e))?;
    Ok(())
}
