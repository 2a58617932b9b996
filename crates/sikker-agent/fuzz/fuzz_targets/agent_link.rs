//! Fuzz target: any bytes another agent sends on an agent link, split into
//! arbitrary chunks, are read by the link's state machine as checked messages
//! or refused with an error naming the peer; every message it lets through
//! goes to a running agent core (as if from host h1), which answers or
//! ignores it and never panics — forged sources, unknown services,
//! processes and limits, bad base64, NaN or negative rates included. After
//! each message the limit's rate held here stays finite and non-negative.
//! Run: `cargo +nightly fuzz run agent_link` from `crates/sikker-agent`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_sikker_agent::AgentCore;
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};
use sidecore_wire::{AgentHello, AgentLink};

const POLICY: &str = r#"
[[service]]
name = "src"
process_count = 3
[[service]]
name = "dst"
domains = ["In"]
[[service.process]]
id = 9
[[grant]]
from = "src"
to = "dst"
processes = [9]
domains = ["In"]
[[rate_limit]]
from = "src"
to = "dst"
gbps = 1.0
bucket_bytes = 65536
"#;

const PLACEMENT: &str = "[[host]]\nname = \"h0\"\nprocesses = [\"src:0\", \"dst:9\"]\n[[host]]\nname = \"h1\"\nprocesses = [\"src:1\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"src:2\"]\n";

fn nos() -> Nos {
    let policy = parse_policy("p.toml", POLICY).expect("the policy parses");
    let placement = parse_placement("h.toml", PLACEMENT, &policy).expect("the placement parses");
    Nos::compile(policy, &placement).expect("it compiles")
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let chunk = (split as usize).max(1);
    let mut core = AgentCore::new(nos(), "h0").expect("h0 is placed");
    core.linked("h1", 0);
    core.linked("h2", 0);
    let mut link = AgentLink::new(
        "h1",
        AgentHello {
            host: "h0".into(),
            software: "0".into(),
        },
    );
    let mut now = 1u64;
    'feed: for c in rest.chunks(chunk) {
        link.handle_input(c);
        loop {
            match link.poll() {
                Ok(Some(m)) => {
                    now += 1_000;
                    let _ = core.on_peer("h1", m, now);
                    let _ = core.tick(now);
                    let _ = core.take_outbox();
                    for r in core.local_rates().values() {
                        assert!(r.is_finite() && *r >= 0.0, "rate {r}");
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(e.peer, "h1");
                    break 'feed;
                }
            }
        }
    }
});
