//! `--state-dir`: the record drainit keeps, the lock, and the sweep at the
//! next start after a drainit that died without its exit (the contract's
//! "The predecessor"). Killing the run with `Running::kill` kills
//! everything, as a container's end does (in Mode::Pid1, drainit is PID 1
//! of its namespace: the SIGKILL ends the namespace). The docker
//! `kill`/`start` case is in tests/docker.rs.

mod kit;
use kit::*;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// A finish program that appends what it was told to DIR/finish.log, one
/// line per run, then runs `then` (shell).
fn finish_program(dir: &Scratch, then: &str) -> String {
    let path = dir.path("finish");
    let script = format!(
        "#!/bin/sh\n\
         echo \"reason=$DRAINIT_STOP_REASON status=$DRAINIT_WORKER_STATUS attempt=$DRAINIT_ATTEMPT \
         pred_pid=${{DRAINIT_PREDECESSOR_PID:-unset}} pred_started=${{DRAINIT_PREDECESSOR_STARTED:-unset}} \
         predecessor=$DRAINIT_PREDECESSOR at=$(date +%s%N)\" >> {log}\n\
         {then}\n",
        log = path_str(&dir.path("finish.log")),
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path_str(&path)
}

/// The finish program's runs, each as its key=value map.
fn finish_runs(dir: &Scratch) -> Vec<std::collections::HashMap<String, String>> {
    dir.lines("finish.log")
        .iter()
        .map(|l| l.split(' ').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
        .collect()
}

/// A worker that notes what it was told (and the record as it found it),
/// then `then` (shell).
fn worker(dir: &Scratch, then: &str) -> String {
    format!(
        "echo \"predecessor=$DRAINIT_PREDECESSOR attempt=$DRAINIT_ATTEMPT pred_pid=${{DRAINIT_PREDECESSOR_PID:-unset}} \
         reason=${{DRAINIT_STOP_REASON:-unset}} at=$(date +%s%N)\" >> {seen}; \
         tr '\\n' ' ' < {state}/drainit.state >> {seen}; echo >> {seen}; {then}",
        seen = path_str(&dir.path("seen")),
        state = path_str(&dir.path("state")),
    )
}

fn state_dir(dir: &Scratch) -> String {
    let state = dir.path("state");
    std::fs::create_dir_all(&state).unwrap();
    path_str(&state)
}

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The record, as the tests read it: `state=...` and its keys.
fn record(state: &str) -> Option<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(Path::new(state).join("drainit.state")).ok()?;
    let body = text.strip_prefix("drainit-state 1\n").unwrap_or_else(|| panic!("a torn or foreign record: {text:?}"));
    let line = body.strip_suffix('\n').unwrap_or_else(|| panic!("a torn record: {text:?}"));
    assert!(!line.contains('\n'), "one line: {text:?}");
    Some(line.split(' ').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
}

/// Whether no process holds DIR's lock (within a few seconds).
fn lock_free(state: &str) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(Path::new(state).join("drainit.lock")) else { return true };
    wait_until(secs(5), || {
        // SAFETY: flock on an fd we own.
        let got = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        // SAFETY: as above.
        got && unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) } == 0
    })
}

/// The pid drainit has as it sees itself.
fn own_pid(mode: Mode, run: &Running) -> String {
    match mode {
        Mode::Pid1 => "1".into(),
        Mode::Subreaper => run.pid.to_string(),
    }
}

per_mode! {
    /// The first run with a DIR is told `none`, the next `clean`; the
    /// record says running (attempt, drainit's pid) while each attempt
    /// runs, and exited (code) after.
    fn none_then_clean_and_the_record_of_each_attempt(mode) {
        let dir = Scratch::new("state-clean");
        let state = state_dir(&dir);
        let script = worker(&dir, "[ \"$DRAINIT_ATTEMPT\" -lt 2 ] && exit 75; exit 3");
        let opts = ["--state-dir", &state, "--backoff-delay", "10ms"];
        let mut run = drainit(mode, with_sh(&opts, &script)).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(3), "{}", run.log());
        let me = own_pid(mode, &run);
        let seen = dir.lines("seen");
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(seen[0].starts_with("predecessor=none attempt=1 "), "{seen:?}");
        for (n, line) in [(1, &seen[1]), (2, &seen[3])] {
            assert!(
                line.starts_with(&format!("drainit-state 1 state=running attempt={n} pid={me} started=")),
                "the record before attempt {n}: {line}"
            );
        }
        let r = record(&state).unwrap();
        assert_eq!((&*r["state"], &*r["code"], &*r["pid"]), ("exited", "3", &*me), "{r:?}");
        assert_eq!(run.count_events("unclean_predecessor") + run.count_events("state_unreadable"), 0);

        let mut run = drainit(mode, with_sh(&["--state-dir", &state], &worker(&dir, "exit 0"))).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(0), "{}", run.log());
        assert!(dir.lines("seen")[4].starts_with("predecessor=clean attempt=1 "), "{:?}", dir.lines("seen"));
        assert_eq!(run.count_events("unclean_predecessor"), 0);
    }
}

