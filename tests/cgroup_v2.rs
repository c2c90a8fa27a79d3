//! drainit on a real cgroup v2 kernel (the contract's Memory and The
//! predecessor sections, issues 32 and 33). This machine and CI's run cgroup
//! v1, so the suite boots its own VM: Debian's kernel package under
//! qemu-system-x86_64 (TCG), an initramfs of busybox, the static drainit and
//! small static helpers (tests/vm/: `build` makes it, `run` boots it,
//! `scenarios.sh` holds the scenarios, docs/testing-vm.md says how to run it
//! alone). Each scenario runs drainit as PID 1 of a container-like sandbox:
//! its own cgroup with `memory.max=64M`, no swap, `memory.oom.group` 1 (the
//! kubelet's since Kubernetes 1.28) or 0 (Docker's), PID + mount + cgroup
//! namespaces and the cgroup2 fs read-only at /sys/fs/cgroup, or the host's
//! view of the same cgroup.
//!
//! The lease worker's scenario (examples/lease-worker under the group kill)
//! runs python3 from this machine's root, which tests/vm/run shares with the
//! VM read-only over 9p.
//!
//! The VM boots once per test process and runs every scenario; each test
//! below asserts on its scenario's output (the blocks scenarios.sh prints).
//! A missing tool (qemu, cpio, busybox-static, apt's lists for the kernel)
//! fails every test with the reason: no skip.

mod containers;
mod kit;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use containers::{MANIFEST_DIR, run_bounded, statics};
use kit::{BIN, Event, check_log_end, is_static_elf, parse_events, parse_events_tagged};

/// The limit every scenario's container has (scenarios.sh's LIMIT, 64M).
const LIMIT: u64 = 64 << 20;
/// Bound on the whole VM run: the build (a first kernel download, the static
/// drainit) and the boot with every scenario; tests/vm/run bounds qemu
/// itself at 300 s.
const VM_RUN_TIMEOUT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------
// The VM run and its output.

/// One scenario's output: scenarios.sh's named blocks, and the shell's exit
/// status (137: /init killed it at its timeout).
struct Scenario {
    name: String,
    rc: i32,
    blocks: Vec<(String, String)>,
    text: String,
}

impl Scenario {
    /// A block's lines; panics, with the whole scenario, when it is missing.
    fn block(&self, name: &str) -> &str {
        match self.blocks.iter().find(|(n, _)| n == name) {
            Some((_, text)) => text,
            None => panic!("scenario {} printed no block {name}:\n{}", self.name, self.text),
        }
    }

    fn events(&self, block: &str) -> Vec<Event> {
        parse_events(self.block(block))
    }

    /// The one event named `name` in the log block `block`.
    fn event(&self, block: &str, name: &str) -> Event {
        let all: Vec<Event> = self.events(block).into_iter().filter(|e| e.name == name).collect();
        assert_eq!(all.len(), 1, "want one {name} event in {}'s {block}:\n{}", self.name, self.text);
        all.into_iter().next().unwrap()
    }

    fn has_event(&self, block: &str, name: &str) -> bool {
        self.events(block).iter().any(|e| e.name == name)
    }

    /// A memory.events block as counters.
    fn counters(&self, block: &str) -> HashMap<String, u64> {
        self.block(block)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }

    fn counter(&self, block: &str, key: &str) -> u64 {
        match self.counters(block).get(key) {
            Some(n) => *n,
            None => panic!("no {key} in {}'s {block}:\n{}", self.name, self.text),
        }
    }

    /// envrec's records in the order the programs ran: (tag, variables).
    fn records(&self) -> Vec<(String, HashMap<String, String>)> {
        let mut records: Vec<(String, HashMap<String, String>)> = Vec::new();
        for line in self.block("env").lines() {
            if let Some(head) = line.strip_prefix("--- ") {
                records.push((head.split(' ').next().unwrap_or("").to_string(), HashMap::new()));
            } else if let (Some((k, v)), Some(last)) = (line.split_once('='), records.last_mut()) {
                last.1.insert(k.to_string(), v.to_string());
            }
        }
        records
    }

