//! drainit in the init slot of Docker and Podman (issue 17): `docker run
//! --init` and `podman run --init` with drainit as the engines' init, in
//! images that do not contain it.
//!
//! Docker: the tests start a private dockerd of their own, once per test
//! process: in its own network and mount namespaces (`unshare --net --mount`;
//! `--bridge none` outside one would delete the host's docker0), with its own
//! socket, data root, exec root, pidfile, cgroup parent and an empty config
//! file, storage driver vfs, no iptables, and `--init-path` naming the static
//! drainit copied as `docker-init`. The machine's own engine is never touched:
//! the daemon gets every path as a flag, and in its mount namespace /run,
//! /var and /etc/docker are empty tmpfs mounts, so that even a default path
//! would land in memory that goes with it (/var/run/docker.sock,
//! /var/lib/docker, /etc/docker/daemon.json and the host containerd's
//! sockets are out of its sight). Containers run with `--network none`.
//!
//! Podman: rootful, with its own storage.conf (vfs, its own graph and run
//! roots) and containers.conf (cgroupfs, events and temporary files in its
//! own directory) through CONTAINERS_STORAGE_CONF and CONTAINERS_CONF; every
//! podman command runs by nsenter in one private network and mount namespace
//! where /run and /var are empty tmpfs mounts (rootful podman and runc keep a
//! few files at fixed paths there: /run/runc, /var/lib/containers/cache).
//! Containers run with `--network none` and `--ulimit nofile=1024:1024
//! --ulimit nproc=1024:1024` (runc here refuses Podman's default rlimits).
//!
//! Images are imported from a tarball (static busybox and the test
//! workers); nothing is pulled. Everything lives under
//! $TMPDIR/drainit-engines/<kind>-<pid>-<start time>-<n> and in cgroups named
//! after it; it goes when the test process exits (an atexit handler; a test
//! that panics changes nothing), when a guard drops, or, after a crash, at the
//! start of the next run: a directory whose owner process is gone is torn
//! down then. Each engine's helper process also stops it when the test
//! process dies, whatever kills it: it waits for EOF on a pipe only the test
//! process holds.
//!
//! Needs, and fails (never skips) without: dockerd, the docker CLI, containerd
//! and runc (Debian: `apt-get install -y docker.io`), podman (`apt-get install
//! -y podman`), unshare and nsenter (util-linux), tar, a static busybox and the
//! static drainit (see tests/containers/, which builds on the test kit,
//! tests/kit/).

mod kit;

mod containers;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use containers::{
    Container, ENGINE_TIMEOUT, Engine, LOG_TIMEOUT, ScratchFiles, assert_log_has, check_deadline_stop,
    check_drained_stop, check_orphans_reaped, run, run_bounded, statics,
};
use kit::{HOST, Scratch, need_program, wait_for, wait_until};

/// The systemd default, as dockerd runs under its unit: /usr/local before /usr.
const DAEMON_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The tag of the imported image, in every private engine.
const IMAGE: &str = "drainit-engines-rootfs:latest";
/// Bound on a private engine's start-up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Private state directories: where they are, and who owns them.

/// $TMPDIR/drainit-engines: short paths (a socket path has at most 107 bytes),
/// outside the directories the engines' namespaces hide.
fn base_dir() -> PathBuf {
    let tmp = std::env::temp_dir();
    let tmp = tmp.canonicalize().unwrap_or(tmp);
    for hidden in ["/run", "/var", "/usr/local", "/etc"] {
        assert!(
            !tmp.starts_with(hidden),
            "TMPDIR is {}, under {hidden}, which the private engines' mount namespaces hide: \
             set TMPDIR to a directory outside /run, /var, /usr/local and /etc",
            tmp.display()
        );
    }
    tmp.join("drainit-engines")
}

/// A new, empty state directory `<kind>-<pid>-<start time>-<n>` under the
/// base, after tearing down what crashed runs left there.
fn new_state_dir(kind: &str) -> PathBuf {
    static LEFTOVERS: OnceLock<()> = OnceLock::new();
    LEFTOVERS.get_or_init(clean_leftovers);
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let me = std::process::id();
    let started = HOST.start_time(me as i32).expect("own /proc/self/stat");
    let dir = base_dir().join(format!("{kind}-{me}-{started}-{}", SEQ.fetch_add(1, Ordering::SeqCst)));
    teardown(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// True while the process that made a state directory (named in it) runs.
fn owner_alive(name: &str) -> bool {
    // <kind>-<pid>-<start time>-<n>, where the kind may hold a `-`.
    let mut parts = name.rsplit('-').skip(1);
    match (parts.next().and_then(|s| s.parse::<u64>().ok()), parts.next()) {
        (Some(started), Some(pid)) => pid.parse().is_ok_and(|pid| HOST.start_time(pid) == Some(started)),
        _ => false,
    }
}

/// Tears down every state directory, and every cgroup, whose owner is gone.
fn clean_leftovers() {
    let base = base_dir();
    if let Ok(entries) = fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !owner_alive(&name) {
                eprintln!("engines: removing {} left by an earlier run", entry.path().display());
                teardown(&entry.path());
            }
        }
    }
    for root in cgroup_roots() {
        for entry in fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(state) = name.strip_prefix("drainit-engines-")
                && !owner_alive(state)
            {
                teardown(&base.join(state));
            }
        }
    }
}

