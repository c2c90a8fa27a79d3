//! Where drainit's memory cgroup is, and what its files say: the places to
//! look (a container's own cgroup at the mount's root, with or without a
//! cgroup namespace; a host process's path from /proc/self/cgroup) and the
//! parsing of the files, pure; the opening is memory.rs's.

use std::path::{Path, PathBuf};

/// Where the cgroup filesystems are mounted, as every runtime mounts them.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The two cgroup hierarchies, and the names of the files each has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The file whose `oom_kill` line counts the OOM kills in the cgroup.
    pub fn counter(self) -> &'static str {
        match self {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        }
    }

    /// The memory in use, page cache included.
    pub fn usage(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    pub fn limit(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    /// memory.stat's line for the page cache the kernel reclaims first:
    /// the kubelet's working set is the usage without it.
    pub fn inactive_file(self) -> &'static str {
        match self {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        }
    }
}

/// A memory cgroup directory and its hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub version: Version,
    pub dir: PathBuf,
}

/// The first place to try, before /proc/self/cgroup is read: a v2 mount
/// whose root has `memory.events` is a container's own cgroup (a host's
/// root cgroup has no such file), so a container finds its counter with one
/// `open`.
pub fn mount_root_v2(root: &Path) -> Place {
    Place { version: Version::V2, dir: root.to_path_buf() }
}

/// The places /proc/self/cgroup's `text` points to, in the order to try
/// them: the v1 memory controller when it has a line (hybrid hosts keep it
/// there), else v2's `0::` line; each as the path it names under the mount
/// (a host process, a container without a cgroup namespace whose runtime
/// mounted the whole tree), then the mount's root (a container whose own
/// cgroup is mounted there: Docker on v1, a v2 cgroup namespace).
pub fn places(text: &str, root: &Path) -> Vec<Place> {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    let (version, path, base) = match (v1, v2) {
        (Some(path), _) => (Version::V1, path, root.join("memory")),
        (None, Some(path)) => (Version::V2, path, root.to_path_buf()),
        (None, None) => return Vec::new(),
    };
    let mut found = Vec::new();
    // "/.." and the like: a path outside our cgroup namespace's view.
    let relative = path.trim_start_matches('/');
    if !relative.is_empty() && !relative.split('/').any(|part| part == "..") {
        found.push(Place { version, dir: base.join(relative) });
    }
    // The v2 mount's root was tried first already.
    if version == Version::V1 {
        found.push(Place { version, dir: base });
    }
    found
}

/// The number on `key`'s line of a flat keyed file (`memory.events`,
/// `memory.oom_control`, `memory.stat`): `key N`.
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        if name == key { value.trim().parse().ok() } else { None }
    })
}

/// A single-number file (`memory.current`, `memory.usage_in_bytes`).
pub fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A limit file: Some(bytes), or None for no limit (`max`, or on v1 a
/// value of at least the machine's memory, which is how v1 says none).
pub fn limit(text: &str, machine: u64) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse().ok().filter(|n| *n > 0 && (machine == 0 || *n < machine))
}

/// `used` has reached `percent` of `limit`.
pub fn over(used: u64, limit: u64, percent: u8) -> bool {
    u128::from(used) * 100 >= u128::from(limit) * u128::from(percent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        PathBuf::from(ROOT)
    }

    fn v1(dir: &str) -> Place {
        Place { version: Version::V1, dir: PathBuf::from(dir) }
    }

    fn v2(dir: &str) -> Place {
        Place { version: Version::V2, dir: PathBuf::from(dir) }
    }

    #[test]
    fn the_places_to_look() {
        type Row = (&'static str, &'static str, Vec<Place>);
        let rows: Vec<Row> = vec![
            ("v2 namespace: the root, tried first already", "0::/\n", vec![]),
            ("v2 host process", "0::/system.slice/x.service\n", vec![v2("/sys/fs/cgroup/system.slice/x.service")]),
            (
                "v1 host process (a hybrid host's v2 line ignored)",
                "9:name=systemd:/\n4:memory:/process_api/9e48\n0::/\n",
                vec![v1("/sys/fs/cgroup/memory/process_api/9e48"), v1("/sys/fs/cgroup/memory")],
            ),
            (
                "v1 container without a namespace",
                "5:memory:/docker/abc\n",
                vec![v1("/sys/fs/cgroup/memory/docker/abc"), v1("/sys/fs/cgroup/memory")],
            ),
            ("v1 co-mounted controllers", "3:cpu,memory:/\n", vec![v1("/sys/fs/cgroup/memory")]),
            ("outside the namespace's view", "0::/../other\n", vec![]),
            ("no memory controller", "3:cpu:/x\n", vec![]),
            ("empty", "", vec![]),
        ];
        for (name, text, want) in rows {
            assert_eq!(places(text, &root()), want, "{name}");
        }
        assert_eq!(mount_root_v2(&root()), v2("/sys/fs/cgroup"));
    }

    #[test]
    fn the_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(2), "not oom_group_kill, not oom");
        let control = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(keyed(control, "oom_kill"), Some(7));
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"), None, "a kernel before 4.13");
        let stat = "cache 10\ninactive_file 4096\ntotal_inactive_file 8192\n";
        assert_eq!(keyed(stat, Version::V2.inactive_file()), Some(4096));
        assert_eq!(keyed(stat, Version::V1.inactive_file()), Some(8192));
        assert_eq!(number("123456\n"), Some(123_456));
        assert_eq!(number("x"), None);
        let gib = 1 << 30;
        assert_eq!(limit("max\n", 8 * gib), None);
        assert_eq!(limit("67108864\n", 8 * gib), Some(64 << 20));
        assert_eq!(limit("9223372036854771712\n", 8 * gib), None, "v1's no limit");
        assert_eq!(limit(&format!("{}", 8 * gib), 8 * gib), None, "the host's size");
        assert_eq!(limit("0", 8 * gib), None);
    }

    #[test]
    fn over_the_percent() {
        assert!(!over(79, 100, 80));
        assert!(over(80, 100, 80));
        assert!(over(u64::MAX, u64::MAX, 99), "no overflow");
    }
}