per_mode! {
    /// drainit and its worker SIGKILLed (everything dies): the next start
    /// logs `unclean_predecessor` and runs the finish program first, told
    /// of the predecessor, then the worker, told `unclean`; then the
    /// finish program runs once more at the end, for this run's worker.
    fn a_killed_predecessor_is_swept_before_the_worker(mode) {
        let dir = Scratch::new("state-unclean");
        let state = state_dir(&dir);
        let finish = finish_program(&dir, "exit 0");
        let ready = path_str(&dir.path("ready"));
        let script = worker(&dir, &format!("[ \"$DRAINIT_ATTEMPT\" -lt 2 ] && exit 75; touch {ready}; exec sleep 60"));
        let opts = ["--state-dir", &state, "--finish", &finish, "--backoff-delay", "10ms"];
        let before = unix_secs();
        let mut run = drainit(mode, with_sh(&opts, &script)).spawn();
        assert!(wait_until(secs(20), || dir.exists("ready")), "{}", run.log());
        let killed = own_pid(mode, &run);
        run.kill();
        assert_eq!(finish_runs(&dir).len(), 0, "a SIGKILLed drainit runs nothing");

        let mut run = drainit(mode, with_sh(&opts, &worker(&dir, "exit 4"))).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(4), "{}", run.log());
        let after = unix_secs();
        let e = run.event("unclean_predecessor").unwrap_or_else(|| panic!("{}", run.log()));
        assert_eq!((e.get("attempt"), e.get("pid")), (Some("2"), Some(&*killed)), "{}", run.log());
        assert!(e.duration("age") < secs(after - before + 1), "{}", run.log());
        let runs = finish_runs(&dir);
        assert_eq!(runs.len(), 2, "the sweep, then the end of this run: {runs:?}");
        let sweep = &runs[0];
        assert_eq!(
            (&*sweep["reason"], &*sweep["status"], &*sweep["attempt"], &*sweep["pred_pid"], &*sweep["predecessor"]),
            ("unclean_predecessor", "unknown", "2", &*killed, "unclean"),
            "{runs:?}"
        );
        let started: u64 = sweep["pred_started"].parse().unwrap();
        assert!((before..=after).contains(&started), "{started} in {before}..={after}");
        let seen = dir.lines("seen");
        let last = seen[seen.len() - 2].clone();
        assert!(last.starts_with("predecessor=unclean attempt=1 pred_pid=unset reason=unset "), "{last}");
        let at = |l: &str| l.rsplit_once("at=").unwrap().1.parse::<u128>().unwrap();
        assert!(sweep["at"].parse::<u128>().unwrap() < at(&last), "the sweep ran before the worker: {runs:?} {last}");
        assert_eq!(&*runs[1]["reason"], "none", "the run's own finish: {runs:?}");
        let names = event_names(&run.log());
        let pos = |n: &str| names.iter().position(|x| x == n).unwrap_or(usize::MAX);
        assert!(pos("unclean_predecessor") < pos("finish_started"), "{names:?}");
        assert!(pos("finish_exited") < pos("child_started"), "{names:?}");
        let r = record(&state).unwrap();
        assert_eq!(&*r["state"], "exited", "{r:?}");
    }
}

