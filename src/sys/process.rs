//! The child's side of drainit: its stack, clone/exec (with execvp's
//! ENOEXEC fallback to the shell), the environment it inherits (the
//! number slots written in place), reaping, _exit and scheduling.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::num::NonZeroUsize;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::mman::{self, MapFlags, ProtFlags};
use nix::unistd::Pid;

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
    // `failed` (and the shell's argv slot of `exec`, see exec_with_shell,
    // and the Cell by which `setup` reports a failed switch of user, see
    // spawn.rs).
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
/// through execvp: no copy of the environment per attempt. Not setenv(3):
/// its entry and its grown array come from malloc, and musl's malloc sets
/// up its heap on its first call (brk twice, mmap twice): four syscalls at
/// every start for DRAINIT_RETRY_AFTER_FILE alone. Here both are Rust
/// allocations (the start-up arena's); an entry of that name is replaced
/// in place, a new one gets an array one longer. Neither is ever freed, as
/// setenv's entries are not (a caller may still hold one): drainit sets a
/// handful of variables at start and at exit, none per attempt.
pub fn set_env(key: &str, value: &std::ffi::OsStr) {
    use std::os::unix::ffi::OsStrExt;
    debug_assert!(!key.is_empty() && !key.contains(['=', '\0']) && !value.as_bytes().contains(&0));
    let mut entry = Vec::with_capacity(key.len() + value.len() + 2);
    entry.extend_from_slice(key.as_bytes());
    entry.push(b'=');
    entry.extend_from_slice(value.as_bytes());
    entry.push(0);
    let entry = Box::leak(entry.into_boxed_slice()).as_mut_ptr().cast::<libc::c_char>();
    // SAFETY: environ is libc's, null or a null-terminated array of
    // pointers to NUL-terminated "NAME=VALUE" strings, each entry read only
    // up to its NUL (`named`); drainit never starts a thread, so nothing
    // reads the array while it changes. The new entry and array are leaked,
    // so they live as long as the process, as environ's must.
    unsafe {
        let old = environ;
        let mut n = 0;
        while !old.is_null() && !(*old.add(n)).is_null() {
            if named(*old.add(n), key.as_bytes()) {
                *old.add(n) = entry;
                return;
            }
            n += 1;
        }
        let mut grown = Vec::with_capacity(n + 2);
        if n > 0 {
            grown.extend_from_slice(std::slice::from_raw_parts(old, n));
        }
        grown.push(entry);
        grown.push(ptr::null_mut());
        environ = Box::leak(grown.into_boxed_slice()).as_mut_ptr();
    }
}

unsafe extern "C" {
    /// libc's environment (POSIX lets a program assign it).
    static mut environ: *mut *mut libc::c_char;
}

/// Whether the environment entry `var` is named `key`.
///
/// # Safety
/// `var` points to a NUL-terminated string.
unsafe fn named(var: *const libc::c_char, key: &[u8]) -> bool {
    // Byte by byte, no strlen of every entry (the environment may be
    // large): each read stops at the first byte that differs from the
    // name's, the entry's NUL at the latest (the name holds no NUL).
    // SAFETY: i goes no further than the first differing byte (see above),
    // within the string.
    let at = |i: usize| unsafe { *var.cast::<u8>().add(i) };
    key.iter().enumerate().all(|(i, &b)| at(i) == b) && at(key.len()) == b'='
}

/// Remove a variable from drainit's own environment (an inherited
/// NOTIFY_SOCKET that the worker must not see).
pub fn unset_env(key: &str) {
    // SAFETY: as set_env's: drainit never starts a thread.
    unsafe { std::env::remove_var(key) };
}

/// What a number's entry (`WATCHDOG_PID`, `DRAINIT_ATTEMPT`) holds in
/// drainit's environment when set: room for any u32, written over in place
/// (`fill_number`). In place, because setenv(3) keeps every value it was
/// ever given (glibc cannot free one a caller may still hold): a new value
/// per restart would grow drainit's heap with every attempt.
pub const NUMBER_SLOT: &str = "0000000000";

/// Write `n` into the environment's entry `key` (its name), which drainit set
/// to NUMBER_SLOT, in place; allocates nothing (the child of `spawn` calls
/// it). An entry of that name that is not such a slot is left alone.
pub fn fill_number(key: &[u8], mut n: u32) {
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
        // attempt the first one's WATCHDOG_PID.
        // SAFETY: var is one of environ's strings (above).
        if unsafe { named(var, key) } {
            let value = var.cast::<u8>().wrapping_add(key.len() + 1);
            // SAFETY: within var's value, which ends in a NUL: read up to it.
            let slot = (0..=NUMBER_SLOT.len()).any(|i| unsafe { *value.add(i) } == 0);
            if !slot {
                return;
            }
            for (i, digit) in digits[..len].iter().rev().enumerate() {
                // SAFETY: an entry of this name is the slot drainit set (an
                // inherited one is replaced before the first fill, and
                // drainit never sets the name otherwise between fills): its
                // buffer, writable (set_env's, leaked), holds the slot's
                // length in bytes and a NUL, and len <= the slot's length.
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

/// The kernel's `struct sched_attr`, its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// The shortest slice the kernel gives a normal task (EEVDF's 0.1 ms).
const SHORT_SLICE_NS: u64 = 100_000;

/// Ask for the shortest time slice for the rest of drainit's life, once a
/// stop has begun: from then on it only drains, kills at the deadline and
/// exits, and the deadline must win the CPU. The scheduler (EEVDF, Linux
/// 6.6) runs the task with the earliest virtual deadline, a slice past its
/// wakeup, and gives each new process half a slice: a fork bomb after
/// SIGTERM kept drainit's timer wakeup waiting for seconds (measured: the
/// deadline's kill 1.3-2.3 s late with a 300 ms grace). A 0.1 ms slice
/// (Linux 6.12's custom slices; older kernels take and ignore it) puts
/// drainit ahead of them and lets its wakeup preempt, with no privilege
/// and no more CPU than its fair share: unlike a real-time policy it
/// cannot starve the worker's drain under a signal storm. Its children
/// start with the default slice (SCHED_FLAG_RESET_ON_FORK). A real-time or
/// idle policy is left as it is; the nice value is kept.
pub fn short_slice() {
    let size = std::mem::size_of::<SchedAttr>();
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr writes at most `size` bytes into `attr`, a
    // SchedAttr of that size; pid 0 is the caller.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut SchedAttr, size, 0) };
    let normal = [libc::SCHED_OTHER, libc::SCHED_BATCH].map(|p| p as u32);
    if got != 0 || !normal.contains(&attr.policy) {
        return;
    }
    attr.size = size as u32;
    // Children start afresh (the finish program: the default slice; a
    // negative nice becomes 0, as the flag does).
    attr.flags = libc::SCHED_FLAG_RESET_ON_FORK as u64;
    attr.runtime = SHORT_SLICE_NS;
    // SAFETY: sched_setattr reads one SchedAttr whose size field says so;
    // pid 0 is the caller.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
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
    // After `short_slice` the policy carries SCHED_RESET_ON_FORK; a chrt'd
    // drainit's may too. (The short slice outlives the boost: measured.)
    let policy = before & !libc::SCHED_RESET_ON_FORK;
    let normal = before >= 0 && policy != libc::SCHED_FIFO && policy != libc::SCHED_RR;
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
