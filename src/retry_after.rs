//! The retry-after file: where a worker that exits with a backoff code may
//! write the exact delay it wants (a DURATION). The worker controls the file,
//! so drainit reads it as untrusted input. Unless the user names the file,
//! it lies in drainit's private directory ([`PrivateDir`]).
//!
//! The private directory (mode 0700, a new random name each run, removed at
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
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::duration;
use crate::events::Event;

/// The variable that names the file, in the worker's environment (and, when
/// the user sets it, in drainit's: a path of their choosing).
pub const VAR: &str = "DRAINIT_RETRY_AFTER_FILE";

/// At most this many bytes are read: a duration is short.
const LIMIT: usize = 64;

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

pub struct RetryAfter {
    /// None: no directory could be made, and the worker is told of no file.
    path: Option<PathBuf>,
    /// The file lies in drainit's private directory, new this run.
    private: bool,
}

impl RetryAfter {
    /// `$DRAINIT_RETRY_AFTER_FILE` if set, else a file in drainit's private
    /// directory; with neither, no file, and the variable (an empty one
    /// inherited) removed.
    pub fn new(dir: Option<&PrivateDir>) -> RetryAfter {
        if let Some(path) = std::env::var_os(VAR).filter(|p| !p.is_empty()) {
            return RetryAfter { path: Some(PathBuf::from(path)), private: false };
        }
        match dir {
            Some(dir) => RetryAfter { path: Some(dir.path().join(RETRY_AFTER_NAME)), private: true },
            None => {
                if std::env::var_os(VAR).is_some() {
                    crate::sys::unset_env(VAR);
                }
                RetryAfter { path: None, private: false }
            }
        }
    }

    /// Whether it needs the private directory.
    pub fn wants_dir() -> bool {
        std::env::var_os(VAR).is_none_or(|p| p.is_empty())
    }

    /// The path the worker is told, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Remove the file (before an attempt starts: an old value must not
    /// count). A missing file is fine.
    fn clear(&self) {
        if let Some(path) = &self.path {
            let _ = fs::remove_file(path);
        }
    }

    /// Clear before attempt `attempt`: a fresh private directory is empty
    /// before the first.
    pub fn clear_before(&self, attempt: u32) {
        if attempt > 1 || !self.private {
            self.clear();
        }
    }

    /// The delay the worker asked for, if it wrote a valid one; the file is
    /// removed once read. Anything else is one warning and the normal delay.
    pub fn take(&self) -> Option<Duration> {
        let path = self.path.as_deref()?;
        let warn = |error: String| Event::RetryAfterInvalid { path: path.display().to_string(), error }.emit();
        let text = match read_small(path) {
            Ok(Some(text)) => text,
            Ok(None) => return None,
            Err(error) => {
                warn(error);
                self.clear();
                return None;
            }
        };
        self.clear();
        match duration::parse(&text) {
            Ok(delay) => Some(delay),
            Err(why) => {
                warn(format!("{:?}: {why}; using the normal delay", text.trim()));
                None
            }
        }
    }
}

/// The file's text, None when it does not exist. Only a regular file is
/// read, without blocking (a FIFO would wedge the event loop) and never past
/// LIMIT (a link to /dev/zero would grow drainit without end).
fn read_small(path: &Path) -> Result<Option<String>, String> {
    let file = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.raw_os_error().map_or("unreadable", |n| Errno::from_raw(n).desc()).to_string()),
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err("not a regular file; using the normal delay".to_string());
    }
    let mut buf = [0u8; LIMIT + 1];
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err("unreadable; using the normal delay".to_string()),
        }
    }
    if len > LIMIT {
        return Err(format!("longer than {LIMIT} bytes; using the normal delay"));
    }
    Ok(Some(String::from_utf8_lossy(&buf[..len]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Fuzzing (issue 26): the file's content is the worker's, untrusted;
    // see scripts/fuzz.
    proptest! {
        #[test]
        fn fuzz_any_content_is_a_bounded_delay_or_none(content in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..80),
            "[ \n]{0,2}[0-9]{0,20}[.]?[0-9]{0,9}(ms|s|m|h|d|y)?[ \n]{0,2}".prop_map(String::into_bytes),
        ]) {
            let dir = std::env::temp_dir().join(format!("drainit-fuzz-retry-{}", std::process::id()));
            fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_alphanumeric(), ""));
            fs::write(&path, &content).unwrap();
            let file = RetryAfter { path: Some(path.clone()), private: false };
            let taken = file.take();
            prop_assert!(!path.exists(), "the file is removed once read");
            if let Some(delay) = taken {
                prop_assert!(content.len() <= LIMIT && delay <= Duration::from_secs(365 * 24 * 3600), "{content:?}");
            }
        }
    }
}