/// The cgroup every container of a state directory runs under.
fn cgroup_name(dir: &Path) -> String {
    format!("drainit-engines-{}", dir.file_name().unwrap().to_string_lossy())
}

/// The mount points of the cgroup hierarchies: /sys/fs/cgroup itself under
/// cgroup v2, each controller's directory under v1.
fn cgroup_roots() -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut roots: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Removes everything a state directory stands for: the processes started
/// with it (daemons, shims, conmon, helpers: they name it on their command
/// line), every process in its cgroups (the containers), the cgroups, and the
/// directory. Idempotent; never panics.
fn teardown(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let mentions = |arg: &str| arg == needle || arg.contains(&format!("{needle}/"));
    let cgroups: Vec<PathBuf> = cgroup_roots().into_iter().map(|r| r.join(cgroup_name(dir))).collect();
    // Bounded: whatever is still there after 20s is reported by the test
    // that needed it gone.
    let _ = wait_until(Duration::from_secs(20), || {
        let mut left = 0;
        for pid in HOST.with_arg(mentions) {
            left += 1;
            kill(&pid.to_string());
        }
        for cgroup in &cgroups {
            for procs in cgroup_dirs(cgroup).iter().map(|d| d.join("cgroup.procs")) {
                for pid in fs::read_to_string(procs).unwrap_or_default().split_whitespace() {
                    left += 1;
                    kill(pid);
                }
            }
        }
        left == 0
    });
    for cgroup in &cgroups {
        // Deepest first: a cgroup goes only once it has no children.
        for d in cgroup_dirs(cgroup).iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }
    let mut failed = None;
    let removed = wait_until(Duration::from_secs(1), || match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            failed = Some(e);
            false
        }
        _ => true,
    });
    if !removed {
        eprintln!("engines: cannot remove {}: {}", dir.display(), failed.map(|e| e.to_string()).unwrap_or_default());
    }
}

fn kill(pid: &str) {
    if let Ok(pid) = pid.parse::<libc::pid_t>() {
        // SAFETY: kill(2) with a pid read from /proc; ESRCH is fine.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// `cgroup` and every cgroup below it, parents first.
fn cgroup_dirs(cgroup: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut todo = vec![cgroup.to_path_buf()];
    while let Some(d) = todo.pop() {
        if !d.is_dir() {
            continue;
        }
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(entry.path());
            }
        }
        all.push(d);
    }
    all.sort_by_key(|p| p.components().count());
    all
}

// ---------------------------------------------------------------------------
// A private engine: a helper process in its own namespaces, stopped at exit.

/// What one private engine needs torn down: its helper (which runs inside the
/// namespaces and stops the engine on EOF of its stdin) and its directory.
struct Private {
    dir: PathBuf,
    helper: Mutex<Option<Child>>,
}

