//! The retry-after file: a worker that exits with a backoff code may first
//! write the exact delay it wants there. drainit reads it once per backoff
//! exit, clamps it, and survives whatever a worker leaves at that path (a
//! read-only location, a directory, garbage, a FIFO, a link to /dev/zero)
//! with at most one warning.

mod kit;
use kit::*;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

/// The `delay=` of each `backoff` event, in order.
fn delays(run: &Running) -> Vec<Duration> {
    run.events().iter().filter(|e| e.name == "backoff").map(|e| e.duration("delay")).collect()
}

/// A recorder that exits 75 on its first attempt (after `first`), 0 on the next.
fn exits_75_then_0(dir: &Scratch, first: impl FnOnce(Recorder) -> Recorder) -> Recorder {
    Recorder::new(dir, "w").per_attempt().exit_after(0, 0).on_attempt(1, |r| first(r.exit_after(0, 75)))
}

/// drainit with a shell worker that exits 75 on its first attempt after
/// `first` (where the recorder cannot live: its own directory read-only),
/// and 0 on the second.
fn backoff_run(mode: Mode, first: &str) -> Builder {
    let script = format!("if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then {first}; exit 75; fi; exit 0");
    let options =
        ["--backoff-delay", "100ms", "--backoff-max-delay", "200ms", "--grace", "1s", "--orchestrator-timeout", "2s"];
    drainit(mode, with_sh(&options, &script))
}

#[test]
fn the_file_sets_the_exact_delay_and_is_removed() {
    let dir = Scratch::new("retry");
    let starts_file = path_str(&dir.path("starts"));
    let removed = path_str(&dir.path("removed"));
    // Attempt 1 asks for 300ms; attempt 2 notes whether the file is gone.
    let script = format!(
        "date +%s%N >> {starts_file}; \
         if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then echo 300ms > \"$DRAINIT_RETRY_AFTER_FILE\"; exit 75; fi; \
         [ -e \"$DRAINIT_RETRY_AFTER_FILE\" ] || touch {removed}; exit 0"
    );
    let mut run = drainit(Mode::Subreaper, with_sh(&["--backoff-delay", "5s"], &script)).spawn();
    let ended = run.wait(secs(10));
    assert_eq!(ended.code, Some(0), "{}", run.log());
    assert_eq!(delays(&run), [ms(300)], "{}", run.log());
    let starts: Vec<u64> = dir.lines("starts").iter().map(|l| l.parse().unwrap()).collect();
    let gap = Duration::from_nanos(starts[1] - starts[0]);
    assert!(gap >= ms(300) && gap < ms(1500), "{gap:?}");
    assert!(dir.exists("removed"), "drainit removes the file after reading it");
}

#[test]
fn a_file_left_from_before_does_not_count() {
    // drainit removes the file before every attempt (not when it exits): a
    // value a worker left behind, in this run or an earlier one, is never
    // read for a later backoff exit.
    let dir = Scratch::new("leftover");
    let file = dir.path("retry-after");
    std::fs::write(&file, "10ms").unwrap();
    let rec = exits_75_then_0(&dir, |r| r);
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--backoff-delay", "400ms"]))
        .env("DRAINIT_RETRY_AFTER_FILE", &file)
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let delays = delays(&run);
    assert!(delays.len() == 1 && delays[0] >= ms(200), "the normal delay, not 10ms: {delays:?}\n{}", run.log());
}

#[test]
fn the_delay_is_clamped_to_the_max_delay() {
    let dir = Scratch::new("clamp");
    let rec = exits_75_then_0(&dir, |r| r.retry_after("1h"));
    let options = ["--backoff-max-delay", "500ms", "--backoff-delay", "100ms"];
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(delays(&run), [ms(500)], "{}", run.log());
}

#[test]
fn garbage_warns_and_the_normal_delay_is_used() {
    let dir = Scratch::new("garbage");
    let rec = exits_75_then_0(&dir, |r| r.retry_after("soon-ish"));
    let mut run = drainit(Mode::Subreaper, rec.worker_with(&["--backoff-delay", "200ms"])).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let warning = run.event("retry_after_invalid").unwrap_or_else(|| panic!("{}", run.log()));
    assert!(warning.line.contains("soon-ish"), "{}", warning.line);
    let slept = delays(&run);
    assert!(slept.len() == 1 && slept[0] >= ms(100) && slept[0] <= ms(200), "{slept:?}");
}

