//! The contexts the runtime hands an offcode in each phase: what it may touch
//! then. `InitCx` gives local resources only (parameters, port names, metrics);
//! `RunCx` adds the connected ports and the clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sidecore_channel::SendOutcome;
use sidecore_channel::call::{
    CallError, CallStatus, CallType, Invocation, PendingCall, RequestHeader, write_request,
};
use sidecore_types::PeKind;
use sidecore_types::calls::CallPortSpec;

use crate::calls::Calls;
use crate::ports::Outlet;
use crate::{InputId, OffcodeError, OutputId};

/// Who and where an offcode is.
#[derive(Debug, Clone)]
pub struct OffcodeInfo {
    pub app: String,
    pub name: String,
    pub implementation: String,
    /// The PE it runs on, e.g. `core:1`.
    pub pe: String,
    pub pe_kind: PeKind,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// The call bindings it takes part in (`[[offcode.uses]]`, either side).
    pub calls: Vec<CallPortSpec>,
}

/// A named counter or gauge the offcode publishes (read by `sidecore ps`).
#[derive(Debug, Clone, Default)]
pub struct Metric(Arc<AtomicU64>);

impl Metric {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// An offcode's metrics, shared between its thread and the control plane.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    entries: Arc<std::sync::Mutex<Vec<(String, Metric)>>>,
}

impl Metrics {
    /// The metric named `name`, created on first use.
    pub fn metric(&self, name: &str) -> Metric {
        let mut e = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, m)) = e.iter().find(|(n, _)| n == name) {
            return m.clone();
        }
        let m = Metric::default();
        e.push((name.to_string(), m.clone()));
        m
    }

    /// Every metric's current value, in creation order.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(n, m)| (n.clone(), m.get()))
            .collect()
    }
}

fn port(list: &[String], name: &str, direction: &'static str) -> Result<usize, OffcodeError> {
    list.iter()
        .position(|p| p == name)
        .ok_or_else(|| OffcodeError::UnknownPort {
            direction,
            port: name.to_string(),
            known: if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            },
        })
}

/// Phase-1 context: local resources only.
pub struct InitCx<'a> {
    info: &'a OffcodeInfo,
    params: &'a toml::Table,
    metrics: &'a Metrics,
}

impl<'a> InitCx<'a> {
    pub fn new(info: &'a OffcodeInfo, params: &'a toml::Table, metrics: &'a Metrics) -> Self {
        InitCx {
            info,
            params,
            metrics,
        }
    }

    /// Who and where this offcode is.
    pub fn info(&self) -> &OffcodeInfo {
        self.info
    }

    /// The manifest's `params`, deserialized; errors name the offending field.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, OffcodeError> {
        parse_params(self.params)
    }

    /// Resolves an input port name.
    pub fn input(&self, name: &str) -> Result<InputId, OffcodeError> {
        port(&self.info.inputs, name, "input").map(InputId)
    }

    /// Resolves an output port name.
    pub fn output(&self, name: &str) -> Result<OutputId, OffcodeError> {
        port(&self.info.outputs, name, "output").map(OutputId)
    }

    /// A metric published under `name`.
    pub fn metric(&self, name: &str) -> Metric {
        self.metrics.metric(name)
    }
}

/// Deserializes offcode parameters from a TOML table.
pub fn parse_params<T: DeserializeOwned>(params: &toml::Table) -> Result<T, OffcodeError> {
    toml::Value::Table(params.clone())
        .try_into()
        .map_err(|e: toml::de::Error| OffcodeError::Params(e.message().trim().to_string()))
}

/// An offcode's bindings (a field of its context, borrowed alone so the
/// outlets stay free); `NoBinding(interface)` if it has none.
fn bindings<'c>(
    calls: &'c mut Option<&mut Calls>,
    interface: &str,
) -> Result<&'c mut Calls, CallError> {
    calls
        .as_deref_mut()
        .ok_or_else(|| CallError::NoBinding(interface.to_string()))
}

/// Context of the running phases (start, handle, poll, serve, control, stop).
pub struct RunCx<'a> {
    info: &'a OffcodeInfo,
    outlets: &'a mut [Outlet],
    calls: Option<&'a mut Calls>,
    now: Instant,
}

impl<'a> RunCx<'a> {
    /// A context with no call bindings.
    pub fn new(info: &'a OffcodeInfo, outlets: &'a mut [Outlet], now: Instant) -> Self {
        RunCx {
            info,
            outlets,
            calls: None,
            now,
        }
    }

    /// A context whose offcode may call the interfaces it is bound to.
    pub fn with_calls(
        info: &'a OffcodeInfo,
        outlets: &'a mut [Outlet],
        calls: &'a mut Calls,
        now: Instant,
    ) -> Self {
        RunCx {
            info,
            outlets,
            calls: Some(calls),
            now,
        }
    }

    /// Who and where this offcode is.
    pub fn info(&self) -> &OffcodeInfo {
        self.info
    }

    /// The time this turn of the loop began.
    pub fn now(&self) -> Instant {
        self.now
    }

    fn outlet(&mut self, out: OutputId) -> Result<&mut Outlet, OffcodeError> {
        let n = self.outlets.len();
        self.outlets
            .get_mut(out.0)
            .ok_or_else(|| OffcodeError::UnknownPort {
                direction: "output",
                port: format!("#{}", out.0),
                known: format!("{n} outputs"),
            })
    }

