//! The Prometheus exposition of a [`Snapshot`], with the `prometheus-client`
//! crate: every family is built fresh from the picture at scrape time (the
//! "constant metrics" pattern of exporters that mirror another system's
//! counters), so the data path keeps its plain atomics and pays nothing for
//! being scraped.
//!
//! Names follow Prometheus' conventions: the `sidecore_` prefix, base units
//! (seconds, bytes, ratios), `_total` on counters (the crate appends it).
//! [`FAMILIES`] lists every family with its type and unit; the metrics test
//! checks a scrape against it and `promtool check metrics` checks the text.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::snapshot::Snapshot;

/// Label pairs of one series.
type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// Every family the daemon exposes: (name as scraped, type).
pub const FAMILIES: &[(&str, &str)] = &[
    ("sidecore_app_uptime_seconds", "gauge"),
    ("sidecore_app_running", "gauge"),
    ("sidecore_offcode_running", "gauge"),
    ("sidecore_offcode_uptime_seconds", "gauge"),
    ("sidecore_offcode_messages_handled_total", "counter"),
    ("sidecore_offcode_messages_sent_total", "counter"),
    ("sidecore_offcode_messages_dropped_total", "counter"),
    ("sidecore_offcode_turns_total", "counter"),
    ("sidecore_offcode_records_total", "counter"),
    ("sidecore_offcode_bytes_total", "counter"),
    ("sidecore_offcode_overruns_total", "counter"),
    ("sidecore_offcode_reported", "gauge"),
    ("sidecore_channel_messages_total", "counter"),
    ("sidecore_channel_dropped_total", "counter"),
    ("sidecore_channel_backpressure_total", "counter"),
    ("sidecore_channel_occupancy_messages", "gauge"),
    ("sidecore_channel_capacity_messages", "gauge"),
    ("sidecore_pe_cpu_capacity", "gauge"),
    ("sidecore_pe_allocated_ratio", "gauge"),
    ("sidecore_pe_busy_ratio", "gauge"),
    ("sidecore_wasm_admissions_total", "counter"),
    ("sidecore_wasm_violations_total", "counter"),
    ("sidecore_wasm_unloads_total", "counter"),
    ("sidecore_firewall_verdicts_total", "counter"),
    ("sidecore_events_total", "counter"),
];

/// Offcode metrics with a family of their own; the rest go to
/// `sidecore_offcode_reported{name="..."}`.
const NAMED: &[&str] = &[
    "records",
    "bytes",
    "violations",
    "accepted",
    "denied",
    "default_denied",
];

/// The registry with every family, filled from `snap`.
struct Families {
    app_uptime: Gauges,
    app_running: Gauges,
    oc_running: Gauges,
    oc_uptime: Gauges,
    handled: Counters,
    sent: Counters,
    dropped: Counters,
    turns: Counters,
    records: Counters,
    bytes: Counters,
    overruns: Counters,
    other: Gauges,
    ch_messages: Counters,
    ch_dropped: Counters,
    ch_backpressure: Counters,
    ch_occupancy: Gauges,
    ch_capacity: Gauges,
    pe_cpu: Gauges,
    pe_allocated: Gauges,
    pe_busy: Gauges,
    wasm_admissions: Counters,
    wasm_violations: Counters,
    wasm_unloads: Counters,
    verdicts: Counters,
    events: Counters,
}

