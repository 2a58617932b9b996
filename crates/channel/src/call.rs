//! Calls: requests on a channel with HYDRA's life cycle (§4.1.5, §5.3).
//!
//! A call starts `PENDING`. With *extended* invocation the callee moves it to
//! `ACKED` as soon as it has released the input buffer (the caller may then reuse
//! whatever it lent), and to `FINISHED` when the output is ready; *simple*
//! invocation skips the `ACKED` notification. Status only ever moves forward:
//! every transition is a compare-and-swap that refuses to go back.
//!
//! Arguments and results are encoded with postcard (serde), written straight
//! into the request slot: the standard serialization, with no intermediate copy.
//! Status words use HYDRA's codes (`1<<13`, `1<<14`, `1<<15`; the seed's figures
//! print `1<13`, which the digest lists as an erratum).

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ring::{Consumer, Recv};
use crate::sender::{SendError, SendOutcome, Sender};

/// HYDRA's `CALL_STATUS_PENDING`.
pub const STATUS_PENDING: u16 = 1 << 13;
/// HYDRA's `CALL_STATUS_ACKED`.
pub const STATUS_ACKED: u16 = 1 << 14;
/// HYDRA's `CALL_STATUS_FINISHED`.
pub const STATUS_FINISHED: u16 = 1 << 15;
const STATUS_FREE: u16 = 0;

/// Bytes of the call header at the start of a request slot.
pub const CALL_HEADER: usize = 16;
/// The only encoding tag defined so far: postcard.
pub const ENC_POSTCARD: u8 = 1;

/// Where a call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum CallStatus {
    Pending,
    Acked,
    Finished,
}

impl CallStatus {
    /// HYDRA's status code.
    pub fn code(self) -> u16 {
        match self {
            CallStatus::Pending => STATUS_PENDING,
            CallStatus::Acked => STATUS_ACKED,
            CallStatus::Finished => STATUS_FINISHED,
        }
    }
    fn from_code(c: u16) -> Option<Self> {
        match c {
            STATUS_PENDING => Some(CallStatus::Pending),
            STATUS_ACKED => Some(CallStatus::Acked),
            STATUS_FINISHED => Some(CallStatus::Finished),
            _ => None,
        }
    }
}

/// `IN_CALL` carries input only; `INOUT_CALL` also returns a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallType {
    In,
    InOut,
}

/// One notification (simple) or two (extended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    Simple,
    Extended,
}

/// A call's identity: slot index in the call table plus a generation, so a stale
/// id can never touch a reused entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallId(pub u64);

impl CallId {
    fn new(index: u32, generation: u32) -> Self {
        CallId(((generation as u64) << 32) | index as u64)
    }
    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("too many calls in flight (table of {0} entries is full)")]
    TableFull(usize),
    #[error("the request channel is full; try again")]
    ChannelFull,
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("could not encode the call arguments: {0}")]
    Encode(String),
    #[error("could not decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("malformed call request: {0}")]
    Malformed(String),
    #[error("unknown or stale call id {0:#x}")]
    UnknownCall(u64),
    #[error("call status cannot move from {from:?} to {to:?}")]
    Backwards { from: CallStatus, to: CallStatus },
    #[error("call not finished by the deadline (status {0:?})")]
    Timeout(CallStatus),
    #[error("the callee failed the call with code {0}")]
    Failed(u16),
    #[error("no call binding to interface `{0}`")]
    NoBinding(String),
    #[error("interface `{interface}` has no method `{method}` this offcode may call")]
    UnknownMethod { interface: String, method: String },
    #[error("the provider of `{0}` is gone (its reply channel closed)")]
    ProviderGone(String),
    #[error(
        "a synchronous call to `{0}` would wait on its own executor, which serves the provider; use an asynchronous call"
    )]
    WouldDeadlock(String),
}

struct Entry {
    generation: AtomicU32,
    status: AtomicU16,
    code: AtomicU16,
    result: Mutex<Vec<u8>>,
}

/// The status words of every call in flight, shared by caller and callee (in
/// HYDRA, the `call_t` in host memory that the device updates by DMA).
pub struct CallTable {
    entries: Box<[Entry]>,
    free: Mutex<Vec<u32>>,
}