impl Private {
    /// Starts `script` (sh; `$1` is the state directory) as the helper in a new
    /// network and mount namespace, its stdin the pipe that keeps it going.
    fn spawn(dir: PathBuf, script: &str, args: &[&str], env: &[(OsString, OsString)]) -> Private {
        let unshare = need_program("unshare", "util-linux");
        let mut cmd = Command::new(unshare);
        cmd.args(["--net", "--mount", "--propagation", "private", "--", "sh", "-euc", script, "sh"])
            .arg(&dir)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("helper.log")).expect("helper.log"));
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        register_at_exit();
        Private { dir, helper: Mutex::new(Some(child)) }
    }

    fn pid(&self) -> u32 {
        self.helper.lock().unwrap().as_ref().map(Child::id).expect("the helper runs")
    }

    /// Err with the helper's log once it has exited.
    fn check_alive(&self, what: &str) -> Result<(), String> {
        let mut helper = self.helper.lock().unwrap();
        match helper.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => Ok(()),
            other => Err(format!(
                "{what}: its helper ended ({other:?}); helper.log:\n{}",
                fs::read_to_string(self.dir.join("helper.log")).unwrap_or_default()
            )),
        }
    }

    /// Closes the helper's stdin (it stops the engine), waits for it a
    /// bounded time, and tears down the directory.
    fn stop(&self) {
        let helper = self.helper.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = helper {
            drop(child.stdin.take());
            if !wait_until(Duration::from_secs(30), || !matches!(child.try_wait(), Ok(None))) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        teardown(&self.dir);
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The shared engines are statics, never dropped: they are stopped when the
/// test process exits (libtest ends with exit(), which runs atexit handlers,
/// whether tests passed, failed or panicked).
fn register_at_exit() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        extern "C" fn at_exit() {
            let _ = std::panic::catch_unwind(|| {
                if let Some(Ok(d)) = DOCKERD.get() {
                    d.private.stop();
                }
                if let Some(Ok(p)) = PODMAN.get() {
                    p.private.stop();
                }
            });
        }
        // SAFETY: registers a handler that only stops child processes and removes files.
        unsafe { libc::atexit(at_exit) };
    });
}

/// Copies the static drainit to `dir/bin/NAME`.
fn install_drainit(dir: &Path, name: &str) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let to = bin.join(name);
    fs::copy(&statics().drainit, &to).unwrap_or_else(|e| panic!("cp drainit {}: {e}", to.display()));
    to
}

/// A tarball of the test root filesystem (busybox, /tmp, /run, the workers;
/// no drainit: the engine brings it) in `dir`.
fn rootfs_tarball(dir: &Path) -> PathBuf {
    let scratch = Scratch(dir.join("rootfs-build"));
    scratch.busybox_rootfs("rootfs", true);
    let built = scratch.tarball("rootfs");
    let tar = dir.join("rootfs.tar");
    fs::rename(&built, &tar).unwrap();
    tar
}

fn leak(engine: Engine) -> &'static Engine {
    Box::leak(Box::new(engine))
}

// ---------------------------------------------------------------------------
// The private dockerd.

/// Runs in the daemon's namespaces; `$1` is the state directory, `$2` says
/// whether docker-init is to be found by name (then /usr/local gets an
/// overlay holding it), the rest is dockerd's command line.
const DOCKERD_HELPER: &str = r#"
dir=$1; by_name=$2; shift 2
# Out of this daemon's sight: the machine's engine state, sockets and
# configuration. Whatever it writes at a default path lands in memory that
# goes with the namespace.
mount -n -t tmpfs -o mode=0755,size=64m drainit-engines /run
mount -n -t tmpfs -o mode=0755,size=64m drainit-engines /var
ln -s /run /var/run
mkdir -m 1777 /var/tmp
mount -n -t tmpfs -o mode=0755,size=1m drainit-engines /etc/docker
if [ "$by_name" = yes ]; then
    # As an operator installs it: docker-init in /usr/local/libexec/docker
    # (Docker 23 and later look there first) and /usr/local/bin (Docker 20.10
    # looks it up in PATH, where /usr/local/bin comes before /usr/bin).
    mkdir -p /run/usr-local/upper /run/usr-local/work
    mount -n -t overlay drainit-engines \
        -o lowerdir=/usr/local,upperdir=/run/usr-local/upper,workdir=/run/usr-local/work /usr/local
    mkdir -p /usr/local/libexec/docker /usr/local/bin
    cp "$dir/bin/docker-init" /usr/local/libexec/docker/docker-init
    cp "$dir/bin/docker-init" /usr/local/bin/docker-init
fi
"$@" </dev/null >"$dir/dockerd.log" 2>&1 &
daemon=$!
# Until the test process closes this pipe (or dies).
read -r _ || true
kill -TERM "$daemon" 2>/dev/null || true
wait "$daemon" || true
"#;

struct Dockerd {
    private: Private,
    engine: &'static Engine,
    /// The static drainit as `docker-init`, as the daemon runs it.
    init: PathBuf,
}

static DOCKERD: OnceLock<Result<Dockerd, String>> = OnceLock::new();

/// The private dockerd the Docker tests share, with `--init-path` and the
/// test image.
fn dockerd() -> &'static Dockerd {
    match DOCKERD.get_or_init(|| Dockerd::start("docker", "{}", false)) {
        Ok(d) => d,
        Err(msg) => panic!("{msg}"),
    }
}

