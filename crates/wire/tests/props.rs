//! The origin and peer state machines driven against each other without
//! sockets: every split of the byte stream gives the same conversation, and a
//! stream with bytes lost, reordered or flipped gives exactly a prefix of the
//! conversation and then a clear error naming the peer — never a different
//! message, never a panic.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run

use std::collections::BTreeMap;

use proptest::prelude::*;
use sidecore_types::{AppState, AppStatus, ChannelProps, Priority};
use sidecore_wire::session::Grammar;
use sidecore_wire::{
    Error, Hello, Message, NodeInfo, Origin, Peer, RemoteChannel, RemoteOffcode, RemotePart,
};

fn hello() -> Hello {
    Hello {
        origin: "vm.1".into(),
        software: "0.1.0".into(),
    }
}

fn info() -> NodeInfo {
    NodeInfo {
        name: "b".into(),
        software: "0.1.0".into(),
        cpus: 2,
        memory_bytes: 8 << 30,
    }
}

fn part() -> RemotePart {
    RemotePart {
        app: "demo".into(),
        origin: "vm.1".into(),
        offcodes: vec![RemoteOffcode {
            name: "checksum".into(),
            implementation: "inet-checksum".into(),
            priority: Priority::High,
            watchdog_ms: Some(1000),
            obsolete_ms: None,
            params: toml::from_str("record_size = 64").unwrap(),
            inputs: vec!["in".into()],
            outputs: vec![],
            calls: vec![],
            restart: None,
        }],
        channels: vec![RemoteChannel {
            name: "records".into(),
            props: ChannelProps::default(),
            from: None,
            to: vec![(0, 0)],
            connect: None,
        }],
    }
}

fn status(i: u64) -> AppStatus {
    AppStatus {
        id: 7,
        name: "demo@vm.1".into(),
        state: if i == u64::MAX {
            AppState::Stopped
        } else {
            AppState::Running
        },
        uptime_ms: i,
        offcodes: Vec::new(),
        channels: Vec::new(),
    }
}

/// What the peer sends after the welcome, in order, for `n` status reports
/// (the last, final report follows the origin's stop).
fn peer_script(n: usize) -> Vec<Message> {
    let mut v = vec![
        Message::Listening {
            channels: BTreeMap::from([("records".to_string(), "10.0.0.2:4000".to_string())]),
        },
        Message::Deployed {
            app: "demo@vm.1".into(),
        },
    ];
    v.extend((0..n as u64).map(|i| Message::Status(status(i))));
    v.push(Message::Status(status(u64::MAX)));
    v
}

/// Feeds `bytes` to `s` in chunks of the given sizes (cycled), polling after
/// each, and calls `react` on every message (to send what the role sends in
/// answer). Returns the messages, or the first error with those before it.
fn deliver<G: Grammar>(
    bytes: &[u8],
    chunks: &[usize],
    s: &mut sidecore_wire::session::Session<G>,
    mut react: impl FnMut(&mut sidecore_wire::session::Session<G>, &Message),
) -> (Vec<Message>, Option<Error>) {
    let mut got = Vec::new();
    let mut at = 0;
    let mut k = 0;
    while at < bytes.len() {
        let n = chunks[k % chunks.len()].max(1).min(bytes.len() - at);
        k += 1;
        s.handle_input(&bytes[at..at + n]);
        at += n;
        loop {
            match s.poll() {
                Ok(Some(m)) => {
                    react(s, &m);
                    got.push(m);
                }
                Ok(None) => break,
                Err(e) => return (got, Some(e)),
            }
        }
    }
    (got, None)
}

/// Runs a whole conversation with the given splits; returns the byte streams
/// each way, and what each side received.
fn converse(
    o2p: &[usize],
    p2o: &[usize],
    n: usize,
) -> (Vec<u8>, Vec<u8>, Vec<Message>, Vec<Message>) {
    let mut o = Origin::new("node b", hello());
    let mut p = Peer::new("origin vm.1", info());
    let (mut wire_o2p, mut wire_p2o) = (Vec::new(), Vec::new());
    let (mut at_peer, mut at_origin) = (Vec::new(), Vec::new());
    let mut step = |o: &mut Origin, p: &mut Peer| {
        let b = o.take_output();
        let (got, e) = deliver(&b, o2p, p, |_, _| {});
        assert!(e.is_none(), "{e:?}");
        wire_o2p.extend_from_slice(&b);
        at_peer.extend(got);
        let b = p.take_output();
        let (got, e) = deliver(&b, p2o, o, |_, _| {});
        assert!(e.is_none(), "{e:?}");
        wire_p2o.extend_from_slice(&b);
        at_origin.extend(got);
    };
    step(&mut o, &mut p); // hello → welcome
    step(&mut o, &mut p);
    o.send(&Message::Deploy(part())).unwrap();
    step(&mut o, &mut p);
    let script = peer_script(n);
    for m in &script[..script.len() - 1] {
        p.send(m).unwrap();
    }
    step(&mut o, &mut p);
    o.send(&Message::Stop).unwrap();
    step(&mut o, &mut p);
    p.send(&script[script.len() - 1]).unwrap();
    step(&mut o, &mut p);
    // Both close: each side's end is clean.
    o.handle_eof().unwrap();
    p.handle_eof().unwrap();
    (wire_o2p, wire_p2o, at_peer, at_origin)
}

