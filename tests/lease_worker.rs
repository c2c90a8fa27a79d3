//! Issue 4: a real lease-holding worker under drainit loses nothing, whether it is
//! stopped with SIGTERM, SIGKILLed with its whole PID namespace mid-job, or ignores
//! SIGTERM until drainit's deadline SIGKILLs it. Issue 15: with drainit's `--finish`
//! running `release`, a worker SIGKILLed at the deadline leaves nothing to wait for,
//! and `release` never frees a lease a newer holder took.
//!
//! The worker is `examples/lease-worker/worker.py` (python3, standard library only),
//! with its queue and lease in a real SQLite file. Each test gets its own temp dir,
//! database and host name, so the tests can run in parallel. Every wait polls with a
//! deadline, and a watchdog fails (and cleans up) a test that hangs anyway.
//!
//! Needs root for scenario 2 (`unshare --pid`).

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const DRAINIT: &str = env!("CARGO_BIN_EXE_drainit");
const POLL: Duration = Duration::from_millis(20);

fn worker_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lease-worker/worker.py")
}

/// The `--finish` program of the example: `worker.py release`, configured by LEASE_*.
fn release_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lease-worker/release").display().to_string()
}

// ---------------------------------------------------------------------------
// processes

fn send(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a pid we started (or found as its child).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Live (non-zombie) processes whose command line mentions `needle`.
fn procs_mentioning(needle: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if !cmd.contains(needle) {
            continue;
        }
        if proc_state(pid) == Some('Z') {
            continue;
        }
        out.push((pid, cmd.trim().to_string()));
    }
    out
}

fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn proc_state(pid: u32) -> Option<char> {
    proc_stat_fields(pid)?.first()?.chars().next()
}

fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(f) = proc_stat_fields(pid)
                && f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
            {
                out.push(pid);
            }
        }
    }
    out
}

fn kill_everything_mentioning(needle: &str) {
    for (pid, _) in procs_mentioning(needle) {
        send(pid, libc::SIGKILL);
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(POLL);
    }
}

/// The shell-style code: exit code, or 128+N for death by signal N.
fn code_of(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn poll_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        thread::sleep(POLL);
    }
}

/// Nothing of the test's own environment that drainit or the worker would act on: a
/// `NOTIFY_SOCKET` of whatever runs the tests would get the worker's messages.
fn scrub_env(c: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("DRAINIT_") || k.starts_with("LEASE_") || k.starts_with("WATCHDOG_") || k == "NOTIFY_SOCKET" {
            c.env_remove(&k);
        }
    }
}

// ---------------------------------------------------------------------------
// watchdog: a hung test fails instead of hanging the suite

