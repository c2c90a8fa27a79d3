//! The finish program: run once at drainit's final exit, after the worker
//! and everything it left are gone, told how it ended, in its own session,
//! bounded in time, never changing drainit's exit code.

mod kit;
use kit::*;

use std::path::{Path, PathBuf};
use std::time::Instant;

/// A finish program that appends what it was told, and what it found, to
/// DIR/finish.log (one block per run), then runs `then` (shell).
fn finish_program(dir: &Scratch, then: &str) -> PathBuf {
    let path = dir.path("finish");
    let script = format!(
        r#"#!/bin/sh
log={log}
group=gone
if [ -f {dir}/w/pid ] && kill -0 -"$(cat {dir}/w/pid)" 2>/dev/null; then group=alive; fi
set -- $(cat /proc/$$/stat)
{{
  echo "code=$DRAINIT_EXIT_CODE status=$DRAINIT_WORKER_STATUS deadline=$DRAINIT_DEADLINE_REACHED stop=$DRAINIT_STOP_SIGNAL attempt=$DRAINIT_ATTEMPT group=$group leader=$([ "$1" = "$5" ] && [ "$1" = "$6" ] && echo yes || echo no) slice=$(sed -n 's/^se.slice *: *//p' /proc/$$/sched)"
}} >> "$log"
{then}
"#,
        log = path_str(&dir.path("finish.log")),
        dir = path_str(&dir.0),
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// The time slice the scheduler gives `pid` (sched_getattr's runtime, in
/// ns: a normal task's slice since Linux 6.12), while it lives.
fn time_slice(pid: i32) -> Option<u64> {
    // struct sched_attr, first version: size, policy, flags, nice,
    // priority, runtime, deadline, period.
    let mut attr = [0u64; 6];
    // SAFETY: sched_getattr writes at most 48 bytes into attr (48 bytes).
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, pid, attr.as_mut_ptr(), 48, 0) };
    (got == 0).then_some(attr[3])
}

/// The runs the finish program logged, each as its key=value map.
fn finish_runs(dir: &Scratch) -> Vec<std::collections::HashMap<String, String>> {
    dir.lines("finish.log")
        .iter()
        .map(|l| logfmt(l).unwrap_or_else(|| panic!("not key=value pairs: {l:?}")).into_iter().collect())
        .collect()
}

per_mode! {
    /// After the deadline's SIGKILL: 137, signal:SIGKILL, deadline 1, the
    /// stop signal, and the worker's group already gone.
    fn after_a_deadline_kill(mode) {
        let dir = Scratch::new("finish-deadline");
        let rec = Recorder::new(&dir, "w").term(Term::Ignore).child(Recorder::new(&dir, "c").term(Term::Ignore));
        let finish = path_str(&finish_program(&dir, "exit 0"));
        let options = ["--finish", &finish, "--grace", "1s", "--orchestrator-timeout", "3s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let slice = time_slice(run.pid);
        assert!(slice > Some(100_000), "drainit has the default slice until a stop: {slice:?} ns");
        run.signal(libc::SIGTERM);
        // Draining (the worker ignores SIGTERM for the grace): from the stop
        // on drainit asks for the shortest slice, so that its deadline wins
        // the CPU from whatever the worker left runnable (a fork bomb:
        // tests/hostile.rs); its children start with the default one.
        assert!(run.wait_event("stop_requested", secs(5)).is_some(), "{}", run.log());
        assert!(
            wait_until(secs(5), || time_slice(run.pid) == Some(100_000)),
            "not the 0.1 ms slice while draining: {:?} ns",
            time_slice(run.pid)
        );
        assert_eq!(run.wait(secs(10)).code, Some(137), "{}", run.log());
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 1, "{}", run.log());
        let r = &runs[0];
        assert_eq!(
            (&*r["code"], &*r["status"], &*r["deadline"], &*r["stop"], &*r["attempt"]),
            ("137", "signal:SIGKILL", "1", "SIGTERM", "1")
        );
        assert_eq!(&r["group"], "gone", "the finish program ran while the worker's group lived");
        assert_eq!(&r["leader"], "yes", "not the leader of its own session and group");
        assert_eq!(Some(&r["slice"]), slice.map(|s| s.to_string()).as_ref(), "the finish program's slice");
        let names = event_names(&run.log());
        let at = |n: &str| names.iter().position(|x| x == n).unwrap_or_else(|| panic!("no {n}: {names:?}"));
        assert!(at("child_exited") < at("finish_started") && at("finish_exited") < at("exit"), "{names:?}");
        let exited = run.event("finish_exited").unwrap();
        assert_eq!((&exited["code"], &exited["timed_out"]), ("0", "0"));
    }
}