impl CallTable {
    /// A table with room for `capacity` calls in flight.
    pub fn new(capacity: usize) -> Arc<Self> {
        let entries = (0..capacity)
            .map(|_| Entry {
                generation: AtomicU32::new(0),
                status: AtomicU16::new(STATUS_FREE),
                code: AtomicU16::new(0),
                result: Mutex::new(Vec::new()),
            })
            .collect();
        Arc::new(CallTable {
            entries,
            free: Mutex::new((0..capacity as u32).rev().collect()),
        })
    }

    fn lock_free(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Allocates an entry in state PENDING.
    pub fn begin(&self) -> Result<CallId, CallError> {
        let idx = self
            .lock_free()
            .pop()
            .ok_or(CallError::TableFull(self.entries.len()))?;
        let e = &self.entries[idx as usize];
        assert_eq!(
            e.status.load(Ordering::Acquire),
            STATUS_FREE,
            "call table: entry {idx} on the free list is in use"
        );
        let generation = e.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        e.code.store(0, Ordering::Relaxed);
        e.status.store(STATUS_PENDING, Ordering::Release);
        Ok(CallId::new(idx, generation))
    }

    fn entry(&self, id: CallId) -> Result<&Entry, CallError> {
        let e = self
            .entries
            .get(id.index())
            .ok_or(CallError::UnknownCall(id.0))?;
        if e.generation.load(Ordering::Acquire) != id.generation()
            || e.status.load(Ordering::Acquire) == STATUS_FREE
        {
            return Err(CallError::UnknownCall(id.0));
        }
        Ok(e)
    }

    /// The status of a call in flight.
    pub fn status(&self, id: CallId) -> Result<CallStatus, CallError> {
        let e = self.entry(id)?;
        CallStatus::from_code(e.status.load(Ordering::Acquire)).ok_or(CallError::UnknownCall(id.0))
    }

    /// Moves a call forward to `to`; refuses to move backwards or stay put.
    pub fn advance(&self, id: CallId, to: CallStatus) -> Result<(), CallError> {
        let e = self.entry(id)?;
        let mut cur = e.status.load(Ordering::Acquire);
        loop {
            let from = CallStatus::from_code(cur).ok_or(CallError::UnknownCall(id.0))?;
            if from >= to {
                return Err(CallError::Backwards { from, to });
            }
            match e
                .status
                .compare_exchange(cur, to.code(), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Stores the result and moves the call to FINISHED.
    pub fn finish(&self, id: CallId, code: u16, result: &[u8]) -> Result<(), CallError> {
        let e = self.entry(id)?;
        {
            let mut r = e
                .result
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            r.clear();
            r.extend_from_slice(result);
        }
        e.code.store(code, Ordering::Release);
        self.advance(id, CallStatus::Finished)
    }

    /// Takes the result of a FINISHED call and frees its entry. Exactly one
    /// of two racing completions of one call frees it; the other is told the
    /// call is gone.
    pub fn complete(&self, id: CallId) -> Result<(u16, Vec<u8>), CallError> {
        let e = self.entry(id)?;
        let status = self.status(id)?;
        if status != CallStatus::Finished {
            return Err(CallError::Timeout(status));
        }
        // Claim the entry: FINISHED → FREE once. It goes back on the free
        // list only after its result is taken, so no `begin` can reuse it
        // before then.
        if e.status
            .compare_exchange(
                CallStatus::Finished.code(),
                STATUS_FREE,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(CallError::UnknownCall(id.0));
        }
        let out = std::mem::take(
            &mut *e
                .result
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let code = e.code.load(Ordering::Acquire);
        let mut free = self.lock_free();
        debug_assert!(
            !free.contains(&(id.index() as u32)),
            "call table: entry {} freed twice",
            id.index()
        );
        free.push(id.index() as u32);
        assert!(
            free.len() <= self.entries.len(),
            "call table: {} free entries in a table of {}",
            free.len(),
            self.entries.len()
        );
        Ok((code, out))
    }

    /// Frees the entry of a call that never reached the callee.
    pub fn abandon(&self, id: CallId) {
        let _ = self.finish(id, u16::MAX, &[]);
        let _ = self.complete(id);
    }

    /// Applies a reply that came back over a channel (a callee on another
    /// core or node): ACKED moves the call forward, FINISHED stores the result.
    pub fn apply(&self, reply: &Reply<'_>) -> Result<(), CallError> {
        match reply.status {
            CallStatus::Finished => self.finish(reply.id, reply.code, reply.result),
            s => self.advance(reply.id, s),
        }
    }

    /// Calls currently in flight.
    pub fn in_flight(&self) -> usize {
        self.entries.len() - self.lock_free().len()
    }
}

/// The caller's end: sends requests, watches their status.
pub struct Caller {
    sender: Sender,
    table: Arc<CallTable>,
}

/// A call the caller is waiting on.
#[derive(Clone)]
pub struct PendingCall {
    pub id: CallId,
    table: Arc<CallTable>,
}

impl PendingCall {
    /// A call begun in `table` (see [`CallTable::begin`]).
    pub fn new(id: CallId, table: Arc<CallTable>) -> Self {
        PendingCall { id, table }
    }

    /// Current status.
    pub fn status(&self) -> Result<CallStatus, CallError> {
        self.table.status(self.id)
    }

    /// Waits (spinning, then yielding) until FINISHED, returning the raw result.
    pub fn wait(self, timeout: Duration) -> Result<Vec<u8>, CallError> {
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            let s = self.table.status(self.id)?;
            if s == CallStatus::Finished {
                let (code, out) = self.table.complete(self.id)?;
                return if code == 0 {
                    Ok(out)
                } else {
                    Err(CallError::Failed(code))
                };
            }
            if Instant::now() >= deadline {
                return Err(CallError::Timeout(s));
            }
            if backoff.is_completed() {
                std::thread::yield_now();
            } else {
                backoff.snooze();
            }
        }
    }

    /// Waits and decodes the result.
    pub fn wait_for<R: DeserializeOwned>(self, timeout: Duration) -> Result<R, CallError> {
        let raw = self.wait(timeout)?;
        postcard::from_bytes(&raw).map_err(|e| CallError::Decode {
            what: "the call result",
            reason: e.to_string(),
        })
    }
}

impl Caller {
    /// A caller sending on `sender` and tracking status in `table`.
    pub fn new(sender: Sender, table: Arc<CallTable>) -> Self {
        Caller { sender, table }
    }

    /// Encodes `args` into a request slot and sends it.
    pub fn call<A: Serialize>(
        &mut self,
        method: u16,
        args: &A,
        ty: CallType,
        inv: Invocation,
    ) -> Result<PendingCall, CallError> {
        let id = self.table.begin()?;
        let mut enc_err = None;
        let header = RequestHeader {
            id,
            method,
            ty,
            invocation: inv,
        };
        let sent = self.sender.try_send_with(|slot| {
            write_request(slot, &header, args).unwrap_or_else(|e| {
                enc_err = Some(e);
                // Commit nothing useful: an empty message is dropped below.
                0
            })
        });
        let fail = |table: &CallTable, e: CallError| {
            table.abandon(id);
            Err(e)
        };
        match sent {
            Ok(SendOutcome::Sent) if enc_err.is_none() => {
                self.sender.publish();
                Ok(PendingCall {
                    id,
                    table: Arc::clone(&self.table),
                })
            }
            Ok(SendOutcome::Sent) => {
                // The zero-length message we committed is ignored by the callee.
                self.sender.publish();
                fail(
                    &self.table,
                    enc_err.unwrap_or(CallError::Encode(String::new())),
                )
            }
            Ok(SendOutcome::Full) | Ok(SendOutcome::Dropped) => {
                fail(&self.table, CallError::ChannelFull)
            }
            Err(e) => fail(&self.table, CallError::Send(e)),
        }
    }
}

/// The fixed part of a request: who, which method, what kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub id: CallId,
    pub method: u16,
    pub ty: CallType,
    pub invocation: Invocation,
}

/// Writes a request (header, then postcard-encoded `args`) into `slot`, the
/// slot of whichever transport carries it; returns the bytes written.
pub fn write_request<A: Serialize>(
    slot: &mut [u8],
    h: &RequestHeader,
    args: &A,
) -> Result<usize, CallError> {
    if slot.len() < CALL_HEADER {
        return Err(CallError::Encode(format!(
            "a {}-byte slot is smaller than the {CALL_HEADER}-byte call header",
            slot.len()
        )));
    }
    slot[0..8].copy_from_slice(&h.id.0.to_le_bytes());
    slot[8..10].copy_from_slice(&h.method.to_le_bytes());
    slot[10] = match h.ty {
        CallType::In => 1,
        CallType::InOut => 2,
    };
    slot[11] = match h.invocation {
        Invocation::Simple => 0,
        Invocation::Extended => 1,
    };
    slot[12] = ENC_POSTCARD;
    slot[13..16].fill(0);
    let room = slot.len() - CALL_HEADER;
    postcard::to_slice(args, &mut slot[CALL_HEADER..])
        .map(|used| CALL_HEADER + used.len())
        .map_err(|e| {
            CallError::Encode(format!(
                "{e} (the arguments must fit the {room} bytes after the header)"
            ))
        })
}

/// A status change travelling back from a callee to its caller's table: the
/// reply channel of a call binding carries these (in HYDRA, the device's DMA
/// write of the `call_t` status word). Layout: call id (u64), status code
/// (u16), result code (u16), 4 reserved bytes, then the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'a> {
    pub id: CallId,
    pub status: CallStatus,
    /// 0 for success, else the callee's failure code (with FINISHED).
    pub code: u16,
    /// The encoded result (with FINISHED).
    pub result: &'a [u8],
}

/// Bytes of a reply's header.
pub const REPLY_HEADER: usize = 16;

/// Writes `reply` into `slot`; returns the bytes written.
pub fn write_reply(slot: &mut [u8], reply: &Reply<'_>) -> Result<usize, CallError> {
    let n = REPLY_HEADER + reply.result.len();
    if slot.len() < n {
        return Err(CallError::Encode(format!(
            "a result of {} bytes does not fit a {}-byte reply slot; raise the binding's slot_size",
            reply.result.len(),
            slot.len()
        )));
    }
    slot[0..8].copy_from_slice(&reply.id.0.to_le_bytes());
    slot[8..10].copy_from_slice(&reply.status.code().to_le_bytes());
    slot[10..12].copy_from_slice(&reply.code.to_le_bytes());
    slot[12..16].fill(0);
    slot[REPLY_HEADER..n].copy_from_slice(reply.result);
    Ok(n)
}

/// Parses a reply. Never panics on any input.
pub fn parse_reply(msg: &[u8]) -> Result<Reply<'_>, CallError> {
    let Some((head, result)) = msg.split_first_chunk::<REPLY_HEADER>() else {
        return Err(CallError::Malformed(format!(
            "{} bytes is shorter than the {REPLY_HEADER}-byte reply header",
            msg.len()
        )));
    };
    let mut id = [0u8; 8];
    id.copy_from_slice(&head[0..8]);
    let code = u16::from_le_bytes([head[8], head[9]]);
    let Some(status @ (CallStatus::Acked | CallStatus::Finished)) = CallStatus::from_code(code)
    else {
        return Err(CallError::Malformed(format!(
            "reply status {code:#x} is neither ACKED ({STATUS_ACKED:#x}) nor FINISHED ({STATUS_FINISHED:#x})"
        )));
    };
    if status == CallStatus::Acked && !result.is_empty() {
        return Err(CallError::Malformed(format!(
            "an ACKED reply carries {} bytes of result",
            result.len()
        )));
    }
    Ok(Reply {
        id: CallId(u64::from_le_bytes(id)),
        status,
        code: u16::from_le_bytes([head[10], head[11]]),
        result,
    })
}

/// A request as the callee sees it, in place in the slot.
pub struct Request<'a> {
    pub id: CallId,
    pub method: u16,
    pub ty: CallType,
    pub invocation: Invocation,
    pub args: &'a [u8],
}

