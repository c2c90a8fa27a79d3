//! drainit(1), the manual page: rendered by clap_mangen from the same clap
//! definition that parses the command line, so it cannot drift from
//! `--help`. A test, not code of the binary: clap_mangen is a
//! dev-dependency, and drainit itself carries no page. `scripts/release`
//! writes the page for the .deb with
//!
//!     DRAINIT_MAN_PAGE=PATH cargo test --bin drainit man_page

use std::ffi::OsString;

use crate::config;

/// The page as roff. No date: the same source renders the same bytes.
fn render() -> Vec<u8> {
    let command = config::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .section("1")
        .source(format!("drainit {}", env!("CARGO_PKG_VERSION")))
        .manual("User Commands")
        .render(&mut page)
        .expect("rendering into a Vec cannot fail");
    page
}

#[test]
fn man_page() {
    let page = render();
    let text = String::from_utf8(page.clone()).expect("roff is UTF-8");
    assert!(text.contains(".TH drainit 1"), "no title line:\n{text}");
    // Every option, and the variable that sets it, is on the page.
    for arg in config::command().get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(text.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))), "--{long} missing:\n{text}");
        }
        if let Some(env) = arg.get_env().and_then(|e| e.to_str()) {
            assert!(text.contains(&env.replace('-', "\\-")), "{env} missing");
        }
    }
    assert_eq!(render(), page, "two renderings differ");
    if let Some(path) = std::env::var_os("DRAINIT_MAN_PAGE").filter(|p: &OsString| !p.is_empty()) {
        std::fs::write(&path, &page).unwrap_or_else(|e| panic!("{}: {e}", path.to_string_lossy()));
    }
}
