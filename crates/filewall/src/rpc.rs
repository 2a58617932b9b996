//! ONC RPC version 2 message headers (RFC 5531 §9): calls with their credential and
//! verifier, accepted and denied replies, and the AUTH_NONE / AUTH_SYS flavors.
//! Procedure arguments and results follow the header; `message` dispatches them.

use crate::xdr::{Decoder, Encoder, Xdr, XdrError, XdrErrorKind, XdrResult, xdr_enum};

/// The only RPC protocol version (`rpcvers`).
pub const RPC_VERSION: u32 = 2;
/// Largest credential or verifier body.
pub const MAX_AUTH_BYTES: usize = 400;
/// Longest AUTH_SYS machine name.
pub const MAX_MACHINE_NAME: usize = 255;
/// Most supplementary groups in AUTH_SYS.
pub const MAX_AUTH_SYS_GIDS: usize = 16;

/// `authsys_parms` (AUTH_SYS, flavor 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSys {
    pub stamp: u32,
    pub machine_name: Vec<u8>,
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

impl Xdr for AuthSys {
    fn encode(&self, enc: &mut Encoder) {
        enc.u32(self.stamp);
        enc.opaque(&self.machine_name);
        enc.u32(self.uid);
        enc.u32(self.gid);
        enc.array(&self.gids);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Self {
            stamp: dec.field("authsys_parms.stamp")?,
            machine_name: dec
                .opaque(MAX_MACHINE_NAME)
                .map_err(|e| e.within("authsys_parms.machinename"))?
                .to_vec(),
            uid: dec.field("authsys_parms.uid")?,
            gid: dec.field("authsys_parms.gid")?,
            gids: dec
                .array(MAX_AUTH_SYS_GIDS)
                .map_err(|e| e.within("authsys_parms.gids"))?,
        })
    }
}

/// An `opaque_auth`: credential or verifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// AUTH_NONE with an empty body.
    None,
    /// AUTH_SYS; the body must hold exactly one `authsys_parms`.
    Sys(AuthSys),
    /// Any other flavor (or AUTH_NONE with a body), kept as bytes.
    Other { flavor: u32, body: Vec<u8> },
}

pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;

impl Auth {
    pub fn flavor(&self) -> u32 {
        match self {
            Auth::None => AUTH_NONE,
            Auth::Sys(_) => AUTH_SYS,
            Auth::Other { flavor, .. } => *flavor,
        }
    }
}

impl Xdr for Auth {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            Auth::None => {
                enc.u32(AUTH_NONE);
                enc.u32(0);
            }
            Auth::Sys(sys) => {
                enc.u32(AUTH_SYS);
                enc.opaque(&sys.to_xdr());
            }
            Auth::Other { flavor, body } => {
                enc.u32(*flavor);
                enc.opaque(body);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let flavor = dec.field::<u32>("opaque_auth.flavor")?;
        let body_at = dec.offset() + 4;
        let body = dec
            .opaque(MAX_AUTH_BYTES)
            .map_err(|e| e.within("opaque_auth.body"))?;
        match flavor {
            AUTH_NONE if body.is_empty() => Ok(Auth::None),
            AUTH_SYS => {
                let mut inner = Decoder::with_base(body, body_at);
                let sys = AuthSys::decode(&mut inner)?;
                inner.finish().map_err(|e| e.within("authsys_parms"))?;
                Ok(Auth::Sys(sys))
            }
            _ => Ok(Auth::Other {
                flavor,
                body: body.to_vec(),
            }),
        }
    }
}

/// `call_body` up to (not including) the procedure arguments, with the XID. Its XDR
/// form (with `msg_type`) is written by [`RpcHeader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader {
    pub xid: u32,
    /// Must be [`RPC_VERSION`]; kept so a mismatch can be answered with RPC_MISMATCH.
    pub rpcvers: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_num: u32,
    pub cred: Auth,
    pub verf: Auth,
}

