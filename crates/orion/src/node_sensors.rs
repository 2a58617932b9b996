//! A node's own sensors as its daemon serves them to monitors on other machines
//! (`sense` on the node protocol): a heartbeat that a ticker thread inside the daemon
//! advances every millisecond — the liveness counter, which stops when the daemon is
//! frozen, stopped or starved — the host's implicit counters, and the PEs this process's
//! monitors have declared dead (gossiped through the ring with every view).
//!
//! Namespaced nodes on one machine share one kernel, so the host's counters keep moving
//! when one node's daemon stops; the heartbeat is the node's own.

use crate::health;
use crate::implicit::ImplicitSource;
use sidecore_wire::orion_msg::{SenseRequest, SenseView};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The ticker's period.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_millis(1);

/// The sensors of this node, with their ticker running.
pub struct NodeSensors {
    name: String,
    beat: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl NodeSensors {
    /// Starts the heartbeat of node `name`.
    pub fn start(name: &str) -> std::io::Result<NodeSensors> {
        let beat = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (Arc::clone(&beat), Arc::clone(&stop));
        let ticker = std::thread::Builder::new()
            .name("sc-orion-beat".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    b.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(HEARTBEAT_PERIOD);
                }
            })?;
        Ok(NodeSensors {
            name: name.to_owned(),
            beat,
            stop,
            ticker: Some(ticker),
        })
    }

    /// The heartbeat now.
    pub fn heartbeat(&self) -> u64 {
        self.beat.load(Ordering::Relaxed)
    }

    /// The view answering `req`.
    pub fn view(&self, req: &SenseRequest) -> SenseView {
        let mut sensors = BTreeMap::new();
        if let Ok(values) = ImplicitSource::ProcStat.read() {
            sensors.extend(values);
        }
        SenseView {
            seq: req.seq,
            node: self.name.clone(),
            heartbeat: self.heartbeat(),
            sensors,
            dead: health::dead().into_iter().map(|d| d.pe).collect(),
        }
    }
}

impl Drop for NodeSensors {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_advances_and_views_carry_it() {
        let s = NodeSensors::start("n1").unwrap();
        let v1 = s.view(&SenseRequest {
            seq: 4,
            watcher: "w".into(),
        });
        std::thread::sleep(Duration::from_millis(20));
        let v2 = s.view(&SenseRequest {
            seq: 5,
            watcher: "w".into(),
        });
        assert_eq!((v1.seq, v2.seq, v2.node.as_str()), (4, 5, "n1"));
        assert!(
            v2.heartbeat > v1.heartbeat,
            "{} → {}",
            v1.heartbeat,
            v2.heartbeat
        );
        assert!(v2.sensors.contains_key("stat.ctxt"), "{:?}", v2.sensors);
    }
}
