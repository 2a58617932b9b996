//! `orion-monitor`: Orion's monitor as a native offcode, so that a manifest places it
//! like any other — on a dedicated core (the seed's monitor that does not share the
//! target's CPUs), on the host, or on a peer node. Each refresh it runs this node's part
//! of the monitoring ring ([`RingWatch`]): views of its `k + 1` successors over the node
//! protocol, counter-slope liveness on their heartbeats, declarations posted on the
//! process's [`crate::health`] board (where the daemon hears them and re-places the dead
//! node's offcodes) and membership changes.
//!
//! ```toml
//! [[offcode]]
//! name = "monitor"
//! impl = "orion-monitor"
//! params = { me = "a", ring = ["a=10.0.0.1:7400", "b=10.0.0.2:7400"], refresh_ms = 25, k = 3 }
//!   [[offcode.target]]
//!   kind = "core"
//! ```
//!
//! Metrics: `views`, `declared`, `recovered`, `left` (declarations heard from others),
//! `members` (still in the ring), `watching`, `refreshes`, `late_refreshes` (a refresh
//! more than half a period late: the monitor itself was starved).

use crate::detect::LivenessConfig;
use crate::ring::{Member, RingNote, RingWatch};
use serde::Deserialize;
use sidecore_offcode::{
    Implementation, InitCx, Interfaces, Metric, Offcode, OffcodeError, Progress, Registry, RunCx,
    parse_params,
};
use sidecore_types::PeKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The implementation's name.
pub const NAME: &str = "orion-monitor";
/// The shortest refresh period accepted.
pub const MIN_REFRESH_MS: u64 = 1;
/// The longest.
pub const MAX_REFRESH_MS: u64 = 60_000;
/// The largest k (ring tolerance and misses alike).
pub const MAX_K: u32 = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// This node's name in the ring.
    me: String,
    /// The ring's members, `NAME=IP:PORT` (this node included).
    ring: Vec<String>,
    /// Refresh period, ms.
    #[serde(default = "default_refresh")]
    refresh_ms: u64,
    /// Refreshes without progress before a node is declared dead.
    #[serde(default = "default_k")]
    k: u32,
    /// Simultaneous failures the ring tolerates (each node watches `ring_k + 1`
    /// successors); default `k`.
    ring_k: Option<u32>,
}

fn default_refresh() -> u64 {
    25
}

fn default_k() -> u32 {
    3
}

/// The checked settings.
fn settings(
    params: &toml::Table,
) -> Result<(String, Vec<Member>, usize, LivenessConfig), OffcodeError> {
    let p: Params = parse_params(params)?;
    let bad = |s: String| OffcodeError::Params(s);
    if !(MIN_REFRESH_MS..=MAX_REFRESH_MS).contains(&p.refresh_ms) {
        return Err(bad(format!(
            "`refresh_ms` = {}: must be {MIN_REFRESH_MS} to {MAX_REFRESH_MS}",
            p.refresh_ms
        )));
    }
    let ring_k = p.ring_k.unwrap_or(p.k);
    if p.k == 0 || p.k > MAX_K || ring_k > MAX_K {
        return Err(bad(format!(
            "`k` = {} and `ring_k` = {ring_k}: k must be 1 to {MAX_K}, ring_k at most {MAX_K}",
            p.k
        )));
    }
    let members = p
        .ring
        .iter()
        .map(|m| m.parse::<Member>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("`ring`: {e}")))?;
    let cfg = LivenessConfig::new(p.refresh_ms * 1_000_000, p.k).map_err(|e| bad(e.to_string()))?;
    // The ring's own checks (membership of `me`, duplicates), without connecting.
    RingWatch::new(&p.me, members.clone(), ring_k as usize, cfg)
        .map_err(|e| bad(format!("`ring`: {e}")))?;
    Ok((p.me, members, ring_k as usize, cfg))
}

/// The monitor offcode.
pub struct OrionMonitor {
    watch: RingWatch,
    refresh: Duration,
    next: Option<Instant>,
    epoch: Instant,
    metrics: Option<Metrics>,
}

struct Metrics {
    views: Metric,
    declared: Metric,
    recovered: Metric,
    left: Metric,
    members: Metric,
    watching: Metric,
    refreshes: Metric,
    late: Metric,
}

impl OrionMonitor {
    /// Builds the monitor from its manifest parameters.
    pub fn new(params: &toml::Table) -> Result<OrionMonitor, OffcodeError> {
        let (me, members, k, cfg) = settings(params)?;
        let watch = RingWatch::new(&me, members, k, cfg)
            .map_err(|e| OffcodeError::Params(e.to_string()))?;
        Ok(OrionMonitor {
            watch,
            refresh: Duration::from_nanos(cfg.refresh_ns),
            next: None,
            epoch: Instant::now(),
            metrics: None,
        })
    }

    fn count(&self, notes: &[RingNote]) {
        let Some(m) = &self.metrics else { return };
        for n in notes {
            match n {
                RingNote::Declared { .. } => m.declared.add(1),
                RingNote::Recovered { .. } => m.recovered.add(1),
                RingNote::Left { .. } => m.left.add(1),
            }
        }
        m.views.set(self.watch.views());
        m.members.set(self.watch.live_members().len() as u64);
        m.watching.set(self.watch.watching().len() as u64);
        m.refreshes.add(1);
    }
}

impl Offcode for OrionMonitor {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.metrics = Some(Metrics {
            views: cx.metric("views"),
            declared: cx.metric("declared"),
            recovered: cx.metric("recovered"),
            left: cx.metric("left"),
            members: cx.metric("members"),
            watching: cx.metric("watching"),
            refreshes: cx.metric("refreshes"),
            late: cx.metric("late_refreshes"),
        });
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let now = cx.now();
        let next = *self.next.get_or_insert(now);
        if now < next {
            return Ok(Progress::Idle);
        }
        if now.duration_since(next) > self.refresh / 2
            && let Some(m) = &self.metrics
        {
            m.late.add(1);
        }
        // Fixed-rate refreshes; a monitor that fell far behind starts afresh.
        let mut following = next + self.refresh;
        if following <= now {
            following = now + self.refresh;
        }
        self.next = Some(following);
        let now_ns = u64::try_from(now.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let notes = self.watch.refresh(now_ns);
        self.count(&notes);
        Ok(Progress::Busy)
    }
}

/// Adds `orion-monitor` to `reg`.
pub fn register(reg: &mut Registry) {
    reg.register(Implementation {
        name: NAME.into(),
        description: "Orion's monitor: watches its k+1 successors in a ring of nodes over the node protocol, declares the dead (counter-slope liveness), and posts them for re-placement".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(|spec| Ok(Box::new(OrionMonitor::new(spec.params)?))),
        validate: Some(Arc::new(|p| settings(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(s: &str) -> toml::Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn bad_parameters_say_which() {
        let ok = r#"me = "a"
ring = ["a=127.0.0.1:1", "b=127.0.0.1:2"]"#;
        assert!(settings(&params(ok)).is_ok());
        for (extra, want) in [
            ("refresh_ms = 0", "`refresh_ms` = 0"),
            ("k = 0", "k must be 1"),
            ("frobnicate = 1", "unknown field `frobnicate`"),
        ] {
            let e = settings(&params(&format!("{ok}\n{extra}")))
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = settings(&params(
            r#"me = "z"
ring = ["a=127.0.0.1:1"]"#,
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("`z` is not a member"), "{e}");
        let e = settings(&params(
            r#"me = "a"
ring = ["a=nowhere"]"#,
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("ring member `a=nowhere`"), "{e}");
    }
}
