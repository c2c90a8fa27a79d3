//! `--user USER[:GROUP]`: the worker and the finish program run as USER
//! (from the image's /etc/passwd and /etc/group, or numbers), with the
//! groups the contract gives, HOME/USER/LOGNAME from the entry; drainit
//! stays root, so the worker cannot signal it; the retry-after file and the
//! notify socket keep working; a failed switch is 126 naming the call and
//! the worker never runs; bad values and a drainit that is not root are
//! refused at start. The image's files are fixtures, bind-mounted over
//! /etc/passwd and /etc/group in a mount namespace of drainit's own.

mod kit;
use kit::*;

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
worker:x:4242:4343:A worker:/home/worker:/bin/sh
";

const GROUP: &str = "\
root:x:0:
worker:x:4343:
jobs:x:5001:worker
logs:x:5002:other,worker
other:x:5003:someone
";

/// The fixture files, written in `dir`, bind-mounted over the machine's in
/// a new mount namespace just before drainit starts (as PID 1 that
/// namespace is already private to it; as a subreaper it is made here).
fn with_image_files(builder: Builder, dir: &Scratch) -> Builder {
    let passwd = dir.path("passwd");
    let group = dir.path("group");
    std::fs::write(&passwd, PASSWD).unwrap();
    std::fs::write(&group, GROUP).unwrap();
    let c = |p: &Path| CString::new(path_str(p)).unwrap();
    let (passwd, group) = (c(&passwd), c(&group));
    builder.before_exec(move || {
        // SAFETY: plain syscalls with NUL-terminated strings made before fork.
        unsafe {
            let none = std::ptr::null();
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(c"none".as_ptr(), c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()) != 0
                || libc::mount(passwd.as_ptr(), c"/etc/passwd".as_ptr(), none, libc::MS_BIND, none.cast()) != 0
                || libc::mount(group.as_ptr(), c"/etc/group".as_ptr(), none, libc::MS_BIND, none.cast()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    })
}

/// Let any user write in `dir` (the worker's outputs).
fn open_to_all(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// (Uid, Gid, Groups) lines of /proc/PID/status, each as its numbers.
fn ids(pid: i32) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let field = |key: &str| -> Vec<u32> {
        HOST.status_field(pid, key)
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    };
    (field("Uid"), field("Gid"), field("Groups"))
}

/// The worker's environment, as /proc/PID/environ holds it.
fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

fn has_var(env: &[String], var: &str) -> bool {
    env.iter().any(|v| v == var)
}

per_mode! {
    /// As USER (a name, a number, with a group): the ids and groups the
    /// contract gives, read in the worker's /proc/PID/status; HOME, USER and
    /// LOGNAME from the entry; signals still reach it; the finish program
    /// runs as the same user.
    fn the_worker_runs_as_the_user(mode, spec: &str, uid: u32, gid: u32, groups: &[u32], home: &str, name: &str) {
        let dir = Scratch::new("user");
        open_to_all(&dir.0);
        let rec = Recorder::new(&dir, "w");
        open_to_all(rec.dir());
        let finish = dir.path("finish");
        std::fs::write(&finish, format!("#!/bin/sh\nid -u > {0}/finish-uid\nid -G > {0}/finish-groups\n", dir.str()))
            .unwrap();
        std::fs::set_permissions(&finish, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = ["--user", spec, "--finish", &path_str(&finish)];
        let mut run = with_image_files(drainit(mode, rec.worker_with(&options)), &dir).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        let pid = rec.host_pid(run.pid).expect("the worker's pid");
        let (uids, gids, got_groups) = ids(pid);
        assert_eq!(uids, [uid; 4], "real, effective, saved, fs uid");
        assert_eq!(gids, [gid; 4], "real, effective, saved, fs gid");
        assert_eq!(got_groups, groups, "supplementary groups");
        let env = environ(pid);
        for var in [format!("HOME={home}"), format!("USER={name}"), format!("LOGNAME={name}")] {
            assert!(has_var(&env, &var), "{var} not in {env:?}");
        }
        // drainit, root, still signals it.
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(5)), "{}", run.log());
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
        assert_eq!(dir.read("finish-uid").trim(), uid.to_string(), "the finish program's uid: {}", run.log());
        // `id -G`: the gid, then the supplementary groups.
        let mut finish_groups: Vec<u32> = dir.read("finish-groups").split_whitespace().map(|g| g.parse().unwrap()).collect();
        finish_groups.sort();
        finish_groups.dedup();
        let mut want = groups.to_vec();
        want.sort();
        assert_eq!(finish_groups, want, "the finish program's groups");
    }
    case name_with_its_groups("worker", 4242, 4343, &[4343, 5001, 5002], "/home/worker", "worker");
    case name_with_a_group("worker:jobs", 4242, 5001, &[5001], "/home/worker", "worker");
    case number_with_an_entry("4242", 4242, 4343, &[4343], "/home/worker", "worker");
    case number_without_an_entry("7777", 7777, 7777, &[7777], "/", "7777");
    case numbers("7777:5002", 7777, 5002, &[5002], "/", "7777");
    case number_with_a_group_name("7777:logs", 7777, 5002, &[5002], "/", "7777");
}

per_mode! {
    /// A worker running as another user cannot signal drainit: its kill of
    /// its parent (drainit, PID 1 or not) fails, and drainit runs on.
    fn the_worker_cannot_signal_drainit(mode) {
        let dir = Scratch::new("user-kill");
        open_to_all(&dir.0);
        let script = format!(
            "kill -TERM $PPID 2> {d}/err; echo $? > {d}/term; kill -KILL $PPID 2>> {d}/err; echo $? > {d}/kill; \
             touch {d}/done; sleep 1; exit 3",
            d = dir.str()
        );
        let mut run = with_image_files(drainit(mode, with_sh(&["--user", "4242"], &script)), &dir).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(3), "drainit ran on to the worker's own exit: {}", run.log());
        assert!(dir.exists("done"), "{}", run.log());
        assert_ne!(dir.read("term").trim(), "0", "kill -TERM of drainit succeeded");
        assert_ne!(dir.read("kill").trim(), "0", "kill -KILL of drainit succeeded");
        assert_eq!(run.count_events("stop_requested"), 0, "{}", run.log());
    }
}

