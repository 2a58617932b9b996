//! Every channel option changes what is deployed, through the real runtime:
//! a multicast channel gives every message to every receiver, a parallel one
//! to exactly one worker, an unreliable one drops (and counts) what a slow
//! receiver cannot take where a reliable one holds the sender back. Each
//! test fails if its option is ignored (a unicast ring would starve the second
//! receiver; a multicast would hand workers duplicates; a reliable channel
//! would drop nothing).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sidecore_offcode::{
    Implementation, InitCx, InputId, Interfaces, Offcode, OffcodeError, OutputId, Progress,
    Registry, RunCx,
};
use sidecore_pe::DiscoverOptions;
use sidecore_runtime::{Runtime, RuntimeConfig};
use sidecore_types::PeKind;

/// What each receiver (by its `tag` parameter) got, in order.
type Seen = Arc<Mutex<BTreeMap<String, Vec<u64>>>>;

/// Sends `count` numbered records as fast as its output takes them.
struct Numbers {
    count: u64,
    next: u64,
    out: Option<OutputId>,
}

impl Offcode for Numbers {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.out = Some(cx.output("out")?);
        Ok(())
    }
    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let out = self.out.unwrap();
        while self.next < self.count {
            match cx.send_bytes(out, &self.next.to_le_bytes())? {
                sidecore_channel::SendOutcome::Full => return Ok(Progress::Busy),
                // Sent, or dropped by an unreliable channel (counted there).
                _ => self.next += 1,
            }
        }
        Ok(Progress::Done)
    }
}

/// Records every record it receives under its tag; optionally slow.
struct Collect {
    tag: String,
    seen: Seen,
    delay: Duration,
}

impl Offcode for Collect {
    fn initialize(&mut self, _cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        Ok(())
    }
    fn handle(
        &mut self,
        _cx: &mut RunCx<'_>,
        _input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
        self.seen
            .lock()
            .unwrap()
            .entry(self.tag.clone())
            .or_default()
            .push(seq);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        Ok(())
    }
}

