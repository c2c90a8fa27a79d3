//! drainit's entry point (the C `main` libc's start-up calls) and its
//! start-up allocator, an arena that spares start-up its mmap/munmap pairs.

use std::ptr;
use std::sync::atomic::Ordering;

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
/// touched); what it cannot hold goes to the system allocator. Memory freed
/// in the arena is not reused, so its cost is bounded by ARENA, sized to
/// hold what start-up allocates, aligned as malloc would, with every flag
/// and a full environment (most of it still in use afterwards): spilling
/// over would cost the system allocator's own set-up syscalls. The loop's
/// few allocations (error texts, signal names in log lines) take the rest
/// until it is full; untouched, the rest costs no memory.
pub struct Startup;

const ARENA: usize = 96 * 1024;

/// Every block starts on a multiple of this, whatever its layout asks: what
/// malloc guarantees on 64-bit Linux (glibc's and musl's alike), and what
/// code relying on it expects of a byte buffer (nix's sendmsg builds the
/// cmsghdr it passes the kernel in a `Vec<u8>`).
const MALLOC_ALIGN: usize = 16;

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

    /// Where the next block for `layout` goes in an arena at address `base`
    /// of which `used` bytes are handed out: its start and end offsets,
    /// aligned as malloc would, if it fits.
    fn place(base: usize, used: usize, layout: std::alloc::Layout) -> Option<(usize, usize)> {
        let start = (base + used).checked_next_multiple_of(layout.align().max(MALLOC_ALIGN))? - base;
        let end = start.checked_add(layout.size()).filter(|end| *end <= ARENA)?;
        Some((start, end))
    }

    /// A fresh range of the arena for `layout`, if it still has room.
    fn bump(layout: std::alloc::Layout) -> Option<*mut u8> {
        let base = Self::base();
        let mut used = USED.load(Ordering::Relaxed);
        loop {
            let (start, end) = Self::place(base, used, layout)?;
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

#[cfg(test)]
mod tests {
    use std::alloc::Layout;

    use super::{ARENA, Startup};

    #[test]
    fn every_block_is_aligned_as_malloc_would() {
        let base = 64 * 1000;
        for used in 0..64 {
            for (size, align) in [(1, 1), (3, 1), (8, 8), (24, 8), (4, 4), (100, 64)] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let (start, end) = Startup::place(base, used, layout).unwrap();
                assert_eq!((base + start) % 16, 0, "used {used}, size {size}, align {align}: start {start}");
                assert_eq!((base + start) % align, 0);
                assert!(start >= used && end == start + size);
            }
        }
    }

    #[test]
    fn a_block_that_does_not_fit_is_none() {
        let layout = Layout::from_size_align(20, 1).unwrap();
        assert_eq!(Startup::place(0, ARENA - 19, layout), None);
        assert_eq!(Startup::place(0, ARENA - 32, layout), Some((ARENA - 32, ARENA - 12)));
        assert_eq!(Startup::place(0, ARENA - 24, layout), None, "aligned up to 16, it no longer fits");
    }
}
