//! Failure detection (§3.5.1), sans-IO: counter-slope liveness with a refresh period and
//! k-refresh hysteresis, and the monitoring ring in which each node watches its k+1
//! successors so that k simultaneous failures are still seen.
//!
//! Nothing here reads a clock: callers pass the time of each fetch (any monotonic
//! nanoseconds, simulated in the tests). A target is alive while its liveness counter
//! (context switches, timer interrupts, a cgroup's CPU usage, a ticker inside the
//! target) has a positive slope between consecutive views; after `k` consecutive views
//! without one — or without a view at all — it is declared dead. A fetch made at a
//! fixed refresh `r` therefore declares a stopped target within `(k + 1)·r` of its last
//! progress (OR-1: 400 ms at r = 100 ms, k = 3).

use crate::error::OrionError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The detector's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LivenessConfig {
    /// Refresh period: the time between views (ns).
    pub refresh_ns: u64,
    /// Views without progress before the target is declared dead (the seed uses 3).
    pub k: u32,
}

impl LivenessConfig {
    /// Checked settings: a positive refresh and `k ≥ 1`.
    pub fn new(refresh_ns: u64, k: u32) -> Result<LivenessConfig, OrionError> {
        if refresh_ns == 0 || k == 0 {
            return Err(OrionError::Config {
                what: "failure detector".to_owned(),
                why: format!("refresh {refresh_ns} ns and k = {k}: both must be positive"),
            });
        }
        Ok(LivenessConfig { refresh_ns, k })
    }

    /// The span without progress after which a target is declared dead, `k·r`.
    pub fn deadline_ns(&self) -> u64 {
        self.refresh_ns.saturating_mul(u64::from(self.k))
    }

    /// The worst-case detection latency from the last progress, `(k + 1)·r`.
    pub fn worst_latency_ns(&self) -> u64 {
        self.refresh_ns.saturating_mul(u64::from(self.k) + 1)
    }
}

/// Where a target stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Liveness {
    /// Progress at the last view (or not yet enough views to say otherwise).
    Alive,
    /// `misses` views in a row without progress, fewer than `k`.
    Suspect {
        /// Views without progress.
        misses: u32,
    },
    /// Declared dead.
    Dead {
        /// When it was declared (the view's time).
        declared_ns: u64,
        /// The last view that showed progress.
        last_progress_ns: u64,
    },
}

/// A change a view caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Transition {
    /// Declared dead now: `k` views without progress.
    Declared {
        /// The view's time.
        at_ns: u64,
        /// The last view with progress.
        last_progress_ns: u64,
        /// The counter's value, unchanged since then (None: no view could be had).
        value: Option<u64>,
    },
    /// A target declared dead made progress again: the declaration was a false positive.
    Recovered {
        /// The view's time.
        at_ns: u64,
    },
}

/// Counter-slope liveness for one target.
#[derive(Debug, Clone)]
pub struct SlopeDetector {
    cfg: LivenessConfig,
    last: Option<u64>,
    last_progress_ns: u64,
    state: Liveness,
}

impl SlopeDetector {
    /// A detector whose first view sets the baseline.
    pub fn new(cfg: LivenessConfig) -> SlopeDetector {
        SlopeDetector {
            cfg,
            last: None,
            last_progress_ns: 0,
            state: Liveness::Alive,
        }
    }

    /// A detector for a target already declared dead (by this monitor or another),
    /// whose counter last read `last`: the next view with a higher value (or the first
    /// view at all, without `last`) is its recovery.
    pub fn declared(cfg: LivenessConfig, last: Option<u64>) -> SlopeDetector {
        SlopeDetector {
            cfg,
            last,
            last_progress_ns: 0,
            state: Liveness::Dead {
                declared_ns: 0,
                last_progress_ns: 0,
            },
        }
    }

    /// The current standing.
    pub fn state(&self) -> Liveness {
        self.state
    }

    /// One view at `now_ns`: the liveness counter's value, or `None` when the fetch
    /// failed (which counts as a view without progress).
    pub fn observe(&mut self, now_ns: u64, value: Option<u64>) -> Option<Transition> {
        let progressed = match (self.last, value) {
            (None, Some(_)) => {
                self.last_progress_ns = now_ns;
                true
            }
            (Some(l), Some(v)) => v > l,
            (_, None) => false,
        };
        if value.is_some() {
            self.last = value;
        }
        if progressed {
            self.last_progress_ns = now_ns;
            let was_dead = matches!(self.state, Liveness::Dead { .. });
            self.state = Liveness::Alive;
            return was_dead.then_some(Transition::Recovered { at_ns: now_ns });
        }
        match self.state {
            Liveness::Dead { .. } => None,
            Liveness::Alive | Liveness::Suspect { .. } => {
                let misses = match self.state {
                    Liveness::Suspect { misses } => misses + 1,
                    _ => 1,
                };
                if misses >= self.cfg.k {
                    self.state = Liveness::Dead {
                        declared_ns: now_ns,
                        last_progress_ns: self.last_progress_ns,
                    };
                    Some(Transition::Declared {
                        at_ns: now_ns,
                        last_progress_ns: self.last_progress_ns,
                        value: self.last,
                    })
                } else {
                    self.state = Liveness::Suspect { misses };
                    None
                }
            }
        }
    }
}

