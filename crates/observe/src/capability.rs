//! The capability panels of the dashboard, built from what a scraped service
//! exposes on its own `/metrics` (`sikker agent`, `filewall run`, `orion
//! watch`, `tcps serve`, each with `--metrics ADDR`): the service is known by
//! its families (`sidecore_sikker_*`, …), and each kind gets the rows an
//! operator looks for — Sikker's checks, denials by kind and SE-TRE rates;
//! FileWall's operations and their latency; Orion's sensors, liveness and
//! repairs; TCPServers' PPE queues — with per-second rates from the previous
//! scrape. Also the families relayed through the daemon's own `/metrics`
//! with a `service` label ([`RELAYED`]). Sans-IO: samples in, rows out.

use serde::Serialize;

/// Most rows one panel shows.
const MAX_ROWS: usize = 24;
/// Most per-operation rows of a FileWall panel (by calls, busiest first).
const MAX_OPS: usize = 6;
/// Most implicit sensors an Orion panel lists by name.
const MAX_SENSORS: usize = 6;

/// One sample of a scrape: a family's series with its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `k`, if set.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// A series as the text format writes it (`name{a="x",b="y\"z"}`), split
/// into its name and labels; `None` if it is not one.
pub fn parse_series(series: &str) -> Option<(String, Vec<(String, String)>)> {
    let Some((name, rest)) = series.split_once('{') else {
        return valid_name(series).then(|| (series.to_string(), Vec::new()));
    };
    if !valid_name(name) {
        return None;
    }
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let key = key.trim_start_matches(',').trim().to_string();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key, value));
    }
    Some((name.to_string(), labels))
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// One row of a panel: a value with its unit, or a word.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub key: String,
    pub value: f64,
    /// `""` (a count), `"/s"`, `"ms"`, `"B/s"`.
    pub unit: &'static str,
    /// A word instead of a number (Orion's liveness state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// The panel of one scraped service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capability {
    /// `sikker`, `filewall`, `orion` or `tcps`.
    pub kind: &'static str,
    /// `Sikker`, `FileWall`, `Orion`, `TCPServers`.
    pub title: &'static str,
    pub rows: Vec<Row>,
}

/// A scrape's samples with the one before it, for rates.
pub struct Scrapes<'a> {
    pub now: &'a [Sample],
    pub before: Option<&'a [Sample]>,
    /// Seconds between the two.
    pub dt_s: f64,
}

impl Scrapes<'_> {
    /// The sum of family `name`'s series whose labels include `want`.
    fn sum_in(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let mut found = false;
        let mut s = 0.0;
        for x in samples.iter().filter(|x| x.name == name) {
            if want.iter().all(|(k, v)| x.label(k) == Some(v)) {
                found = true;
                s += x.value;
            }
        }
        found.then_some(s)
    }

    fn sum(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        Self::sum_in(self.now, name, want)
    }

    /// The per-second rate of that sum since the previous scrape (0 for a
    /// counter that went back: the service restarted).
    fn rate(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let now = self.sum(name, want)?;
        let before = Self::sum_in(self.before?, name, want)?;
        (self.dt_s > 0.0).then(|| ((now - before) / self.dt_s).max(0.0))
    }

    /// The distinct values of label `k` in family `name`, in first-seen order.
    fn values_of(&self, name: &str, k: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for x in self.now.iter().filter(|x| x.name == name) {
            if let Some(v) = x.label(k)
                && !out.iter().any(|o| o == v)
            {
                out.push(v.to_string());
            }
        }
        out
    }
}

/// Rows in the making.
#[derive(Default)]
struct Rows(Vec<Row>);

impl Rows {
    fn num(&mut self, key: impl Into<String>, value: Option<f64>, unit: &'static str) {
        if let Some(value) = value {
            self.0.push(Row {
                key: key.into(),
                value,
                unit,
                text: None,
            });
        }
    }

    fn word(&mut self, key: impl Into<String>, text: impl Into<String>) {
        self.0.push(Row {
            key: key.into(),
            value: 0.0,
            unit: "",
            text: Some(text.into()),
        });
    }
}