per_mode! {
    /// After a plain exit: exited:4, no stop; its own exit code changes
    /// nothing.
    fn after_a_plain_exit(mode) {
        let dir = Scratch::new("finish-plain");
        let rec = Recorder::new(&dir, "w").exit_after(100, 4);
        let finish = path_str(&finish_program(&dir, "exit 7"));
        let mut run = drainit(mode, rec.worker_with(&["--finish", &finish])).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(4), "the finish program's 7 changed drainit's code");
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 1);
        let r = &runs[0];
        assert_eq!((&*r["code"], &*r["status"], &*r["deadline"], &*r["stop"]), ("4", "exited:4", "0", "none"));
        assert_eq!(&run.event("finish_exited").unwrap()["code"], "7");
        check_log_end(&run.log(), 4).unwrap();
    }
}

per_mode! {
    /// Backoff exits 75, 75, then 4: the finish program runs once, after
    /// attempt 3, not between attempts.
    fn once_after_the_last_attempt(mode) {
        let dir = Scratch::new("finish-backoff");
        let finish = path_str(&finish_program(&dir, "exit 0"));
        let script = "if [ \"$DRAINIT_ATTEMPT\" = 3 ]; then exit 4; fi; echo 10ms > \"$DRAINIT_RETRY_AFTER_FILE\"; exit 75";
        let mut run = drainit(mode, with_sh(&["--finish", &finish], script)).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(4), "{}", run.log());
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!((&*runs[0]["attempt"], &*runs[0]["status"]), ("3", "exited:4"));
        assert_eq!(run.count_events("finish_started"), 1);
    }
}

per_mode! {
    /// At --finish-timeout it is SIGKILLed with what it started.
    fn bounded_by_the_finish_timeout(mode) {
        let dir = Scratch::new("finish-timeout");
        let child = dir.path("child-pid");
        let finish = path_str(&finish_program(&dir, &format!("sleep 60 & echo $! > {}; exec sleep 60", path_str(&child))));
        let mut run = drainit(mode, with_sh(&["--finish", &finish, "--finish-timeout", "500ms"], "exit 3")).spawn();
        let started = Instant::now();
        assert_eq!(run.wait(secs(10)).code, Some(3), "{}", run.log());
        assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());
        let exited = run.event("finish_exited").unwrap_or_else(|| panic!("{}", run.log()));
        assert_eq!((&exited["signal"], &exited["timed_out"]), ("SIGKILL", "1"));
        if mode == Mode::Subreaper {
            let pid: i32 = dir.read("child-pid").trim().parse().expect("the finish program's child");
            assert!(!alive_as(pid, "sleep"), "the finish program's child {pid} survived");
        }
    }
}

