//! Readiness and the watchdog, with real workers in both modes: expiry and
//! what follows it (the stop, the drain file, the finish program, the
//! termination message, the exit code, no restart), pings, the ready
//! timeout and its extension, the ready file and `--probe`, who may notify,
//! a flood of datagrams against the deadline, the environment the worker
//! gets, and the outer notify socket.

mod kit;
use kit::*;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// `BIN --notify ARGS` as a shell command.
fn notify(args: &str) -> String {
    format!("'{BIN}' --notify {args}")
}

/// A shell function `wait_for NAME`: poll for the file NAME in `dir`.
fn wait_fn(dir: &Scratch) -> String {
    format!("wait_for() {{ while [ ! -e '{}'/\"$1\" ]; do sleep 0.02; done; }}; ", dir.str())
}

fn touch(dir: &Scratch, name: &str) {
    std::fs::write(dir.path(name), "").unwrap();
}

/// An executable sh script in `dir` that writes its environment to
/// `dir/finish.env`.
fn finish_script(dir: &Scratch) -> String {
    let path = dir.path("finish.sh");
    std::fs::write(&path, format!("#!/bin/sh\nenv > '{}'\n", dir.path("finish.env").display())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path_str(&path)
}

/// `drainit --probe` with the two variables set: its exit code.
fn probe(ready: &Path, drain: &Path) -> i32 {
    let mut child = Command::new(BIN)
        .arg("--probe")
        .env_remove("NOTIFY_SOCKET")
        .env("DRAINIT_READY_FILE", ready)
        .env("DRAINIT_DRAIN_FILE", drain)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_for(secs(10), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status.expect("probe within 10s").code().expect("probe exits")
}

fn args(options: &[String], script: &str) -> Vec<String> {
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    with_sh(&opts, script)
}

fn opts(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The first line of stdout once it is there.
/// `exec` of a recorder that records SIGTERM and dies of it (exit 143 as
/// `exec sleep 60` would): the end of a script whose stop the test times by
/// the recorder's stamps.
fn exec_recorder(rec: &Recorder) -> String {
    let argv: Vec<String> = rec.argv().iter().map(|a| format!("'{a}'")).collect();
    format!("exec {}", argv.join(" "))
}

/// The stamp of the first SIGTERM that reached `rec`.
fn term_stamp(rec: &Recorder, log: &str) -> u128 {
    let got = rec.received_timed();
    got.iter().find(|(s, _)| *s == libc::SIGTERM).unwrap_or_else(|| panic!("no SIGTERM recorded: {got:?}; {log}")).1
}

fn first_stdout_line(run: &Running) -> String {
    wait_for(secs(10), || run.stdout().lines().next().map(str::to_string)).unwrap_or_else(|| panic!("{}", run.log()))
}

// 1. Expiry: the event, the code, the drain file, the finish program, the
// termination message.
per_mode! {
    fn never_pinged_expires(mode) {
        let dir = Scratch::new("wd-expire");
        let drain = dir.path("drain");
        let term_log = dir.path("termination-log");
        std::fs::write(&term_log, "").unwrap();
        let finish = finish_script(&dir);
        let mut o = opts(&["--watchdog", "1s", "--orchestrator-timeout", "3s"]);
        o.extend(opts(&["--drain-file", &path_str(&drain), "--finish", &finish, "--termination-log", &path_str(&term_log)]));
        let script = format!("{} && exec sleep 60", notify("STATUS=busy"));
        let mut run = drainit(mode, args(&o, &script)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(143), "{mode:?}: {log}");
        let ev = run.event("watchdog_expired").unwrap_or_else(|| panic!("{mode:?}: {log}"));
        assert_eq!(ev.get("interval"), Some("1s"), "{log}");
        assert_eq!(ev.get("signal"), Some("SIGTERM"), "{log}");
        assert_eq!(ev.get("status"), Some("busy"), "{log}");
        let since = ev.duration("since");
        assert!(since >= ms(990) && since < ms(1500), "since={since:?}: {log}");
        assert_eq!(run.count_events("watchdog_expired"), 1, "{log}");
        assert!(drain.exists(), "{mode:?}: the drain file was created at the stop: {log}");
        let env = dir.lines("finish.env");
        for want in ["DRAINIT_STOP_REASON=watchdog", "DRAINIT_WORKER_STATUS_TEXT=busy", "DRAINIT_EXIT_CODE=143"] {
            assert!(env.iter().any(|l| l == want), "{mode:?}: finish env lacks {want}: {env:?}\n{log}");
        }
        let message = std::fs::read_to_string(&term_log).unwrap();
        for want in ["code=143", "reason=watchdog", "status=busy"] {
            assert!(message.split_whitespace().any(|w| w == want), "{mode:?}: {want} not in {message:?}");
        }
        let exit = run.event("exit").unwrap();
        assert_eq!(exit.get("status"), Some("busy"), "{log}");
    }
}

// 2. A watchdog stop never exits 0: 128 + the watchdog signal; --remap-exit
// applies.
per_mode! {
    fn watchdog_stop_never_exits_0(mode, signal: Option<&str>, trap: &str, remap: Option<&str>, want: i32, from: Option<i32>) {
        let mut o = opts(&["--watchdog", "1s", "--orchestrator-timeout", "3s"]);
        if let Some(s) = signal {
            o.extend(opts(&["--watchdog-signal", s]));
        }
        if let Some(r) = remap {
            o.extend(opts(&["--remap-exit", r]));
        }
        let script = format!("ulimit -c 0; trap 'exit 0' {trap}; while :; do sleep 0.1; done");
        let mut run = drainit(mode, args(&o, &script)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(want), "{mode:?}: {log}");
        let ev = run.event("watchdog_expired").unwrap_or_else(|| panic!("{log}"));
        assert_eq!(ev.get("signal"), Some(format!("SIG{trap}").as_str()), "{log}");
        let exited = run.event("child_exited").unwrap();
        assert_eq!(exited.get("code"), Some("0"), "the worker itself exited 0: {log}");
        let exit = run.event("exit").unwrap();
        assert_eq!(exit.num("code"), i64::from(want), "{log}");
        assert_eq!(exit.get("remapped_from").map(|s| s.parse::<i32>().unwrap()), from, "{log}");
    }
    case term_gives_143(None, "TERM", None, 143, None);
    case quit_gives_131(Some("SIGQUIT"), "QUIT", None, 131, None);
    case remapped(None, "TERM", Some("143:5"), 5, Some(143));
}

// 3. Pings keep it alive; when they stop, it expires about one interval
// after the last.
per_mode! {
    fn pings_keep_it_then_silence_expires(mode) {
        let dir = Scratch::new("wd-ping");
        let pings = dir.path("pings");
        let rec = Recorder::new(&dir, "w").die_on(libc::SIGTERM);
        let script = format!(
            "while [ ! -e '{}' ]; do {} || exit 9; echo . >> '{}'; sleep 0.2; done; {}",
            dir.path("quiet").display(),
            notify("WATCHDOG=1"),
            pings.display(),
            exec_recorder(&rec)
        );
        let mut run = drainit(mode, args(&opts(&["--watchdog", "1s"]), &script)).spawn();
        let start = Instant::now();
        // 15 pings at 200ms apart: at least 3s, three intervals.
        assert!(
            wait_until(secs(15), || dir.lines("pings").len() >= 15 || run.event("watchdog_expired").is_some()),
            "{mode:?}: {}",
            run.log()
        );
        assert!(start.elapsed() >= ms(2800), "{:?}", start.elapsed());
        assert_eq!(run.count_events("watchdog_expired"), 0, "{mode:?}: pinged, yet expired: {}", run.log());
        let quiet = monotonic_ns();
        touch(&dir, "quiet");
        let ev = run.wait_event("watchdog_expired", secs(5)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        let since = ev.duration("since");
        assert!(since >= ms(990) && since < ms(1500), "since={since:?}: {}", run.log());
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(143), "{}", run.log());
        // The expiry's SIGTERM reached the worker about an interval after the
        // last ping (at most one 200ms turn after "quiet"): the worker's stamp.
        let took = between(quiet, term_stamp(&rec, &run.log()));
        assert!(took >= ms(500) && took < ms(2000), "{mode:?}: SIGTERM {took:?} after the pings stopped");
    }
}

// 4. The ready timeout, the watchdog armed at READY, EXTEND_TIMEOUT_USEC.
per_mode! {
    fn ready_timeout_without_ready(mode) {
        let dir = Scratch::new("wd-rt");
        let term_log = dir.path("termination-log");
        std::fs::write(&term_log, "").unwrap();
        let o = opts(&["--ready-timeout", "1s", "--termination-log", &path_str(&term_log)]);
        let mut run = drainit(mode, args(&o, "exec sleep 60")).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_ne!(ended.code, Some(0), "{log}");
        assert_eq!(ended.code, Some(143), "{log}");
        let ev = run.event("ready_timeout").unwrap_or_else(|| panic!("{mode:?}: {log}"));
        assert_eq!(ev.get("timeout"), Some("1s"), "{log}");
        assert_eq!(ev.get("signal"), Some("SIGTERM"), "{log}");
        assert!(ended.after >= ms(1000), "{:?}", ended.after);
        assert_eq!(run.count_events("ready"), 0, "{log}");
        let message = std::fs::read_to_string(&term_log).unwrap();
        assert!(message.split_whitespace().any(|w| w == "reason=ready_timeout"), "{message:?}");
    }
}

per_mode! {
    fn watchdog_armed_at_ready(mode) {
        // READY=1 at 1.5s: a watchdog armed at the start would expire at 1s,
        // before it.
        let dir = Scratch::new("wd-ready");
        let rec = Recorder::new(&dir, "w").die_on(libc::SIGTERM);
        let script = format!("sleep 1.5; {} && {}", notify("READY=1"), exec_recorder(&rec));
        let o = opts(&["--ready-timeout", "5s", "--watchdog", "1s"]);
        let mut run = drainit(mode, args(&o, &script)).spawn();
        let ready = run.wait_event("ready", secs(10)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        assert_eq!(run.count_events("watchdog_expired"), 0, "{mode:?}: expired before READY: {}", run.log());
        assert!(ready.duration("after") >= ms(1400), "{}", run.log());
        let ev = run.wait_event("watchdog_expired", secs(5)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        let since = ev.duration("since");
        assert!(since >= ms(990) && since < ms(1500), "since is from READY: {since:?}: {}", run.log());
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
        // The worker's stamps: it was set up just after READY=1, and the
        // expiry's SIGTERM reached it about an interval later.
        let set_up = rec.ready_ns().unwrap_or_else(|| panic!("{mode:?}: the recorder never got ready: {}", run.log()));
        let took = between(set_up, term_stamp(&rec, &run.log()));
        assert!(took >= ms(600) && took < ms(2000), "{mode:?}: SIGTERM {took:?} after READY");
        assert_eq!(run.count_events("ready_timeout"), 0, "{}", run.log());
    }
}

per_mode! {
    fn extend_timeout_before_ready(mode) {
        let script = format!("{} && sleep 2 && {} && exec sleep 60", notify("EXTEND_TIMEOUT_USEC=3000000"), notify("READY=1"));
        let mut run = drainit(mode, args(&opts(&["--ready-timeout", "1s"]), &script)).spawn();
        let ready = run.wait_event("ready", secs(10)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        assert!(ready.duration("after") >= ms(1900), "{}", run.log());
        assert_eq!(run.count_events("ready_timeout"), 0, "{mode:?}: extended, yet timed out: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
        assert_eq!(run.count_events("ready_timeout"), 0, "{}", run.log());
    }
}

// 5. No restart after a watchdog stop, whatever the code.
per_mode! {
    fn no_restart_after_a_watchdog_stop(mode) {
        let script = "trap 'exit 75' TERM; while :; do sleep 0.1; done";
        let mut run = drainit(mode, args(&opts(&["--watchdog", "1s", "--backoff-delay", "100ms"]), script)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(75), "{mode:?}: {log}");
        assert_eq!(run.count_events("watchdog_expired"), 1, "{log}");
        assert_eq!(run.count_events("child_started"), 1, "{log}");
        assert_eq!(run.count_events("backoff"), 0, "{log}");
    }
}

// 6. The ready file exists exactly while the worker is ready.
per_mode! {
    fn ready_file_follows_ready_and_reloading(mode) {
        let dir = Scratch::new("wd-readyfile");
        let ready = dir.path("ready");
        let drain = dir.path("drain");
        let script = format!(
            "{}{} && wait_for go1 && {} && wait_for go2 && {} && wait_for go3 && exit 0",
            wait_fn(&dir),
            notify("READY=1"),
            notify("RELOADING=1"),
            notify("READY=1")
        );
        let o = opts(&["--ready-file", &path_str(&ready), "--drain-file", &path_str(&drain)]);
        let mut run = drainit(mode, args(&o, &script)).spawn();
        assert!(wait_until(secs(10), || ready.exists()), "{mode:?}: {}", run.log());
        assert_eq!(probe(&ready, &drain), 0);
        // The file comes with the event; the log's reader may lag behind.
        assert!(run.wait_event("ready", secs(5)).is_some(), "{}", run.log());
        assert_eq!(run.count_events("ready"), 1, "{}", run.log());
        touch(&dir, "go1");
        assert!(wait_until(secs(10), || !ready.exists()), "{mode:?}: RELOADING=1 keeps it: {}", run.log());
        assert_eq!(probe(&ready, &drain), 1);
        let not_ready = run.wait_event("not_ready", secs(5)).unwrap_or_else(|| panic!("{}", run.log()));
        assert_eq!(not_ready.get("reason"), Some("reloading"), "{}", run.log());
        touch(&dir, "go2");
        assert!(wait_until(secs(10), || ready.exists()), "{mode:?}: back on READY=1: {}", run.log());
        assert_eq!(probe(&ready, &drain), 0);
        touch(&dir, "go3");
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(0), "{}", run.log());
        assert!(!ready.exists(), "{mode:?}: the worker exited, the file stayed: {}", run.log());
        assert_eq!(probe(&ready, &drain), 1);
    }
}

per_mode! {
    fn ready_file_goes_when_a_stop_begins(mode) {
        let dir = Scratch::new("wd-readystop");
        let ready = dir.path("ready");
        let drain = dir.path("drain");
        let script = format!(
            "{}trap 'touch \"{}\"; wait_for go; exit 0' TERM; {} || exit 9; while :; do sleep 0.05; done",
            wait_fn(&dir),
            dir.path("termed").display(),
            notify("READY=1")
        );
        let o = opts(&["--ready-file", &path_str(&ready), "--drain-file", &path_str(&drain)]);
        let mut run = drainit(mode, args(&o, &script)).spawn();
        assert!(wait_until(secs(10), || ready.exists()), "{mode:?}: {}", run.log());
        assert_eq!(probe(&ready, &drain), 0);
        run.signal(libc::SIGTERM);
        assert!(wait_until(secs(10), || dir.exists("termed")), "{mode:?}: {}", run.log());
        assert!(!ready.exists(), "{mode:?}: a stop is under way, the ready file is still there: {}", run.log());
        assert!(drain.exists(), "{}", run.log());
        assert_eq!(probe(&ready, &drain), 1);
        assert!(!run.try_ended(), "the worker still runs: {}", run.log());
        touch(&dir, "go");
        assert_eq!(run.wait(secs(15)).code, Some(0), "{}", run.log());
        assert!(!ready.exists());
    }
}

// 7. Who may notify, and what.
per_mode! {
    fn a_stranger_is_rejected(mode) {
        let dir = Scratch::new("wd-stranger");
        let script = format!("echo \"$NOTIFY_SOCKET\"; {}wait_for go; {} || exit 9; exec sleep 60", wait_fn(&dir), notify("READY=1"));
        let ready = dir.path("ready");
        let mut run = drainit(mode, args(&opts(&["--ready-file", &path_str(&ready)]), &script)).spawn();
        let socket = first_stdout_line(&run);
        assert!(socket.starts_with('/'), "{socket:?}");
        let me = UnixDatagram::unbound().unwrap();
        me.send_to(b"READY=1", &socket).unwrap();
        let rejected = run.wait_event("notify_rejected", secs(10)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        let want = match mode {
            Mode::Pid1 => "outside_namespace",
            Mode::Subreaper => "not_a_descendant",
        };
        assert_eq!(rejected.get("reason"), Some(want), "{}", run.log());
        if mode == Mode::Subreaper {
            assert_eq!(rejected.num("pid"), i64::from(std::process::id() as i32), "{}", run.log());
        }
        assert!(!ready.exists() && run.count_events("ready") == 0, "{mode:?}: a stranger made it ready: {}", run.log());
        me.send_to(b"READY=1", &socket).unwrap();
        // The worker's own READY=1 comes after the second rejection: once it
        // is seen, the stranger's second message was read too.
        touch(&dir, "go");
        let ready_ev = run.wait_event("ready", secs(10)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        let started = run.event("child_started").unwrap();
        assert_eq!(ready_ev.get("pid"), started.get("pid"), "{}", run.log());
        assert_eq!(run.count_events("notify_rejected"), 1, "a warning once: {}", run.log());
        assert_eq!(run.count_events("ready"), 1, "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
    }
}

per_mode! {
    fn too_long_and_nul_are_rejected(mode) {
        let py = "import os, socket\n\
                  s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
                  p = os.environ['NOTIFY_SOCKET']\n\
                  s.sendto(b'READY=1\\nSTATUS=' + b'x' * 5000, p)\n\
                  s.sendto(b'READY=1\\nSTATUS=a\\0b', p)\n";
        let script = format!("python3 -c \"$0\" || exit 9; {} || exit 8; exit 7", notify("STATUS=done"));
        let dir = Scratch::new("wd-reject");
        let mut a = with_sh(&["-v", "--ready-file", &path_str(&dir.path("ready"))], &script);
        a.push(py.to_string());
        let mut run = drainit(mode, a).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(7), "{mode:?}: {log}");
        let reasons: Vec<String> =
            run.events().iter().filter(|e| e.name == "notify_rejected").filter_map(|e| e.get("reason").map(String::from)).collect();
        assert_eq!(reasons, ["too_long", "nul_byte"], "{mode:?}: {log}");
        assert_eq!(run.count_events("ready"), 0, "{mode:?}: a rejected message was obeyed: {log}");
        assert_eq!(run.event("exit").unwrap().get("status"), Some("done"), "{log}");
    }
}

// A sender's BARRIER=1 waits for drainit to close the descriptor it sent;
// drainit judges the sender before that close, so a `--notify` of a
// grandchild (judged by its parent links, in subreaper mode) is never found
// gone (it was, now and then, while the close came first).
per_mode! {
    fn a_notifying_grandchild_is_judged_before_it_exits(mode) {
        let script = format!("for i in $(seq 30); do {} || exit 8; done; exit 7", notify("STATUS=$i"));
        let dir = Scratch::new("wd-barrier");
        let mut run = drainit(mode, with_sh(&["-v", "--ready-file", &path_str(&dir.path("ready"))], &script)).spawn();
        let ended = run.wait(secs(30));
        let log = run.log();
        assert_eq!(ended.code, Some(7), "{mode:?}: {log}");
        assert_eq!(run.count_events("notify_rejected"), 0, "{mode:?}: {log}");
        assert_eq!(run.count_events("status"), 30, "{mode:?}: {log}");
    }
}

// 8. A flood of datagrams does not hold off the deadline.
per_mode! {
    fn a_flood_does_not_delay_the_deadline(mode) {
        let _heavy = heavy();
        let dir = Scratch::new("wd-flood");
        let py = format!(
            "import os, socket, signal\n\
             signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
             s.setblocking(False)\n\
             p = os.environ['NOTIFY_SOCKET']\n\
             open('{}', 'w').close()\n\
             while True:\n\
             \x20   try:\n\
             \x20       s.sendto(b'STATUS=x', p)\n\
             \x20   except OSError:\n\
             \x20       pass\n",
            dir.path("flooding").display()
        );
        let o = ["--grace", "1s", "--orchestrator-timeout", "2s", "--ready-file", &path_str(&dir.path("ready")), "--", "python3", "-c", &py];
        let mut run = drainit(mode, o).spawn();
        assert!(wait_until(secs(10), || dir.exists("flooding")), "{mode:?}: {}", run.log());
        let stop = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(15));
        let took = stop.elapsed();
        let log = run.log();
        assert_eq!(ended.code, Some(137), "{mode:?}: {log}");
        assert_eq!(run.count_events("deadline_reached"), 1, "{log}");
        assert!(took >= ms(950) && took < secs(2), "{mode:?}: exited {took:?} after the stop: {log}");
    }
}

// 9. Without the options: no socket, the inherited NOTIFY_SOCKET passes.
per_mode! {
    fn without_options_no_socket(mode) {
        let script = "echo \"sock=${NOTIFY_SOCKET-unset}\"; \
                      echo \"usec=${WATCHDOG_USEC-unset}\"; \
                      echo \"sockets=$(find \"$(dirname \"$DRAINIT_RETRY_AFTER_FILE\")\" -type s | wc -l)\"";
        let mut run = drainit(mode, sh(script)).env("NOTIFY_SOCKET", "/run/outer/notify").env("WATCHDOG_USEC", "123").spawn();
        assert_eq!(run.wait(secs(15)).code, Some(0), "{}", run.log());
        let out = run.stdout();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines, ["sock=/run/outer/notify", "usec=123", "sockets=0"], "{mode:?}: {}", run.log());
        assert_eq!(run.count_events("notify_rejected"), 0);
    }
}

// 10. The outer socket hears READY=1 and STOPPING=1.
/// The next datagram on `socket` whose lines include `line`, within 10 s.
fn receive_line(socket: &UnixDatagram, line: &str, seen: &mut Vec<String>) -> bool {
    let end = Instant::now() + secs(10);
    let mut buf = [0u8; 8192];
    while Instant::now() < end {
        socket.set_read_timeout(Some(end.saturating_duration_since(Instant::now()).max(ms(10)))).unwrap();
        let Ok(n) = socket.recv(&mut buf) else { return false };
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        let has = text.lines().any(|l| l == line);
        seen.push(text);
        if has {
            return true;
        }
    }
    false
}

per_mode! {
    fn the_outer_socket_hears_ready_and_stopping(mode) {
        let dir = Scratch::new("wd-outer");
        let outer = dir.path("outer");
        let socket = UnixDatagram::bind(&outer).unwrap();
        let script = format!("echo \"$NOTIFY_SOCKET\"; {} || exit 9; exec sleep 60", notify("READY=1"));
        let mut run = drainit(mode, args(&opts(&["--ready-file", &path_str(&dir.path("ready"))]), &script))
            .env("NOTIFY_SOCKET", &outer)
            .spawn();
        let inner = first_stdout_line(&run);
        assert!(inner.starts_with('/') && inner != path_str(&outer), "{mode:?}: the worker got {inner:?}");
        let mut seen = Vec::new();
        assert!(receive_line(&socket, "READY=1", &mut seen), "{mode:?}: {seen:?}: {}", run.log());
        assert!(!seen.iter().any(|m| m.lines().any(|l| l == "STOPPING=1")), "{seen:?}");
        run.signal(libc::SIGTERM);
        assert!(receive_line(&socket, "STOPPING=1", &mut seen), "{mode:?}: {seen:?}: {}", run.log());
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
    }
}

// 11. WATCHDOG_USEC and WATCHDOG_PID.
per_mode! {
    fn watchdog_variables(mode) {
        let script = "echo \"$$ ${WATCHDOG_USEC-unset} ${WATCHDOG_PID-unset}\"";
        let mut run = drainit(mode, with_sh(&["--watchdog", "1500ms"], script))
            .env("WATCHDOG_USEC", "999")
            .env("WATCHDOG_PID", "1")
            .spawn();
        assert_eq!(run.wait(secs(15)).code, Some(0), "{}", run.log());
        let out = run.stdout();
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words.len(), 3, "{out:?}");
        assert_eq!(words[1], "1500000", "{mode:?}: {out:?}");
        assert_eq!(words[2], words[0], "{mode:?}: WATCHDOG_PID is the worker's pid: {out:?}");
        assert_eq!(run.event("child_started").unwrap().get("pid"), Some(words[0]), "{}", run.log());
    }
}

per_mode! {
    fn inherited_watchdog_variables_stop_at_ready_file(mode) {
        let dir = Scratch::new("wd-vars");
        let script = "echo \"${WATCHDOG_USEC-unset} ${WATCHDOG_PID-unset} ${NOTIFY_SOCKET:+set}\"";
        let mut run = drainit(mode, with_sh(&["--ready-file", &path_str(&dir.path("ready"))], script))
            .env("WATCHDOG_USEC", "999")
            .env("WATCHDOG_PID", "1")
            .env_remove("NOTIFY_SOCKET")
            .spawn();
        assert_eq!(run.wait(secs(15)).code, Some(0), "{}", run.log());
        assert_eq!(run.stdout().trim(), "unset unset set", "{mode:?}: {}", run.log());
    }
}

// More of the messages: WATCHDOG=trigger, WATCHDOG_USEC=N, STOPPING=1, the
// watchdog signal through --rewrite, and what the outer socket is told.
per_mode! {
    fn trigger_expires_now(mode) {
        let script = format!("{} || exit 9; exec sleep 60", notify("WATCHDOG=trigger"));
        let mut run = drainit(mode, args(&opts(&["--watchdog", "20s"]), &script)).spawn();
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(143), "{mode:?}: {}", run.log());
        assert_eq!(run.count_events("watchdog_expired"), 1, "{}", run.log());
        assert!(ended.after < secs(5), "{mode:?}: trigger expired after {:?}", ended.after);
    }
}

per_mode! {
    fn watchdog_usec_sets_the_interval(mode) {
        let script = format!("{} || exit 9; exec sleep 60", notify("WATCHDOG_USEC=1000000"));
        let mut run = drainit(mode, args(&opts(&["--watchdog", "20s"]), &script)).spawn();
        let ended = run.wait(secs(15));
        let log = run.log();
        assert_eq!(ended.code, Some(143), "{mode:?}: {log}");
        let ev = run.event("watchdog_expired").unwrap_or_else(|| panic!("{log}"));
        assert_eq!(ev.get("interval"), Some("1s"), "{log}");
        assert!(ended.after < secs(6), "{mode:?}: expired after {:?}", ended.after);
    }
}

per_mode! {
    fn stopping_disarms_the_watchdog(mode) {
        let dir = Scratch::new("wd-stopping");
        let ready = dir.path("ready");
        let script = format!("{} && {} || exit 9; sleep 2.5; exit 3", notify("READY=1"), notify("STOPPING=1"));
        let o = opts(&["--watchdog", "1s", "--ready-file", &path_str(&ready)]);
        let mut run = drainit(mode, args(&o, &script)).spawn();
        let not_ready = run.wait_event("not_ready", secs(10)).unwrap_or_else(|| panic!("{mode:?}: {}", run.log()));
        assert_eq!(not_ready.get("reason"), Some("stopping"), "{}", run.log());
        assert!(!ready.exists(), "{}", run.log());
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(3), "{mode:?}: {}", run.log());
        assert_eq!(run.count_events("watchdog_expired"), 0, "{mode:?}: STOPPING=1 disarms it: {}", run.log());
    }
}

per_mode! {
    fn the_watchdog_signal_goes_through_rewrite(mode) {
        let dir = Scratch::new("wd-rewrite");
        let script = format!(
            "ulimit -c 0; trap 'touch \"{}\"; exit 0' QUIT; trap 'touch \"{}\"; exit 0' TERM; while :; do sleep 0.1; done",
            dir.path("quit").display(),
            dir.path("term").display()
        );
        let mut run = drainit(mode, args(&opts(&["--watchdog", "1s", "--rewrite", "TERM:QUIT"]), &script)).spawn();
        let ended = run.wait(secs(15));
        assert_ne!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert!(dir.exists("quit") && !dir.exists("term"), "{mode:?}: the worker got SIGTERM, not the rewritten SIGQUIT: {}", run.log());
    }
}

per_mode! {
    fn the_outer_socket_hears_status_and_pings(mode) {
        let dir = Scratch::new("wd-outer2");
        let outer = dir.path("outer");
        let socket = UnixDatagram::bind(&outer).unwrap();
        let script = format!("{} && {} || exit 9; exec sleep 60", notify("STATUS=hi"), notify("WATCHDOG=1"));
        let mut run = drainit(mode, args(&opts(&["--watchdog", "20s"]), &script)).env("NOTIFY_SOCKET", &outer).spawn();
        let mut seen = Vec::new();
        assert!(receive_line(&socket, "STATUS=hi", &mut seen), "{mode:?}: {seen:?}: {}", run.log());
        assert!(receive_line(&socket, "WATCHDOG=1", &mut seen), "{mode:?}: {seen:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(15)).code, Some(143), "{}", run.log());
    }
}
