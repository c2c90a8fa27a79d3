//! drainit's private directory, where the retry-after file and the notify
//! socket lie (the retry-after file unless the user names it).
//!
//! The directory (mode 0700, a new random name each run, removed at
//! exit: on a shared /tmp no other user can plant a link at a name drainit
//! would use) lies under `$TMPDIR`, else `/dev/shm`, else `/tmp`, the first
//! that takes one. /dev/shm comes before /tmp: Docker and Kubernetes always
//! mount it as a private tmpfs (even `FROM scratch`, even with a read-only
//! root), where a disk's mkdir and rmdir would sit on every start and stop.
//! A relative `$TMPDIR` is made absolute against drainit's working directory,
//! the one the worker starts in, so that it names the directory the user
//! meant and the worker's path still holds after the worker changes
//! directory (skipping it instead would put the files where nobody asked).
//! Where no base takes a directory: one warning, and the variables that need
//! it are not set (an inherited one is removed).

use std::fs;
use std::path::{Path, PathBuf};

use crate::events::Event;

/// The names drainit itself puts in its private directory.
pub const RETRY_AFTER_NAME: &str = "retry-after";
pub const NOTIFY_NAME: &str = "notify";
const OWN_NAMES: [&str; 2] = [RETRY_AFTER_NAME, NOTIFY_NAME];

/// sun_path's size: a socket's path, its NUL included, fits in it.
const SOCKET_PATH_ROOM: usize = 108;

/// drainit's private directory: made once, removed at exit.
#[derive(Debug)]
pub struct PrivateDir(PathBuf);

impl PrivateDir {
    /// A new directory under `$TMPDIR`, `/dev/shm` or `/tmp`, the first that
    /// takes one. When none does, `Err` says why, base by base, for the
    /// one warning the caller gives.
    pub fn create() -> Result<PrivateDir, String> {
        let mut errors = Vec::new();
        let tmpdir = std::env::var_os("TMPDIR").filter(|p| !p.is_empty()).and_then(|p| {
            std::path::absolute(&p).map_err(|e| errors.push(format!("TMPDIR {}: {e}", Path::new(&p).display()))).ok()
        });
        let bases = tmpdir.into_iter().chain(["/dev/shm", "/tmp"].map(PathBuf::from));
        for base in bases {
            let template = base.join("drainit-XXXXXX");
            // The notify socket's path must fit a socket address (108 bytes
            // with its NUL): a base too long for it is passed over, as one
            // that is not writable, rather than leaving the worker without
            // a socket (the watchdog and the ready timeout off).
            let socket = template.as_os_str().len() + 1 + NOTIFY_NAME.len();
            if socket >= SOCKET_PATH_ROOM {
                errors.push(format!("{}: too long for a socket's path ({socket} bytes)", base.display()));
                continue;
            }
            match nix::unistd::mkdtemp(&template) {
                Ok(dir) => return Ok(PrivateDir(dir)),
                Err(e) => errors.push(format!("{}: {}", base.display(), e.desc())),
            }
        }
        Err(errors.join("; "))
    }

    /// The directory (absolute).
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Remove it and the names drainit put in it. Work whose size the
    /// worker chooses never runs at exit (it would push drainit's exit past
    /// the orchestrator's SIGKILL): what else the worker left there makes
    /// one warning, and the directory stays (a container's /dev/shm goes
    /// with the container).
    pub fn remove(self) {
        // Usually empty: one rmdir.
        if fs::remove_dir(&self.0).is_ok() {
            return;
        }
        for name in OWN_NAMES {
            let _ = fs::remove_file(self.0.join(name));
        }
        if let Err(e) = fs::remove_dir(&self.0) {
            let error = format!("left in place: {e}");
            Event::FileSkipped { what: "private_dir", path: self.0.display().to_string(), error }.emit();
        }
    }
}
