//! The tuple-space classifier decides exactly as the linear first-match scan,
//! on random rule sets and packets drawn from a small universe (so that rules
//! overlap often), and the analysis never contradicts the set semantics.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use proptest::prelude::*;
use sidecore_firewall::analyze::{Anomaly, Relation, relation};
use sidecore_firewall::rule::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use sidecore_firewall::{Action, Classifier, Packet, Ports, Prefix, Proto, Rule, RuleSet, analyze};

const BASE: u32 = 0x0a00_0000; // 10.0.0.0

fn proto() -> impl Strategy<Value = Proto> {
    prop_oneof![
        Just(Proto::Any),
        Just(Proto::Is(PROTO_TCP)),
        Just(Proto::Is(PROTO_UDP)),
        Just(Proto::Is(PROTO_ICMP)),
    ]
}

fn prefix() -> impl Strategy<Value = Prefix> {
    (
        0u32..8,
        prop_oneof![Just(0u8), Just(29), Just(30), Just(31), Just(32)],
    )
        .prop_map(|(host, len)| Prefix::new(BASE + host, len))
}

fn ports() -> impl Strategy<Value = Ports> {
    prop_oneof![
        Just(Ports::ANY),
        (0u16..24, 0u16..24).prop_map(|(a, b)| Ports {
            lo: a.min(b),
            hi: a.max(b)
        }),
        (0u16..24).prop_map(|p| Ports { lo: p, hi: p }),
    ]
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        proto(),
        prefix(),
        ports(),
        prefix(),
        ports(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(proto, src, sport, dst, dport, accept, log)| Rule {
            line: 0,
            proto,
            src,
            sport,
            dst,
            dport,
            action: if accept { Action::Accept } else { Action::Deny },
            log,
        })
}

fn packet() -> impl Strategy<Value = Packet> {
    (
        prop_oneof![
            Just(PROTO_TCP),
            Just(PROTO_UDP),
            Just(PROTO_ICMP),
            Just(47u8)
        ],
        0u32..8,
        0u16..24,
        0u32..8,
        0u16..24,
    )
        .prop_map(|(proto, s, sport, d, dport)| {
            let portless = proto != PROTO_TCP && proto != PROTO_UDP;
            Packet {
                proto,
                src: BASE + s,
                sport: if portless { 0 } else { sport },
                dst: BASE + d,
                dport: if portless { 0 } else { dport },
            }
        })
}

fn ruleset(rules: Vec<Rule>) -> RuleSet {
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.line = i + 1;
            r
        })
        .collect();
    RuleSet {
        source: "generated".into(),
        rules,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_classifier_decides_as_first_match(
        rules in prop::collection::vec(rule(), 0..40),
        packets in prop::collection::vec(packet(), 1..64),
    ) {
        let rs = ruleset(rules);
        let c = Classifier::compile(&rs).unwrap();
        for p in &packets {
            prop_assert_eq!(c.decide(p), rs.decide(p), "packet {:?}", p);
        }
    }

    #[test]
    fn shadowed_and_redundant_rules_never_change_a_decision(
        rules in prop::collection::vec(rule(), 1..24),
        packets in prop::collection::vec(packet(), 1..64),
    ) {
        let rs = ruleset(rules);
        for f in analyze(&rs) {
            // A shadowed rule never decides a packet; neither does the later
            // rule of a "later is redundant" pair.
            let second = f.second.number - 1;
            let first = f.first.number - 1;
            match f.anomaly {
                Anomaly::Shadowing => {
                    for p in &packets {
                        prop_assert_ne!(rs.decide(p).rule, Some(second));
                    }
                }
                Anomaly::Redundancy => {
                    // Removing the redundant rule leaves every action as it was.
                    let gone = if relation(&rs.rules[second], &rs.rules[first]) == Relation::Superset {
                        first
                    } else {
                        second
                    };
                    let mut fewer = rs.clone();
                    fewer.rules.remove(gone);
                    for p in &packets {
                        prop_assert_eq!(fewer.decide(p).action, rs.decide(p).action, "{} on {:?}", f, p);
                    }
                }
                Anomaly::Generalization | Anomaly::Correlation => {}
            }
        }
    }
}
