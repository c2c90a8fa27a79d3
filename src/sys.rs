//! The only `unsafe` in drainit: the few libc calls that nix does not cover
//! in the shape drainit needs. Each wrapper is safe to call and states the
//! invariant that makes its `unsafe` block sound.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::mman::{self, MapFlags, ProtFlags};
use nix::sys::signal::SigSet;
use nix::sys::time::TimeSpec;
use nix::unistd::Pid;

/// drainit's entry point, called by libc's start-up code. Starting here
/// rather than in std's `main` skips std's runtime start-up: that asks libc
/// for the main thread's stack bounds (glibc parses /proc/self/maps for
/// them, a large part of drainit's start-up) for stack overflow reports, and
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

/// drainit's allocator. Start-up (clap building and matching its command,
/// mostly) is a burst of allocations that musl's allocator serves with an
/// mmap and a munmap per size class and growth step: a third of drainit's
/// start-up syscalls (measured: bench/RESULTS.md). They are bumped from an
/// arena in .bss instead (no syscall; no file size, .bss is zero pages until
/// touched); what it cannot hold goes to the system allocator. Memory freed in the arena is not reused, so its
/// cost is bounded by ARENA, sized to hold what start-up allocates (most of
/// it still in use afterwards); the loop's few allocations (error texts,
/// signal names in log lines) take the rest until it is full.
pub struct Startup;

const ARENA: usize = 64 * 1024;

#[repr(C, align(64))]
struct Arena(std::cell::UnsafeCell<[u8; ARENA]>);

// SAFETY: the bytes are handed out by `bump` only, each range once, through
// an atomic cursor; no two allocations share a byte.
unsafe impl Sync for Arena {}

static ARENA_BYTES: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA]));
/// Bytes of the arena handed out.
static USED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Startup {
    fn base() -> usize {
        ARENA_BYTES.0.get() as usize
    }

    fn owns(ptr: *mut u8) -> bool {
        (Self::base()..Self::base() + ARENA).contains(&(ptr as usize))
    }

    /// A fresh range of the arena for `layout`, if it still has room.
    fn bump(layout: std::alloc::Layout) -> Option<*mut u8> {
        let base = Self::base();
        let mut used = USED.load(Ordering::Relaxed);
        loop {
            let start = (base + used).checked_next_multiple_of(layout.align())? - base;
            let end = start.checked_add(layout.size()).filter(|end| *end <= ARENA)?;
            match USED.compare_exchange_weak(used, end, Ordering::Relaxed, Ordering::Relaxed) {
                // The pointer is derived from the arena's own, in bounds.
                Ok(_) => return Some(ARENA_BYTES.0.get().cast::<u8>().wrapping_add(start)),
                Err(now) => used = now,
            }
        }
    }
}

// SAFETY: every pointer returned is valid for its layout (arena ranges are
// aligned, in bounds, handed out once; the rest is the system allocator's);
// dealloc and realloc tell the two apart by address and hand the system's
// pointers back to it alone.
unsafe impl std::alloc::GlobalAlloc for Startup {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        match Self::bump(layout) {
            Some(ptr) => ptr,
            // SAFETY: the caller's layout, as GlobalAlloc requires.
            None => unsafe { std::alloc::System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if !Self::owns(ptr) {
            // SAFETY: a pointer the system allocator returned, with its layout.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if !Self::owns(ptr) {
            // SAFETY: a pointer the system allocator returned, with its layout.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        // The last range handed out grows (or shrinks) in place: a Vec
        // being filled is usually that.
        let end = ptr as usize - Self::base() + layout.size();
        let new_end = end - layout.size() + new_size;
        if new_end <= ARENA && USED.compare_exchange(end, new_end, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return ptr;
        }
        let Ok(new) = std::alloc::Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        // SAFETY: `new` has a non-zero size (realloc's contract).
        let moved = unsafe { self.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both ranges are valid for the smaller size and distinct
            // (arena ranges are never handed out twice).
            unsafe { ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size)) };
        }
        moved
    }
}

