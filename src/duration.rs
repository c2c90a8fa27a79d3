//! DURATION values: parsed from flags, variables and the retry-after file,
//! and written into log lines and the termination message, in one place so
//! that what drainit prints it also reads back.

use std::time::Duration;

/// The longest DURATION accepted: far beyond any orchestrator's window, and
/// small enough that `now + duration` can never overflow a clock.
const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// humantime syntax, or a bare (decimal) number of seconds; at most a year.
pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let is_number = !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') && t.matches('.').count() <= 1;
    let parsed = if is_number {
        seconds(t).ok_or_else(|| "not a number of seconds".to_string())?
    } else {
        humantime::parse_duration(t)
            .map_err(|_| "not a duration (examples: 500ms, 8s, 1m30s; a bare number is seconds)".to_string())?
    };
    if parsed > MAX {
        return Err("longer than a year".to_string());
    }
    Ok(parsed)
}

/// A decimal number of seconds (`8`, `0.5`, `.25`, `5.`), exactly: digits
/// below a nanosecond are dropped. Integers rather than an f64: the float
/// parser and its tables would weigh more than the rest of this module.
fn seconds(t: &str) -> Option<Duration> {
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let secs = if whole.is_empty() { 0 } else { whole.parse::<u64>().ok()? };
    let nanos = frac.bytes().chain(std::iter::repeat(b'0')).take(9).fold(0, |n, d| n * 10 + u32::from(d - b'0'));
    Some(Duration::new(secs, nanos))
}

/// `1.5s`, `300ms`, `2m`: short, unquoted in logfmt, and read back by `parse`.
pub fn show(d: Duration) -> String {
    // u64, not the u128 of as_millis: its Display would be another KiB.
    let ms = d.as_secs().saturating_mul(1000).saturating_add(u64::from(d.subsec_millis()));
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{}s", ms / 1000, format!("{:03}", ms % 1000).trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_humantime_and_bare_seconds() {
        for (text, want) in [
            ("8", ms(8000)),
            ("0.5", ms(500)),
            (".25", ms(250)),
            ("5.", ms(5000)),
            ("1.0000000019", Duration::new(1, 1)),
            ("0.1", ms(100)),
            ("500ms", ms(500)),
            ("1m30s", ms(90_000)),
            ("0", ms(0)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for text in
            ["", ".", "abc", "-1s", "-1", "1.2.3", "5 parsecs", "1e3", "366d", "10000000000000000000", "99999999999y"]
        {
            assert!(parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn shows_short_forms_that_parse_back() {
        for (d, text) in
            [(ms(0), "0ms"), (ms(1010), "1.01s"), (ms(90_000), "90s"), (ms(29_000), "29s"), (ms(120_000), "2m")]
        {
            assert_eq!(show(d), text);
            assert_eq!(parse(text), Ok(d), "{text}");
        }
    }

    // Fuzzing (issue 26): `cargo test` runs PROPTEST_CASES of each (256 by
    // default), scripts/fuzz many more.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        const UNITS: [(&str, u64); 8] = [
            ("", 1_000_000_000),
            ("ns", 1),
            ("us", 1000),
            ("ms", 1_000_000),
            ("s", 1_000_000_000),
            ("m", 60_000_000_000),
            ("h", 3_600_000_000_000),
            ("d", 86_400_000_000_000),
        ];

        proptest! {
            #[test]
            fn fuzz_any_text_is_refused_or_within_a_year(text in any::<String>()) {
                if let Ok(d) = parse(&text) {
                    prop_assert!(d <= MAX, "{text:?}: {d:?}");
                }
            }

            #[test]
            fn fuzz_durationish_text(text in "[ 0-9.]{0,3}[0-9]{0,25}[.]?[0-9]{0,12}(ns|us|ms|s|m|h|d|w|y|sec|min)?[ 0-9a-z]{0,4}") {
                if let Ok(d) = parse(&text) {
                    prop_assert!(d <= MAX, "{text:?}: {d:?}");
                }
            }

            #[test]
            fn fuzz_number_and_unit(n in 0u64..=u64::MAX >> 20, unit in 0..UNITS.len(), pad in " {0,2}") {
                let (suffix, nanos) = UNITS[unit];
                let text = format!("{pad}{n}{suffix}{pad}");
                let want = u128::from(n) * u128::from(nanos);
                match parse(&text) {
                    Ok(d) => prop_assert_eq!(d.as_nanos(), want, "{:?}", text),
                    Err(_) => prop_assert!(want > MAX.as_nanos(), "{text:?} refused"),
                }
            }

            #[test]
            fn fuzz_bare_seconds_are_exact(secs in 0..=MAX.as_secs(), frac in "[0-9]{0,14}") {
                let text = format!("{secs}.{frac}");
                let nanos: u32 = format!("{frac:0<9}")[..9].parse().unwrap();
                prop_assert_eq!(parse(&text), Ok(Duration::new(secs, nanos)));
            }

            #[test]
            fn fuzz_show_reads_back(ms in 0..=MAX.as_millis() as u64, sub_ms in 0u32..1_000_000) {
                let d = Duration::from_millis(ms);
                prop_assert_eq!(parse(&show(d)), Ok(d), "{}", show(d));
                // Below a millisecond, show rounds down.
                let finer = d + Duration::from_nanos(u64::from(sub_ms));
                prop_assert_eq!(parse(&show(finer)), Ok(d));
            }
        }
    }
}
