//! DisCo's messages: the coherence exchange (request, forward, grant,
//! confirm, invalidate, release), the seed's named messages (`VNODECHMAN`,
//! `ACK`, `VNODECLOSE`, `VNODEWRITE`, the `STREAM*` family,
//! `PUSH_ANON_REMAP`, `ANON_REMAP`, `ALIAS`) and the chunk notices the seed
//! leaves unnamed. Plain data with serde: the node protocol
//! (`sidecore-wire`) carries them as JSON, byte payloads as base64.

use serde::{Deserialize, Serialize};

use crate::b64;
use crate::b64opt;
use crate::types::{Access, Endpoint, ObjectId, VnodeId};

/// Largest payload one message may carry (a region, a stream push).
pub const MAX_PAYLOAD_BYTES: usize = 512 * 1024;
/// Most entries a list in one message may hold (copysets, queues, regions).
pub const MAX_LIST_ITEMS: usize = 4096;

/// A queued request carried to a new manager by `VNODECHMAN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Queued {
    pub from: Endpoint,
    pub kind: QueuedKind,
    /// For a request: the read copy the requester holds.
    #[serde(default)]
    pub have: Option<u64>,
}

/// What a queued entry asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueuedKind {
    Request(Access),
    /// A sharer's release of the copy granted as `grant`.
    SharerRelease {
        grant: u64,
    },
    /// The owner's release.
    OwnerRelease,
}

/// Ownership handed over with a manager change (the old manager was owner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ownership {
    #[serde(with = "b64")]
    pub data: Vec<u8>,
    pub dirty: bool,
    /// Sharers and the grant each holds.
    pub copyset: Vec<(Endpoint, u64)>,
    pub next_grant: u64,
}

