//! Calls between offcodes at run time (HYDRA §4.1.5, §5.5). A manifest's
//! `[[offcode.uses]]` binds a caller to an interface of a provider over two
//! channels: requests go out on the caller's request port, and status changes
//! (ACKED, then FINISHED with the result) come back on its return port. The
//! caller's [`Calls`] keeps the call table and applies what comes back, so the
//! same life cycle — PENDING → ACKED → FINISHED — holds whether the provider
//! is on the next core or on a peer node.
//!
//! The provider's side is the [`crate::Offcode::serve`] method, which the
//! runtime calls with an [`IncomingCall`] for each request.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use sidecore_channel::call::{CallError, CallStatus, CallTable, PendingCall, parse_reply};
use sidecore_types::calls::{CallPortSpec, CallRole};

use crate::ports::Inlet;

/// Calls one offcode may have in flight at once, over all its bindings.
pub const CALLS_IN_FLIGHT: usize = 1024;
/// Replies taken from one return port per pump.
const REPLY_BURST: usize = 256;

/// The caller's end of one binding.
struct UseEnd {
    spec: CallPortSpec,
    ret: Inlet,
    /// The provider runs on the same executor: a synchronous call would wait
    /// on the very loop that has to serve it.
    colocated: bool,
    closed: bool,
}

/// An offcode's call bindings, both sides.
pub struct Calls {
    table: Arc<CallTable>,
    uses: Vec<UseEnd>,
    serves: Vec<Arc<CallPortSpec>>,
    /// Replies that arrived for calls already given up (timed out).
    late: u64,
}

impl Default for Calls {
    fn default() -> Self {
        Calls::none()
    }
}

impl Calls {
    /// No bindings.
    pub fn none() -> Self {
        Calls {
            table: CallTable::new(0),
            uses: Vec::new(),
            serves: Vec::new(),
            late: 0,
        }
    }

    /// The bindings in `specs`; each caller-side binding's return inlet is
    /// taken out of `inlets` (its place left unconnected: the runtime drains
    /// it through [`Calls::pump`], never through `handle`). `colocated` says
    /// whether a provider runs on the caller's own executor.
    pub fn new(
        specs: &[CallPortSpec],
        inlets: &mut [Inlet],
        colocated: impl Fn(&str) -> bool,
    ) -> Self {
        let mut uses = Vec::new();
        let mut serves = Vec::new();
        for s in specs {
            match s.role {
                CallRole::Caller => {
                    let ret = inlets.get_mut(s.input).map_or(Inlet::Unconnected, |i| {
                        std::mem::replace(i, Inlet::Unconnected)
                    });
                    uses.push(UseEnd {
                        colocated: colocated(&s.peer),
                        spec: s.clone(),
                        ret,
                        closed: false,
                    });
                }
                CallRole::Provider => serves.push(Arc::new(s.clone())),
            }
        }
        let entries = if uses.is_empty() { 0 } else { CALLS_IN_FLIGHT };
        Calls {
            table: CallTable::new(entries),
            uses,
            serves,
            late: 0,
        }
    }

    /// Whether input `i` is a return port (drained by the runtime, not the offcode).
    pub fn is_return_input(&self, i: usize) -> bool {
        self.uses.iter().any(|u| u.spec.input == i)
    }

    /// The binding served on input `i`, if it is a serve port.
    pub fn served_on(&self, i: usize) -> Option<Arc<CallPortSpec>> {
        self.serves.iter().find(|s| s.input == i).cloned()
    }

    /// Replies that came back after their call was given up.
    pub fn late_replies(&self) -> u64 {
        self.late
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.table.in_flight()
    }

    /// Applies every reply waiting on every return port; returns how many.
    pub fn pump(&mut self) -> Result<usize, CallError> {
        let mut n = 0;
        for u in 0..self.uses.len() {
            n += self.pump_one(u)?;
        }
        Ok(n)
    }

