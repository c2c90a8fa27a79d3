//! drainit's log: `drainit: event=NAME key=value ...` lines (logfmt; a value
//! with spaces, quotes or `=` is quoted, with `\"`, `\\` and `\n` escaped),
//! and the same lines of other programs under their own tag
//! (`lease-worker: event=...`, [`Event::parse_tagged`]).

use std::time::Duration;

/// One event line: its name and its key=value pairs in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    /// Every pair, `event` first.
    pub fields: Vec<(String, String)>,
    pub line: String,
}

impl Event {
    /// Parse a line of drainit's log; None unless it is an event line.
    pub fn parse(line: &str) -> Option<Event> {
        Event::parse_tagged("drainit", line)
    }

    /// Parse an event line that `tag` wrote (`TAG: event=NAME ...`).
    pub fn parse_tagged(tag: &str, line: &str) -> Option<Event> {
        let body = line.strip_prefix(tag)?.strip_prefix(": ")?;
        if !body.starts_with("event=") {
            return None;
        }
        let fields = logfmt(body)?;
        Some(Event { name: fields[0].1.clone(), fields, line: line.to_string() })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A numeric value; panics with the line when absent or not a number.
    pub fn num(&self, key: &str) -> i64 {
        self[key].parse().unwrap_or_else(|_| panic!("{key} is not a number in {}", self.line))
    }

    /// A duration value (`300ms`, `1.5s`, `2m`); panics when absent or bad.
    pub fn duration(&self, key: &str) -> Duration {
        parse_duration(&self[key]).unwrap_or_else(|| panic!("{key} is not a duration in {}", self.line))
    }
}

impl std::ops::Index<&str> for Event {
    type Output = str;

    /// The value of `key`; panics, naming the line, when there is none.
    fn index(&self, key: &str) -> &str {
        self.get(key).unwrap_or_else(|| panic!("no {key} in {}", self.line))
    }
}

/// `key=value key="quoted \"value\""` into pairs; None on a malformed line.
pub fn logfmt(text: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ').is_some() {}
        if chars.peek().is_none() {
            return Some(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && *c != ' ') {
            key.push(c);
        }
        chars.next_if_eq(&'=')?;
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ' ') {
                value.push(c);
            }
        }
        pairs.push((key, value));
    }
}

/// Every event line of a log, in order.
pub fn parse_events(log: &str) -> Vec<Event> {
    log.lines().filter_map(Event::parse).collect()
}

/// Every event line that `tag` wrote in a log, in order.
pub fn parse_events_tagged(tag: &str, log: &str) -> Vec<Event> {
    log.lines().filter_map(|l| Event::parse_tagged(tag, l)).collect()
}

/// The event names of a log, in order.
pub fn event_names(log: &str) -> Vec<String> {
    parse_events(log).into_iter().map(|e| e.name).collect()
}

/// drainit's duration format: `300ms`, `1.5s`, `2m`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if let Some(n) = text.strip_suffix("ms") {
        Some(Duration::from_millis(n.parse().ok()?))
    } else if let Some(n) = text.strip_suffix('s') {
        Duration::try_from_secs_f64(n.parse().ok()?).ok()
    } else if let Some(n) = text.strip_suffix('m') {
        Some(Duration::from_secs(60 * n.parse::<u64>().ok()?))
    } else {
        None
    }
}

/// What every run's log must show: no panic text, and the last line is
/// `event=exit code=N` with N drainit's real exit code.
pub fn check_log_end(log: &str, code: i32) -> Result<(), String> {
    if log.contains("panicked") || log.contains("RUST_BACKTRACE") {
        return Err(format!("panic text in the log:\n{log}"));
    }
    let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    match Event::parse(last) {
        Some(e) if e.name == "exit" && e.get("code") == Some(code.to_string().as_str()) => Ok(()),
        _ => Err(format!("last line {last:?} is not event=exit code={code}; log:\n{log}")),
    }
}

/// The log of a run that must fail: exactly one line with "error", naming
/// `needle`, and no panic.
pub fn one_clear_line(log: &str, needle: &str) -> Result<(), String> {
    if log.contains("panicked") {
        return Err(format!("panic:\n{log}"));
    }
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("error")).collect();
    if errors.len() != 1 || !errors[0].contains(needle) || !errors[0].starts_with("drainit: ") {
        return Err(format!("want one error line naming {needle:?}; log:\n{log}"));
    }
    Ok(())
}
