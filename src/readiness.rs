//! Readiness and the watchdog of one attempt: whether the worker said it is
//! ready, whether the outer socket heard so, the watchdog's state, interval
//! and last ping. The supervisor decides what happens to the worker; this
//! room keeps its own state and says what a message or its timer calls for:
//! actions, and the stop it asks the supervisor for. Its deadlines stay
//! rows of the supervisor's `Timers`, lent to each call.

use std::time::{Duration, Instant};

use crate::events::Event;
use crate::record::StopReason;
use crate::signals::Signo;
use crate::supervisor::{Action, Note, Now, Settings, Tell};
use crate::timers::{Timer, Timers};

/// The watchdog of one attempt.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Watch {
    /// No watchdog configured, or disarmed (`STOPPING=1`, a stop, the
    /// worker's exit).
    Off,
    /// Configured; armed once the worker is ready (`--ready-timeout`).
    AtReady,
    /// Running: `Timer::Watchdog` holds its deadline.
    On,
}

#[derive(Clone, Debug)]
pub struct Readiness {
    /// `--watchdog`, when the worker can ping.
    watchdog: Option<Duration>,
    /// `--ready-timeout`, when the worker can say it is ready.
    ready_timeout: Option<Duration>,
    /// drainit has an outer notify socket to tell.
    outer: bool,
    /// When the current attempt started (`ready`'s `after`).
    started: Option<Instant>,
    ready: bool,
    /// The outer socket was told `READY=1` once.
    told_ready: bool,
    watch: Watch,
    /// The watchdog interval of this attempt (`WATCHDOG_USEC=` changes it).
    interval: Duration,
    /// The last ping, or the arming (`watchdog_expired`'s `since`).
    pinged: Option<Instant>,
}

impl Readiness {
    pub fn new(settings: &Settings) -> Readiness {
        Readiness {
            watchdog: settings.watchdog,
            ready_timeout: settings.ready_timeout,
            outer: settings.outer,
            started: None,
            ready: false,
            told_ready: false,
            watch: Watch::Off,
            interval: settings.watchdog.unwrap_or_default(),
            pinged: None,
        }
    }

    /// An attempt started at `now`: not ready yet, the configured interval
    /// again, the ready timeout armed, the watchdog armed now or once the
    /// worker is ready (with a ready timeout).
    pub fn spawned(&mut self, now: Instant, timers: &mut Timers) {
        self.started = Some(now);
        self.ready = false;
        self.interval = self.watchdog.unwrap_or_default();
        self.watch = Watch::Off;
        if let Some(timeout) = self.ready_timeout {
            timers.arm(Timer::Ready, now + timeout);
        }
        if self.watchdog.is_some() {
            self.watch = Watch::AtReady;
            if self.ready_timeout.is_none() {
                self.arm_watchdog(now, timers);
            }
        }
    }

    /// A message from the running worker `pid` (its status is the
    /// supervisor's, not this room's): what it calls for goes to `out`;
    /// the stop it asks for (`WATCHDOG=trigger`), if any, is returned.
    pub fn note(
        &mut self,
        note: Note,
        pid: i32,
        now: &mut Now,
        timers: &mut Timers,
        out: &mut Vec<Action>,
    ) -> Option<StopReason> {
        match note {
            Note::Ready if !self.ready => {
                let now = now.get();
                self.ready = true;
                let after = self.started.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                out.extend([Action::Log(Event::Ready { pid, after }), Action::CreateReadyFile]);
                timers.disarm(Timer::Ready);
                if self.watch == Watch::AtReady {
                    self.arm_watchdog(now, timers);
                }
                if self.outer && !self.told_ready {
                    self.told_ready = true;
                    out.push(Action::Tell(Tell::Ready));
                }
            }
            Note::Reloading => {
                if self.ready {
                    self.not_ready(out);
                    out.push(Action::Log(Event::NotReady { reason: "reloading" }));
                }
                self.tell(Tell::Reloading, out);
                // The outer socket's supervisor now waits for READY=1 again.
                self.told_ready = false;
            }
            Note::Stopping => {
                self.disarm(timers, out);
                out.push(Action::Log(Event::NotReady { reason: "stopping" }));
                self.tell(Tell::Stopping, out);
            }
            Note::Ping if self.watch == Watch::On => {
                self.arm_watchdog(now.get(), timers);
                self.tell(Tell::Watchdog, out);
            }
            Note::Trigger if self.watch != Watch::Off => return Some(StopReason::Watchdog),
            Note::Interval(interval) if self.watch != Watch::Off && !interval.is_zero() => {
                self.interval = interval;
                if self.watch == Watch::On {
                    self.arm_watchdog(now.get(), timers);
                }
            }
            Note::Extend(by) if !self.ready => {
                if let Some(at) = timers.get(Timer::Ready) {
                    timers.arm(Timer::Ready, at.max(now.get() + by));
                }
            }
            _ => {}
        }
        None
    }