/// The panel for a scrape, if the service is one the dashboard knows.
pub fn capability(s: &Scrapes<'_>) -> Option<Capability> {
    let has = |prefix: &str| s.now.iter().any(|x| x.name.starts_with(prefix));
    let (kind, title, rows) = if has("sidecore_sikker_") {
        ("sikker", "Sikker", sikker(s))
    } else if has("sidecore_filewall_") {
        ("filewall", "FileWall", filewall(s))
    } else if has("sidecore_orion_") {
        ("orion", "Orion", orion(s))
    } else if has("sidecore_tcps_") {
        ("tcps", "TCPServers", tcps(s))
    } else {
        return None;
    };
    let mut rows = rows.0;
    rows.truncate(MAX_ROWS);
    Some(Capability { kind, title, rows })
}

/// Sikker: messages checked (at the sender, and from peers), denials by
/// kind, SE-TRE rates per limit.
fn sikker(s: &Scrapes<'_>) -> Rows {
    let mut r = Rows::default();
    let msgs = "sidecore_sikker_messages_total";
    // Checked at this agent: what its processes sent, and what its peers
    // forwarded to it (checked again at the receiver).
    let (sent, peers) = ([("what", "sent")], [("what", "received_from_peers")]);
    let plus = |a: Option<f64>, b: Option<f64>| a.map(|a| a + b.unwrap_or(0.0));
    r.num(
        "checks/s",
        plus(s.rate(msgs, &sent), s.rate(msgs, &peers)),
        "/s",
    );
    r.num("checks", plus(s.sum(msgs, &sent), s.sum(msgs, &peers)), "");
    r.num("delivered", s.sum(msgs, &[("what", "delivered")]), "");
    let denials = "sidecore_sikker_denials_total";
    r.num("denied", s.sum(denials, &[]).or(Some(0.0)), "");
    r.num("denied/s", s.rate(denials, &[]), "/s");
    for kind in s.values_of(denials, "kind") {
        r.num(
            format!("denied: {kind}"),
            s.sum(denials, &[("kind", &kind)]),
            "",
        );
    }
    let rate = "sidecore_sikker_rate_bytes_per_second";
    for limit in s.values_of(rate, "limit") {
        r.num(
            format!("SE-TRE rate, limit {limit}"),
            s.sum(rate, &[("limit", &limit)]),
            "B/s",
        );
    }
    r.num(
        "processes attached",
        s.sum("sidecore_sikker_attachments_total", &[]),
        "",
    );
    r.num(
        "policy updates",
        s.sum("sidecore_sikker_policy_updates_total", &[]),
        "",
    );
    r
}

/// FileWall: operations and their rate, the busiest operations with their
/// mean latency, denials and drops.
fn filewall(s: &Scrapes<'_>) -> Rows {
    let mut r = Rows::default();
    let ops = "sidecore_filewall_operations_total";
    let call = [("kind", "call")];
    r.num("operations/s", s.rate(ops, &call), "/s");
    r.num("operations", s.sum(ops, &call), "");
    let mut by_op: Vec<(String, f64)> = s
        .values_of(ops, "op")
        .into_iter()
        .filter_map(|op| {
            let n = s.sum(ops, &[("op", &op), ("kind", "call")])?;
            Some((op, n))
        })
        .collect();
    by_op.sort_by(|a, b| b.1.total_cmp(&a.1));
    let lat = "sidecore_filewall_operation_latency_seconds";
    for (op, n) in by_op.into_iter().take(MAX_OPS) {
        r.num(format!("{op}: calls"), Some(n), "");
        let sum = s.sum(&format!("{lat}_sum"), &[("op", &op)]);
        let count = s.sum(&format!("{lat}_count"), &[("op", &op)]);
        if let (Some(sum), Some(count)) = (sum, count)
            && count > 0.0
        {
            r.num(format!("{op}: mean latency"), Some(sum / count * 1e3), "ms");
        }
    }
    r.num("denied", s.sum("sidecore_filewall_denials_total", &[]), "");
    r.num("dropped", s.sum("sidecore_filewall_drops_total", &[]), "");
    r
}

