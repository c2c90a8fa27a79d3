//! Issue 4: a real lease-holding worker under drainit loses nothing, whether it is
//! stopped with SIGTERM, SIGKILLed with its whole PID namespace mid-job, or ignores
//! SIGTERM until drainit's deadline SIGKILLs it. Issue 15: with drainit's `--finish`
//! running `release`, a worker SIGKILLed at the deadline leaves nothing to wait for,
//! and `release` never frees a lease a newer holder took. Issue 32: the worker
//! alone OOM-killed (Docker, Podman) is told, and `release` frees its lease.
//!
//! The worker is `examples/lease-worker/worker.py` (python3, standard library only),
//! with its queue and lease in a real SQLite file. Each test gets its own scratch dir,
//! database and host name, so the tests can run in parallel. Everything runs through
//! the kit: drainit, the plain workers and the `worker.py` tools are kit runs, so
//! every wait is bounded and a watchdog kills a run that hangs anyway.
//!
//! Needs root for the scenarios in a PID namespace.

mod kit;
use kit::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn worker_py() -> String {
    path_str(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lease-worker/worker.py"))
}

/// The `--finish` program of the example: `worker.py release`, configured by LEASE_*.
fn release_script() -> String {
    path_str(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lease-worker/release"))
}

/// The kit's watchdog for every run of a scenario.
const WATCHDOG: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// one scenario's sandbox: scratch dir, database, host name

/// A `worker.py` tool run to its end: its status, stdout and stderr.
struct Output {
    ended: Ended,
    stdout: String,
    stderr: String,
}

struct Sandbox {
    name: String,
    dir: Scratch,
    db: PathBuf,
    host: String,
    stale: &'static str,
}

impl Sandbox {
    fn new(name: &str, stale: &'static str, jobs: u32) -> Self {
        let dir = Scratch::new(&format!("lease-worker-{name}"));
        let sb = Sandbox {
            name: name.to_string(),
            db: dir.path("queue.db"),
            host: format!("{name}-{}", std::process::id()),
            stale,
            dir,
        };
        let out = sb.tool("init", &["--jobs", &jobs.to_string()]);
        assert_eq!(out.ended.code, Some(0), "init failed: {}", out.stderr);
        sb
    }

    /// The token file of this sandbox's "container" (never the shared default in /tmp).
    fn token_file(&self) -> PathBuf {
        self.dir.path("token")
    }

    /// `python3 worker.py SUB --db ... --host ... --stale ... --token-file ... EXTRA...`.
    fn worker_argv(&self, sub: &str, extra: &[&str]) -> Vec<String> {
        let python = path_str(&need_program("python3", "python3"));
        let mut argv = vec![python, worker_py(), sub.into()];
        argv.extend(["--db".into(), path_str(&self.db), "--host".into(), self.host.clone()]);
        argv.extend(["--stale".into(), self.stale.into(), "--token-file".into(), path_str(&self.token_file())]);
        argv.extend(extra.iter().map(|s| s.to_string()));
        argv
    }

    /// The same settings as variables: how the finish program, which drainit runs
    /// without arguments, gets them.
    fn lease_env(&self) -> Vec<(String, String)> {
        vec![
            ("LEASE_DB".into(), path_str(&self.db)),
            ("LEASE_HOST".into(), self.host.clone()),
            ("LEASE_STALE".into(), self.stale.into()),
            ("LEASE_TOKEN_FILE".into(), path_str(&self.token_file())),
        ]
    }

    /// `argv` as a kit run in this sandbox: in its directory, with nothing of the
    /// test's own LEASE_* settings, and `env` added.
    fn start(&self, b: Builder, env: &[(String, String)]) -> Running {
        let b = env
            .iter()
            .fold(b.current_dir(&self.dir.0).env_remove_prefix("LEASE_").watchdog(WATCHDOG), |b, (k, v)| b.env(k, v));
        b.spawn()
    }

    /// `worker.py init|status|sweep|release ...`, run to its end.
    fn tool_env(&self, sub: &str, extra: &[&str], env: &[(String, String)]) -> Output {
        let mut run = self.start(launch(Mode::Subreaper, self.worker_argv(sub, extra)), env);
        let ended = run.wait(secs(30));
        Output { ended, stdout: run.stdout(), stderr: run.log() }
    }

    fn tool(&self, sub: &str, extra: &[&str]) -> Output {
        self.tool_env(sub, extra, &[])
    }

    fn status(&self) -> Status {
        let out = self.tool("status", &[]);
        assert_eq!(out.ended.code, Some(0), "status failed: {}", out.stderr);
        Status::parse(&out.stdout)
    }

    fn sweep(&self) -> (u32, String) {
        let out = self.tool("sweep", &[]);
        assert_eq!(out.ended.code, Some(0), "sweep failed: {}", out.stderr);
        let sweep = worker_events(&out.stderr, "sweep");
        let line = sweep.first().unwrap_or_else(|| panic!("no sweep summary line: {}", out.stderr));
        (line["requeued"].parse().unwrap(), out.stderr)
    }

    /// `worker.py release` with `token_file`, as drainit's finish program would run it
    /// after a SIGKILL: its `event=release` line as key/value pairs, and all it logged.
    fn release(&self, token_file: &Path) -> (HashMap<String, String>, String) {
        let file = path_str(token_file);
        let env = [
            ("DRAINIT_WORKER_STATUS".to_string(), "signal:SIGKILL".to_string()),
            ("DRAINIT_DEADLINE_REACHED".to_string(), "0".to_string()),
        ];
        let out = self.tool_env("release", &["--token-file", &file], &env);
        assert_eq!(out.ended.code, Some(0), "release failed: {}", out.stderr);
        let release = worker_events(&out.stderr, "release");
        let line = release.into_iter().next().unwrap_or_else(|| panic!("no release line: {}", out.stderr));
        (line, out.stderr)
    }

    /// `python3 worker.py run ...` without drainit (a worker of another "container"),
    /// with its own token file.
    fn spawn_plain(&self, token_file: &Path, worker_args: &[&str]) -> Running {
        let file = path_str(token_file);
        let extra: Vec<&str> = ["--token-file", file.as_str()].into_iter().chain(worker_args.iter().copied()).collect();
        self.start(launch(Mode::Subreaper, self.worker_argv("run", &extra)), &[])
    }

    /// `drainit DRAINIT_ARGS -- python3 worker.py run ...` in `mode` (PID 1 of its own
    /// namespace, as in a container, or a plain child of the test), with `env` added
    /// to drainit's environment (and so the worker's and the finish program's).
    fn spawn(&self, mode: Mode, drainit_args: &[&str], worker_args: &[&str], env: &[(String, String)]) -> Running {
        let mut args: Vec<String> = drainit_args.iter().map(|s| s.to_string()).collect();
        args.push("--".into());
        args.extend(self.worker_argv("run", worker_args));
        self.start(drainit(mode, args), env)
    }

    /// Wait for `run`'s log to satisfy `pred`; the log then.
    fn wait_log(&self, run: &Running, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let found = wait_for(limit, || {
            let log = run.log();
            pred(&log).then_some(log)
        });
        found.unwrap_or_else(|| {
            panic!("[{}] timed out after {limit:?} waiting for {what}; log:\n{}", self.name, run.log())
        })
    }

    /// Mid-job: at least one job done and one running, as the database says.
    fn wait_mid_job(&self, run: &Running) -> Status {
        self.wait_log(run, "a second job_started", secs(20), |l| l.matches("event=job_started").count() >= 2);
        let status = wait_for(secs(10), || {
            let s = self.status();
            (s.running == 1 && s.done >= 1).then_some(s)
        });
        status.unwrap_or_else(|| panic!("[{}] no running job (mid-job) within 10s: {:?}", self.name, self.status()))
    }

    /// Nothing that this sandbox started may still be alive.
    fn assert_nothing_left(&self, after: &str) {
        let needle = self.dir.str();
        if !wait_until(secs(2), || HOST.alive_mentioning(&needle).is_empty()) {
            let left: Vec<(i32, String)> =
                HOST.alive_mentioning(&needle).into_iter().map(|p| (p, HOST.comm(p))).collect();
            panic!("[{}] processes still alive {after}: {left:?}", self.name);
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Whatever a failed scenario left (its runs kill theirs when dropped).
        for p in HOST.alive_mentioning(&self.dir.str()) {
            if let Ok(fd) = Pidfd::try_open(p) {
                let _ = fd.send(libc::SIGKILL);
            }
        }
        if std::thread::panicking() {
            // No asserting, and no waiting without a bound: a second panic while
            // unwinding would abort.
            let mut run = self.start(launch(Mode::Subreaper, self.worker_argv("status", &[])), &[]);
            if wait_until(secs(10), || run.try_ended()) {
                eprintln!("---- [{}] status ----\n{}{}", self.name, run.stdout(), run.log());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// parsing

/// The pairs of a `key=value ...` text (a token file's line), as a map.
fn pairs(text: &str) -> HashMap<String, String> {
    logfmt(text.trim()).unwrap_or_else(|| panic!("not key=value pairs: {text:?}")).into_iter().collect()
}

#[derive(Debug, Default)]
#[allow(dead_code)]
struct Job {
    id: u32,
    status: String,
    attempts: u32,
    completions: u32,
}

#[derive(Debug, Default)]
struct Status {
    jobs: Vec<Job>,
    total: u32,
    queued: u32,
    running: u32,
    done: u32,
    completions: u32,
    duplicates: u32,
    leases: Vec<HashMap<String, String>>,
}

impl Status {
    /// `worker.py status`'s stdout: `job k=v ...`, `lease k=v ...`, `summary k=v ...`.
    fn parse(text: &str) -> Status {
        let mut s = Status::default();
        for line in text.lines() {
            let Some((kind, rest)) = line.split_once(' ') else { continue };
            let m = pairs(rest);
            let num = |k: &str| m.get(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
            match kind {
                "job" => s.jobs.push(Job {
                    id: num("id"),
                    status: m["status"].clone(),
                    attempts: num("attempts"),
                    completions: num("completions"),
                }),
                "summary" => {
                    s.total = num("jobs");
                    s.queued = num("queued");
                    s.running = num("running");
                    s.done = num("done");
                    s.completions = num("completions");
                    s.duplicates = num("duplicates");
                }
                "lease" => s.leases.push(m),
                _ => {}
            }
        }
        assert_eq!(s.total as usize, s.jobs.len(), "bad status output:\n{text}");
        s
    }
}

/// Every `TAG: event=NAME` line of a log, as key/value maps, in order.
fn events(tag: &str, log: &str, name: &str) -> Vec<HashMap<String, String>> {
    parse_events_tagged(tag, log)
        .into_iter()
        .filter(|e| e.name == name)
        .map(|e| e.fields.into_iter().collect())
        .collect()
}

/// drainit's events named `name`.
fn drainit_events(log: &str, name: &str) -> Vec<HashMap<String, String>> {
    events("drainit", log, name)
}

/// The lease worker's events named `name` (the worker's and `release`'s), in order.
fn worker_events(log: &str, name: &str) -> Vec<HashMap<String, String>> {
    events("lease-worker", log, name)
}

fn line_index(log: &str, pred: impl Fn(&str) -> bool) -> Option<usize> {
    log.lines().position(pred)
}

/// The finish program's one release after the deadline killed the worker:
/// fenced on `token`, the job requeued, and in order: the worker reaped,
/// the finish program started, the release, the finish program's end,
/// drainit's exit. Returns the release record for what else the scenario
/// checks.
fn assert_released_after_the_kill(log: &str, token: &str) -> HashMap<String, String> {
    assert_released_after(log, token, "signal:SIGKILL", "1")
}

/// The same after any death of the worker that drainit survived: `worker` is
/// DRAINIT_WORKER_STATUS as the finish program saw it, `deadline` whether
/// drainit's deadline killed it.
fn assert_released_after(log: &str, token: &str, worker: &str, deadline: &str) -> HashMap<String, String> {
    let release = worker_events(log, "release");
    assert_eq!(release.len(), 1, "log:\n{log}");
    let r = &release[0];
    assert_eq!(r["outcome"], "released", "log:\n{log}");
    assert_eq!(r["requeued"], "1", "log:\n{log}");
    assert_eq!(r["token"], token, "fenced on the worker's token; log:\n{log}");
    assert_eq!(r["worker"], worker, "log:\n{log}");
    assert_eq!(r["deadline_reached"], deadline, "log:\n{log}");
    let at = |pat: &str| line_index(log, |l| l.contains(pat)).unwrap_or_else(|| panic!("no {pat}; log:\n{log}"));
    assert!(at("drainit: event=child_exited") < at("drainit: event=finish_started"), "log:\n{log}");
    assert!(at("drainit: event=finish_started") < at("lease-worker: event=release"), "log:\n{log}");
    assert!(at("lease-worker: event=release") < at("drainit: event=finish_exited"), "log:\n{log}");
    assert!(at("drainit: event=finish_exited") < at("drainit: event=exit"), "log:\n{log}");
    release[0].clone()
}

// ---------------------------------------------------------------------------
// the scenarios

const JOBS: u32 = 6;

/// The end of a scenario whose worker was killed mid-job: all JOBS done, each
/// A new drainit's run after `release` freed the lease: no backoff, no busy
/// lease, one attempt, and the lease claimed (not reclaimed once stale) from
/// its released state; the `lease_claimed` events.
fn assert_claimed_at_once_after_release(log: &str) -> Vec<HashMap<String, String>> {
    assert!(drainit_events(log, "backoff").is_empty(), "the released lease needs no backoff; log:\n{log}");
    assert!(worker_events(log, "lease_busy").is_empty(), "log:\n{log}");
    assert_eq!(drainit_events(log, "child_started").len(), 1, "log:\n{log}");
    let claimed = worker_events(log, "lease_claimed");
    assert_eq!(claimed.len(), 1, "claimed, not reclaimed after going stale; log:\n{log}");
    assert_eq!(claimed[0]["previous"], "released", "log:\n{log}");
    claimed
}

/// completed exactly once, `interrupted` attempted twice, the lease released.
fn assert_every_job_done_once(s: &Status, interrupted: u32) {
    assert_eq!(s.done, JOBS, "every job done: {s:?}");
    assert_eq!(s.running, 0, "{s:?}");
    assert_eq!(s.completions, JOBS, "each job completed exactly once: {s:?}");
    assert_eq!(s.duplicates, 0, "{s:?}");
    for j in &s.jobs {
        assert_eq!(j.completions, 1, "job {} completed {} times", j.id, j.completions);
    }
    let again = s.jobs.iter().find(|j| j.id == interrupted).unwrap();
    assert_eq!(again.attempts, 2, "the interrupted job ran twice, finished once: {again:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
}

/// 1. SIGTERM drainit mid-job: the worker stops claiming, hands its job back, releases
///    its lease and exits 0; drainit exits 0 well inside the grace; nothing is lost.
#[test]
fn sigterm_mid_job_hands_the_job_back() {
    let sb = Sandbox::new("sigterm", "3s", JOBS);
    let mut drainit = sb.spawn(
        Mode::Subreaper,
        &["--grace", "5s", "--orchestrator-timeout", "10s"],
        &["--heartbeat", "300ms", "--step", "100ms", "--steps", "5"],
        &[],
    );
    let before = sb.wait_mid_job(&drainit);
    assert_eq!(before.running, 1);

    let t0 = Instant::now();
    drainit.signal(libc::SIGTERM);
    let st = drainit.wait(secs(8));
    let took = t0.elapsed();
    let log = drainit.log();
    assert_eq!(st.shell_code(), 0, "drainit exit status {st:?}; log:\n{log}");
    assert!(took < Duration::from_millis(2500), "drainit took {took:?} of a 5s grace; log:\n{log}");
    sb.assert_nothing_left("after drainit exited");

    let stop = drainit_events(&log, "stop_requested");
    assert_eq!(stop.len(), 1, "one stop_requested expected; log:\n{log}");
    assert_eq!(stop[0]["signal"], "SIGTERM");
    assert!(drainit_events(&log, "deadline_reached").is_empty(), "no deadline expected; log:\n{log}");
    let exit = drainit_events(&log, "exit");
    assert_eq!(exit.last().map(|e| e["code"].as_str()), Some("0"), "log:\n{log}");
    let wexits = worker_events(&log, "exit");
    let w = wexits.first().unwrap_or_else(|| panic!("worker exit line missing; log:\n{log}"));
    let wexit = format!("{w:?}");
    assert_eq!(w["code"], "0", "{wexit}");
    assert_eq!(w["in_flight"], "1", "{wexit}");
    assert_eq!(w["requeued"], "1", "{wexit}");
    assert_eq!(w["lease_released"], "1", "{wexit}");

    let s = sb.status();
    assert_eq!(s.running, 0, "{s:?}");
    assert_eq!(s.queued + s.done, JOBS, "a job was lost: {s:?}");
    assert!(s.queued >= 1, "the in-flight job should be back in the queue: {s:?}");
    assert_eq!(s.completions, s.done, "{s:?}");
    assert_eq!(s.duplicates, 0, "{s:?}");
    assert_eq!(s.leases.len(), 1);
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
}

/// 2. drainit is PID 1 of its own PID namespace; SIGKILL it mid-job (the kernel kills the
///    worker with it, like an OOM kill of the container) and start a fresh one at once.
///    The first attempt finds the lease fresh and backs off (exit 75, backoff); a later
///    attempt reclaims it once stale, requeues the dead predecessor's job and finishes:
///    every job done exactly once, none stuck in running.
#[test]
fn sigkill_of_the_namespace_then_restart_backs_off_and_reclaims() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this scenario needs root (unshare --pid)");
    let sb = Sandbox::new("sigkill", "3s", JOBS);
    let worker_args = ["--heartbeat", "300ms", "--step", "100ms", "--steps", "4"];
    let drainit_args = ["--grace", "3s", "--orchestrator-timeout", "10s", "--backoff-timeout", "30s"];
    // drainit is PID 1 inside the namespace; `pid` is its pid as the test sees it.
    let mut first = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &[]);
    let pid1 = first.pid;
    sb.wait_mid_job(&first);

    first.signal(libc::SIGKILL);
    // The kit's launcher ends as drainit did.
    let ended = first.wait(secs(10));
    assert_eq!(ended.signal, Some(libc::SIGKILL), "drainit (pid {pid1}) survived SIGKILL: {ended:?}");
    assert!(!alive(pid1), "drainit (pid {pid1}) survived SIGKILL");
    // The kernel killed everything in the namespace with its PID 1.
    sb.assert_nothing_left("after SIGKILL of the namespace's PID 1");
    let s = sb.status();
    assert_eq!(s.running, 1, "the killed worker's job is left running: {s:?}");
    assert_eq!(s.leases[0]["state"], "fresh", "{s:?}");
    // Read after the kill: the job seen running before it may have finished since,
    // and the next one been claimed.
    let interrupted = s.jobs.iter().find(|j| j.status == "running").map(|j| j.id).unwrap();

    // A fresh container at once.
    let t0 = Instant::now();
    let mut second = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &[]);
    let st = second.wait(secs(40));
    let took = t0.elapsed();
    let log = second.log();
    assert_eq!(st.shell_code(), 0, "restarted drainit {st:?}; log:\n{log}");
    sb.assert_nothing_left("after the restarted run");

    // First attempt: lease fresh -> exit 75 -> backoff.
    let started = drainit_events(&log, "child_started");
    assert!(started.len() >= 2, "expected a restart; log:\n{log}");
    assert_eq!(started[0]["attempt"], "1", "log:\n{log}");
    let exited = drainit_events(&log, "child_exited");
    assert_eq!(exited[0].get("code").map(String::as_str), Some("75"), "log:\n{log}");
    assert_eq!(exited[0]["pid"], started[0]["pid"], "log:\n{log}");
    let backoff = drainit_events(&log, "backoff");
    assert!(!backoff.is_empty(), "no backoff event; log:\n{log}");
    assert_eq!(backoff[0]["code"], "75", "log:\n{log}");
    assert!(log.contains("lease-worker: event=lease_busy"), "log:\n{log}");
    // A later attempt reclaims the stale lease, after the backoff.
    let i_backoff = line_index(&log, |l| l.starts_with("drainit: event=backoff")).unwrap();
    let i_reclaim = line_index(&log, |l| l.starts_with("lease-worker: event=lease_reclaimed"))
        .unwrap_or_else(|| panic!("no lease_reclaimed; log:\n{log}"));
    assert!(i_backoff < i_reclaim, "reclaim before backoff? log:\n{log}");
    let reclaimed = worker_events(&log, "lease_reclaimed");
    let reclaim = &reclaimed[0];
    assert_eq!(reclaim["requeued"], "1", "the dead worker's job is requeued; log:\n{log}");
    assert!(
        reclaim["token"].parse::<u32>().unwrap() > reclaim["old_token"].parse::<u32>().unwrap(),
        "fencing token must grow; log:\n{log}"
    );
    assert_eq!(drainit_events(&log, "exit").last().map(|e| e["code"].clone()), Some("0".into()));
    assert!(drainit_events(&log, "backoff_exhausted").is_empty(), "log:\n{log}");

    assert_every_job_done_once(&sb.status(), interrupted);
    eprintln!("[sigkill] restarted run took {took:?}");
}

/// 2b. Scenario 2 with `--state-dir` and `--finish release`: drainit, PID 1 of its
///    namespace, SIGKILLed mid-job with its worker; the restarted drainit finds its
///    record saying `running`, runs `release` first (the sweep), and the worker claims
///    the lease at once: no backoff. The same kill and restart without the option
///    backs off until the lease is stale (10s here). Both times (restart to the first
///    job started) are printed; examples/lease-worker/README.md has them.
#[test]
fn sigkill_of_the_namespace_then_restart_with_the_sweep_needs_no_backoff() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this scenario needs root (unshare --pid)");
    // Jobs of 1s: the kill lands mid-job.
    let worker_args = ["--heartbeat", "300ms", "--step", "100ms", "--steps", "10"];
    let finish = release_script();
    let mut took = Vec::new();
    for sweep in [false, true] {
        let sb = Sandbox::new(if sweep { "sweep" } else { "nosweep" }, "10s", JOBS);
        let state = sb.dir.path("state");
        std::fs::create_dir(&state).unwrap();
        let state = path_str(&state);
        let mut drainit_args = vec!["--grace", "3s", "--orchestrator-timeout", "10s", "--backoff-timeout", "30s"];
        if sweep {
            // Python's start-up alone can take seconds on a loaded machine.
            drainit_args.extend(["--state-dir", &state, "--finish", &finish, "--finish-timeout", "20s"]);
        }
        let env = sb.lease_env();
        let mut first = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &env);
        let pid1 = first.pid;
        sb.wait_mid_job(&first);
        first.signal(libc::SIGKILL);
        let ended = first.wait(secs(10));
        assert_eq!(ended.signal, Some(libc::SIGKILL), "drainit (pid {pid1}) survived SIGKILL: {ended:?}");
        sb.assert_nothing_left("after SIGKILL of the namespace's PID 1");
        assert_eq!(sb.status().leases[0]["state"], "fresh");
        let interrupted = sb.status().jobs.iter().find(|j| j.status == "running").map(|j| j.id).unwrap();

        let t0 = Instant::now();
        let mut second = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &env);
        sb.wait_log(&second, "the first job_started", secs(30), |l| l.contains("event=job_started"));
        took.push(t0.elapsed());
        let st = second.wait(secs(40));
        let log = second.log();
        assert_eq!(st.shell_code(), 0, "log:\n{log}");
        sb.assert_nothing_left("after the restarted run");
        assert_every_job_done_once(&sb.status(), interrupted);
        if !sweep {
            assert!(!drainit_events(&log, "backoff").is_empty(), "today: a backoff; log:\n{log}");
            continue;
        }
        assert!(drainit_events(&log, "backoff").is_empty(), "the sweep released the lease; log:\n{log}");
        assert!(worker_events(&log, "lease_busy").is_empty(), "log:\n{log}");
        let unclean = drainit_events(&log, "unclean_predecessor");
        assert_eq!(unclean.len(), 1, "log:\n{log}");
        assert_eq!((unclean[0]["attempt"].as_str(), unclean[0]["pid"].as_str()), ("1", "1"), "log:\n{log}");
        let release = worker_events(&log, "release");
        assert_eq!(release[0]["outcome"], "released", "log:\n{log}");
        assert_eq!(release[0]["stop_reason"], "unclean_predecessor", "log:\n{log}");
        assert_eq!(release[0]["worker"], "unknown", "log:\n{log}");
        assert_eq!(release[0]["requeued"], "1", "the dead worker's job, at once; log:\n{log}");
        let claimed = worker_events(&log, "lease_claimed");
        assert_eq!(claimed[0]["previous"], "released", "log:\n{log}");
        assert_eq!(drainit_events(&log, "child_started").len(), 1, "log:\n{log}");
    }
    eprintln!("[sweep] restart to the first job started: today {:?}, with the sweep {:?}", took[0], took[1]);
    assert!(took[1] < took[0], "{took:?}");
}

/// 3. A worker that ignores SIGTERM inside one long step: drainit's deadline SIGKILLs it
///    before the (simulated) orchestrator's timeout; drainit exits 137 with
///    deadline_reached. Its job is left `running` under a lease that goes stale; the
///    sweeper requeues it only then, and is idempotent.
#[test]
fn ignored_sigterm_hits_the_deadline_and_the_sweeper_recovers() {
    let sb = Sandbox::new("deadline", "3s", 3);
    let mut drainit = sb.spawn(
        Mode::Subreaper,
        &["--grace", "1s", "--orchestrator-timeout", "3s"],
        &["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--ignore-sigterm", "--long-step"],
        &[],
    );
    sb.wait_log(&drainit, "the long step", secs(20), |l| l.contains("event=long_step"));

    let t0 = Instant::now();
    drainit.signal(libc::SIGTERM);
    // The simulated orchestrator SIGKILLs at 3s: drainit must be gone before.
    let gone = wait_until(secs(3), || drainit.try_ended());
    let took = t0.elapsed();
    assert!(gone, "orchestrator timeout (3s) reached before drainit exited; log:\n{}", drainit.log());
    let st = drainit.wait(secs(1));
    let log = drainit.log();
    assert_eq!(st.shell_code(), 137, "drainit {st:?}; log:\n{log}");
    assert!(took >= Duration::from_millis(900), "deadline came early: {took:?}; log:\n{log}");
    sb.assert_nothing_left("after the deadline");
    assert_eq!(drainit_events(&log, "deadline_reached").len(), 1, "log:\n{log}");
    let exited = drainit_events(&log, "child_exited");
    let sig = exited.last().and_then(|e| e.get("signal")).map(String::as_str);
    assert!(matches!(sig, Some("SIGKILL" | "KILL" | "9")), "the worker should have died of SIGKILL; log:\n{log}");
    assert_eq!(drainit_events(&log, "exit").last().map(|e| e["code"].clone()), Some("137".into()));
    assert!(!log.contains("lease-worker: event=exit"), "the worker must not have exited by itself");

    // The job is stuck in `running`. The sweeper keeps sweeping: while the lease is
    // fresh it must leave the job alone, and when it requeues it the lease it judged
    // must really be stale (the sweeper logs the age it saw).
    let s = sb.status();
    assert_eq!(s.running, 1, "{s:?}");
    let mut sweeps_while_fresh = 0;
    let requeued = wait_until(secs(15), || {
        let (n, out) = sb.sweep();
        for line in worker_events(&out, "requeued") {
            let age: f64 = line["lease_age"].trim_end_matches('s').parse().unwrap();
            assert!(age >= 3.0, "requeued under a fresh lease (stale is 3s):\n{out}");
        }
        if n == 0 {
            sweeps_while_fresh += 1;
        }
        n == 1
    });
    assert!(requeued, "the sweeper did not requeue the orphan within 15s: {:?}", sb.status());
    eprintln!("[deadline] {sweeps_while_fresh} sweeps found the lease still fresh");
    // A second sweep changes nothing.
    let (n, out) = sb.sweep();
    assert_eq!(n, 0, "sweeper is idempotent:\n{out}");

    let s = sb.status();
    assert_eq!(s.running, 0, "{s:?}");
    assert_eq!(s.queued + s.done, 3, "{s:?}");
    for j in &s.jobs {
        assert!(j.status == "queued" || j.status == "done", "{j:?}");
    }
    assert_eq!(s.duplicates, 0, "{s:?}");
}

/// 4. Scenario 3 with drainit's `--finish` running `worker.py release`: drainit's deadline
///    SIGKILLs the TERM-ignoring worker mid-job, then the finish program, fenced on the
///    token the worker recorded, frees the lease and requeues the job. A new drainit's
///    worker claims the lease at once: no backoff, although the lease was fresh and the
///    stale threshold is 30s. Every job is done exactly once.
#[test]
fn finish_releases_the_lease_of_a_worker_killed_at_the_deadline() {
    let sb = Sandbox::new("finish", "30s", JOBS);
    let finish = release_script();
    let drainit_args = ["--grace", "1s", "--orchestrator-timeout", "5s", "--finish", finish.as_str()];
    let env = sb.lease_env();
    let mut drainit = sb.spawn(
        Mode::Subreaper,
        &drainit_args,
        &["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--ignore-sigterm", "--long-step"],
        &env,
    );
    sb.wait_log(&drainit, "the long step", secs(20), |l| l.contains("event=long_step"));
    let s = sb.status();
    assert_eq!(s.running, 1, "{s:?}");
    assert_eq!(s.leases[0]["state"], "fresh", "{s:?}");
    let interrupted = s.jobs.iter().find(|j| j.status == "running").map(|j| j.id).unwrap();
    let recorded = std::fs::read_to_string(sb.token_file()).expect("the worker records its token");
    assert_eq!(pairs(&recorded)["token"], s.leases[0]["token"], "token file: {recorded:?}");

    drainit.signal(libc::SIGTERM);
    // The simulated orchestrator SIGKILLs at 5s: the kill and the finish program fit before.
    let gone = wait_until(secs(5), || drainit.try_ended());
    assert!(gone, "orchestrator timeout (5s) reached before drainit exited; log:\n{}", drainit.log());
    let st = drainit.wait(secs(1));
    let log = drainit.log();
    assert_eq!(st.shell_code(), 137, "the finish program must not change the exit code; log:\n{log}");
    sb.assert_nothing_left("after drainit and its finish program exited");
    assert_eq!(drainit_events(&log, "deadline_reached").len(), 1, "log:\n{log}");
    let finished = drainit_events(&log, "finish_exited");
    assert_eq!(finished.len(), 1, "the finish program runs once; log:\n{log}");
    assert_eq!(finished[0].get("code").map(String::as_str), Some("0"), "log:\n{log}");
    assert_ne!(finished[0].get("timed_out").map(String::as_str), Some("1"), "log:\n{log}");
    assert_released_after_the_kill(&log, &s.leases[0]["token"]);

    let s = sb.status();
    assert_eq!(s.running, 0, "released at once, not after the 30s stale threshold: {s:?}");
    assert_eq!(s.queued, JOBS, "{s:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
    assert!(!sb.token_file().exists(), "release removes the token file it acted on");

    // A new "container" at once: the lease is free, no backoff.
    let mut drainit =
        sb.spawn(Mode::Subreaper, &drainit_args, &["--heartbeat", "300ms", "--step", "100ms", "--steps", "2"], &env);
    // Well under the 30s a backoff until the stale threshold would take.
    let st = drainit.wait(secs(20));
    let log = drainit.log();
    assert_eq!(st.shell_code(), 0, "new drainit {st:?}; log:\n{log}");
    sb.assert_nothing_left("after the new run");
    let claimed = assert_claimed_at_once_after_release(&log);
    assert_eq!(claimed[0]["requeued"], "0", "release had requeued the job already; log:\n{log}");
    // The finish program runs after a clean exit too, and finds nothing to release.
    let release = worker_events(&log, "release");
    assert_eq!(release.len(), 1, "log:\n{log}");
    assert_eq!(release[0]["outcome"], "nothing_held", "log:\n{log}");
    assert_eq!(release[0]["worker"], "exited:0", "log:\n{log}");

    assert_every_job_done_once(&sb.status(), interrupted);
}

/// 5. Issue 27: the job loop wedged in a blocking read while the heartbeat thread keeps
///    the lease fresh: alive, holding its lease, and useless. The worker pings drainit's
///    watchdog from its job loop only, so the pings stop with the loop. drainit, PID 1
///    of its own namespace as in a container, stops it one interval after the last ping;
///    the wedged loop cannot drain, so the grace deadline SIGKILLs it; the finish
///    program, told DRAINIT_STOP_REASON=watchdog, frees the lease and requeues the job;
///    the next "container" claims the lease at once (token + 1, no backoff although the
///    lease was fresh and the stale threshold is 30s) and finishes. Every job is done
///    exactly once.
#[test]
fn watchdog_stops_a_wedged_job_loop_and_finish_releases_its_lease() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this scenario needs root (unshare --pid)");
    // A job is 3 steps of 100ms: the interval leaves a wide margin over one turn of the
    // job loop, so only the wedge can miss a ping.
    const INTERVAL: Duration = Duration::from_secs(2);
    const GRACE: Duration = Duration::from_secs(1);
    const WEDGE_AT: u32 = 3;
    let sb = Sandbox::new("watchdog", "30s", JOBS);
    let finish = release_script();
    let drainit_args = [
        "--watchdog",
        "2s",
        "--ready-timeout",
        "10s",
        "--grace",
        "1s",
        "--orchestrator-timeout",
        "5s",
        "--finish",
        finish.as_str(),
    ];
    let worker_args = ["--heartbeat", "300ms", "--step", "100ms", "--steps", "3"];
    let env = sb.lease_env();
    let mut wedge_env = env.clone();
    wedge_env.push(("LEASE_WEDGE_AT_JOB".into(), WEDGE_AT.to_string()));
    let mut first = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &wedge_env);

    // Watch the log and note when each milestone first shows (within one poll).
    let milestones = [
        "lease-worker: event=wedged ",
        "drainit: event=watchdog_expired ",
        "drainit: event=child_exited ",
        "drainit: event=exit ",
    ];
    let mut seen: HashMap<&str, Instant> = HashMap::new();
    let mut lease_during_wedge = None;
    let ended = wait_until(secs(30), || {
        let log = first.log();
        for m in milestones {
            if log.contains(m) {
                seen.entry(m).or_insert_with(Instant::now);
            }
        }
        // Between the expiry and the deadline kill: the job loop has been wedged for a
        // whole interval, and the heartbeat thread is still renewing the lease.
        if lease_during_wedge.is_none() && seen.contains_key(milestones[1]) && !seen.contains_key(milestones[2]) {
            lease_during_wedge = Some(sb.status());
        }
        first.try_ended()
    });
    let exited_at = Instant::now();
    assert!(ended, "drainit still running 30s after its start; log:\n{}", first.log());
    let st = first.wait(secs(1));
    let log = first.log();
    let at = |m: &str| *seen.get(m).unwrap_or_else(|| panic!("no {m:?} seen; log:\n{log}"));
    let (wedged_at, expired_at, reaped_at) = (at(milestones[0]), at(milestones[1]), at(milestones[2]));
    assert_eq!(st.shell_code(), 137, "the wedged worker dies at the grace deadline; log:\n{log}");
    sb.assert_nothing_left("after drainit and its finish program exited");

    let claimed = worker_events(&log, "lease_claimed");
    assert_eq!(claimed.len(), 1, "log:\n{log}");
    let token: u32 = claimed[0]["token"].parse().unwrap();
    let wedged = worker_events(&log, "wedged");
    assert_eq!(wedged.len(), 1, "log:\n{log}");
    assert_eq!(wedged[0]["nth"], WEDGE_AT.to_string(), "log:\n{log}");
    let wedged_job: u32 = wedged[0]["job"].parse().unwrap();
    assert_eq!(worker_events(&log, "job_done").len(), WEDGE_AT as usize - 1, "log:\n{log}");
    assert_eq!(drainit_events(&log, "ready").len(), 1, "READY=1 once the lease is held; log:\n{log}");
    assert!(drainit_events(&log, "ready_timeout").is_empty(), "log:\n{log}");

    // The heartbeat thread went on: a heartbeat came after the loop had been wedged for
    // an interval (the heartbeat is 300ms; the stale threshold is 30s).
    let s = lease_during_wedge.unwrap_or_else(|| panic!("no status between expiry and kill; log:\n{log}"));
    assert_eq!(s.running, 1, "{s:?}");
    assert_eq!(s.leases[0]["state"], "fresh", "{s:?}");
    let age: f64 = s.leases[0]["age"].trim_end_matches('s').parse().unwrap();
    assert!(age < 1.0, "the heartbeat thread should still renew the lease while the loop is wedged: {s:?}");

    // The last ping is the one of the turn that claimed the wedged job (its STATUS says
    // so); the heartbeat thread never pinged, so the watchdog expired one interval later.
    let expired = drainit_events(&log, "watchdog_expired");
    assert_eq!(expired.len(), 1, "log:\n{log}");
    let e = &expired[0];
    assert_eq!(e["interval"], "2s", "log:\n{log}");
    assert_eq!(e["signal"], "SIGTERM", "log:\n{log}");
    assert_eq!(e["status"], format!("job={wedged_job}"), "the last STATUS= came with the last ping; log:\n{log}");
    let since = parse_duration(&e["since"]).unwrap_or_else(|| panic!("since is no duration; log:\n{log}"));
    assert!(
        since >= INTERVAL && since < INTERVAL + Duration::from_millis(500),
        "expired {since:?} after the last ping (interval {INTERVAL:?}); log:\n{log}"
    );
    // The same from outside: the wedge line follows the last ping by the claim's few
    // milliseconds, and each milestone is seen within one poll.
    let slack = Duration::from_millis(300);
    let to_expiry = expired_at - wedged_at;
    assert!(
        to_expiry + slack >= INTERVAL && to_expiry <= INTERVAL + Duration::from_millis(1500),
        "wedge to watchdog_expired took {to_expiry:?}; log:\n{log}"
    );
    let to_reap = reaped_at - wedged_at;
    assert!(
        to_reap + slack >= INTERVAL + GRACE && to_reap <= INTERVAL + GRACE + Duration::from_millis(1500),
        "wedge to the worker's death took {to_reap:?} (interval + grace = {:?}); log:\n{log}",
        INTERVAL + GRACE
    );
    assert_eq!(drainit_events(&log, "deadline_reached").len(), 1, "log:\n{log}");
    let died = drainit_events(&log, "child_exited");
    assert_eq!(died.len(), 1, "no restart after a watchdog stop; log:\n{log}");
    assert_eq!(died[0].get("signal").map(String::as_str), Some("SIGKILL"), "log:\n{log}");
    assert!(worker_events(&log, "exit").is_empty(), "a wedged loop cannot drain; log:\n{log}");
    let exit = drainit_events(&log, "exit");
    assert_eq!(exit.last().map(|e| e["code"].as_str()), Some("137"), "log:\n{log}");

    // The finish program knows why, and frees the lease at once.
    let r = assert_released_after_the_kill(&log, &token.to_string());
    assert_eq!(r["stop_reason"], "watchdog", "log:\n{log}");
    assert_eq!(r["status_text"], format!("job={wedged_job}"), "log:\n{log}");
    let i = |pat: &str| line_index(&log, |l| l.contains(pat)).unwrap_or_else(|| panic!("no {pat}; log:\n{log}"));
    assert!(i("drainit: event=watchdog_expired") < i("drainit: event=deadline_reached"), "log:\n{log}");
    let s = sb.status();
    assert_eq!(s.running, 0, "released at once, not after the 30s stale threshold: {s:?}");
    assert_eq!(s.done, WEDGE_AT - 1, "{s:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
    assert!(!sb.token_file().exists(), "release removes the token file it acted on");
    eprintln!(
        "[watchdog] wedge -> watchdog_expired {to_expiry:?} (since={}), -> worker killed {to_reap:?}, \
         -> drainit exited {:?}",
        e["since"],
        exited_at - wedged_at
    );

    // The next "container", not wedged, under the same watchdog: the lease at once.
    let t0 = Instant::now();
    let mut second = sb.spawn(Mode::Pid1, &drainit_args, &worker_args, &env);
    let st = second.wait(secs(20));
    let took = t0.elapsed();
    let log = second.log();
    assert_eq!(st.shell_code(), 0, "new drainit {st:?}; log:\n{log}");
    sb.assert_nothing_left("after the new run");
    assert!(drainit_events(&log, "backoff").is_empty(), "the released lease needs no backoff; log:\n{log}");
    assert!(worker_events(&log, "lease_busy").is_empty(), "log:\n{log}");
    assert_eq!(drainit_events(&log, "child_started").len(), 1, "log:\n{log}");
    assert!(drainit_events(&log, "watchdog_expired").is_empty(), "a healthy loop pings in time; log:\n{log}");
    let claimed = worker_events(&log, "lease_claimed");
    assert_eq!(claimed.len(), 1, "claimed, not reclaimed after going stale; log:\n{log}");
    assert_eq!(claimed[0]["previous"], "released", "log:\n{log}");
    assert_eq!(claimed[0]["token"], (token + 1).to_string(), "log:\n{log}");
    assert_eq!(claimed[0]["requeued"], "0", "release had requeued the job already; log:\n{log}");
    let release = worker_events(&log, "release");
    assert_eq!(release.len(), 1, "log:\n{log}");
    assert_eq!(release[0]["outcome"], "nothing_held", "log:\n{log}");
    assert_eq!(release[0]["stop_reason"], "none", "log:\n{log}");
    assert_every_job_done_once(&sb.status(), wedged_job);
    eprintln!("[watchdog] the new run took {took:?}");
}

/// 6. Issue 32, Docker's and Podman's OOM kill (`memory.oom.group=0`; cgroup v1
///    here has no group kill at all): drainit, PID 1 of its namespace as in a
///    container, in a memory cgroup of 128 MiB; at its second job the worker takes
///    512 MiB and the kernel's OOM killer kills it alone, mid-job. drainit survives,
///    tells it (`oom_kill`, `child_exited ... oom=1`), and runs `release`, told
///    `DRAINIT_WORKER_STATUS=oom_kill`: the lease is freed and the job requeued at
///    once; drainit exits `--oom-exit-code`. The next "container" claims the lease at
///    once (no backoff, although the stale threshold is 30s) and every job is done
///    exactly once. (The v2 group kill, where drainit dies too, is the VM's
///    `lease_worker_group_oom`, tests/cgroup_v2.rs.)
#[test]
fn oom_kill_of_the_worker_alone_then_finish_releases_its_lease() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this scenario needs root (unshare --pid, a memory cgroup)");
    const EAT_AT: u32 = 2;
    let sb = Sandbox::new("oom", "30s", JOBS);
    let cg = Cgroup::new("lease-oom", Some(128));
    let finish = release_script();
    let drainit_args = [
        "--oom-exit-code",
        "3",
        "--grace",
        "3s",
        "--orchestrator-timeout",
        "10s",
        "--finish",
        finish.as_str(),
        // Python's start-up alone can take seconds on a loaded machine.
        "--finish-timeout",
        "20s",
    ];
    let worker_args = ["--heartbeat", "300ms", "--step", "100ms", "--steps", "3"];
    let env = sb.lease_env();
    let mut eat_env = env.clone();
    eat_env.extend([("LEASE_EAT_AT_JOB".to_string(), EAT_AT.to_string()), ("LEASE_EAT_MIB".into(), "512".into())]);
    let spawn = |env: &[(String, String)]| {
        let mut args: Vec<String> = drainit_args.iter().map(|s| s.to_string()).collect();
        args.push("--".into());
        args.extend(sb.worker_argv("run", &worker_args));
        sb.start(cg.enter(drainit(Mode::Pid1, args)), env)
    };

    let mut first = spawn(&eat_env);
    let st = first.wait(secs(60));
    let log = first.log();
    assert_eq!(st.shell_code(), 3, "--oom-exit-code, not 137; log:\n{log}");
    sb.assert_nothing_left("after drainit and its finish program exited");
    assert_eq!(cg.oom_kills(), 1, "the kernel's count; log:\n{log}");

    let claimed = worker_events(&log, "lease_claimed");
    assert_eq!(claimed.len(), 1, "log:\n{log}");
    let token: u32 = claimed[0]["token"].parse().unwrap();
    let eating = worker_events(&log, "eating");
    assert_eq!(eating.len(), 1, "log:\n{log}");
    let eaten_job: u32 = eating[0]["job"].parse().unwrap();
    assert!(worker_events(&log, "eaten").is_empty(), "512 MiB fit under 128 MiB? log:\n{log}");
    assert_eq!(worker_events(&log, "job_done").len(), EAT_AT as usize - 1, "log:\n{log}");
    assert!(worker_events(&log, "exit").is_empty(), "an OOM kill runs no cleanup; log:\n{log}");

    // Told: the kill, the worker's death as an OOM kill, the exit.
    let oom = drainit_events(&log, "oom_kill");
    assert_eq!(oom.len(), 1, "log:\n{log}");
    assert_eq!((oom[0]["count"].as_str(), oom[0]["total"].as_str()), ("1", "1"), "log:\n{log}");
    let died = drainit_events(&log, "child_exited");
    assert_eq!(died.len(), 1, "no restart after an OOM kill; log:\n{log}");
    assert_eq!(died[0].get("signal").map(String::as_str), Some("SIGKILL"), "log:\n{log}");
    assert_eq!(died[0].get("oom").map(String::as_str), Some("1"), "log:\n{log}");
    assert!(drainit_events(&log, "deadline_reached").is_empty(), "no stop, no deadline; log:\n{log}");
    let exit = drainit_events(&log, "exit");
    assert_eq!(exit.last().map(|e| e["code"].as_str()), Some("3"), "log:\n{log}");
    assert_eq!(exit.last().and_then(|e| e.get("oom_kills")).map(String::as_str), Some("1"), "log:\n{log}");

    // The finish program, told it was an OOM kill, frees the lease at once.
    let r = assert_released_after(&log, &token.to_string(), "oom_kill", "0");
    assert_eq!(r["stop_reason"], "none", "log:\n{log}");
    let s = sb.status();
    assert_eq!(s.running, 0, "released at once, not after the 30s stale threshold: {s:?}");
    assert_eq!(s.done, EAT_AT - 1, "{s:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
    assert!(!sb.token_file().exists(), "release removes the token file it acted on");

    // The next "container", in the same cgroup, without the leak: the lease at once.
    let t0 = Instant::now();
    let mut second = spawn(&env);
    let st = second.wait(secs(40));
    let took = t0.elapsed();
    let log = second.log();
    assert_eq!(st.shell_code(), 0, "new drainit {st:?}; log:\n{log}");
    sb.assert_nothing_left("after the new run");
    let claimed = assert_claimed_at_once_after_release(&log);
    assert_eq!(claimed[0]["token"], (token + 1).to_string(), "log:\n{log}");
    assert_eq!(claimed[0]["requeued"], "0", "release had requeued the job already; log:\n{log}");
    assert_eq!(cg.oom_kills(), 1, "no second kill; log:\n{log}");
    let release = worker_events(&log, "release");
    assert_eq!(release.len(), 1, "log:\n{log}");
    assert_eq!(release[0]["outcome"], "nothing_held", "log:\n{log}");
    assert_eq!(release[0]["worker"], "exited:0", "log:\n{log}");
    assert_every_job_done_once(&sb.status(), eaten_job);
    eprintln!("[oom] the new run took {took:?}");
}

/// `release` is fenced on the token in its token file, so it never frees a lease a
/// newer holder took. Worker A (token 1) is frozen mid-job until its lease goes
/// stale; worker B, another "container" of the same host with its own token file,
/// reclaims it (token 2) and works. A is SIGKILLed and `release` runs with A's file:
/// B's lease and job are untouched, and a second run finds nothing. B is SIGKILLed
/// and `release` with B's file frees the lease and requeues B's job; again, nothing.
#[test]
fn release_never_frees_a_newer_holders_lease() {
    let sb = Sandbox::new("fenced", "2s", 3);
    let (file_a, file_b) = (sb.dir.path("token-a"), sb.dir.path("token-b"));
    let long = ["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--long-step"];

    let mut a = sb.spawn_plain(&file_a, &long);
    sb.wait_log(&a, "A's long step", secs(20), |l| l.contains("event=long_step"));
    assert_eq!(pairs(&std::fs::read_to_string(&file_a).unwrap())["token"], "1");
    a.signal(libc::SIGSTOP);
    let stale = wait_until(secs(10), || sb.status().leases[0]["state"] == "stale");
    assert!(stale, "A's lease did not go stale within 10s: {:?}", sb.status());

    let mut b = sb.spawn_plain(&file_b, &long);
    sb.wait_log(&b, "B's long step", secs(20), |l| l.contains("event=long_step"));
    let reclaimed = worker_events(&b.log(), "lease_reclaimed");
    assert_eq!(reclaimed.len(), 1, "log:\n{}", b.log());
    assert_eq!(reclaimed[0]["token"], "2");
    assert_eq!(pairs(&std::fs::read_to_string(&file_b).unwrap())["token"], "2");

    a.signal(libc::SIGKILL);
    assert_eq!(a.wait(secs(5)).signal, Some(libc::SIGKILL), "A dies of SIGKILL");
    for round in 1..=2 {
        let (ev, out) = sb.release(&file_a);
        let want = if round == 1 { "newer_holder" } else { "nothing_held" };
        assert_eq!(ev["outcome"], want, "release with A's token, round {round}:\n{out}");
        assert_eq!(ev.get("requeued").map(String::as_str).unwrap_or("0"), "0", "{out}");
        let s = sb.status();
        assert_eq!(s.running, 1, "B's job must stay running: {s:?}");
        assert_eq!(s.leases[0]["state"], "fresh", "B's lease must stay held: {s:?}");
        assert_eq!(s.leases[0]["token"], "2", "{s:?}");
        assert_eq!(s.leases[0]["pid"], b.pid.to_string(), "{s:?}");
    }

    b.signal(libc::SIGKILL);
    assert_eq!(b.wait(secs(5)).signal, Some(libc::SIGKILL), "B dies of SIGKILL");
    let (ev, out) = sb.release(&file_b);
    assert_eq!(ev["outcome"], "released", "{out}");
    assert_eq!(ev["token"], "2", "{out}");
    assert_eq!(ev["requeued"], "1", "{out}");
    let (ev, out) = sb.release(&file_b);
    assert_eq!(ev["outcome"], "nothing_held", "idempotent:\n{out}");
    sb.assert_nothing_left("after both workers were killed");

    let s = sb.status();
    assert_eq!(s.running, 0, "{s:?}");
    assert_eq!(s.queued, 3, "{s:?}");
    assert_eq!(s.completions, 0, "{s:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
    assert_eq!(s.leases[0]["token"], "2", "the token stays, so the next one is higher still: {s:?}");
}