impl Request<'_> {
    /// Decodes the arguments.
    pub fn decode<A: DeserializeOwned>(&self) -> Result<A, CallError> {
        postcard::from_bytes(self.args).map_err(|e| CallError::Decode {
            what: "the call arguments",
            reason: e.to_string(),
        })
    }
}

/// Parses a request header. Never panics on any input.
pub fn parse_request(msg: &[u8]) -> Result<Request<'_>, CallError> {
    if msg.len() < CALL_HEADER {
        return Err(CallError::Malformed(format!(
            "{} bytes is shorter than the {CALL_HEADER}-byte call header",
            msg.len()
        )));
    }
    let id = CallId(u64::from_le_bytes(msg[0..8].try_into().expect("8 bytes")));
    let method = u16::from_le_bytes([msg[8], msg[9]]);
    let ty = match msg[10] {
        1 => CallType::In,
        2 => CallType::InOut,
        t => {
            return Err(CallError::Malformed(format!(
                "call type {t} is neither IN (1) nor INOUT (2)"
            )));
        }
    };
    let invocation = match msg[11] {
        0 => Invocation::Simple,
        1 => Invocation::Extended,
        v => {
            return Err(CallError::Malformed(format!(
                "invocation {v} is neither simple (0) nor extended (1)"
            )));
        }
    };
    if msg[12] != ENC_POSTCARD {
        return Err(CallError::Malformed(format!(
            "unknown encoding tag {}",
            msg[12]
        )));
    }
    Ok(Request {
        id,
        method,
        ty,
        invocation,
        args: &msg[CALL_HEADER..],
    })
}