/// Orion: the target and its liveness, the liveness sensor, fetches, the
/// sensors read, repairs.
fn orion(s: &Scrapes<'_>) -> Rows {
    let mut r = Rows::default();
    let state = s
        .now
        .iter()
        .find(|x| x.name == "sidecore_orion_target_state" && x.value >= 1.0);
    if let Some(st) = state {
        r.word("target", st.label("target").unwrap_or("?"));
        r.word("liveness", st.label("state").unwrap_or("?"));
    }
    if let Some(l) = s
        .now
        .iter()
        .find(|x| x.name == "sidecore_orion_liveness_sensor")
    {
        let sensor = l.label("sensor").unwrap_or("sensor");
        r.num(format!("liveness sensor {sensor}"), Some(l.value), "");
    }
    let fetches = "sidecore_orion_fetches_total";
    r.num("fetches/s", s.rate(fetches, &[]), "/s");
    r.num("fetches", s.sum(fetches, &[]), "");
    let mut implicit: Vec<&Sample> = s
        .now
        .iter()
        .filter(|x| x.name == "sidecore_orion_sensor")
        .collect();
    // The CPU, process and cgroup counters before the many vmstat ones.
    let rank = |x: &Sample| {
        let name = x.label("sensor").unwrap_or("");
        (u8::from(name.starts_with("vmstat.")), name.to_string())
    };
    implicit.sort_by_key(|x| rank(x));
    let explicit = s.sum("sidecore_orion_explicit_sensors", &[]).unwrap_or(0.0);
    #[allow(clippy::cast_precision_loss)] // a count of sensors
    r.num("sensors", Some(implicit.len() as f64 + explicit), "");
    r.num("repairs", s.sum("sidecore_orion_repairs_total", &[]), "");
    r.num(
        "processes killed",
        s.sum("sidecore_orion_processes_killed_total", &[]),
        "",
    );
    r.num(
        "liveness transitions",
        s.sum("sidecore_orion_transitions_total", &[]),
        "",
    );
    for x in implicit.iter().take(MAX_SENSORS) {
        let name = x.label("sensor").unwrap_or("?");
        r.num(format!("sensor {name}"), Some(x.value), "");
    }
    r
}

/// TCPServers: per PPE its connections, accepts and full receive queues;
/// bytes in and out per second.
fn tcps(s: &Scrapes<'_>) -> Rows {
    let mut r = Rows::default();
    r.num(
        "bytes in/s",
        s.rate("sidecore_tcps_bytes_received_total", &[]),
        "B/s",
    );
    r.num(
        "bytes out/s",
        s.rate("sidecore_tcps_bytes_sent_total", &[]),
        "B/s",
    );
    for ppe in s.values_of("sidecore_tcps_connections", "ppe") {
        let p = [("ppe", ppe.as_str())];
        let active = s.sum("sidecore_tcps_ppe_active", &p).unwrap_or(0.0) >= 1.0;
        r.word(format!("PPE {ppe}"), if active { "active" } else { "idle" });
        r.num(
            format!("PPE {ppe}: connections"),
            s.sum("sidecore_tcps_connections", &p),
            "",
        );
        r.num(
            format!("PPE {ppe}: accepted/s"),
            s.rate("sidecore_tcps_accepted_total", &p),
            "/s",
        );
        r.num(
            format!("PPE {ppe}: receive queue full"),
            s.sum("sidecore_tcps_receive_queue_full_total", &p),
            "",
        );
    }
    let picks = "sidecore_tcps_scheduler_picks_total";
    for q in s.values_of(picks, "queue") {
        r.num(
            format!("scheduler picks: {q}"),
            s.sum(picks, &[("queue", &q)]),
            "",
        );
    }
    r
}

/// A family relayed through the daemon's `/metrics` with a `service` label:
/// (name as the service writes it, name registered without the `sidecore_`
/// prefix and `_total` or unit suffix, counter?, unit suffix, help).
pub type RelayedFamily = (&'static str, &'static str, bool, &'static str, &'static str);