/// Enter a new mount namespace in which `dir` is read-only.
fn read_only(dir: &std::path::Path) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
    move || {
        // SAFETY: unshare and mount with valid NUL-terminated strings that
        // live as long as the closure.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    target.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    std::ptr::null(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

per_mode! {
    /// DRAINIT_RETRY_AFTER_FILE in a read-only directory: the worker cannot
    /// write it, drainit restarts with the normal delay, and says nothing
    /// that is not an event.
    fn a_read_only_directory_still_restarts(mode) {
        let dir = Scratch::new("ro");
        std::fs::create_dir(dir.path("ro")).unwrap();
        let file = dir.path("ro/retry-after");
        let mut run = backoff_run(mode, "echo 50ms 2>/dev/null > \"$DRAINIT_RETRY_AFTER_FILE\"")
            .env("DRAINIT_RETRY_AFTER_FILE", &file)
            .before_exec(read_only(&dir.path("ro")))
            .spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?} read-only dir: {log}");
        assert_eq!(run.count_events("child_started"), 2, "{mode:?}: {log}");
        let stray: Vec<&str> = log.lines().filter(|l| !l.starts_with("drainit: event=")).collect();
        assert!(stray.is_empty(), "{mode:?}: {log}");
        check_log_end(&log, 0).unwrap();
    }
}

per_mode! {
    /// The default location, with all of the temporary directory read-only.
    fn a_read_only_tmp_still_restarts(mode) {
        let mut run = backoff_run(mode, "echo 50ms > \"$DRAINIT_RETRY_AFTER_FILE\" 2>/dev/null")
            .before_exec(read_only(&std::env::temp_dir()))
            .spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?} read-only /tmp: {log}");
        assert_eq!(run.count_events("child_started"), 2, "{mode:?}: {log}");
        check_log_end(&log, 0).unwrap();
    }
}

per_mode! {
    fn a_directory_at_the_path_is_one_warning(mode) {
        let dir = Scratch::new("ra-dir");
        std::fs::create_dir(dir.path("ra")).unwrap();
        let rec = exits_75_then_0(&dir, |r| r);
        let options = ["--backoff-delay", "100ms", "--backoff-max-delay", "200ms"];
        let mut run = drainit(mode, rec.worker_with(&options)).env("DRAINIT_RETRY_AFTER_FILE", dir.path("ra")).spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: {log}");
        assert_eq!(run.count_events("retry_after_invalid"), 1, "{mode:?}: {log}");
        check_log_end(&log, 0).unwrap();
    }
}

per_mode! {
    /// 1 MiB of garbage: a warning, a normal delay, and a line of sane length.
    fn a_mebibyte_of_garbage_is_one_short_warning(mode) {
        let dir = Scratch::new("ra-big");
        let mut run = backoff_run(mode, "head -c 1048576 /dev/urandom | base64 > \"$DRAINIT_RETRY_AFTER_FILE\"")
            .env("DRAINIT_RETRY_AFTER_FILE", dir.path("ra"))
            .spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", &log[..log.len().min(2000)]);
        let warning = run.event("retry_after_invalid").expect("a warning");
        assert!(warning.line.len() < 1000, "{mode:?}: a {}-byte warning line echoes the whole file", warning.line.len());
    }
}

