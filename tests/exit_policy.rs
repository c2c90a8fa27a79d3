//! The exit status policy (`--remap-exit`) and the termination message:
//! the code drainit exits with after running the worker may be remapped,
//! and one summary line goes to the termination log when it is an empty
//! regular file.

mod kit;
use kit::*;

use std::path::Path;

per_mode! {
    /// A worker killed by SIGTERM's default action exits 0 under 143:0, and
    /// the exit event says what it was.
    fn a_sigterm_death_remapped_to_success(mode) {
        let dir = Scratch::new("remap");
        let rec = Recorder::new(&dir, "w").term(Term::Default);
        let mut run = drainit(mode, rec.worker_with(&["--remap-exit", "143:0"])).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let exit = run.event("exit").unwrap();
        assert_eq!((&exit["code"], &exit["remapped_from"]), ("0", "143"));
        check_log_end(&run.log(), 0).unwrap();
    }
}

per_mode! {
    /// Codes the table does not name pass through; the variable works too.
    fn other_codes_are_unchanged(mode, code: i32, remap: &str, want: i32) {
        let mut run = drainit(mode, sh(&format!("exit {code}"))).env("DRAINIT_REMAP_EXIT", remap).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(want), "{}", run.log());
        let exit = run.event("exit").unwrap();
        assert_eq!(exit.get("remapped_from").is_some(), code != want, "{}", exit.line);
    }
    case unnamed(3, "143:0", 3);
    case named(3, "143:0,3:42", 42);
    case zero_to_one(0, "0:1", 1);
}

cases! {
    /// Refused with one line, exit 2, no worker.
    fn refused(args: &[&str], env: &[(&str, &str)], needle: &str) {
        assert_refused(args, env, needle);
    }
    case no_colon(&["--remap-exit", "143"], &[], "'143' is not FROM:TO");
    case letters(&["--remap-exit", "a:b"], &[], "'a' is not an exit code");
    case from_too_big(&["--remap-exit", "256:0"], &[], "'256' is not an exit code from 0 to 255");
    case to_too_big(&["--remap-exit", "1:256"], &[], "'256'");
    case negative(&["--remap-exit", "-1:0"], &[], "'-1'");
    case three_parts(&["--remap-exit", "143:0:1"], &[], "'0:1'");
    case two_tos(&["--remap-exit", "143:0", "--remap-exit", "143:1"], &[], "143 is already remapped to 0");
    case two_tos_in_the_variable(&[], &[("DRAINIT_REMAP_EXIT", "143:0,143:1")], "DRAINIT_REMAP_EXIT");
    case empty_flag(&["--remap-exit", ""], &[], "--remap-exit");
    case empty_variable(&[], &[("DRAINIT_REMAP_EXIT", "")], "DRAINIT_REMAP_EXIT is set but empty");
    case empty_termination_log(&[], &[("DRAINIT_TERMINATION_LOG", "")], "DRAINIT_TERMINATION_LOG is set but empty");
}

/// The same FROM twice with the same TO is no contradiction.
#[test]
fn the_same_pair_twice_is_accepted() {
    let mut run =
        drainit(Mode::Subreaper, ["--remap-exit", "3:0", "--remap-exit", "3:0", "--", "sh", "-c", "exit 3"]).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
}

/// The logfmt pairs of the termination log's one line.
fn summary(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(text.len() <= 4096);
    let line = text.trim_end().strip_prefix("drainit: ").unwrap_or_else(|| panic!("{text:?}"));
    logfmt(line).unwrap_or_else(|| panic!("not logfmt: {line:?}"))
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    pairs.iter().find(|(k, _)| k == key).map_or_else(|| panic!("no {key} in {pairs:?}"), |(_, v)| v.as_str())
}

per_mode! {
    /// After a deadline kill: 137, the deadline, how many it killed, the
    /// stop and how long it took.
    fn the_termination_message_after_a_deadline_kill(mode) {
        let dir = Scratch::new("termlog");
        let log = dir.path("termination-log");
        std::fs::write(&log, "").unwrap();
        let rec = Recorder::new(&dir, "w").term(Term::Ignore).child(Recorder::new(&dir, "c").term(Term::Ignore));
        let options = ["--termination-log", &path_str(&log), "--grace", "1s", "--orchestrator-timeout", "3s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(137));
        let s = summary(&log);
        let keys: Vec<&str> = s.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["code", "worker", "deadline_reached", "killed", "stop", "stop_took", "attempts"]);
        assert_eq!((get(&s, "code"), get(&s, "worker"), get(&s, "deadline_reached")), ("137", "signal:SIGKILL", "1"));
        assert_eq!(get(&s, "killed"), run.event("deadline_reached").unwrap()["remaining"].to_string());
        assert!(get(&s, "killed").parse::<u32>().unwrap() >= 2, "the worker and its child");
        assert_eq!((get(&s, "stop"), get(&s, "attempts")), ("SIGTERM", "1"));
        let took = parse_duration(get(&s, "stop_took")).unwrap();
        assert!(took >= secs(1) && took < secs(3), "{took:?}");
    }
}

