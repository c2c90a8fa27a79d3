//! drainit in real containers: the static binary as PID 1 of `FROM scratch`
//! images, driven through the Docker engine (`run`, `stop`, `kill`, `exec`, `cp`).
//!
//! Needs, and fails (never skips) without:
//! - a reachable Docker engine (`docker version` must reach the server);
//! - a static busybox at /bin/busybox (Debian: `apt-get install -y busybox-static`),
//!   or the path in `BUSYBOX_STATIC_BIN`, for the shell workers;
//! - the static drainit. The tests build it themselves as the README documents
//!   (a no-op when up to date): `cargo build --release --target
//!   x86_64-unknown-linux-musl` when that target is installed, else
//!   `RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target
//!   x86_64-unknown-linux-gnu`; or `DRAINIT_STATIC_BIN` names a prebuilt one.
//!
//! No image is pulled: each image is built FROM scratch out of a temporary
//! context. Images and containers are named `drainit-test-<pid>-<n>` and removed
//! by Drop guards, pass or fail; every docker command and every wait has a deadline.
//! Self-contained on purpose: nothing here depends on tests/common/.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
const MUSL: &str = "x86_64-unknown-linux-musl";
const GNU: &str = "x86_64-unknown-linux-gnu";
/// Bound on one ordinary docker command (run, stop, build of a tiny context).
const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on waiting for a line in a container's log.
const LOG_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Workers. The sample worker comes from examples/sample-worker/; these are the
// test-only ones, copied into every test image under /workers/.

/// Ignores SIGTERM in itself and in everything it starts (an ignored signal
/// stays ignored across exec), so only a SIGKILL ends it.
const IGNORE_TERM_WORKER: &str = r#"
trap '' TERM
echo "ignore-term: ready"
while :; do sleep 1; done
"#;

/// Starts a grandchild of drainit (a background `sh`, same process group) that
/// reports SIGUSR1, and reports SIGUSR1 itself.
const USR1_GRANDCHILD_WORKER: &str = r#"
trap 'echo "worker: got USR1"' USR1
sh -c 'trap "echo grandchild: got USR1" USR1; echo "grandchild: ready pid=$$ ppid=$PPID"; while :; do sleep 0.1; done' &
while :; do sleep 0.1; done
"#;

/// Makes orphans: each `sh -c` exits at once, leaving its background `sleep`
/// to be re-parented to PID 1 (drainit); the test then kills them, and drainit
/// must reap them.
const ORPHANS_WORKER: &str = r#"
i=0
while [ "$i" -lt 20 ]; do
    sh -c 'sleep 1000 & exit 0'
    i=$((i + 1))
done
echo "orphans: spawned $i"
while :; do sleep 1; done
"#;

// ---------------------------------------------------------------------------
// Bounded commands.

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
    fn text(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Runs `cmd` with stdin closed, collecting its output; kills it and fails
/// after `timeout`.
fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<Out, String> {
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
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                // The readers are left behind: a grandchild may still hold the pipes.
                return Err(format!("{desc} did not finish within {timeout:?}; killed it"));
            }
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {desc}: {e}")),
        }
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    Ok(Out { status, stdout, stderr })
}

fn docker_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    cmd
}

/// A docker command, bounded; panics only when it cannot run or times out.
fn docker(args: &[&str]) -> Out {
    run_bounded(docker_cmd(args), DOCKER_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// A docker command that must succeed; returns its stdout.
fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(out.status.success(), "docker {args:?} failed ({}):\n{}", out.status, out.text());
    out.stdout
}

fn unique_name() -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    format!("drainit-test-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst))
}

/// Polls `probe` every 100ms until it returns Some, or `timeout` passes.
fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// Prerequisites: checked once per test process; every test fails with the
// same clear message when one is missing.

struct Prereqs {
    drainit: PathBuf,
    busybox: PathBuf,
    applets: Vec<String>,
}

fn prereqs() -> &'static Prereqs {
    static PREREQS: OnceLock<Result<Prereqs, String>> = OnceLock::new();
    match PREREQS.get_or_init(check_prereqs) {
        Ok(p) => p,
        Err(msg) => panic!("{msg}"),
    }
}

