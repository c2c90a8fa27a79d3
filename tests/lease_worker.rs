//! Issue 4: a real lease-holding worker under drainit loses nothing, whether it is
//! stopped with SIGTERM, SIGKILLed with its whole PID namespace mid-job, or ignores
//! SIGTERM until drainit's deadline SIGKILLs it.
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

    fn common_args(&self) -> Vec<String> {
        vec![
            "--db".into(),
            self.db.display().to_string(),
            "--host".into(),
            self.host.clone(),
            "--stale".into(),
            self.stale.into(),
        ]
    }

    fn python(&self) -> Command {
        let mut c = Command::new("python3");
        c.arg(worker_py());
        for (k, _) in std::env::vars() {
            if k.starts_with("DRAINIT_") || k.starts_with("LEASE_") {
                c.env_remove(&k);
            }
        }
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

    /// `[unshare --pid --fork --mount-proc] drainit DRAINIT_ARGS -- python3 worker.py run ...`,
    /// stdout and stderr appended to run<n>.log.
    fn spawn(&self, n: u32, pid_ns: bool, drainit_args: &[&str], worker_args: &[&str]) -> Child {
        let mut c = if pid_ns {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--mount-proc", DRAINIT]);
            c
        } else {
            Command::new(DRAINIT)
        };
        c.args(drainit_args).arg("--").arg("python3").arg(worker_py()).arg("run");
        c.args(self.common_args()).args(worker_args);
        for (k, _) in std::env::vars() {
            if k.starts_with("DRAINIT_") || k.starts_with("LEASE_") {
                c.env_remove(&k);
            }
        }
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

fn line_index(log: &str, pred: impl Fn(&str) -> bool) -> Option<usize> {
    log.lines().position(pred)
}

// ---------------------------------------------------------------------------
// the scenarios

const JOBS: u32 = 6;

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
    let before = sb.wait_mid_job(1);
    let interrupted: Vec<u32> = before.jobs.iter().filter(|j| j.status == "running").map(|j| j.id).collect();
    assert_eq!(interrupted.len(), 1);

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

    let s = sb.status();
    assert_eq!(s.done, JOBS, "every job done: {s:?}");
    assert_eq!(s.running, 0, "{s:?}");
    assert_eq!(s.completions, JOBS, "each job completed exactly once: {s:?}");
    assert_eq!(s.duplicates, 0, "{s:?}");
    for j in &s.jobs {
        assert_eq!(j.completions, 1, "job {} completed {} times", j.id, j.completions);
    }
    let again = s.jobs.iter().find(|j| j.id == interrupted[0]).unwrap();
    assert_eq!(again.attempts, 2, "the interrupted job ran twice, finished once: {again:?}");
    assert_eq!(s.leases[0]["state"], "released", "{s:?}");
    eprintln!("[sigkill] restarted run took {took:?}");
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