/// The stack the worker-to-be runs on between clone and exec (see `spawn`),
/// with a guard page below it: an overflow faults instead of overwriting
/// drainit's memory, which the child shares.
pub struct ChildStack {
    map: NonNull<libc::c_void>,
    len: usize,
    /// The guard's size: one page of the running kernel's.
    guard: usize,
}

impl ChildStack {
    /// Room for execvp: glibc's copies at most PATH_MAX of PATH and, for a
    /// script without `#!`, the argument pointers; musl's only the first.
    pub fn new(argc: usize) -> nix::Result<ChildStack> {
        let guard = Self::page_size();
        let len = Self::size(argc, guard);
        let length = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
        // SAFETY: a new private anonymous mapping aliases nothing.
        let map = unsafe {
            mman::mmap_anonymous(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_STACK,
            )
        }?;
        // SAFETY: the first page of the mapping just made, which nothing uses.
        if let Err(e) = unsafe { mman::mprotect(map, guard, ProtFlags::PROT_NONE) } {
            // SAFETY: the whole mapping, unused.
            let _ = unsafe { mman::munmap(map, len) };
            return Err(e);
        }
        Ok(ChildStack { map, len, guard })
    }

    /// The kernel's page size, read at run time: mprotect works in whole
    /// pages, and one binary runs on kernels with 4, 16 or 64 KiB pages
    /// (aarch64, ppc64le). A guard sized below the page would have the
    /// protection cover the stack itself.
    fn page_size() -> usize {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|page| usize::try_from(page).ok())
            .filter(|page| page.is_power_of_two())
            .unwrap_or(4096)
    }

    /// The mapping's length: one guard page, then the room execvp needs,
    /// rounded up to whole pages.
    fn size(argc: usize, page: usize) -> usize {
        (page + 64 * 1024 + (argc + 2) * size_of::<usize>()).next_multiple_of(page)
    }

    /// Whether a program with `argc` arguments can exec from this stack.
    pub fn fits(&self, argc: usize) -> bool {
        self.len >= Self::size(argc, self.guard)
    }

    /// Everything above the guard page.
    fn usable(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is readable and writable past its guard page,
        // lives as long as self, and is reachable only through self.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().cast::<u8>().add(self.guard), self.len - self.guard) }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), which no child uses any more
        // (spawn returns only once its child has exec'd or exited).
        let _ = unsafe { mman::munmap(self.map, self.len) };
    }
}

/// What `spawn` started: the child's pid and, if its exec failed, the errno
/// (the child has exited then, and still has to be waited for).
pub struct Spawned {
    pub pid: Pid,
    pub exec_error: Option<Errno>,
}

/// Start a child that runs `setup` and then execs `exec`, the way
/// posix_spawn does: clone(CLONE_VM | CLONE_VFORK). The child borrows
/// drainit's memory instead of copying it, so spawning copies no page
/// tables and leaves no copy-on-write faults behind for drainit's next
/// writes; drainit sleeps until the child has exec'd or exited, so the
/// child's report of a failed exec is simply a word of shared memory.
/// `setup` runs in the child on the ChildStack: it may only make syscalls
/// (no allocation, no change to drainit's state).
pub fn spawn(stack: &mut ChildStack, exec: &ExecArgs, mut setup: impl FnMut()) -> nix::Result<Spawned> {
    let failed = AtomicI32::new(0);
    let child = Box::new(|| -> isize {
        setup();
        let errno = exec.exec();
        failed.store(errno as i32, Ordering::Relaxed);
        // Never seen: drainit reaps this child and reports the errno.
        exit_now(127)
    });
    // SAFETY: the child runs on the ChildStack's usable part (above the
    // guard page), sized for execvp; what it runs (setup, execvp, an atomic
    // store, _exit) allocates nothing and changes no state of drainit's but
    // `failed` (and the shell's argv slot of `exec`, see exec_with_shell).
    // Its closure and everything it borrows outlive it: CLONE_VFORK
    // suspends drainit until the child has exec'd or exited, which also
    // means the store is done before the load below. Signals stay blocked
    // in the child until `setup` unblocks them right before exec, and
    // drainit installs no handler, so no handler runs on that stack. The
    // child's exit signal is SIGCHLD, like fork's, so waitpid sees it.
    let pid = unsafe {
        nix::sched::clone(child, stack.usable(), CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK, Some(libc::SIGCHLD))
    }?;
    let exec_error = match failed.load(Ordering::Relaxed) {
        0 => None,
        errno => Some(Errno::from_raw(errno)),
    };
    Ok(Spawned { pid, exec_error })
}