/// Ring membership: node ids in ring order (ascending, wrapping), each watching its
/// `k + 1` successors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ring {
    members: BTreeSet<u32>,
    k: usize,
}

impl Ring {
    /// A ring of `members` tolerating `k` simultaneous failures.
    pub fn new(members: impl IntoIterator<Item = u32>, k: usize) -> Ring {
        Ring {
            members: members.into_iter().collect(),
            k,
        }
    }

    /// The members in ring order.
    pub fn members(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().copied()
    }

    /// Adds a node.
    pub fn join(&mut self, node: u32) -> bool {
        self.members.insert(node)
    }

    /// Removes a node (declared dead, or leaving).
    pub fn leave(&mut self, node: u32) -> bool {
        self.members.remove(&node)
    }

    /// The nodes `node` watches: its `k + 1` successors (all others in a small ring).
    pub fn watched_by(&self, node: u32) -> Vec<u32> {
        let after = self.members.range(node.saturating_add(1)..);
        let before = self.members.range(..node);
        let n = (self.k + 1).min(
            self.members
                .len()
                .saturating_sub(usize::from(self.members.contains(&node))),
        );
        after
            .chain(before)
            .copied()
            .filter(|m| *m != node)
            .take(n)
            .collect()
    }

    /// The nodes watching `node`.
    pub fn watchers_of(&self, node: u32) -> Vec<u32> {
        self.members
            .iter()
            .copied()
            .filter(|m| *m != node && self.watched_by(*m).contains(&node))
            .collect()
    }
}

/// What one ring member's monitor reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RingEvent {
    /// The watching node.
    pub watcher: u32,
    /// The watched node.
    pub target: u32,
    /// What changed.
    pub transition: Transition,
}

/// One node's monitor in the ring: a detector per watched successor, reconciled on
/// every membership change.
#[derive(Debug, Clone)]
pub struct RingMonitor {
    me: u32,
    cfg: LivenessConfig,
    detectors: BTreeMap<u32, SlopeDetector>,
}

impl RingMonitor {
    /// The monitor of node `me` under `ring`.
    pub fn new(me: u32, cfg: LivenessConfig, ring: &Ring) -> RingMonitor {
        let mut m = RingMonitor {
            me,
            cfg,
            detectors: BTreeMap::new(),
        };
        m.membership(ring);
        m
    }

    /// Applies a membership change: new successors get fresh detectors (baseline at
    /// their first view), nodes no longer watched are dropped, the rest keep their state.
    pub fn membership(&mut self, ring: &Ring) {
        let want: BTreeSet<u32> = ring.watched_by(self.me).into_iter().collect();
        self.detectors.retain(|n, _| want.contains(n));
        for n in want {
            self.detectors
                .entry(n)
                .or_insert_with(|| SlopeDetector::new(self.cfg));
        }
    }

    /// The nodes this monitor watches.
    pub fn targets(&self) -> Vec<u32> {
        self.detectors.keys().copied().collect()
    }

    /// Where a watched node stands.
    pub fn state(&self, target: u32) -> Option<Liveness> {
        self.detectors.get(&target).map(SlopeDetector::state)
    }

