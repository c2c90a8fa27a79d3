//! What a hostile worker sends drainit cannot hold it nor make it lie: a
//! descriptor whose close would block (a lingering TCP socket), a flood
//! from deep down the process tree (subreaper mode walks /proc), few free
//! descriptors while a sender is checked, control bytes in a `STATUS=`;
//! and what a well-behaved worker is owed: its own WATCHDOG_PID on every
//! attempt, the 1 ms floor of `WATCHDOG_USEC`, `READY=1` told to the outer
//! socket again after `RELOADING=1`, a notify socket even under a `$TMPDIR`
//! too long for a socket's path.

mod kit;
use kit::*;

use std::os::unix::net::UnixDatagram;
use std::time::Instant;

/// `BIN --notify ARGS` as a shell command.
fn notify(args: &str) -> String {
    format!("'{BIN}' --notify {args}")
}

/// `--` then `python3 -c script`.
fn python(options: &[&str], script: &str) -> Vec<String> {
    let mut argv: Vec<String> = options.iter().map(|s| s.to_string()).collect();
    argv.extend(["--".into(), "python3".into(), "-c".into(), script.into()]);
    argv
}

// 1. A TCP socket with a linger time and unsent data to a peer that never
// reads, handed over with a notify message: drainit's close of the last
// reference would wait out the linger time (10 s here), signals blocked.
// drainit is stopped (SIGSTOP) while the worker sends and drops its own
// copy, so that drainit's is the last.
per_mode! {
    fn a_lingering_socket_does_not_hold_the_deadline(mode) {
        let dir = Scratch::new("linger");
        let script = format!(
            "import os, signal, socket, struct, time\n\
             signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
             while not os.path.exists('{go}'): time.sleep(0.01)\n\
             srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n\
             c = socket.socket(); c.connect(srv.getsockname())\n\
             c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 10))\n\
             c.setblocking(False)\n\
             try:\n\
             \x20   while True: c.send(b'x' * 65536)\n\
             except BlockingIOError:\n\
             \x20   pass\n\
             n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
             n.connect(os.environ['NOTIFY_SOCKET'])\n\
             socket.send_fds(n, [b'READY=1'], [c.fileno()])\n\
             c.close()\n\
             open('{sent}', 'w').close()\n\
             while True: signal.pause()\n",
            go = dir.path("go").display(),
            sent = dir.path("sent").display()
        );
        let ready = path_str(&dir.path("ready"));
        let o = ["--grace", "2s", "--orchestrator-timeout", "3s", "--ready-file", &ready];
        let mut run = drainit(mode, python(&o, &script)).spawn();
        assert!(run.wait_event("child_started", secs(10)).is_some(), "{mode:?}: {}", run.log());
        run.signal(libc::SIGSTOP);
        std::fs::write(dir.path("go"), "").unwrap();
        let sent = wait_until(secs(10), || dir.exists("sent"));
        run.signal(libc::SIGCONT);
        assert!(sent, "{mode:?}: {}", run.log());
        // drainit reads the message at once (a drainit that blocks in
        // close() logs `ready` only after the linger time).
        let read = run.wait_event("ready", secs(3)).is_some();
        let stop = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(30));
        let took = stop.elapsed();
        let log = run.log();
        assert_eq!(ended.code, Some(137), "{mode:?}: {log}");
        assert!(took < secs(3), "{mode:?}: exited {took:?} after SIGTERM, past the orchestrator's 3s: {log}");
        assert!(read, "{mode:?}: the message was read before the stop: {log}");
    }
}

const CHAIN: &str = r#"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* chain DEPTH MARKER: a chain of DEPTH processes ignoring SIGTERM, each
   the parent of the next; the deepest floods the notify socket with X=1.
   Each level is a fresh exec: a chain of bare forks shares its anonymous
   memory's bookkeeping down the chain, and the kernel then takes seconds
   to tear 1,000 of them down, which would measure the kernel, not
   drainit. */
