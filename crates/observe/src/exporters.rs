//! `/metrics` for the services that run as their own commands rather than
//! inside the daemon: FileWall's proxies (`filewall run --metrics ADDR`), a
//! TCPServers server (`tcps serve --metrics ADDR`) and a Sikker agent
//! (`sikker agent --metrics ADDR`). Each renders its own counters at scrape
//! time through [`Exposition`], a small builder over `prometheus-client` that
//! registers a family the first time a series of it is written.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;
/// Label pairs read from another exposition (relayed families).
pub type OwnedLabels = Vec<(String, String)>;

/// A histogram whose buckets were counted elsewhere (the service keeps its
/// own, with fixed bounds), written as they are.
/// Sum, count and (upper bound, count) per bucket.
type HistogramData = (f64, u64, Vec<(f64, u64)>);

#[derive(Debug, Default)]
pub struct ConstHistogram(Mutex<HistogramData>);

impl TypedMetric for ConstHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        encoder.encode_histogram::<NoLabelSet>(g.0, g.1, &g.2, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Families registered on first use.
pub struct Exposition {
    reg: Registry,
    counters: BTreeMap<&'static str, Family<Labels, Counter>>,
    gauges: BTreeMap<&'static str, Family<Labels, Gauge<f64, AtomicU64>>>,
    histograms: BTreeMap<&'static str, Family<Labels, ConstHistogram>>,
    relayed_counters: BTreeMap<&'static str, Family<OwnedLabels, Counter<f64, AtomicU64>>>,
    relayed_gauges: BTreeMap<&'static str, Family<OwnedLabels, Gauge<f64, AtomicU64>>>,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition {
            reg: Registry::with_prefix("sidecore"),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            histograms: BTreeMap::new(),
            relayed_counters: BTreeMap::new(),
            relayed_gauges: BTreeMap::new(),
        }
    }
}

impl Exposition {
    /// A counter series (`name` without `sidecore_` and `_total`).
    pub fn counter(&mut self, name: &'static str, help: &str, labels: Labels, v: u64) {
        let reg = &mut self.reg;
        self.counters
            .entry(name)
            .or_insert_with(|| {
                let f = Family::default();
                reg.register(name, help, f.clone());
                f
            })
            .get_or_create(&labels)
            .inc_by(v);
    }

    /// A gauge series; `unit` becomes the name's suffix.
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &str,
        unit: Option<Unit>,
        labels: Labels,
        v: f64,
    ) {
        let reg = &mut self.reg;
        self.gauges
            .entry(name)
            .or_insert_with(|| {
                let f = Family::default();
                match unit {
                    Some(u) => reg.register_with_unit(name, help, u, f.clone()),
                    None => reg.register(name, help, f.clone()),
                }
                f
            })
            .get_or_create(&labels)
            .set(v);
    }

    /// A series read from another exposition (a scraped service's), as a
    /// counter or a gauge; `unit` becomes the name's suffix.
    pub fn relay(
        &mut self,
        name: &'static str,
        help: &str,
        (counter, unit): (bool, Option<Unit>),
        labels: &OwnedLabels,
        v: f64,
    ) {
        let reg = &mut self.reg;
        if counter {
            self.relayed_counters
                .entry(name)
                .or_insert_with(|| {
                    let f = Family::default();
                    register(reg, name, help, unit.clone(), f.clone());
                    f
                })
                .get_or_create(labels)
                .inc_by(v.max(0.0));
        } else {
            self.relayed_gauges
                .entry(name)
                .or_insert_with(|| {
                    let f = Family::default();
                    register(reg, name, help, unit.clone(), f.clone());
                    f
                })
                .get_or_create(labels)
                .set(v);
        }
    }

    /// A histogram series in seconds from per-bucket counts with upper bounds
    /// in seconds (the last bucket, above every bound, is `+Inf`).
    pub fn histogram_seconds(
        &mut self,
        name: &'static str,
        help: &str,
        labels: Labels,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let reg = &mut self.reg;
        let mut buckets: Vec<(f64, u64)> =
            bounds.iter().copied().zip(counts.iter().copied()).collect();
        buckets.push((f64::MAX, counts.get(bounds.len()).copied().unwrap_or(0)));
        let count = counts.iter().sum();
        let h = self.histograms.entry(name).or_insert_with(|| {
            let f = Family::default();
            reg.register_with_unit(name, help, Unit::Seconds, f.clone());
            f
        });
        let s = h.get_or_create(&labels);
        *s.0.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (sum, count, buckets);
    }

    /// The OpenMetrics text. A series without labels is written without
    /// the empty braces `prometheus-client` gives it inside a family.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would be a bug in the
        // crate's encoder, and an empty scrape says so without taking the
        // service down.
        if encode(&mut out, &self.reg).is_err() {
            tracing::error!("the metrics encoder failed");
            return String::new();
        }
        if !out.contains("{} ") {
            return out;
        }
        let mut clean = String::with_capacity(out.len());
        for line in out.lines() {
            if line.starts_with('#') {
                clean.push_str(line);
            } else {
                clean.push_str(&line.replacen("{} ", " ", 1));
            }
            clean.push('\n');
        }
        clean
    }
}

