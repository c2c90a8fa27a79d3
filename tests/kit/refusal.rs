//! Bad configuration, as every option's tests check it: drainit exits 2 with
//! one clear line naming the value and why, and the worker never starts.

use super::{Mode, Scratch, drainit, one_clear_line, path_str, secs};

/// Run drainit with `args` and `env` (its options only: the worker, which
/// would touch a file, is added here) and require the refusal: exit 2, the
/// worker never ran, and one line with "error" in the log naming `needle`.
pub fn assert_refused(args: &[&str], env: &[(&str, &str)], needle: &str) {
    let dir = Scratch::new("refused");
    let marker = dir.path("ran");
    let all = args.iter().map(|s| s.to_string()).chain(["--".into(), "touch".into(), path_str(&marker)]);
    let mut builder = drainit(Mode::Subreaper, all);
    for (k, v) in env {
        builder = builder.env(k, v);
    }
    let mut run = builder.spawn();
    let ended = run.wait(secs(10));
    let log = run.log();
    assert_eq!(ended.code, Some(2), "{args:?} {env:?}: {log}");
    assert!(!marker.exists(), "{args:?} {env:?}: the worker ran");
    assert_eq!(log.lines().count(), 1, "{args:?} {env:?}: one line, got:\n{log}");
    assert!(log.starts_with("drainit: error: "), "{log}");
    one_clear_line(&log, needle).unwrap_or_else(|e| panic!("{args:?} {env:?}: {e}"));
}