impl Dockerd {
    /// A private dockerd with `config` as its config file; `by_name`: no
    /// `--init-path`, docker-init is found where an operator installs it.
    fn start(kind: &str, config: &str, by_name: bool) -> Result<Dockerd, String> {
        let dockerd = need_program("dockerd", "docker.io");
        let cli = need_program("docker", "docker.io");
        for (name, package) in [("containerd", "containerd"), ("runc", "runc"), ("tar", "tar")] {
            need_program(name, package);
        }
        if !Path::new("/etc/docker").is_dir() {
            return Err("no /etc/docker: dockerd writes its key there whatever its flags say, and the \
                        private daemon hides it behind a tmpfs; create the directory (Debian's \
                        docker.io package does)"
                .into());
        }
        let dir = new_state_dir(kind);
        let init = install_drainit(&dir, "docker-init");
        fs::write(dir.join("daemon.json"), config).unwrap();
        let socket = dir.join("docker.sock");
        let cgroup = format!("/{}", cgroup_name(&dir));
        let d = |rel: &str| dir.join(rel).to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            dockerd.to_string_lossy().into_owned(),
            format!("--config-file={}", d("daemon.json")),
            format!("--host=unix://{}", socket.display()),
            format!("--data-root={}", d("data")),
            format!("--exec-root={}", d("exec")),
            format!("--pidfile={}", d("dockerd.pid")),
            "--storage-driver=vfs".into(),
            "--bridge=none".into(),
            "--iptables=false".into(),
            "--ip-forward=false".into(),
            format!("--cgroup-parent={cgroup}"),
            "--shutdown-timeout=5".into(),
        ];
        let help = run(&dockerd.to_string_lossy(), &["--help"], Duration::from_secs(20));
        if help.stdout.contains("--ip6tables") {
            args.push("--ip6tables=false".into());
        }
        if !by_name {
            args.push(format!("--init-path={}", init.display()));
        }
        let mut helper_args = vec![if by_name { "yes" } else { "no" }];
        helper_args.extend(args.iter().map(String::as_str));
        let private = Private::spawn(dir.clone(), DOCKERD_HELPER, &helper_args, &[("PATH".into(), DAEMON_PATH.into())]);
        let engine = leak(Engine {
            name: "docker",
            program: cli,
            prefix: vec!["--host".into(), format!("unix://{}", socket.display()).into()],
            env: vec![("DOCKER_CONFIG".into(), dir.join("cli").into())],
            env_remove: vec!["DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"],
            run_defaults: vec!["--network".into(), "none".into()],
        });
        let d = Dockerd { private, engine, init };
        let t = Instant::now();
        let ready = wait_for(START_TIMEOUT, || {
            if d.private.check_alive("the private dockerd").is_err() {
                return Some(false);
            }
            let out = run_bounded(engine.command(&["version", "--format", "{{.Server.Version}}"]), ENGINE_TIMEOUT);
            out.is_ok_and(|o| o.status.success()).then_some(true)
        });
        if ready != Some(true) {
            return Err(format!(
                "the private dockerd did not answer within {START_TIMEOUT:?} ({}); dockerd.log:\n{}",
                d.private.check_alive("dockerd").err().unwrap_or_default(),
                d.log()
            ));
        }
        eprintln!("engines: private dockerd in {} answered after {:?}", dir.display(), t.elapsed());
        engine.ok(&["import", &rootfs_tarball(&dir).to_string_lossy(), IMAGE]);
        Ok(d)
    }

    fn log(&self) -> String {
        fs::read_to_string(self.private.dir.join("dockerd.log")).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------
// The private Podman.

/// Runs in Podman's namespaces; `$1` is the state directory.
const PODMAN_HELPER: &str = r#"
dir=$1
# Rootful podman and runc keep files at fixed paths (/run/runc,
# /var/lib/containers/cache, /var/cache/containers): here they land in memory.
mount -n -t tmpfs -o mode=0755,size=64m drainit-engines /run
mount -n -t tmpfs -o mode=0755,size=64m drainit-engines /var
ln -s /run /var/run
mkdir -m 1777 /var/tmp
touch "$dir/namespace.ready"
# Until the test process closes this pipe (or dies).
read -r _ || true
podman rm --all --force --time 0 >/dev/null 2>&1 || true
"#;

struct Podman {
    private: Private,
    engine: &'static Engine,
    /// The same podman with containers.conf naming drainit as the init
    /// (`init_path`) and setting DRAINIT_GRACE=1s for every container.
    with_defaults: &'static Engine,
    /// The static drainit, for `--init-path`.
    init: PathBuf,
}

static PODMAN: OnceLock<Result<Podman, String>> = OnceLock::new();

fn podman() -> &'static Podman {
    match PODMAN.get_or_init(Podman::start) {
        Ok(p) => p,
        Err(msg) => panic!("{msg}"),
    }
}

