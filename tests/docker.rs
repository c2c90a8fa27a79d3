//! drainit in real containers: the static binary as PID 1 of `FROM scratch`
//! images, driven through the machine's Docker engine (`run`, `stop`, `kill`,
//! `exec`, `cp`, health checks, bind mounts). drainit in the engines' own init
//! slot (`docker run --init`, `podman run --init`) is tests/engines.rs.
//!
//! Needs, and fails (never skips) without:
//! - a reachable Docker engine (`docker version` must reach the server);
//! - a static busybox at /bin/busybox (Debian: `apt-get install -y busybox-static`),
//!   or the path in `BUSYBOX_STATIC_BIN`, for the shell workers;
//! - the static drainit. The tests build it themselves with `scripts/prepare
//!   static`, as CI does (a no-op when up to date): the musl build when rustup
//!   has that target, else glibc +crt-static; or `DRAINIT_STATIC_BIN` names a
//!   prebuilt one.
//!
//! No image is pulled: each image is built FROM scratch out of a temporary
//! context. Images and containers are named `drainit-test-<pid>-<n>` and removed
//! by Drop guards, pass or fail; every docker command and every wait has a deadline.
//! What it shares with tests/engines.rs is in tests/containers/, which builds
//! on the test kit (tests/kit/): its bounded waits, scratch directories and
//! log parser.

mod kit;

mod containers;

use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use containers::{
    Container, Engine, Image, LOG_TIMEOUT, MANIFEST_DIR, ScratchFiles, assert_log_has, check_deadline_stop,
    check_drained_stop, check_orphans_reaped, run_bounded, statics, unique_name,
};
use kit::{Scratch, parse_events, wait_until};

// ---------------------------------------------------------------------------
// The engine and its images.

/// The machine's Docker engine; every test fails with the same clear message
/// when it is not reachable.
fn docker() -> &'static Engine {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        let engine = Engine::host_docker();
        let hint = "tests/docker.rs needs a running Docker engine (Debian: `apt-get install -y docker.io`, \
                    then start dockerd; or set DOCKER_HOST); it fails rather than skip";
        let out = run_bounded(engine.command(&["version", "--format", "{{.Server.Version}}"]), Duration::from_secs(20))
            .map_err(|e| format!("Docker engine not reachable: {e}. {hint}"))?;
        if !out.status.success() || out.stdout.trim().is_empty() {
            return Err(format!(
                "Docker engine not reachable: `docker version` exited {}: {} -- {hint}",
                out.status,
                out.stderr.trim()
            ));
        }
        Ok(engine)
    });
    match engine {
        Ok(e) => e,
        Err(msg) => panic!("{msg}"),
    }
}

/// `docker build` of `scratch` (a context directory) with `dockerfile`.
///
/// Without the cache: tests build identical contexts at the same time, and
/// the legacy builder would reuse another build's intermediate layer, which
/// that image's `rmi --force` (its Drop) may delete in mid-build ("failed to
/// get digest ... no such file or directory", seen once in CI).
fn build(scratch: Scratch, dockerfile: &str) -> Image {
    let engine = docker();
    scratch.write("Dockerfile", dockerfile, 0o644);
    let image = Image { engine, tag: format!("{}:latest", unique_name()) };
    let dir = scratch.str();
    let out = engine.run(&["build", "--quiet", "--no-cache", "--tag", &image.tag, &dir]);
    assert!(out.status.success(), "docker build of\n{dockerfile}\nfailed ({}):\n{}", out.status, out.text());
    image
}

/// A `FROM scratch` image of busybox, the test workers and the static
/// drainit at its entry point as in Dockerfile.example, plus `extra`
/// Dockerfile lines; /tmp only when `with_tmp`.
fn drainit_image(with_tmp: bool, extra: &str) -> Image {
    let scratch = Scratch::new("docker-image");
    scratch.busybox_rootfs("rootfs", with_tmp);
    scratch.copy("rootfs/usr/local/bin/drainit", &statics().drainit);
    build(
        scratch,
        &format!(
            "FROM scratch\n\
             COPY rootfs/ /\n\
             STOPSIGNAL SIGTERM\n\
             ENTRYPOINT [\"/usr/local/bin/drainit\", \"--\"]\n\
             {extra}"
        ),
    )
}

