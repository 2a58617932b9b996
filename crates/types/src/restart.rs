//! What the supervisor does when an offcode fails (issue 20): its restart
//! policy, as a manifest declares it (`restart = "on-failure"` with a limit in
//! a window and an exponential backoff, like systemd's `Restart=` with
//! `StartLimitBurst=`/`StartLimitIntervalSec=`, or Kubernetes'
//! `restartPolicy: OnFailure` with its crash-loop backoff). The default,
//! `never`, is HYDRA's: the watchdog disposes of a failed offcode.

use serde::{Deserialize, Serialize};

use std::fmt;
use std::str::FromStr;

use crate::keyword::UnknownKeyword;

/// Restarts allowed within the window unless the manifest says otherwise.
pub const DEFAULT_RESTART_LIMIT: u32 = 5;
/// The window restarts are counted in, ms.
pub const DEFAULT_RESTART_WINDOW_MS: u64 = 60_000;
/// Delay before the first restart in a window, ms; it doubles with each
/// restart already in the window.
pub const DEFAULT_RESTART_BACKOFF_MS: u64 = 100;
/// The longest delay before a restart, ms.
pub const DEFAULT_RESTART_BACKOFF_MAX_MS: u64 = 10_000;
/// Most restarts a window may allow.
pub const MAX_RESTART_LIMIT: u32 = 1_000;
/// Longest window or delay, ms (one day).
pub const MAX_RESTART_TIME_MS: u64 = 86_400_000;

keyword_enum!(
    /// Whether a failed offcode is restarted.
    RestartMode, "restart policy", {
        /// Left failed: HYDRA's watchdog disposes of it (the default).
        Never = "never",
        /// Re-initialised and restarted on its PE, its channels still attached,
        /// after a failure (an error from a turn, or its watchdog), up to the
        /// limit.
        OnFailure = "on-failure",
    }
);

/// An offcode's restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartPolicy {
    pub mode: RestartMode,
    /// Restarts allowed within `window_ms`; one more failure in the window
    /// leaves the offcode failed.
    pub limit: u32,
    pub window_ms: u64,
    /// Delay before a restart with none before it in the window, ms.
    pub backoff_ms: u64,
    /// The delay doubles with each restart in the window, up to this, ms.
    pub backoff_max_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy::NEVER
    }
}

impl RestartPolicy {
    /// HYDRA's behaviour: no restart.
    pub const NEVER: RestartPolicy = RestartPolicy {
        mode: RestartMode::Never,
        limit: DEFAULT_RESTART_LIMIT,
        window_ms: DEFAULT_RESTART_WINDOW_MS,
        backoff_ms: DEFAULT_RESTART_BACKOFF_MS,
        backoff_max_ms: DEFAULT_RESTART_BACKOFF_MAX_MS,
    };

    /// `on-failure` with the default limit, window and backoff.
    pub const ON_FAILURE: RestartPolicy = RestartPolicy {
        mode: RestartMode::OnFailure,
        ..RestartPolicy::NEVER
    };

    /// True if a failure leads to a restart (within the limit).
    pub fn restarts(&self) -> bool {
        self.mode == RestartMode::OnFailure
    }

    /// What is wrong with it, if anything (a policy that arrives over the
    /// network is checked with this; the manifest loader locates each fault).
    pub fn problem(&self) -> Option<String> {
        if self.limit == 0 || self.limit > MAX_RESTART_LIMIT {
            return Some(format!(
                "limit {} is not in 1..={MAX_RESTART_LIMIT}",
                self.limit
            ));
        }
        if self.window_ms == 0 || self.window_ms > MAX_RESTART_TIME_MS {
            return Some(format!(
                "window {} ms is not in 1..={MAX_RESTART_TIME_MS}",
                self.window_ms
            ));
        }
        if self.backoff_max_ms > MAX_RESTART_TIME_MS || self.backoff_ms > self.backoff_max_ms {
            return Some(format!(
                "backoff {} ms to {} ms: the first delay must not exceed the longest, nor the longest {MAX_RESTART_TIME_MS} ms",
                self.backoff_ms, self.backoff_max_ms
            ));
        }
        None
    }

    /// The delay before a restart when `restarts_in_window` restarts are
    /// already in the window: `backoff_ms × 2^n`, at most `backoff_max_ms`.
    pub fn backoff_ms(&self, restarts_in_window: u32) -> u64 {
        let factor = 1u64.checked_shl(restarts_in_window).unwrap_or(u64::MAX);
        self.backoff_ms
            .saturating_mul(factor)
            .min(self.backoff_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_never_overflows() {
        let p = RestartPolicy {
            backoff_ms: 100,
            backoff_max_ms: 1_000,
            ..RestartPolicy::ON_FAILURE
        };
        let d: Vec<u64> = (0..6).map(|n| p.backoff_ms(n)).collect();
        assert_eq!(d, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(p.backoff_ms(200), 1_000);
        assert!(
            RestartPolicy::default() == RestartPolicy::NEVER && !RestartPolicy::NEVER.restarts()
        );
    }

    #[test]
    fn problems_are_named() {
        assert_eq!(RestartPolicy::ON_FAILURE.problem(), None);
        let bad = RestartPolicy {
            limit: 0,
            ..RestartPolicy::ON_FAILURE
        };
        assert!(bad.problem().unwrap_or_default().contains("limit 0"));
        let bad = RestartPolicy {
            backoff_ms: 5,
            backoff_max_ms: 1,
            ..RestartPolicy::ON_FAILURE
        };
        assert!(bad.problem().unwrap_or_default().contains("backoff 5 ms"));
        assert_eq!("on-failure".parse(), Ok(RestartMode::OnFailure));
        assert!("always".parse::<RestartMode>().is_err());
    }
}