per_mode! {
    /// A stop signal during the sweep reaches the finish program, and
    /// drainit exits 128+N without starting the worker.
    fn a_stop_during_the_sweep_ends_drainit_without_a_worker(mode) {
        let dir = Scratch::new("state-stop");
        let state = state_dir(&dir);
        std::fs::write(
            dir.path("state/drainit.state"),
            "drainit-state 1\nstate=running attempt=1 pid=7 started=1700000000.000\n",
        )
        .unwrap();
        let termed = path_str(&dir.path("termed"));
        let sweeping = path_str(&dir.path("sweeping"));
        let finish = finish_program(&dir, &format!("trap 'touch {termed}; exit 0' TERM; touch {sweeping}; sleep 30 & wait"));
        let opts = ["--state-dir", &state, "--finish", &finish, "--finish-timeout", "30s", "--grace", "3s"];
        let mut run = drainit(mode, with_sh(&opts, &worker(&dir, "exit 0"))).spawn();
        assert!(wait_until(secs(10), || dir.exists("sweeping")), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(143), "{}", run.log());
        assert!(dir.exists("termed"), "the stop reached the sweep: {}", run.log());
        assert!(!dir.exists("seen"), "the worker never ran: {}", run.log());
        assert_eq!(run.count_events("child_started"), 0);
        assert_eq!(finish_runs(&dir).len(), 1, "no second finish without a worker");
    }
}

per_mode! {
    /// The sweep is bounded by --finish-timeout; the worker starts after it.
    fn the_sweep_is_bounded_by_the_finish_timeout(mode) {
        let dir = Scratch::new("state-bound");
        let state = state_dir(&dir);
        std::fs::write(
            dir.path("state/drainit.state"),
            "drainit-state 1\nstate=running attempt=5 pid=7 started=1700000000.000\n",
        )
        .unwrap();
        let finish = finish_program(&dir, "exec sleep 30");
        let opts = ["--state-dir", &state, "--finish", &finish, "--finish-timeout", "1s"];
        let mut run = drainit(mode, with_sh(&opts, &worker(&dir, "exit 0"))).spawn();
        let ended = run.wait(secs(15));
        assert_eq!(ended.code, Some(0), "{}", run.log());
        let e = run.event("finish_exited").unwrap();
        assert_eq!((e.get("signal"), e.get("timed_out")), (Some("SIGKILL"), Some("1")), "{}", run.log());
        assert!(dir.lines("seen")[0].starts_with("predecessor=unclean attempt=1 "), "{:?}", dir.lines("seen"));
        assert_eq!(&*finish_runs(&dir)[0]["attempt"], "5");
    }
}

per_mode! {
    /// A record that cannot be read (garbage, a link planted at its name)
    /// is `state_unreadable` and counts as unclean; without --finish the
    /// worker is still told.
    fn an_unreadable_record_counts_as_unclean(mode) {
        let dir = Scratch::new("state-garbage");
        let state = state_dir(&dir);
        for (plant, why) in [("garbage", "not a drainit record"), ("link", "is a link")] {
            let name = dir.path("state/drainit.state");
            let _ = std::fs::remove_file(&name);
            match plant {
                "garbage" => std::fs::write(&name, "hello\n").unwrap(),
                _ => std::os::unix::fs::symlink("/etc/hostname", &name).unwrap(),
            }
            let mut run = drainit(mode, with_sh(&["--state-dir", &state], &worker(&dir, "exit 0"))).spawn();
            assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
            let e = run.event("state_unreadable").unwrap_or_else(|| panic!("{plant}: {}", run.log()));
            assert!(e.get("reason").unwrap_or_default().contains(why), "{plant}: {}", run.log());
            let e = run.event("unclean_predecessor").unwrap();
            assert_eq!((e.get("attempt"), e.get("pid"), e.get("age")), (Some("unknown"), Some("unknown"), Some("unknown")));
            assert!(dir.lines("seen").iter().any(|l| l.starts_with("predecessor=unclean ")), "{plant}");
            assert_eq!(&*record(&state).unwrap()["state"], "exited", "{plant}: the record replaces what was planted");
            std::fs::remove_file(dir.path("seen")).unwrap();
        }
    }
}