per_mode! {
    /// While a stop is under way, the grace deadline bounds it.
    fn bounded_by_the_grace_deadline_during_a_stop(mode) {
        let dir = Scratch::new("finish-stop");
        let rec = Recorder::new(&dir, "w");
        let finish = path_str(&finish_program(&dir, "exec sleep 60"));
        let options = ["--finish", &finish, "--finish-timeout", "30s", "--grace", "2s", "--orchestrator-timeout", "4s"];
        let mut run = drainit(mode, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)));
        let sent = Instant::now();
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        let took = sent.elapsed();
        let gone = monotonic_ns();
        // The orchestrator's SIGKILL comes 4s after the stop (its clock);
        // the finish program's own bound, 30s, would be far past it.
        assert!(took < secs(4), "drainit exited {took:?} after SIGTERM: past the orchestrator's SIGKILL at 4s");
        // The grace counts from the stop: the worker's stamp of the SIGTERM.
        let got = rec.received_timed();
        assert_eq!(got.first().map(|(s, _)| *s), Some(libc::SIGTERM), "{}", run.log());
        let after = between(got[0].1, gone);
        assert!(after >= ms(1900), "drainit exited {after:?} after the SIGTERM reached the worker, grace 2s");
        assert_eq!(&run.event("finish_exited").unwrap()["timed_out"], "1");
    }
}

per_mode! {
    /// A stop signal while it runs goes to it, and starts the grace clock.
    fn a_stop_while_it_runs_reaches_it(mode) {
        let dir = Scratch::new("finish-term");
        let started = dir.path("started");
        let finish = path_str(&finish_program(
            &dir,
            &format!("trap 'echo got-term >> {}; exit 5' TERM; touch {}; while :; do sleep 0.05; done", path_str(&dir.path("finish.log")), path_str(&started)),
        ));
        let options = ["--finish", &finish, "--grace", "3s", "--orchestrator-timeout", "5s"];
        let mut run = drainit(mode, with_sh(&options, "exit 0")).spawn();
        assert!(wait_until(secs(10), || started.exists()), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert!(dir.read("finish.log").contains("got-term"), "{}", run.log());
        assert_eq!(run.count_events("stop_requested"), 1);
        assert_eq!((&run.event("finish_exited").unwrap()["code"], &run.event("finish_exited").unwrap()["timed_out"]), ("5", "0"));
    }
}

cases! {
    /// No worker ran, or the configuration is bad: no finish program.
    fn never_without_a_worker(args: &[&str], code: i32) {
        let dir = Scratch::new("finish-never");
        let finish = path_str(&finish_program(&dir, "exit 0"));
        std::fs::write(dir.path("not-executable"), "#!/bin/sh\n").unwrap();
        let mut all = vec!["--finish".to_string(), finish];
        all.extend(args.iter().map(|s| s.replace("DIR", &dir.str())));
        let mut run = drainit(Mode::Subreaper, all).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(code), "{}", run.log());
        assert!(!dir.exists("finish.log"), "the finish program ran:\n{}", run.log());
    }
    case bad_configuration(&["--grace", "soon", "--", "true"], 2);
    case command_not_found(&["--", "/nonexistent/worker"], 127);
    case command_not_executable(&["--", "DIR/not-executable"], 126);
}

cases! {
    /// A finish PATH that is not an executable regular file at start: exit
    /// 2 before the worker starts.
    fn refused(path: &str, needle: &str) {
        let dir = Scratch::new("finish-refused");
        let path = path.replace("DIR", &dir.str());
        std::fs::write(dir.path("plain"), "#!/bin/sh\n").unwrap();
        assert_refused(&["--finish", &path], &[], needle);
    }
    case missing("DIR/none", "No such file");
    case directory("DIR", "not a regular file");
    case not_executable("DIR/plain", "not executable");
    case empty("", "must not be empty");
}

/// A memory cgroup the test makes for one worker (v1 or v2), removed after.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(tag: &str, limit: u64) -> Option<MemoryCgroup> {
        let name = format!("drainit-test-{tag}-{}", std::process::id());
        for (root, file) in [("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup", "memory.max")] {
            let dir = Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join(file), limit.to_string()).is_ok() {
                return Some(MemoryCgroup(dir));
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its processes may still be on their way out; a cgroup left behind
        // is not worth a panic while a test unwinds.
        if !wait_until(secs(5), || std::fs::remove_dir(&self.0).is_ok()) {
            eprintln!("could not remove {}", self.0.display());
        }
    }
}