/// The test image (drainit_image with /tmp), built once and shared by the
/// tests running at the same time.
fn rig() -> Arc<Image> {
    static RIG: Mutex<Weak<Image>> = Mutex::new(Weak::new());
    let mut shared = RIG.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(image) = shared.upgrade() {
        return image;
    }
    let image = Arc::new(drainit_image(true, ""));
    *shared = Arc::downgrade(&image);
    image
}

/// `docker run -d` of `image` with `opts`, `env` and the worker command `args`.
fn start(image: &Image, opts: &[&str], env: &[(&str, &str)], args: &[&str]) -> Container {
    Container::start(docker(), opts, env, &image.tag, args)
}

// ---------------------------------------------------------------------------
// Dockerfile.example, rebuilt from local files.

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
    let p = statics();
    let ctx = Scratch::new("docker-example");
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
    build(ctx, &dockerfile)
}

// ---------------------------------------------------------------------------
// Small parsers for the manifests and the log.

/// `500ms`, `8s`, `1.5s`, `1m30s`, or a bare number of seconds: the forms
/// the manifests use, a wider set than drainit's own (`kit::parse_duration`).
fn parse_duration(text: &str) -> Duration {
    let text = text.trim().trim_matches('"');
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::from_secs_f64(secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().unwrap_or_else(|_| panic!("bad duration {text:?}"));
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += Duration::from_secs_f64(match &rest[..unit] {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => 60.0 * n,
            "h" => 3600.0 * n,
            u => panic!("bad unit {u:?} in duration {text:?}"),
        });
        rest = &rest[unit..];
    }
    total
}

/// The value of `key=` in the first `event=NAME` line of drainit's log.
fn event_value(log: &str, event: &str, key: &str) -> Option<String> {
    parse_events(log).into_iter().find(|e| e.name == event)?.get(key).map(String::from)
}

fn env_value(env: &[(String, String)], key: &str) -> Option<Duration> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| parse_duration(v))
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
        let (_c, out) = Container::run(docker(), &[], &[], &image.tag, args);
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
    let env = [("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s"), ("SAMPLE_WORKER_STEP", "1")];
    let c = start(&image, &[], &env, &["/usr/local/bin/sample-worker"]);
    check_drained_stop(&c, 5, 4);
}

#[test]
fn drainit_deadline_beats_docker_kill() {
    let image = rig();
    let env = [("DRAINIT_GRACE", "2s"), ("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")];
    let c = start(&image, &[], &env, &["sh", "/workers/ignore-term.sh"]);
    check_deadline_stop(&c, 5, 2);
}

#[test]
fn docker_kill_usr1_reaches_a_grandchild() {
    let image = rig();
    let c = start(&image, &[], &[], &["sh", "/workers/usr1-grandchild.sh"]);
    c.wait_for_log("grandchild: ready", LOG_TIMEOUT);
    docker().ok(&["kill", "--signal", "USR1", &c.name]);
    c.wait_for_log("grandchild: got USR1", Duration::from_secs(10));
    c.wait_for_log("worker: got USR1", Duration::from_secs(10));
    assert!(c.running(), "USR1 is no stop signal, yet {}", c.state());
}