per_mode! {
    /// After a plain exit: the code, no deadline, no stop; with a remap,
    /// what it was remapped from.
    fn the_termination_message_after_a_plain_exit(mode) {
        let dir = Scratch::new("termlog-plain");
        let log = dir.path("termination-log");
        std::fs::write(&log, "").unwrap();
        let options = ["--termination-log", &path_str(&log), "--remap-exit", "4:0"];
        let mut run = drainit(mode, with_sh(&options, "exit 4")).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "drainit: code=0 remapped_from=4 worker=exited:4 deadline_reached=0 killed=0 stop=none attempts=1\n"
        );
    }
}

/// What drainit leaves at the path in each case, and whether it warned.
fn termination_log_case(setup: impl FnOnce(&Path), option: Option<&str>) -> (Scratch, String) {
    let dir = Scratch::new("termlog-case");
    let path = dir.path("termination-log");
    setup(&path);
    let arg = option.map_or_else(|| path_str(&path), str::to_string);
    let mut run = drainit(Mode::Subreaper, with_sh(&["--termination-log", &arg], "exit 3")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(3), "{}", run.log());
    (dir, run.log())
}

#[test]
fn a_workers_own_message_is_kept_byte_for_byte() {
    let mine = b"worker: lease lost\n\xff\x00 bytes".to_vec();
    let (dir, log) = termination_log_case(|p| std::fs::write(p, b"worker: lease lost\n\xff\x00 bytes").unwrap(), None);
    assert_eq!(std::fs::read(dir.path("termination-log")).unwrap(), mine);
    assert!(!log.contains("file_skipped"), "{log}");
}

#[test]
fn a_missing_path_is_never_created() {
    let (dir, log) = termination_log_case(|_| {}, None);
    assert!(!dir.exists("termination-log"));
    assert!(!log.contains("file_skipped"), "{log}");
}

#[test]
fn off_writes_nothing() {
    let (dir, _) = termination_log_case(|p| std::fs::write(p, "").unwrap(), Some("off"));
    assert_eq!(dir.read("termination-log"), "");
}

#[test]
fn a_fifo_at_the_path_does_not_hang_drainit() {
    let (dir, log) = termination_log_case(
        |p| {
            let c = std::ffi::CString::new(path_str(p)).unwrap();
            // SAFETY: mkfifo with a valid path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        },
        None,
    );
    assert!(dir.exists("termination-log"));
    assert!(log.contains("event=file_skipped what=termination_log"), "{log}");
}

#[test]
fn a_fifo_with_a_reader_is_not_written_either() {
    let dir = Scratch::new("termlog-fifo-reader");
    let path = dir.path("termination-log");
    let c = std::ffi::CString::new(path_str(&path)).unwrap();
    // SAFETY: mkfifo and open with a valid path.
    let reader = unsafe {
        assert_eq!(libc::mkfifo(c.as_ptr(), 0o600), 0);
        libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC)
    };
    assert!(reader >= 0);
    let mut run = drainit(Mode::Subreaper, with_sh(&["--termination-log", &path_str(&path)], "exit 3")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(3));
    let mut buf = [0u8; 64];
    // SAFETY: reading into a valid buffer from our fd, then closing it.
    let n = unsafe {
        let n = libc::read(reader, buf.as_mut_ptr().cast(), buf.len());
        libc::close(reader);
        n
    };
    assert!(n <= 0, "drainit wrote into the FIFO");
    assert!(run.log().contains("event=file_skipped what=termination_log"), "{}", run.log());
}

#[test]
fn a_link_at_the_path_is_not_followed() {
    let dir = Scratch::new("termlog-link");
    let target = dir.path("target");
    std::fs::write(&target, "").unwrap();
    let path = dir.path("termination-log");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let mut run = drainit(Mode::Subreaper, with_sh(&["--termination-log", &path_str(&path)], "exit 3")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(3));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "", "written through the link");
    assert!(run.log().contains("event=file_skipped what=termination_log"), "{}", run.log());
}

#[test]
fn a_directory_at_the_path_is_one_warning() {
    let (_dir, log) = termination_log_case(|p| std::fs::create_dir(p).unwrap(), None);
    assert_eq!(log.matches("event=file_skipped").count(), 1, "{log}");
}