struct Watchdog {
    tx: Option<mpsc::Sender<()>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new(name: &str, limit: Duration, needle: String) -> Self {
        let (tx, rx) = mpsc::channel::<()>();
        let name = name.to_string();
        let handle = thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("WATCHDOG: test {name} still running after {limit:?}; killing its processes");
                kill_everything_mentioning(&needle);
                std::process::exit(101);
            }
        });
        Watchdog { tx: Some(tx), handle: Some(handle) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------
// one scenario's sandbox: temp dir, database, host name; cleans up on drop

struct Sandbox {
    name: String,
    dir: PathBuf,
    db: PathBuf,
    host: String,
    stale: &'static str,
    _watchdog: Watchdog,
}

impl Sandbox {
    fn new(name: &str, stale: &'static str, jobs: u32) -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("drainit-lease-worker-{name}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let watchdog = Watchdog::new(name, Duration::from_secs(90), dir.display().to_string());
        let sb = Sandbox {
            name: name.to_string(),
            db: dir.join("queue.db"),
            host: format!("{name}-{}", std::process::id()),
            stale,
            dir,
            _watchdog: watchdog,
        };
        let out = sb.tool("init", &["--jobs", &jobs.to_string()]);
        assert!(out.status.success(), "init failed: {}", String::from_utf8_lossy(&out.stderr));
        sb
    }

    fn needle(&self) -> String {
        self.dir.display().to_string()
    }

    fn log_path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("run{n}.log"))
    }

    fn read_log(&self, n: u32) -> String {
        fs::read_to_string(self.log_path(n)).unwrap_or_default()
    }

    /// The token file of this sandbox's "container" (never the shared default in /tmp).
    fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    fn common_args(&self) -> Vec<String> {
        vec![
            "--db".into(),
            self.db.display().to_string(),
            "--host".into(),
            self.host.clone(),
            "--stale".into(),
            self.stale.into(),
            "--token-file".into(),
            self.token_file().display().to_string(),
        ]
    }

    /// The same settings as variables: how the finish program, which drainit runs
    /// without arguments, gets them.
    fn lease_env(&self) -> Vec<(String, String)> {
        vec![
            ("LEASE_DB".into(), self.db.display().to_string()),
            ("LEASE_HOST".into(), self.host.clone()),
            ("LEASE_STALE".into(), self.stale.into()),
            ("LEASE_TOKEN_FILE".into(), self.token_file().display().to_string()),
        ]
    }

    fn python(&self) -> Command {
        let mut c = Command::new("python3");
        c.arg(worker_py());
        scrub_env(&mut c);
        c.current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    /// `worker.py init|status|sweep ...`, run to completion.
    fn tool(&self, sub: &str, extra: &[&str]) -> std::process::Output {
        let mut c = self.python();
        c.arg(sub).args(self.common_args()).args(extra);
        c.output().expect("run python3 worker.py")
    }

    fn status(&self) -> Status {
        let out = self.tool("status", &[]);
        assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
        Status::parse(&String::from_utf8_lossy(&out.stdout))
    }

    fn sweep(&self) -> (u32, String) {
        let out = self.tool("sweep", &[]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "sweep failed: {err}");
        let line = err.lines().find(|l| l.contains("event=sweep ")).expect("sweep summary line");
        (kv(line)["requeued"].parse().unwrap(), err)
    }

    /// `worker.py release` with `token_file`, as drainit's finish program would run it
    /// after a SIGKILL: its `event=release` line as key/value pairs, and all it logged.
    fn release(&self, token_file: &Path) -> (HashMap<String, String>, String) {
        let mut c = self.python();
        c.arg("release").args(self.common_args()).arg("--token-file").arg(token_file);
        c.env("DRAINIT_WORKER_STATUS", "signal:SIGKILL").env("DRAINIT_DEADLINE_REACHED", "0");
        let out = c.output().expect("run python3 worker.py release");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "release failed: {err}");
        let line =
            err.lines().find(|l| l.contains("event=release ")).unwrap_or_else(|| panic!("no release line: {err}"));
        (kv(line), err)
    }

    /// `python3 worker.py run ...` without drainit (a worker of another "container"),
    /// with its own token file; stdout and stderr appended to run<n>.log.
    fn spawn_plain(&self, n: u32, token_file: &Path, worker_args: &[&str]) -> Child {
        let mut c = self.python();
        c.arg("run").args(self.common_args()).arg("--token-file").arg(token_file).args(worker_args);
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path(n)).unwrap();
        c.stdout(log.try_clone().unwrap()).stderr(log);
        c.spawn().expect("spawn python3 worker.py run")
    }

    /// `[unshare --pid --fork --mount-proc] drainit DRAINIT_ARGS -- python3 worker.py run ...`,
    /// stdout and stderr appended to run<n>.log.
    fn spawn(&self, n: u32, pid_ns: bool, drainit_args: &[&str], worker_args: &[&str]) -> Child {
        self.spawn_env(n, pid_ns, drainit_args, worker_args, &[])
    }

    /// `spawn`, with `env` added to drainit's environment (and so the worker's and the
    /// finish program's).
    fn spawn_env(
        &self,
        n: u32,
        pid_ns: bool,
        drainit_args: &[&str],
        worker_args: &[&str],
        env: &[(String, String)],
    ) -> Child {
        let mut c = if pid_ns {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--mount-proc", DRAINIT]);
            c
        } else {
            Command::new(DRAINIT)
        };
        c.args(drainit_args).arg("--").arg("python3").arg(worker_py()).arg("run");
        c.args(self.common_args()).args(worker_args);
        scrub_env(&mut c);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path(n)).unwrap();
        c.current_dir(&self.dir).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        c.spawn().expect("spawn drainit")
    }

    fn wait_log(&self, n: u32, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + limit;
        loop {
            let log = self.read_log(n);
            if pred(&log) {
                return log;
            }
            assert!(
                Instant::now() < end,
                "[{}] timed out after {limit:?} waiting for {what}; run{n}.log:\n{log}",
                self.name
            );
            thread::sleep(POLL);
        }
    }

    /// Mid-job: at least one job done and one running, as the database says.
    fn wait_mid_job(&self, n: u32) -> Status {
        self.wait_log(n, "a second job_started", Duration::from_secs(20), |l| {
            l.matches("event=job_started").count() >= 2
        });
        poll_until("a running job (mid-job)", Duration::from_secs(10), || {
            let s = self.status();
            (s.running == 1 && s.done >= 1).then_some(s)
        })
    }

    /// Nothing that this sandbox started may still be alive.
    fn assert_nothing_left(&self, after: &str) {
        let needle = self.needle();
        let end = Instant::now() + Duration::from_secs(2);
        loop {
            let left = procs_mentioning(&needle);
            if left.is_empty() {
                return;
            }
            if Instant::now() >= end {
                kill_everything_mentioning(&needle);
                panic!("[{}] processes still alive {after}: {left:?}", self.name);
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        kill_everything_mentioning(&self.needle());
        if thread::panicking() {
            for n in 1..=3 {
                let log = self.read_log(n);
                if !log.is_empty() {
                    eprintln!("---- [{}] run{n}.log ----\n{log}", self.name);
                }
            }
            // No asserting here: a second panic while unwinding would abort.
            let out = self.tool("status", &[]);
            eprintln!(
                "---- [{}] status ----\n{}{}",
                self.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// parsing

/// logfmt-ish `key=value` pairs of one line (values without spaces, as both logs use).
fn kv(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
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
    fn parse(text: &str) -> Status {
        let mut s = Status::default();
        for line in text.lines() {
            let m = kv(line);
            let num = |k: &str| m.get(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
            if line.starts_with("job ") {
                s.jobs.push(Job {
                    id: num("id"),
                    status: m["status"].clone(),
                    attempts: num("attempts"),
                    completions: num("completions"),
                });
            } else if line.starts_with("lease ") {
                s.leases.push(m);
            } else if line.starts_with("summary ") {
                s.total = num("jobs");
                s.queued = num("queued");
                s.running = num("running");
                s.done = num("done");
                s.completions = num("completions");
                s.duplicates = num("duplicates");
            }
        }
        assert_eq!(s.total as usize, s.jobs.len(), "bad status output:\n{text}");
        s
    }
}

/// Every drainit line with `event=NAME`, as key/value maps, in order.
fn drainit_events(log: &str, name: &str) -> Vec<HashMap<String, String>> {
    let tag = format!("event={name}");
    log.lines().filter(|l| l.starts_with("drainit:") && l.split_whitespace().any(|w| w == tag)).map(kv).collect()
}

/// Every lease-worker line with `event=NAME` (the worker's and `release`'s), in order.
fn worker_events(log: &str, name: &str) -> Vec<HashMap<String, String>> {
    let tag = format!("event={name}");
    log.lines().filter(|l| l.starts_with("lease-worker:") && l.split_whitespace().any(|w| w == tag)).map(kv).collect()
}

/// A duration as drainit logs it (`950ms`, `2s`, `2.004s`, `1m`).
fn parse_shown(text: &str) -> Duration {
    if let Some(ms) = text.strip_suffix("ms") {
        Duration::from_millis(ms.parse().unwrap())
    } else if let Some(s) = text.strip_suffix('s') {
        Duration::from_secs_f64(s.parse().unwrap())
    } else if let Some(m) = text.strip_suffix('m') {
        Duration::from_secs(60 * m.parse::<u64>().unwrap())
    } else {
        panic!("not a duration drainit shows: {text:?}")
    }
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
    let release = worker_events(log, "release");
    assert_eq!(release.len(), 1, "log:\n{log}");
    let r = &release[0];
    assert_eq!(r["outcome"], "released", "log:\n{log}");
    assert_eq!(r["requeued"], "1", "log:\n{log}");
    assert_eq!(r["token"], token, "fenced on the worker's token; log:\n{log}");
    assert_eq!(r["worker"], "signal:SIGKILL", "log:\n{log}");
    assert_eq!(r["deadline_reached"], "1", "log:\n{log}");
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
        1,
        false,
        &["--grace", "5s", "--orchestrator-timeout", "10s"],
        &["--heartbeat", "300ms", "--step", "100ms", "--steps", "5"],
    );
    let before = sb.wait_mid_job(1);
    assert_eq!(before.running, 1);

    let t0 = Instant::now();
    send(drainit.id(), libc::SIGTERM);
    let st = wait_exit(&mut drainit, Duration::from_secs(8))
        .unwrap_or_else(|| panic!("drainit still running 8s after SIGTERM (grace 5s); log:\n{}", sb.read_log(1)));
    let took = t0.elapsed();
    let log = sb.read_log(1);
    assert_eq!(code_of(st), 0, "drainit exit status {st:?}; log:\n{log}");
    assert!(took < Duration::from_millis(2500), "drainit took {took:?} of a 5s grace; log:\n{log}");
    sb.assert_nothing_left("after drainit exited");

    let stop = drainit_events(&log, "stop_requested");
    assert_eq!(stop.len(), 1, "one stop_requested expected; log:\n{log}");
    assert_eq!(stop[0]["signal"], "SIGTERM");
    assert!(drainit_events(&log, "deadline_reached").is_empty(), "no deadline expected; log:\n{log}");
    let exit = drainit_events(&log, "exit");
    assert_eq!(exit.last().map(|e| e["code"].as_str()), Some("0"), "log:\n{log}");
    let wexit = log
        .lines()
        .find(|l| l.starts_with("lease-worker: event=exit "))
        .unwrap_or_else(|| panic!("worker exit line missing; log:\n{log}"));
    let w = kv(wexit);
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
    let mut unshare = sb.spawn(1, true, &drainit_args, &worker_args);

    // drainit is unshare's child, PID 1 inside the namespace.
    let pid1 = poll_until("drainit as unshare's child", Duration::from_secs(10), || {
        children_of(unshare.id()).into_iter().find(|&c| {
            fs::read_link(format!("/proc/{c}/exe"))
                .map(|p| p.file_name().is_some_and(|n| n == "drainit"))
                .unwrap_or(false)
        })
    });
    sb.wait_mid_job(1);

    send(pid1, libc::SIGKILL);
    // unshare exits once its child is gone. (Its status is not checked: util-linux 2.38
    // tries to re-raise the child's SIGKILL on itself, fails, and exits 1.)
    wait_exit(&mut unshare, Duration::from_secs(10)).expect("unshare exits once its child is killed");
    assert!(
        fs::metadata(format!("/proc/{pid1}")).is_err() || proc_state(pid1) == Some('Z'),
        "drainit (pid {pid1}) survived SIGKILL"
    );
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
    let mut unshare = sb.spawn(2, true, &drainit_args, &worker_args);
    let st = wait_exit(&mut unshare, Duration::from_secs(40))
        .unwrap_or_else(|| panic!("restarted run did not finish in 40s; log:\n{}", sb.read_log(2)));
    let took = t0.elapsed();
    let log = sb.read_log(2);
    assert_eq!(code_of(st), 0, "restarted drainit {st:?}; log:\n{log}");
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
    let reclaim = kv(log.lines().nth(i_reclaim).unwrap());
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
        let state = sb.dir.join("state");
        fs::create_dir(&state).unwrap();
        let state = state.display().to_string();
        let mut drainit_args = vec!["--grace", "3s", "--orchestrator-timeout", "10s", "--backoff-timeout", "30s"];
        if sweep {
            // Python's start-up alone can take seconds on a loaded machine.
            drainit_args.extend(["--state-dir", &state, "--finish", &finish, "--finish-timeout", "20s"]);
        }
        let env = sb.lease_env();
        let mut unshare = sb.spawn_env(1, true, &drainit_args, &worker_args, &env);
        let pid1 = poll_until("drainit as unshare's child", Duration::from_secs(10), || {
            children_of(unshare.id()).into_iter().find(|&c| {
                fs::read_link(format!("/proc/{c}/exe")).is_ok_and(|p| p.file_name().is_some_and(|n| n == "drainit"))
            })
        });
        sb.wait_mid_job(1);
        send(pid1, libc::SIGKILL);
        wait_exit(&mut unshare, Duration::from_secs(10)).expect("unshare exits once its child is killed");
        sb.assert_nothing_left("after SIGKILL of the namespace's PID 1");
        assert_eq!(sb.status().leases[0]["state"], "fresh");
        let interrupted = sb.status().jobs.iter().find(|j| j.status == "running").map(|j| j.id).unwrap();

        let t0 = Instant::now();
        let mut unshare = sb.spawn_env(2, true, &drainit_args, &worker_args, &env);
        sb.wait_log(2, "the first job_started", Duration::from_secs(30), |l| l.contains("event=job_started"));
        took.push(t0.elapsed());
        let st = wait_exit(&mut unshare, Duration::from_secs(40))
            .unwrap_or_else(|| panic!("restarted run did not finish; log:\n{}", sb.read_log(2)));
        let log = sb.read_log(2);
        assert_eq!(code_of(st), 0, "log:\n{log}");
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
        1,
        false,
        &["--grace", "1s", "--orchestrator-timeout", "3s"],
        &["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--ignore-sigterm", "--long-step"],
    );
    sb.wait_log(1, "the long step", Duration::from_secs(20), |l| l.contains("event=long_step"));

    let t0 = Instant::now();
    send(drainit.id(), libc::SIGTERM);
    // The simulated orchestrator SIGKILLs at 3s: drainit must be gone before.
    let st = wait_exit(&mut drainit, Duration::from_secs(3));
    let took = t0.elapsed();
    let Some(st) = st else {
        send(drainit.id(), libc::SIGKILL);
        panic!("orchestrator timeout (3s) reached before drainit exited; log:\n{}", sb.read_log(1));
    };
    let log = sb.read_log(1);
    assert_eq!(code_of(st), 137, "drainit {st:?}; log:\n{log}");
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
    poll_until("the sweeper to requeue the orphan", Duration::from_secs(15), || {
        let (n, out) = sb.sweep();
        for line in out.lines().filter(|l| l.contains("event=requeued ")) {
            let age: f64 = kv(line)["lease_age"].trim_end_matches('s').parse().unwrap();
            assert!(age >= 3.0, "requeued under a fresh lease (stale is 3s):\n{out}");
        }
        if n == 0 {
            sweeps_while_fresh += 1;
        }
        (n == 1).then_some(())
    });
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
    let mut drainit = sb.spawn_env(
        1,
        false,
        &drainit_args,
        &["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--ignore-sigterm", "--long-step"],
        &env,
    );
    sb.wait_log(1, "the long step", Duration::from_secs(20), |l| l.contains("event=long_step"));
    let s = sb.status();
    assert_eq!(s.running, 1, "{s:?}");
    assert_eq!(s.leases[0]["state"], "fresh", "{s:?}");
    let interrupted = s.jobs.iter().find(|j| j.status == "running").map(|j| j.id).unwrap();
    let recorded = fs::read_to_string(sb.token_file()).expect("the worker records its token");
    assert_eq!(kv(&recorded)["token"], s.leases[0]["token"], "token file: {recorded:?}");

    send(drainit.id(), libc::SIGTERM);
    // The simulated orchestrator SIGKILLs at 5s: the kill and the finish program fit before.
    let Some(st) = wait_exit(&mut drainit, Duration::from_secs(5)) else {
        send(drainit.id(), libc::SIGKILL);
        panic!("orchestrator timeout (5s) reached before drainit exited; log:\n{}", sb.read_log(1));
    };
    let log = sb.read_log(1);
    assert_eq!(code_of(st), 137, "the finish program must not change the exit code; log:\n{log}");
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
        sb.spawn_env(2, false, &drainit_args, &["--heartbeat", "300ms", "--step", "100ms", "--steps", "2"], &env);
    // Well under the 30s a backoff until the stale threshold would take.
    let st = wait_exit(&mut drainit, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the new run did not finish in 20s; log:\n{}", sb.read_log(2)));
    let log = sb.read_log(2);
    assert_eq!(code_of(st), 0, "new drainit {st:?}; log:\n{log}");
    sb.assert_nothing_left("after the new run");
    assert!(drainit_events(&log, "backoff").is_empty(), "the released lease needs no backoff; log:\n{log}");
    assert!(worker_events(&log, "lease_busy").is_empty(), "log:\n{log}");
    assert_eq!(drainit_events(&log, "child_started").len(), 1, "log:\n{log}");
    let claimed = worker_events(&log, "lease_claimed");
    assert_eq!(claimed.len(), 1, "claimed, not reclaimed after going stale; log:\n{log}");
    assert_eq!(claimed[0]["previous"], "released", "log:\n{log}");
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
    let mut unshare = sb.spawn_env(1, true, &drainit_args, &worker_args, &wedge_env);

    // Watch the log and note when each milestone first shows (within one poll).
    let milestones = [
        "lease-worker: event=wedged ",
        "drainit: event=watchdog_expired ",
        "drainit: event=child_exited ",
        "drainit: event=exit ",
    ];
    let mut seen: HashMap<&str, Instant> = HashMap::new();
    let mut lease_during_wedge = None;
    let end = Instant::now() + Duration::from_secs(30);
    let st = loop {
        let log = sb.read_log(1);
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
        if let Some(st) = unshare.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= end {
            send(unshare.id(), libc::SIGKILL);
            panic!("drainit still running 30s after its start; log:\n{}", sb.read_log(1));
        }
        thread::sleep(POLL);
    };
    let exited_at = Instant::now();
    let log = sb.read_log(1);
    let at = |m: &str| *seen.get(m).unwrap_or_else(|| panic!("no {m:?} seen; log:\n{log}"));
    let (wedged_at, expired_at, reaped_at) = (at(milestones[0]), at(milestones[1]), at(milestones[2]));
    assert_eq!(code_of(st), 137, "the wedged worker dies at the grace deadline; log:\n{log}");
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
    let since = parse_shown(&e["since"]);
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
    let mut unshare = sb.spawn_env(2, true, &drainit_args, &worker_args, &env);
    let st = wait_exit(&mut unshare, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the new run did not finish in 20s; log:\n{}", sb.read_log(2)));
    let took = t0.elapsed();
    let log = sb.read_log(2);
    assert_eq!(code_of(st), 0, "new drainit {st:?}; log:\n{log}");
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

/// `release` is fenced on the token in its token file, so it never frees a lease a
/// newer holder took. Worker A (token 1) is frozen mid-job until its lease goes
/// stale; worker B, another "container" of the same host with its own token file,
/// reclaims it (token 2) and works. A is SIGKILLed and `release` runs with A's file:
/// B's lease and job are untouched, and a second run finds nothing. B is SIGKILLed
/// and `release` with B's file frees the lease and requeues B's job; again, nothing.
#[test]
fn release_never_frees_a_newer_holders_lease() {
    let sb = Sandbox::new("fenced", "2s", 3);
    let (file_a, file_b) = (sb.dir.join("token-a"), sb.dir.join("token-b"));
    let long = ["--heartbeat", "300ms", "--step", "1s", "--steps", "30", "--long-step"];

    let mut a = sb.spawn_plain(1, &file_a, &long);
    sb.wait_log(1, "A's long step", Duration::from_secs(20), |l| l.contains("event=long_step"));
    assert_eq!(kv(&fs::read_to_string(&file_a).unwrap())["token"], "1");
    send(a.id(), libc::SIGSTOP);
    poll_until("A's lease to go stale", Duration::from_secs(10), || {
        let s = sb.status();
        (s.leases[0]["state"] == "stale").then_some(())
    });

    let mut b = sb.spawn_plain(2, &file_b, &long);
    sb.wait_log(2, "B's long step", Duration::from_secs(20), |l| l.contains("event=long_step"));
    let reclaimed = worker_events(&sb.read_log(2), "lease_reclaimed");
    assert_eq!(reclaimed.len(), 1, "log:\n{}", sb.read_log(2));
    assert_eq!(reclaimed[0]["token"], "2");
    assert_eq!(kv(&fs::read_to_string(&file_b).unwrap())["token"], "2");

    send(a.id(), libc::SIGKILL);
    wait_exit(&mut a, Duration::from_secs(5)).expect("A dies of SIGKILL");
    for round in 1..=2 {
        let (ev, out) = sb.release(&file_a);
        let want = if round == 1 { "newer_holder" } else { "nothing_held" };
        assert_eq!(ev["outcome"], want, "release with A's token, round {round}:\n{out}");
        assert_eq!(ev.get("requeued").map(String::as_str).unwrap_or("0"), "0", "{out}");
        let s = sb.status();
        assert_eq!(s.running, 1, "B's job must stay running: {s:?}");
        assert_eq!(s.leases[0]["state"], "fresh", "B's lease must stay held: {s:?}");
        assert_eq!(s.leases[0]["token"], "2", "{s:?}");
        assert_eq!(s.leases[0]["pid"], b.id().to_string(), "{s:?}");
    }

    send(b.id(), libc::SIGKILL);
    wait_exit(&mut b, Duration::from_secs(5)).expect("B dies of SIGKILL");
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
