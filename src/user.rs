//! `--user USER[:GROUP]`: who the worker and the finish program run as,
//! resolved at start against the image's own /etc/passwd and /etc/group
//! (parsed here: the static build has no NSS, and a `FROM scratch` image
//! may have neither file, so numbers need no entry). Pure but for reading
//! the two files; the child's switch is `sys::become_user`'s.

use std::ffi::OsString;
use std::path::Path;

use crate::events::Event;

pub const PASSWD: &str = "/etc/passwd";
pub const GROUP: &str = "/etc/group";

/// What the child becomes, and what its environment says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// The supplementary groups, set first (`setgroups`).
    pub groups: Vec<u32>,
    /// `HOME`: the passwd entry's, else `/`.
    pub home: OsString,
    /// `USER` and `LOGNAME`: the entry's name, else the number.
    pub name: String,
}

/// One line of /etc/passwd.
#[derive(Debug, PartialEq)]
struct Passwd<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

/// One line of /etc/group.
#[derive(Debug, PartialEq)]
struct Group<'a> {
    name: &'a str,
    gid: u32,
    members: &'a str,
}

/// The -1 that setuid/setgid read as "unchanged": never an id.
const NO_ID: u32 = u32::MAX;

/// A number as an id: digits only, below 2^32 - 1.
fn id(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u32>().ok().filter(|n| *n != NO_ID)
}

fn passwd_entries(text: &str) -> impl Iterator<Item = Passwd<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        // name:password:uid:gid:gecos:home:shell; anything else (a
        // comment, a NIS `+` line, a broken line) is not an entry.
        match f.as_slice() {
            [name, _, uid, gid, _, home, ..] if !name.is_empty() && !name.starts_with(['#', '+', '-']) => {
                Some(Passwd { name, uid: id(uid)?, gid: id(gid)?, home })
            }
            _ => None,
        }
    })
}

fn group_entries(text: &str) -> impl Iterator<Item = Group<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        match f.as_slice() {
            [name, _, gid, members, ..] if !name.is_empty() && !name.starts_with(['#', '+', '-']) => {
                Some(Group { name, gid: id(gid)?, members })
            }
            [name, _, gid] if !name.is_empty() && !name.starts_with(['#', '+', '-']) => {
                Some(Group { name, gid: id(gid)?, members: "" })
            }
            _ => None,
        }
    })
}

/// `USER[:GROUP]` against the two files' contents (None: the file is not
/// in the image). On error, why, for a refusal line.
pub fn resolve(spec: &str, passwd: Option<&str>, group: Option<&str>) -> Result<Credentials, String> {
    let malformed = || "is not USER[:GROUP] (a name or a number each, e.g. postgres, 999:999, app:staff)".to_string();
    let (user, wanted_group) = match spec.split_once(':') {
        Some((user, group)) => (user, Some(group)),
        None => (spec, None),
    };
    let valid = |part: &str| !part.is_empty() && !part.contains([':', '\0', '\n', ',']) && part.trim() == part;
    if !valid(user) || wanted_group.is_some_and(|g| !valid(g)) {
        return Err(malformed());
    }
    let passwd_text = passwd.unwrap_or("");
    let by_number = user.bytes().all(|b| b.is_ascii_digit());
    let entry = if by_number {
        let uid = id(user).ok_or_else(|| format!("user {user} is not a valid id (0 to 4294967294)"))?;
        passwd_entries(passwd_text).find(|p| p.uid == uid).map(|p| (uid, Some(p)))
    } else {
        passwd_entries(passwd_text).find(|p| p.name == user).map(|p| (p.uid, Some(p)))
    };
    let (uid, entry) = match entry {
        Some(found) => found,
        None if by_number => (id(user).unwrap_or(NO_ID), None),
        None if passwd.is_none() => {
            return Err(format!("unknown user '{user}': the image has no {PASSWD}; give a number instead"));
        }
        None => return Err(format!("unknown user '{user}': not in {PASSWD}")),
    };
    let group_text = group.unwrap_or("");
    let given_gid = match wanted_group {
        None => None,
        Some(g) if g.bytes().all(|b| b.is_ascii_digit()) => {
            Some(id(g).ok_or_else(|| format!("group {g} is not a valid id (0 to 4294967294)"))?)
        }
        Some(g) => match group_entries(group_text).find(|e| e.name == g) {
            Some(e) => Some(e.gid),
            None if group.is_none() => {
                return Err(format!("unknown group '{g}': the image has no {GROUP}; give a number instead"));
            }
            None => return Err(format!("unknown group '{g}': not in {GROUP}")),
        },
    };
    let gid = given_gid.or(entry.as_ref().map(|e| e.gid)).unwrap_or(uid);
    let groups = match (given_gid, &entry) {
        // A name without GROUP: its groups in /etc/group, as login's
        // initgroups gives them, its primary group first.
        (None, Some(e)) if !by_number => {
            let mut groups = vec![gid];
            let member = |g: &Group| g.members.split(',').any(|m| m.trim() == e.name);
            for g in group_entries(group_text).filter(member) {
                if !groups.contains(&g.gid) {
                    groups.push(g.gid);
                }
            }
            groups
        }
        // GROUP alone; for a number without GROUP, its gid alone.
        _ => vec![gid],
    };
    let home = entry.as_ref().map(|e| e.home).filter(|h| !h.is_empty()).unwrap_or("/");
    let name = entry.as_ref().map_or_else(|| user.to_string(), |e| e.name.to_string());
    Ok(Credentials { uid, gid, groups, home: home.into(), name })
}

