//! A Wasm module as an ordinary offcode: built by the registry's `loader:wasm` from a
//! manifest-style spec (admitted at deploy time), initialized with the manifest's port
//! names, and run through the `Offcode` trait into a real shared-memory ring.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::{Path, PathBuf};
use std::time::Instant;

use sidecore_channel::{Ring, RingConfig, Sender};
use sidecore_offcode::{
    BuildSpec, InitCx, Inlet, InputId, Metrics, Offcode, OffcodeInfo, Outlet, Registry, RunCx,
};
use sidecore_types::{Delivery, PeKind};

fn corpus(rel: &str) -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../ext-verify/corpus")
        .join(rel)
}

fn registry() -> Registry {
    let mut r = Registry::new();
    sidecore_ext::offcode::register(&mut r);
    r
}

fn build(module: &Path, params: &str) -> Result<Box<dyn Offcode>, String> {
    let reg = registry();
    let imp = reg
        .lookup(&Registry::loader_name(PeKind::Wasm), PeKind::Wasm)
        .expect("loader:wasm registered");
    let params: toml::Table = toml::from_str(params).unwrap();
    let spec = BuildSpec {
        params: &params,
        kind: PeKind::Wasm,
        module: Some(module),
    };
    (imp.factory)(&spec).map_err(|e| e.to_string())
}

#[test]
fn wasm_offcode_runs_through_the_offcode_trait_into_a_ring() {
    let mut oc = build(
        &corpus("benign/hdr_rewrite.wat"),
        "min_interarrival_ns = 5000\nviolations = { k = 100, window = 100 }",
    )
    .unwrap();
    let info = OffcodeInfo {
        app: "t".into(),
        name: "nat".into(),
        implementation: "loader:wasm".into(),
        pe: "wasm:0".into(),
        pe_kind: PeKind::Wasm,
        inputs: vec!["in".into()],
        outputs: vec!["out".into()],
        calls: vec![],
    };
    let params = toml::Table::new();
    let metrics = Metrics::default();
    oc.initialize(&mut InitCx::new(&info, &params, &metrics))
        .unwrap();
    let (prod, mut cons) = Ring::create(RingConfig {
        slots: 16,
        slot_size: 2048 + 16,
        ..RingConfig::default()
    })
    .unwrap();
    let mut outlets = vec![Outlet::Ring(Sender::new(prod, Delivery::Reliable))];
    let mut f = vec![0u8; 64];
    f[12] = 0x08;
    f[14] = 0x45;
    f[22] = 9;
    f[23] = 17;
    {
        let mut cx = RunCx::new(&info, &mut outlets, Instant::now());
        for _ in 0..3 {
            oc.handle(&mut cx, InputId(0), &f).unwrap();
        }
        cx.flush().unwrap();
    }
    let mut got = 0;
    while let Ok(m) = cons[0].try_recv() {
        assert_eq!(m.len(), 64);
        assert_eq!(&m[30..34], &[10, 0, 0, 1], "rewritten by the wasm module");
        assert_eq!(m[22], 8, "TTL decremented");
        got += 1;
    }
    assert_eq!(got, 3);
    let snap = metrics.snapshot();
    assert!(
        snap.iter().any(|(n, v)| n == "invocations" && *v == 3),
        "{snap:?}"
    );
}

#[test]
fn deploy_time_admission_rejects_with_the_report() {
    let e = build(&corpus("hostile/recursion.wat"), "")
        .err()
        .expect("rejected");
    assert!(e.contains("recursion") && e.contains("calls itself"), "{e}");
    let e = build(
        &corpus("benign/chacha.wat"),
        "min_interarrival_ns = 10\ninflation = 2",
    )
    .err()
    .expect("over budget");
    assert!(e.contains("exceeds the inflated limit"), "{e}");
    let e = build(&corpus("benign/chacha.wat"), "inflation = 0.5")
        .err()
        .expect("bad param");
    assert!(e.contains("inflation must be at least 1"), "{e}");
    let e = build(&corpus("benign/chacha.wat"), "bogus = 1")
        .err()
        .expect("unknown param");
    assert!(e.contains("bogus"), "{e}");
}

#[test]
fn a_batch_capable_module_takes_a_burst_from_the_ring_in_batches_of_b() {
    let mut oc = build(
        &corpus("benign/hdr_rewrite.wat"),
        "min_interarrival_ns = 5000\nviolations = { k = 100, window = 100 }",
    )
    .unwrap();
    let info = OffcodeInfo {
        app: "t".into(),
        name: "nat".into(),
        implementation: "loader:wasm".into(),
        pe: "wasm:0".into(),
        pe_kind: PeKind::Wasm,
        inputs: vec!["in".into()],
        outputs: vec!["out".into()],
        calls: vec![],
    };
    let params = toml::Table::new();
    let metrics = Metrics::default();
    oc.initialize(&mut InitCx::new(&info, &params, &metrics))
        .unwrap();
    let ring = |slots| {
        Ring::create(RingConfig {
            slots,
            slot_size: 2048 + 16,
            ..RingConfig::default()
        })
        .unwrap()
    };
    let (mut inp, cons_in) = ring(128);
    let (prod_out, mut cons_out) = ring(128);
    let mut inlet = Inlet::Ring(cons_in.into_iter().next().unwrap());
    let mut outlets = vec![Outlet::Ring(Sender::new(prod_out, Delivery::Reliable))];
    // 70 frames, every fifth with TTL 1 (dropped by the handler, status -2).
    for i in 0..70u8 {
        let mut f = vec![i; 64];
        f[12] = 0x08;
        f[13] = 0x00;
        f[14] = 0x45;
        f[22] = if i % 5 == 0 { 1 } else { 9 };
        f[23] = 17;
        assert!(inp.try_push(&f).unwrap());
    }
    inp.publish();
    {
        let mut cx = RunCx::new(&info, &mut outlets, Instant::now());
        let d = oc
            .handle_burst(&mut cx, InputId(0), &mut inlet, 100)
            .unwrap();
        assert_eq!(d.messages, 70);
        cx.flush().unwrap();
    }
    let mut got = Vec::new();
    while let Ok(m) = cons_out[0].try_recv() {
        assert_eq!(m.len(), 64);
        assert_eq!(&m[30..34], &[10, 0, 0, 1], "rewritten by the wasm module");
        assert_eq!(m[22], 8, "TTL decremented");
        got.push(m[0]);
    }
    let want: Vec<u8> = (0..70u8).filter(|i| i % 5 != 0).collect();
    assert_eq!(got, want, "forwarded in order, TTL-1 frames dropped");
    let snap = metrics.snapshot();
    let get = |n: &str| snap.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
    assert_eq!(get("invocations"), Some(70), "{snap:?}");
    assert_eq!(get("batches"), Some(3), "32 + 32 + 6: {snap:?}");
}
