//! A hostile environment: closed or full standard streams, a huge
//! environment, arguments and a command that are not UTF-8, resource limits.
//! drainit either works or fails with one clear line and a truthful exit
//! code; it never panics.
//!
//! Measurements go to stderr (`cargo test --test environment -- --nocapture`).

mod kit;
use kit::*;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

per_mode! {
    fn closed_stdio_still_works(mode) {
        let dir = Scratch::new("closed");
        let rec = Recorder::new(&dir, "w").exit_after(200, 5);
        let mut run = drainit(mode, rec.worker()).stdin(Io::Closed).stdout(Io::Closed).stderr(Io::Closed).spawn();
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(5), "{mode:?}: the worker's code with fds 0-2 closed");
    }
}

per_mode! {
    fn stdout_and_stderr_on_dev_full_still_work(mode) {
        let dir = Scratch::new("full");
        let rec = Recorder::new(&dir, "w");
        let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let mut run = drainit(mode, rec.worker_with(&["-vv"])).stdout(full()).stderr(full()).spawn();
        assert!(rec.wait_ready(secs(10)), "{mode:?}: worker never started");
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(5)), "{mode:?}: forwarded while logging into /dev/full");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: the worker's code");
    }
}

per_mode! {
    fn a_huge_environment_reaches_the_worker(mode, count: usize, size: usize) {
        let dir = Scratch::new("env");
        let out = path_str(&dir.path("count"));
        let script = format!("env | grep -c '^BIG_' > {out}; printf %s \"$BIG_{:06}\" | wc -c >> {out}", count - 1);
        let mut builder = drainit(mode, sh(&script));
        let value = "x".repeat(size - 12);
        for i in 0..count {
            builder = builder.env(format!("BIG_{i:06}"), &value);
        }
        let mut run = builder.spawn();
        let ended = run.wait(secs(20));
        assert_eq!(ended.code, Some(0), "{mode:?} {count}x{size}: {}", run.log());
        let lines = dir.lines("count");
        let want = [count.to_string(), value.len().to_string()];
        assert_eq!(lines.iter().map(|l| l.trim()).collect::<Vec<_>>(), want, "{mode:?}: {lines:?}");
        check_log_end(&run.log(), 0).unwrap();
    }
    // 1 MiB as 1,024 variables of 1 KiB, and as 16,384 variables of 64 bytes.
    case kib_values(1024, 1024);
    case small_values(16_384, 64);
}

per_mode! {
    /// A worker argument and an environment value with invalid UTF-8 arrive
    /// byte for byte.
    fn non_utf8_arguments_arrive_byte_for_byte(mode) {
        let dir = Scratch::new("bytes");
        let out = dir.path("arg");
        let arg = OsString::from_vec(b"caf\xe9 \xff\xfe".to_vec());
        let env = OsStr::from_bytes(b"\xc3\x28");
        let args: Vec<OsString> = vec![
            "--".into(),
            "sh".into(),
            "-c".into(),
            "printf %s \"$1\" > \"$0\"; printf %s \"$WEIRD\" >> \"$0\"".into(),
            out.clone().into_os_string(),
            arg.clone(),
        ];
        let mut run = drainit(mode, args).env("WEIRD", env).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
        let mut want = arg.as_bytes().to_vec();
        want.extend(env.as_bytes());
        assert_eq!(std::fs::read(&out).unwrap(), want, "{mode:?}");
        check_log_end(&run.log(), 0).unwrap();
    }
}

per_mode! {
    /// A command whose name is not UTF-8 is found and run.
    fn a_non_utf8_command_runs(mode) {
        let dir = Scratch::new("bytes-cmd");
        let mut name = dir.0.clone().into_os_string().into_vec();
        name.extend(b"/w\xff");
        let script = std::path::PathBuf::from(OsString::from_vec(name));
        std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut run = drainit(mode, [OsString::from("--"), script.into_os_string()]).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(3), "{mode:?}: {}", run.log());
        check_log_end(&run.log(), 3).unwrap();
    }
}