fn families(reg: &mut Registry) -> Families {
    let f = Families {
        app_uptime: Gauges::default(),
        app_running: Gauges::default(),
        oc_running: Gauges::default(),
        oc_uptime: Gauges::default(),
        handled: Counters::default(),
        sent: Counters::default(),
        dropped: Counters::default(),
        turns: Counters::default(),
        records: Counters::default(),
        bytes: Counters::default(),
        overruns: Counters::default(),
        other: Gauges::default(),
        ch_messages: Counters::default(),
        ch_dropped: Counters::default(),
        ch_backpressure: Counters::default(),
        ch_occupancy: Gauges::default(),
        ch_capacity: Gauges::default(),
        pe_cpu: Gauges::default(),
        pe_allocated: Gauges::default(),
        pe_busy: Gauges::default(),
        wasm_admissions: Counters::default(),
        wasm_violations: Counters::default(),
        wasm_unloads: Counters::default(),
        verdicts: Counters::default(),
        events: Counters::default(),
    };
    let secs = Unit::Seconds;
    let msgs = Unit::Other("messages".into());
    let ratio = Unit::Other("ratio".into());
    reg.register_with_unit(
        "app_uptime",
        "Time since the app was deployed",
        secs.clone(),
        f.app_uptime.clone(),
    );
    reg.register(
        "app_running",
        "1 while the app runs, 0 once it stopped",
        f.app_running.clone(),
    );
    reg.register(
        "offcode_running",
        "1 while the offcode runs, 0 otherwise; labels carry its PE and state",
        f.oc_running.clone(),
    );
    reg.register_with_unit(
        "offcode_uptime",
        "Time since the offcode landed",
        secs,
        f.oc_uptime.clone(),
    );
    reg.register(
        "offcode_messages_handled",
        "Messages the offcode took from its inputs",
        f.handled.clone(),
    );
    reg.register(
        "offcode_messages_sent",
        "Messages the offcode's outputs sent",
        f.sent.clone(),
    );
    reg.register(
        "offcode_messages_dropped",
        "Messages the offcode's unreliable outputs dropped",
        f.dropped.clone(),
    );
    reg.register(
        "offcode_turns",
        "Executor turns the offcode had",
        f.turns.clone(),
    );
    reg.register(
        "offcode_records",
        "Records the offcode processed (its own `records` counter)",
        f.records.clone(),
    );
    reg.register_with_unit(
        "offcode",
        "Bytes the offcode processed (its own `bytes` counter)",
        Unit::Bytes,
        f.bytes.clone(),
    );
    reg.register(
        "offcode_overruns",
        "Watchdog expiries and preempted overruns of the offcode",
        f.overruns.clone(),
    );
    reg.register(
        "offcode_reported",
        "Other values an offcode reports, by name",
        f.other.clone(),
    );
    reg.register(
        "channel_messages",
        "Messages sent into the channel (local rings)",
        f.ch_messages.clone(),
    );
    reg.register(
        "channel_dropped",
        "Messages the channel dropped because it was full",
        f.ch_dropped.clone(),
    );
    reg.register(
        "channel_backpressure",
        "Times a reliable sender waited for space in the channel",
        f.ch_backpressure.clone(),
    );
    reg.register_with_unit(
        "channel_occupancy",
        "Messages in the channel not yet released by its slowest receiver",
        msgs.clone(),
        f.ch_occupancy.clone(),
    );
    reg.register_with_unit(
        "channel_capacity",
        "Slots in the channel",
        msgs,
        f.ch_capacity.clone(),
    );
    reg.register(
        "pe_cpu_capacity",
        "The PE's CPU capacity in cores",
        f.pe_cpu.clone(),
    );
    reg.register_with_unit(
        "pe_allocated",
        "Share of the PE's CPU that running apps hold",
        ratio.clone(),
        f.pe_allocated.clone(),
    );
    reg.register_with_unit(
        "pe_busy",
        "Busy share of a core PE over the last second (/proc/stat)",
        ratio,
        f.pe_busy.clone(),
    );
    reg.register(
        "wasm_admissions",
        "Wasm extensions admitted by the verifier and initialized",
        f.wasm_admissions.clone(),
    );
    reg.register(
        "wasm_violations",
        "Resource violations of Wasm extensions",
        f.wasm_violations.clone(),
    );
    reg.register(
        "wasm_unloads",
        "Wasm extensions unloaded after a failure or violation",
        f.wasm_unloads.clone(),
    );
    reg.register(
        "firewall_verdicts",
        "Packets each firewall offcode judged, by verdict",
        f.verdicts.clone(),
    );
    reg.register("events", "Runtime events by kind", f.events.clone());
    f
}

fn gauge(f: &Gauges, l: Labels, v: f64) {
    f.get_or_create(&l).set(v);
}

fn count(f: &Counters, l: Labels, v: u64) {
    f.get_or_create(&l).inc_by(v);
}

/// Renders `snap` in the OpenMetrics text format, as `prometheus-client`
/// writes it.
pub fn render(snap: &Snapshot) -> String {
    let mut reg = Registry::with_prefix("sidecore");
    let f = families(&mut reg);
    fill_apps(&f, snap);
    fill_pes(&f, snap);
    let e = &snap.events;
    count(&f.wasm_admissions, Vec::new(), e.wasm_admitted);
    count(&f.wasm_unloads, Vec::new(), e.wasm_unloaded);
    for (kind, n) in &e.by_kind {
        count(&f.events, vec![("kind", kind.clone())], *n);
    }
    let mut out = String::new();
    // Writing into a String cannot fail; an error here would be a bug in the
    // crate's encoder, and an empty scrape says so without taking the daemon down.
    if encode(&mut out, &reg).is_err() {
        tracing::error!("the metrics encoder failed");
        out.clear();
    }
    out
}

