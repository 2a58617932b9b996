//! What a running app and its offcodes look like from outside: the status that
//! `sidecore ps` prints, the control socket returns and a peer node reports to the
//! origin over the node protocol. Plain data, shared by the runtime, the control
//! plane and the wire, so none of them has to depend on another for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Identifies a deployed app within one daemon.
pub type AppId = u64;

/// Life-cycle state of an offcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum OffcodeState {
    Landing = 0,
    Initialized = 1,
    Running = 2,
    Done = 3,
    Stopped = 4,
    Failed = 5,
    /// Failed, and waiting for the supervisor to restart it (its restart
    /// policy): its instance is stopped, its channels stay attached.
    Restarting = 6,
}

impl OffcodeState {
    /// The state stored as `v` (its discriminant) in an atomic; an unknown value
    /// reads as `Failed`, the state that can never be mistaken for health.
    pub fn from_u8(v: u8) -> Self {
        match v {
            0 => OffcodeState::Landing,
            1 => OffcodeState::Initialized,
            2 => OffcodeState::Running,
            3 => OffcodeState::Done,
            4 => OffcodeState::Stopped,
            6 => OffcodeState::Restarting,
            _ => OffcodeState::Failed,
        }
    }

    /// No longer running.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OffcodeState::Done | OffcodeState::Stopped | OffcodeState::Failed
        )
    }
}

/// Life of an app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AppState {
    Running,
    /// Every offcode finished or was stopped by the runtime.
    Finished,
    /// Stopped by request.
    Stopped,
}

/// One offcode as `sidecore ps` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffcodeStatus {
    pub name: String,
    pub implementation: String,
    pub pe: String,
    pub state: OffcodeState,
    pub uptime_ms: u64,
    /// Messages taken from its inputs.
    pub handled: u64,
    /// Messages its outputs sent.
    pub sent: u64,
    /// Messages its unreliable outputs dropped.
    pub dropped: u64,
    /// Executor turns it has had.
    pub turns: u64,
    /// Periodic jobs of it that ended after their deadline (it ran longer
    /// than its declared WCET); absent from reports of older peers.
    #[serde(default)]
    pub deadline_misses: u64,
    /// Its own counters (`records`, `sequence_gaps`, ...).
    pub metrics: BTreeMap<String, u64>,
    pub stop_reason: Option<String>,
    /// Times the supervisor restarted it after a failure (its restart
    /// policy); absent from reports of older peers.
    #[serde(default)]
    pub restarts: u64,
}

/// One channel of an app as `sidecore ps --json` and the metrics show it.
/// Counters are read from a ring's shared indices; channels that are not
/// rings in this daemon (work queues, streams to peers) carry only their name
/// and transport, and their counters stay zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelStatus {
    pub name: String,
    /// `Ring`, `WorkQueue` or `Stream`.
    pub transport: String,
    /// The sending offcode.
    pub from: String,
    /// The receiving offcodes.
    pub to: Vec<String>,
    /// True when the counters below are measured (a local ring).
    pub probed: bool,
    pub messages: u64,
    pub dropped: u64,
    /// Times a reliable sender waited for space.
    pub backpressure: u64,
    /// Messages sent and not yet released by the slowest receiver.
    pub occupancy: u64,
    pub capacity: u64,
}

/// One app as `sidecore ps` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppStatus {
    pub id: AppId,
    pub name: String,
    pub state: AppState,
    pub uptime_ms: u64,
    pub offcodes: Vec<OffcodeStatus>,
    /// Its channels (absent in reports from older daemons and peers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<ChannelStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offcode_state_survives_its_atomic_form() {
        for s in [
            OffcodeState::Landing,
            OffcodeState::Initialized,
            OffcodeState::Running,
            OffcodeState::Done,
            OffcodeState::Stopped,
            OffcodeState::Failed,
            OffcodeState::Restarting,
        ] {
            assert_eq!(OffcodeState::from_u8(s as u8), s);
        }
        assert!(!OffcodeState::Restarting.is_final(), "it will run again");
        assert_eq!(OffcodeState::from_u8(200), OffcodeState::Failed);
        assert!(OffcodeState::Done.is_final() && !OffcodeState::Running.is_final());
    }
}