#[derive(Debug, Clone)]
enum Damage {
    Lose {
        at: prop::sample::Index,
        len: usize,
    },
    Swap {
        at: prop::sample::Index,
        a: usize,
        b: usize,
    },
    Flip {
        at: prop::sample::Index,
        bit: u8,
    },
    Cut {
        at: prop::sample::Index,
    },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1usize..48).prop_map(|(at, len)| Damage::Lose { at, len }),
        (any::<prop::sample::Index>(), 1usize..32, 1usize..32)
            .prop_map(|(at, a, b)| Damage::Swap { at, a, b }),
        (any::<prop::sample::Index>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        any::<prop::sample::Index>().prop_map(|at| Damage::Cut { at }),
    ]
}

fn apply(d: &Damage, bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    match d {
        Damage::Lose { at, len } => {
            let i = at.index(v.len());
            let end = (i + len).min(v.len());
            v.drain(i..end);
        }
        Damage::Swap { at, a, b } => {
            let i = at.index(v.len());
            let j = (i + a).min(v.len());
            let k = (j + b).min(v.len());
            let (first, second) = (v[i..j].to_vec(), v[j..k].to_vec());
            v.splice(i..k, second.into_iter().chain(first));
        }
        Damage::Flip { at, bit } => {
            let i = at.index(v.len());
            v[i] ^= 1 << bit;
        }
        Damage::Cut { at } => v.truncate(at.index(v.len())),
    }
    v
}

/// Checks what a side received from a damaged stream: a prefix of what was
/// sent; and unless the damaged stream is a prefix of the original (cut at a
/// frame boundary), or equal to it, an error naming the peer.
fn check_damaged(
    sent: &[Message],
    original: &[u8],
    damaged: &[u8],
    got: &[Message],
    err: Option<Error>,
    peer: &str,
) -> Result<(), TestCaseError> {
    prop_assert!(got.len() <= sent.len());
    prop_assert_eq!(
        got,
        &sent[..got.len()],
        "a damaged stream produced a different message"
    );
    match err {
        Some(e) => {
            prop_assert_eq!(&e.peer, peer);
            prop_assert!(e.to_string().starts_with(peer), "{}", e);
        }
        None => prop_assert!(
            damaged == original || original.starts_with(damaged),
            "damage went unnoticed: {} of {} messages, no error",
            got.len(),
            sent.len()
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_split_gives_the_same_conversation(
        o2p in prop::collection::vec(1usize..40, 1..12),
        p2o in prop::collection::vec(1usize..40, 1..12),
        n in 0usize..5,
    ) {
        let (_, _, at_peer, at_origin) = converse(&o2p, &p2o, n);
        prop_assert_eq!(
            at_peer,
            vec![Message::Hello(hello()), Message::Deploy(part()), Message::Stop]
        );
        let mut want = vec![Message::Welcome(info())];
        want.extend(peer_script(n));
        prop_assert_eq!(at_origin, want);
    }

    #[test]
    fn damage_from_the_peer_is_caught_by_the_origin(
        d in damage(),
        chunks in prop::collection::vec(1usize..40, 1..8),
        n in 0usize..4,
    ) {
        let (_, p2o, _, _) = converse(&[4096], &[4096], n);
        let bad = apply(&d, &p2o);
        let mut sent = vec![Message::Welcome(info())];
        sent.extend(peer_script(n));
        let mut o = Origin::new("node b", hello());
        let mut statuses = 0;
        let (got, mut err) = deliver(&bad, &chunks, &mut o, |o, m| match m {
            Message::Welcome(_) => o.send(&Message::Deploy(part())).unwrap(),
            Message::Status(_) => {
                statuses += 1;
                if statuses == n {
                    o.send(&Message::Stop).unwrap();
                }
            }
            Message::Deployed { .. } if n == 0 => o.send(&Message::Stop).unwrap(),
            _ => {}
        });
        if err.is_none() {
            err = o.handle_eof().err();
        }
        check_damaged(&sent, &p2o, &bad, &got, err, "node b")?;
    }

    #[test]
    fn damage_from_the_origin_is_caught_by_the_peer(
        d in damage(),
        chunks in prop::collection::vec(1usize..40, 1..8),
    ) {
        let (o2p, _, _, _) = converse(&[4096], &[4096], 1);
        let bad = apply(&d, &o2p);
        let sent = vec![Message::Hello(hello()), Message::Deploy(part()), Message::Stop];
        let mut p = Peer::new("origin vm.1", info());
        let script = peer_script(1);
        let (got, mut err) = deliver(&bad, &chunks, &mut p, |p, m| match m {
            Message::Deploy(_) => {
                for s in &script[..script.len() - 1] {
                    p.send(s).unwrap();
                }
            }
            Message::Stop => p.send(&script[script.len() - 1]).unwrap(),
            _ => {}
        });
        if err.is_none() {
            err = p.handle_eof().err();
        }
        check_damaged(&sent, &o2p, &bad, &got, err, "origin vm.1")?;
    }

    #[test]
    fn arbitrary_bytes_never_panic_either_side(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut o = Origin::new("node b", hello());
        let mut p = Peer::new("origin x", info());
        let with_preamble = [&b"SCNODE\x02\x00"[..], &bytes[..]].concat();
        for s in [&bytes[..], &with_preamble[..]] {
            let _ = deliver(s, &[7], &mut o, |_, _| {});
            let _ = o.handle_eof();
            let _ = deliver(s, &[7], &mut p, |_, _| {});
            let _ = p.handle_eof();
        }
    }
}