per_mode! {
    /// As the user, the retry-after file and the notify socket in drainit's
    /// private directory still work: the requested sleep is taken, and the
    /// worker's pings keep the watchdog quiet.
    fn retry_after_and_the_watchdog_work_as_the_user(mode) {
        let dir = Scratch::new("user-notify");
        open_to_all(&dir.0);
        let script = format!(
            "test \"$(id -u)\" = 4242 || exit 9
             if [ \"$DRAINIT_ATTEMPT\" = 1 ]; then echo 1500ms > \"$DRAINIT_RETRY_AFTER_FILE\" || exit 8; exit 75; fi
             {bin} --notify READY=1 || exit 7
             i=0; while [ $i -lt 8 ]; do {bin} --notify WATCHDOG=1 || exit 6; sleep 0.2; i=$((i+1)); done
             exit 0",
            bin = path_str(Path::new(runner_argv().last().unwrap()))
        );
        let options = ["--user", "worker", "--watchdog", "1s", "--backoff-delay", "100ms", "--backoff-max-delay", "5s"];
        let mut run = with_image_files(drainit(mode, with_sh(&options, &script)), &dir).spawn();
        assert_eq!(run.wait(secs(20)).code, Some(0), "{}", run.log());
        let backoff = run.event("backoff").expect("backoff");
        assert_eq!(backoff.duration("delay"), ms(1500), "the retry-after file was read: {}", run.log());
        assert!(run.event("ready").is_some(), "READY=1 reached drainit: {}", run.log());
        assert_eq!(run.count_events("watchdog_expired"), 0, "{}", run.log());
    }
}

per_mode! {
    /// A switch the kernel refuses (drainit without CAP_SETGID, or
    /// CAP_SETUID) ends the child before exec: 126, an exec_failed line
    /// naming the call, and the worker never runs.
    fn a_failed_switch_is_126_naming_the_call(mode, dropped: &str, call: &str) {
        let dir = Scratch::new("user-fail");
        let marker = dir.path("ran");
        let mut argv = vec!["setpriv".into(), format!("--bounding-set=-{dropped}").into()];
        argv.extend(runner_argv());
        argv.extend(["--user", "4242", "--", "touch", &path_str(&marker)].map(Into::into));
        let mut run = with_image_files(launch(mode, argv), &dir).spawn();
        assert_eq!(run.wait(secs(10)).code, Some(126), "{}", run.log());
        assert!(!marker.exists(), "the worker ran");
        let failed = run.event("exec_failed").unwrap_or_else(|| panic!("no exec_failed: {}", run.log()));
        assert!(failed["error"].starts_with(&format!("{call}:")), "{}", failed.line);
        assert_eq!(failed.num("code"), 126);
    }
    case setgroups("setgid", "setgroups");
    case setuid("setuid", "setuid");
}

#[test]
fn bad_users_are_refused() {
    let dir = Scratch::new("user-refused");
    type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let rows: &[Row] = &[
        (&["--user", "nosuchuser"], &[], "--user 'nosuchuser': unknown user"),
        (&["--user", "worker:nosuchgroup"], &[], "unknown group 'nosuchgroup'"),
        (&["--user", "a:b:c"], &[], "is not USER[:GROUP]"),
        (&["--user", "worker:"], &[], "is not USER[:GROUP]"),
        (&["--user", "4294967295"], &[], "not a valid id"),
        (&[], &[("DRAINIT_USER", "nosuchuser")], "DRAINIT_USER 'nosuchuser'"),
    ];
    for (args, env, needle) in rows {
        let marker = dir.path("ran");
        let all = args.iter().map(|s| s.to_string()).chain(["--".into(), "touch".into(), path_str(&marker)]);
        let mut builder = with_image_files(drainit(Mode::Subreaper, all), &dir);
        for (k, v) in *env {
            builder = builder.env(k, v);
        }
        let mut run = builder.spawn();
        assert_eq!(run.wait(secs(10)).code, Some(2), "{args:?}: {}", run.log());
        assert!(!marker.exists(), "{args:?}: the worker ran");
        one_clear_line(&run.log(), needle).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
}

#[test]
fn a_drainit_that_is_not_root_is_refused() {
    let dir = Scratch::new("user-not-root");
    open_to_all(&dir.0);
    let marker = dir.path("ran");
    let mut argv: Vec<std::ffi::OsString> =
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups"].map(Into::into).to_vec();
    argv.extend(runner_argv());
    argv.extend(["--user", "4242", "--", "touch", &path_str(&marker)].map(Into::into));
    let mut run = launch(Mode::Subreaper, argv).spawn();
    assert_eq!(run.wait(secs(10)).code, Some(2), "{}", run.log());
    assert!(!marker.exists(), "the worker ran");
    one_clear_line(&run.log(), "not root").unwrap();
}