/// Links planted at every name drainit uses in DIR are never followed:
/// what they point to is untouched, and the run goes on.
#[test]
fn links_at_drainits_names_are_never_followed() {
    let dir = Scratch::new("state-links");
    let state = state_dir(&dir);
    let target = dir.path("target");
    std::fs::write(&target, "precious\n").unwrap();
    for name in ["drainit.lock", "drainit.state", "drainit.state.new"] {
        std::os::unix::fs::symlink(&target, dir.path(&format!("state/{name}"))).unwrap();
    }
    let mut run = drainit(Mode::Subreaper, with_sh(&["--state-dir", &state], "exit 0")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    assert_eq!(dir.read("target"), "precious\n");
    for name in ["drainit.lock", "drainit.state"] {
        let meta = std::fs::symlink_metadata(dir.path(&format!("state/{name}"))).unwrap();
        assert!(meta.file_type().is_file(), "{name}: {meta:?}");
    }
    assert_eq!(&*record(&state).unwrap()["state"], "exited");
}

/// Two drainits must not share a DIR: the second is refused, naming it;
/// once the first is gone, the lock is free again.
#[test]
fn a_second_drainit_on_the_same_dir_is_refused() {
    let dir = Scratch::new("state-lock");
    let state = state_dir(&dir);
    let ready = path_str(&dir.path("ready"));
    let mut first =
        drainit(Mode::Subreaper, with_sh(&["--state-dir", &state], &format!("touch {ready}; exec sleep 30"))).spawn();
    assert!(wait_until(secs(10), || dir.exists("ready")), "{}", first.log());
    assert_refused(&["--state-dir", &state], &[], &state);
    assert_refused(&[], &[("DRAINIT_STATE_DIR", &state)], "another drainit");
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait(secs(10)).code, Some(143));
    let mut run = drainit(Mode::Subreaper, with_sh(&["--state-dir", &state], "exit 0")).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
}

/// DIR missing, not a directory, or not writable (a read-only mount):
/// exit 2 before the worker, one line naming DIR.
#[test]
fn a_dir_that_cannot_be_kept_is_refused() {
    let dir = Scratch::new("state-bad");
    let file = path_str(&dir.path("file"));
    std::fs::write(&file, "").unwrap();
    assert_refused(&["--state-dir", &path_str(&dir.path("missing"))], &[], "does not exist");
    assert_refused(&["--state-dir", &file], &[], "is not a directory");
    // Read-only: a tmpfs mounted ro in the run's own mount namespace.
    let ro = dir.path("ro");
    std::fs::create_dir(&ro).unwrap();
    let target = std::ffi::CString::new(path_str(&ro)).unwrap();
    let marker = dir.path("ran");
    let mut run = drainit(Mode::Pid1, ["--state-dir", &path_str(&ro), "--", "touch", &path_str(&marker)])
        .before_exec(move || {
            // SAFETY: mount(2) with valid C strings.
            let rc = unsafe {
                libc::mount(c"none".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), libc::MS_RDONLY, std::ptr::null())
            };
            if rc != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
        })
        .spawn();
    assert_eq!(run.wait(secs(10)).code, Some(2), "{}", run.log());
    assert!(!marker.exists());
    one_clear_line(&run.log(), "is not writable").unwrap();
    one_clear_line(&run.log(), &path_str(&ro)).unwrap();
}

