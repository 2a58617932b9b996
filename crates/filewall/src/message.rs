//! Whole RPC messages of the three programs FileWall serves (NFSv3, MOUNT v3,
//! portmapper v2): a call decoded into header plus typed arguments, or refused with
//! the error that says which RPC error reply it deserves; a reply decoded given the
//! procedure of its pending call. Input is one record (TCP) or one datagram (UDP).
//! [`Msg`] is what travels through the policy chain: a call with its client flow,
//! or a reply.

use crate::mount::{self, MountCall, MountProc, MountReply};
use crate::nfs3::{self, Nfs3Call, Nfs3Proc, Nfs3Reply};
use crate::pending::FlowId;
use crate::portmap::{self, PmapCall, PmapProc, PmapReply};
use crate::rpc::{AcceptStat, Auth, CallHeader, RPC_VERSION, ReplyBody, ReplyHeader, RpcHeader};
use crate::xdr::{Decoder, Encoder, Xdr, XdrError, XdrErrorKind, XdrResult};

/// A procedure of a served program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Procedure {
    Nfs3(Nfs3Proc),
    Mount3(MountProc),
    Portmap2(PmapProc),
}

/// Typed call arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallArgs {
    Nfs3(Nfs3Call),
    Mount3(MountCall),
    Portmap2(PmapCall),
}

impl CallArgs {
    pub fn procedure(&self) -> Procedure {
        match self {
            CallArgs::Nfs3(c) => Procedure::Nfs3(c.procedure()),
            CallArgs::Mount3(c) => Procedure::Mount3(c.procedure()),
            CallArgs::Portmap2(c) => Procedure::Portmap2(c.procedure()),
        }
    }

    /// (program, version, procedure) numbers for the header.
    pub fn numbers(&self) -> (u32, u32, u32) {
        match self {
            CallArgs::Nfs3(c) => (nfs3::PROGRAM, nfs3::VERSION, c.procedure().to_u32()),
            CallArgs::Mount3(c) => (mount::PROGRAM, mount::VERSION, c.procedure().to_u32()),
            CallArgs::Portmap2(c) => (portmap::PROGRAM, portmap::VERSION, c.procedure().to_u32()),
        }
    }
}

/// Typed reply results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyResults {
    Nfs3(Nfs3Reply),
    Mount3(MountReply),
    Portmap2(PmapReply),
}

/// A decoded call. The header's program, version and procedure agree with `args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub xid: u32,
    pub cred: Auth,
    pub verf: Auth,
    pub args: CallArgs,
}

impl Call {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut enc = Encoder::new();
        self.encode_into(&mut enc);
        enc.into_bytes()
    }

    /// Appends its encoding to `enc`.
    pub fn encode_into(&self, enc: &mut Encoder) {
        let (prog, vers, proc_num) = self.args.numbers();
        let header = RpcHeader::Call(CallHeader {
            xid: self.xid,
            rpcvers: RPC_VERSION,
            prog,
            vers,
            proc_num,
            cred: self.cred.clone(),
            verf: self.verf.clone(),
        });
        header.encode(enc);
        match &self.args {
            CallArgs::Nfs3(a) => a.encode(enc),
            CallArgs::Mount3(a) => a.encode(enc),
            CallArgs::Portmap2(a) => a.encode(enc),
        }
    }
}

/// A call FileWall cannot pass on, and what to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Not even a header: nothing can be answered, drop it.
    #[error("unreadable RPC header: {0}")]
    Header(XdrError),
    #[error("xid {xid:#x}: a reply arrived where a call was expected")]
    NotACall { xid: u32 },
    #[error("xid {xid:#x}: RPC version {got}, only 2 is spoken")]
    RpcVersion { xid: u32, got: u32 },
    #[error("xid {xid:#x}: program {prog} is not served")]
    ProgUnavail { xid: u32, prog: u32 },
    #[error("xid {xid:#x}: program {prog} version {vers} is not served (only {low}..={high})")]
    ProgMismatch {
        xid: u32,
        prog: u32,
        vers: u32,
        low: u32,
        high: u32,
    },
    #[error("xid {xid:#x}: program {prog} version {vers} has no procedure {proc_num}")]
    ProcUnavail {
        xid: u32,
        prog: u32,
        vers: u32,
        proc_num: u32,
    },
    #[error("xid {xid:#x}: garbage arguments: {source}")]
    GarbageArgs { xid: u32, source: XdrError },
}

impl CallError {
    /// The RPC error reply the client should get, or `None` for `Header` and
    /// `NotACall` (drop those silently).
    pub fn reply(&self) -> Option<ReplyHeader> {
        let accepted = |xid, stat| ReplyHeader {
            xid,
            body: ReplyBody::Accepted {
                verf: Auth::None,
                stat,
            },
        };
        match *self {
            CallError::Header(_) | CallError::NotACall { .. } => None,
            CallError::RpcVersion { xid, .. } => Some(ReplyHeader {
                xid,
                body: ReplyBody::RpcMismatch {
                    low: RPC_VERSION,
                    high: RPC_VERSION,
                },
            }),
            CallError::ProgUnavail { xid, .. } => Some(accepted(xid, AcceptStat::ProgUnavail)),
            CallError::ProgMismatch { xid, low, high, .. } => {
                Some(accepted(xid, AcceptStat::ProgMismatch { low, high }))
            }
            CallError::ProcUnavail { xid, .. } => Some(accepted(xid, AcceptStat::ProcUnavail)),
            CallError::GarbageArgs { xid, .. } => Some(accepted(xid, AcceptStat::GarbageArgs)),
        }
    }
}