    /// `Timer::Watchdog` came due at `at`, seen at `now`, the worker
    /// running: the stop it asks for, if it expired. A drainit that did not
    /// run for more than an interval past the deadline (stopped, paused,
    /// starved) read this turn's messages, which held no ping, but the
    /// worker had no chance to be seen: one fresh interval instead.
    pub fn watchdog_due(
        &mut self,
        at: Instant,
        now: Instant,
        timers: &mut Timers,
        out: &mut Vec<Action>,
    ) -> Option<StopReason> {
        if self.watch != Watch::On {
            return None;
        }
        let late = now.saturating_duration_since(at);
        if late > self.interval {
            out.push(Action::Log(Event::WatchdogLate { late }));
            // A fresh interval, not a ping: `since` still counts from the
            // last one.
            timers.arm(Timer::Watchdog, now + self.interval);
            return None;
        }
        Some(StopReason::Watchdog)
    }

    /// The attempt's readiness is over (a stop, `STOPPING=1`, the worker's
    /// exit): the ready file goes, the watchdog and the ready timeout are
    /// disarmed.
    pub fn disarm(&mut self, timers: &mut Timers, out: &mut Vec<Action>) {
        self.not_ready(out);
        self.watch = Watch::Off;
        timers.disarm(Timer::Watchdog);
        timers.disarm(Timer::Ready);
    }

    /// The event of a stop this room asked for: what the watchdog or the
    /// ready timeout saw, the signal that goes out, the worker's status.
    pub fn stop_event(&self, reason: StopReason, signal: Signo, status: Option<String>, now: Instant) -> Event {
        match reason {
            StopReason::ReadyTimeout => {
                Event::ReadyTimeout { timeout: self.ready_timeout.unwrap_or_default(), signal, status }
            }
            _ => Event::WatchdogExpired { interval: self.interval, since: self.since_ping(now), signal, status },
        }
    }

    fn arm_watchdog(&mut self, now: Instant, timers: &mut Timers) {
        self.watch = Watch::On;
        self.pinged = Some(now);
        timers.arm(Timer::Watchdog, now + self.interval);
    }

    /// Time since the last ping, or the arming.
    fn since_ping(&self, now: Instant) -> Duration {
        self.pinged.map_or(self.interval, |t| now.saturating_duration_since(t))
    }

    /// The ready file goes, if the worker had said it is ready.
    fn not_ready(&mut self, out: &mut Vec<Action>) {
        if std::mem::take(&mut self.ready) {
            out.push(Action::RemoveReadyFile);
        }
    }