/// The callee's end: serves requests one at a time (a sequential channel).
pub struct Callee {
    receiver: Consumer,
    table: Arc<CallTable>,
}

impl Callee {
    /// A callee reading requests from `receiver`.
    pub fn new(receiver: Consumer, table: Arc<CallTable>) -> Self {
        Callee { receiver, table }
    }

    /// Serves one request, if there is one.
    ///
    /// `decode` runs with the input still in the slot (zero copy). The slot is
    /// then released and an extended call moves to ACKED; `handle` runs on the
    /// decoded value and its `(code, result)` moves the call to FINISHED.
    /// Returns `Ok(false)` when no request was waiting.
    pub fn serve_one<T>(
        &mut self,
        decode: impl FnOnce(&Request<'_>) -> Result<T, CallError>,
        handle: impl FnOnce(u16, T) -> (u16, Vec<u8>),
    ) -> Result<bool, CallError> {
        let (id, method, inv, decoded) = {
            let slot = match self.receiver.try_recv() {
                Ok(s) => s,
                Err(Recv::Empty) | Err(Recv::Closed) => return Ok(false),
            };
            if slot.is_empty() {
                // An abandoned request (the caller failed to encode it).
                return Ok(true);
            }
            let req = parse_request(&slot)?;
            let decoded = decode(&req);
            (req.id, req.method, req.invocation, decoded)
        };
        // The input slot is dropped: hand it back now so the caller may reuse it.
        self.receiver.release();
        let value = match decoded {
            Ok(v) => v,
            Err(e) => {
                self.table.finish(id, u16::MAX - 1, &[])?;
                return Err(e);
            }
        };
        if inv == Invocation::Extended {
            self.table.advance(id, CallStatus::Acked)?;
        }
        let (code, out) = handle(method, value);
        self.table.finish(id, code, &out)?;
        Ok(true)
    }
}

/// Encodes a result for [`Callee::serve_one`]'s `handle`.
pub fn encode_result<R: Serialize>(r: &R) -> Result<Vec<u8>, CallError> {
    postcard::to_allocvec(r).map_err(|e| CallError::Encode(e.to_string()))
}

#[cfg(test)]
// `Request::decode::<T>` by path is not general over the request's lifetime.
#[allow(clippy::redundant_closure_for_method_calls)]
mod tests {
    use super::*;
    use crate::ring::{Ring, RingConfig};
    use sidecore_types::Delivery;