fn fill_apps(f: &Families, snap: &Snapshot) {
    for a in &snap.apps {
        let app = vec![("app", a.name.clone())];
        gauge(&f.app_uptime, app.clone(), a.uptime_ms as f64 / 1e3);
        let running = matches!(a.state, sidecore_types::AppState::Running);
        gauge(&f.app_running, app, f64::from(u8::from(running)));
        for o in &a.offcodes {
            let l: Labels = vec![("app", a.name.clone()), ("offcode", o.name.clone())];
            let mut info = l.clone();
            info.extend([
                ("implementation", o.implementation.clone()),
                ("pe", o.pe.clone()),
            ]);
            let run = matches!(o.state, sidecore_types::OffcodeState::Running);
            gauge(&f.oc_running, info, f64::from(u8::from(run)));
            gauge(&f.oc_uptime, l.clone(), o.uptime_ms as f64 / 1e3);
            count(&f.handled, l.clone(), o.handled);
            count(&f.sent, l.clone(), o.sent);
            count(&f.dropped, l.clone(), o.dropped);
            count(&f.turns, l.clone(), o.turns);
            fill_offcode_metrics(f, snap, &l, o);
        }
        for c in &a.channels {
            let l: Labels = vec![
                ("app", a.name.clone()),
                ("channel", c.name.clone()),
                ("transport", c.transport.clone()),
            ];
            if !c.probed {
                continue;
            }
            count(&f.ch_messages, l.clone(), c.messages);
            count(&f.ch_dropped, l.clone(), c.dropped);
            count(&f.ch_backpressure, l.clone(), c.backpressure);
            gauge(&f.ch_occupancy, l.clone(), c.occupancy as f64);
            gauge(&f.ch_capacity, l, c.capacity as f64);
        }
    }
}

fn fill_offcode_metrics(
    f: &Families,
    snap: &Snapshot,
    l: &Labels,
    o: &sidecore_types::OffcodeStatus,
) {
    let m = |k: &str| o.metrics.get(k).copied();
    if let Some(v) = m("records") {
        count(&f.records, l.clone(), v);
    }
    if let Some(v) = m("bytes") {
        count(&f.bytes, l.clone(), v);
    }
    let key = (l[0].1.clone(), l[1].1.clone());
    let overruns =
        snap.events.overruns.get(&key).copied().unwrap_or(0) + m("preempted_overruns").unwrap_or(0);
    count(&f.overruns, l.clone(), overruns);
    if let Some(v) = m("violations") {
        count(&f.wasm_violations, l.clone(), v);
    }
    if o.implementation == "firewall" {
        for (verdict, key) in [
            ("accept", "accepted"),
            ("deny", "denied"),
            ("default_deny", "default_denied"),
        ] {
            let mut vl = l.clone();
            vl.push(("verdict", verdict.into()));
            count(&f.verdicts, vl, m(key).unwrap_or(0));
        }
    }
    for (k, v) in o
        .metrics
        .iter()
        .filter(|(k, _)| !NAMED.contains(&k.as_str()))
    {
        let mut cl = l.clone();
        cl.push(("name", k.clone()));
        gauge(&f.other, cl, *v as f64);
    }
}

fn fill_pes(f: &Families, snap: &Snapshot) {
    for p in &snap.pes {
        let l: Labels = vec![("pe", p.id.clone()), ("kind", p.kind.clone())];
        gauge(&f.pe_cpu, l.clone(), p.cpu);
        let share = if p.cpu > 0.0 {
            p.allocated / p.cpu
        } else {
            0.0
        };
        gauge(&f.pe_allocated, l.clone(), share);
        if let Some(b) = p.busy {
            gauge(&f.pe_busy, l, b);
        }
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition, for
/// scrapers and tools that ask for it (`promtool check metrics`, older
/// Prometheus servers). `prometheus-client` writes only OpenMetrics, and the
/// two differ in three places: a counter family's HELP and TYPE lines name it
/// with its `_total` suffix, and there are no `# UNIT` or `# EOF` lines.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_becomes_prometheus_text() {
        let om = "# HELP x_turns Turns.\n# TYPE x_turns counter\nx_turns_total{a=\"1\"} 3\n\
                  # HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up seconds\nx_up 1.0\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP x_turns_total Turns.\n# TYPE x_turns_total counter\nx_turns_total{a=\"1\"} 3\n\
             # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1.0\n"
        );
    }
}