int main(int argc, char **argv) {
    int depth = atoi(argv[1]);
    signal(SIGTERM, SIG_IGN);
    if (depth > 1) {
        pid_t p = fork();
        if (p < 0)
            _exit(1);
        if (p == 0) {
            char next[16];
            snprintf(next, sizeof next, "%d", depth - 1);
            execl("/proc/self/exe", argv[0], next, argv[2], (char *)0);
            _exit(1);
        }
        for (;;)
            pause();
    }
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, getenv("NOTIFY_SOCKET"), sizeof a.sun_path - 1);
    close(open(argv[2], O_CREAT | O_WRONLY, 0600));
    for (;;)
        sendto(s, "X=1", 3, 0, (struct sockaddr *)&a, sizeof a);
}
"#;

// 2. Subreaper mode judges a sender by its parent links in /proc: a flood
// from 1,000 levels down must not hold the deadline (the old build: 40 s).
#[test]
fn a_deep_flood_does_not_hold_the_deadline_in_subreaper_mode() {
    let _heavy = heavy();
    let dir = Scratch::new("deep-flood");
    let chain = path_str(&c_helper("chain", CHAIN));
    let flooding = path_str(&dir.path("flooding"));
    let ready = path_str(&dir.path("ready"));
    let o = ["--grace", "2s", "--orchestrator-timeout", "3s", "--ready-file", &ready, "--", &chain, "1000", &flooding];
    let mut run = drainit(Mode::Subreaper, o).watchdog(secs(120)).spawn();
    assert!(wait_until(secs(60), || dir.exists("flooding")), "{}", run.log());
    // Let the flood reach drainit before the stop.
    assert!(!wait_until(ms(300), || run.try_ended()), "{}", run.log());
    let stop = Instant::now();
    run.signal(libc::SIGTERM);
    let ended = run.wait(secs(90));
    let took = stop.elapsed();
    let log = run.log();
    assert_eq!(ended.code, Some(137), "{log}");
    assert_eq!(run.count_events("deadline_reached"), 1, "{log}");
    assert!(took < secs(3), "exited {took:?} after SIGTERM, past the orchestrator's 3s: {log}");
}

// 3. Every attempt gets its own pid as WATCHDOG_PID (the old build handed
// every restart the first attempt's).
per_mode! {
    fn every_attempt_gets_its_own_watchdog_pid(mode) {
        let dir = Scratch::new("wd-pid");
        let out = path_str(&dir.path("out"));
        let script = format!(
            "echo \"$$ $WATCHDOG_PID\" >> '{out}'; [ \"$DRAINIT_ATTEMPT\" -lt 4 ] && exit 75; exit 0"
        );
        let o = ["--watchdog", "20s", "--backoff-delay", "10ms", "--backoff-max-delay", "10ms"];
        let mut run = drainit(mode, with_sh(&o, &script)).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(0), "{mode:?}: {}", run.log());
        let lines = dir.lines("out");
        assert_eq!(lines.len(), 4, "{mode:?}: {lines:?}");
        for (attempt, line) in lines.iter().enumerate() {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words.len(), 2, "{line:?}");
            assert_eq!(words[1], words[0], "{mode:?}: attempt {}: WATCHDOG_PID is not its pid: {lines:?}", attempt + 1);
        }
    }
}

// 4. A worker's WATCHDOG_USEC=1 counts as 1 ms: the watchdog expires as
// any other, without a storm of `watchdog_late` lines (the old build: an
// interval of 1 us, hundreds of them).
per_mode! {
    fn a_tiny_watchdog_usec_counts_as_1ms(mode) {
        let script = format!("{} || exit 9; exec sleep 60", notify("WATCHDOG_USEC=1"));
        let mut run = drainit(mode, with_sh(&["--watchdog", "20s"], &script)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(143), "{mode:?}: {log}");
        let ev = run.event("watchdog_expired").unwrap_or_else(|| panic!("{mode:?}: {log}"));
        assert_eq!(ev.get("interval"), Some("1ms"), "{mode:?}: {log}");
        assert!(run.count_events("watchdog_late") < 10, "{mode:?}: {log}");
    }
}

