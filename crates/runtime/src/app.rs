//! A deployed app as the runtime keeps it: its resource-tree root, the handles
//! of its offcodes, the state of its executors, and its own life-cycle state.

use std::sync::Arc;
use std::time::Instant;

use sidecore_channel::RingProbe;
use sidecore_types::{AppId, AppState, AppStatus, ChannelStatus};

use crate::executor::ExecutorState;
use crate::handle::{OffcodeHandle, millis};
use crate::restart::Restarter;
use crate::tree::ResourceId;

/// One deployed app.
pub struct AppEntry {
    pub id: AppId,
    pub name: String,
    pub root: ResourceId,
    pub handles: Vec<Arc<OffcodeHandle>>,
    /// The supervisor's restart book-keeping, one per handle.
    pub restarters: Vec<Restarter>,
    pub executors: Vec<Arc<ExecutorState>>,
    pub channels: Vec<ChannelEntry>,
    pub state: AppState,
    pub started: Instant,
    pub finished: Option<Instant>,
}

impl AppEntry {
    /// Its status as `sidecore ps` shows it, read now.
    pub fn status(&self) -> AppStatus {
        AppStatus {
            id: self.id,
            name: self.name.clone(),
            state: self.state,
            uptime_ms: millis(
                self.finished
                    .unwrap_or_else(Instant::now)
                    .duration_since(self.started),
            ),
            offcodes: self.handles.iter().map(|h| h.status()).collect(),
            channels: self.channels.iter().map(ChannelEntry::status).collect(),
        }
    }
}

/// One channel of a deployed app: where it runs and, for a local ring, a probe
/// of its counters.
pub struct ChannelEntry {
    pub name: String,
    pub transport: String,
    pub from: String,
    pub to: Vec<String>,
    pub probe: Option<RingProbe>,
}

impl ChannelEntry {
    /// Its status, read now.
    pub fn status(&self) -> ChannelStatus {
        let s = self
            .probe
            .as_ref()
            .map(RingProbe::snapshot)
            .unwrap_or_default();
        ChannelStatus {
            name: self.name.clone(),
            transport: self.transport.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            probed: self.probe.is_some(),
            messages: s.published,
            dropped: s.dropped,
            backpressure: s.full_waits,
            occupancy: s.occupancy,
            capacity: s.capacity,
        }
    }
}