/// `docker kill` (SIGKILL to drainit as PID 1: the whole container dies)
/// then `docker start` of the same container: the record in the container's
/// own filesystem (/tmp) says its predecessor died without its exit, so the
/// finish program (here `env`, whose output lands in the log) runs first,
/// told why, then the worker, told `unclean`; after a `docker stop` the
/// next start is told `clean`.
#[test]
fn docker_kill_then_start_sweeps_with_the_record_in_the_containers_filesystem() {
    let image = rig();
    let env = [("DRAINIT_STATE_DIR", "/tmp"), ("DRAINIT_FINISH", "/bin/env"), ("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")];
    let c = start(&image, &[], &env, &["sh", "-c", "echo worker: predecessor=$DRAINIT_PREDECESSOR; exec sleep 600"]);
    c.wait_for_log("worker: predecessor=none", LOG_TIMEOUT);
    docker().ok(&["kill", &c.name]);
    assert!(wait_until(Duration::from_secs(20), || !c.running()), "{}", c.state());
    docker().ok(&["start", &c.name]);
    c.wait_for_log("worker: predecessor=unclean", LOG_TIMEOUT);
    let log = c.logs();
    assert_log_has(&log, "event=unclean_predecessor attempt=1 pid=1 age=", "after docker kill + start");
    let sweep = log.find("DRAINIT_STOP_REASON=unclean_predecessor").unwrap_or_else(|| panic!("no sweep:\n{log}"));
    let worker = log.find("worker: predecessor=unclean").unwrap_or_default();
    assert!(sweep < worker, "the sweep ran before the worker:\n{log}");
    assert!(log.contains("DRAINIT_PREDECESSOR_PID=1"), "{log}");
    c.stop(5);
    assert_eq!(c.exit_code(), 143, "{}", c.logs());
    docker().ok(&["start", &c.name]);
    c.wait_for_log("worker: predecessor=clean", LOG_TIMEOUT);
    assert_eq!(c.logs().matches("event=unclean_predecessor").count(), 1, "{}", c.logs());
}

#[test]
fn orphans_are_reaped_inside_a_container() {
    let image = rig();
    let c = start(&image, &[], &[], &["sh", "/workers/orphans.sh"]);
    check_orphans_reaped(&c, "drainit");
}

