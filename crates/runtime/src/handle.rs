//! An offcode as the control plane sees it: its identity, counters, life-cycle
//! state and stop request, shared between the executor that runs it, the
//! supervisor that watches it, the origin's mirror of a remote part, and
//! `sidecore ps`. Everything in it is atomic or behind a short lock, so reading
//! it never stalls an executor. A failed offcode with a restart policy is
//! *parked* by its executor (ports kept, instance stopped) until the
//! supervisor restarts it or gives up on it.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sidecore_offcode::Metrics;
use sidecore_types::{OffcodeState, OffcodeStatus, RestartPolicy};

use crate::events::{EventKind, EventLog};

/// What the control plane sees of an offcode.
pub struct OffcodeHandle {
    pub app: String,
    pub name: String,
    pub pe: String,
    pub implementation: String,
    pub watchdog: Option<Duration>,
    pub obsolete: Option<Duration>,
    /// What the supervisor does when it fails.
    pub restart: RestartPolicy,
    pub metrics: Metrics,
    state: AtomicU8,
    /// Set by its executor when it parked the failed offcode for the
    /// supervisor; taken by the supervisor.
    parked: AtomicBool,
    /// Its PE was declared dead: its executor holds it (instance stopped,
    /// ports kept open) for a re-placement to rewire its neighbours.
    held: AtomicBool,
    /// Set when its watchdog expired (until a restart rearms it).
    watchdog_fired: AtomicBool,
    /// Times the supervisor restarted it.
    restarts: AtomicU64,
    /// Set to ask the executor to stop it at its next turn.
    stop_requested: AtomicBool,
    /// Set once its executor has let go of it (stopped, done or failed to land).
    exited: AtomicBool,
    stop_reason: std::sync::Mutex<Option<String>>,
    pub landed_at: Instant,
    pub handled: AtomicU64,
    pub turns: AtomicU64,
    /// Periodic jobs that ended after their deadline (see
    /// `Dispatcher::ran`).
    pub deadline_misses: AtomicU64,
    /// Outlet counters: (sent, dropped) summed over outputs.
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
}