/// The services' key families the daemon relays (histograms are not).
pub const RELAYED: &[RelayedFamily] = &[
    (
        "sidecore_sikker_messages_total",
        "sikker_messages",
        true,
        "",
        "Messages a scraped Sikker agent checked, by what became of them",
    ),
    (
        "sidecore_sikker_denials_total",
        "sikker_denials",
        true,
        "",
        "Messages a scraped Sikker agent denied, by kind",
    ),
    (
        "sidecore_sikker_rate_bytes_per_second",
        "sikker_rate",
        false,
        "bytes_per_second",
        "SE-TRE fill rate a scraped Sikker agent holds per limit",
    ),
    (
        "sidecore_filewall_operations_total",
        "filewall_operations",
        true,
        "",
        "NFS and MOUNT calls and replies through a scraped FileWall, by operation",
    ),
    (
        "sidecore_filewall_denials_total",
        "filewall_denials",
        true,
        "",
        "Calls a scraped FileWall answered without the server",
    ),
    (
        "sidecore_filewall_drops_total",
        "filewall_drops",
        true,
        "",
        "Calls or records a scraped FileWall dropped",
    ),
    (
        "sidecore_orion_target_state",
        "orion_target_state",
        false,
        "",
        "1 for the liveness state of a scraped Orion watch's target",
    ),
    (
        "sidecore_orion_fetches_total",
        "orion_fetches",
        true,
        "",
        "Views a scraped Orion watch fetched",
    ),
    (
        "sidecore_orion_repairs_total",
        "orion_repairs",
        true,
        "",
        "Repairs a scraped Orion watch did",
    ),
    (
        "sidecore_orion_processes_killed_total",
        "orion_processes_killed",
        true,
        "",
        "Processes a scraped Orion watch's repairs killed",
    ),
    (
        "sidecore_tcps_connections",
        "tcps_connections",
        false,
        "",
        "Connections each PPE of a scraped TCPServers owns",
    ),
    (
        "sidecore_tcps_accepted_total",
        "tcps_accepted",
        true,
        "",
        "Connections each PPE of a scraped TCPServers accepted",
    ),
    (
        "sidecore_tcps_receive_queue_full_total",
        "tcps_receive_queue_full",
        true,
        "",
        "Times a scraped TCPServers' receive queue was full",
    ),
];

