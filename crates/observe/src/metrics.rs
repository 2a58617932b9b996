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

use prometheus_client::registry::Unit;

use crate::capability::RELAYED;
use crate::exporters::{Exposition, Labels};
use crate::snapshot::Snapshot;

/// Every family the daemon exposes: (name as scraped, type, unit). The unit
/// is the one OpenMetrics declares (`# UNIT`) and the name's suffix; "" for
/// none (counts, states).
pub const FAMILIES: &[(&str, &str, &str)] = &[
    ("sidecore_app_uptime_seconds", "gauge", "seconds"),
    ("sidecore_app_running", "gauge", ""),
    ("sidecore_offcode_running", "gauge", ""),
    ("sidecore_offcode_uptime_seconds", "gauge", "seconds"),
    ("sidecore_offcode_messages_handled_total", "counter", ""),
    ("sidecore_offcode_messages_sent_total", "counter", ""),
    ("sidecore_offcode_messages_dropped_total", "counter", ""),
    ("sidecore_offcode_turns_total", "counter", ""),
    ("sidecore_offcode_deadline_misses_total", "counter", ""),
    ("sidecore_offcode_records_total", "counter", ""),
    ("sidecore_offcode_bytes_total", "counter", ""),
    ("sidecore_offcode_overruns_total", "counter", ""),
    ("sidecore_offcode_restarts_total", "counter", ""),
    ("sidecore_offcode_reported", "gauge", ""),
    ("sidecore_channel_messages_total", "counter", ""),
    ("sidecore_channel_dropped_total", "counter", ""),
    ("sidecore_channel_backpressure_total", "counter", ""),
    ("sidecore_channel_occupancy_messages", "gauge", "messages"),
    ("sidecore_channel_capacity_messages", "gauge", "messages"),
    ("sidecore_pe_cpu_capacity", "gauge", ""),
    ("sidecore_pe_allocated_ratio", "gauge", "ratio"),
    ("sidecore_pe_busy_ratio", "gauge", "ratio"),
    ("sidecore_wasm_admissions_total", "counter", ""),
    ("sidecore_wasm_violations_total", "counter", ""),
    ("sidecore_wasm_unloads_total", "counter", ""),
    ("sidecore_firewall_verdicts_total", "counter", ""),
    ("sidecore_events_total", "counter", ""),
    ("sidecore_service_up", "gauge", ""),
    // Relayed from the scraped services, with a `service` label
    // (`crate::capability::RELAYED`).
    ("sidecore_sikker_messages_total", "counter", ""),
    ("sidecore_sikker_denials_total", "counter", ""),
    (
        "sidecore_sikker_rate_bytes_per_second",
        "gauge",
        "bytes_per_second",
    ),
    ("sidecore_filewall_operations_total", "counter", ""),
    ("sidecore_filewall_denials_total", "counter", ""),
    ("sidecore_filewall_drops_total", "counter", ""),
    ("sidecore_orion_target_state", "gauge", ""),
    ("sidecore_orion_fetches_total", "counter", ""),
    ("sidecore_orion_repairs_total", "counter", ""),
    ("sidecore_orion_processes_killed_total", "counter", ""),
    ("sidecore_tcps_connections", "gauge", ""),
    ("sidecore_tcps_accepted_total", "counter", ""),
    ("sidecore_tcps_receive_queue_full_total", "counter", ""),
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

/// Renders `snap` in the OpenMetrics text format, as `prometheus-client`
/// writes it. A family appears once it has a series.
pub fn render(snap: &Snapshot) -> String {
    let mut e = Exposition::default();
    for a in &snap.apps {
        let app = || vec![("app", a.name.clone())];
        e.gauge(
            "app_uptime",
            "Time since the app was deployed",
            Some(Unit::Seconds),
            app(),
            a.uptime_ms as f64 / 1e3,
        );
        let running = matches!(a.state, sidecore_types::AppState::Running);
        e.gauge(
            "app_running",
            "1 while the app runs, 0 once it stopped",
            None,
            app(),
            f64::from(u8::from(running)),
        );
        for o in &a.offcodes {
            offcode(&mut e, snap, &a.name, o);
        }
        for c in a.channels.iter().filter(|c| c.probed) {
            channel(&mut e, &a.name, c);
        }
    }
    for p in &snap.pes {
        let l = || vec![("pe", p.id.clone()), ("kind", p.kind.clone())];
        e.gauge(
            "pe_cpu_capacity",
            "The PE's CPU capacity in cores",
            None,
            l(),
            p.cpu,
        );
        let share = if p.cpu > 0.0 {
            p.allocated / p.cpu
        } else {
            0.0
        };
        e.gauge(
            "pe_allocated",
            "Share of the PE's CPU that running apps hold",
            Some(ratio()),
            l(),
            share,
        );
        if let Some(b) = p.busy {
            e.gauge(
                "pe_busy",
                "Busy share of a core PE over the last second (/proc/stat)",
                Some(ratio()),
                l(),
                b,
            );
        }
    }
    for s in &snap.services {
        let l = vec![("service", s.name.clone()), ("addr", s.addr.clone())];
        e.gauge(
            "service_up",
            "1 when the service's /metrics answered the last scrape",
            None,
            l,
            f64::from(u8::from(s.up)),
        );
        relay(&mut e, s);
    }
    let ev = &snap.events;
    e.counter(
        "wasm_admissions",
        "Wasm extensions admitted by the verifier and initialized",
        Vec::new(),
        ev.wasm_admitted,
    );
    e.counter(
        "wasm_unloads",
        "Wasm extensions unloaded after a failure or violation",
        Vec::new(),
        ev.wasm_unloaded,
    );
    for (kind, n) in &ev.by_kind {
        e.counter(
            "events",
            "Runtime events by kind",
            vec![("kind", kind.clone())],
            *n,
        );
    }
    e.render()
}

/// A scraped service's key families, with a `service` label first (a
/// `service` label of its own is dropped).
fn relay(e: &mut Exposition, s: &crate::services::ServiceView) {
    for x in &s.relayed {
        let Some(&(_, name, counter, unit, help)) = RELAYED.iter().find(|f| f.0 == x.name) else {
            continue;
        };
        let mut labels = vec![("service".to_string(), s.name.clone())];
        labels.extend(x.labels.iter().filter(|(k, _)| k != "service").cloned());
        let unit = (!unit.is_empty()).then(|| Unit::Other(unit.into()));
        e.relay(name, help, (counter, unit), &labels, x.value);
    }
}

fn ratio() -> Unit {
    Unit::Other("ratio".into())
}

fn offcode(e: &mut Exposition, snap: &Snapshot, app: &str, o: &sidecore_types::OffcodeStatus) {
    let l = || -> Labels { vec![("app", app.to_string()), ("offcode", o.name.clone())] };
    let mut info = l();
    info.extend([
        ("implementation", o.implementation.clone()),
        ("pe", o.pe.clone()),
    ]);
    let run = matches!(o.state, sidecore_types::OffcodeState::Running);
    e.gauge(
        "offcode_running",
        "1 while the offcode runs, 0 otherwise; labels carry its PE",
        None,
        info,
        f64::from(u8::from(run)),
    );
    e.gauge(
        "offcode_uptime",
        "Time since the offcode landed",
        Some(Unit::Seconds),
        l(),
        o.uptime_ms as f64 / 1e3,
    );
    e.counter(
        "offcode_messages_handled",
        "Messages the offcode took from its inputs",
        l(),
        o.handled,
    );
    e.counter(
        "offcode_messages_sent",
        "Messages the offcode's outputs sent",
        l(),
        o.sent,
    );
    e.counter(
        "offcode_messages_dropped",
        "Messages the offcode's unreliable outputs dropped",
        l(),
        o.dropped,
    );
    e.counter(
        "offcode_turns",
        "Executor turns the offcode had",
        l(),
        o.turns,
    );
    e.counter(
        "offcode_deadline_misses",
        "Periodic jobs of the offcode that ended after their deadline (it ran past its WCET)",
        l(),
        o.deadline_misses,
    );
    e.counter(
        "offcode_restarts",
        "Times the supervisor restarted the offcode after a failure (its restart policy)",
        l(),
        o.restarts,
    );
    own_counters(e, snap, app, o);
}

/// The counters an offcode keeps itself: some have families of their own.
fn own_counters(e: &mut Exposition, snap: &Snapshot, app: &str, o: &sidecore_types::OffcodeStatus) {
    let l = || -> Labels { vec![("app", app.to_string()), ("offcode", o.name.clone())] };
    let m = |k: &str| o.metrics.get(k).copied();
    if let Some(v) = m("records") {
        e.counter(
            "offcode_records",
            "Records the offcode processed (its own `records` counter)",
            l(),
            v,
        );
    }
    if let Some(v) = m("bytes") {
        e.counter(
            "offcode_bytes",
            "Bytes the offcode processed (its own `bytes` counter)",
            l(),
            v,
        );
    }
    let key = (app.to_string(), o.name.clone());
    let overruns =
        snap.events.overruns.get(&key).copied().unwrap_or(0) + m("preempted_overruns").unwrap_or(0);
    e.counter(
        "offcode_overruns",
        "Watchdog expiries and preempted overruns of the offcode",
        l(),
        overruns,
    );
    if let Some(v) = m("violations") {
        e.counter(
            "wasm_violations",
            "Resource violations of Wasm extensions",
            l(),
            v,
        );
    }
    if o.implementation == "firewall" {
        for (verdict, k) in [
            ("accept", "accepted"),
            ("deny", "denied"),
            ("default_deny", "default_denied"),
        ] {
            let mut vl = l();
            vl.push(("verdict", verdict.into()));
            e.counter(
                "firewall_verdicts",
                "Packets each firewall offcode judged, by verdict",
                vl,
                m(k).unwrap_or(0),
            );
        }
    }
    for (k, v) in o
        .metrics
        .iter()
        .filter(|(k, _)| !NAMED.contains(&k.as_str()))
    {
        let mut cl = l();
        cl.push(("name", k.clone()));
        e.gauge(
            "offcode_reported",
            "Other values an offcode reports, by name",
            None,
            cl,
            *v as f64,
        );
    }
}

fn channel(e: &mut Exposition, app: &str, c: &sidecore_types::ChannelStatus) {
    let l = || -> Labels {
        vec![
            ("app", app.to_string()),
            ("channel", c.name.clone()),
            ("transport", c.transport.clone()),
        ]
    };
    let msgs = || Some(Unit::Other("messages".into()));
    e.counter(
        "channel_messages",
        "Messages sent into the channel (local rings)",
        l(),
        c.messages,
    );
    e.counter(
        "channel_dropped",
        "Messages the channel dropped because it was full",
        l(),
        c.dropped,
    );
    e.counter(
        "channel_backpressure",
        "Times a reliable sender waited for space in the channel",
        l(),
        c.backpressure,
    );
    e.gauge(
        "channel_occupancy",
        "Messages in the channel not yet released by its slowest receiver",
        msgs(),
        l(),
        c.occupancy as f64,
    );
    e.gauge(
        "channel_capacity",
        "Slots in the channel",
        msgs(),
        l(),
        c.capacity as f64,
    );
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
    fn relayed_families_are_on_the_list_with_their_names() {
        for &(scraped, base, counter, unit, _) in RELAYED {
            let kind = if counter { "counter" } else { "gauge" };
            assert!(FAMILIES.contains(&(scraped, kind, unit)), "{scraped}");
            let unit = if unit.is_empty() {
                String::new()
            } else {
                format!("_{unit}")
            };
            let total = if counter { "_total" } else { "" };
            assert_eq!(scraped, format!("sidecore_{base}{unit}{total}"));
        }
    }

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