#[test]
fn dockerfile_example_final_stage_runs() {
    let image = example_image();
    let config = |format: &str| docker().ok(&["image", "inspect", "--format", format, &image.tag]);
    assert_eq!(config("{{json .Config.Entrypoint}}").trim(), r#"["/usr/local/bin/drainit","--"]"#);
    assert_eq!(config("{{.Config.StopSignal}}").trim(), "SIGTERM");
    let env = config("{{json .Config.Env}}");
    for key in ["DRAINIT_ORCHESTRATOR_TIMEOUT=", "DRAINIT_GRACE="] {
        assert!(env.contains(key), "no {key} in the image's Env: {env}");
    }

    // As the quick start runs it: no arguments, no environment.
    let c = start(&image, &[], &[], &[]);
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
/// deploy/kubernetes.yaml must agree with each other and with the contract,
/// and their health checks must test the drain file drainit creates.
#[test]
fn example_grace_settings_agree() {
    // Dockerfile.example: grace ends >= 1s before the docker stop timeout; the
    // stop delay leaves the worker time for a step (the sample worker's
    // default, 1s); a health check lands inside the delay.
    let stage = example_final_stage();
    let env: Vec<(String, String)> = stage
        .iter()
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
    let delay = env_value(&env, "DRAINIT_STOP_DELAY").unwrap_or_default();
    assert!(delay + Duration::from_secs(1) < grace, "Dockerfile.example: delay {delay:?} leaves no step in {grace:?}");
    if let Some((_, drain_file)) = env.iter().find(|(k, _)| k == "DRAINIT_DRAIN_FILE") {
        let check = stage.iter().find(|(op, _)| op == "HEALTHCHECK").map(|(_, a)| a.as_str()).unwrap_or_default();
        assert!(check.contains(drain_file.as_str()), "Dockerfile.example: HEALTHCHECK does not test {drain_file}");
        let interval = check
            .split_whitespace()
            .find_map(|w| w.strip_prefix("--interval="))
            .map(parse_duration)
            .expect("HEALTHCHECK --interval=");
        assert!(interval < delay, "Dockerfile.example: a check every {interval:?} may miss a {delay:?} delay");
    }

    // deploy/kubernetes.yaml: the timeout is what a preStop hook (if any)
    // leaves of terminationGracePeriodSeconds, the grace ends >= 1s before
    // it, and the readiness probe tests the drain file.
    let path = Path::new(MANIFEST_DIR).join("deploy/kubernetes.yaml");
    let yaml = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<&str> = yaml.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let find = |key: &str, from: usize| lines.iter().skip(from).position(|l| l.starts_with(key)).map(|i| i + from);
    let value = |i: usize, key: &str| lines[i][key.len()..].trim();
    let env_var = |name: &str| -> Option<String> {
        let i = lines.iter().position(|l| *l == format!("- name: {name}"))?;
        Some(lines[i + 1].strip_prefix("value:").expect("value: after name:").trim().trim_matches('"').to_string())
    };
    let duration_var = |name: &str| parse_duration(&env_var(name).unwrap_or_else(|| panic!("no {name}")));
    let seconds = |key: &str, from: usize| -> Duration {
        let i = find(key, from).unwrap_or_else(|| panic!("kubernetes.yaml: no {key}"));
        Duration::from_secs(value(i, key).parse().unwrap_or_else(|_| panic!("{key} {}", value(i, key))))
    };
    let period = seconds("terminationGracePeriodSeconds:", 0);
    let pre_stop = match find("preStop:", 0) {
        None => Duration::ZERO,
        Some(at) => {
            let i = find("command:", at).expect("a preStop command");
            let command = value(i, "command:");
            assert!(command.contains("sleep"), "the preStop hook is expected to be a sleep: {command}");
            let secs = command.trim_matches(|c| c == '[' || c == ']').split(',').next_back().unwrap();
            parse_duration(secs.trim().trim_matches('"'))
        }
    };
    let k8s_timeout = duration_var("DRAINIT_ORCHESTRATOR_TIMEOUT");
    let k8s_grace = duration_var("DRAINIT_GRACE");
    assert_eq!(
        k8s_timeout + pre_stop,
        period,
        "kubernetes.yaml: DRAINIT_ORCHESTRATOR_TIMEOUT + preStop must equal terminationGracePeriodSeconds"
    );
    assert!(k8s_grace + Duration::from_secs(1) <= k8s_timeout, "kubernetes.yaml: grace {k8s_grace:?}");
    let k8s_delay = env_var("DRAINIT_STOP_DELAY").map(|d| parse_duration(&d)).unwrap_or_default();
    let step = duration_var("SAMPLE_WORKER_STEP");
    assert!(k8s_delay + step < k8s_grace, "kubernetes.yaml: delay {k8s_delay:?} + a step {step:?} must fit the grace");
    if let Some(drain_file) = env_var("DRAINIT_DRAIN_FILE") {
        let probe = find("readinessProbe:", 0).expect("kubernetes.yaml: a readinessProbe on the drain file");
        let command = find("command:", probe).map(|i| value(i, "command:")).unwrap_or_default();
        assert!(command.contains(&drain_file), "kubernetes.yaml: the readiness probe does not test {drain_file}");
        let every = seconds("periodSeconds:", probe);
        assert!(every < k8s_delay, "kubernetes.yaml: a probe every {every:?} may miss a {k8s_delay:?} delay");
    }
}

// ---------------------------------------------------------------------------
// Stop delay and drain file (issue 14): a load balancer's health check fails
// first, the worker hears of the stop only after the delay.

#[test]
fn stop_delay_fails_the_health_check_before_the_worker_hears_of_it() {
    let image = drainit_image(
        true,
        "ENV DRAINIT_STOP_DELAY=1s DRAINIT_DRAIN_FILE=/run/draining DRAINIT_ORCHESTRATOR_TIMEOUT=5s\n\
         HEALTHCHECK --interval=200ms --timeout=5s --retries=1 CMD [\"/bin/busybox\", \"test\", \"!\", \"-e\", \"/run/draining\"]\n",
    );
    let c = start(&image, &[], &[], &["sh", "/workers/term-reporter.sh"]);
    c.wait_for_log("term-reporter: ready", LOG_TIMEOUT);
    let health = || c.inspect("{{.State.Status}} {{.State.Health.Status}}");
    assert!(
        wait_until(LOG_TIMEOUT, || health() == "running healthy"),
        "not healthy within {LOG_TIMEOUT:?}: {}; log:\n{}",
        health(),
        c.logs()
    );

    let name = c.name.clone();
    let stopper = thread::spawn(move || {
        let t = Instant::now();
        let out = docker().run(&["stop", "-t", "5", &name]);
        (out, t.elapsed())
    });
    // While the stop is held back: the drain file is there, the worker has not
    // been told, and the engine's health check turns unhealthy.
    let (mut drain_file_before_term, mut unhealthy_while_running) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !(drain_file_before_term && unhealthy_while_running) {
        let state = health();
        if !state.starts_with("running") {
            break;
        }
        unhealthy_while_running |= state == "running unhealthy";
        if !drain_file_before_term && c.exec(&["test", "-e", "/run/draining"]).status.success() {
            drain_file_before_term = !c.logs().contains("term-reporter: got TERM");
        }
        thread::sleep(Duration::from_millis(50));
    }
    let (out, took) = stopper.join().expect("the docker stop thread");
    assert!(out.status.success(), "docker stop: {}", out.text());
    let log = c.logs();
    assert!(drain_file_before_term, "no /run/draining seen before the worker got SIGTERM; log:\n{log}");
    assert_eq!(c.exit_code(), 0, "docker stop -t 5 took {took:?}; log:\n{log}");
    assert_log_has(&log, "event=stop_requested signal=SIGTERM grace=4s delay=1s", "stop delay");
    assert_log_has(&log, "event=stop_forwarded signal=SIGTERM", "stop delay");
    assert_log_has(&log, "term-reporter: got TERM", "stop delay");
    assert_log_has(&log, "event=exit code=0", "stop delay");
    assert!(!log.contains("event=deadline_reached"), "the worker drained in time, yet:\n{log}");
    let waited = parse_duration(&event_value(&log, "stop_forwarded", "waited").expect("waited= in stop_forwarded"));
    assert!(waited >= Duration::from_millis(900), "the stop went out after {waited:?}, not ~1s:\n{log}");
    // Docker runs health checks while a container stops: a probe saw the
    // drain file. Docker probes only a running container and leaves the
    // status as the last probe set it, so `unhealthy` after the exit says the
    // same as `unhealthy` seen while it drained (which the loop above may miss
    // on a slow machine).
    let status = c.inspect("{{.State.Health.Status}} {{.State.Health.FailingStreak}}");
    eprintln!("health after the stop: {status}; unhealthy seen while draining: {unhealthy_while_running}");
    assert!(
        unhealthy_while_running || status.starts_with("unhealthy"),
        "the health check never failed during the stop ({status}); log:\n{log}"
    );
}

// ---------------------------------------------------------------------------
// Termination message (issue 16): the kubelet bind-mounts an empty file at
// /dev/termination-log; drainit writes its one-line summary there.

/// An empty file to bind-mount at /dev/termination-log, and the mount option.
fn termination_log(scratch: &Scratch) -> (std::path::PathBuf, String) {
    let file = scratch.path("termination-log");
    scratch.write("termination-log", "", 0o666);
    let mount = format!("type=bind,source={},target=/dev/termination-log", file.display());
    (file, mount)
}

#[test]
fn termination_log_gets_the_summary_after_docker_stop() {
    let image = rig();
    let scratch = Scratch::new("termination-log");
    let (file, mount) = termination_log(&scratch);
    let env = [("DRAINIT_GRACE", "1s"), ("DRAINIT_ORCHESTRATOR_TIMEOUT", "5s")];
    let c = start(&image, &["--mount", &mount], &env, &["sh", "/workers/ignore-term.sh"]);
    check_deadline_stop(&c, 5, 1);
    let message = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(message.lines().count(), 1, "one line expected in the termination log: {message:?}");
    assert!(message.starts_with("drainit: code=137 "), "termination log: {message:?}");
    let words: Vec<&str> = message.split_whitespace().collect();
    for want in ["deadline_reached=1", "stop=SIGTERM", "attempts=1"] {
        assert!(words.contains(&want), "no {want} in the termination log: {message:?}");
    }
}

#[test]
fn termination_log_keeps_the_workers_own_message() {
    let image = rig();
    let scratch = Scratch::new("termination-log");
    let (file, mount) = termination_log(&scratch);
    let (_c, out) = Container::run(
        docker(),
        &["--mount", &mount],
        &[],
        &image.tag,
        &["sh", "-c", "echo 'worker: lease lost' > /dev/termination-log; exit 4"],
    );
    assert_eq!(out.code(), Some(4), "{}", out.text());
    let message = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(message, "worker: lease lost\n", "drainit wrote over the worker's own message");
}

// ---------------------------------------------------------------------------
// The retry-after file in a FROM scratch image (issue 18): no /tmp there, but
// Docker always mounts /dev/shm.

/// Asks for 300ms on its first attempt, then succeeds; says where the file is.
const RETRY_AFTER_WORKER: &str = r#"echo "retry-file=${DRAINIT_RETRY_AFTER_FILE-unset}"
if [ "$DRAINIT_ATTEMPT" = 1 ]; then
    [ -n "${DRAINIT_RETRY_AFTER_FILE-}" ] && echo 300ms > "$DRAINIT_RETRY_AFTER_FILE"
    exit 75
fi
exit 0"#;

#[test]
fn retry_after_file_lives_in_dev_shm_without_tmp() {
    let image = drainit_image(false, "");
    let (_c, out) = Container::run(
        docker(),
        &[],
        &[("DRAINIT_BACKOFF_DELAY", "5s")],
        &image.tag,
        &["sh", "-c", RETRY_AFTER_WORKER],
    );
    let log = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code(), Some(0), "{log}");
    assert_log_has(&log, "retry-file=/dev/shm/drainit-", "no /tmp");
    // The worker's 300ms, not a draw from [2.5s, 5s].
    assert_log_has(&log, "event=backoff attempt=1 code=75 delay=300ms", "no /tmp");
    assert_log_has(&log, "event=child_started pid=", "no /tmp");
    assert!(!log.contains("retry_after_unavailable"), "/dev/shm was writable, yet:\n{log}");
}

#[test]
fn retry_after_without_tmp_or_dev_shm_is_one_warning() {
    let image = drainit_image(false, "");
    let (_c, out) = Container::run(
        docker(),
        &["--mount", "type=tmpfs,destination=/dev/shm,readonly"],
        &[("DRAINIT_BACKOFF_DELAY", "1s")],
        &image.tag,
        &["sh", "-c", RETRY_AFTER_WORKER],
    );
    let log = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code(), Some(0), "{log}");
    assert_log_has(&log, "retry-file=unset", "no /tmp, read-only /dev/shm");
    let warnings = log.lines().filter(|l| l.contains("event=retry_after_unavailable")).count();
    assert_eq!(warnings, 1, "one retry_after_unavailable warning expected:\n{log}");
    // The normal delay: a draw from [base/2, base].
    let delay = parse_duration(&event_value(&log, "backoff", "delay").unwrap_or_else(|| panic!("no backoff:\n{log}")));
    assert!(
        (Duration::from_millis(500)..=Duration::from_secs(1)).contains(&delay),
        "delay {delay:?} is not in [500ms, 1s]:\n{log}"
    );
}

