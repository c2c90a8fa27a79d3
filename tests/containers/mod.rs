//! What the container tests share (tests/docker.rs: drainit as an image's
//! entry point on the machine's engine; tests/engines.rs: drainit in the init
//! slot of a private dockerd and of Podman): bounded commands, the static
//! drainit and busybox, `FROM scratch` root filesystems, and a container
//! engine's CLI (`docker` or `podman`) with guards that remove what it made.
//!
//! Every command and every wait here has a deadline; a missing prerequisite
//! is a clear panic naming what to install, never a skip. It builds on the
//! test kit (tests/kit/): its bounded waits, its [`Scratch`] directories
//! (written into through [`ScratchFiles`]), its /proc [`Stat`] parser and its
//! ELF check; each user declares `mod kit;` before `mod containers;`.
#![allow(dead_code)]

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::kit::{Scratch, Stat, is_static_elf, wait_for, wait_until};

pub const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// Bound on one ordinary engine command (run, stop, build or import of a tiny image).
pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on waiting for a line in a container's log.
pub const LOG_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Workers, copied into every test image under /workers/.

/// Ignores SIGTERM in itself and in everything it starts (an ignored signal
/// stays ignored across exec), so only a SIGKILL ends it.
pub const IGNORE_TERM_WORKER: &str = r#"
trap '' TERM
echo "ignore-term: ready"
while :; do sleep 1; done
"#;

/// Starts a grandchild of drainit (a background `sh`, same process group) that
/// reports SIGUSR1, and reports SIGUSR1 itself.
pub const USR1_GRANDCHILD_WORKER: &str = r#"
trap 'echo "worker: got USR1"' USR1
sh -c 'trap "echo grandchild: got USR1" USR1; echo "grandchild: ready pid=$$ ppid=$PPID"; while :; do sleep 0.1; done' &
while :; do sleep 0.1; done
"#;

/// Makes orphans: each `sh -c` exits at once, leaving its background `sleep`
/// to be re-parented to PID 1 (drainit); the test then kills them, and drainit
/// must reap them.
pub const ORPHANS_WORKER: &str = r#"
i=0
while [ "$i" -lt 20 ]; do
    sh -c 'sleep 1000 & exit 0'
    i=$((i + 1))
done
echo "orphans: spawned $i"
while :; do sleep 1; done
"#;

/// Says at once when SIGTERM reaches it (its loop sleeps 0.1s at a time),
/// then exits 0.
pub const TERM_REPORTER_WORKER: &str = r#"
stopping=
trap 'stopping=1' TERM
echo "term-reporter: ready"
while [ -z "$stopping" ]; do sleep 0.1; done
echo "term-reporter: got TERM"
exit 0
"#;

// ---------------------------------------------------------------------------
// Bounded commands.

pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn text(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Runs `cmd` with stdin closed, collecting its output; kills it and fails
/// after `timeout`.
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<Out, String> {
    let desc = format!("{cmd:?}");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {desc}: {e}"))?;
    let mut so = child.stdout.take().expect("piped stdout");
    let mut se = child.stderr.take().expect("piped stderr");
    let t_out = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = match wait_for(timeout, || child.try_wait().transpose()) {
        Some(Ok(status)) => status,
        Some(Err(e)) => return Err(format!("waiting for {desc}: {e}")),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            // The readers are left behind: a grandchild may still hold the pipes.
            return Err(format!("{desc} did not finish within {timeout:?}; killed it"));
        }
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    Ok(Out { status, stdout, stderr })
}

/// `program args...`, bounded by `timeout`; panics only when it cannot run.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Out {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_bounded(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

pub fn unique_name() -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    format!("drainit-test-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst))
}

pub fn assert_log_has(log: &str, needle: &str, what: &str) {
    assert!(log.contains(needle), "{what}: expected {needle:?} in the log:\n{log}");
}

// ---------------------------------------------------------------------------
// The static drainit and busybox: found or built once per test process.

pub struct Statics {
    pub drainit: PathBuf,
    pub busybox: PathBuf,
    pub applets: Vec<String>,
}

/// The static drainit and busybox; panics with what to install when one is missing.
pub fn statics() -> &'static Statics {
    static STATICS: OnceLock<Result<Statics, String>> = OnceLock::new();
    match STATICS.get_or_init(|| {
        let busybox = find_busybox()?;
        let applets = busybox_applets(&busybox)?;
        let drainit = static_drainit()?;
        Ok(Statics { drainit, busybox, applets })
    }) {
        Ok(s) => s,
        Err(msg) => panic!("{msg}"),
    }
}

