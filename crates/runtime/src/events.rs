//! The event log of a runtime: what happened to each offcode and when
//! (landed, initialized, started, stopped and why, restarted). `sidecore up` prints it;
//! tests read it to check the order of the life cycle.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum EventKind {
    /// Placed on a PE (with the layout's reason).
    Placed {
        pe: String,
        reason: String,
    },
    /// No implementation for the chosen PE: runs on the host instead.
    Fallback {
        wanted: String,
        reason: String,
    },
    Initialized,
    Started,
    /// Finished by itself.
    Done,
    /// Missed its watchdog period.
    WatchdogExpired {
        period_ms: u64,
        elapsed_ms: u64,
    },
    /// A periodic job of it ended `late_us` after its deadline (it ran
    /// past its WCET); `misses` so far. Logged for the 1st, 2nd, 4th, 8th…
    /// miss; `sidecore_offcode_deadline_misses_total` counts every one.
    DeadlineMissed {
        late_us: u64,
        misses: u64,
    },
    /// Its obsolete time elapsed.
    Obsolete {
        lifetime_ms: u64,
    },
    /// Stopped (by request, by the watchdog, ...).
    Stopped {
        reason: String,
    },
    /// An error from the offcode.
    Failed {
        error: String,
    },
    /// Failed, and its restart policy restarts it after `backoff_ms`: this
    /// is restart `attempt` of the `limit` allowed within `window_ms`.
    Restarting {
        attempt: u32,
        limit: u32,
        window_ms: u64,
        backoff_ms: u64,
    },
    /// A fresh instance runs on its PE, its channels attached; `restarts`
    /// counts every restart of it so far.
    Restarted {
        restarts: u64,
    },
    /// Failed again with `restarts` restarts already within `window_ms`, its
    /// limit: it stays failed.
    RestartLimit {
        restarts: u32,
        window_ms: u64,
    },
    /// A note about the app as a whole.
    App {
        message: String,
    },
    /// Re-placed without PE `without`, which an Orion monitor declared dead:
    /// only the offcodes that ran there moved (`to_id == from_id`), or the
    /// whole app was started again as app `to_id`. `moves` lists
    /// "offcode → PE" for what moved.
    Replaced {
        without: String,
        from_id: u64,
        to_id: u64,
        moves: String,
    },
}

/// One entry.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Time since the runtime began.
    #[serde(serialize_with = "ser_ms")]
    pub at: Duration,
    pub app: String,
    pub offcode: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{:>9.3} ms] {}/{}: ",
            self.at.as_secs_f64() * 1e3,
            self.app,
            self.offcode
        )?;
        match &self.kind {
            EventKind::Placed { pe, reason } => write!(f, "placed on {pe} ({reason})"),
            EventKind::Fallback { wanted, reason } => {
                write!(f, "falls back to host instead of {wanted}: {reason}")
            }
            EventKind::Initialized => write!(f, "initialized"),
            EventKind::Started => write!(f, "started"),
            EventKind::Done => write!(f, "done"),
            EventKind::WatchdogExpired {
                period_ms,
                elapsed_ms,
            } => {
                write!(
                    f,
                    "watchdog expired: no progress for {elapsed_ms} ms (period {period_ms} ms); stopping it"
                )
            }
            EventKind::DeadlineMissed { late_us, misses } => write!(
                f,
                "missed a deadline by {late_us} us (miss {misses}): a turn ran past its declared WCET"
            ),
            EventKind::Obsolete { lifetime_ms } => {
                write!(f, "obsolete after {lifetime_ms} ms; reaping it")
            }
            EventKind::Stopped { reason } => write!(f, "stopped ({reason})"),
            EventKind::Failed { error } => write!(f, "failed: {error}"),
            EventKind::Restarting {
                attempt,
                limit,
                window_ms,
                backoff_ms,
            } => write!(
                f,
                "restarting in {backoff_ms} ms (restart {attempt} of {limit} allowed within {window_ms} ms)"
            ),
            EventKind::Restarted { restarts } => {
                write!(f, "restarted (restart {restarts})")
            }
            EventKind::RestartLimit {
                restarts,
                window_ms,
            } => write!(
                f,
                "failed again after {restarts} restarts within {window_ms} ms, its limit: left failed"
            ),
            EventKind::App { message } => write!(f, "{message}"),
            EventKind::Replaced {
                without,
                from_id,
                to_id,
                moves,
            } if from_id == to_id => write!(
                f,
                "re-placed only the offcodes on {without} (id {from_id} kept, the rest ran on): {moves}"
            ),
            EventKind::Replaced {
                without,
                from_id,
                to_id,
                moves,
            } => write!(
                f,
                "re-placed without {without} (id {from_id} → {to_id}): {moves}"
            ),
        }
    }
}

type Subscriber = Box<dyn Fn(&Event) + Send + Sync>;

/// A shared, append-only event log.
#[derive(Clone)]
pub struct EventLog {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
    subscribers: Arc<Mutex<Vec<Subscriber>>>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            start: Instant::now(),
            events: Arc::default(),
            subscribers: Arc::default(),
        }
    }
}

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an event and tells the subscribers.
    pub fn emit(&self, app: &str, offcode: &str, kind: EventKind) {
        let e = Event {
            at: self.start.elapsed(),
            app: app.to_string(),
            offcode: offcode.to_string(),
            kind,
        };
        for s in self
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            s(&e);
        }
        let mut v = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Keep memory bounded in a long-running daemon.
        if v.len() >= 100_000 {
            v.drain(..50_000);
        }
        v.push(e);
    }

    /// Calls `f` for every later event.
    pub fn subscribe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(f));
    }

    /// All events so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Events of one app.
    pub fn of_app(&self, app: &str) -> Vec<Event> {
        self.snapshot()
            .into_iter()
            .filter(|e| e.app == app)
            .collect()
    }
}