    /// Applies the replies waiting on binding `u`'s return port.
    fn pump_one(&mut self, u: usize) -> Result<usize, CallError> {
        let Calls {
            table, uses, late, ..
        } = self;
        let end = &mut uses[u];
        if end.closed {
            return Ok(0);
        }
        let mut bad = None;
        let d = end.ret.drain(REPLY_BURST, |msg| {
            match parse_reply(msg).and_then(|r| table.apply(&r)) {
                Ok(()) => {}
                // A reply for a call given up after its deadline.
                Err(CallError::UnknownCall(_)) => *late += 1,
                Err(e) if bad.is_none() => bad = Some(e),
                Err(_) => {}
            }
            Ok(())
        });
        if let Some(e) = bad {
            return Err(CallError::Malformed(format!(
                "reply from `{}` on `{}`: {e}",
                end.spec.peer, end.spec.interface
            )));
        }
        match d {
            Ok(d) => {
                end.closed = d.closed;
                Ok(d.messages)
            }
            Err(e) => Err(CallError::Malformed(format!(
                "return channel from `{}`: {e}",
                end.spec.peer
            ))),
        }
    }

    /// The caller-side binding to `interface`, its index and spec.
    pub(crate) fn binding(&self, interface: &str) -> Result<(usize, &CallPortSpec), CallError> {
        self.uses
            .iter()
            .enumerate()
            .find(|(_, u)| u.spec.interface == interface)
            .map(|(i, u)| (i, &u.spec))
            .ok_or_else(|| CallError::NoBinding(interface.to_string()))
    }

    pub(crate) fn table(&self) -> &Arc<CallTable> {
        &self.table
    }

    /// Whether binding `u`'s provider shares this executor.
    pub(crate) fn colocated(&self, u: usize) -> bool {
        self.uses[u].colocated
    }

    /// Pumps binding `u` and, if the call is finished, takes its result.
    /// `ProviderGone` once its return channel has closed with the call unfinished.
    pub(crate) fn poll_one<R: DeserializeOwned>(
        &mut self,
        u: usize,
        call: &PendingCall,
    ) -> Result<Option<R>, CallError> {
        self.pump_one(u)?;
        match call.status()? {
            CallStatus::Finished => {
                let (code, raw) = self.table.complete(call.id)?;
                if code != 0 {
                    return Err(CallError::Failed(code));
                }
                postcard::from_bytes(&raw)
                    .map(Some)
                    .map_err(|e| CallError::Decode {
                        what: "the call result",
                        reason: e.to_string(),
                    })
            }
            _ if self.uses[u].closed => {
                self.table.abandon(call.id);
                Err(CallError::ProviderGone(self.uses[u].spec.interface.clone()))
            }
            _ => Ok(None),
        }
    }

    /// The binding a pending call went out on.
    pub(crate) fn binding_of(&self, interface: &str) -> Result<usize, CallError> {
        self.binding(interface).map(|(u, _)| u)
    }
}

/// A call as the provider sees it.
pub struct IncomingCall<'a> {
    /// The interface it came in on.
    pub interface: &'a str,
    /// The method's name and header id.
    pub method: &'a str,
    pub method_id: u16,
    /// The calling offcode.
    pub caller: &'a str,
    /// The postcard-encoded arguments.
    pub args: &'a [u8],
}

impl IncomingCall<'_> {
    /// Decodes the arguments; a mismatch is a [`CallFault::BAD_ARGUMENTS`].
    pub fn decode<A: DeserializeOwned>(&self) -> Result<A, CallFault> {
        postcard::from_bytes(self.args).map_err(|_| CallFault::BAD_ARGUMENTS)
    }
}

/// Why a provider failed a call: the code the caller's
/// [`CallError::Failed`] carries. Codes below 0xff00 are the provider's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFault(pub u16);

impl CallFault {
    /// The offcode serves no such method.
    pub const NOT_SERVED: CallFault = CallFault(0xff01);
    /// The arguments did not decode as the method's parameters.
    pub const BAD_ARGUMENTS: CallFault = CallFault(0xff02);
    /// The request named a method id the interface does not have.
    pub const UNKNOWN_METHOD: CallFault = CallFault(0xff03);
    /// The result could not be encoded.
    pub const BAD_RESULT: CallFault = CallFault(0xff04);
}

/// Encodes a result for [`crate::Offcode::serve`].
pub fn encode_result<R: serde::Serialize>(r: &R) -> Result<Vec<u8>, CallFault> {
    postcard::to_allocvec(r).map_err(|_| CallFault::BAD_RESULT)
}