fn find_busybox() -> Result<PathBuf, String> {
    let path = PathBuf::from(std::env::var_os("BUSYBOX_STATIC_BIN").unwrap_or_else(|| "/bin/busybox".into()));
    if !path.is_file() {
        return Err(format!(
            "no busybox at {}: install Debian's static one (`apt-get install -y busybox-static`) \
             or set BUSYBOX_STATIC_BIN",
            path.display()
        ));
    }
    if !is_static_elf(&path)? {
        return Err(format!(
            "{} is dynamically linked and cannot run in a FROM scratch image: install \
             busybox-static (not busybox), or set BUSYBOX_STATIC_BIN",
            path.display()
        ));
    }
    Ok(path)
}

fn busybox_applets(busybox: &Path) -> Result<Vec<String>, String> {
    let mut cmd = Command::new(busybox);
    cmd.arg("--list");
    let out = run_bounded(cmd, Duration::from_secs(10))?;
    let applets: Vec<String> = out
        .stdout
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(String::from)
        .collect();
    for needed in ["sh", "sleep", "cat", "mkdir", "mv", "rm", "kill", "test", "touch"] {
        if !applets.iter().any(|a| a == needed) {
            return Err(format!("{} has no `{needed}` applet", busybox.display()));
        }
    }
    Ok(applets)
}

/// The static drainit: DRAINIT_STATIC_BIN, or the documented static build.
fn static_drainit() -> Result<PathBuf, String> {
    let path = match std::env::var_os("DRAINIT_STATIC_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_static_drainit()?,
    };
    if !is_static_elf(&path)? {
        return Err(format!("{} is dynamically linked: it would not start in a FROM scratch image", path.display()));
    }
    Ok(path)
}

/// The static build, as CI and the benchmark make it: `scripts/prepare
/// static` (musl when rustup has that target, else glibc +crt-static; a
/// no-op when up to date) prints the binary's path.
fn build_static_drainit() -> Result<PathBuf, String> {
    let mut cmd = Command::new(Path::new(MANIFEST_DIR).join("scripts/prepare"));
    cmd.arg("static").current_dir(MANIFEST_DIR);
    let out = run_bounded(cmd, Duration::from_secs(900))?;
    if !out.status.success() {
        return Err(format!("the static build `scripts/prepare static` failed ({}):\n{}", out.status, out.stderr));
    }
    let path = PathBuf::from(out.stdout.trim());
    if !path.is_file() {
        return Err(format!("`scripts/prepare static` printed {:?}, which is no file:\n{}", out.stdout, out.stderr));
    }
    Ok(path)
}

// ---------------------------------------------------------------------------
// Build contexts and root filesystems, in the kit's scratch directories.

/// `rel` under `scratch` (a leading `/` is dropped), its parents created.
fn place(scratch: &Scratch, rel: &str) -> PathBuf {
    let p = scratch.0.join(rel.trim_start_matches('/'));
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
    }
    p
}

/// What the container tests write into a kit [`Scratch`]: build contexts,
/// root filesystems and their tarballs. `rel` is relative to the directory;
/// parents are created on the way.
pub trait ScratchFiles {
    fn mkdir(&self, rel: &str);
    /// A copy of the file `from` at `rel`.
    fn copy(&self, rel: &str, from: &Path);
    /// `text` at `rel`, with permissions `mode`.
    fn write(&self, rel: &str, text: &str, mode: u32);
    /// A `FROM scratch` root filesystem under `prefix` (`""` or `rootfs`):
    /// busybox with its applets as links in /bin, an empty /run (for the drain
    /// file), /tmp when `with_tmp`, the sample worker at
    /// /usr/local/bin/sample-worker and the test workers in /workers.
    fn busybox_rootfs(&self, prefix: &str, with_tmp: bool);
    /// The directory `rel` as a tarball (owned by root), for `docker import`.
    fn tarball(&self, rel: &str) -> PathBuf;
}

