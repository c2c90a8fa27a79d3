//! A v1 memory cgroup of the test's own (this machine's and CI's cgroup v1;
//! the v2 scenarios run in the VM): made under the test's own memory
//! cgroup, so nothing leaves the machine's accounting, and removed when
//! dropped.

use super::{Builder, secs, wait_until};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// A memory cgroup of the test's own under its own v1 memory cgroup,
/// removed when dropped (after its processes are gone). A machine without
/// the v1 memory controller fails the test with the reason.
pub struct Cgroup {
    pub dir: PathBuf,
}

impl Cgroup {
    pub fn new(tag: &str, limit_mib: Option<u64>) -> Cgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let path = own
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
            })
            .expect("these tests need the cgroup v1 memory controller (the v2 ones run in the VM)");
        let dir = Path::new("/sys/fs/cgroup/memory")
            .join(path.trim_start_matches('/'))
            .join(format!("drainit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = Cgroup { dir };
        if let Some(mib) = limit_mib {
            cg.write("memory.limit_in_bytes", &(mib << 20).to_string());
            // No swap to climb into: the limit is the limit.
            if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
                cg.write("memory.memsw.limit_in_bytes", &(mib << 20).to_string());
            }
        }
        cg
    }

    pub fn write(&self, name: &str, value: &str) {
        std::fs::write(self.dir.join(name), value).unwrap_or_else(|e| panic!("{name} = {value}: {e}"));
    }

    pub fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap()
    }

    /// Moves the process about to exec (drainit; PID 1 of its namespace in
    /// that mode) into the cgroup: `0` is the writer itself.
    pub fn enter(&self, run: Builder) -> Builder {
        let procs = CString::new(self.dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap();
        run.before_exec(move || {
            // SAFETY: open, write and close are async-signal-safe.
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            Ok(())
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The run's processes are reaped; the kernel lets the directory go
        // once their pages are uncharged.
        let gone = wait_until(secs(5), || std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists());
        if !gone {
            eprintln!("cgroup {} left behind", self.dir.display());
        }
    }
}
