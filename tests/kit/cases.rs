//! One `#[test]` per mode and per case, so that one failure hides no other.

/// ```ignore
/// per_mode! {
///     fn name(mode) { ... }
/// }
/// ```
/// defines `fn name(mode: Mode)` and the tests `name::pid1` and
/// `name::subreaper`. With more arguments, rows follow the body, one test
/// per row and mode (`name::exit_42::pid1`, ...):
/// ```ignore
/// per_mode! {
///     fn name(mode, code: i32) { ... }
///     case exit_0(0);
///     case exit_42(42);
/// }
/// ```
macro_rules! per_mode {
    ($(#[$attr:meta])* fn $name:ident($mode:ident) $body:block) => {
        $(#[$attr])*
        fn $name($mode: $crate::kit::Mode) $body

        mod $name {
            #[test]
            fn pid1() {
                super::$name($crate::kit::Mode::Pid1)
            }

            #[test]
            fn subreaper() {
                super::$name($crate::kit::Mode::Subreaper)
            }
        }
    };
    ($(#[$attr:meta])* fn $name:ident($mode:ident, $($arg:ident: $ty:ty),+ $(,)?) $body:block
     $(case $case:ident($($val:expr),+ $(,)?);)+) => {
        $(#[$attr])*
        fn $name($mode: $crate::kit::Mode, $($arg: $ty),+) $body

        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                mod $case {
                    #[allow(unused_imports)]
                    use super::*;

                    #[test]
                    fn pid1() {
                        super::super::$name($crate::kit::Mode::Pid1, $($val),+)
                    }

                    #[test]
                    fn subreaper() {
                        super::super::$name($crate::kit::Mode::Subreaper, $($val),+)
                    }
                }
            )+
        }
    };
}

/// ```ignore
/// cases! {
///     fn name(flag: &str, code: i32) { ... }
///     case grace_abc("--grace=abc", 2);
///     case grace_ok("--grace=2s", 0);
/// }
/// ```
/// defines `fn name(...)` and one test per row: `name::grace_abc`, ...
macro_rules! cases {
    ($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),+ $(,)?) $body:block
     $(case $case:ident($($val:expr),+ $(,)?);)+) => {
        $(#[$attr])*
        fn $name($($arg: $ty),+) $body

        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    super::$name($($val),+)
                }
            )+
        }
    };
}

pub(crate) use {cases, per_mode};