impl ScratchFiles for Scratch {
    fn mkdir(&self, rel: &str) {
        let p = place(self, rel);
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    }

    fn copy(&self, rel: &str, from: &Path) {
        let to = place(self, rel);
        fs::copy(from, &to).unwrap_or_else(|e| panic!("cp {} {}: {e}", from.display(), to.display()));
    }

    fn write(&self, rel: &str, text: &str, mode: u32) {
        let to = place(self, rel);
        fs::write(&to, text).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
        fs::set_permissions(&to, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn busybox_rootfs(&self, prefix: &str, with_tmp: bool) {
        let s = statics();
        let at = |rel: &str| format!("{prefix}/{rel}");
        self.copy(&at("bin/busybox"), &s.busybox);
        for applet in &s.applets {
            let link = place(self, &at(&format!("bin/{applet}")));
            symlink("busybox", &link).unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
        }
        self.mkdir(&at("run"));
        if with_tmp {
            self.mkdir(&at("tmp"));
        }
        self.copy(
            &at("usr/local/bin/sample-worker"),
            &Path::new(MANIFEST_DIR).join("examples/sample-worker/worker.sh"),
        );
        self.write(&at("workers/ignore-term.sh"), IGNORE_TERM_WORKER, 0o755);
        self.write(&at("workers/usr1-grandchild.sh"), USR1_GRANDCHILD_WORKER, 0o755);
        self.write(&at("workers/orphans.sh"), ORPHANS_WORKER, 0o755);
        self.write(&at("workers/term-reporter.sh"), TERM_REPORTER_WORKER, 0o755);
    }

    fn tarball(&self, rel: &str) -> PathBuf {
        let tar = self.0.join(format!("{}.tar", rel.trim_matches('/').replace('/', "-")));
        let src = self.0.join(rel.trim_start_matches('/'));
        let out = run(
            "tar",
            &[
                "--create",
                "--file",
                &tar.to_string_lossy(),
                "--directory",
                &src.to_string_lossy(),
                "--numeric-owner",
                "--owner=0",
                "--group=0",
                ".",
            ],
            ENGINE_TIMEOUT,
        );
        assert!(out.status.success(), "tar of {} failed: {}", src.display(), out.text());
        tar
    }
}

// ---------------------------------------------------------------------------
// A container engine's CLI.

/// How to run one engine's CLI: `docker`, `docker -H unix://...`, or
/// `nsenter ... podman` with its private configuration in the environment;
/// and the options every `run` of the tests takes there.
pub struct Engine {
    /// `docker` or `podman`, for messages.
    pub name: &'static str,
    pub program: PathBuf,
    pub prefix: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub env_remove: Vec<&'static str>,
    pub run_defaults: Vec<String>,
}

impl Engine {
    /// The machine's own Docker engine, as the `docker` CLI finds it.
    pub fn host_docker() -> Engine {
        Engine {
            name: "docker",
            program: "docker".into(),
            prefix: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            run_defaults: Vec::new(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.prefix).args(args);
        for key in &self.env_remove {
            cmd.env_remove(key);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// A command, bounded; panics only when it cannot run or times out.
    pub fn run(&self, args: &[&str]) -> Out {
        run_bounded(self.command(args), ENGINE_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{} {args:?} failed ({}):\n{}", self.name, out.status, out.text());
        out.stdout
    }

    /// `import` of a root filesystem tarball as `tag`.
    pub fn import(&'static self, tarball: &Path, tag: &str) -> Image {
        self.ok(&["import", &tarball.to_string_lossy(), tag]);
        Image { engine: self, tag: tag.to_string() }
    }
}

/// An image, removed on drop.
pub struct Image {
    pub engine: &'static Engine,
    pub tag: String,
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = run_bounded(self.engine.command(&["rmi", "--force", &self.tag]), ENGINE_TIMEOUT);
    }
}

/// A container name, and the container removed (with its volumes) on drop.
pub struct Container {
    pub engine: &'static Engine,
    pub name: String,
}

impl Container {
    pub fn new(engine: &'static Engine) -> Container {
        Container { engine, name: unique_name() }
    }

    /// The arguments of `run --name NAME` with the engine's defaults, `opts`,
    /// `env` as `-e` options, the image, and the command `args`.
    pub fn run_args(&self, opts: &[&str], env: &[(&str, &str)], image: &str, args: &[&str]) -> Vec<String> {
        let mut cmd: Vec<String> = vec!["run".into(), "--name".into(), self.name.clone()];
        cmd.extend(self.engine.run_defaults.iter().cloned());
        cmd.extend(opts.iter().map(|o| o.to_string()));
        for (k, v) in env {
            cmd.push("-e".into());
            cmd.push(format!("{k}={v}"));
        }
        cmd.push(image.to_string());
        cmd.extend(args.iter().map(|a| a.to_string()));
        cmd
    }

    /// `run` in the foreground: returns how it ended and its output.
    pub fn run(
        engine: &'static Engine,
        opts: &[&str],
        env: &[(&str, &str)],
        image: &str,
        args: &[&str],
    ) -> (Container, Out) {
        let c = Container::new(engine);
        let cmd = c.run_args(opts, env, image, args);
        let out = engine.run(&cmd.iter().map(String::as_str).collect::<Vec<_>>());
        (c, out)
    }

    /// `run -d` with `opts`, `env` and the worker command `args`.
    pub fn start(
        engine: &'static Engine,
        opts: &[&str],
        env: &[(&str, &str)],
        image: &str,
        args: &[&str],
    ) -> Container {
        let c = Container::new(engine);
        let mut cmd = c.run_args(opts, env, image, args);
        cmd.insert(1, "-d".into());
        engine.ok(&cmd.iter().map(String::as_str).collect::<Vec<_>>());
        c
    }

    pub fn logs(&self) -> String {
        let out = self.engine.run(&["logs", &self.name]);
        format!("{}{}", out.stdout, out.stderr)
    }

    /// Waits until the log has `needle`; panics with the log after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        if !wait_until(timeout, || self.logs().contains(needle)) {
            panic!(
                "container {}: no {needle:?} in its log within {timeout:?}; state {}; log:\n{}",
                self.name,
                self.state(),
                self.logs()
            );
        }
    }

    pub fn inspect(&self, format: &str) -> String {
        self.engine.ok(&["inspect", "--format", format, &self.name]).trim().to_string()
    }

    pub fn state(&self) -> String {
        self.engine
            .run(&["inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}}", &self.name])
            .stdout
            .trim()
            .to_string()
    }

    pub fn running(&self) -> bool {
        self.state().starts_with("running")
    }

    /// `stop -t secs`; returns how long it took.
    pub fn stop(&self, secs: u32) -> Duration {
        let t = Instant::now();
        self.engine.ok(&["stop", "-t", &secs.to_string(), &self.name]);
        t.elapsed()
    }

    pub fn exit_code(&self) -> i32 {
        let code = self.inspect("{{.State.ExitCode}}");
        code.parse().unwrap_or_else(|_| panic!("bad exit code {code:?} for {}", self.name))
    }

    /// `exec` of `args` in the running container.
    pub fn exec(&self, args: &[&str]) -> Out {
        let mut cmd = vec!["exec", self.name.as_str()];
        cmd.extend_from_slice(args);
        self.engine.run(&cmd)
    }

    /// A file from the (possibly stopped) container, via `cp`.
    pub fn read_file(&self, path: &str) -> Result<String, String> {
        let scratch = Scratch::new("engine-cp");
        let to = scratch.path("copied");
        let to_s = to.to_string_lossy().into_owned();
        let out = self.engine.run(&["cp", &format!("{}:{path}", self.name), &to_s]);
        if !out.status.success() {
            return Err(format!("{} cp {path}: {}", self.engine.name, out.stderr.trim()));
        }
        fs::read_to_string(&to).map_err(|e| format!("reading copied {path}: {e}"))
    }

    /// Every process in the container, read from /proc inside it.
    pub fn processes(&self) -> Vec<Stat> {
        let out = self.exec(&["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null"]);
        out.stdout.lines().filter_map(Stat::parse).collect()
    }

    /// PID 1's argv inside the container, from /proc/1/cmdline.
    pub fn pid1_argv(&self) -> Vec<String> {
        let out = self.exec(&["cat", "/proc/1/cmdline"]);
        assert!(out.status.success(), "cat /proc/1/cmdline in {}: {}", self.name, out.text());
        out.stdout.split('\0').filter(|a| !a.is_empty()).map(String::from).collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run_bounded(self.engine.command(&["rm", "--force", "--volumes", &self.name]), ENGINE_TIMEOUT);
    }
}

/// Stops (`stop -t secs`) a container running the sample worker (steps of
/// 1s) and checks that it drained: its cleanup file, drainit's exit 0, no
/// deadline; drainit must log a grace of `grace_secs`.
pub fn check_drained_stop(c: &Container, secs: u32, grace_secs: u64) {
    c.wait_for_log("sample-worker: ready", LOG_TIMEOUT);
    let took = c.stop(secs);
    let log = c.logs();
    let what = format!("{} stop -t {secs} took {took:?}", c.engine.name);
    assert_eq!(c.exit_code(), 0, "{what}; log:\n{log}");
    let cleanup = c.read_file("/state/cleanup.done").unwrap_or_else(|e| panic!("{e}; log:\n{log}"));
    assert!(cleanup.starts_with("stopped by SIGTERM"), "cleanup file: {cleanup:?}");
    assert_log_has(&log, &format!("event=stop_requested signal=SIGTERM grace={grace_secs}s"), &what);
    assert_log_has(&log, "event=exit code=0", &what);
    assert!(!log.contains("event=deadline_reached"), "{what}: the worker drained in time, yet:\n{log}");
}

/// Stops (`stop -t secs`) a container running ignore-term.sh and checks that
/// drainit's deadline, `grace_secs` after the stop, ended it: 137,
/// deadline_reached, and drainit's own exit line, which the engine's SIGKILL
/// would not have left. Returns how long the stop took.
pub fn check_deadline_stop(c: &Container, secs: u32, grace_secs: u64) -> Duration {
    c.wait_for_log("ignore-term: ready", LOG_TIMEOUT);
    let took = c.stop(secs);
    let log = c.logs();
    let what = format!("{} stop -t {secs} took {took:?}", c.engine.name);
    eprintln!("{what} (a TERM-ignoring worker, grace {grace_secs}s)");
    assert_eq!(c.exit_code(), 137, "{what}; log:\n{log}");
    assert_log_has(&log, &format!("event=stop_requested signal=SIGTERM grace={grace_secs}s"), &what);
    assert_log_has(&log, "event=deadline_reached", &what);
    assert_log_has(&log, "event=exit code=137", &what);
    let grace = Duration::from_secs(grace_secs);
    assert!(took + Duration::from_millis(500) >= grace, "{what}, before the grace of {grace:?}:\n{log}");
    took
}

/// Checks the orphans worker's 20 orphans under PID 1 `pid1_comm`, kills
/// them from outside drainit's tree, and checks that none is left, not even
/// as a zombie: only PID 1 can reap them.
pub fn check_orphans_reaped(c: &Container, pid1_comm: &str) {
    c.wait_for_log("orphans: spawned 20", LOG_TIMEOUT);
    let orphan = |p: &Stat| p.ppid == 1 && p.comm == "sleep";
    // (polled: a forked orphan may not have exec'd `sleep` yet)
    let orphans: Vec<String> = wait_for(Duration::from_secs(10), || {
        let pids: Vec<String> = c.processes().iter().filter(|p| orphan(p)).map(|p| p.pid.to_string()).collect();
        (pids.len() == 20).then_some(pids)
    })
    .unwrap_or_else(|| panic!("expected 20 orphaned sleeps under PID 1:\n{:#?}", c.processes()));
    let procs = c.processes();
    let pid1 = procs.iter().find(|p| p.pid == 1).map(|p| p.comm.as_str());
    assert_eq!(pid1, Some(pid1_comm), "PID 1 is not drainit:\n{procs:#?}");
    let mut kill = vec!["kill", "-KILL"];
    kill.extend(orphans.iter().map(String::as_str));
    let out = c.exec(&kill);
    assert!(out.status.success(), "kill of the orphans: {}", out.text());
    let settled = wait_until(Duration::from_secs(10), || {
        let procs = c.processes();
        !procs.is_empty() && procs.iter().all(|p| p.state != 'Z' && !orphan(p))
    });
    assert!(settled, "killed orphans still there (zombies?) after 10s:\n{:#?}", c.processes());
    assert!(c.running(), "the worker should still run: {}", c.state());
}
