//! A deployed app as the runtime keeps it: its resource-tree root, the handles
//! of its offcodes, the state of its executors, and its own life-cycle state.

use std::sync::Arc;
use std::time::Instant;

use sidecore_types::{AppId, AppState, AppStatus};

use crate::executor::ExecutorState;
use crate::handle::{OffcodeHandle, millis};
use crate::tree::ResourceId;

/// One deployed app.
pub struct AppEntry {
    pub id: AppId,
    pub name: String,
    pub root: ResourceId,
    pub handles: Vec<Arc<OffcodeHandle>>,
    pub executors: Vec<Arc<ExecutorState>>,
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
        }
    }
}
