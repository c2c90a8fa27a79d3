//! The tools a test needs: found, or a failure that names the package to
//! install (scripts/prepare deps installs them all). Never a skip.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// `name` as an executable in PATH or the sbin directories (a root
/// daemon's binaries live there).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// `name`'s path, or a panic saying which Debian package has it.
pub fn need_program(name: &str, package: &str) -> PathBuf {
    find_program(name).unwrap_or_else(|| {
        panic!(
            "this test needs `{name}` and it is not installed: `scripts/prepare deps` installs it \
             (Debian: `apt-get install -y {package}`); a missing tool fails the test, never skips it"
        )
    })
}
