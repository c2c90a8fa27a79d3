//! What the worker sees: a session of its own, default dispositions, an
//! empty mask, no file descriptor of drainit's, and its attempt number.

mod common;
use common::*;

fn status_field(status: &str, key: &str) -> String {
    status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("?").trim().to_string()
}

#[test]
fn worker_is_a_session_leader_with_clean_signal_state() {
    for mode in MODES {
        let dir = Scratch::new("clean");
        let (status, stat) = (path_str(&dir.path("status")), path_str(&dir.path("stat")));
        // exec so that the file describes the worker process itself.
        let script = format!("cat /proc/$$/stat > {stat}; exec cat /proc/self/status > {status}");
        // drainit itself starts with signals ignored and blocked, as it may
        // under a careless parent: the worker must not inherit that.
        let mut run = drainit(mode, sh(&script))
            .before_exec(|| {
                // SAFETY: signal and sigprocmask are async-signal-safe.
                unsafe {
                    libc::signal(libc::SIGINT, libc::SIG_IGN);
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGUSR1);
                    libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
                Ok(())
            })
            .spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
        let status = dir.read("status");
        assert_eq!(status_field(&status, "SigBlk:"), "0000000000000000", "{mode:?}");
        assert_eq!(status_field(&status, "SigIgn:"), "0000000000000000", "{mode:?}");
        let stat = dir.read("stat");
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        let pid: &str = stat.split_whitespace().next().unwrap();
        assert_eq!((fields[2], fields[3]), (pid, pid), "{mode:?}: pgrp and session are the worker's pid: {stat}");
    }
}

#[test]
fn no_drainit_fd_leaks_into_the_worker() {
    for mode in MODES {
        let dir = Scratch::new("fds");
        let out = path_str(&dir.path("fds"));
        // Python, not sh: dash keeps a descriptor of its own (fd 10). The
        // directory's own fd is closed when listdir returns, so it is
        // filtered out by the existence check.
        let code = format!(
            "import os; fds = os.listdir('/proc/self/fd'); \
             fds = ' '.join(sorted(f for f in fds if os.path.exists('/proc/self/fd/' + f))); \
             open('{out}', 'w').write(fds)"
        );
        let mut run = drainit(mode, ["--", "python3", "-c", &code]).only_stdio().spawn();
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}: {}", run.log());
        let fds = dir.read("fds");
        let numbers: Vec<&str> = fds.split_whitespace().map(|p| p.rsplit('/').next().unwrap()).collect();
        assert_eq!(numbers, ["0", "1", "2"], "{mode:?}: {fds}");
    }
}

#[test]
fn worker_gets_drainits_environment_plus_attempt_and_retry_file() {
    let dir = Scratch::new("env");
    let out = path_str(&dir.path("env"));
    let mut run = drainit(Mode::Subreaper, sh(&format!("env > {out}")))
        .env("SOME_SETTING", "kept")
        .env("RUST_LOG", "worker-owns-this")
        .env("DRAINIT_ATTEMPT", "99")
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    let env = dir.lines("env");
    assert!(env.contains(&"SOME_SETTING=kept".to_string()));
    assert!(env.contains(&"RUST_LOG=worker-owns-this".to_string()));
    assert!(env.contains(&"DRAINIT_ATTEMPT=1".to_string()), "{env:?}");
    assert!(env.iter().any(|l| l.starts_with("DRAINIT_RETRY_AFTER_FILE=/")), "{env:?}");
    assert_eq!(env.iter().filter(|l| l.starts_with("DRAINIT_ATTEMPT=")).count(), 1);
}

#[test]
fn rust_log_does_not_configure_drainit() {
    let mut run = drainit(Mode::Subreaper, sh("exit 0")).env("RUST_LOG", "off").spawn();
    run.wait(secs(10));
    assert!(run.log().contains("event=exit code=0"), "{}", run.log());
    let mut quiet = drainit(Mode::Subreaper, sh("exit 0")).env("DRAINIT_LOG", "off").spawn();
    quiet.wait(secs(10));
    assert_eq!(quiet.log(), "");
}