    /// One view of `target` (ignored when not watched).
    pub fn observe(&mut self, target: u32, now_ns: u64, value: Option<u64>) -> Option<RingEvent> {
        let d = self.detectors.get_mut(&target)?;
        d.observe(now_ns, value).map(|transition| RingEvent {
            watcher: self.me,
            target,
            transition,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn k_views_without_progress_declare_and_progress_recovers() {
        let mut d = SlopeDetector::new(LivenessConfig::new(25 * MS, 3).unwrap());
        assert_eq!(d.observe(0, Some(10)), None);
        assert_eq!(d.observe(25 * MS, Some(11)), None);
        assert_eq!(d.observe(50 * MS, Some(11)), None);
        assert_eq!(d.state(), Liveness::Suspect { misses: 1 });
        assert_eq!(d.observe(75 * MS, None), None);
        let t = d.observe(100 * MS, Some(11)).unwrap();
        assert_eq!(
            t,
            Transition::Declared {
                at_ns: 100 * MS,
                last_progress_ns: 25 * MS,
                value: Some(11)
            }
        );
        assert_eq!(d.observe(125 * MS, Some(11)), None, "declared once");
        assert_eq!(
            d.observe(150 * MS, Some(12)),
            Some(Transition::Recovered { at_ns: 150 * MS })
        );
        assert_eq!(d.state(), Liveness::Alive);
    }

    #[test]
    fn a_target_declared_elsewhere_recovers_on_progress_only() {
        let cfg = LivenessConfig::new(25 * MS, 3).unwrap();
        let mut d = SlopeDetector::declared(cfg, Some(40));
        assert_eq!(d.observe(MS, None), None);
        assert_eq!(d.observe(2 * MS, Some(40)), None, "no progress");
        assert_eq!(
            d.observe(3 * MS, Some(41)),
            Some(Transition::Recovered { at_ns: 3 * MS })
        );
        let mut d = SlopeDetector::declared(cfg, None);
        assert_eq!(
            d.observe(MS, Some(7)),
            Some(Transition::Recovered { at_ns: MS })
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(
            LivenessConfig::new(0, 3)
                .unwrap_err()
                .to_string()
                .contains("must be positive")
        );
        assert!(LivenessConfig::new(1, 0).is_err());
    }

    #[test]
    fn ring_successors_and_membership() {
        let mut ring = Ring::new([1, 2, 3, 4, 5], 1);
        assert_eq!(ring.watched_by(4), vec![5, 1]);
        assert_eq!(ring.watchers_of(1), vec![4, 5]);
        let mut m = RingMonitor::new(4, LivenessConfig::new(MS, 2).unwrap(), &ring);
        assert_eq!(m.targets(), vec![1, 5]);
        ring.leave(5);
        m.membership(&ring);
        assert_eq!(m.targets(), vec![1, 2]);
        ring.join(6);
        m.membership(&ring);
        assert_eq!(m.targets(), vec![1, 6]);
        assert_eq!(Ring::new([7], 3).watched_by(7), Vec::<u32>::new());
    }

    /// A simulated cluster: node `n`'s counter grows by one per ms until it dies.
    fn run_ring(
        n: u32,
        k: usize,
        deaths: &[(u32, u64)],
        refresh_ms: u64,
        horizon_ms: u64,
    ) -> Vec<(u32, u64)> {
        let cfg = LivenessConfig::new(refresh_ms * MS, k as u32 + 1).unwrap();
        let mut ring = Ring::new(0..n, k);
        let mut mons: BTreeMap<u32, RingMonitor> = (0..n)
            .map(|i| (i, RingMonitor::new(i, cfg, &ring)))
            .collect();
        let died = |node: u32| deaths.iter().find(|d| d.0 == node).map(|d| d.1);
        let mut declared = Vec::new();
        let mut t = 0;
        while t <= horizon_ms {
            let mut dead_now = Vec::new();
            for (me, m) in &mut mons {
                if died(*me).is_some_and(|d| t >= d) {
                    continue; // a dead node monitors nothing
                }
                for target in m.targets() {
                    let value = t.min(died(target).unwrap_or(u64::MAX));
                    if let Some(ev) = m.observe(target, t * MS, Some(value))
                        && matches!(ev.transition, Transition::Declared { .. })
                    {
                        dead_now.push(ev.target);
                    }
                }
            }
            for d in dead_now {
                if ring.leave(d) {
                    declared.push((d, t));
                    mons.remove(&d);
                    for m in mons.values_mut() {
                        m.membership(&ring);
                    }
                }
            }
            t += refresh_ms;
        }
        declared
    }

    #[test]
    fn the_ring_sees_k_simultaneous_failures_within_the_bound_and_heals() {
        // k = 2: nodes 3 and 4 (neighbours) die at once; both are declared by a live
        // watcher within (k+1+1)·r of death, and nothing else is.
        let declared = run_ring(8, 2, &[(3, 1000), (4, 1000)], 10, 3000);
        let mut nodes: Vec<u32> = declared.iter().map(|d| d.0).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![3, 4]);
        for (_, t) in declared {
            assert!(t - 1000 <= 40, "declared {} ms after death", t - 1000);
        }
    }

    proptest! {
        #[test]
        fn a_steady_counter_is_never_declared(k in 1u32..6, refresh in 1u64..1000, steps in 1usize..200) {
            let mut d = SlopeDetector::new(LivenessConfig::new(refresh, k).unwrap());
            for i in 0..steps as u64 {
                prop_assert_eq!(d.observe(i * refresh, Some(i)), None);
            }
        }

        #[test]
        fn a_stopped_counter_is_declared_after_exactly_k_views(k in 1u32..6, before in 1u64..50) {
            let mut d = SlopeDetector::new(LivenessConfig::new(10, k).unwrap());
            for i in 0..before { d.observe(i * 10, Some(i)); }
            let mut at = None;
            for j in 0..(k as u64 + 3) {
                if let Some(Transition::Declared { .. }) = d.observe((before + j) * 10, Some(before - 1)) {
                    at = Some(j + 1);
                    break;
                }
            }
            prop_assert_eq!(at, Some(u64::from(k)));
        }

        #[test]
        fn every_node_is_watched_by_k_plus_one_others(n in 2u32..20, k in 0usize..4, gone in proptest::collection::btree_set(0u32..20, 0..5)) {
            let mut ring = Ring::new(0..n, k);
            for g in &gone { ring.leave(*g); }
            let size = ring.members().count();
            for m in ring.members() {
                prop_assert_eq!(ring.watchers_of(m).len(), (k + 1).min(size - 1));
            }
        }
    }
}