impl Podman {
    fn start() -> Result<Podman, String> {
        let podman = need_program("podman", "podman");
        let nsenter = need_program("nsenter", "util-linux");
        for (name, package) in [("conmon", "conmon"), ("tar", "tar")] {
            need_program(name, package);
        }
        let dir = new_state_dir("podman");
        let init = install_drainit(&dir, "drainit");
        let d = |rel: &str| dir.join(rel).to_string_lossy().into_owned();
        fs::write(
            dir.join("storage.conf"),
            format!("[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n", d("root"), d("runroot")),
        )
        .unwrap();
        let engine_conf = format!(
            "[engine]\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n\
             events_logfile_path = \"{}\"\n\
             tmp_dir = \"{}\"\n\
             image_copy_tmp_dir = \"{}\"\n\
             volume_path = \"{}\"\n\
             \n[network]\nnetwork_config_dir = \"{}\"\n",
            d("events.log"),
            d("tmp"),
            d("tmp"),
            d("volumes"),
            d("net")
        );
        let containers = "[containers]\nlog_driver = \"k8s-file\"\nnetns = \"none\"\n";
        fs::write(dir.join("containers.conf"), format!("{containers}\n{engine_conf}")).unwrap();
        // The install story for a whole host: init_path (what `--init` mounts)
        // and drainit's variables for every container, in containers.conf.
        // (`init = true` there is not applied by `podman run` 4.3: its --init
        // defaults to false whatever containers.conf says.)
        let defaults = format!(
            "{containers}init_path = \"{}\"\n\
             env = [\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\", \"DRAINIT_GRACE=1s\"]\n\n\
             {engine_conf}",
            init.display()
        );
        fs::write(dir.join("containers-defaults.conf"), defaults).unwrap();
        fs::write(dir.join("registries.conf"), "").unwrap();
        for sub in ["tmp", "net"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let env_for = |conf: &str| -> Vec<(OsString, OsString)> {
            vec![
                ("CONTAINERS_CONF".into(), d(conf).into()),
                ("CONTAINERS_STORAGE_CONF".into(), d("storage.conf").into()),
                ("CONTAINERS_REGISTRIES_CONF".into(), d("registries.conf").into()),
            ]
        };
        let private = Private::spawn(dir.clone(), PODMAN_HELPER, &[], &env_for("containers.conf"));
        let ready = wait_for(START_TIMEOUT, || {
            if private.check_alive("the podman namespace").is_err() {
                return Some(false);
            }
            dir.join("namespace.ready").exists().then_some(true)
        });
        if ready != Some(true) {
            return Err(format!(
                "podman's namespace was not ready within {START_TIMEOUT:?}: {}",
                private.check_alive("podman's namespace").err().unwrap_or_default()
            ));
        }
        let cgroup = format!("/{}", cgroup_name(&dir));
        let make = |conf: &str| {
            leak(Engine {
                name: "podman",
                program: nsenter.clone(),
                prefix: vec![
                    "--target".into(),
                    private.pid().to_string().into(),
                    "--mount".into(),
                    "--net".into(),
                    "--".into(),
                    podman.clone().into(),
                ],
                env: env_for(conf),
                env_remove: vec!["CONTAINER_HOST", "CONTAINER_CONNECTION"],
                run_defaults: [
                    "--network",
                    "none",
                    "--ulimit",
                    "nofile=1024:1024",
                    "--ulimit",
                    "nproc=1024:1024",
                    "--cgroup-parent",
                    &cgroup,
                ]
                .map(String::from)
                .to_vec(),
            })
        };
        let engine = make("containers.conf");
        let with_defaults = make("containers-defaults.conf");
        let p = Podman { private, engine, with_defaults, init };
        engine.ok(&["import", &rootfs_tarball(&dir).to_string_lossy(), IMAGE]);
        Ok(p)
    }

    /// `--init --init-path <the static drainit>`.
    fn init_opts(&self) -> [String; 3] {
        ["--init".into(), "--init-path".into(), self.init.to_string_lossy().into_owned()]
    }

    /// `podman run -d --init --init-path drainit` of the test image.
    fn start_with_init(&self, env: &[(&str, &str)], args: &[&str]) -> Container {
        let opts = self.init_opts();
        Container::start(self.engine, &opts.iter().map(String::as_str).collect::<Vec<_>>(), env, IMAGE, args)
    }
}

/// The image's name in Podman's store.
const PODMAN_IMAGE: &str = "localhost/drainit-engines-rootfs:latest";

// ---------------------------------------------------------------------------
// What drainit's version line must be under the name docker-init.

/// (VERSION, ID) of `tini version VERSION - git.ID`, checked against the
/// contract: VERSION names drainit and its version, and the ID (what `docker
/// info` shows) is drainit's version with `_` for `.`, maybe followed by `-`
/// and 7 hex digits of the build's commit. Neither has " - " or ".", which
/// dockerd's parseInitVersion splits on.
fn parse_init_version(line: &str) -> (String, String) {
    let version = format!("drainit-{}", env!("CARGO_PKG_VERSION"));
    let rest = line.strip_prefix("tini version ").unwrap_or_else(|| panic!("not `tini version ...`: {line:?}"));
    let (v, git) = rest.split_once(" - ").unwrap_or_else(|| panic!("no ` - ` in {line:?}"));
    let id = git.strip_prefix("git.").unwrap_or_else(|| panic!("no `git.` after ` - ` in {line:?}"));
    assert_eq!(v, version, "the version part of {line:?}");
    let id_base = version.replace('.', "_");
    let commit = id.strip_prefix(&id_base).unwrap_or_else(|| panic!("the ID of {line:?} is not {id_base}[-COMMIT]"));
    assert!(
        commit.is_empty()
            || (commit.len() == 8 && commit.starts_with('-') && commit[1..].bytes().all(|b| b.is_ascii_hexdigit())),
        "the ID's commit part {commit:?} of {line:?} is not `-` and 7 hex digits"
    );
    assert!(!id.contains('.') && !id.contains(" - "), "{line:?}");
    (v.to_string(), id.to_string())
}

// ---------------------------------------------------------------------------
// Docker tests.

#[test]
fn docker_info_shows_drainits_init_version() {
    let d = dockerd();
    // The binary itself, under the name docker-init: one line, -V the same.
    let out = run(&d.init.to_string_lossy(), &["--version"], Duration::from_secs(10));
    assert!(out.status.success(), "docker-init --version: {}", out.text());
    assert_eq!(out.stdout.lines().count(), 1, "one line expected: {:?}", out.stdout);
    let (version, id) = parse_init_version(out.stdout.trim_end());
    let short = run(&d.init.to_string_lossy(), &["-V"], Duration::from_secs(10));
    assert_eq!(short.stdout, out.stdout, "-V and --version differ");
    // Under any other name: `drainit VERSION`.
    let scratch = Scratch::new("init-version");
    scratch.copy("drainit", &d.init);
    fs::set_permissions(scratch.path("drainit"), fs::Permissions::from_mode(0o755)).unwrap();
    let other = run(&scratch.path("drainit").to_string_lossy(), &["--version"], Duration::from_secs(10));
    assert_eq!(other.stdout, format!("drainit {}\n", env!("CARGO_PKG_VERSION")));

    // What dockerd made of it.
    let info = d.engine.ok(&["info"]);
    let lines: Vec<&str> = info.lines().filter(|l| l.to_lowercase().contains("init")).collect();
    eprintln!("docker info, as seen:\n{}", lines.join("\n"));
    assert_eq!(d.engine.ok(&["info", "--format", "{{.InitCommit.ID}}"]).trim(), id, "{info}");
    assert!(lines.iter().any(|l| l.trim() == format!("init version: {id}")), "docker info:\n{info}");
    let component = d.engine.ok(&[
        "version",
        "--format",
        "{{range .Server.Components}}{{if eq .Name \"docker-init\"}}{{.Version}} {{.Details.GitCommit}}{{end}}{{end}}",
    ]);
    assert_eq!(component.trim(), format!("{version} {id}"), "docker version's docker-init component");
    let log = d.log();
    // Its own containerd, not the machine's.
    assert_log_has(&log, "libcontainerd: started new containerd process", "the private dockerd's log");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("docker-init") && (l.contains("failed to parse") || l.contains("failed to retrieve")))
        .collect();
    assert!(warnings.is_empty(), "dockerd warned about the init's version:\n{}", warnings.join("\n"));
}

