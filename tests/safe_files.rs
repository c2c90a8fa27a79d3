//! The files drainit (root, in most containers) creates, removes or writes
//! for others: a worker that owns a directory on the path may swap a part
//! of it for a link; drainit then warns and touches nothing through it. An
//! administrator's own link (`/var/run -> /run`: owned by root, in a
//! directory only root may write) is followed as before.

mod kit;
use kit::*;

use std::os::unix::fs::{lchown, symlink};

/// A user that is not root: a worker that dropped its privileges.
const WORKER_UID: u32 = 65534;

/// `dir/owned` belongs to the worker, who made `owned/sub` a link to
/// `dir/victim`, root's: a drain file and a termination log under
/// `owned/sub` would be root's files in `victim`.
fn planted(dir: &Scratch) -> (String, String) {
    std::fs::create_dir(dir.path("owned")).unwrap();
    std::fs::create_dir(dir.path("victim")).unwrap();
    std::os::unix::fs::chown(dir.path("owned"), Some(WORKER_UID), Some(WORKER_UID)).unwrap();
    symlink(dir.path("victim"), dir.path("owned/sub")).unwrap();
    lchown(dir.path("owned/sub"), Some(WORKER_UID), Some(WORKER_UID)).unwrap();
    (path_str(&dir.path("owned/sub/drain")), path_str(&dir.path("owned/sub/tlog")))
}

fn skipped(run: &Running, what: &str) -> usize {
    run.events().iter().filter(|e| e.name == "file_skipped" && e.get("what") == Some(what)).count()
}

per_mode! {
    /// A stale drain file is removed at start: never the victim's file
    /// through the planted link.
    fn a_planted_link_in_the_path_is_not_unlinked_through(mode) {
        let dir = Scratch::new("safe-unlink");
        let (drain, _) = planted(&dir);
        std::fs::write(dir.path("victim/drain"), "keep").unwrap();
        let rec = Recorder::new(&dir, "w");
        let mut run = drainit(mode, rec.worker_with(&["--drain-file", &drain])).spawn();
        assert!(rec.wait_ready(secs(10)), "{mode:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
        assert_eq!(dir.read("victim/drain"), "keep", "{mode:?}: unlinked through the link; log:\n{}", run.log());
        assert!(skipped(&run, "drain_file") >= 1, "{mode:?}: no warning; log:\n{}", run.log());
    }
}

per_mode! {
    /// At the stop: no drain file created through the link, and no
    /// termination message written through it; one warning each.
    fn a_planted_link_in_the_path_is_not_written_through(mode) {
        let dir = Scratch::new("safe-create");
        let (drain, tlog) = planted(&dir);
        std::fs::write(dir.path("victim/tlog"), "").unwrap();
        let rec = Recorder::new(&dir, "w");
        let options = ["--drain-file", &drain, "--termination-log", &tlog];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)), "{mode:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
        let log = run.log();
        assert!(!dir.exists("victim/drain"), "{mode:?}: drain file created through the link; log:\n{log}");
        assert_eq!(dir.read("victim/tlog"), "", "{mode:?}: termination log written through the link; log:\n{log}");
        assert_eq!(skipped(&run, "drain_file"), 2, "{mode:?}: at start and at the stop; log:\n{log}");
        assert_eq!(skipped(&run, "termination_log"), 1, "{mode:?}: {log}");
    }
}

cases! {
    /// Root's own links, relative and absolute, in a directory only root
    /// may write: followed, as /var/run -> /run is.
    fn a_root_owned_link_is_followed(relative: bool) {
        let dir = Scratch::new("safe-root-link");
        std::fs::create_dir(dir.path("real")).unwrap();
        let target = if relative { std::path::PathBuf::from("real") } else { dir.path("real") };
        symlink(target, dir.path("run")).unwrap();
        std::fs::write(dir.path("real/tlog"), "").unwrap();
        std::fs::write(dir.path("real/drain"), "stale").unwrap();
        let drain = path_str(&dir.path("run/drain"));
        let tlog = path_str(&dir.path("run/tlog"));
        let rec = Recorder::new(&dir, "w");
        let options = ["--drain-file", &drain, "--termination-log", &tlog];
        let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        assert!(!dir.exists("real/drain"), "the stale drain file stays; log:\n{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let log = run.log();
        assert!(dir.exists("real/drain"), "no drain file through root's link; log:\n{log}");
        assert!(dir.read("real/tlog").starts_with("drainit: code=0 "), "{:?}; log:\n{log}", dir.read("real/tlog"));
        assert_eq!(run.count_events("file_skipped"), 0, "{log}");
    }
    case relative(true);
    case absolute(false);
}

/// A link root made, but in a directory the worker may write (it could
/// have replaced it): not followed.
#[test]
fn a_root_link_in_a_worker_directory_is_not_followed() {
    let dir = Scratch::new("safe-root-in-worker");
    std::fs::create_dir(dir.path("owned")).unwrap();
    std::fs::create_dir(dir.path("victim")).unwrap();
    symlink(dir.path("victim"), dir.path("owned/sub")).unwrap();
    std::os::unix::fs::chown(dir.path("owned"), Some(WORKER_UID), Some(WORKER_UID)).unwrap();
    let drain = path_str(&dir.path("owned/sub/drain"));
    let rec = Recorder::new(&dir, "w");
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--drain-file", &drain])).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert!(!dir.exists("victim/drain"), "{}", run.log());
}

/// Root's links in a chain, with `..` in a target: resolved part by part
/// as the kernel would.
#[test]
fn a_chain_of_root_links_with_dotdot_is_followed() {
    let dir = Scratch::new("safe-chain");
    std::fs::create_dir_all(dir.path("a/real")).unwrap();
    std::fs::create_dir(dir.path("b")).unwrap();
    // run -> b/hop -> ../a/./real
    symlink("b/hop", dir.path("run")).unwrap();
    symlink("../a/./real", dir.path("b/hop")).unwrap();
    let drain = path_str(&dir.path("run/drain"));
    let rec = Recorder::new(&dir, "w");
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--drain-file", &drain])).spawn();
    assert!(rec.wait_ready(secs(10)), "{}", run.log());
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert!(dir.exists("a/real/drain"), "{}", run.log());
    assert_eq!(run.count_events("file_skipped"), 0, "{}", run.log());
}