/// `USER[:GROUP]` against the image's files; drainit must be root (it stays
/// root to signal and reap the worker, and only root can switch users).
pub fn load(spec: &str, euid: u32) -> Result<Credentials, String> {
    if euid != 0 {
        return Err(format!(
            "drainit runs as uid {euid}, not root: it cannot switch users. Run drainit as root (it stays root, \
            the worker does not), or drop --user and set the user in the image or the orchestrator"
        ));
    }
    let read = |path: &str| -> Result<Option<String>, String> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {path}: {e}")),
        }
    };
    resolve(spec, read(PASSWD)?.as_deref(), read(GROUP)?.as_deref())
}

/// Before the first spawn: `HOME`, `USER` and `LOGNAME` in drainit's own
/// environment (the worker and the finish program inherit it), and
/// drainit's private directory and the notify socket in it given to the
/// user, so that the retry-after file and `NOTIFY_SOCKET` keep working.
/// The drain file, the ready file and the termination log stay drainit's.
pub fn hand_over(user: &Credentials, private: Option<&Path>, socket: bool) {
    crate::environment::user(&user.home, user.name.as_ref());
    let Some(dir) = private else { return };
    let socket_path = dir.join(crate::private_dir::NOTIFY_NAME);
    let paths = [Some(dir), socket.then_some(socket_path.as_path())];
    for path in paths.into_iter().flatten() {
        if let Err(e) = give(path, user) {
            let error = format!("cannot be given to uid {}: {}", user.uid, e.desc());
            Event::FileSkipped { what: "private_dir", path: path.display().to_string(), error }.emit();
        }
    }
}

