//! What the worker sees: a session of its own, default dispositions, an
//! empty mask, no file descriptor of drainit's, and its attempt number.

mod kit;
use kit::*;

per_mode! {
    fn worker_is_a_session_leader_with_clean_signal_state(mode) {
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
        let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("?").trim().to_string();
        assert_eq!(field("SigBlk:"), "0000000000000000", "{mode:?}");
        assert_eq!(field("SigIgn:"), "0000000000000000", "{mode:?}");
        let st = Stat::parse(&dir.read("stat")).unwrap();
        assert_eq!((st.pgrp, st.session), (st.pid, st.pid), "{mode:?}: pgrp and session are the worker's pid: {st:?}");
    }
}

per_mode! {
    fn no_drainit_fd_leaks_into_the_worker(mode) {
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
        let numbers: Vec<&str> = fds.split_whitespace().collect();
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
    assert_eq!(run.wait(secs(10)).code, Some(0));
    check_log_end(&run.log(), 0).unwrap();
    let mut quiet = drainit(Mode::Subreaper, sh("exit 0")).env("DRAINIT_LOG", "off").spawn();
    assert_eq!(quiet.wait(secs(10)).code, Some(0));
    assert_eq!(quiet.log(), "");
}