    /// The variables of the only record tagged `tag`.
    fn record(&self, tag: &str) -> HashMap<String, String> {
        let all: Vec<_> = self.records().into_iter().filter(|(t, _)| t == tag).collect();
        assert_eq!(all.len(), 1, "want one {tag} record in {}:\n{}", self.name, self.text);
        all.into_iter().next().unwrap().1
    }

    /// `status`-like block: drainit's end as the sandbox saw it.
    fn status(&self, block: &str) -> String {
        self.block(block).trim().to_string()
    }
}

fn var<'a>(vars: &'a HashMap<String, String>, key: &str) -> &'a str {
    vars.get(key).map(String::as_str).unwrap_or("<unset>")
}

struct VmRun {
    scenarios: HashMap<String, Scenario>,
    console: String,
}

/// Parse tests/vm/run's output (see tests/vm/init for the markers).
fn parse(console: &str) -> HashMap<String, Scenario> {
    let mut out = HashMap::new();
    let mut current: Option<Scenario> = None;
    for line in console.lines() {
        if let Some(rest) = line.strip_prefix("=== BEGIN ") {
            let name = rest.split(' ').next().unwrap_or("").to_string();
            let text = format!("--- scenario {name}\n");
            current = Some(Scenario { name, rc: -1, blocks: Vec::new(), text });
        } else if let Some(rest) = line.strip_prefix("=== END ") {
            if let Some(mut s) = current.take() {
                s.rc = rest.split(' ').find_map(|w| w.strip_prefix("rc=")).and_then(|n| n.parse().ok()).unwrap_or(-1);
                out.insert(s.name.clone(), s);
            }
        } else if let Some(s) = current.as_mut() {
            s.text.push_str(line);
            s.text.push('\n');
            if let Some(name) = line.strip_prefix("@@ ") {
                s.blocks.push((name.trim().to_string(), String::new()));
            } else if let Some((_, text)) = s.blocks.last_mut() {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    out
}

/// The static drainit for the VM: the binary under test when it is static
/// (the musl test run), else the documented static build of this tree.
fn static_drainit() -> PathBuf {
    match is_static_elf(BIN) {
        Ok(true) => PathBuf::from(BIN),
        _ => statics().drainit.clone(),
    }
}

/// The one VM run of this test process: every scenario, booted once.
fn vm() -> &'static VmRun {
    static RUN: OnceLock<Result<VmRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        let mut cmd = Command::new(Path::new(MANIFEST_DIR).join("tests/vm/run"));
        cmd.arg("--drainit").arg(static_drainit()).current_dir(MANIFEST_DIR);
        let out = run_bounded(cmd, VM_RUN_TIMEOUT)?;
        let console = out.stdout.clone();
        if !out.status.success() {
            return Err(format!("tests/vm/run failed ({}):\n{}", out.status, out.text()));
        }
        let summary: Vec<&str> = console.lines().filter(|l| l.starts_with("=== ")).collect();
        println!("cgroup v2 VM:\n{}", summary.join("\n"));
        Ok(VmRun { scenarios: parse(&console), console })
    });
    match run {
        Ok(run) => run,
        Err(e) => panic!("the cgroup v2 VM did not run: {e}"),
    }
}

/// A scenario's output; panics when the VM did not finish it.
fn scenario(name: &str) -> &'static Scenario {
    let run = vm();
    match run.scenarios.get(name) {
        Some(s) if s.rc == 0 => s,
        Some(s) => panic!("scenario {name} ended with rc={} (137: killed at its timeout):\n{}", s.rc, s.text),
        None => panic!("the VM printed no scenario {name}:\n{}", run.console),
    }
}

/// The `climb` block's last step: the MiB the climber held and when (ms
/// since its start).
fn climbed(s: &Scenario) -> Option<(u64, u64)> {
    s.block("climb").lines().rev().find_map(|l| {
        let (mib, ms) = l.split_once(' ')?;
        Some((mib.parse().ok()?, ms.parse().ok()?))
    })
}

// ---------------------------------------------------------------------------
// The rig: the sandbox is what a container sees.

