//! Property tests over the whole wire layer: every call and reply of every procedure
//! round-trips through encode and decode, accepted bytes re-encode identically, and
//! decoding arbitrary bytes returns an error instead of panicking.

use std::collections::HashSet;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use crate::message::{Call, CallArgs, Procedure, Reply, ReplyResults, decode_call, decode_reply};
use crate::mount::{MountCall, MountProc, MountReply};
use crate::nfs3::{Nfs3Call, Nfs3Proc, Nfs3Reply};
use crate::portmap::{PmapCall, PmapProc, PmapReply};
use crate::rpc::{AcceptStat, Auth, ReplyBody, ReplyHeader, RpcHeader};
use crate::xdr::{Decoder, Encoder, Xdr};

fn call_args() -> impl Strategy<Value = CallArgs> {
    prop_oneof![
        any::<Nfs3Call>().prop_map(CallArgs::Nfs3),
        any::<MountCall>().prop_map(CallArgs::Mount3),
        any::<PmapCall>().prop_map(CallArgs::Portmap2),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    (any::<u32>(), any::<Auth>(), any::<Auth>(), call_args()).prop_map(|(xid, cred, verf, args)| {
        Call {
            xid,
            cred,
            verf,
            args,
        }
    })
}

fn results() -> impl Strategy<Value = ReplyResults> {
    prop_oneof![
        any::<Nfs3Reply>().prop_map(ReplyResults::Nfs3),
        any::<MountReply>().prop_map(ReplyResults::Mount3),
        any::<PmapReply>().prop_map(ReplyResults::Portmap2),
    ]
}

fn procedure_of(r: &ReplyResults) -> Procedure {
    match r {
        ReplyResults::Nfs3(r) => Procedure::Nfs3(r.procedure()),
        ReplyResults::Mount3(r) => Procedure::Mount3(r.procedure()),
        ReplyResults::Portmap2(r) => Procedure::Portmap2(r.procedure()),
    }
}

/// A successful reply with results, or an unsuccessful one (results absent) paired
/// with some procedure.
fn reply() -> impl Strategy<Value = (Reply, Procedure)> {
    prop_oneof![
        (any::<u32>(), any::<Auth>(), results()).prop_map(|(xid, verf, r)| {
            let p = procedure_of(&r);
            let header = ReplyHeader {
                xid,
                body: ReplyBody::Accepted {
                    verf,
                    stat: AcceptStat::Success,
                },
            };
            (
                Reply {
                    header,
                    results: Some(r),
                },
                p,
            )
        }),
        (any::<u32>(), any::<ReplyBody>(), results()).prop_filter_map(
            "failures carry no results",
            |(xid, body, r)| {
                match body {
                    ReplyBody::Accepted {
                        stat: AcceptStat::Success,
                        ..
                    } => None,
                    body => Some((
                        Reply {
                            header: ReplyHeader { xid, body },
                            results: None,
                        },
                        procedure_of(&r),
                    )),
                }
            }
        ),
    ]
}

fn all_procedures() -> Vec<Procedure> {
    let mut v: Vec<Procedure> = Nfs3Proc::ALL.iter().map(|p| Procedure::Nfs3(*p)).collect();
    v.extend(MountProc::ALL.iter().map(|p| Procedure::Mount3(*p)));
    v.extend(PmapProc::ALL.iter().map(|p| Procedure::Portmap2(*p)));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn calls_round_trip(c in call()) {
        let bytes = c.to_bytes();
        prop_assert_eq!(decode_call(&bytes), Ok(c));
    }

    #[test]
    fn replies_round_trip((r, p) in reply()) {
        let bytes = r.to_bytes();
        prop_assert_eq!(decode_reply(&bytes, p), Ok(r));
    }

    #[test]
    fn headers_round_trip(h in any::<RpcHeader>()) {
        prop_assert_eq!(RpcHeader::from_xdr(&h.to_xdr()), Ok(h));
    }

    #[test]
    fn every_truncation_of_a_call_is_an_error(c in call()) {
        let bytes = c.to_bytes();
        for len in 0..bytes.len() {
            prop_assert!(decode_call(&bytes[..len]).is_err(), "prefix of {} bytes accepted", len);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_accepted_ones_re_encode(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(c) = decode_call(&bytes) {
            prop_assert_eq!(c.to_bytes(), bytes.clone());
        }
        for p in all_procedures() {
            if let Ok(r) = decode_reply(&bytes, p) {
                prop_assert_eq!(r.to_bytes(), bytes.clone());
            }
        }
        for p in Nfs3Proc::ALL {
            let mut dec = Decoder::new(&bytes);
            if let Ok(c) = Nfs3Call::decode(*p, &mut dec) {
                let mut enc = Encoder::new();
                c.encode(&mut enc);
                prop_assert_eq!(&enc.buf[..], &bytes[..dec.offset()]);
            }
            let _ = Nfs3Reply::decode(*p, &mut Decoder::new(&bytes));
        }
    }

    /// Arbitrary bytes behind a valid NFS call header exercise the argument decoders
    /// far more often than fully random input does.
    #[test]
    fn arbitrary_arguments_never_panic(proc_num in 0u32..22, body in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = RpcHeader::Call(crate::rpc::CallHeader {
            xid: 1, rpcvers: 2, prog: crate::nfs3::PROGRAM, vers: 3, proc_num, cred: Auth::None, verf: Auth::None,
        }).to_xdr();
        bytes.extend_from_slice(&body);
        if let Ok(c) = decode_call(&bytes) {
            prop_assert_eq!(c.to_bytes(), bytes);
        }
    }
}

/// Runs `strategy` until every procedure has been seen, checking each value's round
/// trip, so every message type is covered whatever the random union picks.
fn cover<T: std::fmt::Debug>(
    strategy: impl Strategy<Value = T>,
    key: impl Fn(&T) -> Procedure,
    check: impl Fn(&T),
) -> HashSet<Procedure> {
    let mut runner = TestRunner::deterministic();
    let mut seen = HashSet::new();
    for _ in 0..4000 {
        let v = strategy
            .new_tree(&mut runner)
            .expect("strategy generates")
            .current();
        check(&v);
        seen.insert(key(&v));
    }
    seen
}

#[test]
fn every_procedure_call_and_reply_round_trips() {
    let all: HashSet<Procedure> = all_procedures().into_iter().collect();
    let calls = cover(
        call(),
        |c| c.args.procedure(),
        |c| assert_eq!(decode_call(&c.to_bytes()).as_ref(), Ok(c)),
    );
    assert_eq!(calls, all, "calls not generated");
    let ok_replies = reply().prop_filter("results present", |(r, _)| r.results.is_some());
    let replies = cover(
        ok_replies,
        |(_, p)| *p,
        |(r, p)| assert_eq!(decode_reply(&r.to_bytes(), *p).as_ref(), Ok(r)),
    );
    assert_eq!(replies, all, "replies not generated");
}

#[test]
fn unknown_program_version_and_procedure_get_rpc_error_replies() {
    let header = |prog, vers, proc_num, rpcvers| {
        RpcHeader::Call(crate::rpc::CallHeader {
            xid: 9,
            rpcvers,
            prog,
            vers,
            proc_num,
            cred: Auth::None,
            verf: Auth::None,
        })
        .to_xdr()
    };
    let stat = |bytes: Vec<u8>| decode_call(&bytes).unwrap_err().reply().map(|r| r.body);
    let accepted = |stat| {
        Some(ReplyBody::Accepted {
            verf: Auth::None,
            stat,
        })
    };
    assert_eq!(
        stat(header(100_099, 1, 0, 2)),
        accepted(AcceptStat::ProgUnavail)
    );
    assert_eq!(
        stat(header(100_003, 4, 0, 2)),
        accepted(AcceptStat::ProgMismatch { low: 3, high: 3 })
    );
    assert_eq!(
        stat(header(100_003, 3, 22, 2)),
        accepted(AcceptStat::ProcUnavail)
    );
    assert_eq!(
        stat(header(100_003, 3, 1, 2)),
        accepted(AcceptStat::GarbageArgs)
    );
    assert_eq!(
        stat(header(100_003, 3, 0, 3)),
        Some(ReplyBody::RpcMismatch { low: 2, high: 2 })
    );
    assert_eq!(decode_call(&[1, 2, 3]).unwrap_err().reply(), None);
}