per_mode! {
    /// Crash safety: drainit SIGKILLed (with everything it started) at
    /// random moments of its start, its sweep, its attempts, its backoff
    /// sleeps and its exit, hundreds of times in a row on one DIR. After
    /// every death the record is whole (the old one or a new one, never
    /// torn); the next start's verdict is what the record says; and it is
    /// unclean exactly when the killed drainit had started a worker and had
    /// not written its exit (drainit writes `running` just before each
    /// attempt: a kill in that gap also reads unclean, which is the safe
    /// side: the finish program must be idempotent anyway).
    fn killed_at_random_moments_always_leaves_a_record_the_next_start_reads(mode) {
        let _heavy = heavy();
        let dir = Scratch::new("state-crash");
        let state = state_dir(&dir);
        let marks = dir.path("marks");
        std::fs::create_dir(&marks).unwrap();
        let m = path_str(&marks);
        let finish = finish_program(&dir, &format!("echo \"$DRAINIT_STOP_REASON\" > {m}/finish.$RUN"));
        let script = format!(
            "echo \"$DRAINIT_PREDECESSOR\" > {m}/worker.$RUN.$DRAINIT_ATTEMPT; \
             [ \"$DRAINIT_ATTEMPT\" -lt 3 ] && exit 75; exit 0"
        );
        let opts = [
            "--state-dir", &state, "--finish", &finish, "--backoff-delay", "10ms", "--backoff-max-delay", "20ms",
        ];
        let runs: u32 = if long_mode() { 2000 } else { 300 };
        let budget = secs(if long_mode() { 1200 } else { 100 });
        let started = std::time::Instant::now();
        let mut seed = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64) | 1;
        eprintln!("seed {seed}");
        let mut random = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut tally = std::collections::BTreeMap::<&str, u32>::new();
        let mut done = 0;
        for i in 0..runs {
            if started.elapsed() > budget {
                break;
            }
            let before = record(&state);
            let want = match before.as_ref().map(|r| r["state"].clone()).as_deref() {
                None => "none",
                Some("exited") => "clean",
                _ => "unclean",
            };
            let launched_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis();
            let mut run = drainit(mode, with_sh(&opts, &script)).env("RUN", i.to_string()).spawn();
            // One run in eight goes to its end; the others die at a moment
            // drawn from the span a whole run takes.
            let completed = if random(8) == 0 {
                assert_eq!(run.wait(secs(20)).code, Some(0), "run {i}: {}", run.log());
                true
            } else {
                std::thread::sleep(ms(random(120)));
                let ended = run.poll_end();
                run.kill();
                if let Some(e) = ended {
                    assert_eq!(e.code, Some(0), "run {i} ended by itself: {}", run.log());
                }
                ended.is_some()
            };
            // Everything of the killed run is gone before the next starts,
            // as in a container's restart (SIGKILLs land a moment apart).
            assert!(lock_free(&state), "run {i}: the lock is still held after the kill");
            let after = record(&state);
            let worker_ran = (1..=3).any(|a| marks.join(format!("worker.{i}.{a}")).exists());
            let label = |r: &Option<std::collections::HashMap<String, String>>| format!("{r:?}");
            // The verdict this run was given is what the record said.
            let told = std::fs::read_to_string(marks.join(format!("worker.{i}.1"))).unwrap_or_default();
            if !told.is_empty() {
                assert_eq!(told.trim(), want, "run {i}: told, with {} before", label(&before));
            }
            if want == "unclean" && worker_ran {
                let swept = std::fs::read_to_string(marks.join(format!("finish.{i}"))).unwrap_or_default();
                assert!(!swept.is_empty(), "run {i}: the worker ran, unswept");
            }
            match after.as_ref().map(|r| r["state"].as_str()) {
                None => assert!(before.is_none() && !worker_ran, "run {i}: no record, yet the worker ran"),
                Some("exited") => {}
                Some("running") => {
                    let stamp = after.as_ref().unwrap()["started"].replace('.', "").parse::<u128>().unwrap();
                    let ours = stamp >= launched_ms;
                    assert!(ours || after == before, "run {i}: a running record neither new nor the old one");
                    assert!(!completed, "run {i} exited, its record says running: {}", label(&after));
                }
                Some(other) => panic!("run {i}: state {other}"),
            }
            // Unclean exactly when a worker started and the exit was not
            // written: a worker that ran leaves `running` or `exited`,
            // never the record from before it.
            if worker_ran {
                let state_after = after.as_ref().map(|r| r["state"].clone()).unwrap_or_default();
                let ours = state_after == "exited"
                    || after.as_ref().unwrap()["started"].replace('.', "").parse::<u128>().unwrap() >= launched_ms;
                assert!(ours, "run {i}: the worker ran, the record is older: {}", label(&after));
            }
            if completed {
                assert_eq!(after.as_ref().map(|r| r["state"].as_str()), Some("exited"), "run {i}");
            }
            *tally.entry(if completed { "completed" } else if worker_ran { "killed_after_a_worker" } else { "killed_before_a_worker" }).or_default() += 1;
            *tally.entry(want).or_default() += 1;
            done += 1;
        }
        eprintln!("{done} runs in {:?}: {tally:?}", started.elapsed());
        assert!(done >= 100, "only {done} runs in {budget:?}");
        for seen in ["none", "clean", "unclean", "completed", "killed_after_a_worker", "killed_before_a_worker"] {
            assert!(tally.get(seen).is_some_and(|n| *n > 0), "never {seen}: {tally:?}");
        }
    }
}