    fn tell(&self, tell: Tell, out: &mut Vec<Action>) {
        if self.outer {
            out.push(Action::Tell(tell));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff;
    use crate::exit::Remap;
    use crate::signals::{Rewrite, SIGQUIT, SIGTERM};

    const W: i32 = 100;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The settings this room reads: the watchdog, the ready timeout, an
    /// outer socket (the rest is the supervisor's).
    fn settings(watchdog: Option<u64>, ready_timeout: Option<u64>, outer: bool) -> Settings {
        Settings {
            grace: ms(5000),
            orchestrator_timeout: ms(7000),
            rewrite: Rewrite::default(),
            backoff: backoff::Policy { codes: vec![], delay: ms(1000), max_delay: ms(4000), timeout: ms(10_000) },
            stop_delay: Duration::ZERO,
            finish_timeout: None,
            remap: Remap::default(),
            watchdog: watchdog.map(ms),
            ready_timeout: ready_timeout.map(ms),
            watchdog_signal: SIGQUIT,
            outer,
            oom_counter: false,
            oom_exit_code: None,
            memory_stop: None,
            memory_check: ms(1000),
            stop_sequence: None,
            watchdog_signal_given: false,
        }
    }
    fn watched() -> Settings {
        settings(Some(1000), None, false)
    }
    fn gated() -> Settings {
        settings(Some(1000), Some(3000), false)
    }
    fn told() -> Settings {
        settings(Some(1000), None, true)
    }

    /// What the supervisor calls.
    #[derive(Clone, Debug)]
    enum Call {
        Spawned,
        Msg(Note),
        /// The watchdog timer, if it is due.
        Due,
        Disarm,
    }
    use Call::*;

    /// The room, the timers it is lent, the instant its story starts at.
    struct Room {
        r: Readiness,
        timers: Timers,
        t: Instant,
    }

    impl Room {
        /// `call` at t + `at` ms: its actions and the stop it asks for, briefly.
        fn call(&mut self, at: u64, call: Call) -> Vec<String> {
            let now = self.t + ms(at);
            let mut out = Vec::new();
            let stop = match call {
                Spawned => {
                    self.r.spawned(now, &mut self.timers);
                    None
                }
                Msg(note) => self.r.note(note, W, &mut Now::at(now), &mut self.timers, &mut out),
                Due => match self.timers.get(Timer::Watchdog).filter(|due| *due <= now) {
                    Some(due) => {
                        self.timers.disarm(Timer::Watchdog);
                        self.r.watchdog_due(due, now, &mut self.timers, &mut out)
                    }
                    None => None,
                },
                Disarm => {
                    self.r.disarm(&mut self.timers, &mut out);
                    None
                }
            };
            let mut brief: Vec<String> = out.iter().map(brief).collect();
            brief.extend(stop.map(|reason| format!("stop {}", reason.name())));
            brief
        }

        /// The room's deadlines, in ms after the start: watchdog, ready.
        fn deadlines(&self) -> (Option<u64>, Option<u64>) {
            let at = |timer| self.timers.get(timer).map(|at: Instant| (at - self.t).as_millis() as u64);
            (at(Timer::Watchdog), at(Timer::Ready))
        }
    }

    fn brief(a: &Action) -> String {
        match a {
            Action::CreateReadyFile => "ready_file".into(),
            Action::RemoveReadyFile => "ready_file_gone".into(),
            Action::Tell(t) => format!("tell {t:?}"),
            Action::Log(e) => {
                format!("log {}", e.to_string().split(' ').next().unwrap_or("").trim_start_matches("event="))
            }
            other => format!("{other:?}"),
        }
    }

    /// (settings, calls before) x call -> actions (and the stop asked for),
    /// and the deadlines after it (watchdog, ready). Times in ms; the
    /// watchdog interval is 1s, the ready timeout (where set) 3s.
    #[test]
    fn calls() {
        type Row<'a> =
            (&'a str, fn() -> Settings, &'a [(u64, Call)], u64, Call, &'a [&'a str], (Option<u64>, Option<u64>));
        let rows: &[Row] = &[
            ("nothing configured", || settings(None, None, false), &[], 0, Spawned, &[], (None, None)),
            ("armed at the start", watched, &[], 0, Spawned, &[], (Some(1000), None)),
            ("gated: the ready timeout only", gated, &[], 0, Spawned, &[], (None, Some(3000))),
            ("not yet due", watched, &[(0, Spawned)], 999, Due, &[], (Some(1000), None)),
            ("due: the stop", watched, &[(0, Spawned)], 1000, Due, &["stop watchdog"], (None, None)),
            ("a ping moves it", watched, &[(0, Spawned)], 800, Msg(Note::Ping), &[], (Some(1800), None)),
            ("a ping before it is armed", gated, &[(0, Spawned)], 800, Msg(Note::Ping), &[], (None, Some(3000))),
            (
                "late: one fresh interval",
                watched,
                &[(0, Spawned)],
                2500,
                Due,
                &["log watchdog_late"],
                (Some(3500), None),
            ),
            ("trigger", watched, &[(0, Spawned)], 10, Msg(Note::Trigger), &["stop watchdog"], (Some(1000), None)),
            (
                "trigger without a watchdog",
                || settings(None, None, false),
                &[(0, Spawned)],
                10,
                Msg(Note::Trigger),
                &[],
                (None, None),
            ),
            ("ready", watched, &[(0, Spawned)], 10, Msg(Note::Ready), &["log ready", "ready_file"], (Some(1000), None)),
            (
                "ready once",
                watched,
                &[(0, Spawned), (10, Msg(Note::Ready))],
                20,
                Msg(Note::Ready),
                &[],
                (Some(1000), None),
            ),
            (
                "ready arms a gated watchdog",
                gated,
                &[(0, Spawned)],
                2000,
                Msg(Note::Ready),
                &["log ready", "ready_file"],
                (Some(3000), None),
            ),
            (
                "reloading when ready",
                watched,
                &[(0, Spawned), (10, Msg(Note::Ready))],
                20,
                Msg(Note::Reloading),
                &["ready_file_gone", "log not_ready"],
                (Some(1000), None),
            ),
            ("reloading when not", watched, &[(0, Spawned)], 20, Msg(Note::Reloading), &[], (Some(1000), None)),
            ("stopping disarms", gated, &[(0, Spawned)], 20, Msg(Note::Stopping), &["log not_ready"], (None, None)),
            (
                "WATCHDOG_USEC: now + N",
                watched,
                &[(0, Spawned)],
                500,
                Msg(Note::Interval(ms(2000))),
                &[],
                (Some(2500), None),
            ),
            ("... not 0", watched, &[(0, Spawned)], 500, Msg(Note::Interval(Duration::ZERO)), &[], (Some(1000), None)),
            (
                "extend the ready timeout",
                gated,
                &[(0, Spawned)],
                2500,
                Msg(Note::Extend(ms(2000))),
                &[],
                (None, Some(4500)),
            ),
            ("... never shorten it", gated, &[(0, Spawned)], 100, Msg(Note::Extend(ms(1000))), &[], (None, Some(3000))),
            (
                "... not once ready",
                gated,
                &[(0, Spawned), (10, Msg(Note::Ready))],
                2500,
                Msg(Note::Extend(ms(2000))),
                &[],
                (Some(1010), None),
            ),
            ("disarm", gated, &[(0, Spawned), (10, Msg(Note::Ready))], 20, Disarm, &["ready_file_gone"], (None, None)),
            ("no ping once disarmed", watched, &[(0, Spawned), (10, Disarm)], 20, Msg(Note::Ping), &[], (None, None)),
            (
                "a new attempt: the interval again",
                watched,
                &[(0, Spawned), (10, Msg(Note::Interval(ms(4000)))), (20, Disarm)],
                30,
                Spawned,
                &[],
                (Some(1030), None),
            ),
            (
                "the outer socket: ready",
                told,
                &[(0, Spawned)],
                10,
                Msg(Note::Ready),
                &["log ready", "ready_file", "tell Ready"],
                (Some(1000), None),
            ),
            (
                "... again after RELOADING=1",
                told,
                &[(0, Spawned), (10, Msg(Note::Ready)), (20, Msg(Note::Reloading))],
                30,
                Msg(Note::Ready),
                &["log ready", "ready_file", "tell Ready"],
                (Some(1000), None),
            ),
            (
                "... not twice in a row",
                told,
                &[(0, Spawned), (10, Msg(Note::Ready))],
                30,
                Msg(Note::Ready),
                &[],
                (Some(1000), None),
            ),
            ("... a ping", told, &[(0, Spawned)], 10, Msg(Note::Ping), &["tell Watchdog"], (Some(1010), None)),
            ("... reloading", told, &[(0, Spawned)], 10, Msg(Note::Reloading), &["tell Reloading"], (Some(1000), None)),
            (
                "... stopping",
                told,
                &[(0, Spawned)],
                10,
                Msg(Note::Stopping),
                &["log not_ready", "tell Stopping"],
                (None, None),
            ),
        ];
        for (name, settings, before, at, call, want, deadlines) in rows {
            let settings = settings();
            let mut room = Room { r: Readiness::new(&settings), timers: Timers::default(), t: Instant::now() };
            for (t, call) in *before {
                room.call(*t, call.clone());
            }
            assert_eq!(room.call(*at, call.clone()), *want, "{name}: actions");
            assert_eq!(room.deadlines(), *deadlines, "{name}: deadlines (watchdog, ready)");
        }
    }

    #[test]
    fn the_stop_event_says_what_expired() {
        let mut timers = Timers::default();
        let t = Instant::now();
        let mut r = Readiness::new(&gated());
        r.spawned(t, &mut timers);
        assert_eq!(
            r.stop_event(StopReason::ReadyTimeout, SIGTERM, None, t + ms(3000)),
            Event::ReadyTimeout { timeout: ms(3000), signal: SIGTERM, status: None }
        );
        let mut out = Vec::new();
        r.note(Note::Ready, W, &mut Now::at(t + ms(100)), &mut timers, &mut out);
        r.note(Note::Ping, W, &mut Now::at(t + ms(300)), &mut timers, &mut out);
        assert_eq!(
            r.stop_event(StopReason::Watchdog, SIGQUIT, Some("a".into()), t + ms(1300)),
            Event::WatchdogExpired { interval: ms(1000), since: ms(1000), signal: SIGQUIT, status: Some("a".into()) }
        );
    }
}
