//! A script without `#!` runs through /bin/sh, as execvp runs it (POSIX:
//! on ENOEXEC the file is given to the shell): in the dynamic build, whose
//! glibc does that, and in the static one, whose musl does not, so drainit
//! does it itself. As the worker, found by a path or in PATH, and as the
//! finish program. The CI runs this file against both builds.

mod kit;
use kit::*;

use std::os::unix::fs::PermissionsExt;

/// An executable script without `#!` at `dir/name` that writes its `$0`
/// and arguments to `dir/marker`, then exits 3.
fn script(dir: &Scratch, name: &str) -> String {
    let path = dir.path(name);
    let body = format!("printf '%s|' \"$0\" \"$@\" > {}\nexit 3\n", path_str(&dir.path("marker")));
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path_str(&path)
}

per_mode! {
    /// Named by its path: run by the shell with its arguments, and its
    /// exit code is drainit's.
    fn a_script_without_a_hashbang_runs_as_the_worker(mode) {
        let dir = Scratch::new("nohashbang");
        let path = script(&dir, "job");
        let mut run = drainit(mode, ["--", path.as_str(), "a b", "c"]).spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(3), "{mode:?}: the script's own code; log:\n{log}");
        assert_eq!(dir.read("marker"), format!("{path}|a b|c|"), "{mode:?}: $0 is the script, then its arguments");
        assert_eq!(run.count_events("exec_failed"), 0, "{mode:?}: {log}");
    }
}

per_mode! {
    /// Found in PATH, after a directory where the name is not executable
    /// (EACCES there must not end the search) and one where it is missing.
    fn a_script_without_a_hashbang_is_found_in_path(mode) {
        let dir = Scratch::new("nohashbang-path");
        for sub in ["denied", "empty", "bin"] {
            std::fs::create_dir(dir.path(sub)).unwrap();
        }
        std::fs::write(dir.path("denied/job"), "exit 9\n").unwrap();
        let path = script(&dir, "bin/job");
        let search = format!(
            "{}:{}:{}:{}",
            path_str(&dir.path("denied")),
            path_str(&dir.path("empty")),
            path_str(&dir.path("bin")),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut run = drainit(mode, ["--", "job", "x"]).env("PATH", &search).spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(3), "{mode:?}: {log}");
        assert_eq!(dir.read("marker"), format!("{path}|x|"), "{mode:?}: {log}");
    }
}

per_mode! {
    /// The finish program may be such a script too.
    fn a_finish_script_without_a_hashbang_runs(mode) {
        let dir = Scratch::new("nohashbang-finish");
        let path = script(&dir, "finish");
        let mut run = drainit(mode, ["--finish", path.as_str(), "--", "true"]).spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: the worker's code, whatever the finish program's; log:\n{log}");
        assert_eq!(dir.read("marker"), format!("{path}|"), "{mode:?}: the finish script did not run; log:\n{log}");
        let finished = run.event("finish_exited").unwrap_or_else(|| panic!("{mode:?}: {log}"));
        assert_eq!(finished.get("code"), Some("3"), "{mode:?}: {log}");
    }
}
