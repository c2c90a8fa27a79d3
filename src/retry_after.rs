//! The retry-after file: where a worker that exits with a backoff code may
//! write the exact delay it wants (a DURATION). The worker controls the file,
//! so drainit reads it as untrusted input.

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::config;
use crate::events::Event;

/// The variable that names the file, in the worker's environment (and, when
/// the user sets it, in drainit's: a path of their choosing).
pub const VAR: &str = "DRAINIT_RETRY_AFTER_FILE";

/// At most this many bytes are read: a duration is short.
const LIMIT: usize = 64;

pub struct RetryAfter {
    path: PathBuf,
}

impl RetryAfter {
    /// `$DRAINIT_RETRY_AFTER_FILE` if set, else `$TMPDIR/drainit-PID.retry-after`.
    pub fn new() -> RetryAfter {
        let path = match std::env::var_os(VAR) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => std::env::temp_dir().join(format!("drainit-{}.retry-after", std::process::id())),
        };
        RetryAfter { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the file (before an attempt starts: an old value must not
    /// count). A missing file is fine.
    pub fn clear(&self) {
        let _ = fs::remove_file(&self.path);
    }

    /// The delay the worker asked for, if it wrote a valid one; the file is
    /// removed once read. Anything else is one warning and the normal delay.
    pub fn take(&self) -> Option<Duration> {
        let warn = |error: String| Event::RetryAfterInvalid { path: self.path.display().to_string(), error }.emit();
        let text = match read_small(&self.path) {
            Ok(Some(text)) => text,
            Ok(None) => return None,
            Err(error) => {
                warn(error);
                self.clear();
                return None;
            }
        };
        self.clear();
        match config::parse_duration(&text) {
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