    fn pair(slots: usize) -> (Caller, Callee) {
        let (p, mut c) = Ring::create(RingConfig {
            slots,
            release_batch: 1,
            ..RingConfig::default()
        })
        .unwrap();
        let table = CallTable::new(16);
        (
            Caller::new(Sender::new(p, Delivery::Reliable), Arc::clone(&table)),
            Callee::new(c.remove(0), table),
        )
    }

    #[test]
    fn extended_call_goes_pending_acked_finished() {
        let (mut caller, mut callee) = pair(8);
        let call = caller
            .call(
                7,
                &(3u32, "hello".to_string()),
                CallType::InOut,
                Invocation::Extended,
            )
            .unwrap();
        assert_eq!(call.status().unwrap(), CallStatus::Pending);
        let mut seen_in_handler = None;
        let served = callee
            .serve_one(
                |req| req.decode::<(u32, String)>(),
                |method, (n, s)| {
                    seen_in_handler = Some(method);
                    (0, encode_result(&s.repeat(n as usize)).unwrap())
                },
            )
            .unwrap();
        assert!(served);
        assert_eq!(seen_in_handler, Some(7));
        assert_eq!(call.status().unwrap(), CallStatus::Finished);
        let r: String = call.wait_for(Duration::from_secs(1)).unwrap();
        assert_eq!(r, "hellohellohello");
    }