per_mode! {
    /// A worker that leaves a FIFO as its retry-after file must not wedge
    /// drainit: reading it must not block.
    fn a_fifo_does_not_wedge_drainit(mode) {
        let dir = Scratch::new("ra-fifo");
        let mut run = backoff_run(mode, "mkfifo \"$DRAINIT_RETRY_AFTER_FILE\"")
            .env("DRAINIT_RETRY_AFTER_FILE", dir.path("ra"))
            .spawn();
        assert!(run.wait_log(&["event=child_exited", "code=75"], secs(10)), "{}", run.log());
        // Stuck opening the FIFO, drainit would never decide on the sleep.
        assert!(
            run.wait_event("backoff", secs(5)).is_some(),
            "{mode:?}: drainit is stuck opening the FIFO (no signal, no reaping, no deadline); log:\n{}",
            run.log()
        );
        let sent = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(4));
        eprintln!("fifo {mode:?}: exit {:?} {:?} after SIGTERM", ended.code, sent.elapsed());
        assert!(
            ended.code == Some(0) || ended.code == Some(143),
            "{mode:?}: restarted and stopped (143), or restarted and done (0); log:\n{}",
            run.log()
        );
    }
}

#[test]
fn a_link_to_dev_zero_is_not_read_forever() {
    let dir = Scratch::new("ra-zero");
    // A limit on address space keeps an endless read from hurting the
    // machine: Rust's read_to_string then fails with "out of memory" after
    // some 256 MiB instead of reading until the OOM killer comes.
    let mut run = backoff_run(Mode::Subreaper, "ln -s /dev/zero \"$DRAINIT_RETRY_AFTER_FILE\"")
        .env("DRAINIT_RETRY_AFTER_FILE", dir.path("ra"))
        .before_exec(|| {
            let limit = libc::rlimit { rlim_cur: 512 << 20, rlim_max: 512 << 20 };
            // SAFETY: setrlimit with a valid struct.
            unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
            Ok(())
        })
        .spawn();
    let mut peak = 0;
    let ended = wait_until(secs(20), || {
        peak = peak.max(HOST.memory_kib(run.pid).1);
        run.try_ended()
    });
    assert!(ended, "drainit still runs after 20s: {}", run.log());
    let ended = run.wait(secs(1));
    let log = run.log();
    eprintln!("dev/zero: exit {:?}, drainit VmHWM {peak} KiB; log:\n{log}", ended.code);
    assert_eq!(ended.code, Some(0), "{log}");
    check_log_end(&log, 0).unwrap();
    assert!(peak < 64 << 10, "drainit read /dev/zero into memory: VmHWM {peak} KiB");
}

/// The worker notes, in `dir`/note, where DRAINIT_RETRY_AFTER_FILE points,
/// that directory's mode and owner, and whether the variable is set at all.
fn note_the_file(dir: &std::path::Path) -> String {
    format!(
        "if [ -n \"${{DRAINIT_RETRY_AFTER_FILE+set}}\" ]; then \
           d=$(dirname \"$DRAINIT_RETRY_AFTER_FILE\"); echo \"$DRAINIT_RETRY_AFTER_FILE $(stat -c '%a %u' \"$d\")\" > {note}; \
         else echo unset > {note}; fi",
        note = path_str(&dir.join("note"))
    )
}

per_mode! {
    /// Unless the user names it, the file lies in a directory drainit made
    /// for itself under $TMPDIR: mode 0700, owned by drainit's user, a new
    /// name each run, removed when drainit exits.
    fn the_default_file_lives_in_a_private_directory(mode) {
        let dir = Scratch::new("ra-private");
        let mut seen = Vec::new();
        for _ in 0..2 {
            let mut run = drainit(mode, sh(&note_the_file(&dir.0))).env("TMPDIR", &dir.0).spawn();
            assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
            let note = dir.read("note");
            let mut fields = note.split_whitespace();
            let (file, mode_bits, owner) = (fields.next().unwrap(), fields.next().unwrap(), fields.next().unwrap());
            let parent = std::path::Path::new(file).parent().unwrap().to_path_buf();
            assert_eq!(parent.parent(), Some(dir.0.as_path()), "{file} is not in a directory under $TMPDIR");
            assert_eq!((mode_bits, owner), ("700", "0"), "{file}");
            assert!(!parent.exists(), "{} outlived drainit", parent.display());
            seen.push(parent);
        }
        assert_ne!(seen[0], seen[1], "the same directory name twice");
    }
}

