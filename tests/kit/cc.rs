//! Compile the C workers the tests run (sigrec.c, bomb.c, orphans.c).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// Compile `source` (C) into an executable named after `name` and a hash of
/// the source, under cargo's per-target scratch directory; compiled once,
/// shared by every test (and every later run) that asks for the same source.
/// The compiler is $CC, else gcc.
pub fn c_helper(name: &str, source: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut hasher = DefaultHasher::new();
    source.hash(&mut hasher);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("drainit-helpers");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(format!("{name}-{:016x}", hasher.finish()));
    if exe.exists() {
        return exe;
    }
    // Per-process names: test binaries of one `cargo test` run in turn, but
    // two `cargo test` runs may share the directory.
    let src = dir.join(format!("{name}-{}.c", std::process::id()));
    let tmp = dir.join(format!("{name}-{}.tmp", std::process::id()));
    std::fs::write(&src, source).unwrap();
    let cc = std::env::var_os("CC").unwrap_or_else(|| "gcc".into());
    let out = Command::new(&cc).args(["-O2", "-Wall", "-o"]).arg(&tmp).arg(&src).output().unwrap_or_else(|e| {
        panic!(
            "{}: {e}: the tests compile their C workers with it; `scripts/prepare deps` installs gcc \
                 (Debian: `apt-get install -y gcc libc6-dev`)",
            cc.to_string_lossy()
        )
    });
    assert!(out.status.success(), "compiling {name}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &exe).unwrap();
    let _ = std::fs::remove_file(&src);
    exe
}
