//! What the suites of tini, dumb-init and catatonit check of themselves,
//! checked of drainit: exit codes over the whole range, with and without
//! `--remap-exit`; a worker that kills itself with a stop signal; rewrite
//! tables that must not chain, and the lowest and highest signals; no stray
//! signal at the terminal's hand-over; a piped stdin; drainit under another
//! subreaper; and no leak under valgrind.

mod kit;
use kit::*;

use std::io::Write;

/// Restarts off: every exit is final, as under tini.
const RESTARTS_OFF: [&str; 2] = ["--backoff-exit-code", "none"];

per_mode! {
    /// Every code 0-255 is drainit's own exit code.
    fn every_exit_code_passes_through(mode) {
        let mut wrong = Vec::new();
        for code in 0..=255 {
            let mut run = drainit(mode, with_sh(&RESTARTS_OFF, &format!("exit {code}"))).spawn();
            let ended = run.wait(secs(10));
            if ended.code != Some(code) || check_log_end(&run.log(), code).is_err() {
                wrong.push(format!("{code} -> {:?}: {}", ended.code, run.log()));
            }
        }
        assert!(wrong.is_empty(), "{mode:?}:\n{}", wrong.join("\n"));
    }
}

per_mode! {
    /// `--remap-exit FROM:TO` for every FROM (TO = 255 - FROM, so every TO
    /// too): drainit exits TO, and its exit event says it was FROM.
    fn remap_exit_over_the_whole_range(mode) {
        let mut wrong = Vec::new();
        for from in 0..=255 {
            let to = 255 - from;
            let pair = format!("{from}:{to}");
            let options = [RESTARTS_OFF[0], RESTARTS_OFF[1], "--remap-exit", &pair];
            let mut run = drainit(mode, with_sh(&options, &format!("exit {from}"))).spawn();
            let ended = run.wait(secs(10));
            let exit = run.event("exit");
            let remapped_from = exit.as_ref().and_then(|e| e.get("remapped_from").map(str::to_string));
            let want_from = (from != to).then(|| from.to_string());
            if ended.code != Some(to) || remapped_from != want_from {
                wrong.push(format!("{pair}: exit {:?}, remapped_from {remapped_from:?}: {}", ended.code, run.log()));
            }
        }
        assert!(wrong.is_empty(), "{mode:?}:\n{}", wrong.join("\n"));
    }
}

per_mode! {
    /// A worker that dies of its own stop signal ends drainit with 128 + N
    /// at once: the signal never came to drainit, so no stop was requested
    /// and no grace is waited.
    fn a_worker_killing_itself_with_a_stop_signal_is_no_stop(mode, sig: i32) {
        // A script's own SIGINT and SIGQUIT keep their default action only
        // in the foreground; trap - restores it whatever sh inherited.
        let script = format!("trap - INT QUIT TERM; kill -{sig} $$; sleep 5");
        let options = ["--grace", "5s", "--orchestrator-timeout", "6s"];
        let mut run = drainit(mode, with_sh(&options, &script)).spawn();
        let ended = run.wait(secs(10));
        let log = run.log();
        assert_eq!(ended.code, Some(128 + sig), "{mode:?}: {log}");
        assert_eq!(run.count_events("stop_requested"), 0, "{mode:?}: {log}");
        assert_eq!(run.count_events("deadline_reached"), 0, "{mode:?}: {log}");
        assert!(ended.after < secs(4), "{mode:?}: waited {:?}; log:\n{log}", ended.after);
    }
    case sigterm(libc::SIGTERM);
    case sigint(libc::SIGINT);
    case sigquit(libc::SIGQUIT);
}

