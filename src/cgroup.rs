//! Where drainit's memory cgroup is, and what its files say: the places to
//! look (a container's own cgroup at the mount's root, with or without a
//! cgroup namespace; a host process's path from /proc/self/cgroup) and the
//! parsing of the files, pure; the opening is memory.rs's.

/// The two cgroup hierarchies, and the names of the files each has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// Where the hierarchy is mounted, as every runtime mounts it.
    pub fn mount(self) -> &'static str {
        match self {
            Version::V1 => "/sys/fs/cgroup/memory",
            Version::V2 => "/sys/fs/cgroup",
        }
    }

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

/// A memory cgroup: its hierarchy and its path under the mount (empty: the
/// mount's root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place<'a> {
    pub version: Version,
    pub path: &'a str,
}

/// A v2 mount whose root has `memory.events` is a container's own cgroup
/// (a host's root cgroup has no such file): a container's PID 1 tries it
/// before /proc/self/cgroup is read, and finds its counter with one `open`;
/// any other process tries it after.
pub const MOUNT_ROOT_V2: Place<'static> = Place { version: Version::V2, path: "" };

/// The places /proc/self/cgroup's `text` points to, in the order to try
/// them: the v1 memory controller when it has a line (hybrid hosts keep it
/// there), else v2's `0::` line; each as the path it names under the mount
/// (a host process, a container without a cgroup namespace whose runtime
/// mounted the whole tree), then, on v1, the mount's root (a container whose
/// own cgroup is mounted there: Docker on v1). No allocation: this runs at
/// every start.
pub fn places(text: &str) -> [Option<Place<'_>>; 2] {
    let mut v1 = None;
    let mut v2 = None;
    for line in lines(text) {
        // ID:CONTROLLERS:PATH, the path the rest (it may hold a colon).
        let Some((controllers, path)) = split_at_byte(line, b':').and_then(|(_, rest)| split_at_byte(rest, b':'))
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.as_bytes().split(|b| *b == b',').any(|c| c == b"memory") {
            v1 = Some(path);
        }
    }
    let (version, path) = match (v1, v2) {
        (Some(path), _) => (Version::V1, path),
        (None, Some(path)) => (Version::V2, path),
        (None, None) => return [None, None],
    };
    // "/.." and the like: a path outside our cgroup namespace's view.
    let path = path.trim_start_matches('/').trim_end_matches('/');
    let named = (!path.is_empty() && !path.split('/').any(|part| part == "..")).then_some(Place { version, path });
    // The v2 mount's root is tried apart (MOUNT_ROOT_V2).
    let root = (version == Version::V1).then_some(Place { version, path: "" });
    [named, root]
}

/// The lines of a cgroup or procfs file (`\n`-ended, never `\r`): a byte
/// scan, cheaper on lines this short than `str::lines`' memchr (some 900
/// instructions for the counter's file, which is read at every start).
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.bytes().position(|b| b == b'\n').unwrap_or(rest.len());
        let line = rest.get(..end)?;
        rest = rest.get(end + 1..).unwrap_or("");
        Some(line)
    })
}

/// `text` before and after the first `byte` (ASCII), by a byte scan: str's
/// char searchers cost some 6,000 instructions over a v1 host's
/// /proc/self/cgroup, read at every start.
fn split_at_byte(text: &str, byte: u8) -> Option<(&str, &str)> {
    let at = text.bytes().position(|b| b == byte)?;
    Some((text.get(..at)?, text.get(at + 1..)?))
}

/// The number on `key`'s line of a flat keyed file (`memory.events`,
/// `memory.oom_control`, `memory.stat`): `key N`.
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    // A prefix compare per line, not a search for the space in each.
    lines(text).find_map(|line| line.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
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

    fn v1(path: &str) -> Option<Place<'_>> {
        Some(Place { version: Version::V1, path })
    }

    fn v2(path: &str) -> Option<Place<'_>> {
        Some(Place { version: Version::V2, path })
    }

    #[test]
    fn the_places_to_look() {
        type Row = (&'static str, &'static str, [Option<Place<'static>>; 2]);
        let rows: Vec<Row> = vec![
            ("v2 namespace: the root, tried first already", "0::/\n", [None, None]),
            ("v2 host process", "0::/system.slice/x.service\n", [v2("system.slice/x.service"), None]),
            (
                "v1 host process (a hybrid host's v2 line ignored)",
                "9:name=systemd:/\n4:memory:/process_api/9e48\n0::/\n",
                [v1("process_api/9e48"), v1("")],
            ),
            ("v1 container without a namespace", "5:memory:/docker/abc\n", [v1("docker/abc"), v1("")]),
            ("v1 co-mounted controllers", "3:cpu,memory:/\n", [None, v1("")]),
            ("a path with a colon", "0::/a:b\n", [v2("a:b"), None]),
            ("memory only as a part of a name", "3:cpu,memoryx:/x\n", [None, None]),
            ("outside the namespace's view", "0::/../other\n", [None, None]),
            ("no memory controller", "3:cpu:/x\n", [None, None]),
            ("empty", "", [None, None]),
        ];
        for (name, text, want) in rows {
            assert_eq!(places(text), want, "{name}");
        }
        assert_eq!((MOUNT_ROOT_V2.version.mount(), MOUNT_ROOT_V2.path), ("/sys/fs/cgroup", ""));
    }

    #[test]
    fn the_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(2), "not oom_group_kill, not oom");
        let control = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(keyed(control, "oom_kill"), Some(7));
        assert_eq!(keyed("\n\nunder_oom 0\noom_kill 8", "oom_kill"), Some(8), "empty lines, no final newline");
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