    /// Writes a message straight into the channel's slot (zero copy): `fill`
    /// gets the slot and returns the bytes it wrote. `Full` on a reliable
    /// channel means nothing was sent: try again on a later turn.
    #[inline]
    pub fn send(
        &mut self,
        out: OutputId,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<SendOutcome, OffcodeError> {
        self.outlet(out)?.send_with(fill)
    }

    /// Copies `msg` into the channel.
    pub fn send_bytes(&mut self, out: OutputId, msg: &[u8]) -> Result<SendOutcome, OffcodeError> {
        let o = self.outlet(out)?;
        if msg.len() > o.capacity() {
            return Err(OffcodeError::Channel(format!(
                "message of {} bytes exceeds the {}-byte slot",
                msg.len(),
                o.capacity()
            )));
        }
        o.send_with(|slot| {
            slot[..msg.len()].copy_from_slice(msg);
            msg.len()
        })
    }

    /// Free room on an output, in messages (for back-pressure decisions).
    pub fn free(&mut self, out: OutputId) -> Result<u64, OffcodeError> {
        Ok(self.outlet(out)?.free())
    }

    /// Largest message an output accepts.
    pub fn capacity(&mut self, out: OutputId) -> Result<usize, OffcodeError> {
        Ok(self.outlet(out)?.capacity())
    }

    /// Invokes `method` of `interface` asynchronously: the request goes out now
    /// and the call starts PENDING; [`RunCx::call_status`] shows it move to
    /// ACKED and FINISHED, and [`RunCx::call_result`] takes the result.
    /// `ChannelFull` means nothing was sent: try again on a later turn.
    pub fn call<A: Serialize>(
        &mut self,
        interface: &str,
        method: &str,
        args: &A,
        invocation: Invocation,
    ) -> Result<PendingCall, CallError> {
        let calls = bindings(&mut self.calls, interface)?;
        let (_, spec) = calls.binding(interface)?;
        let m = spec
            .method(method)
            .ok_or_else(|| CallError::UnknownMethod {
                interface: interface.to_string(),
                method: method.to_string(),
            })?;
        let header = RequestHeader {
            id: calls.table().begin()?,
            method: m.id,
            ty: if m.returns.is_some() {
                CallType::InOut
            } else {
                CallType::In
            },
            invocation,
        };
        let table = Arc::clone(calls.table());
        let Some(outlet) = self.outlets.get_mut(spec.output) else {
            table.abandon(header.id);
            return Err(CallError::NoBinding(interface.to_string()));
        };
        let mut enc = None;
        let sent = outlet.send_with(|slot| {
            write_request(slot, &header, args).unwrap_or_else(|e| {
                enc = Some(e);
                0 // an empty request: the provider skips it
            })
        });
        let error = match (sent, enc) {
            (Ok(SendOutcome::Sent), None) => match outlet.publish() {
                Ok(()) => return Ok(PendingCall::new(header.id, table)),
                Err(e) => CallError::Malformed(e.to_string()),
            },
            (_, Some(e)) => e,
            (Ok(SendOutcome::Full | SendOutcome::Dropped), None) => CallError::ChannelFull,
            (Err(e), None) => CallError::Malformed(e.to_string()),
        };
        table.abandon(header.id);
        Err(error)
    }

    /// Where a call is now (replies that arrived are applied first).
    pub fn call_status(&mut self, call: &PendingCall) -> Result<CallStatus, CallError> {
        if let Some(c) = self.calls.as_deref_mut() {
            c.pump()?;
        }
        call.status()
    }

    /// The result of a call once FINISHED (`None` before); taking it frees
    /// the call. A provider's failure is `CallError::Failed` with its code.
    pub fn call_result<R: DeserializeOwned>(
        &mut self,
        interface: &str,
        call: &PendingCall,
    ) -> Result<Option<R>, CallError> {
        let calls = bindings(&mut self.calls, interface)?;
        let u = calls.binding_of(interface)?;
        calls.poll_one(u, call)
    }

    /// Invokes `method` of `interface` and waits up to `timeout` for its result
    /// (HYDRA's synchronous call). Refused when the provider runs on this very
    /// executor, which could never serve it while this turn waits.
    pub fn call_wait<A: Serialize, R: DeserializeOwned>(
        &mut self,
        interface: &str,
        method: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<R, CallError> {
        {
            let calls = bindings(&mut self.calls, interface)?;
            let (u, _) = calls.binding(interface)?;
            if calls.colocated(u) {
                return Err(CallError::WouldDeadlock(interface.to_string()));
            }
        }
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        let call = loop {
            match self.call(interface, method, args, Invocation::Extended) {
                Err(CallError::ChannelFull | CallError::TableFull(_))
                    if Instant::now() < deadline =>
                {
                    backoff.snooze();
                }
                r => break r?,
            }
        };
        loop {
            if let Some(r) = self.call_result(interface, &call)? {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                let status = call.status()?;
                if let Some(t) = self.calls.as_deref().map(Calls::table) {
                    t.abandon(call.id);
                }
                return Err(CallError::Timeout(status));
            }
            if backoff.is_completed() {
                std::thread::yield_now();
            } else {
                backoff.snooze();
            }
        }
    }

    /// Publishes what was sent so far on one output (the rest wait for the
    /// end of the turn).
    pub fn publish(&mut self, out: OutputId) -> Result<(), OffcodeError> {
        self.outlet(out)?.publish()
    }

    /// Publishes everything sent so far on every output.
    pub fn flush(&mut self) -> Result<(), OffcodeError> {
        for o in self.outlets.iter_mut() {
            o.publish()?;
        }
        Ok(())
    }
}
