//! Orion's monitors against a real node listener on loopback: views over the node
//! protocol, and bad input of each kind — a monitor that vanishes mid-exchange, a
//! malformed `sense`, a node that serves no views, a node that goes away — each with a
//! clear error, and the node keeps serving.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use sidecore_control::node::{Handlers, NodeListener};
use sidecore_orion::detect::LivenessConfig;
use sidecore_orion::node_sensors::NodeSensors;
use sidecore_orion::ring::{Member, RingNote, RingWatch};
use sidecore_wire::frame::{FrameDecoder, FrameEncoder, preamble};
use sidecore_wire::orion_msg::SenseRequest;
use sidecore_wire::{Hello, Link, Message};

const T: Duration = Duration::from_secs(5);

fn hello() -> Hello {
    Hello {
        origin: "monitor.test".into(),
        software: sidecore_wire::SOFTWARE_VERSION.into(),
    }
}

fn listener(name: &str) -> NodeListener {
    let sensors = Arc::new(NodeSensors::start(name).unwrap());
    NodeListener::start_with(
        "127.0.0.1:0",
        name,
        Handlers {
            deploy: None,
            sense: Some(Arc::new(move |req| sensors.view(req))),
            mx: None,
        },
    )
    .unwrap()
}

/// One view through a fresh monitoring connection.
fn view(addr: &str, seq: u64) -> (u64, String) {
    let link = Link::connect(addr, "node", hello(), T).unwrap();
    assert!(matches!(link.expect(T).unwrap(), Message::Welcome(_)));
    link.send(&Message::Sense(SenseRequest {
        seq,
        watcher: "t".into(),
    }))
    .unwrap();
    match link.expect(T).unwrap() {
        Message::SenseView(v) => {
            assert_eq!(v.seq, seq);
            (v.heartbeat, v.node)
        }
        m => panic!("expected a view, got {}", m.kind()),
    }
}

/// The node's answers to raw bytes sent after a proper hello.
fn raw_exchange(addr: &str, after_hello: &[u8]) -> Vec<Message> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut out = preamble().to_vec();
    let mut enc = FrameEncoder::default();
    enc.encode(&Message::Hello(hello()).encode(), &mut out);
    enc.encode(after_hello, &mut out);
    s.write_all(&out).unwrap();
    let mut dec = FrameDecoder::new();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => dec.feed(&buf[..n]),
        }
        while let Ok(Some((_, payload))) = dec.next_frame() {
            got.push(Message::decode(payload).unwrap());
        }
    }
    got
}

#[test]
fn views_flow_and_bad_monitors_get_clear_errors_while_the_node_keeps_serving() {
    let l = listener("n1");
    let addr = l.addr().to_string();
    let (h1, node) = view(&addr, 1);
    assert_eq!(node, "n1");

    // A monitor that asks and vanishes without reading its answer.
    {
        let link = Link::connect(&addr, "node", hello(), T).unwrap();
        link.expect(T).unwrap();
        link.send(&Message::Sense(SenseRequest {
            seq: 7,
            watcher: "gone".into(),
        }))
        .unwrap();
    }
    // A malformed sense (a field missing): the node names it and closes.
    let answers = raw_exchange(&addr, br#"{"type":"sense","watcher":"x"}"#);
    let err = answers
        .iter()
        .find_map(|m| match m {
            Message::Error { error } => Some(error.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error in {answers:?}"));
    assert!(err.contains("missing field `seq`"), "{err}");

    // Still serving, and its heartbeat moved on.
    std::thread::sleep(Duration::from_millis(20));
    let (h2, _) = view(&addr, 2);
    assert!(h2 > h1, "heartbeat {h1} → {h2}");

    // A node without a sense handler says so.
    let plain = NodeListener::start("127.0.0.1:0", "plain", None).unwrap();
    let answers = raw_exchange(
        &plain.addr().to_string(),
        &Message::Sense(SenseRequest {
            seq: 0,
            watcher: "t".into(),
        })
        .encode(),
    );
    assert!(
        answers.iter().any(|m| matches!(m,
            Message::Error { error } if error.contains("serves no sensor views"))),
        "{answers:?}"
    );
}

#[test]
fn a_ring_watch_declares_a_node_that_goes_away_and_says_why() {
    let b = listener("ring-b");
    let c = listener("ring-c");
    let members = vec![
        Member {
            name: "ring-a".into(),
            addr: "127.0.0.1:9".into(),
        },
        Member {
            name: "ring-b".into(),
            addr: b.addr().to_string(),
        },
        Member {
            name: "ring-c".into(),
            addr: c.addr().to_string(),
        },
    ];
    // k = 10: a loopback node answers within 100 ms even on a loaded machine.
    let cfg = LivenessConfig::new(10_000_000, 10).unwrap();
    let mut w = RingWatch::new("ring-a", members, 1, cfg).unwrap();
    assert_eq!(w.watching(), vec!["ring-b", "ring-c"]);
    let mut now = 0;
    let mut refresh = |w: &mut RingWatch| {
        std::thread::sleep(Duration::from_millis(10));
        now += 10_000_000;
        w.refresh(now)
    };
    for _ in 0..500 {
        refresh(&mut w);
        if w.views() >= 30 && w.live_members().len() == 3 {
            break;
        }
    }
    assert!(w.views() >= 30, "views {}", w.views());
    assert_eq!(w.live_members().len(), 3);
    drop(c); // the node goes away: its connection closes, nothing answers
    let mut declared = None;
    for _ in 0..500 {
        if let Some(n) = refresh(&mut w)
            .into_iter()
            .find(|n| matches!(n, RingNote::Declared { node, .. } if node == "ring-c"))
        {
            declared = Some(n);
            break;
        }
    }
    let Some(RingNote::Declared { node, evidence }) = declared else {
        panic!("ring-c never declared");
    };
    assert_eq!(node, "ring-c");
    assert!(evidence.contains("10 refreshes of 10.0 ms"), "{evidence}");
    assert!(sidecore_orion::health::is_dead("node:ring-c"));
    // b, still answering, stays in (or, declared on a starved machine, comes back).
    for _ in 0..500 {
        if w.live_members() == vec!["ring-a", "ring-b"] {
            break;
        }
        refresh(&mut w);
    }
    assert_eq!(w.live_members(), vec!["ring-a", "ring-b"]);
    assert!(!sidecore_orion::health::is_dead("node:ring-b"));
}