/// The argument vector for execvp, built before the spawn so that the child
/// allocates nothing (nix's execvp collects its pointers into a Vec).
pub struct ExecArgs {
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    /// Where execvp looks for the program, in its order: the name itself
    /// when it holds a `/`, else each PATH entry joined with it.
    candidates: Vec<CString>,
    /// `/bin/sh FILE ARGS...`, for a file execve cannot run (no `#!`). Slot
    /// 1 is the file, set in the child to the candidate that was refused
    /// (a Cell: `exec` takes &self, and the parent sleeps meanwhile).
    sh_argv: Vec<Cell<*const libc::c_char>>,
}

/// The shell a file without `#!` is given to, as glibc's execvp does.
const SHELL: &CStr = c"/bin/sh";

/// execvp's search path when PATH is unset: the C library's own.
const DEFAULT_PATH: &str = if cfg!(target_env = "musl") { "/usr/local/bin:/bin:/usr/bin" } else { "/bin:/usr/bin" };

impl ExecArgs {
    pub fn new(argv: Vec<CString>) -> ExecArgs {
        // The pointers point into the CStrings' heap buffers, which do not
        // move when the Vec holding the CStrings moves into the struct.
        let argv_ptrs: Vec<_> = argv.iter().map(|a| a.as_ptr()).chain([ptr::null()]).collect();
        let candidates = argv.first().map(|name| Self::candidates(name.as_bytes())).unwrap_or_default();
        let sh_argv = [SHELL.as_ptr()].into_iter().chain(argv_ptrs.iter().copied()).map(Cell::new).collect();
        ExecArgs { _argv: argv, argv_ptrs, candidates, sh_argv }
    }

    /// The paths execvp tries for `name`. PATH is read once, here: drainit
    /// never changes its own, so the child's execvp reads the same.
    fn candidates(name: &[u8]) -> Vec<CString> {
        if name.is_empty() {
            return Vec::new();
        }
        if name.contains(&b'/') {
            return CString::new(name).into_iter().collect();
        }
        let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        use std::os::unix::ffi::OsStrExt;
        path.as_bytes()
            .split(|b| *b == b':')
            .filter_map(|dir| {
                // An empty entry is the current directory, as execvp reads it.
                let joined = if dir.is_empty() { name.to_vec() } else { [dir, b"/", name].concat() };
                CString::new(joined).ok()
            })
            .collect()
    }

    pub fn argc(&self) -> usize {
        self.argv_ptrs.len() - 1
    }

    /// execvp(3) with drainit's environment: returns only on failure, with
    /// its errno. Async-signal-safe.
    pub fn exec(&self) -> Errno {
        // SAFETY: argv_ptrs is a null-terminated array of pointers to
        // NUL-terminated strings owned by self, alive for the whole call; it
        // holds at least the program name (config requires COMMAND).
        unsafe { libc::execvp(self.argv_ptrs[0], self.argv_ptrs.as_ptr()) };
        match Errno::last() {
            Errno::ENOEXEC => self.exec_with_shell(),
            errno => errno,
        }
    }

    /// POSIX's execvp gives a file that execve refuses with ENOEXEC (a
    /// script without `#!`) to the shell. glibc's does; musl's returns the
    /// error, so the static build would refuse what the dynamic one runs.
    /// Find the file again in execvp's order and hand the first that is
    /// refused so to /bin/sh. Without a shell (`FROM scratch`) the file
    /// stays unrunnable: ENOEXEC, 126. Async-signal-safe, allocates nothing.
    fn exec_with_shell(&self) -> Errno {
        for path in &self.candidates {
            // SAFETY: `path` and argv_ptrs are NUL-terminated, the latter a
            // null-terminated array, all owned by self and alive for the call.
            unsafe { libc::execv(path.as_ptr(), self.argv_ptrs.as_ptr()) };
            match Errno::last() {
                Errno::ENOEXEC => {
                    self.sh_argv[1].set(path.as_ptr());
                    // SAFETY: Cell<*const c_char> has the layout of the
                    // pointer (repr(transparent)): sh_argv is a null-terminated
                    // array of pointers to NUL-terminated strings (SHELL is
                    // static, the rest owned by self), alive for the call.
                    unsafe { libc::execv(SHELL.as_ptr(), self.sh_argv.as_ptr().cast()) };
                    return Errno::ENOEXEC;
                }
                // As execvp: the name is not here, or not for us; look on.
                Errno::EACCES | Errno::ENOENT | Errno::ENOTDIR => {}
                errno => return errno,
            }
        }
        Errno::ENOEXEC
    }
}