/// chown, without following a link.
fn give(path: &Path, to: &Credentials) -> nix::Result<()> {
    use nix::unistd::{Gid, Uid};
    let (uid, gid) = (Some(Uid::from_raw(to.uid)), Some(Gid::from_raw(to.gid)));
    nix::unistd::fchownat(nix::fcntl::AT_FDCWD, path, uid, gid, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD_FIXTURE: &str = "\
root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
postgres:x:999:999:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash
app:x:1000:1000::/home/app:/bin/sh
nohome:x:1001:1001:::/bin/sh
broken line
+nis::::::
twin:x:1000:50::/elsewhere:/bin/sh
";

    const GROUP_FIXTURE: &str = "\
root:x:0:
daemon:x:1:
staff:x:50:app,postgres
postgres:x:999:
ssl-cert:x:110:postgres
app:x:1000:
audio:x:29: app ,other
video:x:44:appx
users:x:100
";

    fn ok(spec: &str) -> Credentials {
        resolve(spec, Some(PASSWD_FIXTURE), Some(GROUP_FIXTURE)).unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    fn creds(uid: u32, gid: u32, groups: &[u32], home: &str, name: &str) -> Credentials {
        Credentials { uid, gid, groups: groups.to_vec(), home: home.into(), name: name.into() }
    }

    #[test]
    fn names_numbers_and_groups() {
        let rows: &[(&str, Credentials)] = &[
            // A name: its primary group, then every group listing it.
            ("postgres", creds(999, 999, &[999, 50, 110], "/var/lib/postgresql", "postgres")),
            ("app", creds(1000, 1000, &[1000, 50, 29], "/home/app", "app")),
            // A name with GROUP: that group alone.
            ("postgres:staff", creds(999, 50, &[50], "/var/lib/postgresql", "postgres")),
            ("postgres:4242", creds(999, 4242, &[4242], "/var/lib/postgresql", "postgres")),
            // A number: its entry's name, home and primary group, no
            // supplementary groups but the gid.
            ("999", creds(999, 999, &[999], "/var/lib/postgresql", "postgres")),
            ("1000", creds(1000, 1000, &[1000], "/home/app", "app")),
            ("999:50", creds(999, 50, &[50], "/var/lib/postgresql", "postgres")),
            ("999:staff", creds(999, 50, &[50], "/var/lib/postgresql", "postgres")),
            // A number without an entry: the uid's number as the gid, HOME=/.
            ("4321", creds(4321, 4321, &[4321], "/", "4321")),
            ("4321:77", creds(4321, 77, &[77], "/", "4321")),
            ("0", creds(0, 0, &[0], "/root", "root")),
            ("nohome", creds(1001, 1001, &[1001], "/", "nohome")),
        ];
        for (spec, want) in rows {
            assert_eq!(ok(spec), *want, "{spec}");
        }
    }

    #[test]
    fn without_the_files_numbers_still_work() {
        let c = resolve("1234:5678", None, None).unwrap();
        assert_eq!(c, creds(1234, 5678, &[5678], "/", "1234"));
        assert_eq!(resolve("65534", None, None).unwrap(), creds(65534, 65534, &[65534], "/", "65534"));
        let err = resolve("app", None, None).unwrap_err();
        assert!(err.contains("unknown user 'app'") && err.contains("no /etc/passwd"), "{err}");
        let err = resolve("1:staff", None, None).unwrap_err();
        assert!(err.contains("unknown group 'staff'") && err.contains("no /etc/group"), "{err}");
    }

    #[test]
    fn refused() {
        let rows: &[(&str, &str)] = &[
            ("", "is not USER[:GROUP]"),
            (":", "is not USER[:GROUP]"),
            ("app:", "is not USER[:GROUP]"),
            (":staff", "is not USER[:GROUP]"),
            ("app:staff:x", "is not USER[:GROUP]"),
            (" app", "is not USER[:GROUP]"),
            ("ap p", "unknown user 'ap p'"),
            ("nobody", "unknown user 'nobody': not in /etc/passwd"),
            ("Postgres", "unknown user 'Postgres'"),
            ("app:wheel", "unknown group 'wheel': not in /etc/group"),
            ("4294967295", "not a valid id"),
            ("99999999999", "not a valid id"),
            ("app:4294967295", "not a valid id"),
            ("-1", "unknown user '-1'"),
            ("users", "unknown user"),
        ];
        for (spec, want) in rows {
            let err = resolve(spec, Some(PASSWD_FIXTURE), Some(GROUP_FIXTURE)).expect_err(spec);
            assert!(err.contains(want), "{spec:?}: {err}");
        }
    }

    #[test]
    fn not_root_is_refused_before_any_file_is_read() {
        let err = load("0", 1000).unwrap_err();
        assert!(err.contains("not root"), "{err}");
    }

    #[test]
    fn a_group_line_without_members_is_still_a_group() {
        assert_eq!(ok("app:users").gid, 100);
    }
}
