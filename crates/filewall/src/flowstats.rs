//! The statistics template (§4.4) as a chain policy: per client flow and operation,
//! calls, replies, bytes each way and latency (from the call reaching this policy
//! to its reply coming back to it). Counters live in [`PolicyCounters`], shared
//! with the proxy, which exposes them through `Proxy::stats()`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::chain::{Action, Policy};
use crate::message::{Msg, procedure_name};
use crate::pending::FlowId;

/// Counters of one operation on one flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowOpStats {
    pub calls: u64,
    pub replies: u64,
    /// Encoded call bytes (RPC message, without record marking).
    pub call_bytes: u64,
    /// Encoded reply bytes.
    pub reply_bytes: u64,
    /// Sum and maximum of call-to-reply latencies, in microseconds.
    pub latency_total_us: u64,
    pub latency_max_us: u64,
}

impl FlowOpStats {
    /// Mean latency in microseconds (0 without replies).
    pub fn mean_latency_us(&self) -> u64 {
        self.latency_total_us.checked_div(self.replies).unwrap_or(0)
    }
}

/// What the policies of one proxy count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyCounters {
    /// By (client flow, procedure name).
    pub flows: BTreeMap<(FlowId, String), FlowOpStats>,
    /// Calls refused by the handle policy because a handle's MAC was wrong
    /// (never forwarded to the server).
    pub bad_handles: u64,
    /// Server handles too long to carry a MAC within NFS3_FHSIZE (replaced by an
    /// NFS3ERR_SERVERFAULT reply).
    pub oversize_handles: u64,
    /// Calls answered NFS3ERR_ACCES by the temporal policy (never forwarded).
    pub temporal_denied: u64,
    /// The replication policy's replicas, by index (0: the primary).
    pub replicas: Vec<ReplicaCounters>,
    /// Calls whose replicas answered with different statuses.
    pub replica_divergences: u64,
    /// What the RBAC policy counted.
    pub rbac: RbacCounters,
}

/// What the policy counted about one replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaCounters {
    pub alive: bool,
    /// Copies sent to it.
    pub sent: u64,
    /// Replies from it.
    pub replied: u64,
    /// Copies it did not answer in time (the first one marks it dead).
    pub timed_out: u64,
    /// Calls it was not sent because a handle had no mapping for it.
    pub unmapped: u64,
}

pub(crate) fn lock_counters(
    c: &Mutex<PolicyCounters>,
) -> std::sync::MutexGuard<'_, PolicyCounters> {
    c.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Calls in flight kept at most this long for latency (their replies timed out).
const STALE: Duration = Duration::from_secs(600);
const MAX_IN_FLIGHT: usize = 65_536;

/// The statistics policy.
pub struct StatsPolicy {
    counters: Arc<Mutex<PolicyCounters>>,
    in_flight: HashMap<u32, (Instant, FlowId, String)>,
}

impl StatsPolicy {
    pub fn new(counters: Arc<Mutex<PolicyCounters>>) -> Self {
        Self {
            counters,
            in_flight: HashMap::new(),
        }
    }
}

impl Policy<Msg> for StatsPolicy {
    fn name(&self) -> &str {
        "stats"
    }

    fn on_request(&mut self, xid: u32, request: Msg, out: &mut Vec<Action<Msg>>) {
        if let Msg::Call { flow, call, .. } = &request {
            let name = procedure_name(call.args.procedure());
            let bytes = call.to_bytes().len() as u64;
            let now = Instant::now();
            if self.in_flight.len() >= MAX_IN_FLIGHT {
                self.in_flight
                    .retain(|_, (t, _, _)| now.duration_since(*t) < STALE);
            }
            if self.in_flight.len() < MAX_IN_FLIGHT {
                self.in_flight.insert(xid, (now, *flow, name.clone()));
            }
            let mut c = lock_counters(&self.counters);
            let s = c.flows.entry((*flow, name)).or_default();
            s.calls += 1;
            s.call_bytes += bytes;
        }
        out.push(Action::Forward(request));
    }

    fn on_response(&mut self, xid: u32, _request: &Msg, response: Msg, out: &mut Vec<Action<Msg>>) {
        if let (Some((t, flow, name)), Msg::Reply(r)) = (self.in_flight.remove(&xid), &response) {
            let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
            let bytes = r.to_bytes().len() as u64;
            let mut c = lock_counters(&self.counters);
            let s = c.flows.entry((flow, name)).or_default();
            s.replies += 1;
            s.reply_bytes += bytes;
            s.latency_total_us += us;
            s.latency_max_us = s.latency_max_us.max(us);
        }
        out.push(Action::Forward(response));
    }
}

/// What the RBAC policy counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RbacCounters {
    /// Calls on real objects Algorithm 2 allowed (forwarded) and denied (answered
    /// NFS3ERR_ACCES here).
    pub allowed: u64,
    pub denied: u64,
    /// LOG and ALARM events (also in the audit log).
    pub logged: u64,
    pub alarms: u64,
    /// Sessions turned into threat sessions.
    pub threats: u64,
    /// Requests the policy made itself (GETATTR, LOOKUP, listings).
    pub injected: u64,
    /// Calls on VCN objects, writes among them, and writes refused.
    pub vcn_calls: u64,
    pub vcn_writes: u64,
    pub vcn_refused: u64,
    /// Why the last VCN write was refused.
    pub last_vcn_error: Option<String>,
    pub store_errors: u64,
    pub last_store_error: Option<String>,
}