/// In the container view drainit is PID 1, /proc/self/cgroup says `0::/`
/// and the read-only cgroup2 mount's root is the container's own cgroup
/// (its memory.max); in the host view the path names the cgroup.
#[test]
fn sandbox_gives_the_container_and_the_host_view() {
    let s = scenario("sandbox_views");
    let container = s.block("container");
    for want in ["pid1 drainit", "cgroup 0::/\n", &format!("max {LIMIT}")] {
        assert!(container.contains(want), "container view lacks {want:?}:\n{}", s.text);
    }
    let mount = container.lines().find(|l| l.starts_with("mount ")).unwrap_or("");
    assert!(mount.contains(" cgroup2 ro,"), "the cgroup2 fs is not mounted read-only:\n{}", s.text);
    let host = s.block("host");
    for want in ["pid1 drainit", "cgroup 0::/sandbox_views\n"] {
        assert!(host.contains(want), "host view lacks {want:?}:\n{}", s.text);
    }
    assert_eq!(s.status("container_status"), "exited 0", "{}", s.text);
    assert_eq!(s.status("host_status"), "exited 0", "{}", s.text);
}

// ---------------------------------------------------------------------------
// Told: OOM kills.

/// Kubernetes (`memory.oom.group=1`): one OOM kill takes every process of
/// the container, drainit included: no `exit` line, no finish program. What
/// the predecessor sweep (`--state-dir`) is for.
#[test]
fn group_oom_kill_takes_drainit_with_the_worker() {
    let s = scenario("group_oom_kills_drainit");
    assert_eq!(s.status("status"), "signal 9", "drainit survived the group kill:\n{}", s.text);
    assert!(s.has_event("log", "child_started"), "{}", s.text);
    assert!(!s.has_event("log", "exit"), "an exit line after a group kill:\n{}", s.text);
    assert!(s.records().is_empty(), "the finish program ran:\n{}", s.text);
    assert!(
        s.counter("events_after", "oom_kill") > s.counter("events_before", "oom_kill"),
        "the cgroup's oom_kill count did not rise:\n{}",
        s.text
    );
    assert!(s.counter("events_after", "oom_group_kill") >= 1, "{}", s.text);
}

/// Docker (`memory.oom.group=0`): the OOM killer takes the worker alone, and
/// drainit tells it: `oom=1` on the worker's `child_exited`, an `oom_kill`
/// event, `oom_kills=1` on `exit` and in the termination message, and for
/// the finish program `DRAINIT_WORKER_STATUS=oom_kill`, `DRAINIT_OOM_KILLS=1`.
#[test]
fn oom_killed_worker_is_told() {
    let s = scenario("oom_kill_worker");
    check_oom_killed_worker(s, 137);
}

/// The same with drainit outside a cgroup namespace (it finds its cgroup by
/// /proc/self/cgroup's path) and `--oom-exit-code 200`: exit 200, not 137.
#[test]
fn oom_killed_worker_is_told_from_the_host_view_with_its_exit_code() {
    let s = scenario("oom_kill_worker_host_view");
    check_oom_killed_worker(s, 200);
}

/// The same with drainit not PID 1 of its container (a shell is): a process
/// that is not PID 1 reads /proc/self/cgroup first, which names no path
/// (`0::/`), and then finds the container's counter at the mount's root.
#[test]
fn oom_killed_worker_is_told_when_drainit_is_not_pid1() {
    let s = scenario("oom_kill_worker_not_pid1");
    // The shell is pid 1 of the container, drainit 2, the worker 3.
    assert_eq!(s.event("log", "child_started").get("pid"), Some("3"), "{}", s.text);
    check_oom_killed_worker(s, 137);
}

fn check_oom_killed_worker(s: &Scenario, code: i32) {
    assert_eq!(s.status("status"), format!("exited {code}"), "{}", s.text);
    assert_eq!(s.counter("events_after", "oom_kill") - s.counter("events_before", "oom_kill"), 1, "{}", s.text);
    let exited = s.event("log", "child_exited");
    assert_eq!((exited.get("signal"), exited.get("oom")), (Some("SIGKILL"), Some("1")), "{}", s.text);
    let oom = s.event("log", "oom_kill");
    assert_eq!((oom.get("count"), oom.get("total")), (Some("1"), Some("1")), "{}", s.text);
    let exit = s.event("log", "exit");
    assert_eq!(exit.get("oom_kills"), Some("1"), "{}", s.text);
    check_log_end(s.block("log"), code).unwrap();
    let finish = s.record("finish");
    assert_eq!(var(&finish, "DRAINIT_WORKER_STATUS"), "oom_kill", "{}", s.text);
    assert_eq!(var(&finish, "DRAINIT_OOM_KILLS"), "1", "{}", s.text);
    assert_eq!(var(&finish, "DRAINIT_EXIT_CODE"), code.to_string(), "{}", s.text);
    let tlog = s.block("tlog");
    assert!(
        tlog.contains(&format!("code={code} ")) && tlog.contains("oom_kills=1"),
        "termination message:\n{}",
        s.text
    );
}