cases! {
    /// Each signal sent arrives as the table says, once, and nothing else
    /// arrives: a swap must not chain (TERM -> INT -> TERM).
    fn rewrites_do_not_chain(rewrites: &[&str], sends: &[(i32, i32)]) {
        let dir = Scratch::new("rewrite-swap");
        let rec = Recorder::new(&dir, "w").term(Term::Record).exit_on(libc::SIGUSR2);
        let mut options = vec!["--grace", "5s", "--orchestrator-timeout", "6s"];
        for r in rewrites {
            options.extend(["--rewrite", r]);
        }
        let mut run = drainit(Mode::Subreaper, rec.worker_with(&options)).spawn();
        assert!(rec.wait_ready(secs(10)), "{}", run.log());
        for (n, &(send, want)) in sends.iter().enumerate() {
            run.signal(send);
            assert!(rec.wait_seen(want, secs(5)), "{send} should arrive as {want}: {:?}; log:\n{}", rec.seen(), run.log());
            let wanted: Vec<i32> = sends[..=n].iter().map(|s| s.1).collect();
            assert!(
                rec.counts().iter().all(|(sig, count)| wanted.contains(sig) && *count == 1),
                "after {send}: {:?}; log:\n{}",
                rec.counts(),
                run.log()
            );
        }
        run.signal(libc::SIGUSR2);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
    }
    case term_int_swap(&["TERM:INT", "INT:TERM"], &[(libc::SIGTERM, libc::SIGINT), (libc::SIGINT, libc::SIGTERM)]);
    case int_term_swap_reversed(&["INT:TERM", "TERM:INT"], &[(libc::SIGINT, libc::SIGTERM), (libc::SIGTERM, libc::SIGINT)]);
    case extremes_1_and_31(&["1:31", "31:1"], &[(1, 31), (31, 1)]);
    case extremes_by_name(&["SIGHUP:SIGSYS", "SYS:HUP"], &[(libc::SIGSYS, libc::SIGHUP), (libc::SIGHUP, libc::SIGSYS)]);
}

per_mode! {
    /// On a terminal drainit hands the terminal to the worker; giving it up
    /// makes the kernel send SIGHUP and SIGCONT to drainit's group, which
    /// must not reach the worker (dumb-init's TIOCNOTTY quirk).
    fn no_stray_signal_at_the_terminal_hand_over(mode) {
        let dir = Scratch::new("tty-stray");
        let rec = Recorder::new(&dir, "w").exit_on(libc::SIGUSR2);
        let (master, slave) = pty::open(24, 80);
        let io = || slave.try_clone().unwrap();
        let mut argv = vec![BIN.to_string(), "--".to_string()];
        argv.extend(rec.argv());
        let mut run = launch(mode, argv).stdin(io()).stdout(io()).stderr(io()).controlling_tty().spawn();
        assert!(rec.wait_ready(secs(10)), "{mode:?}: the recorder never got ready");
        // A marker: once it is in, whatever drainit had pending before it
        // (a SIGHUP of the hand-over, lower-numbered) would be in too.
        run.signal(libc::SIGUSR1);
        assert!(rec.wait_seen(libc::SIGUSR1, secs(5)), "{mode:?}: {:?}", rec.seen());
        assert_eq!(rec.seen(), [libc::SIGUSR1], "{mode:?}: a stray signal reached the worker");
        run.signal(libc::SIGUSR2);
        assert_eq!(run.wait(secs(10)).code, Some(0), "{mode:?}");
        drop(master);
    }
}

per_mode! {
    /// A pipe on drainit's stdin is the worker's stdin, to its end.
    fn a_piped_stdin_reaches_the_worker(mode) {
        let (read_end, write_end) = pipe();
        let mut run = drainit(mode, sh("cat; echo end")).stdin(read_end).spawn();
        let mut writer = std::fs::File::from(write_end);
        writer.write_all(b"first line\nsecond line\n").unwrap();
        drop(writer);
        let ended = run.wait(secs(10));
        assert_eq!(ended.code, Some(0), "{mode:?}: {}", run.log());
        assert_eq!(run.stdout(), "first line\nsecond line\nend\n", "{mode:?}: {}", run.log());
    }
}

