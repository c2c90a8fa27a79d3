//! Reading /proc: the host's ([`HOST`]), or a PID namespace's as its own
//! processes see it (`Running::ns_proc`, through /proc/PID/root/proc), where
//! pids are the ones the worker and drainit's log print.

use std::borrow::Cow;
use std::path::Path;

/// A procfs mount.
#[derive(Clone, Debug)]
pub struct Procfs {
    pub root: Cow<'static, str>,
}

/// The test's own /proc.
pub const HOST: Procfs = Procfs { root: Cow::Borrowed("/proc") };

/// Whether `pid` is alive (exists and is not a zombie), in the host's view.
pub fn alive(pid: i32) -> bool {
    HOST.alive(pid)
}

/// Whether `pid` exists at all (alive or zombie), in the host's view.
pub fn exists(pid: i32) -> bool {
    HOST.exists(pid)
}

/// Whether `pid` is alive and still the process we mean: its command line
/// holds `marker` (a scratch path). On a busy machine a pid can name a
/// stranger soon after its process is gone.
pub fn alive_as(pid: i32, marker: &str) -> bool {
    HOST.alive_as(pid, marker)
}

/// The fields of /proc/PID/stat the tests look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub tty_nr: i64,
    pub tpgid: i32,
}

impl Stat {
    /// Parse one /proc/PID/stat line (the command may hold spaces and ')').
    pub fn parse(text: &str) -> Option<Stat> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let f: Vec<&str> = text[close + 1..].split_whitespace().collect();
        Some(Stat {
            pid: text[..open].trim().parse().ok()?,
            comm: text[open + 1..close].to_string(),
            state: f.first()?.chars().next()?,
            ppid: f.get(1)?.parse().ok()?,
            pgrp: f.get(2)?.parse().ok()?,
            session: f.get(3)?.parse().ok()?,
            tty_nr: f.get(4)?.parse().ok()?,
            tpgid: f.get(5)?.parse().ok()?,
        })
    }
}

impl Procfs {
    /// The /proc of the namespace whose processes see `pid`'s root.
    pub fn of_root(pid: i32) -> Procfs {
        Procfs { root: Cow::Owned(format!("/proc/{pid}/root/proc")) }
    }

    fn read(&self, pid: i32, file: &str) -> Option<String> {
        std::fs::read_to_string(format!("{}/{pid}/{file}", self.root)).ok()
    }

    pub fn stat(&self, pid: i32) -> Option<Stat> {
        Stat::parse(&self.read(pid, "stat")?)
    }

    pub fn exists(&self, pid: i32) -> bool {
        Path::new(&format!("{}/{pid}", self.root)).exists()
    }

    /// Exists and is not a zombie.
    pub fn alive(&self, pid: i32) -> bool {
        self.stat(pid).is_some_and(|s| s.state != 'Z')
    }

    pub fn alive_as(&self, pid: i32, marker: &str) -> bool {
        self.alive(pid) && self.cmdline(pid).iter().any(|a| a.contains(marker))
    }

    /// The arguments of `pid`'s command line (none for a kernel thread, a
    /// zombie or a pid that is gone).
    pub fn cmdline(&self, pid: i32) -> Vec<String> {
        let raw = std::fs::read(format!("{}/{pid}/cmdline", self.root)).unwrap_or_default();
        raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
    }