/// A worker's child OOM-killed while the worker survives: the kill is told
/// as it happens (`oom_kill` while the worker still runs: memory.events
/// wakes the wait), and at the end (`oom_kills=1`, `DRAINIT_OOM_KILLS=1`);
/// the worker's own end (3, on the stop) is not called one.
#[test]
fn oom_kill_of_the_workers_child_is_told_as_it_happens() {
    let s = scenario("oom_kill_workers_child");
    assert_eq!(s.status("status"), "exited 3", "{}", s.text);
    assert_eq!(s.block("child").trim(), "child 137", "the climber was not SIGKILLed:\n{}", s.text);
    assert_eq!(s.counter("events_after", "oom_kill") - s.counter("events_before", "oom_kill"), 1, "{}", s.text);
    assert_eq!(s.block("told_while_running").trim(), "yes", "no oom_kill line while the worker ran:\n{}", s.text);
    let oom = s.event("log", "oom_kill");
    assert_eq!((oom.get("count"), oom.get("total")), (Some("1"), Some("1")), "{}", s.text);
    let exited = s.event("log", "child_exited");
    assert_eq!((exited.get("code"), exited.get("oom")), (Some("3"), None), "{}", s.text);
    assert_eq!(s.event("log", "exit").get("oom_kills"), Some("1"), "{}", s.text);
    check_log_end(s.block("log"), 3).unwrap();
    let finish = s.record("finish");
    assert_eq!(var(&finish, "DRAINIT_OOM_KILLS"), "1", "{}", s.text);
    assert_eq!(var(&finish, "DRAINIT_WORKER_STATUS"), "exited:3", "{}", s.text);
}

// ---------------------------------------------------------------------------
// Turned: --memory-stop.

/// Under `memory.oom.group=1` only a stop before the kill saves the
/// worker's cleanup: a climb of 2 MiB every 20 ms to 200 MiB under a 64 MiB
/// limit, with `--memory-stop 80 --memory-check 50ms`, is stopped by drainit
/// (`memory_stop`, SIGTERM), drains, runs the finish program with
/// `DRAINIT_STOP_REASON=memory`, exits 143, and the OOM killer never runs.
/// Prints the margin: the working set at the stop against the limit.
#[test]
fn memory_stop_beats_the_group_oom_kill() {
    let s = scenario("memory_stop_climb");
    assert_eq!(s.status("status"), "exited 143", "{}", s.text);
    assert_eq!(s.counter("events_after", "oom_kill"), s.counter("events_before", "oom_kill"), "{}", s.text);
    assert_eq!(s.counter("events_after", "oom"), 0, "the cgroup reached OOM:\n{}", s.text);
    let stop = s.event("log", "memory_stop");
    assert_eq!((stop.get("limit"), stop.get("percent")), (Some(LIMIT.to_string().as_str()), Some("80")), "{}", s.text);
    assert_eq!(stop.get("signal"), Some("SIGTERM"), "{}", s.text);
    let used = stop.num("used") as u64;
    assert!((LIMIT * 80 / 100..LIMIT).contains(&used), "used={used} is not within [80%, 100%) of {LIMIT}:\n{}", s.text);
    let names: Vec<String> = s.events("log").into_iter().map(|e| e.name).collect();
    let at = |n: &str| names.iter().position(|x| x == n);
    assert!(at("memory_stop") < at("child_exited"), "the worker ended before the stop:\n{}", s.text);
    assert!(!names.iter().any(|n| n == "deadline_reached"), "{}", s.text);
    assert!(s.block("climb").lines().any(|l| l.starts_with("term ")), "the climber saw no SIGTERM:\n{}", s.text);
    check_log_end(s.block("log"), 143).unwrap();
    let finish = s.record("finish");
    assert_eq!(var(&finish, "DRAINIT_STOP_REASON"), "memory", "{}", s.text);
    assert_eq!(var(&finish, "DRAINIT_EXIT_CODE"), "143", "{}", s.text);
    assert_eq!(var(&finish, "DRAINIT_OOM_KILLS"), "0", "{}", s.text);
    assert!(s.block("tlog").contains("reason=memory"), "termination message:\n{}", s.text);
    let (held, ms) = climbed(s).unwrap_or((0, 0));
    println!(
        "memory_stop margin: working set {used} B ({:.1} MiB, {:.1}% of the {} MiB limit) at the stop, \
         {:.1} MiB below it; the climber held {held} MiB after {ms} ms ({:.0} MiB/s under TCG) when \
         SIGTERM came; cgroup peak {} B",
        used as f64 / 1048576.0,
        used as f64 * 100.0 / LIMIT as f64,
        LIMIT >> 20,
        (LIMIT - used) as f64 / 1048576.0,
        held as f64 * 1000.0 / ms.max(1) as f64,
        s.block("peak").trim(),
    );
}