/// Registers `m` as family `name`, with its unit if it has one.
fn register<M: prometheus_client::registry::Metric>(
    reg: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    m: M,
) {
    match unit {
        Some(u) => reg.register_with_unit(name, help, u, m),
        None => reg.register(name, help, m),
    }
}

/// FileWall: each proxy's operations, latency, refusals and drops.
pub fn filewall(proxies: &[(&str, sidecore_filewall::proxy::ProxyStats)]) -> String {
    let mut e = Exposition::default();
    let bounds: Vec<f64> = sidecore_filewall::latency::BOUNDS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .collect();
    for (proxy, s) in proxies {
        let p = || vec![("proxy", (*proxy).to_string())];
        for (op, c) in &s.ops {
            let l = |k: &'static str| {
                vec![
                    ("proxy", (*proxy).to_string()),
                    ("op", op.clone()),
                    ("kind", k.to_string()),
                ]
            };
            e.counter(
                "filewall_operations",
                "NFS and MOUNT calls forwarded and replies returned, by operation",
                l("call"),
                c.calls,
            );
            e.counter(
                "filewall_operations",
                "NFS and MOUNT calls forwarded and replies returned, by operation",
                l("reply"),
                c.replies,
            );
        }
        for (op, h) in &s.latency {
            e.histogram_seconds(
                "filewall_operation_latency",
                "Time from a client's call reaching the proxy to its reply leaving it",
                vec![("proxy", (*proxy).to_string()), ("op", op.clone())],
                &bounds,
                &h.buckets,
                h.sum_ns as f64 / 1e9,
            );
        }
        let pc = &s.policies;
        for (why, v) in [
            ("refused", s.refused_calls),
            ("bad_handle", pc.bad_handles),
            ("oversize_handle", pc.oversize_handles),
            ("temporal", pc.temporal_denied),
        ] {
            let mut l = p();
            l.push(("reason", why.into()));
            e.counter(
                "filewall_denials",
                "Calls the proxy or its policies answered without the server",
                l,
                v,
            );
        }
        for (why, v) in [
            ("record", s.dropped_records),
            ("pending_full", s.overflows),
            ("policy_buffer", s.policy_buffer_drops),
            ("timeout", s.timeouts),
        ] {
            let mut l = p();
            l.push(("reason", why.into()));
            e.counter(
                "filewall_drops",
                "Calls or records dropped (the client sees network loss)",
                l,
                v,
            );
        }
        e.counter(
            "filewall_retransmissions",
            "Client retransmissions resent under their pending server XID",
            p(),
            s.retransmissions,
        );
        e.counter(
            "filewall_server_errors",
            "Failures to reach the server",
            p(),
            s.server_errors,
        );
    }
    e.render()
}

/// TCPServers: per PPE, its queues and connections.
pub fn tcps(s: &sidecore_tcps::Snapshot) -> String {
    let mut e = Exposition::default();
    for p in &s.ppes {
        let l = || vec![("ppe", p.cpu.to_string()), ("master", p.master.to_string())];
        e.gauge(
            "tcps_ppe_active",
            "1 while the PPE serves",
            None,
            l(),
            f64::from(u8::from(p.active)),
        );
        e.gauge(
            "tcps_connections",
            "Connections the PPE owns",
            None,
            l(),
            p.conns as f64,
        );
        e.counter("tcps_accepted", "Connections accepted", l(), p.accepted);
        e.counter(
            "tcps_bytes_received",
            "Bytes received from clients",
            l(),
            p.bytes_in,
        );
        e.counter("tcps_bytes_sent", "Bytes sent to clients", l(), p.bytes_out);
        e.counter("tcps_receive_queue_full", "Times a connection's receive queue was full and its socket was no longer read (TCP's window pushes back)", l(), p.rq_full_stalls);
        e.counter(
            "tcps_receive_queue_resumed",
            "Times a full receive queue drained and its socket was read again",
            l(),
            p.rq_resumed,
        );
        for (queue, v) in [
            ("control", p.picks_control),
            ("ready", p.picks_ready),
            ("accept", p.picks_accept),
        ] {
            let mut q = l();
            q.push(("queue", queue.into()));
            e.counter("tcps_scheduler_picks", "GR³ scheduler picks by queue", q, v);
        }
        for (why, v) in [
            ("app", p.closed_app),
            ("reset", p.closed_reset),
            ("idle", p.closed_idle),
            ("half_open", p.closed_half_open),
            ("linger", p.closed_linger),
        ] {
            let mut c = l();
            c.push(("reason", why.into()));
            e.counter("tcps_closed", "Connections closed, by reason", c, v);
        }
    }
    for (name, v) in &s.app {
        e.counter(
            "tcps_app_events",
            "Application-level counters (HTTP responses by status, ...)",
            vec![("name", name.clone())],
            *v,
        );
    }
    e.render()
}