/// One DisCo message. `obj` names the coherent object (a physical region, a
/// vnode's lists, a stream record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "m", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum Msg {
    /// Requester → manager: `from` wants `access` (Ivy's fault); `have`
    /// names the read copy it still holds, if any.
    Request {
        obj: ObjectId,
        from: Endpoint,
        access: Access,
        #[serde(default)]
        have: Option<u64>,
    },
    /// Manager → owner: serve `from`'s request.
    Forward {
        obj: ObjectId,
        from: Endpoint,
        access: Access,
        #[serde(default)]
        have: Option<u64>,
    },
    /// Owner → requester: the access, with the data unless the requester
    /// already holds the current copy; on a write, the copyset to invalidate.
    Grant {
        obj: ObjectId,
        access: Access,
        #[serde(with = "b64opt", default)]
        data: Option<Vec<u8>>,
        dirty: bool,
        /// The grant number of this copy (for reads).
        grant: u64,
        /// Write: sharers to invalidate; read: empty.
        copyset: Vec<(Endpoint, u64)>,
        next_grant: u64,
    },
    /// Requester → manager: the request completed; unlock.
    Confirm { obj: ObjectId, from: Endpoint },
    /// New owner → sharer: drop the copy.
    Invalidate { obj: ObjectId, from: Endpoint },
    /// Sharer → new owner: dropped.
    InvAck { obj: ObjectId, from: Endpoint },
    /// Holder → manager (forwarded to the owner for a sharer): return the
    /// resource. `grant` names a sharer's copy; `owner` marks the owner's.
    Release {
        obj: ObjectId,
        from: Endpoint,
        grant: u64,
        owner: bool,
    },
    /// Manager → releasing owner: accepted; send the state.
    ReleaseAck { obj: ObjectId },
    /// Releasing owner → manager: the data and sharers; the manager owns now.
    ReleaseData {
        obj: ObjectId,
        from: Endpoint,
        own: Ownership,
    },
    /// Old manager → every endpoint with the object open (§5.1.2): `manager`
    /// manages it now. The new manager's copy also carries the owner, the
    /// queue and, if the old manager owned it, the ownership.
    Vnodechman {
        obj: ObjectId,
        /// Manager changes of this object so far, this one included: a
        /// change overtaken by a later one (from another sender) is only
        /// acknowledged.
        epoch: u64,
        manager: Endpoint,
        owner: Option<Endpoint>,
        queue: Vec<Queued>,
        open: Vec<Endpoint>,
        own: Option<Ownership>,
    },
    /// Answer to the `VNODECHMAN` of `epoch`.
    Ack {
        obj: ObjectId,
        from: Endpoint,
        epoch: u64,
    },
    /// Closing endpoint → vnode manager (§6.2.4): drop `from` from the
    /// copysets of these regions.
    Vnodeclose {
        vnode: VnodeId,
        from: Endpoint,
        regions: Vec<ObjectId>,
    },
    /// Writer → client in write-through mode (§6.3.3), or at approval of a
    /// write-back overlay: write `data` at `offset` of the client's file.
    Vnodewrite {
        vnode: VnodeId,
        offset: u64,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Stream writer → reader: bytes for the buffer (§6.4).
    Streampush {
        vnode: VnodeId,
        #[serde(with = "b64")]
        data: Vec<u8>,
        /// The stream ends after these bytes.
        eof: bool,
    },
    /// Stream reader → writer: the window grew by `delta` bytes.
    Streamstat { vnode: VnodeId, delta: u64 },
    /// New active reader → holder of the buffer: send it here.
    Streamreqbuf { vnode: VnodeId, from: Endpoint },
    /// Old holder → new active reader: the buffer.
    Streampushbuf {
        vnode: VnodeId,
        #[serde(with = "b64")]
        data: Vec<u8>,
        eof: bool,
    },
    /// A reader or writer appeared on an endpoint (§6.4).
    Streampresent {
        vnode: VnodeId,
        from: Endpoint,
        writer: bool,
    },
    /// The last reader or writer on an endpoint went away.
    Streamabsent {
        vnode: VnodeId,
        from: Endpoint,
        writer: bool,
    },
    /// Migration (§8.2): the contents of a page; place it in a new page this
    /// endpoint manages and map virtual page `vpage` to it.
    PushAnonRemap {
        vpage: u64,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// An unwritten page: map `vpage` to a new zero page.
    AnonRemap { vpage: u64 },
    /// Map `vpage` to the physical page behind `target`.
    Alias { vpage: u64, target: u64 },
    /// A chunk of the physical space changed hands (or was reclaimed: `None`).
    ChunkNotice {
        chunk: u32,
        manager: Option<Endpoint>,
    },
}

/// A message that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed DisCo message: {0}")]
    Json(String),
    #[error(
        "DisCo message `{kind}` carries {got} bytes, more than the {MAX_PAYLOAD_BYTES}-byte limit"
    )]
    TooLarge { kind: &'static str, got: usize },
    #[error("DisCo message `{kind}` lists {got} items, more than the {MAX_LIST_ITEMS}-item limit")]
    TooMany { kind: &'static str, got: usize },
}

impl Msg {
    /// The message's name as the seed writes it.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Request { .. } => "REQUEST",
            Msg::Forward { .. } => "FORWARD",
            Msg::Grant { .. } => "GRANT",
            Msg::Confirm { .. } => "CONFIRM",
            Msg::Invalidate { .. } => "INVALIDATE",
            Msg::InvAck { .. } => "INV_ACK",
            Msg::Release { .. } => "RELEASE",
            Msg::ReleaseAck { .. } => "RELEASE_ACK",
            Msg::ReleaseData { .. } => "RELEASE_DATA",
            Msg::Vnodechman { .. } => "VNODECHMAN",
            Msg::Ack { .. } => "ACK",
            Msg::Vnodeclose { .. } => "VNODECLOSE",
            Msg::Vnodewrite { .. } => "VNODEWRITE",
            Msg::Streampush { .. } => "STREAMPUSH",
            Msg::Streamstat { .. } => "STREAMSTAT",
            Msg::Streamreqbuf { .. } => "STREAMREQBUF",
            Msg::Streampushbuf { .. } => "STREAMPUSHBUF",
            Msg::Streampresent { .. } => "STREAMPRESENT",
            Msg::Streamabsent { .. } => "STREAMABSENT",
            Msg::PushAnonRemap { .. } => "PUSH_ANON_REMAP",
            Msg::AnonRemap { .. } => "ANON_REMAP",
            Msg::Alias { .. } => "ALIAS",
            Msg::ChunkNotice { .. } => "CHUNK_NOTICE",
        }
    }

    /// The coherent object a coherence message is about.
    #[must_use]
    pub fn object(&self) -> Option<ObjectId> {
        match self {
            Msg::Request { obj, .. }
            | Msg::Forward { obj, .. }
            | Msg::Grant { obj, .. }
            | Msg::Confirm { obj, .. }
            | Msg::Invalidate { obj, .. }
            | Msg::InvAck { obj, .. }
            | Msg::Release { obj, .. }
            | Msg::ReleaseAck { obj }
            | Msg::ReleaseData { obj, .. }
            | Msg::Vnodechman { obj, .. }
            | Msg::Ack { obj, .. } => Some(*obj),
            _ => None,
        }
    }

    /// Checks the limits a decoded message must respect.
    pub fn check(&self) -> Result<(), DecodeError> {
        let kind = self.kind();
        let bytes = match self {
            Msg::Grant { data, .. } => data.as_ref().map_or(0, Vec::len),
            Msg::ReleaseData { own, .. } => own.data.len(),
            Msg::Vnodechman { own, .. } => own.as_ref().map_or(0, |o| o.data.len()),
            Msg::Vnodewrite { data, .. }
            | Msg::Streampush { data, .. }
            | Msg::Streampushbuf { data, .. }
            | Msg::PushAnonRemap { data, .. } => data.len(),
            _ => 0,
        };
        if bytes > MAX_PAYLOAD_BYTES {
            return Err(DecodeError::TooLarge { kind, got: bytes });
        }
        let items = match self {
            Msg::Grant { copyset, .. } => copyset.len(),
            Msg::ReleaseData { own, .. } => own.copyset.len(),
            Msg::Vnodechman {
                queue, open, own, ..
            } => queue.len() + open.len() + own.as_ref().map_or(0, |o| o.copyset.len()),
            Msg::Vnodeclose { regions, .. } => regions.len(),
            _ => 0,
        };
        if items > MAX_LIST_ITEMS {
            return Err(DecodeError::TooMany { kind, got: items });
        }
        Ok(())
    }

    /// JSON bytes of the message.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads and checks a message.
    pub fn decode(bytes: &[u8]) -> Result<Msg, DecodeError> {
        let m: Msg = serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        m.check()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_messages_round_trip_with_the_seeds_names() {
        let m = Msg::Vnodewrite {
            vnode: VnodeId(7),
            offset: 4096,
            data: b"hello".to_vec(),
        };
        let j = String::from_utf8(m.encode()).unwrap();
        assert!(j.contains(r#""m":"VNODEWRITE""#), "{j}");
        assert!(j.contains(r#""data":"aGVsbG8=""#), "{j}");
        assert_eq!(Msg::decode(j.as_bytes()).unwrap(), m);
        let c = Msg::Vnodechman {
            obj: ObjectId(1 << 32),
            epoch: 1,
            manager: Endpoint(2),
            owner: Some(Endpoint(3)),
            queue: vec![Queued {
                from: Endpoint(4),
                kind: QueuedKind::Request(Access::Write),
                have: None,
            }],
            open: vec![Endpoint(2), Endpoint(3)],
            own: None,
        };
        assert_eq!(Msg::decode(&c.encode()).unwrap(), c);
        assert_eq!(c.kind(), "VNODECHMAN");
    }

    #[test]
    fn bad_messages_are_named() {
        let e = Msg::decode(br#"{"m":"EXPLODE"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `EXPLODE`"), "{e}");
        let e = Msg::decode(br#"{"m":"VNODEWRITE","vnode":1,"offset":0,"data":"!!"}"#).unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
        let big = Msg::Streampush {
            vnode: VnodeId(1),
            data: vec![0; MAX_PAYLOAD_BYTES + 1],
            eof: false,
        };
        let e = Msg::decode(&big.encode()).unwrap_err();
        assert!(
            matches!(
                e,
                DecodeError::TooLarge {
                    kind: "STREAMPUSH",
                    ..
                }
            ),
            "{e}"
        );
    }
}