#[test]
fn docker_run_init_runs_drainit_as_pid_1() {
    let d = dockerd();
    let c = Container::start(d.engine, &["--init"], &[], IMAGE, &["sh", "/workers/term-reporter.sh"]);
    c.wait_for_log("term-reporter: ready", LOG_TIMEOUT);
    assert_eq!(c.pid1_argv(), ["/sbin/docker-init", "--", "sh", "/workers/term-reporter.sh"]);
    // The bind-mounted binary is drainit's static build, byte for byte.
    let inside = c.exec(&["sha256sum", "/proc/1/exe"]);
    let outside = run("sha256sum", &[&d.init.to_string_lossy()], Duration::from_secs(10));
    let hash = |o: &str| o.split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(hash(&inside.stdout), hash(&outside.stdout), "PID 1 is not drainit: {}", inside.text());
    assert_log_has(&c.logs(), "event=child_started", "docker run --init");

    // Exit codes pass through.
    let (_c, out) = Container::run(d.engine, &["--init"], &[], IMAGE, &["sh", "-c", "exit 3"]);
    assert_eq!(out.code(), Some(3), "{}", out.text());
    assert_log_has(&out.stderr, "event=exit code=3", "docker run --init ... exit 3");
}

#[test]
fn docker_stop_lets_a_draining_worker_finish_under_the_init() {
    let d = dockerd();
    let env = [("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("SAMPLE_WORKER_STEP", "1")];
    let c = Container::start(d.engine, &["--init"], &env, IMAGE, &["/usr/local/bin/sample-worker"]);
    check_drained_stop(&c, 5, 4);
}

/// DRAINIT_ORCHESTRATOR_TIMEOUT=5s: a grace of 4s, before Docker's SIGKILL at 5s.
#[test]
fn docker_stop_of_a_term_ignoring_worker_ends_at_drainits_deadline() {
    let d = dockerd();
    let env = [("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")];
    let c = Container::start(d.engine, &["--init"], &env, IMAGE, &["sh", "/workers/ignore-term.sh"]);
    check_deadline_stop(&c, 5, 4);
}

/// What the README says of a `docker stop -t N` that drainit was not told
/// of: Docker's SIGKILL ends drainit and the container before drainit's own
/// deadline, and nothing honest is left in the log.
#[test]
fn docker_stop_shorter_than_drainits_deadline_kills_drainit_first() {
    let d = dockerd();
    let c = Container::start(d.engine, &["--init"], &[], IMAGE, &["sh", "/workers/ignore-term.sh"]);
    c.wait_for_log("ignore-term: ready", LOG_TIMEOUT);
    let took = c.stop(2);
    let log = c.logs();
    assert_eq!(c.exit_code(), 137, "docker stop -t 2 took {took:?}; log:\n{log}");
    // drainit heard the stop and set its deadline for Docker's default 10s...
    assert_log_has(&log, "event=stop_requested signal=SIGTERM grace=9s", "too short a docker stop");
    // ...and died of Docker's SIGKILL at 2s, before it: no deadline, no exit line.
    assert!(!log.contains("event=deadline_reached") && !log.contains("event=exit"), "{log}");
}

#[test]
fn docker_init_reaps_orphans() {
    let d = dockerd();
    let c = Container::start(d.engine, &["--init"], &[], IMAGE, &["sh", "/workers/orphans.sh"]);
    check_orphans_reaped(&c, "docker-init");
}

#[test]
fn docker_run_init_takes_its_configuration_from_the_environment() {
    let d = dockerd();
    let run_init = |env: &[(&str, &str)], args: &[&str]| Container::run(d.engine, &["--init"], env, IMAGE, args).1;

    // A bad value is drainit's configuration error, naming the variable.
    let out = run_init(&[("DRAINIT_GRACE", "soon")], &["true"]);
    assert_eq!(out.code(), Some(2), "{}", out.text());
    assert!(out.stderr.contains("DRAINIT_GRACE"), "the error names no variable:\n{}", out.text());

    // Backoff codes, delays, budget and exit remapping, all from variables.
    let out = run_init(
        &[
            ("DRAINIT_BACKOFF_EXIT_CODES", "3"),
            ("DRAINIT_BACKOFF_DELAY", "10ms"),
            ("DRAINIT_BACKOFF_TIMEOUT", "300ms"),
            ("DRAINIT_REMAP_EXIT", "3:0"),
        ],
        &["sh", "-c", "echo attempt=$DRAINIT_ATTEMPT; exit 3"],
    );
    let log = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code(), Some(0), "{log}");
    assert_log_has(&log, "event=backoff attempt=1 code=3", "backoff from the environment");
    assert_log_has(&log, "attempt=2", "backoff from the environment");
    assert_log_has(&log, "event=backoff_exhausted", "backoff from the environment");
    assert_log_has(&log, "event=exit code=0 remapped_from=3", "remapping from the environment");

    // The log level.
    let out = run_init(&[("DRAINIT_LOG", "warn")], &["true"]);
    assert_eq!(out.code(), Some(0), "{}", out.text());
    assert!(!out.stderr.contains("event="), "DRAINIT_LOG=warn, yet info lines:\n{}", out.text());
}

/// The install story for a whole host, as an operator follows it: a daemon
/// with `"init": true` in daemon.json and no init path, and drainit copied as
/// docker-init where dockerd looks for it by name.
#[test]
fn docker_daemon_wide_init_finds_drainit_by_name() {
    let d = Dockerd::start("docker-defaults", "{\"init\": true}\n", true).unwrap_or_else(|e| panic!("{e}"));
    let info = d.engine.ok(&["info", "--format", "{{.InitBinary}} {{.InitCommit.ID}}"]);
    let (binary, id) = info.trim().split_once(' ').unwrap_or_else(|| panic!("docker info: {info:?}"));
    assert_eq!(binary, "docker-init");
    let line = run(&d.init.to_string_lossy(), &["--version"], Duration::from_secs(10)).stdout;
    assert_eq!(id, parse_init_version(line.trim_end()).1, "docker info shows another init: {info}");

    // Every container gets the init without --init...
    let (_c, out) = Container::run(d.engine, &[], &[], IMAGE, &["cat", "/proc/1/cmdline"]);
    assert_eq!(out.code(), Some(0), "{}", out.text());
    assert_eq!(out.stdout.split('\0').collect::<Vec<_>>(), ["/sbin/docker-init", "--", "cat", "/proc/1/cmdline", ""]);
    assert_log_has(&out.stderr, "event=exit code=0", "daemon-wide init");
    // ...and --init=false opts one out.
    let (_c, out) = Container::run(d.engine, &["--init=false"], &[], IMAGE, &["cat", "/proc/1/cmdline"]);
    assert_eq!(out.stdout.split('\0').collect::<Vec<_>>(), ["cat", "/proc/1/cmdline", ""], "{}", out.text());
    drop(d);
}

// ---------------------------------------------------------------------------
// Podman tests.

#[test]
fn podman_run_init_runs_drainit_as_pid_1() {
    let p = podman();
    let opts = p.init_opts();
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let (_c, out) = Container::run(p.engine, &opts, &[], PODMAN_IMAGE, &["sh", "-c", "cat /proc/1/cmdline; exit 3"]);
    assert_eq!(out.code(), Some(3), "exit 3 must pass through: {}", out.text());
    assert_eq!(
        out.stdout.split('\0').collect::<Vec<_>>(),
        ["/run/podman-init", "--", "sh", "-c", "cat /proc/1/cmdline; exit 3", ""],
        "{}",
        out.text()
    );
    assert_log_has(&out.stderr, "event=exit code=3", "podman run --init");
}

#[test]
fn podman_stop_of_a_term_ignoring_worker_ends_at_drainits_grace() {
    let p = podman();
    let c = p.start_with_init(&[("DRAINIT_GRACE", "1s")], &["sh", "/workers/ignore-term.sh"]);
    check_deadline_stop(&c, 5, 1);
}

#[test]
fn podman_stop_lets_a_draining_worker_finish() {
    let p = podman();
    let env = [("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("SAMPLE_WORKER_STEP", "1")];
    let c = p.start_with_init(&env, &["/usr/local/bin/sample-worker"]);
    check_drained_stop(&c, 5, 4);
}

#[test]
fn podman_kill_usr1_reaches_a_grandchild() {
    let p = podman();
    let c = p.start_with_init(&[], &["sh", "/workers/usr1-grandchild.sh"]);
    c.wait_for_log("grandchild: ready", LOG_TIMEOUT);
    p.engine.ok(&["kill", "--signal", "USR1", &c.name]);
    c.wait_for_log("grandchild: got USR1", Duration::from_secs(10));
    c.wait_for_log("worker: got USR1", Duration::from_secs(10));
    assert!(c.running(), "USR1 is no stop signal, yet {}", c.state());
}

/// containers.conf with `init_path` and drainit's variables in `env`: a
/// plain `podman run --init` gets drainit, configured.
#[test]
fn podman_containers_conf_sets_the_init_and_its_variables() {
    let p = podman();
    let c = Container::start(p.with_defaults, &["--init"], &[], PODMAN_IMAGE, &["sh", "/workers/term-reporter.sh"]);
    c.wait_for_log("term-reporter: ready", LOG_TIMEOUT);
    assert_eq!(c.pid1_argv(), ["/run/podman-init", "--", "sh", "/workers/term-reporter.sh"]);
    c.stop(5);
    let log = c.logs();
    assert_eq!(c.exit_code(), 0, "{log}");
    assert_log_has(&log, "event=stop_requested signal=SIGTERM grace=1s", "containers.conf env");
    assert_log_has(&log, "term-reporter: got TERM", "containers.conf env");
}