/// The samples of a scrape the daemon relays.
pub fn relayed(samples: &[Sample]) -> Vec<Sample> {
    samples
        .iter()
        .filter(|x| RELAYED.iter().any(|f| f.0 == x.name))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(text: &str) -> Vec<Sample> {
        text.lines()
            .filter_map(|l| {
                let (series, v) = l.rsplit_once(' ')?;
                let (name, labels) = parse_series(series)?;
                Some(Sample {
                    name,
                    labels,
                    value: v.parse().ok()?,
                })
            })
            .collect()
    }

    fn row<'a>(c: &'a Capability, key: &str) -> &'a Row {
        c.rows
            .iter()
            .find(|r| r.key == key)
            .unwrap_or_else(|| panic!("no row {key}: {c:?}"))
    }

    #[test]
    fn series_split_into_names_and_labels_with_escapes() {
        assert_eq!(parse_series("up"), Some(("up".into(), vec![])));
        assert_eq!(
            parse_series(r#"a_total{x="1 2",y="q\"z\\"}"#),
            Some((
                "a_total".into(),
                vec![("x".into(), "1 2".into()), ("y".into(), "q\"z\\".into())]
            ))
        );
        assert_eq!(parse_series("a{x=1}"), None);
        assert_eq!(parse_series("a{x=\"1\""), None);
        assert_eq!(parse_series("bad name"), None);
    }

    #[test]
    fn sikker_rows_count_checks_denials_by_kind_and_rates() {
        let before = samples(
            "sidecore_sikker_messages_total{host=\"h\",what=\"sent\"} 100\n\
             sidecore_sikker_messages_total{host=\"h\",what=\"received_from_peers\"} 0",
        );
        let now = samples(
            "sidecore_sikker_messages_total{host=\"h\",what=\"sent\"} 300\n\
             sidecore_sikker_messages_total{host=\"h\",what=\"received_from_peers\"} 100\n\
             sidecore_sikker_messages_total{host=\"h\",what=\"delivered\"} 250\n\
             sidecore_sikker_denials_total{host=\"h\",kind=\"no_permission\"} 7\n\
             sidecore_sikker_denials_total{host=\"h\",kind=\"rate\"} 3\n\
             sidecore_sikker_rate_bytes_per_second{host=\"h\",limit=\"0\"} 1250000",
        );
        let c = capability(&Scrapes {
            now: &now,
            before: Some(&before),
            dt_s: 2.0,
        })
        .unwrap();
        assert_eq!((c.kind, c.title), ("sikker", "Sikker"));
        assert_eq!(row(&c, "checks/s").value, 150.0);
        assert_eq!(row(&c, "checks").value, 400.0);
        assert_eq!(row(&c, "denied").value, 10.0);
        assert_eq!(row(&c, "denied: no_permission").value, 7.0);
        assert_eq!(row(&c, "SE-TRE rate, limit 0").unit, "B/s");
        // No earlier scrape: no rates, the rest as is.
        let c = capability(&Scrapes {
            now: &now,
            before: None,
            dt_s: 0.0,
        })
        .unwrap();
        assert!(c.rows.iter().all(|r| r.unit != "/s"), "{c:?}");
    }

    #[test]
    fn filewall_orion_and_tcps_panels() {
        let fw = samples(
            "sidecore_filewall_operations_total{proxy=\"p\",op=\"READ\",kind=\"call\"} 90\n\
             sidecore_filewall_operations_total{proxy=\"p\",op=\"GETATTR\",kind=\"call\"} 10\n\
             sidecore_filewall_operation_latency_seconds_sum{proxy=\"p\",op=\"READ\"} 0.09\n\
             sidecore_filewall_operation_latency_seconds_count{proxy=\"p\",op=\"READ\"} 90",
        );
        let c = capability(&Scrapes {
            now: &fw,
            before: None,
            dt_s: 1.0,
        })
        .unwrap();
        assert_eq!(c.kind, "filewall");
        // No earlier scrape, so no rate row first.
        assert_eq!(c.rows[0].key, "operations");
        assert_eq!(c.rows[1].key, "READ: calls", "busiest first: {c:?}");
        assert!((row(&c, "READ: mean latency").value - 1.0).abs() < 1e-9);
        let or = samples(
            "sidecore_orion_sensor{target=\"host\",sensor=\"stat.ctxt\"} 5\n\
             sidecore_orion_target_state{target=\"host\",state=\"alive\"} 1\n\
             sidecore_orion_target_state{target=\"host\",state=\"dead\"} 0\n\
             sidecore_orion_fetches_total{target=\"host\"} 40",
        );
        let c = capability(&Scrapes {
            now: &or,
            before: None,
            dt_s: 1.0,
        })
        .unwrap();
        assert_eq!(row(&c, "liveness").text.as_deref(), Some("alive"));
        assert_eq!(row(&c, "sensors").value, 1.0);
        assert_eq!(row(&c, "fetches").value, 40.0);
        let tc = samples(
            "sidecore_tcps_ppe_active{ppe=\"1\",master=\"true\"} 1\n\
             sidecore_tcps_connections{ppe=\"1\",master=\"true\"} 3\n\
             sidecore_tcps_receive_queue_full_total{ppe=\"1\",master=\"true\"} 2",
        );
        let c = capability(&Scrapes {
            now: &tc,
            before: None,
            dt_s: 1.0,
        })
        .unwrap();
        assert_eq!(row(&c, "PPE 1").text.as_deref(), Some("active"));
        assert_eq!(row(&c, "PPE 1: receive queue full").value, 2.0);
        assert!(
            capability(&Scrapes {
                now: &samples("other_total 1"),
                before: None,
                dt_s: 1.0
            })
            .is_none()
        );
        assert_eq!(relayed(&tc).len(), 2);
    }
}
