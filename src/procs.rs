//! The processes drainit is responsible for, read from /proc: its
//! descendants. Needed where a process group does not reach: a descendant that
//! called setsid, counted and killed at the deadline.

use std::fs;

/// Pids of every descendant of `root`, found by following parent links in
/// /proc. Racy by nature (processes come and go while it reads), which is why
/// the deadline kill repeats after each reaping round.
pub fn descendants(root: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let links: Vec<(i32, i32)> = dir
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent_pid = found[next];
        found.extend(links.iter().filter(|(_, ppid)| *ppid == parent_pid).map(|(pid, _)| *pid));
        next += 1;
    }
    found.remove(0);
    found
}

/// The parent pid from /proc/PID/stat ("pid (comm) state ppid ..."); comm
/// may hold spaces and parentheses, so read after the last ')'.
fn parent(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_child_and_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let found = descendants(std::process::id() as i32);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(grandchild), nix::sys::signal::SIGKILL);
        let _ = child.wait();
        assert!(found.contains(&(child.id() as i32)) && found.contains(&grandchild), "{found:?}");
    }
}
