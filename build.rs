//! Links libgcc's unwinder statically into the dynamic glibc build.
//!
//! std needs the unwinder only to print a panic's backtrace (release builds
//! abort on panic), yet links it as the shared libgcc_s: one more library for
//! the dynamic loader to find, map and relocate at every start, about a tenth
//! of drainit's start-up overhead in bench/run. With libgcc_eh.a (the same
//! code, static, shipped with gcc) named first, libgcc_s is left unused and
//! `--as-needed` drops it. Static builds (musl, glibc with crt-static) link
//! the unwinder statically already; without gcc's archive (a clang-only
//! toolchain), the build stays as std makes it.
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
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