/// `--memory-stop` in a cgroup with no limit (`memory.max` is `max`): one
/// `memory_stop_off reason=no_limit`, and the worker runs as usual.
#[test]
fn memory_stop_off_without_a_limit() {
    let s = scenario("memory_stop_no_limit");
    assert_eq!(s.status("status"), "exited 0", "{}", s.text);
    assert_eq!(s.event("log", "memory_stop_off").get("reason"), Some("no_limit"), "{}", s.text);
    assert!(!s.has_event("log", "memory_stop"), "{}", s.text);
    s.record("worker");
    check_log_end(s.block("log"), 0).unwrap();
}

// ---------------------------------------------------------------------------
// The wait: no polling.

/// What an idle scenario measured over its idle seconds: drainit's
/// wakeups (voluntary context switches: each return from its one wait is
/// one), its preemptions (involuntary ones), its read calls, and whether it
/// holds memory.events open (the memory source of its one wait).
struct Idle {
    seconds: u64,
    wakeups: u64,
    preemptions: u64,
    reads: u64,
    holds_memory_events: bool,
}

fn idle(s: &Scenario) -> Idle {
    let get = |block: &str, key: &str| -> u64 {
        s.block(block)
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim_start_matches(':').trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {block}:\n{}", s.text))
    };
    let delta = |key: &str| get("wakeups_after", key) - get("wakeups_before", key);
    Idle {
        seconds: s.block("idle_seconds").trim().parse().unwrap(),
        wakeups: delta("voluntary_ctxt_switches"),
        preemptions: delta("nonvoluntary_ctxt_switches"),
        reads: delta("syscr"),
        holds_memory_events: s.block("fds").lines().any(|l| l.ends_with("memory.events")),
    }
}

/// An idle drainit with the memory source in its wait (v2: memory.events,
/// POLLPRI) does not wake at all.
#[test]
fn idle_drainit_waits_on_memory_events_without_waking() {
    let s = scenario("idle");
    let m = idle(s);
    assert!(m.holds_memory_events, "drainit holds no memory.events open:\n{}", s.text);
    assert_eq!((m.wakeups, m.preemptions, m.reads), (0, 0, 0), "an idle drainit ran in {} s:\n{}", m.seconds, s.text);
    println!("idle: 0 wakeups, 0 reads in {} s", m.seconds);
}

/// With `--memory-stop`, the check is drainit's one periodic wakeup: one
/// per `--memory-check` (500ms here), each with a read of the usage.
#[test]
fn memory_check_is_the_one_periodic_wakeup() {
    let s = scenario("idle_memory_check");
    let m = idle(s);
    let checks = m.seconds * 2;
    println!("memory check: {} wakeups, {} read calls in {} s at 500ms", m.wakeups, m.reads, m.seconds);
    assert!(m.holds_memory_events, "drainit holds no memory.events open:\n{}", s.text);
    assert!(
        (checks - 1..=checks + 1).contains(&m.wakeups),
        "{} wakeups in {} s of 500ms checks (want {checks}, one per check):\n{}",
        m.wakeups,
        m.seconds,
        s.text
    );
    // A usage reading is memory.current and memory.stat, each read to its
    // end (memory.stat may come in more than one piece): a few read calls
    // per check, never none, never more as time goes on.
    assert!(
        m.reads >= checks - 1 && m.reads <= 6 * m.wakeups,
        "{} read calls for {} wakeups (want one usage reading per check):\n{}",
        m.reads,
        m.wakeups,
        s.text
    );
    assert!(!s.has_event("log", "memory_stop"), "{}", s.text);
}