fn check_prereqs() -> Result<Prereqs, String> {
    check_docker_engine()?;
    let busybox = find_busybox()?;
    let applets = busybox_applets(&busybox)?;
    let drainit = static_drainit()?;
    Ok(Prereqs { drainit, busybox, applets })
}

fn check_docker_engine() -> Result<(), String> {
    let hint = "tests/docker.rs needs a running Docker engine (start dockerd, or set \
                DOCKER_HOST); it fails rather than skip";
    let out = run_bounded(docker_cmd(&["version", "--format", "{{.Server.Version}}"]), Duration::from_secs(20))
        .map_err(|e| format!("Docker engine not reachable: {e}. {hint}"))?;
    if !out.status.success() || out.stdout.trim().is_empty() {
        return Err(format!(
            "Docker engine not reachable: `docker version` exited {}: {} -- {hint}",
            out.status,
            out.stderr.trim()
        ));
    }
    Ok(())
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
    let out = run_bounded(
        {
            let mut c = Command::new(busybox);
            c.arg("--list");
            c
        },
        Duration::from_secs(10),
    )?;
    let applets: Vec<String> = out
        .stdout
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(String::from)
        .collect();
    for needed in ["sh", "sleep", "cat", "mkdir", "mv", "rm", "kill"] {
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

/// The static build's target and RUSTFLAGS: musl (static by itself; its
/// flags come from .cargo/config.toml) when rustup installed its std, else
/// glibc with +crt-static.
fn static_build() -> (&'static str, Option<&'static str>) {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc).args(["--print", "sysroot"]).output().ok();
    let musl_std =
        sysroot.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib/rustlib").join(MUSL));
    if musl_std.is_some_and(|dir| dir.is_dir()) { (MUSL, None) } else { (GNU, Some("-C target-feature=+crt-static")) }
}

fn build_static_drainit() -> Result<PathBuf, String> {
    let (target, rustflags) = static_build();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", target])
        .arg("--message-format=json-render-diagnostics")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(MANIFEST_DIR);
    if let Some(flags) = rustflags {
        cmd.env("RUSTFLAGS", flags);
    }
    let out = run_bounded(cmd, Duration::from_secs(900))?;
    if !out.status.success() {
        return Err(format!(
            "the static build `RUSTFLAGS='{}' cargo build --release --target {target}` failed ({}):\n{}",
            rustflags.unwrap_or_default(),
            out.status,
            out.stderr
        ));
    }
    // The artifact message names the binary, wherever the target dir is.
    let from_json = out
        .stdout
        .lines()
        .filter(|l| l.contains(r#""reason":"compiler-artifact""#) && l.contains(r#""name":"drainit""#))
        .find_map(|l| {
            let start = l.find(r#""executable":""#)? + r#""executable":""#.len();
            let len = l[start..].find('"')?;
            Some(PathBuf::from(&l[start..start + len]))
        });
    let path = from_json.unwrap_or_else(|| Path::new(MANIFEST_DIR).join("target").join(target).join("release/drainit"));
    if !path.is_file() {
        return Err(format!("the static build succeeded but {} is missing", path.display()));
    }
    Ok(path)
}

/// True when `path` is an ELF executable with no program interpreter.
fn is_static_elf(path: &Path) -> Result<bool, String> {
    let b = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return Err(format!("{} is not a 64-bit little-endian ELF file", path.display()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let p_type = b.get(o..o + 4).ok_or_else(|| format!("{}: truncated ELF", path.display()))?;
        if u32::from_le_bytes(p_type.try_into().unwrap()) == 3 {
            return Ok(false); // PT_INTERP: needs a dynamic loader
        }
    }
    Ok(true)
}

// ---------------------------------------------------------------------------
// Guards for what the tests create.

/// A build context directory under the cargo target tmp dir, removed on drop.
struct Context {
    dir: PathBuf,
}

impl Context {
    fn new() -> Context {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique_name());
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Context { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        let p = self.dir.join(rel.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
        p
    }

    fn copy(&self, rel: &str, from: &Path) {
        let to = self.path(rel);
        fs::copy(from, &to).unwrap_or_else(|e| panic!("cp {} {}: {e}", from.display(), to.display()));
    }

    fn write(&self, rel: &str, text: &str, mode: u32) {
        let to = self.path(rel);
        fs::write(&to, text).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
        fs::set_permissions(&to, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn build(self, dockerfile: &str) -> Image {
        self.write("Dockerfile", dockerfile, 0o644);
        let image = Image { tag: format!("{}:latest", unique_name()) };
        let dir = self.dir.to_string_lossy().into_owned();
        let out = docker(&["build", "--quiet", "--tag", &image.tag, &dir]);
        assert!(out.status.success(), "docker build of\n{dockerfile}\nfailed ({}):\n{}", out.status, out.text());
        image
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

struct Image {
    tag: String,
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = run_bounded(docker_cmd(&["rmi", "--force", &self.tag]), DOCKER_TIMEOUT);
    }
}

/// A container name, and the container removed (with its volumes) on drop.
struct Container {
    name: String,
}

impl Container {
    fn new() -> Container {
        Container { name: unique_name() }
    }

    /// `docker run -d` of `image` with `env` and the worker command `args`.
    fn start(image: &Image, env: &[(&str, &str)], args: &[&str]) -> Container {
        let c = Container::new();
        let mut cmd: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), c.name.clone()];
        for (k, v) in env {
            cmd.push("-e".into());
            cmd.push(format!("{k}={v}"));
        }
        cmd.push(image.tag.clone());
        cmd.extend(args.iter().map(|a| a.to_string()));
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        docker_ok(&cmd);
        c
    }

    fn logs(&self) -> String {
        let out = docker(&["logs", &self.name]);
        format!("{}{}", out.stdout, out.stderr)
    }

    /// Waits until the log has `needle`; panics with the log after `timeout`.
    fn wait_for_log(&self, needle: &str, timeout: Duration) {
        if poll(timeout, || self.logs().contains(needle).then_some(())).is_none() {
            panic!(
                "container {}: no {needle:?} in its log within {timeout:?}; state {}; log:\n{}",
                self.name,
                self.state(),
                self.logs()
            );
        }
    }

    fn inspect(&self, format: &str) -> String {
        docker_ok(&["inspect", "--format", format, &self.name]).trim().to_string()
    }

    fn state(&self) -> String {
        docker(&["inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}}", &self.name])
            .stdout
            .trim()
            .to_string()
    }

    /// `docker stop -t secs`; returns how long it took.
    fn stop(&self, secs: u32) -> Duration {
        let t = Instant::now();
        docker_ok(&["stop", "-t", &secs.to_string(), &self.name]);
        t.elapsed()
    }

    fn exit_code(&self) -> i32 {
        let code = self.inspect("{{.State.ExitCode}}");
        code.parse().unwrap_or_else(|_| panic!("bad exit code {code:?} for {}", self.name))
    }

    /// A file from the (possibly stopped) container, via `docker cp`.
    fn read_file(&self, path: &str) -> Result<String, String> {
        let ctx = Context::new();
        let to = ctx.path("copied");
        let to_s = to.to_string_lossy().into_owned();
        let out = docker(&["cp", &format!("{}:{path}", self.name), &to_s]);
        if !out.status.success() {
            return Err(format!("docker cp {path}: {}", out.stderr.trim()));
        }
        fs::read_to_string(&to).map_err(|e| format!("reading copied {path}: {e}"))
    }

    /// Every process in the container, read from /proc inside it.
    fn processes(&self) -> Vec<Proc> {
        let out = docker(&["exec", &self.name, "sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null"]);
        out.stdout.lines().filter_map(Proc::parse).collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run_bounded(docker_cmd(&["rm", "--force", "--volumes", &self.name]), DOCKER_TIMEOUT);
    }
}

#[derive(Debug)]
struct Proc {
    pid: u32,
    comm: String,
    state: char,
    ppid: u32,
}

impl Proc {
    /// One /proc/PID/stat line: `pid (comm) state ppid ...`; comm may hold spaces.
    fn parse(line: &str) -> Option<Proc> {
        let open = line.find('(')?;
        let close = line.rfind(')')?;
        let mut rest = line[close + 1..].split_whitespace();
        Some(Proc {
            pid: line[..open].trim().parse().ok()?,
            comm: line[open + 1..close].to_string(),
            state: rest.next()?.chars().next()?,
            ppid: rest.next()?.parse().ok()?,
        })
    }
}

// ---------------------------------------------------------------------------
// Images.

/// The test image: busybox (with its applets as symlinks), the static drainit
/// as in Dockerfile.example, the sample worker, and the test workers; built
/// once and shared by the tests running at the same time.
fn rig() -> Arc<Image> {
    static RIG: Mutex<Weak<Image>> = Mutex::new(Weak::new());
    let mut shared = RIG.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(image) = shared.upgrade() {
        return image;
    }
    let p = prereqs();
    let ctx = Context::new();
    ctx.copy("rootfs/bin/busybox", &p.busybox);
    for applet in &p.applets {
        let link = ctx.path(&format!("rootfs/bin/{applet}"));
        symlink("busybox", &link).unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
    }
    fs::create_dir_all(ctx.path("rootfs/tmp")).unwrap();
    ctx.copy("rootfs/usr/local/bin/drainit", &p.drainit);
    ctx.copy("rootfs/usr/local/bin/sample-worker", &Path::new(MANIFEST_DIR).join("examples/sample-worker/worker.sh"));
    ctx.write("rootfs/workers/ignore-term.sh", IGNORE_TERM_WORKER, 0o755);
    ctx.write("rootfs/workers/usr1-grandchild.sh", USR1_GRANDCHILD_WORKER, 0o755);
    ctx.write("rootfs/workers/orphans.sh", ORPHANS_WORKER, 0o755);
    let image = Arc::new(ctx.build(
        "FROM scratch\n\
         COPY rootfs/ /\n\
         STOPSIGNAL SIGTERM\n\
         ENTRYPOINT [\"/usr/local/bin/drainit\", \"--\"]\n",
    ));
    *shared = Arc::downgrade(&image);
    image
}

/// The final stage of Dockerfile.example, from the last FROM on (which must be
/// `FROM scratch`), as (instruction, arguments) with continuations joined.
fn example_final_stage() -> Vec<(String, String)> {
    let path = Path::new(MANIFEST_DIR).join("Dockerfile.example");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        if line.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let (op, args) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
        instructions.push((op.to_ascii_uppercase(), args.trim().to_string()));
    }
    let last_from = instructions.iter().rposition(|(op, _)| op == "FROM").expect("Dockerfile.example has no FROM");
    assert_eq!(
        instructions[last_from].1, "scratch",
        "Dockerfile.example's final stage must be FROM scratch (the test rebuilds it from local files)"
    );
    instructions.split_off(last_from + 1)
}

/// Dockerfile.example's final stage, rebuilt from local files: each
/// `COPY --from=STAGE SRC DST` takes the local static build of SRC's file
/// (drainit or busybox); a plain `COPY` takes the file from the work tree;
/// every other instruction is kept as written.
fn example_image() -> Image {
    let p = prereqs();
    let ctx = Context::new();
    let mut dockerfile = String::from("FROM scratch\n");
    for (op, args) in example_final_stage() {
        if op != "COPY" {
            dockerfile.push_str(&format!("{op} {args}\n"));
            continue;
        }
        let words: Vec<&str> = args.split_whitespace().collect();
        let (from_stage, srcdst) = match words.first().and_then(|w| w.strip_prefix("--from=")) {
            Some(stage) => (Some(stage), &words[1..]),
            None => (None, &words[..]),
        };
        assert_eq!(srcdst.len(), 2, "unexpected COPY in Dockerfile.example: COPY {args}");
        let (src, dst) = (srcdst[0], srcdst[1]);
        let local = match from_stage {
            Some(stage) => {
                let file = match Path::new(src).file_name().and_then(|f| f.to_str()) {
                    Some("drainit") => &p.drainit,
                    Some("busybox") => &p.busybox,
                    _ => {
                        panic!("COPY --from={stage} {src}: the test knows no local stand-in for it")
                    }
                };
                let rel = format!("from-{stage}/{}", src.trim_start_matches('/'));
                ctx.copy(&rel, file);
                rel
            }
            None => {
                ctx.copy(src, &Path::new(MANIFEST_DIR).join(src));
                src.to_string()
            }
        };
        dockerfile.push_str(&format!("COPY {local} {dst}\n"));
    }
    ctx.build(&dockerfile)
}

// ---------------------------------------------------------------------------
// Small parsers for the manifests.

/// `500ms`, `8s`, `1m30s`, or a bare number of seconds.
fn parse_duration(text: &str) -> Duration {
    let text = text.trim().trim_matches('"');
    if let Ok(secs) = text.parse::<u64>() {
        return Duration::from_secs(secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().unwrap_or_else(|_| panic!("bad duration {text:?}"));
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(60 * n),
            "h" => Duration::from_secs(3600 * n),
            u => panic!("bad unit {u:?} in duration {text:?}"),
        };
        rest = &rest[unit..];
    }
    total
}

fn env_value(env: &[(String, String)], key: &str) -> Option<Duration> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| parse_duration(v))
}

fn assert_log_has(log: &str, needle: &str, what: &str) {
    assert!(log.contains(needle), "{what}: expected {needle:?} in the log:\n{log}");
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn docker_run_passes_exit_codes_through() {
    let image = rig();
    let cases: [(&[&str], i32); 5] = [
        (&["true"], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["sh", "-c", "exit 42"], 42),
        (&["sh", "-c", "kill -USR2 $$"], 128 + 12),
        (&["/no/such/worker"], 127),
    ];
    for (args, want) in cases {
        let c = Container::new();
        let mut cmd = vec!["run", "--rm", "--name", &c.name, &image.tag];
        cmd.extend_from_slice(args);
        let out = docker(&cmd);
        assert_eq!(out.code(), Some(want), "docker run <image> {args:?}:\n{}", out.text());
        if want == 127 {
            // Docker's own "cannot exec the entrypoint" is 127 too: this one must be drainit's.
            assert!(!out.stderr.contains("Error response from daemon"), "{}", out.text());
        } else {
            assert_log_has(&out.stderr, &format!("event=exit code={want}"), &format!("{args:?}"));
        }
    }
}

#[test]
fn docker_stop_lets_a_draining_worker_finish() {
    let image = rig();
    let c = Container::start(
        &image,
        &[("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("SAMPLE_WORKER_STEP", "1")],
        &["/usr/local/bin/sample-worker"],
    );
    c.wait_for_log("sample-worker: ready", LOG_TIMEOUT);
    let took = c.stop(5);
    let log = c.logs();
    assert_eq!(c.exit_code(), 0, "docker stop -t 5 took {took:?}; log:\n{log}");
    let cleanup = c.read_file("/state/cleanup.done").unwrap_or_else(|e| panic!("{e}; log:\n{log}"));
    assert!(cleanup.starts_with("stopped by SIGTERM"), "cleanup file: {cleanup:?}");
    assert_log_has(&log, "event=stop_requested signal=SIGTERM", "stop");
    assert_log_has(&log, "event=exit code=0", "stop");
    assert!(!log.contains("event=deadline_reached"), "the worker drained in time, yet:\n{log}");
}

#[test]
fn drainit_deadline_beats_docker_kill() {
    let image = rig();
    let c = Container::start(
        &image,
        &[("DRAINIT_GRACE", "2s"), ("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")],
        &["sh", "/workers/ignore-term.sh"],
    );
    c.wait_for_log("ignore-term: ready", LOG_TIMEOUT);
    let took = c.stop(5);
    let log = c.logs();
    assert_eq!(c.exit_code(), 137, "docker stop -t 5 took {took:?}; log:\n{log}");
    assert_log_has(&log, "event=stop_requested signal=SIGTERM grace=2s", "deadline");
    assert_log_has(&log, "event=deadline_reached", "deadline");
    // Docker's own SIGKILL would leave no exit line: this one proves drainit
    // ended the worker and exited by itself, before Docker's 5s.
    assert_log_has(&log, "event=exit code=137", "deadline");
    assert!(took >= Duration::from_millis(1500), "grace 2s, yet stopped after {took:?}:\n{log}");
}

#[test]
fn docker_kill_usr1_reaches_a_grandchild() {
    let image = rig();
    let c = Container::start(&image, &[], &["sh", "/workers/usr1-grandchild.sh"]);
    c.wait_for_log("grandchild: ready", LOG_TIMEOUT);
    docker_ok(&["kill", "--signal", "USR1", &c.name]);
    c.wait_for_log("grandchild: got USR1", Duration::from_secs(10));
    c.wait_for_log("worker: got USR1", Duration::from_secs(10));
    assert!(c.state().starts_with("running"), "USR1 is no stop signal, yet {}", c.state());
}

#[test]
fn orphans_are_reaped_inside_a_container() {
    let image = rig();
    let c = Container::start(&image, &[], &["sh", "/workers/orphans.sh"]);
    c.wait_for_log("orphans: spawned 20", LOG_TIMEOUT);
    // The orphans were re-parented to PID 1...
    let orphan = |p: &Proc| p.ppid == 1 && p.comm == "sleep";
    // (polled: a forked orphan may not have exec'd `sleep` yet)
    let orphans: Vec<String> = poll(Duration::from_secs(10), || {
        let pids: Vec<String> = c.processes().iter().filter(|p| orphan(p)).map(|p| p.pid.to_string()).collect();
        (pids.len() == 20).then_some(pids)
    })
    .unwrap_or_else(|| panic!("expected 20 orphaned sleeps under PID 1:\n{:#?}", c.processes()));
    let procs = c.processes();
    let pid1 = procs.iter().find(|p| p.pid == 1).map(|p| p.comm.as_str());
    assert_eq!(pid1, Some("drainit"), "PID 1 is not drainit:\n{procs:#?}");
    // ...and once they die (killed from outside drainit's tree), none is left
    // as a zombie: only PID 1 can reap them.
    let mut kill = vec!["exec", c.name.as_str(), "kill", "-KILL"];
    kill.extend(orphans.iter().map(String::as_str));
    docker_ok(&kill);
    let settled = poll(Duration::from_secs(10), || {
        let procs = c.processes();
        let gone = !procs.is_empty() && procs.iter().all(|p| p.state != 'Z' && !orphan(p));
        gone.then_some(())
    });
    assert!(settled.is_some(), "killed orphans still there (zombies?) after 10s:\n{:#?}", c.processes());
    assert!(c.state().starts_with("running"), "the worker should still run: {}", c.state());
}

#[test]
fn dockerfile_example_final_stage_runs() {
    let image = example_image();
    let config = |format: &str| docker_ok(&["image", "inspect", "--format", format, &image.tag]);
    assert_eq!(config("{{json .Config.Entrypoint}}").trim(), r#"["/usr/local/bin/drainit","--"]"#);
    assert_eq!(config("{{.Config.StopSignal}}").trim(), "SIGTERM");
    let env = config("{{json .Config.Env}}");
    for key in ["DRAINIT_ORCHESTRATOR_TIMEOUT=", "DRAINIT_GRACE="] {
        assert!(env.contains(key), "no {key} in the image's Env: {env}");
    }

    // As the quick start runs it: no arguments, no environment.
    let c = Container::start(&image, &[], &[]);
    c.wait_for_log("sample-worker: ready", LOG_TIMEOUT);
    assert_log_has(&c.logs(), "event=child_started", "example image");
    let took = c.stop(10);
    let log = c.logs();
    assert_eq!(c.exit_code(), 0, "docker stop took {took:?}; log:\n{log}");
    let cleanup = c.read_file("/state/cleanup.done").unwrap_or_else(|e| panic!("{e}; log:\n{log}"));
    assert!(cleanup.starts_with("stopped by SIGTERM"), "cleanup file: {cleanup:?}");
    assert_log_has(&log, "event=exit code=0", "example image");
}

/// Not a Docker test: the grace numbers in Dockerfile.example and
/// deploy/kubernetes.yaml must agree with each other and with the contract.
#[test]
fn example_grace_settings_agree() {
    // Dockerfile.example: grace ends >= 1s before the docker stop timeout.
    let env: Vec<(String, String)> = example_final_stage()
        .into_iter()
        .filter(|(op, _)| op == "ENV")
        .flat_map(|(_, args)| {
            args.split_whitespace()
                .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect::<Vec<_>>()
        })
        .collect();
    let timeout = env_value(&env, "DRAINIT_ORCHESTRATOR_TIMEOUT").expect("ENV DRAINIT_ORCHESTRATOR_TIMEOUT");
    let grace = env_value(&env, "DRAINIT_GRACE").expect("ENV DRAINIT_GRACE");
    assert!(grace + Duration::from_secs(1) <= timeout, "Dockerfile.example: grace {grace:?}, timeout {timeout:?}");

    // deploy/kubernetes.yaml: the timeout is what the preStop hook leaves of
    // terminationGracePeriodSeconds, and the grace ends >= 1s before it.
    let path = Path::new(MANIFEST_DIR).join("deploy/kubernetes.yaml");
    let yaml = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<&str> = yaml.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let after = |key: &str| -> &str {
        let i = lines.iter().position(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
        lines[i][key.len()..].trim()
    };
    let env_var = |name: &str| -> Duration {
        let i = lines
            .iter()
            .position(|l| *l == format!("- name: {name}"))
            .unwrap_or_else(|| panic!("kubernetes.yaml sets no {name}"));
        parse_duration(lines[i + 1].strip_prefix("value:").expect("value: after name:"))
    };
    let period = Duration::from_secs(after("terminationGracePeriodSeconds:").parse().expect("seconds"));
    let pre_stop = {
        let command = after("command:");
        let secs = command.trim_matches(|c| c == '[' || c == ']').split(',').next_back().unwrap();
        parse_duration(secs.trim().trim_matches('"'))
    };
    assert!(after("command:").contains("sleep"), "the preStop hook is expected to be a sleep");
    let k8s_timeout = env_var("DRAINIT_ORCHESTRATOR_TIMEOUT");
    let k8s_grace = env_var("DRAINIT_GRACE");
    assert_eq!(
        k8s_timeout + pre_stop,
        period,
        "kubernetes.yaml: DRAINIT_ORCHESTRATOR_TIMEOUT + preStop must equal terminationGracePeriodSeconds"
    );
    assert!(k8s_grace + Duration::from_secs(1) <= k8s_timeout, "kubernetes.yaml: grace {k8s_grace:?}");
    let step = env_var("SAMPLE_WORKER_STEP");
    assert!(step < k8s_grace, "kubernetes.yaml: a step ({step:?}) must fit in the grace");
}