/// Bytes a terminal would act on: C0 controls but the line's own `\n`,
/// DEL, and C1 (CSI as U+009B).
fn raw_controls(text: &str) -> Vec<char> {
    text.chars().filter(|&c| c != '\n' && c.is_control()).collect()
}

// 5. Control bytes of a STATUS= are escaped in every log line and in the
// termination message.
per_mode! {
    fn control_bytes_of_a_status_are_escaped(mode) {
        let dir = Scratch::new("status-ctl");
        let term_log = dir.path("termination-log");
        std::fs::write(&term_log, "").unwrap();
        let script = "import os, socket, time\n\
                      s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
                      s.sendto(b'READY=1\\nSTATUS=a\\x1b[2Kb\\x07c\\td\\x7fe\\xc2\\x9bf', os.environ['NOTIFY_SOCKET'])\n\
                      time.sleep(60)\n";
        let ready = path_str(&dir.path("ready"));
        let o = ["-v", "--ready-file", &ready, "--termination-log", &path_str(&term_log)];
        let mut run = drainit(mode, python(&o, script)).spawn();
        assert!(run.wait_event("ready", secs(10)).is_some(), "{mode:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{mode:?}: {}", run.log());
        let log = run.log();
        assert_eq!(raw_controls(&log), Vec::<char>::new(), "{mode:?}: {log:?}");
        let stop = run.event("stop_requested").unwrap_or_else(|| panic!("{log}"));
        assert!(stop.line.ends_with(r#" status="a\x1b[2Kb\x07c\td\x7fe\x9bf""#), "{mode:?}: {log}");
        let message = std::fs::read_to_string(&term_log).unwrap();
        assert_eq!(raw_controls(&message), Vec::<char>::new(), "{mode:?}: {message:?}");
        assert!(message.contains(r#"status="a\x1b[2Kb\x07c\td\x7fe\x9bf""#), "{mode:?}: {message:?}");
    }
}

/// The next `READY=1` lines the outer socket hears within 10 s, up to `want`.
fn count_ready(socket: &UnixDatagram, want: usize) -> (usize, Vec<String>) {
    let end = Instant::now() + secs(10);
    let (mut n, mut seen) = (0, Vec::new());
    let mut buf = [0u8; 8192];
    while n < want && Instant::now() < end {
        socket.set_read_timeout(Some(end.saturating_duration_since(Instant::now()).max(ms(10)))).unwrap();
        let Ok(len) = socket.recv(&mut buf) else { break };
        let text = String::from_utf8_lossy(&buf[..len]).to_string();
        n += text.lines().filter(|l| *l == "READY=1").count();
        seen.push(text);
    }
    (n, seen)
}

// 6. After RELOADING=1, the next READY=1 is told to the outer socket again
// (a systemd unit or Podman above would otherwise stay "reloading").
per_mode! {
    fn the_outer_socket_hears_ready_again_after_reloading(mode) {
        let dir = Scratch::new("outer-reload");
        let outer = dir.path("outer");
        let socket = UnixDatagram::bind(&outer).unwrap();
        let script = format!(
            "{} && {} && {} || exit 9; exec sleep 60",
            notify("READY=1"),
            notify("RELOADING=1"),
            notify("READY=1")
        );
        let ready = path_str(&dir.path("ready"));
        let mut run = drainit(mode, with_sh(&["--ready-file", &ready], &script)).env("NOTIFY_SOCKET", &outer).spawn();
        let (n, seen) = count_ready(&socket, 2);
        assert_eq!(n, 2, "{mode:?}: {seen:?}: {}", run.log());
        assert!(seen.iter().any(|m| m.lines().any(|l| l == "RELOADING=1")), "{seen:?}");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
    }
}

// 7. A $TMPDIR too long for the socket's path (108 bytes) is passed over:
// the private directory goes to /dev/shm and the readiness options hold.
per_mode! {
    fn a_tmpdir_too_long_for_the_socket_is_passed_over(mode) {
        let dir = Scratch::new("long-tmpdir");
        let room = 100usize.saturating_sub(dir.str().len() + 1).max(1);
        let long = dir.path(&"t".repeat(room));
        std::fs::create_dir(&long).unwrap();
        assert!(path_str(&long).len() + "/drainit-XXXXXX/notify".len() >= 108, "{}", long.display());
        let script = format!("echo \"$NOTIFY_SOCKET\"; {} || exit 9; exec sleep 60", notify("READY=1"));
        let ready = path_str(&dir.path("ready"));
        let mut run = drainit(mode, with_sh(&["--ready-file", &ready], &script)).env("TMPDIR", &long).spawn();
        assert!(run.wait_event("ready", secs(10)).is_some(), "{mode:?}: {}", run.log());
        let socket = run.stdout().lines().next().unwrap_or_default().to_string();
        assert!(socket.starts_with("/dev/shm/drainit-"), "{mode:?}: NOTIFY_SOCKET={socket:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
        assert_eq!(run.count_events("failed"), 0, "{mode:?}: {}", run.log());
    }
}

/// The lowest descriptor number `pid` does not use: with its limit there,
/// every new descriptor fails (EMFILE).
fn first_free_fd(pid: i32) -> u64 {
    let used: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..).find(|n| !used.contains(n)).unwrap()
}

// 8. With no descriptor left to open /proc, a live sender (a descendant,
// not the worker: subreaper mode walks /proc only for those) is not
// judged gone (the old build: `notify_rejected reason=sender_gone`).
#[test]
fn a_sender_checked_with_no_free_descriptor_is_not_judged_gone() {
    let dir = Scratch::new("emfile");
    let go = path_str(&dir.path("go"));
    let ready = path_str(&dir.path("ready"));
    // The worker's child notifies: its own `--notify` runs as a grandchild.
    let script = format!("while [ ! -e '{go}' ]; do sleep 0.02; done; ({}) ; exec sleep 60", notify("READY=1"));
    let mut run = drainit(Mode::Subreaper, with_sh(&["--ready-file", &ready], &script)).spawn();
    assert!(wait_until(secs(10), || run.event("child_started").is_some()), "{}", run.log());
    // Every descriptor number drainit may use is taken: the limit is its
    // lowest free one.
    let free = first_free_fd(run.pid);
    assert!(free > 3, "{free}");
    let fds = || {
        let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", run.pid))
            .map(|d| d.filter_map(|e| Some(format!("{:?}", std::fs::read_link(e.ok()?.path()).ok()?))).collect())
            .unwrap_or_default();
        fds.sort();
        fds
    };
    let before = fds();
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit writes one rlimit (the old one) and reads none.
    let got = unsafe { libc::prlimit(run.pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut limit) };
    assert_eq!(got, 0, "{}", std::io::Error::last_os_error());
    limit.rlim_cur = free;
    // SAFETY: prlimit reads one rlimit and writes none (null old).
    let set = unsafe { libc::prlimit(run.pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    std::fs::write(&go, "").unwrap();
    // The READY=1 is read and its sender judged with the table full; the
    // barrier that follows carries a descriptor the kernel cannot install
    // then (`control_truncated`, told as such), and the ready file cannot
    // be created (`file_skipped`): both say what happened.
    let misjudged = |run: &Running| {
        run.events()
            .into_iter()
            .find(|e| e.name == "notify_rejected" && matches!(e.get("reason"), Some("sender_gone" | "unverifiable")))
    };
    let got = wait_for(secs(10), || {
        if let Some(r) = misjudged(&run) {
            return Some(Err(r.line));
        }
        run.event("ready").map(|_| Ok(()))
    });
    assert_eq!(got, Some(Ok(())), "limit {free}, descriptors {before:?}: {}", run.log());
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
}