/// Set a variable in drainit's own environment, which the worker inherits
/// through execvp: no copy of the environment per attempt.
pub fn set_env(key: &str, value: &std::ffi::OsStr) {
    // SAFETY: setenv is unsound only against a concurrent reader in another
    // thread; drainit never starts a thread.
    unsafe { std::env::set_var(key, value) };
}

/// Remove a variable from drainit's own environment (an inherited
/// NOTIFY_SOCKET that the worker must not see).
pub fn unset_env(key: &str) {
    // SAFETY: as set_env's: drainit never starts a thread.
    unsafe { std::env::remove_var(key) };
}

/// Own a descriptor the kernel has just installed in drainit's table from a
/// received SCM_RIGHTS message: nothing else in drainit knows its number.
pub fn own_received(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: recvmsg installed fd for this message alone; the caller takes
    // it once, and nothing else closes or uses it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// What a number's entry (`WATCHDOG_PID`, `DRAINIT_ATTEMPT`) holds in
/// drainit's environment when set: room for any u32, written over in place
/// (`fill_number`). In place, because setenv(3) keeps every value it was
/// ever given (glibc cannot free one a caller may still hold): a new value
/// per restart would grow drainit's heap with every attempt.
pub const NUMBER_SLOT: &str = "0000000000";
pub const WATCHDOG_PID_SLOT: &str = NUMBER_SLOT;

/// In the child of `spawn`, before exec: write the child's own pid into
/// the environment's `WATCHDOG_PID=` entry, in place. Allocates nothing
/// (the child shares drainit's memory); systemd's libraries compare the
/// variable with their own pid.
pub fn fill_watchdog_pid() {
    fill_number(b"WATCHDOG_PID=", nix::unistd::getpid().as_raw().unsigned_abs());
}

/// Write `n` into the environment's entry `key` (`NAME=`), which drainit set
/// to NUMBER_SLOT, in place; allocates nothing (the child of `spawn` calls
/// it). An entry of that name that is not such a slot is left alone.
pub fn fill_number(key: &[u8], mut n: u32) {
    unsafe extern "C" {
        static environ: *const *mut libc::c_char;
    }
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 || len == digits.len() {
            break;
        }
    }
    // SAFETY: environ is libc's, a null-terminated array of pointers to
    // NUL-terminated "NAME=VALUE" strings; drainit has one thread, and the
    // parent sleeps (CLONE_VFORK) while a child reads it.
    let mut entry = unsafe { environ };
    while !entry.is_null() {
        // SAFETY: entry points into the array, before or at its null end.
        let var = unsafe { *entry };
        if var.is_null() {
            return;
        }
        // Found by its name alone: a number written earlier may be shorter
        // than the slot (its NUL comes sooner). Matching the slot's length
        // found nothing after the first spawn and handed every later
        // attempt the first one's WATCHDOG_PID. Compared byte by byte, no
        // strlen of every entry: the environment may be large.
        let at = |i: usize| {
            // SAFETY: called only for i up to the first NUL of var, a
            // NUL-terminated string of the environment (see `named`).
            unsafe { *var.cast::<u8>().add(i) }
        };
        let named = key.iter().enumerate().all(|(i, &b)| at(i) == b)
            && (key.len()..=key.len() + NUMBER_SLOT.len()).any(|i| at(i) == 0);
        if named {
            let value = var.cast::<u8>().wrapping_add(key.len());
            for (i, digit) in digits[..len].iter().rev().enumerate() {
                // SAFETY: an entry of this name is the slot drainit set (an
                // inherited one is replaced before the first fill, and
                // drainit never sets the name otherwise between fills): its
                // buffer, writable (setenv copied it to the heap), holds the
                // slot's length in bytes and a NUL, and len <= the slot's
                // length.
                unsafe { *value.add(i) = *digit };
            }
            // SAFETY: as above: within the slot, which ends in its NUL.
            unsafe { *value.add(len) = 0 };
            return;
        }
        // SAFETY: the array goes on until its null entry, not yet reached.
        entry = unsafe { entry.add(1) };
    }
}