    #[test]
    fn acked_is_set_before_the_handler_runs() {
        let (mut caller, mut callee) = pair(8);
        let call = caller
            .call(1, &5u8, CallType::InOut, Invocation::Extended)
            .unwrap();
        let probe = call.clone();
        callee
            .serve_one(
                |r| r.decode::<u8>(),
                |_, v| {
                    assert_eq!(probe.status().unwrap(), CallStatus::Acked);
                    (0, encode_result(&(v + 1)).unwrap())
                },
            )
            .unwrap();
        assert_eq!(call.wait_for::<u8>(Duration::from_secs(1)).unwrap(), 6);
    }

    #[test]
    fn simple_call_skips_acked() {
        let (mut caller, mut callee) = pair(8);
        let call = caller
            .call(1, &5u8, CallType::In, Invocation::Simple)
            .unwrap();
        let probe = call.clone();
        callee
            .serve_one(
                |r| r.decode::<u8>(),
                |_, _| {
                    assert_eq!(probe.status().unwrap(), CallStatus::Pending);
                    (0, Vec::new())
                },
            )
            .unwrap();
        assert!(call.wait(Duration::from_secs(1)).unwrap().is_empty());
    }

    #[test]
    fn racing_completions_free_an_entry_once() {
        let t = CallTable::new(4);
        for _ in 0..200 {
            let id = t.begin().unwrap();
            t.finish(id, 0, b"r").unwrap();
            let wins: usize = std::thread::scope(|s| {
                let a = s.spawn(|| t.complete(id).is_ok());
                let b = s.spawn(|| t.complete(id).is_ok());
                usize::from(a.join().unwrap()) + usize::from(b.join().unwrap())
            });
            assert_eq!(wins, 1);
            assert_eq!(t.in_flight(), 0);
        }
    }

    #[test]
    fn status_never_moves_backwards() {
        let t = CallTable::new(2);
        let id = t.begin().unwrap();
        t.advance(id, CallStatus::Acked).unwrap();
        assert_eq!(
            t.advance(id, CallStatus::Pending),
            Err(CallError::Backwards {
                from: CallStatus::Acked,
                to: CallStatus::Pending
            })
        );
        assert!(
            t.advance(id, CallStatus::Acked).is_err(),
            "no self-transition"
        );
        t.finish(id, 0, b"x").unwrap();
        assert!(t.advance(id, CallStatus::Acked).is_err());
        t.complete(id).unwrap();
        assert!(
            matches!(t.status(id), Err(CallError::UnknownCall(_))),
            "freed id is stale"
        );
        let id2 = t.begin().unwrap();
        assert_ne!(id, id2, "a reused entry gets a new generation");
    }

    #[test]
    fn replies_round_trip_and_drive_the_table() {
        let t = CallTable::new(4);
        let id = t.begin().unwrap();
        let mut slot = [0u8; 64];
        let ack = Reply {
            id,
            status: CallStatus::Acked,
            code: 0,
            result: &[],
        };
        let n = write_reply(&mut slot, &ack).unwrap();
        assert_eq!(n, REPLY_HEADER);
        assert_eq!(parse_reply(&slot[..n]).unwrap(), ack);
        t.apply(&parse_reply(&slot[..n]).unwrap()).unwrap();
        assert_eq!(t.status(id).unwrap(), CallStatus::Acked);
        let done = Reply {
            id,
            status: CallStatus::Finished,
            code: 7,
            result: b"xyz",
        };
        let n = write_reply(&mut slot, &done).unwrap();
        assert_eq!(parse_reply(&slot[..n]).unwrap(), done);
        t.apply(&parse_reply(&slot[..n]).unwrap()).unwrap();
        assert_eq!(t.complete(id).unwrap(), (7, b"xyz".to_vec()));
        // A repeated ACK after FINISHED is refused, never applied backwards.
        let id2 = t.begin().unwrap();
        t.apply(&Reply { id: id2, ..done }).unwrap();
        assert!(matches!(
            t.apply(&Reply { id: id2, ..ack }),
            Err(CallError::Backwards { .. })
        ));
    }