per_mode! {
    /// The worker can fill drainit's private directory (same uid): nothing
    /// whose size it chooses may stand between the stop and the deadline,
    /// nor between the deadline and drainit's exit. 200,000 files, a
    /// worker that ignores SIGTERM, a 2s orchestrator timeout: drainit
    /// exits before the orchestrator's SIGKILL, leaves the directory (one
    /// warning) and still exits with the deadline's code.
    fn what_the_worker_leaves_in_the_directory_costs_no_time(mode) {
        let dir = Scratch::new("ra-full");
        let script = "import os, signal, sys, time\n\
            d = os.path.dirname(os.environ['DRAINIT_RETRY_AFTER_FILE'])\n\
            for i in range(200000):\n    open(os.path.join(d, str(i)), 'w').close()\n\
            signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
            print('ready', file=sys.stderr, flush=True)\n\
            time.sleep(60)\n";
        let args = ["--grace", "1s", "--orchestrator-timeout", "2s", "--", "python3", "-c", script];
        let mut run = drainit(mode, args).env("TMPDIR", &dir.0).spawn();
        assert!(run.wait_log(&["ready"], secs(60)), "{}", run.log());
        let stop = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(30));
        let took = stop.elapsed();
        assert_eq!(ended.code, Some(137), "{}", run.log());
        assert!(took < secs(2), "drainit exited {took:?} after SIGTERM, past the orchestrator's SIGKILL at 2s: {}", run.log());
        let left = run.events().into_iter().find(|e| e.name == "file_skipped" && e.get("what") == Some("private_dir"));
        assert!(left.is_some(), "the directory left in place is said: {}", run.log());
    }
}

/// Where the file once was, `$TMPDIR/drainit-PID.retry-after` (PID 1 in a
/// container), a link planted by another user is never followed: drainit
/// does not use that name at all.
#[test]
fn a_link_at_the_old_predictable_name_is_never_followed() {
    let dir = Scratch::new("ra-planted");
    let target = dir.path("victim");
    std::fs::write(&target, "").unwrap();
    std::os::unix::fs::symlink(&target, dir.path("drainit-1.retry-after")).unwrap();
    let script = "if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then echo 10ms > \"$DRAINIT_RETRY_AFTER_FILE\"; exit 75; fi; exit 0";
    let mut run = drainit(Mode::Pid1, sh(script)).env("TMPDIR", &dir.0).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "", "written through the planted link");
    assert_eq!(delays(&run), [ms(10)], "{}", run.log());
}

per_mode! {
    /// With $TMPDIR, /tmp and /dev/shm all read-only: one warning, no
    /// variable for the worker (not even an empty one it would have
    /// inherited), and backoff with the normal delays.
    fn without_a_writable_place_one_warning_and_no_file(mode) {
        // The worker says on its stdout (what the read-only mounts cannot
        // reach, wherever the test's own files are) whether it got the variable.
        let script = "if [ -n \"${DRAINIT_RETRY_AFTER_FILE+set}\" ]; then echo set; else echo unset; fi; \
                      if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then exit 75; fi; exit 0";
        let options = ["--backoff-delay", "100ms", "--backoff-max-delay", "200ms"];
        let mut run = drainit(mode, with_sh(&options, script))
            .env_remove("TMPDIR")
            .env("DRAINIT_RETRY_AFTER_FILE", "")
            .before_exec(read_only(std::path::Path::new("/tmp")))
            .before_exec(read_only(std::path::Path::new("/dev/shm")))
            .spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(0), "{log}");
        assert_eq!(run.count_events("retry_after_unavailable"), 1, "{log}");
        assert_eq!(run.count_events("child_started"), 2, "{log}");
        assert_eq!(run.stdout(), "unset\nunset\n", "both attempts: no variable");
        let slept = delays(&run);
        assert!(slept.len() == 1 && slept[0] >= ms(50) && slept[0] <= ms(100), "{slept:?}");
    }
}

/// Where the worker's note says the private directory was.
fn noted_dir(dir: &Scratch) -> std::path::PathBuf {
    let note = dir.read("note");
    let file = note.split_whitespace().next().unwrap_or_else(|| panic!("no note: {note:?}"));
    std::path::Path::new(file).parent().unwrap().to_path_buf()
}