// ---------------------------------------------------------------------------
// The predecessor: --state-dir.

/// Kubernetes' group OOM kill takes drainit with its worker; the next start
/// with the same state directory logs `unclean_predecessor` and runs the
/// finish program (`DRAINIT_STOP_REASON=unclean_predecessor`) before the
/// worker, which then sees `DRAINIT_PREDECESSOR=unclean`.
#[test]
fn state_dir_sweeps_up_after_a_group_oom_kill() {
    let s = scenario("state_dir_after_group_oom");
    assert_eq!(s.status("first_status"), "signal 9", "{}", s.text);
    assert!(!s.has_event("first_log", "exit"), "{}", s.text);
    assert!(s.counter("first_events_after", "oom_group_kill") >= 1, "{}", s.text);
    assert_eq!(s.status("status"), "exited 0", "{}", s.text);
    let unclean = s.event("log", "unclean_predecessor");
    assert_eq!(unclean.get("attempt"), Some("1"), "{}", s.text);
    assert!(unclean.num("pid") > 0 && unclean.get("age").is_some(), "{}", s.text);
    let names: Vec<String> = s.events("log").into_iter().map(|e| e.name).collect();
    let at = |n: &str| names.iter().position(|x| x == n);
    assert!(
        at("unclean_predecessor") < at("finish_started") && at("finish_started") < at("child_started"),
        "the sweep did not come before the worker:\n{}",
        s.text
    );
    let records = s.records();
    let tags: Vec<&str> = records.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tags, ["finish", "worker", "finish"], "{}", s.text);
    let sweep = &records[0].1;
    assert_eq!(var(sweep, "DRAINIT_STOP_REASON"), "unclean_predecessor", "{}", s.text);
    assert_eq!(var(sweep, "DRAINIT_WORKER_STATUS"), "unknown", "{}", s.text);
    assert_eq!(var(sweep, "DRAINIT_ATTEMPT"), "1", "{}", s.text);
    assert_eq!(var(sweep, "DRAINIT_PREDECESSOR_PID"), &unclean["pid"], "{}", s.text);
    assert!(var(sweep, "DRAINIT_PREDECESSOR_STARTED").parse::<u64>().is_ok(), "{}", s.text);
    assert_eq!(var(&records[1].1, "DRAINIT_PREDECESSOR"), "unclean", "{}", s.text);
    assert_eq!(var(&records[2].1, "DRAINIT_STOP_REASON"), "none", "{}", s.text);
    check_log_end(s.block("log"), 0).unwrap();
}

// ---------------------------------------------------------------------------
// The lease worker (examples/lease-worker) under the group kill.

/// The lease worker's events (its own and `release`'s) in a log block.
fn lease_events(s: &Scenario, block: &str, name: &str) -> Vec<Event> {
    parse_events_tagged("lease-worker", s.block(block)).into_iter().filter(|e| e.name == name).collect()
}