xdr_enum! {
    /// `auth_stat`: why a call's credentials were refused.
    pub enum AuthStat {
        Ok = 0, BadCred = 1, RejectedCred = 2, BadVerf = 3, RejectedVerf = 4, TooWeak = 5,
        InvalidResp = 6, Failed = 7, KerbGeneric = 8, TimeExpire = 9, TktFile = 10,
        Decode = 11, NetAddr = 12, GssCredProblem = 13, GssCtxProblem = 14,
    }
}

/// `accept_stat` with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptStat {
    /// Results follow the header.
    Success,
    ProgUnavail,
    ProgMismatch {
        low: u32,
        high: u32,
    },
    ProcUnavail,
    GarbageArgs,
    SystemErr,
}

/// A reply's body after the XID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyBody {
    Accepted { verf: Auth, stat: AcceptStat },
    RpcMismatch { low: u32, high: u32 },
    AuthError(AuthStat),
}

/// A reply header; on `Accepted`/`Success` the results follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyHeader {
    pub xid: u32,
    pub body: ReplyBody,
}

const CALL: u32 = 0;
const REPLY: u32 = 1;

impl Xdr for ReplyBody {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            ReplyBody::Accepted { verf, stat } => {
                enc.u32(0);
                verf.encode(enc);
                match stat {
                    AcceptStat::Success => enc.u32(0),
                    AcceptStat::ProgUnavail => enc.u32(1),
                    AcceptStat::ProgMismatch { low, high } => {
                        enc.u32(2);
                        enc.u32(*low);
                        enc.u32(*high);
                    }
                    AcceptStat::ProcUnavail => enc.u32(3),
                    AcceptStat::GarbageArgs => enc.u32(4),
                    AcceptStat::SystemErr => enc.u32(5),
                }
            }
            ReplyBody::RpcMismatch { low, high } => {
                enc.u32(1);
                enc.u32(0);
                enc.u32(*low);
                enc.u32(*high);
            }
            ReplyBody::AuthError(stat) => {
                enc.u32(1);
                enc.u32(1);
                stat.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let bad =
            |at: usize, ty, value| XdrError::new(at, XdrErrorKind::BadDiscriminant { ty, value });
        let at = dec.offset();
        match dec.u32()? {
            0 => {
                let verf = dec.field("accepted_reply.verf")?;
                let at = dec.offset();
                let stat = match dec.u32()? {
                    0 => AcceptStat::Success,
                    1 => AcceptStat::ProgUnavail,
                    2 => AcceptStat::ProgMismatch {
                        low: dec.field("mismatch_info.low")?,
                        high: dec.field("mismatch_info.high")?,
                    },
                    3 => AcceptStat::ProcUnavail,
                    4 => AcceptStat::GarbageArgs,
                    5 => AcceptStat::SystemErr,
                    v => return Err(bad(at, "accept_stat", v)),
                };
                Ok(ReplyBody::Accepted { verf, stat })
            }
            1 => {
                let at = dec.offset();
                match dec.u32()? {
                    0 => Ok(ReplyBody::RpcMismatch {
                        low: dec.field("rejected_reply.low")?,
                        high: dec.field("rejected_reply.high")?,
                    }),
                    1 => Ok(ReplyBody::AuthError(dec.field("rejected_reply.stat")?)),
                    v => Err(bad(at, "reject_stat", v)),
                }
            }
            v => Err(bad(at, "reply_stat", v)),
        }
    }
}

/// An RPC message header: a call or a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcHeader {
    Call(CallHeader),
    Reply(ReplyHeader),
}

impl RpcHeader {
    pub fn xid(&self) -> u32 {
        match self {
            RpcHeader::Call(c) => c.xid,
            RpcHeader::Reply(r) => r.xid,
        }
    }
}