fn registry(seen: &Seen) -> Registry {
    let mut r = Registry::new();
    r.register(Implementation {
        name: "numbers".into(),
        description: "numbered records".into(),
        kinds: vec![PeKind::Host, PeKind::Core],
        inputs: Some(vec![]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(|spec| {
            let count = spec
                .params
                .get("count")
                .and_then(toml::Value::as_integer)
                .unwrap_or(0);
            Ok(Box::new(Numbers {
                count: u64::try_from(count).unwrap(),
                next: 0,
                out: None,
            }))
        }),
        validate: None,
        interfaces: Interfaces::default(),
    });
    let seen = seen.clone();
    r.register(Implementation {
        name: "collect".into(),
        description: "records what it receives".into(),
        kinds: vec![PeKind::Host, PeKind::Core],
        inputs: Some(vec!["in".into()]),
        outputs: Some(vec![]),
        factory: Arc::new(move |spec| {
            let p = spec.params;
            Ok(Box::new(Collect {
                tag: p
                    .get("tag")
                    .and_then(toml::Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                seen: seen.clone(),
                delay: Duration::from_micros(
                    u64::try_from(
                        p.get("delay_us")
                            .and_then(toml::Value::as_integer)
                            .unwrap_or(0),
                    )
                    .unwrap(),
                ),
            }))
        }),
        validate: None,
        interfaces: Interfaces::default(),
    });
    r
}

fn offcode(name: &str, n: u32, imp: &str, params: &str, port: &str) -> String {
    format!(
        "[[offcode]]\nname = \"{name}\"\nid = \"00000000-0000-4000-8000-{n:012}\"\nimpl = \"{imp}\"\ncpu = 0.1\n{port}\nparams = {{ {params} }}\n[[offcode.target]]\nkind = \"host\"\n\n"
    )
}

/// Deploys `count` records from `src` to receivers `a` and `b` over a channel
/// with `options`; returns what each receiver saw and the channel's drops.
fn run(count: u64, options: &str, delay_us: u64) -> (BTreeMap<String, Vec<u64>>, u64) {
    let _g = common::serial();
    let seen: Seen = Arc::default();
    let mut text = "[app]\nname = \"channels\"\n\n".to_string();
    text.push_str(&offcode(
        "src",
        1,
        "numbers",
        &format!("count = {count}"),
        "outputs = [\"out\"]",
    ));
    for (tag, n) in [("a", 2), ("b", 3)] {
        text.push_str(&offcode(
            tag,
            n,
            "collect",
            &format!("tag = \"{tag}\", delay_us = {delay_us}"),
            "inputs = [\"in\"]",
        ));
    }
    text.push_str(&format!(
        "[[channel]]\nname = \"c\"\nfrom = \"src.out\"\nto = [\"a.in\", \"b.in\"]\nslots = 16\nslot_size = 64\n{options}\n"
    ));
    let manifest = sidecore_manifest::parse_str("channels.toml", &text)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    let inventory = sidecore_pe::discover(&DiscoverOptions {
        probe_kernel: false,
        probe_wasm: false,
        housekeeping: Some(vec![]),
        ..Default::default()
    });
    let plan = sidecore_runtime::plan_manifest(
        &manifest,
        &inventory,
        &registry(&seen),
        &Default::default(),
    )
    .unwrap();
    let rt = Runtime::new(RuntimeConfig::default());
    let id = rt.deploy(&plan).unwrap();
    // Until the source is done and the receivers have drained what reached them.
    let total = |s: &BTreeMap<String, Vec<u64>>| s.values().map(Vec::len).sum::<usize>();
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = total(&seen.lock().unwrap());
        let src_done = rt
            .status_of(id)
            .unwrap()
            .offcodes
            .iter()
            .any(|o| o.name == "src" && o.state == sidecore_runtime::OffcodeState::Done);
        if src_done && now == last {
            break;
        }
        last = now;
    }
    let (_, status) = rt.stop_app_with_status(id).unwrap();
    rt.shutdown();
    let dropped = status
        .offcodes
        .iter()
        .find(|o| o.name == "src")
        .unwrap()
        .dropped;
    let seen = seen.lock().unwrap().clone();
    (seen, dropped)
}

#[test]
fn multicast_gives_every_message_to_every_receiver() {
    let (seen, dropped) = run(5_000, "cast = \"multicast\"", 0);
    let all: Vec<u64> = (0..5_000).collect();
    assert_eq!(seen.get("a"), Some(&all), "receiver a");
    assert_eq!(seen.get("b"), Some(&all), "receiver b");
    assert_eq!(dropped, 0);
}

#[test]
fn parallel_gives_each_message_to_exactly_one_worker() {
    let (seen, dropped) = run(5_000, "order = \"parallel\"", 0);
    let a: BTreeSet<u64> = seen
        .get("a")
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let b: BTreeSet<u64> = seen
        .get("b")
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert!(a.is_disjoint(&b), "a message reached both workers");
    let n_a = seen.get("a").map_or(0, Vec::len);
    let n_b = seen.get("b").map_or(0, Vec::len);
    assert_eq!(
        n_a + n_b,
        5_000,
        "every message exactly once ({n_a} + {n_b})"
    );
    assert_eq!(a.union(&b).count(), 5_000);
    assert_eq!(dropped, 0);
}

#[test]
fn unreliable_drops_and_counts_where_reliable_holds_the_sender_back() {
    // A receiver that takes 200 µs a message behind a 16-slot ring.
    let (seen, dropped) = run(
        2_000,
        "cast = \"multicast\"\ndelivery = \"unreliable\"",
        200,
    );
    let got = seen.get("a").map_or(0, Vec::len);
    assert!(dropped > 0, "nothing dropped");
    assert!(got < 2_000, "receiver a got everything ({got})");
    // What arrived is in order, with gaps where messages were dropped.
    let a = seen.get("a").unwrap();
    assert!(a.windows(2).all(|w| w[0] < w[1]), "out of order");
    let (seen, dropped) = run(300, "cast = \"multicast\"\ndelivery = \"reliable\"", 200);
    assert_eq!(dropped, 0);
    assert_eq!(seen.get("a").map_or(0, Vec::len), 300);
    assert_eq!(seen.get("b").map_or(0, Vec::len), 300);
}
