//! The book-keeping behind the supervisor's restarts, without I/O: for each
//! offcode with a restart policy, the restarts issued within its window and
//! the one due; [`RestartTracker::failed`] decides between a restart after a
//! doubling backoff and giving up at the limit. [`crate::supervisor`] acts
//! on the decisions; the app keeps one [`Restarter`] per offcode.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use sidecore_types::RestartPolicy;

use crate::executor::Command;

/// What the supervisor decides about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Restart it at `at`: restart number `attempt` in the window.
    Restart {
        at: Instant,
        attempt: u32,
        backoff: Duration,
    },
    /// `restarts` restarts are already within the window: leave it failed.
    GiveUp { restarts: u32 },
}

/// One offcode's restart book-keeping, without I/O: the restarts issued
/// within the window, and the one due, if any.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: RestartPolicy,
    /// When each restart within the window was issued, oldest first.
    issued: VecDeque<Instant>,
    due: Option<Instant>,
    gave_up: bool,
}

impl RestartTracker {
    pub fn new(policy: RestartPolicy) -> Self {
        RestartTracker {
            policy,
            issued: VecDeque::new(),
            due: None,
            gave_up: false,
        }
    }

    /// Restarts issued within the window ending `now`.
    pub fn in_window(&mut self, now: Instant) -> u32 {
        let window = Duration::from_millis(self.policy.window_ms);
        while let Some(&t) = self.issued.front() {
            if now.saturating_duration_since(t) >= window {
                self.issued.pop_front();
            } else {
                break;
            }
        }
        u32::try_from(self.issued.len()).unwrap_or(u32::MAX)
    }

    /// It failed at `now`.
    pub fn failed(&mut self, now: Instant) -> Decision {
        let n = self.in_window(now);
        if !self.policy.restarts() || n >= self.policy.limit {
            self.gave_up = true;
            self.due = None;
            return Decision::GiveUp { restarts: n };
        }
        let backoff = Duration::from_millis(self.policy.backoff_ms(n));
        let at = now + backoff;
        self.due = Some(at);
        Decision::Restart {
            at,
            attempt: n + 1,
            backoff,
        }
    }

    /// True if a restart is due at `now`; it is then counted as issued.
    pub fn take_due(&mut self, now: Instant) -> bool {
        match self.due {
            Some(at) if at <= now => {
                self.due = None;
                self.issued.push_back(now);
                assert!(
                    self.issued.len() <= self.policy.limit as usize,
                    "more restarts issued within the window than its limit"
                );
                true
            }
            _ => false,
        }
    }

    /// True once it was left failed.
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }
}

/// An offcode as the supervisor restarts it: its executor (none for one on
/// a peer node, whose daemon supervises it) and its tracker.
pub struct Restarter {
    pub tx: Option<Sender<Command>>,
    pub tracker: RestartTracker,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(limit: u32, window_ms: u64) -> RestartPolicy {
        RestartPolicy {
            limit,
            window_ms,
            backoff_ms: 10,
            backoff_max_ms: 25,
            ..RestartPolicy::ON_FAILURE
        }
    }

    #[test]
    fn restarts_back_off_then_give_up_at_the_limit() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = RestartTracker::new(policy(3, 10_000));
        let mut got = Vec::new();
        let mut now = t0;
        for _ in 0..3 {
            match t.failed(now) {
                Decision::Restart {
                    at,
                    attempt,
                    backoff,
                } => {
                    assert!(
                        !t.take_due(at - Duration::from_millis(1)),
                        "not before its time"
                    );
                    assert!(t.take_due(at));
                    assert!(!t.take_due(at), "issued once");
                    got.push((attempt, backoff.as_millis()));
                    now = at + Duration::from_millis(5);
                }
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(got, [(1, 10), (2, 20), (3, 25)], "doubling, capped");
        assert_eq!(t.failed(now), Decision::GiveUp { restarts: 3 });
        assert!(t.gave_up() && !t.take_due(ms(1_000_000)));
    }

    #[test]
    fn restarts_older_than_the_window_no_longer_count() {
        let t0 = Instant::now();
        let mut t = RestartTracker::new(policy(2, 1_000));
        for k in 0..2u64 {
            let now = t0 + Duration::from_millis(100 * k);
            assert!(matches!(t.failed(now), Decision::Restart { .. }));
            assert!(t.take_due(now + Duration::from_millis(30)));
        }
        let soon = t0 + Duration::from_millis(500);
        assert_eq!(t.in_window(soon), 2);
        // A second later both have left the window: restart 1 again, first delay.
        let later = t0 + Duration::from_millis(1_200);
        assert_eq!(
            t.failed(later),
            Decision::Restart {
                at: later + Duration::from_millis(10),
                attempt: 1,
                backoff: Duration::from_millis(10),
            }
        );
    }

    #[test]
    fn never_gives_up_at_once() {
        let mut t = RestartTracker::new(RestartPolicy::NEVER);
        assert_eq!(t.failed(Instant::now()), Decision::GiveUp { restarts: 0 });
    }
}