    #[test]
    fn malformed_replies_are_rejected_with_a_reason() {
        let e = |m: &[u8]| parse_reply(m).err().unwrap().to_string();
        assert!(e(&[0; 5]).contains("shorter than the 16-byte reply header"));
        let mut m = [0u8; 16];
        m[8..10].copy_from_slice(&STATUS_PENDING.to_le_bytes());
        assert!(e(&m).contains("neither ACKED"));
        let mut m = [0u8; 20];
        m[8..10].copy_from_slice(&STATUS_ACKED.to_le_bytes());
        assert!(e(&m).contains("an ACKED reply carries 4 bytes"));
        let big = [0u8; 40];
        let r = Reply {
            id: CallId(1),
            status: CallStatus::Finished,
            code: 0,
            result: &big,
        };
        let err = write_reply(&mut [0u8; 32], &r).err().unwrap().to_string();
        assert!(err.contains("does not fit a 32-byte reply slot"), "{err}");
    }

    #[test]
    fn a_request_that_does_not_fit_its_slot_says_so() {
        let h = RequestHeader {
            id: CallId(1),
            method: 1,
            ty: CallType::InOut,
            invocation: Invocation::Simple,
        };
        let e = write_request(&mut [0u8; 24], &h, &"x".repeat(100))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("must fit the 8 bytes after the header"), "{e}");
        let e = write_request(&mut [0u8; 8], &h, &())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("smaller than the 16-byte call header"), "{e}");
    }

    #[test]
    fn table_full_is_reported() {
        let t = CallTable::new(1);
        t.begin().unwrap();
        assert_eq!(t.begin(), Err(CallError::TableFull(1)));
    }

    #[test]
    fn malformed_requests_are_rejected_with_a_reason() {
        assert!(
            parse_request(&[0; 3])
                .err()
                .unwrap()
                .to_string()
                .contains("shorter")
        );
        let mut m = [0u8; 16];
        m[10] = 9;
        assert!(
            parse_request(&m)
                .err()
                .unwrap()
                .to_string()
                .contains("call type 9")
        );
        m[10] = 1;
        m[11] = 0;
        m[12] = 77;
        assert!(
            parse_request(&m)
                .err()
                .unwrap()
                .to_string()
                .contains("encoding tag 77")
        );
    }

    #[test]
    fn undecodable_arguments_fail_the_call() {
        let (mut caller, mut callee) = pair(8);
        // 0xff is a varint with its continuation bit set and nothing after it.
        let call = caller
            .call(1, &u8::MAX, CallType::InOut, Invocation::Extended)
            .unwrap();
        let r = callee.serve_one(|r| r.decode::<u64>(), |_, _| (0, vec![]));
        assert!(matches!(r, Err(CallError::Decode { .. })));
        assert!(matches!(
            call.wait(Duration::from_secs(1)),
            Err(CallError::Failed(_))
        ));
    }

    #[test]
    fn concurrent_calls_observe_monotonic_status() {
        let (mut caller, mut callee) = pair(64);
        let server = std::thread::spawn(move || {
            let mut n = 0;
            while n < 500 {
                if callee
                    .serve_one(
                        |r| r.decode::<u32>(),
                        |_, v| (0, encode_result(&(v * 2)).unwrap()),
                    )
                    .unwrap()
                {
                    n += 1;
                }
            }
        });
        for i in 0..500u32 {
            let call = loop {
                match caller.call(3, &i, CallType::InOut, Invocation::Extended) {
                    Ok(c) => break c,
                    Err(CallError::ChannelFull) | Err(CallError::TableFull(_)) => {
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            let mut last = CallStatus::Pending;
            loop {
                let s = call.status().unwrap();
                assert!(s >= last, "status went from {last:?} back to {s:?}");
                last = s;
                if s == CallStatus::Finished {
                    break;
                }
            }
            assert_eq!(call.wait_for::<u32>(Duration::from_secs(5)).unwrap(), i * 2);
        }
        server.join().unwrap();
    }
}
