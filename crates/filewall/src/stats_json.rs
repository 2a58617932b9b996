//! FileWall's counters as JSON (what the control socket sends and `sidecore
//! filewall stats --json` prints) and as text, rendered from that JSON.

use std::fmt::Write as _;

use crate::engine::ProxyStats;

/// The counters of one proxy as JSON: what the control socket sends.
pub fn to_json(label: &str, s: &ProxyStats) -> serde_json::Value {
    let ops: serde_json::Map<String, serde_json::Value> = s
        .ops
        .iter()
        .map(|(n, c)| {
            (
                n.clone(),
                serde_json::json!({"calls": c.calls, "replies": c.replies}),
            )
        })
        .collect();
    let latency: serde_json::Map<String, serde_json::Value> = s
        .latency
        .iter()
        .map(|(n, h)| {
            let mean_us = (h.sum_ns / 1000).checked_div(h.count).unwrap_or(0);
            (
                n.clone(),
                serde_json::json!({"count": h.count, "mean_us": mean_us}),
            )
        })
        .collect();
    let flows: Vec<serde_json::Value> = s
        .policies
        .flows
        .iter()
        .map(|((flow, op), f)| {
            serde_json::json!({
                "flow": flow, "op": op, "calls": f.calls, "replies": f.replies,
                "call_bytes": f.call_bytes, "reply_bytes": f.reply_bytes,
                "latency_mean_us": f.mean_latency_us(), "latency_max_us": f.latency_max_us,
            })
        })
        .collect();
    serde_json::json!({
        "proxy": label,
        "refused": s.refused_calls, "dropped": s.dropped_records,
        "closed": s.closed_connections, "retransmissions": s.retransmissions,
        "overflows": s.overflows, "timeouts": s.timeouts, "unmatched": s.unmatched_replies,
        "server_errors": s.server_errors, "buffer_drops": s.policy_buffer_drops,
        "bad_handles": s.policies.bad_handles, "oversize_handles": s.policies.oversize_handles,
        "temporal_denied": s.policies.temporal_denied,
        "udp_datagrams": s.udp_datagrams,
        "replicas": s.policies.replicas.iter().enumerate().map(|(i, r)| serde_json::json!({
            "replica": i, "alive": r.alive, "sent": r.sent, "replied": r.replied,
            "timed_out": r.timed_out, "unmapped": r.unmapped,
        })).collect::<Vec<_>>(),
        "replica_divergences": s.policies.replica_divergences,
        "rbac": {
            "allowed": s.policies.rbac.allowed, "denied": s.policies.rbac.denied,
            "logged": s.policies.rbac.logged, "alarms": s.policies.rbac.alarms,
            "threats": s.policies.rbac.threats, "injected": s.policies.rbac.injected,
            "vcn_calls": s.policies.rbac.vcn_calls, "vcn_writes": s.policies.rbac.vcn_writes,
            "vcn_refused": s.policies.rbac.vcn_refused, "store_errors": s.policies.rbac.store_errors,
            "last_vcn_error": s.policies.rbac.last_vcn_error,
            "last_store_error": s.policies.rbac.last_store_error,
        },
        "ops": ops, "latency": latency, "flows": flows, "last_error": s.last_error,
    })
}

/// One proxy's counters as text, from their JSON.
pub fn render(v: &serde_json::Value) -> String {
    let label = v["proxy"].as_str().unwrap_or("?");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut t = format!(
        "[{label}] refused {} dropped {} closed {} retransmissions {} overflows {} timeouts {} \
         unmatched {} server_errors {} buffer_drops {} bad_handles {} oversize_handles {} \
         temporal_denied {}\n",
        n("refused"),
        n("dropped"),
        n("closed"),
        n("retransmissions"),
        n("overflows"),
        n("timeouts"),
        n("unmatched"),
        n("server_errors"),
        n("buffer_drops"),
        n("bad_handles"),
        n("oversize_handles"),
        n("temporal_denied")
    );
    for (name, c) in v["ops"].as_object().into_iter().flatten() {
        let lat = &v["latency"][name];
        let _ = writeln!(
            t,
            "[{label}] op {name:<22} calls {} replies {}{}",
            c["calls"],
            c["replies"],
            lat["count"]
                .as_u64()
                .map(|_| format!(" latency mean {} us", lat["mean_us"]))
                .unwrap_or_default()
        );
    }
    for f in v["flows"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "[{label}] flow {} {:<22} calls {} replies {} bytes {}/{} latency mean {} us max {} us",
            f["flow"],
            f["op"].as_str().unwrap_or("?"),
            f["calls"],
            f["replies"],
            f["call_bytes"],
            f["reply_bytes"],
            f["latency_mean_us"],
            f["latency_max_us"]
        );
    }
    for r in v["replicas"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "[{label}] replica {} {} sent {} replied {} timed_out {} unmapped {}",
            r["replica"],
            if r["alive"].as_bool() == Some(true) {
                "alive"
            } else {
                "DEAD"
            },
            r["sent"],
            r["replied"],
            r["timed_out"],
            r["unmapped"]
        );
    }
    let r = &v["rbac"];
    if r["allowed"].as_u64().unwrap_or(0)
        + r["denied"].as_u64().unwrap_or(0)
        + r["vcn_calls"].as_u64().unwrap_or(0)
        > 0
    {
        let _ = writeln!(
            t,
            "[{label}] rbac allowed {} denied {} logged {} alarms {} threats {} injected {} vcn calls {} writes {} refused {} store_errors {}",
            r["allowed"],
            r["denied"],
            r["logged"],
            r["alarms"],
            r["threats"],
            r["injected"],
            r["vcn_calls"],
            r["vcn_writes"],
            r["vcn_refused"],
            r["store_errors"]
        );
    }
    if let Some(e) = v["last_error"].as_str() {
        let _ = writeln!(t, "[{label}] last error: {e}");
    }
    t
}