fn procedure_of(h: &CallHeader) -> Result<Procedure, CallError> {
    let (xid, prog, vers, proc_num) = (h.xid, h.prog, h.vers, h.proc_num);
    let (version, found) = match prog {
        nfs3::PROGRAM => (
            nfs3::VERSION,
            Nfs3Proc::from_u32(proc_num).map(Procedure::Nfs3),
        ),
        mount::PROGRAM => (
            mount::VERSION,
            MountProc::from_u32(proc_num).map(Procedure::Mount3),
        ),
        portmap::PROGRAM => (
            portmap::VERSION,
            PmapProc::from_u32(proc_num).map(Procedure::Portmap2),
        ),
        _ => return Err(CallError::ProgUnavail { xid, prog }),
    };
    if vers != version {
        return Err(CallError::ProgMismatch {
            xid,
            prog,
            vers,
            low: version,
            high: version,
        });
    }
    found.ok_or(CallError::ProcUnavail {
        xid,
        prog,
        vers,
        proc_num,
    })
}

/// Decodes one call message.
pub fn decode_call(bytes: &[u8]) -> Result<Call, CallError> {
    let mut dec = Decoder::new(bytes);
    let header = match RpcHeader::decode(&mut dec).map_err(CallError::Header)? {
        RpcHeader::Call(h) => h,
        RpcHeader::Reply(r) => return Err(CallError::NotACall { xid: r.xid }),
    };
    if header.rpcvers != RPC_VERSION {
        return Err(CallError::RpcVersion {
            xid: header.xid,
            got: header.rpcvers,
        });
    }
    let xid = header.xid;
    let garbage = |source| CallError::GarbageArgs { xid, source };
    let args = match procedure_of(&header)? {
        Procedure::Nfs3(p) => CallArgs::Nfs3(Nfs3Call::decode(p, &mut dec).map_err(garbage)?),
        Procedure::Mount3(p) => CallArgs::Mount3(MountCall::decode(p, &mut dec).map_err(garbage)?),
        Procedure::Portmap2(p) => {
            CallArgs::Portmap2(PmapCall::decode(p, &mut dec).map_err(garbage)?)
        }
    };
    dec.finish().map_err(garbage)?;
    Ok(Call {
        xid,
        cred: header.cred,
        verf: header.verf,
        args,
    })
}

/// A decoded reply; `results` is present exactly when the call was accepted and
/// succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub header: ReplyHeader,
    pub results: Option<ReplyResults>,
}

impl Reply {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut enc = Encoder::new();
        self.encode_into(&mut enc);
        enc.into_bytes()
    }

    /// Appends its encoding to `enc`.
    pub fn encode_into(&self, enc: &mut Encoder) {
        RpcHeader::Reply(self.header.clone()).encode(enc);
        match &self.results {
            None => {}
            Some(ReplyResults::Nfs3(r)) => r.encode(enc),
            Some(ReplyResults::Mount3(r)) => r.encode(enc),
            Some(ReplyResults::Portmap2(r)) => r.encode(enc),
        }
    }
}

/// The XID and header of a reply, and the offset where its results start: enough to
/// find the pending call before the results are decoded.
pub fn decode_reply_header(bytes: &[u8]) -> XdrResult<(ReplyHeader, usize)> {
    let mut dec = Decoder::new(bytes);
    match RpcHeader::decode(&mut dec)? {
        RpcHeader::Reply(h) => Ok((h, dec.offset())),
        RpcHeader::Call(_) => Err(XdrError::new(
            4,
            XdrErrorKind::BadDiscriminant {
                ty: "msg_type (a call where a reply was expected)",
                value: 0,
            },
        )),
    }
}

/// Decodes one reply to a call of `procedure`.
pub fn decode_reply(bytes: &[u8], procedure: Procedure) -> XdrResult<Reply> {
    let (header, at) = decode_reply_header(bytes)?;
    let mut dec = Decoder::with_base(bytes.get(at..).unwrap_or_default(), at);
    let results = match header.body {
        ReplyBody::Accepted {
            stat: AcceptStat::Success,
            ..
        } => Some(match procedure {
            Procedure::Nfs3(p) => ReplyResults::Nfs3(Nfs3Reply::decode(p, &mut dec)?),
            Procedure::Mount3(p) => ReplyResults::Mount3(MountReply::decode(p, &mut dec)?),
            Procedure::Portmap2(p) => ReplyResults::Portmap2(PmapReply::decode(p, &mut dec)?),
        }),
        _ => None,
    };
    dec.finish()?;
    Ok(Reply { header, results })
}

/// A procedure's name in the counters: program label and procedure.
pub fn procedure_name(p: Procedure) -> String {
    match p {
        Procedure::Nfs3(p) => format!("NFSv3 {p:?}"),
        Procedure::Mount3(p) => format!("MOUNTv3 {p:?}"),
        Procedure::Portmap2(p) => format!("PMAPv2 {p:?}"),
    }
}

/// The peer address a call carries when none is known.
pub const NO_PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// A message in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A call from client flow `flow`, whose peer is at `peer` (its XID is the
    /// client's; in a request a policy generated, the XID is the policy's own
    /// correlation token).
    Call {
        flow: FlowId,
        peer: std::net::IpAddr,
        call: Call,
    },
    /// A reply (its XID is rewritten to the client's when it leaves).
    Reply(Reply),
    /// A server reply whose results did not decode, as received; the handle policy
    /// drops these (it cannot see their handles).
    RawReply(Vec<u8>),
}