impl Xdr for RpcHeader {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            RpcHeader::Call(c) => {
                enc.u32(c.xid);
                enc.u32(CALL);
                c.rpcvers.encode(enc);
                c.prog.encode(enc);
                c.vers.encode(enc);
                c.proc_num.encode(enc);
                c.cred.encode(enc);
                c.verf.encode(enc);
            }
            RpcHeader::Reply(r) => {
                enc.u32(r.xid);
                enc.u32(REPLY);
                r.body.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let xid = dec.field("rpc_msg.xid")?;
        let at = dec.offset();
        match dec.u32()? {
            CALL => Ok(RpcHeader::Call(CallHeader {
                xid,
                rpcvers: dec.field("call_body.rpcvers")?,
                prog: dec.field("call_body.prog")?,
                vers: dec.field("call_body.vers")?,
                proc_num: dec.field("call_body.proc")?,
                cred: dec.field("call_body.cred")?,
                verf: dec.field("call_body.verf")?,
            })),
            REPLY => Ok(RpcHeader::Reply(ReplyHeader {
                xid,
                body: dec.field("rpc_msg.reply")?,
            })),
            value => Err(XdrError::new(
                at,
                XdrErrorKind::BadDiscriminant {
                    ty: "msg_type",
                    value,
                },
            )),
        }
    }
}

#[cfg(test)]
mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    impl Arbitrary for AuthSys {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            (
                any::<u32>(),
                prop::collection::vec(any::<u8>(), 0..=MAX_MACHINE_NAME),
                any::<u32>(),
                any::<u32>(),
                prop::collection::vec(any::<u32>(), 0..=MAX_AUTH_SYS_GIDS),
            )
                .prop_map(|(stamp, machine_name, uid, gid, gids)| AuthSys {
                    stamp,
                    machine_name,
                    uid,
                    gid,
                    gids,
                })
                .boxed()
        }
    }

    impl Arbitrary for Auth {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            prop_oneof![
                Just(Auth::None),
                any::<AuthSys>().prop_map(Auth::Sys),
                (
                    2u32..20,
                    prop::collection::vec(any::<u8>(), 0..=MAX_AUTH_BYTES)
                )
                    .prop_map(|(flavor, body)| Auth::Other { flavor, body }),
                prop::collection::vec(any::<u8>(), 1..8).prop_map(|body| Auth::Other {
                    flavor: AUTH_NONE,
                    body
                })
            ]
            .boxed()
        }
    }

    impl Arbitrary for CallHeader {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<Auth>(),
                any::<Auth>(),
            )
                .prop_map(
                    |(xid, rpcvers, prog, vers, proc_num, cred, verf)| CallHeader {
                        xid,
                        rpcvers,
                        prog,
                        vers,
                        proc_num,
                        cred,
                        verf,
                    },
                )
                .boxed()
        }
    }

    impl Arbitrary for AcceptStat {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            prop_oneof![
                Just(AcceptStat::Success),
                Just(AcceptStat::ProgUnavail),
                (any::<u32>(), any::<u32>())
                    .prop_map(|(low, high)| AcceptStat::ProgMismatch { low, high }),
                Just(AcceptStat::ProcUnavail),
                Just(AcceptStat::GarbageArgs),
                Just(AcceptStat::SystemErr)
            ]
            .boxed()
        }
    }

    impl Arbitrary for ReplyBody {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            prop_oneof![
                (any::<Auth>(), any::<AcceptStat>())
                    .prop_map(|(verf, stat)| ReplyBody::Accepted { verf, stat }),
                (any::<u32>(), any::<u32>())
                    .prop_map(|(low, high)| ReplyBody::RpcMismatch { low, high }),
                any::<AuthStat>().prop_map(ReplyBody::AuthError)
            ]
            .boxed()
        }
    }

    impl Arbitrary for RpcHeader {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            prop_oneof![
                any::<CallHeader>().prop_map(RpcHeader::Call),
                (any::<u32>(), any::<ReplyBody>())
                    .prop_map(|(xid, body)| RpcHeader::Reply(ReplyHeader { xid, body }))
            ]
            .boxed()
        }
    }
}