// ---------------------------------------------------------------------------
// Memory (issue 32): Docker `--memory` on this machine's cgroup v1, drainit
// PID 1 of the container, its own memory cgroup at the mount's root (no
// cgroup namespace: /proc/self/cgroup names a path the mount does not have).

/// A limit the kernel enforces without swap to climb into.
const MEMORY_64M: [&str; 4] = ["--memory", "64m", "--memory-swap", "64m"];

/// The worker OOM-killed under `--memory`: told, and exiting
/// DRAINIT_OOM_EXIT_CODE; a worker's child OOM-killed: told, the worker's
/// own code kept.
#[test]
fn an_oom_kill_under_docker_memory_is_told() {
    let image = rig();
    let dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"];
    let (_c, out) = Container::run(docker(), &MEMORY_64M, &[("DRAINIT_OOM_EXIT_CODE", "3")], &image.tag, &dd);
    assert_eq!(out.code(), Some(3), "the worker OOM-killed:\n{}", out.text());
    assert_log_has(&out.stderr, "event=oom_kill count=1 total=1", "the kill told");
    assert_log_has(&out.stderr, "signal=SIGKILL code=137 oom=1", "the worker's end");
    assert_log_has(&out.stderr, "event=exit code=3 oom_kills=1", "the exit");
    let script = "dd if=/dev/zero of=/dev/null bs=300M count=1; exit 3";
    let (_c, out) = Container::run(docker(), &MEMORY_64M, &[], &image.tag, &["sh", "-c", script]);
    assert_eq!(out.code(), Some(3), "a child OOM-killed:\n{}", out.text());
    assert_log_has(&out.stderr, "event=oom_kill count=1 total=1", "the child's kill told");
    assert_log_has(&out.stderr, "event=exit code=3 oom_kills=1", "the exit");
}

