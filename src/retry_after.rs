//! The retry-after file: where a worker that exits with a backoff code may
//! write the exact delay it wants (a DURATION). The worker controls the file,
//! so drainit reads it as untrusted input. Unless the user names the file,
//! it lies in drainit's private directory (`private_dir.rs`).

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::duration;
use crate::environment::RETRY_AFTER_FILE;
use crate::events::Event;
use crate::private_dir::{PrivateDir, RETRY_AFTER_NAME};

/// At most this many bytes are read: a duration is short.
const LIMIT: usize = 64;

pub struct RetryAfter {
    /// None: no directory could be made, and the worker is told of no file.
    path: Option<PathBuf>,
    /// The file lies in drainit's private directory, new this run.
    private: bool,
}

impl RetryAfter {
    /// `$DRAINIT_RETRY_AFTER_FILE` if set (a path of the user's choosing),
    /// else a file in drainit's private directory; with neither, no file
    /// (and `environment::retry_after_file` removes an empty one inherited).
    pub fn new(dir: Option<&PrivateDir>) -> RetryAfter {
        if let Some(path) = std::env::var_os(RETRY_AFTER_FILE).filter(|p| !p.is_empty()) {
            return RetryAfter { path: Some(PathBuf::from(path)), private: false };
        }
        match dir {
            Some(dir) => RetryAfter { path: Some(dir.path().join(RETRY_AFTER_NAME)), private: true },
            None => RetryAfter { path: None, private: false },
        }
    }

    /// Whether it needs the private directory.
    pub fn wants_dir() -> bool {
        std::env::var_os(RETRY_AFTER_FILE).is_none_or(|p| p.is_empty())
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