/// Sikker: the agent's checks, denials, forwarding and its SE-TRE rates.
pub fn sikker(
    host: &str,
    c: &sidecore_sikker_agent::core::Counters,
    rates: &BTreeMap<u32, f64>,
) -> String {
    let mut e = Exposition::default();
    let h = || vec![("host", host.to_string())];
    for (what, v) in [
        ("sent", c.sent),
        ("delivered", c.delivered),
        ("forwarded", c.forwarded),
        ("received_from_peers", c.received_from_peers),
        ("held", c.held),
    ] {
        let mut l = h();
        l.push(("what", what.into()));
        e.counter(
            "sikker_messages",
            "Messages the agent checked, by what became of them",
            l,
            v,
        );
    }
    e.counter(
        "sikker_attachments",
        "Processes attested and attached",
        h(),
        c.attached,
    );
    e.counter(
        "sikker_attachments_refused",
        "Attachments refused",
        h(),
        c.refused,
    );
    for (kind, v) in &c.denied {
        let mut l = h();
        l.push(("kind", kind.clone()));
        e.counter("sikker_denials", "Messages denied, by kind", l, *v);
    }
    e.counter(
        "sikker_policy_updates",
        "Policy updates applied",
        h(),
        c.policy_updates,
    );
    e.counter(
        "sikker_policy_refused",
        "Policy updates refused (the last good policy kept enforcing)",
        h(),
        c.policy_refused,
    );
    e.counter(
        "sikker_placement_updates",
        "Placement updates applied",
        h(),
        c.placement_updates,
    );
    e.counter(
        "sikker_placement_refused",
        "Placement updates refused (the last good placement kept)",
        h(),
        c.placement_refused,
    );
    for (slot, r) in rates {
        let mut l = h();
        l.push(("limit", slot.to_string()));
        e.gauge(
            "sikker_rate",
            "SE-TRE fill rate this host holds for each limit",
            Some(Unit::Other("bytes_per_second".into())),
            l,
            *r,
        );
    }
    e.render()
}

/// What `orion watch` saw at its latest fetch, and what it has done.
#[derive(Debug, Clone, Default)]
pub struct OrionWatch {
    /// What is watched: a cgroup's path, or `host`.
    pub target: String,
    /// The liveness sensor and its value.
    pub sensor: String,
    pub value: Option<u64>,
    /// Implicit sensors (cgroup and /proc counters) read at the fetch.
    pub implicit: Vec<(String, u64)>,
    /// Live explicit sensors in the box.
    pub explicit_sensors: usize,
    /// `alive`, `suspect` or `dead`.
    pub state: &'static str,
    pub fetches: u64,
    pub transitions: u64,
    pub repairs: u64,
    pub killed: u64,
}

/// Orion: the watched target's sensors, liveness and repairs.
pub fn orion(w: &OrionWatch) -> String {
    let mut e = Exposition::default();
    let t = || vec![("target", w.target.clone())];
    for (name, v) in &w.implicit {
        e.gauge(
            "orion_sensor",
            "Implicit sensors read at the latest fetch",
            None,
            vec![("target", w.target.clone()), ("sensor", name.clone())],
            *v as f64,
        );
    }
    if let Some(v) = w.value {
        e.gauge(
            "orion_liveness_sensor",
            "The liveness sensor's value at the latest fetch",
            None,
            vec![("target", w.target.clone()), ("sensor", w.sensor.clone())],
            v as f64,
        );
    }
    e.gauge(
        "orion_explicit_sensors",
        "Live explicit sensors in the box",
        None,
        t(),
        w.explicit_sensors as f64,
    );
    for s in ["alive", "suspect", "dead"] {
        e.gauge(
            "orion_target_state",
            "1 for the target's liveness state by counter slope",
            None,
            vec![("target", w.target.clone()), ("state", s.into())],
            f64::from(u8::from(w.state == s)),
        );
    }
    e.counter(
        "orion_fetches",
        "Views fetched from the sensor box",
        t(),
        w.fetches,
    );
    e.counter(
        "orion_transitions",
        "Liveness transitions",
        t(),
        w.transitions,
    );
    e.counter("orion_repairs", "Fork-bomb repairs done", t(), w.repairs);
    e.counter(
        "orion_processes_killed",
        "Processes killed by repairs",
        t(),
        w.killed,
    );
    e.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_inf_and_families_appear_on_use() {
        let mut e = Exposition::default();
        e.histogram_seconds(
            "x_latency",
            "L",
            vec![("op", "a".into())],
            &[0.001, 0.01],
            &[2, 3, 1],
            0.5,
        );
        let t = crate::metrics::to_prometheus_text(&e.render());
        assert!(
            t.contains("sidecore_x_latency_seconds_bucket{le=\"0.001\",op=\"a\"} 2"),
            "{t}"
        );
        assert!(t.contains("le=\"0.01\",op=\"a\"} 5"), "{t}");
        assert!(t.contains("le=\"+Inf\",op=\"a\"} 6"), "{t}");
        assert!(
            t.contains("sidecore_x_latency_seconds_count{op=\"a\"} 6"),
            "{t}"
        );
        assert!(!t.contains("_total"), "no counter was written: {t}");
    }
}