/// A climb of 2 MiB every 20 ms (files in /dev/shm, which the cgroup is
/// charged for and no reclaim frees) under `--memory 64m` is stopped at 50%:
/// the worker's TERM trap cleans up, drainit exits 143, and nothing was
/// OOM-killed.
#[test]
fn a_climb_under_docker_memory_is_turned_into_a_stop() {
    let image = rig();
    let script = "trap 'rm -f /dev/shm/c*; echo cleaned >&2; exit 0' TERM; i=0; \
                  while [ $i -lt 100 ]; do dd if=/dev/zero of=/dev/shm/c$i bs=2M count=1 2>/dev/null; \
                  i=$((i+1)); usleep 20000; done; sleep 1000 & wait";
    let opts = [&MEMORY_64M[..], &["--shm-size", "256m"]].concat();
    let env = [("DRAINIT_MEMORY_STOP", "50"), ("DRAINIT_MEMORY_CHECK", "10ms")];
    let (c, out) = Container::run(docker(), &opts, &env, &image.tag, &["sh", "-c", script]);
    assert_eq!(out.code(), Some(143), "never 0 after a stop drainit began:\n{}", out.text());
    assert_log_has(&out.stderr, "event=memory_stop", "the stop");
    assert_log_has(&out.stderr, "limit=67108864 percent=50 signal=SIGTERM", "its keys");
    assert_log_has(&out.stderr, "cleaned", "the worker's cleanup ran");
    assert!(!out.stderr.contains("event=oom_kill"), "{}", out.text());
    assert_eq!(c.inspect("{{.State.OOMKilled}}").trim(), "false", "{}", out.text());
}