per_mode! {
    /// Without $TMPDIR, /dev/shm comes first (a private tmpfs in every
    /// container; a disk's mkdir would sit on every start), then /tmp.
    fn without_tmpdir_the_directory_is_under_dev_shm_then_tmp(mode) {
        let dir = Scratch::new("ra-order");
        let mut run = drainit(mode, sh(&note_the_file(&dir.0))).env_remove("TMPDIR").spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let private = noted_dir(&dir);
        assert_eq!(private.parent(), Some(std::path::Path::new("/dev/shm")), "{mode:?}: {}", private.display());
        let mut run = drainit(mode, sh(&note_the_file(&dir.0)))
            .env_remove("TMPDIR")
            .before_exec(read_only(std::path::Path::new("/dev/shm")))
            .spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let private = noted_dir(&dir);
        assert_eq!(private.parent(), Some(std::path::Path::new("/tmp")), "{mode:?}: {}", private.display());
        assert_eq!(run.count_events("retry_after_unavailable"), 0, "{}", run.log());
    }
}

per_mode! {
    /// A relative $TMPDIR is taken from drainit's working directory (the
    /// one the worker starts in) and the worker is told an absolute path:
    /// one that still holds after the worker changes directory.
    fn a_relative_tmpdir_gives_an_absolute_path(mode) {
        let dir = Scratch::new("ra-relative");
        std::fs::create_dir(dir.path("tmp")).unwrap();
        let script = format!("cd /; {}", note_the_file(&dir.0));
        let mut run = drainit(mode, sh(&script)).env("TMPDIR", "tmp").current_dir(&dir.0).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let private = noted_dir(&dir);
        assert!(private.is_absolute(), "{mode:?}: {}", private.display());
        assert_eq!(private.parent(), Some(dir.path("tmp").as_path()), "{mode:?}: {}", private.display());
    }
}

per_mode! {
    /// No restart follows a stop, so nothing reads the retry-after file
    /// after one: the private directory goes as the stop signal goes out
    /// (its rmdir then runs while the worker winds down, not between the
    /// worker's exit and drainit's). With a readiness option the notify
    /// socket lives there and is read until exit: the directory stays
    /// until then.
    fn the_directory_goes_at_the_stop_unless_the_socket_lives_there(mode) {
        for (options, want) in [(&[][..], "gone"), (&["--ready-file", "READY"][..], "there")] {
            let dir = Scratch::new("ra-at-stop");
            let ready = path_str(&dir.path("ready"));
            let options: Vec<&str> = options.iter().map(|o| if *o == "READY" { ready.as_str() } else { o }).collect();
            // In the trap: up to 5 s for the directory to go; "there" when
            // it outlives them. With the socket, 0.3 s is the window in
            // which it must not go.
            let patience = if want == "gone" { 250 } else { 15 };
            let script = format!(
                "d=$(dirname \"$DRAINIT_RETRY_AFTER_FILE\"); echo \"$d\" > {path}; \
                 trap 'i=0; while [ -d \"$d\" ] && [ $i -lt {patience} ]; do sleep 0.02; i=$((i+1)); done; \
                       if [ -d \"$d\" ]; then echo there; else echo gone; fi >> {path}; exit 0' TERM; \
                 echo ready >&2; while :; do sleep 0.05; done",
                path = path_str(&dir.path("note"))
            );
            let mut run = drainit(mode, with_sh(&options, &script)).env("TMPDIR", &dir.0).spawn();
            assert!(run.wait_log(&["ready"], secs(10)), "{mode:?}: {}", run.log());
            run.signal(libc::SIGTERM);
            assert!(run.wait(secs(15)).code.is_some(), "{}", run.log());
            let note = dir.read("note");
            let lines: Vec<&str> = note.lines().collect();
            assert_eq!(lines.get(1), Some(&want), "{mode:?} {options:?}: {note} {}", run.log());
            assert!(!std::path::Path::new(lines[0]).exists(), "{} outlived drainit", lines[0]);
        }
    }
}