    /// Field 22 of /proc/PID/stat: when the process started, in clock ticks
    /// since boot. With the pid it names one process for good.
    pub fn start_time(&self, pid: i32) -> Option<u64> {
        let stat = self.read(pid, "stat")?;
        stat[stat.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()
    }

    /// Every process (zombies too, never the test itself) with an argument
    /// for which `pred` holds.
    pub fn with_arg(&self, pred: impl Fn(&str) -> bool) -> Vec<i32> {
        let me = std::process::id() as i32;
        self.pids().into_iter().filter(|&p| p != me && self.cmdline(p).iter().any(|a| pred(a))).collect()
    }

    pub fn comm(&self, pid: i32) -> String {
        self.read(pid, "comm").unwrap_or_default().trim().to_string()
    }

    /// A line of /proc/PID/status (`SigBlk`, `VmHWM`, ...), after the colon.
    pub fn status_field(&self, pid: i32, key: &str) -> Option<String> {
        let status = self.read(pid, "status")?;
        let line = status.lines().find(|l| l.split(':').next() == Some(key))?;
        Some(line[key.len() + 1..].trim().to_string())
    }

    /// A signal mask of /proc/PID/status (`SigBlk`, `SigIgn`, `SigCgt`, `SigPnd`).
    pub fn sig_mask(&self, pid: i32, key: &str) -> Option<u64> {
        u64::from_str_radix(&self.status_field(pid, key)?, 16).ok()
    }

    /// Whether `pid` blocks any signal (drainit does, once set up). While it
    /// waits in rt_sigtimedwait, the kernel shows the signals waited for as
    /// unblocked (they are taken by the wait, not delivered), so that wait
    /// counts as blocking too.
    pub fn blocks_signals(&self, pid: i32) -> bool {
        let in_sigtimedwait = || {
            let call = self.read(pid, "syscall").unwrap_or_default();
            call.split_whitespace().next() == Some(&libc::SYS_rt_sigtimedwait.to_string())
        };
        self.sig_mask(pid, "SigBlk").is_some_and(|m| m != 0) || in_sigtimedwait()
    }

    /// (VmRSS, VmHWM) in KiB; 0 when unknown.
    pub fn memory_kib(&self, pid: i32) -> (u64, u64) {
        let kib =
            |key| self.status_field(pid, key).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0);
        (kib("VmRSS"), kib("VmHWM"))
    }

    /// Anonymous resident memory (heap, stacks), in KiB: what a leak grows.
    /// VmRSS also counts the binary's pages as code first runs, which is no
    /// leak.
    pub fn anon_kib(&self, pid: i32) -> u64 {
        self.status_field(pid, "RssAnon").and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    }

    /// Voluntary plus involuntary context switches of the main thread.
    pub fn ctxt_switches(&self, pid: i32) -> u64 {
        ["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"]
            .iter()
            .filter_map(|k| self.status_field(pid, k)?.parse::<u64>().ok())
            .sum()
    }

    /// Live processes (never the test itself) whose command line holds
    /// `marker` (a scratch path): what a test started and may have left.
    pub fn alive_mentioning(&self, marker: &str) -> Vec<i32> {
        let me = std::process::id() as i32;
        self.pids().into_iter().filter(|&p| p != me && self.alive_as(p, marker)).collect()
    }

    /// Every pid in this /proc.
    pub fn pids(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir(&*self.root) else { return vec![] };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
    }

    /// Children of every thread of `pid`.
    pub fn children(&self, pid: i32) -> Vec<i32> {
        let Ok(tasks) = std::fs::read_dir(format!("{}/{pid}/task", self.root)) else { return vec![] };
        tasks
            .flatten()
            .flat_map(|t| {
                let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>()
            })
            .collect()
    }

    /// Every descendant of `pid`, breadth first.
    pub fn descendants(&self, pid: i32) -> Vec<i32> {
        let mut found = vec![pid];
        let mut next = 0;
        while next < found.len() {
            let kids = self.children(found[next]);
            found.extend(kids);
            next += 1;
        }
        found.remove(0);
        found
    }

    /// The first descendant of `pid` (breadth first) whose comm is `name`.
    pub fn descendant_named(&self, pid: i32, name: &str) -> Option<i32> {
        self.descendants(pid).into_iter().find(|&p| self.comm(p) == name)
    }

    /// Children of `pid` that are zombies.
    pub fn zombie_children(&self, pid: i32) -> Vec<i32> {
        self.pids().into_iter().filter(|&p| self.stat(p).is_some_and(|s| s.ppid == pid && s.state == 'Z')).collect()
    }

    /// Processes (zombies included) in process group `pgid`.
    pub fn group(&self, pgid: i32) -> Vec<i32> {
        self.pids().into_iter().filter(|&p| self.stat(p).is_some_and(|s| s.pgrp == pgid)).collect()
    }

    /// Live processes whose executable is `exe`.
    pub fn running(&self, exe: &Path) -> Vec<i32> {
        self.pids()
            .into_iter()
            .filter(|p| std::fs::read_link(format!("{}/{p}/exe", self.root)).is_ok_and(|e| e == exe) && self.alive(*p))
            .collect()
    }
}