/// `--user` with numbers in a `FROM scratch` image that has no /etc/passwd
/// (gosu's job, without gosu): the worker runs as 1234:5678 with that group
/// alone and HOME=/, cannot signal drainit (PID 1, root), and the
/// retry-after file in drainit's private directory is still its to write.
/// A name there is refused at start: the image has no passwd to find it in.
#[test]
fn user_numbers_in_a_scratch_image_without_passwd() {
    let image = rig();
    let worker = r#"
        echo "ids: $(id -u) $(id -g) $(id -G)"
        echo "home: $HOME user: $USER"
        grep '^Groups:' /proc/self/status
        kill -TERM 1 2>/dev/null; echo "kill: $?"
        if [ "$DRAINIT_ATTEMPT" = 1 ]; then echo 200ms > "$DRAINIT_RETRY_AFTER_FILE" && exit 75; fi
        exit 0
    "#;
    let env = [("DRAINIT_USER", "1234:5678")];
    let (_c, out) = Container::run(docker(), &[], &env, &image.tag, &["sh", "-c", worker]);
    let log = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code(), Some(0), "{log}");
    assert_log_has(&log, "ids: 1234 5678 5678", "--user 1234:5678");
    assert_log_has(&log, "home: / user: 1234", "--user 1234:5678");
    assert!(log.lines().any(|l| l.split_whitespace().eq(["Groups:", "5678"])), "{log}");
    assert_log_has(&log, "kill: 1", "the worker signalling PID 1");
    assert_log_has(&log, "event=backoff attempt=1 code=75 delay=200ms", "the retry-after file as the user");
    assert!(!log.contains("stop_requested"), "{log}");

    let (_c, out) = Container::run(docker(), &[], &[("DRAINIT_USER", "app")], &image.tag, &["true"]);
    assert_eq!(out.code(), Some(2), "{}", out.text());
    assert_log_has(&out.stderr, "unknown user 'app': the image has no /etc/passwd", "a name without passwd");
}