per_mode! {
    /// A command whose name is not UTF-8 and is not found: 127, one line.
    fn a_missing_non_utf8_command_is_127(mode) {
        let missing = OsString::from_vec(b"no-such-\xff\xfe-command".to_vec());
        let mut run = drainit(mode, [OsString::from("--"), missing]).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(127), "{mode:?}: {}", run.log());
        let log = run.log();
        one_clear_line(&log.replace("exec_failed", "exec_failed error"), "no-such-").unwrap();
        check_log_end(&log, 127).unwrap();
    }
}

/// A uid with no process on the machine, for RLIMIT_NPROC to count from zero.
fn idle_uid() -> u32 {
    let busy = |uid: u32| {
        HOST.pids()
            .into_iter()
            .any(|p| HOST.status_field(p, "Uid").is_some_and(|u| u.split_whitespace().next() == Some(&uid.to_string())))
    };
    [65534, 54321, 54322].into_iter().find(|u| !busy(*u)).expect("a uid with no processes")
}

/// Drop to `uid` with RLIMIT_NPROC `nproc` (root ignores the limit).
fn unprivileged(uid: u32, nproc: u64) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    move || {
        let limit = libc::rlimit { rlim_cur: nproc, rlim_max: nproc };
        // SAFETY: plain syscalls with integer or valid pointer arguments.
        unsafe {
            if libc::setrlimit(libc::RLIMIT_NPROC, &limit) != 0
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

#[test]
fn rlimit_nproc_at_spawn_is_125_with_one_line() {
    let uid = idle_uid();
    // The limit counts drainit itself: 1 lets it exec but not fork.
    let mut run = drainit(Mode::Subreaper, ["--", "true"])
        .env("DRAINIT_RETRY_AFTER_FILE", "/nonexistent/ra")
        .before_exec(unprivileged(uid, 1))
        .spawn();
    let ended = run.wait(secs(10));
    let log = run.log();
    eprintln!("nproc: uid {uid}, exit {:?}; log:\n{log}", ended.code);
    assert_eq!(ended.code, Some(125), "{log}");
    let failed: Vec<Event> = run.events().into_iter().filter(|e| e.name == "failed").collect();
    assert_eq!(failed.iter().map(|e| &e["what"]).collect::<Vec<_>>(), ["fork"], "{log}");
    assert!(log.contains("process limit"), "EAGAIN: {log}");
    assert_eq!(run.count_events("child_started"), 0, "{log}");
    check_log_end(&log, 125).unwrap();
}

/// drainit with `true` as the worker and RLIMIT_NOFILE `limit`.
fn with_nofile(limit: u64) -> Running {
    drainit(Mode::Subreaper, ["--", "true"])
        .only_stdio()
        .before_exec(move || {
            let limit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            // SAFETY: setrlimit with a valid struct.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
            Ok(())
        })
        .spawn()
}

/// drainit needs one fd beyond stdio, its signalfd: with 4 the worker runs
/// (without a fd for drainit's own non-blocking description of stderr, its
/// lines are written as before; at exit no warning about the termination log
/// it cannot open).
#[test]
fn rlimit_nofile_4_is_enough() {
    let mut run = with_nofile(4);
    let ended = run.wait(secs(10));
    let log = run.log();
    assert_eq!(ended.code, Some(0), "RLIMIT_NOFILE 4: {log}");
    assert_eq!(run.count_events("child_started"), 1, "{log}");
    assert_eq!(run.count_events("file_skipped"), 0, "{log}");
}

/// With 3 drainit cannot start: 125 and one line. A dynamic build fails
/// earlier, in the loader (127 from ld.so, before drainit runs).
#[test]
fn rlimit_nofile_3_is_125_with_one_line() {
    let mut run = with_nofile(3);
    let ended = run.wait(secs(10));
    let log = run.log();
    eprintln!("nofile 3: exit {:?}; log: {log:?}", ended.code);
    if is_static_elf(BIN).unwrap() {
        assert_eq!(ended.code, Some(125), "RLIMIT_NOFILE 3: {log}");
        one_clear_line(&log, "Too many open files").unwrap();
    } else {
        assert_eq!(ended.code, Some(127), "RLIMIT_NOFILE 3, dynamic build: {log}");
        assert!(log.contains("error while loading shared libraries"), "the loader's failure: {log}");
    }
}
