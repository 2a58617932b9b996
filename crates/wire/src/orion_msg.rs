//! What Orion's monitors ask of a node over the node protocol (issue 13): a
//! monitor on another machine opens an ordinary node connection (hello,
//! welcome), then asks for a view of the node's sensors every refresh period
//! with `sense`, and the node answers each with `sense-view`. The view carries
//! the node's heartbeat (a counter a ticker inside the node's daemon advances
//! every millisecond: the liveness sensor whose slope the monitor judges),
//! implicit sensors of its host, and the nodes its own monitors have declared
//! dead, so that a declaration spreads through the monitoring ring with the
//! views (the ring's membership changes).
//!
//! ```text
//! monitor                                   node
//!   hello                        ───▶
//!                                ◀───       welcome
//!   sense {seq}                  ───▶
//!                                ◀───       sense-view {seq, node, heartbeat, sensors, dead}
//!   sense {seq + 1}              ───▶       ... once per refresh, until the monitor closes
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Monitor → node: a request for one view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenseRequest {
    /// The request's number; the view answering it carries the same.
    pub seq: u64,
    /// The watching node's name (for the node's logs).
    pub watcher: String,
}

/// Node → monitor: one view of the node's sensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenseView {
    /// The request answered.
    pub seq: u64,
    /// The node's name.
    pub node: String,
    /// The node daemon's ticker: advances every millisecond while the daemon runs.
    pub heartbeat: u64,
    /// Implicit sensors of the node's host (`stat.ctxt`, ...), by name.
    pub sensors: BTreeMap<String, u64>,
    /// Nodes this node's monitors have declared dead (names).
    pub dead: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Hello, Message, NodeInfo};
    use crate::session::{Origin, Peer};

    #[test]
    fn a_monitor_asks_for_views_after_the_welcome_and_nothing_else_mixes_in() {
        let mut o = Origin::new(
            "b",
            Hello {
                origin: "a.1".into(),
                software: "0.1.0".into(),
            },
        );
        let mut p = Peer::new(
            "a",
            NodeInfo {
                name: "b".into(),
                software: "0.1.0".into(),
                cpus: 1,
                memory_bytes: 1,
            },
        );
        let pump = |o: &mut Origin, p: &mut Peer| {
            let x = o.take_output();
            p.handle_input(&x);
            while p.poll().unwrap().is_some() {}
            let x = p.take_output();
            o.handle_input(&x);
        };
        pump(&mut o, &mut p);
        assert!(matches!(o.poll().unwrap(), Some(Message::Welcome(_))));
        for seq in 0..3 {
            o.send(&Message::Sense(SenseRequest {
                seq,
                watcher: "a".into(),
            }))
            .unwrap();
            pump(&mut o, &mut p);
            let view = SenseView {
                seq,
                node: "b".into(),
                heartbeat: 10 + seq,
                sensors: BTreeMap::from([("stat.ctxt".into(), 5)]),
                dead: vec!["c".into()],
            };
            p.send(&Message::SenseView(view.clone())).unwrap();
            pump(&mut o, &mut p);
            assert_eq!(o.poll().unwrap(), Some(Message::SenseView(view)));
        }
        // A monitoring connection deploys nothing, and a node never volunteers views.
        assert!(o.send(&Message::Stop).is_err());
        let stray = SenseView {
            seq: 9,
            node: "b".into(),
            heartbeat: 0,
            sensors: BTreeMap::new(),
            dead: Vec::new(),
        };
        let mut q = Peer::new(
            "a",
            NodeInfo {
                name: "b".into(),
                software: "0.1.0".into(),
                cpus: 1,
                memory_bytes: 1,
            },
        );
        assert!(q.send(&Message::SenseView(stray)).is_err());
        // The monitor may simply close.
        assert!(o.handle_eof().is_ok());
    }

    #[test]
    fn views_are_tagged_json_and_unknown_fields_are_named() {
        let m = Message::Sense(SenseRequest {
            seq: 1,
            watcher: "a".into(),
        });
        assert_eq!(
            std::str::from_utf8(&m.encode()).unwrap(),
            r#"{"type":"sense","seq":1,"watcher":"a"}"#
        );
        let e = Message::decode(br#"{"type":"sense","seq":1,"watcher":"a","x":0}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `x`"), "{e}");
        let e = Message::decode(br#"{"type":"sense-view","seq":1}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `node`"), "{e}");
    }
}