per_mode! {
    /// A worker the kernel's OOM killer ends (in a memory-limited cgroup)
    /// is reported to the finish program as signal:SIGKILL, without a stop.
    fn after_the_oom_killer(mode) {
        let dir = Scratch::new("finish-oom");
        let finish = path_str(&finish_program(&dir, "exit 0"));
        let cgroup = MemoryCgroup::new(if mode == Mode::Pid1 { "pid1" } else { "sub" }, 64 << 20);
        let script = match &cgroup {
            Some(cg) => format!(
                "echo 0 > {}/cgroup.procs && exec python3 -c 'b = []\nwhile True: b.append(bytearray(1 << 20))'",
                path_str(&cg.0)
            ),
            // No writable memory cgroup on this machine: the kernel's
            // SIGKILL is stood in for by one from outside.
            None => "touch ready; exec sleep 60".to_string(),
        };
        let mut run = drainit(mode, with_sh(&["--finish", &finish], &script)).spawn();
        if cgroup.is_none() {
            eprintln!("no writable memory cgroup: the worker is SIGKILLed from outside instead");
            let worker = wait_for(secs(10), || HOST.descendant_named(run.pid, "sleep")).expect("the worker");
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(worker, libc::SIGKILL) };
        }
        assert_eq!(run.wait(secs(30)).code, Some(137), "{}", run.log());
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 1, "{}", run.log());
        assert_eq!((&*runs[0]["status"], &*runs[0]["deadline"], &*runs[0]["stop"]), ("signal:SIGKILL", "0", "none"));
    }
}

per_mode! {
    /// A stop after the finish program exited bounds what it left behind
    /// (defect: the leftover was killed only at the 30s finish bound, long
    /// past the orchestrator's SIGKILL).
    fn a_stop_bounds_what_the_finish_program_left(mode) {
        let dir = Scratch::new("finish-left");
        let up = path_str(&dir.path("left-up"));
        let then = format!(
            "sh -c 'trap \"\" TERM; : > {up}; exec sleep 60' </dev/null >/dev/null 2>&1 &\n\
             while [ ! -e {up} ]; do sleep 0.01; done"
        );
        let finish = path_str(&finish_program(&dir, &then));
        let args = ["--orchestrator-timeout", "3s", "--grace", "2s", "--finish", &finish, "--finish-timeout", "30s"];
        let mut run = drainit(mode, with_sh(&args, "exit 0")).spawn();
        assert!(run.wait_event("finish_exited", secs(10)).is_some(), "{}", run.log());
        let stop = Instant::now();
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(40));
        let took = stop.elapsed();
        assert_eq!(ended.code, Some(0), "{}", run.log());
        assert!(took < secs(3), "exited {took:?} after SIGTERM: past the orchestrator's SIGKILL at 3s: {}", run.log());
        assert!(took >= secs(2) - ms(100), "killed at the grace deadline, not before: {took:?}");
    }
}

per_mode! {
    /// A later attempt that cannot exec still runs the finish program: a
    /// worker ran before it (defect: "no worker ran" was taken from the
    /// last attempt alone).
    fn after_a_later_attempt_cannot_exec(mode) {
        let dir = Scratch::new("finish-noexec");
        let finish = path_str(&finish_program(&dir, ""));
        let worker = dir.path("worker");
        std::fs::write(&worker, "#!/bin/sh\nchmod -x \"$0\"\nexit 75\n").unwrap();
        std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let args = ["--finish", &finish, "--backoff-delay", "100ms", "--", &path_str(&worker)];
        let mut run = drainit(mode, args).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(126), "{}", run.log());
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 1, "{}", run.log());
        assert_eq!((runs[0]["code"].as_str(), runs[0]["status"].as_str(), runs[0]["attempt"].as_str()), ("126", "exited:75", "2"));
    }
}