/// Kubernetes' group OOM kill of the lease worker's container: at its second
/// job the worker takes 512 MiB of a 64 MiB container, and the kill takes
/// drainit with it (no `exit`, no `release`: the lease stays held, the job
/// `running`). The next container, with the same `--state-dir`, logs
/// `unclean_predecessor` and runs `release` first (told
/// `DRAINIT_STOP_REASON=unclean_predecessor`): the lease freed and the job
/// requeued before the worker starts, which claims the lease at once (the
/// next token, no backoff although the stale threshold is 30s) and does
/// every job left: each done exactly once, the eaten one twice attempted.
#[test]
fn lease_worker_group_oom_kill_is_swept_up_by_release() {
    let s = scenario("lease_worker_group_oom");
    assert_eq!(s.status("first_status"), "signal 9", "drainit survived the group kill:\n{}", s.text);
    assert!(s.counter("first_events_after", "oom_group_kill") >= 1, "{}", s.text);
    assert!(!s.has_event("first_log", "exit"), "{}", s.text);
    let claimed = lease_events(s, "first_log", "lease_claimed");
    assert_eq!(claimed.len(), 1, "{}", s.text);
    let token: u32 = claimed[0].num("token") as u32;
    let eating = lease_events(s, "first_log", "eating");
    assert_eq!(eating.len(), 1, "{}", s.text);
    let eaten_job = eating[0]["job"].to_string();
    assert!(lease_events(s, "first_log", "eaten").is_empty(), "512 MiB fit in 64 MiB?\n{}", s.text);
    assert!(lease_events(s, "first_log", "release").is_empty(), "release ran after the group kill:\n{}", s.text);
    assert!(lease_events(s, "first_log", "exit").is_empty(), "{}", s.text);

    // The sweep: release before the worker, fenced on the dead worker's token.
    assert_eq!(s.status("status"), "exited 0", "{}", s.text);
    let unclean = s.event("log", "unclean_predecessor");
    assert_eq!(unclean.get("attempt"), Some("1"), "{}", s.text);
    let release = lease_events(s, "log", "release");
    assert_eq!(release.len(), 2, "the sweep's and the exit's:\n{}", s.text);
    let r = &release[0];
    assert_eq!(r.get("outcome"), Some("released"), "{}", s.text);
    assert_eq!(r.get("token"), Some(token.to_string().as_str()), "{}", s.text);
    assert_eq!(r.get("requeued"), Some("1"), "the dead worker's job, at once:\n{}", s.text);
    assert_eq!(r.get("stop_reason"), Some("unclean_predecessor"), "{}", s.text);
    assert_eq!(r.get("worker"), Some("unknown"), "{}", s.text);
    let lines: Vec<&str> = s.block("log").lines().collect();
    let at = |pat: &str| lines.iter().position(|l| l.starts_with(pat));
    assert!(
        at("drainit: event=unclean_predecessor") < at("drainit: event=finish_started")
            && at("drainit: event=finish_started") < at("lease-worker: event=release ")
            && at("lease-worker: event=release ") < at("drainit: event=finish_exited")
            && at("drainit: event=finish_exited") < at("drainit: event=child_started"),
        "the sweep did not come before the worker:\n{}",
        s.text
    );

    // The worker at once: no backoff, the lease taken as released.
    assert!(!s.has_event("log", "backoff"), "the released lease needs no backoff:\n{}", s.text);
    assert!(lease_events(s, "log", "lease_busy").is_empty(), "{}", s.text);
    assert_eq!(s.events("log").iter().filter(|e| e.name == "child_started").count(), 1, "{}", s.text);
    let claimed = lease_events(s, "log", "lease_claimed");
    assert_eq!(claimed.len(), 1, "{}", s.text);
    assert_eq!(claimed[0].get("previous"), Some("released"), "{}", s.text);
    assert_eq!(claimed[0].get("token"), Some((token + 1).to_string().as_str()), "{}", s.text);
    assert_eq!(claimed[0].get("requeued"), Some("0"), "release had requeued the job already:\n{}", s.text);
    assert_eq!(release[1].get("outcome"), Some("nothing_held"), "{}", s.text);
    check_log_end(s.block("log"), 0).unwrap();

    // Every job done exactly once; the eaten one attempted twice.
    let db = s.block("db");
    let summary = db.lines().find(|l| l.starts_with("summary ")).unwrap_or_else(|| panic!("{}", s.text));
    assert!(
        summary.contains(" jobs=4 ")
            && summary.contains(" running=0 ")
            && summary.contains(" done=4 ")
            && summary.contains(" completions=4 ")
            && summary.contains(" duplicates=0"),
        "{}",
        s.text
    );
    let eaten = format!("job id={eaten_job} status=done attempts=2 ");
    assert!(db.lines().any(|l| l.starts_with(&eaten)), "want {eaten:?}:\n{}", s.text);
    assert!(db.lines().any(|l| l.starts_with("lease ") && l.ends_with(" state=released")), "{}", s.text);
}
