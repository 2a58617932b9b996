//! The violation policy (sans-IO): the thesis unloads an extension that "consistently
//! violates" the acceptable limit but never says what that means (§3.1, §3.3). sidecore's
//! rule: an offcode is marked for unloading when `k` of its last `window` invocations
//! violated, and is unloaded at its next idle moment — between invocations, never during
//! one. A trap (including a broken declared loop bound) is a violation *and* marks the
//! offcode at once, because its instance state may be half-updated.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// `k` violations within the last `window` invocations → unload when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViolationPolicy {
    pub k: u32,
    pub window: u32,
}

impl Default for ViolationPolicy {
    fn default() -> Self {
        // With an inflation factor of 64 and a 128-slot input queue the thesis tolerates
        // two back-to-back misbehaviours (§5.2.1); three in 64 is "consistent".
        ViolationPolicy { k: 3, window: 64 }
    }
}

impl ViolationPolicy {
    pub fn validate(&self) -> Result<(), BadPolicy> {
        if self.k == 0 {
            return Err(BadPolicy::ZeroK);
        }
        if self.window < self.k {
            return Err(BadPolicy::WindowBelowK {
                window: self.window,
                k: self.k,
            });
        }
        Ok(())
    }
}

/// Why a violation policy cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPolicy {
    #[error("violation policy: k must be at least 1")]
    ZeroK,
    #[error("violation policy: window ({window}) must be at least k ({k})")]
    WindowBelowK { window: u32, k: u32 },
}

/// Why an offcode is to be unloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadReason {
    Violations { count: u32, window: u32 },
    Trap(String),
}

impl std::fmt::Display for UnloadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnloadReason::Violations { count, window } => {
                write!(
                    f,
                    "{count} violations of the acceptable limit in the last {window} invocations"
                )
            }
            UnloadReason::Trap(t) => write!(f, "trapped: {t}"),
        }
    }
}

/// Sliding-window violation tracker.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: ViolationPolicy,
    recent: VecDeque<bool>,
    in_window: u32,
    pub total_invocations: u64,
    pub total_violations: u64,
    pub pending_unload: Option<UnloadReason>,
}

impl Tracker {
    pub fn new(policy: ViolationPolicy) -> Tracker {
        Tracker {
            policy,
            recent: VecDeque::with_capacity(policy.window as usize),
            in_window: 0,
            total_invocations: 0,
            total_violations: 0,
            pending_unload: None,
        }
    }

    /// Records one finished invocation. Returns true if the offcode is now marked for
    /// unloading (it will be unloaded by the caller, which is idle at this point).
    pub fn record(&mut self, violated: bool, trap: Option<String>) -> bool {
        self.total_invocations += 1;
        let violated = violated || trap.is_some();
        if violated {
            self.total_violations += 1;
        }
        if self.recent.len() == self.policy.window as usize && self.recent.pop_front() == Some(true)
        {
            self.in_window -= 1;
        }
        self.recent.push_back(violated);
        if violated {
            self.in_window += 1;
        }
        if self.pending_unload.is_none() {
            if let Some(t) = trap {
                self.pending_unload = Some(UnloadReason::Trap(t));
            } else if self.in_window >= self.policy.k {
                self.pending_unload = Some(UnloadReason::Violations {
                    count: self.in_window,
                    window: self.policy.window,
                });
            }
        }
        self.pending_unload.is_some()
    }

    pub fn violations_in_window(&self) -> u32 {
        self.in_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_in_window_unloads_and_old_ones_expire() {
        let mut t = Tracker::new(ViolationPolicy { k: 2, window: 4 });
        assert!(!t.record(true, None));
        for _ in 0..4 {
            assert!(!t.record(false, None));
        }
        // the first violation has left the window
        assert_eq!(t.violations_in_window(), 0);
        assert!(!t.record(true, None));
        assert!(t.record(true, None));
        assert!(matches!(
            t.pending_unload,
            Some(UnloadReason::Violations {
                count: 2,
                window: 4
            })
        ));
    }

    #[test]
    fn a_trap_unloads_at_once() {
        let mut t = Tracker::new(ViolationPolicy::default());
        assert!(t.record(false, Some("declared loop bound exceeded".into())));
        assert!(
            t.pending_unload
                .as_ref()
                .unwrap()
                .to_string()
                .contains("declared loop bound")
        );
    }

    #[test]
    fn bad_policies_are_explained() {
        assert!(
            ViolationPolicy { k: 0, window: 4 }
                .validate()
                .unwrap_err()
                .to_string()
                .contains("k must be at least 1")
        );
        assert!(
            ViolationPolicy { k: 5, window: 4 }
                .validate()
                .unwrap_err()
                .to_string()
                .contains("window (4) must be at least k (5)")
        );
    }
}