/// _exit(2): end the process now, without libc's exit work: atexit
/// handlers, shared objects' destructors (glibc's _dl_fini), stdio flushing.
/// drainit registers none of those and writes its lines straight to the fds;
/// the child of `spawn`, which shares drainit's memory, must not run them.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns.
    unsafe { libc::_exit(code) }
}

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

/// Run `f` under SCHED_FIFO (the lowest real-time priority), then restore
/// the policy drainit had. For a walk that must outrun a fork bomb: among
/// thousands of runnable processes a normal one gets a sliver of the CPU,
/// while a real-time one runs until it blocks, so nothing it chases can fork
/// in the meantime. Without the privilege (CAP_SYS_NICE, which Docker drops)
/// `f` just runs as it is.
pub fn first_in_line<T>(f: impl FnOnce() -> T) -> T {
    let param = |priority| {
        // SAFETY: sched_param is plain integers (musl's has more fields than
        // glibc's): all zero is a valid value.
        let mut p: libc::sched_param = unsafe { std::mem::zeroed() };
        p.sched_priority = priority;
        p
    };
    let fifo = param(1);
    // SAFETY: sched_getscheduler takes a pid (0: the caller) and reads nothing.
    let before = unsafe { libc::sched_getscheduler(0) };
    let normal = before >= 0 && before != libc::SCHED_FIFO && before != libc::SCHED_RR;
    // SAFETY: a valid sched_param for the call, pid 0 (the caller).
    let boosted = normal && unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) } == 0;
    let out = f();
    if boosted {
        let normal = param(0);
        // SAFETY: as above; `before` is the non-real-time policy the kernel
        // just reported, whose static priority is always 0.
        unsafe { libc::sched_setscheduler(0, before, &normal) };
    }
    out
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

#[cfg(test)]
mod child_stack_tests {
    use super::ChildStack;

    /// The usable part above the guard, for `argc` arguments at `page`.
    fn usable(argc: usize, page: usize) -> usize {
        ChildStack::size(argc, page) - page
    }

    #[test]
    fn the_room_for_execvp_does_not_depend_on_the_page_size() {
        let need = |argc: usize| 64 * 1024 + (argc + 2) * size_of::<usize>();
        for page in [4096, 16 * 1024, 64 * 1024] {
            for argc in [1, 3, 1000, 100_000] {
                let len = ChildStack::size(argc, page);
                assert_eq!(len % page, 0, "page {page}, argc {argc}: {len} is not whole pages");
                assert!(usable(argc, page) >= need(argc), "page {page}, argc {argc}: {} usable", usable(argc, page));
            }
        }
        // At 64 KiB pages: one guard page, two pages of stack.
        assert_eq!(ChildStack::size(1, 64 * 1024), 3 * 64 * 1024);
        assert_eq!(usable(1, 64 * 1024), 2 * 64 * 1024);
        // At 4 KiB pages the layout is the one drainit always had.
        assert_eq!(ChildStack::size(1, 4096), 4096 + 64 * 1024 + 4096);
    }

    #[test]
    fn the_guard_is_this_kernels_page() {
        let page = ChildStack::page_size();
        assert!(page >= 4096 && page.is_power_of_two(), "{page}");
        let mut stack = ChildStack::new(1).unwrap();
        assert_eq!(stack.guard, page);
        assert!(stack.fits(1));
        let len = stack.usable().len();
        assert_eq!(len, ChildStack::size(1, page) - page);
        // The usable part is writable to its two ends.
        let top = stack.usable();
        top[0] = 1;
        top[len - 1] = 1;
    }
}
