//! Records the build's git commit (for the `docker-init --version` line),
//! and links libgcc's unwinder statically into the dynamic glibc build.
//!
//! std needs the unwinder only to print a panic's backtrace (release builds
//! abort on panic), yet links it as the shared libgcc_s: one more library for
//! the dynamic loader to find, map and relocate at every start (bench/run
//! measures it in drainit's start-up overhead). With libgcc_eh.a (the same
//! code, static, shipped with gcc) named first, libgcc_s is left unused and
//! `--as-needed` drops it. Static builds (musl, glibc with crt-static) link
//! the unwinder statically already; without gcc's archive (a clang-only
//! toolchain), the build stays as std makes it.
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    git_commit();
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE").split(',').any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" || crt_static {
        return;
    }
    // rustc links through `cc`; it prints the archive's full path when it has one.
    let found = Command::new("cc").arg("-print-file-name=libgcc_eh.a").output().ok().is_some_and(|out| {
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Path::new(&path).is_absolute() && Path::new(&path).is_file()
    });
    if found {
        println!("cargo::rustc-link-lib=static:-bundle=gcc_eh");
    }
}

/// DRAINIT_GIT_COMMIT: the commit's first 7 hex digits, when built from a
/// git checkout (a build from a tarball or a Docker context without .git
/// has none). Rebuilt when HEAD moves.
fn git_commit() {
    // A path that does not exist would make cargo rebuild every time.
    for path in [".git/HEAD", ".git/packed-refs"].into_iter().filter(|p| Path::new(p).exists()) {
        println!("cargo::rerun-if-changed={path}");
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(reference) = head.trim().strip_prefix("ref: ")
        && Path::new(".git").join(reference).exists()
    {
        println!("cargo::rerun-if-changed=.git/{reference}");
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|c| c.len() == 7 && c.bytes().all(|b| b.is_ascii_hexdigit()));
    println!("cargo::rustc-env=DRAINIT_GIT_COMMIT={}", commit.unwrap_or_default());
}