/// Under a parent that is a subreaper itself (a nested init, a supervisor),
/// drainit still registers, and the worker's orphans come to drainit, the
/// nearest subreaper, which reaps them: none is left to the parent.
#[test]
fn under_another_subreaper_drainit_reaps_its_own_orphans() {
    let dir = Scratch::new("nested-subreaper");
    let mut worker = Recorder::new(&dir, "w");
    for i in 0..5 {
        worker = worker.child(Recorder::new(&dir, &format!("o{i}")).orphan().exit_after(50, 0));
    }
    let mut run = drainit(Mode::Subreaper, worker.worker_with(&["-v"])).before_exec(under_a_subreaper).spawn();
    // run.pid is the parent subreaper; drainit is its only child.
    let drainit_pid = wait_for(secs(10), || HOST.children(run.pid).first().copied()).expect("drainit under the parent");
    assert!(worker.wait_ready(secs(20)), "{}", run.log());
    assert!(
        wait_until(secs(10), || run.count_events("reaped") >= 5),
        "drainit reaped {} of 5 orphans; log:\n{}",
        run.count_events("reaped"),
        run.log()
    );
    assert!(HOST.zombie_children(run.pid).is_empty(), "zombies left to the parent");
    assert!(run.log().contains("mode=subreaper"), "{}", run.log());
    // SAFETY: kill with a pid of our own descendant and a valid signal.
    assert_eq!(unsafe { libc::kill(drainit_pid, libc::SIGTERM) }, 0);
    assert_eq!(run.wait(secs(10)).code, Some(0), "{}", run.log());
}

/// valgrind's memcheck over drainit: errors or leaked blocks make valgrind
/// exit 99. It checks the heap of the dynamic build only: in the static
/// (musl) one, which the CI's second pass runs, malloc is linked in and
/// memcheck cannot replace it, so only memory errors are caught there.
///
/// What it can see: memcheck watches malloc and free. drainit's own
/// allocations come first from its start-up arena in .bss (`sys::Startup`),
/// which memcheck takes for plain static memory: they are neither checked
/// for leaks nor reported, and no suppression or `--soname-synonyms` is
/// needed for them (the allocator replaces no malloc of a shared object).
/// What goes past the arena, and everything libc allocates, is malloc'd
/// and checked. Still-reachable blocks are no error: drainit exits without
/// freeing what it holds on purpose (the kernel releases it at once).
/// Without valgrind the tests fail, naming the package (never a silent pass).
fn valgrind(mode: Mode, worker: &[&str]) -> Builder {
    let valgrind = need_program("valgrind", "valgrind");
    let valgrind = path_str(&valgrind);
    let mut argv = vec![
        valgrind.as_str(),
        "--quiet",
        "--leak-check=full",
        "--show-leak-kinds=definite,indirect,possible",
        "--errors-for-leak-kinds=definite,indirect,possible",
        "--error-exitcode=99",
        BIN,
        "--",
    ];
    argv.extend_from_slice(worker);
    launch(mode, argv).watchdog(secs(120))
}

per_mode! {
    fn valgrind_finds_nothing_on_a_plain_run(mode) {
        let mut run = valgrind(mode, &["true"]).spawn();
        let ended = run.wait(secs(60));
        assert_eq!(ended.code, Some(0), "{mode:?}: valgrind's report:\n{}", run.log());
    }
}

per_mode! {
    /// The stop path: SIGTERM forwarded, the worker's death reaped, exit.
    fn valgrind_finds_nothing_on_a_stop(mode) {
        let mut run = valgrind(mode, &["sleep", "60"]).spawn();
        assert!(run.wait_event("child_started", secs(60)).is_some(), "{mode:?}: {}", run.log());
        run.signal(libc::SIGTERM);
        let ended = run.wait(secs(60));
        assert_eq!(ended.code, Some(143), "{mode:?}: valgrind's report:\n{}", run.log());
        assert_eq!(run.count_events("stop_requested"), 1, "{mode:?}: {}", run.log());
    }
}