impl OffcodeHandle {
    pub fn new(
        app: &str,
        name: &str,
        pe: &str,
        implementation: &str,
        watchdog: Option<Duration>,
        obsolete: Option<Duration>,
    ) -> Self {
        OffcodeHandle {
            app: app.into(),
            name: name.into(),
            pe: pe.into(),
            implementation: implementation.into(),
            watchdog,
            obsolete,
            restart: RestartPolicy::NEVER,
            metrics: Metrics::default(),
            state: AtomicU8::new(0),
            parked: AtomicBool::new(false),
            held: AtomicBool::new(false),
            watchdog_fired: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            stop_requested: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            stop_reason: std::sync::Mutex::new(None),
            landed_at: Instant::now(),
            handled: AtomicU64::new(0),
            turns: AtomicU64::new(0),
            deadline_misses: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The same handle with a restart policy.
    #[must_use]
    pub fn with_restart(mut self, restart: RestartPolicy) -> Self {
        self.restart = restart;
        self
    }

    pub fn state(&self) -> OffcodeState {
        OffcodeState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: OffcodeState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// The watchdog expired (a turn ran `elapsed` past period `wd`; `why` says
    /// how): a running offcode fails, once — the executor and the supervisor may
    /// both notice the same overrun, and only the one that moves it from
    /// `Running` reports it and asks it to stop.
    pub(crate) fn expire_watchdog(
        &self,
        events: &EventLog,
        app: &str,
        wd: Duration,
        elapsed: Duration,
        why: impl FnOnce() -> String,
    ) {
        if self
            .state
            .compare_exchange(
                OffcodeState::Running as u8,
                OffcodeState::Failed as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.watchdog_fired.store(true, Ordering::Release);
            events.emit(
                app,
                &self.name,
                EventKind::WatchdogExpired {
                    period_ms: millis(wd),
                    elapsed_ms: millis(elapsed),
                },
            );
            self.request_stop(why());
        }
    }

    /// True if its watchdog expired since it (last) started.
    pub fn watchdog_fired(&self) -> bool {
        self.watchdog_fired.load(Ordering::Acquire)
    }

    /// Whether a failure now should park it for the supervisor rather than
    /// let it go: it has a restart policy, and it failed on its own (an
    /// error or its watchdog), not while being stopped.
    pub(crate) fn parks_on_failure(&self) -> bool {
        self.restart.restarts() && (!self.stop_requested() || self.watchdog_fired())
    }

    /// Marks it parked: failed, its instance stopped, its ports kept, a
    /// restart pending (`Restarting` until the supervisor restarts it or
    /// gives up and leaves it `Failed`).
    pub(crate) fn park(&self) {
        self.set_state(OffcodeState::Restarting);
        self.parked.store(true, Ordering::Release);
    }

    /// Its PE was declared dead: when it stops, its executor keeps its ports
    /// open (a dead PE runs nothing, and closing them would end its
    /// neighbours before a re-placement can rewire them). No restart follows.
    pub(crate) fn hold_for_replacement(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Whether [`OffcodeHandle::hold_for_replacement`] was called.
    pub(crate) fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The supervisor takes the news that it was parked (once per parking).
    pub fn take_parked(&self) -> bool {
        self.parked.swap(false, Ordering::AcqRel)
    }

    /// A fresh instance takes its place: the stop request, its reason and the
    /// watchdog's verdict are forgotten, and the restart is counted.
    pub(crate) fn rearm(&self) {
        *self
            .stop_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.stop_requested.store(false, Ordering::Release);
        self.watchdog_fired.store(false, Ordering::Release);
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Times the supervisor restarted it.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Asks the executor to stop the offcode; the first reason wins.
    pub fn request_stop(&self, reason: impl Into<String>) {
        let mut r = self
            .stop_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.into());
        }
        self.stop_requested.store(true, Ordering::Release);
    }

    /// Records why it ended (an error, a stop), unless a reason is already
    /// recorded; `sidecore ps` shows it.
    pub(crate) fn note_reason(&self, reason: &str) {
        let mut r = self
            .stop_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.to_string());
        }
    }

    /// Marks it let go of by whatever ran it (its executor, or a peer node for
    /// a remote offcode).
    pub(crate) fn set_exited(&self) {
        self.exited.store(true, Ordering::Release);
    }

    /// True once its executor has let go of it: nothing of it runs any more.
    pub fn exited(&self) -> bool {
        self.exited.load(Ordering::Acquire)
    }

    /// Why it was asked to stop, if it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.stop_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// True once a stop was asked for.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested.load(Ordering::Acquire)
    }

    /// Its status as `sidecore ps` shows it, read now.
    pub fn status(&self) -> OffcodeStatus {
        OffcodeStatus {
            name: self.name.clone(),
            implementation: self.implementation.clone(),
            pe: self.pe.clone(),
            state: self.state(),
            uptime_ms: millis(self.landed_at.elapsed()),
            handled: self.handled.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            turns: self.turns.load(Ordering::Relaxed),
            deadline_misses: self.deadline_misses.load(Ordering::Relaxed),
            metrics: self.metrics.snapshot().into_iter().collect(),
            stop_reason: self.stop_reason(),
            restarts: self.restarts(),
        }
    }

    /// Takes a status report about it from the peer node that runs it.
    pub(crate) fn mirror(&self, o: &OffcodeStatus) {
        self.handled.store(o.handled, Ordering::Relaxed);
        self.sent.store(o.sent, Ordering::Relaxed);
        self.dropped.store(o.dropped, Ordering::Relaxed);
        self.turns.store(o.turns, Ordering::Relaxed);
        self.deadline_misses
            .store(o.deadline_misses, Ordering::Relaxed);
        // Restarted on the peer since the last report: what stopped the
        // earlier instance no longer applies.
        if self.restarts.swap(o.restarts, Ordering::Relaxed) < o.restarts {
            *self
                .stop_reason
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            self.stop_requested.store(false, Ordering::Release);
        }
        for (k, v) in &o.metrics {
            self.metrics.metric(k).set(*v);
        }
        self.set_state(o.state);
    }
}

/// Milliseconds, saturating (a status field).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
