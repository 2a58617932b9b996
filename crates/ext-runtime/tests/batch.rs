//! The batch ABI on real wasmtime instances: a batch gives exactly the per-buffer results
//! (statuses, outputs in order, final state) of the same inputs run one by one, in every
//! execution mode; malformed batches and verdicts are refused with clear errors; a
//! violating batch is one recorded violation and unloading happens between batches.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sidecore_ext::verify::{Calibration, abi};
use sidecore_ext::{
    BadVerdict, ExecMode, ExtConfig, ExtEngine, InvokeError, ViolationPolicy, WasmExtension,
};

fn corpus(name: &str) -> Vec<u8> {
    let p = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../ext-verify/corpus/benign")
        .join(format!("{name}.wat"));
    wat::parse_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cfg() -> ExtConfig {
    ExtConfig {
        violations: ViolationPolicy {
            k: 1000,
            window: 1000,
        },
        outputs: vec!["out".into(), "b".into(), "c".into(), "d".into()],
        ..ExtConfig::default()
    }
}

fn engine(mode: ExecMode) -> ExtEngine {
    ExtEngine::new(mode, 256 << 10, Duration::from_micros(100)).unwrap()
}

fn load(e: &ExtEngine, bytes: &[u8], cfg: &ExtConfig) -> WasmExtension {
    WasmExtension::load(
        e,
        bytes,
        cfg,
        &Calibration::fallback(),
        Arc::new(Vec::new()),
    )
    .unwrap_or_else(|err| panic!("load: {err}"))
}

/// Per buffer: (status, outputs as (output, bytes)).
type PerBuffer = Vec<(i32, Vec<(u32, Vec<u8>)>)>;

fn one_by_one(x: &mut WasmExtension, inputs: &[Vec<u8>]) -> PerBuffer {
    let h = x.handler("handle").unwrap();
    inputs
        .iter()
        .map(|i| {
            let o = x.invoke(h, i).unwrap();
            assert_eq!(o.trap, None);
            let outs = x
                .emitted()
                .into_iter()
                .map(|(o, b)| (o, b.to_vec()))
                .collect();
            (o.status, outs)
        })
        .collect()
}

fn batched(x: &mut WasmExtension, inputs: &[Vec<u8>]) -> PerBuffer {
    let h = x.batch_entry("batch").unwrap();
    let b = x.batch_max().unwrap();
    let mut res = PerBuffer::new();
    for chunk in inputs.chunks(b) {
        let refs: Vec<&[u8]> = chunk.iter().map(std::vec::Vec::as_slice).collect();
        let o = x.invoke_batch(h, &refs).unwrap();
        assert_eq!((o.status, o.trap.clone()), (0, None));
        let base = res.len();
        for it in x.batch_items() {
            assert_eq!(it.bad_verdict, None);
            res.push((it.status, Vec::new()));
        }
        let mut last = 0;
        x.for_each_batch_output(|buf, out, bytes| {
            assert!(buf >= last, "outputs in buffer order");
            last = buf;
            res[base + buf].1.push((out, bytes.to_vec()));
        });
    }
    res
}

/// Frames of every kind the corpus handlers tell apart.
fn frame(len: usize, proto: u8, dport: u16, ttl: u8, ethertype: u16, seed: u8) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    if len >= 14 {
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    }
    if len >= 38 {
        let ip = 14;
        f[ip] = 0x45;
        f[ip + 8] = ttl;
        f[ip + 9] = proto;
        f[ip + 22..ip + 24].copy_from_slice(&dport.to_be_bytes());
    }
    f
}

fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(20usize),
            Just(37),
            38usize..200,
            Just(1500),
            Just(2048)
        ],
        prop_oneof![Just(6u8), Just(17), Just(1), Just(99)],
        prop_oneof![Just(80u16), Just(443), Just(53), Just(9), any::<u16>()],
        prop_oneof![Just(0u8), Just(1), Just(2), Just(64)],
        prop_oneof![Just(0x0800u16), Just(0x86dd)],
        0u8..4,
    )
        .prop_map(|(len, p, d, t, e, s)| frame(len, p, d, t, e, s))
}

const BATCHED: &[&str] = &[
    "counter",
    "classifier",
    "hdr_rewrite",
    "checksum",
    "flowtable",
];

fn same_results(mode: ExecMode, name: &str, inputs: &[Vec<u8>]) {
    let e = engine(mode);
    let bytes = corpus(name);
    let mut single = load(&e, &bytes, &cfg());
    let mut batch = load(&e, &bytes, &cfg());
    let a = one_by_one(&mut single, inputs);
    let b = batched(&mut batch, inputs);
    assert_eq!(a, b, "{name} in {mode:?}");
    // The same state afterwards: counter's key/value, flowtable's table and overflows.
    assert_eq!(single.state_value(1), batch.state_value(1), "{name}");
    if name == "flowtable" {
        // The flow table (1024 slots of 32 bytes at 8192).
        let (a, b) = (
            single.memory_read(8192, 32 * 1024).unwrap(),
            batch.memory_read(8192, 32 * 1024).unwrap(),
        );
        assert!(a == b, "flow tables differ in {mode:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn a_batch_gives_the_per_buffer_results(inputs in prop::collection::vec(arb_frame(), 1..80)) {
        for name in BATCHED {
            same_results(ExecMode::Hybrid, name, &inputs);
        }
    }
}

#[test]
fn every_mode_gives_the_per_buffer_results() {
    let inputs: Vec<Vec<u8>> = (0..70)
        .map(|i| {
            frame(
                [64, 1500, 37, 2048][i % 4],
                [6, 17, 99][i % 3],
                [80, 443, 53][i % 3],
                [64, 1][i % 2],
                0x0800,
                i as u8,
            )
        })
        .collect();
    for mode in [
        ExecMode::Unchecked,
        ExecMode::Fuel,
        ExecMode::Epoch,
        ExecMode::Hybrid,
    ] {
        for name in BATCHED {
            same_results(mode, name, &inputs);
        }
    }
}

#[test]
fn malformed_batches_are_refused_with_clear_errors() {
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("hdr_rewrite"), &cfg());
    let h = x.batch_entry("batch").unwrap();
    assert_eq!(x.batch_max(), Some(32));
    let f = frame(64, 6, 80, 64, 0x0800, 0);
    let too_many: Vec<&[u8]> = vec![&f[..]; 33];
    let err = x.invoke_batch(h, &too_many).unwrap_err();
    assert_eq!(err, InvokeError::BatchTooLong { n: 33, max: 32 });
    assert_eq!(
        err.to_string(),
        "batch of 33 buffers exceeds the module's batch size B = 32"
    );
    let big = vec![0u8; 2049];
    let err = x.invoke_batch(h, &[&f, &f, &big]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "buffer #2 of the batch: 2049 bytes exceed the 2048-byte slot ('A)"
    );
    assert_eq!(x.invoke_batch(h, &[]).unwrap_err(), InvokeError::EmptyBatch);
    assert_eq!(x.invoke_staged(h).unwrap_err(), InvokeError::EmptyBatch);
    assert_eq!(
        x.invoke_batch(7, &[&f]).unwrap_err(),
        InvokeError::NoBatchEntry(7)
    );
    // Staging one by one stops at B.
    for i in 0..32 {
        assert_eq!(x.stage(&f).unwrap(), i);
    }
    assert_eq!(
        x.stage(&f).unwrap_err(),
        InvokeError::BatchTooLong { n: 33, max: 32 }
    );
    let o = x.invoke_staged(h).unwrap();
    assert_eq!(o.status, 0);
    assert_eq!(x.batch_items().len(), 32);
    assert_eq!(x.staged(), 0);
    // Nothing was run by the refused calls: 32 forwards from the one good batch.
    let mut n = 0;
    x.for_each_batch_output(|_, _, b| {
        assert_eq!(&b[30..34], &[10, 0, 0, 1]);
        n += 1;
    });
    assert_eq!(n, 32);
    // A module without batch entries.
    let mut y = load(&e, &corpus("chacha"), &cfg());
    assert_eq!(y.batch_max(), None);
    assert_eq!(y.invoke_batch(0, &[&f]).unwrap_err(), InvokeError::NoBatch);
    assert_eq!(y.stage(&f).unwrap_err(), InvokeError::NoBatch);
}

/// A batch entry that, for buffer i, emits the buffer's first byte and the index, then
/// gives verdict `fwd[i]` with length `len[i]` (tables at 0 and 64).
const VERDICTS: &str = r#"(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 2 2)
  (data (i32.const 0) "\00\00\00\00\07\00\00\00\01\00\00\00\ff\ff\ff\ff\00\00\00\00")
  (data (i32.const 64) "\03\00\00\00\03\00\00\00\00\10\00\00\02\00\00\00\01\00\00\00")
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func (export "sc_batch_max") (result i32) (i32.const 5))
  (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
  (func (export "handle") (param i32) (result i32) (i32.const 0))
  (func (export "batch") (param $n i32) (result i32) (local $i i32) (local $d i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (i32.store (i32.const 8192) (local.get $i))
      (local.set $d (i32.add (i32.const 8208) (i32.shl (local.get $i) (i32.const 4))))
      (drop (call $emit (i32.const 1) (i32.load (local.get $d)) (i32.const 1)))
      (i32.store8 (i32.const 200) (local.get $i))
      (drop (call $emit (i32.const 2) (i32.const 200) (i32.const 1)))
      (i32.store offset=4 (local.get $d) (i32.load offset=64 (i32.shl (local.get $i) (i32.const 2))))
      (i32.store offset=8 (local.get $d) (i32.add (local.get $i) (i32.const 10)))
      (i32.store offset=12 (local.get $d) (i32.load (i32.shl (local.get $i) (i32.const 2))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (i32.const 0)))"#;

#[test]
fn emits_and_in_place_verdicts_are_delivered_per_buffer_and_bad_verdicts_refused() {
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &wat::parse_str(VERDICTS).unwrap(), &cfg());
    let h = x.batch_entry("batch").unwrap();
    let bufs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![100 + i; 8]).collect();
    let refs: Vec<&[u8]> = bufs.iter().map(std::vec::Vec::as_slice).collect();
    let o = x.invoke_batch(h, &refs).unwrap();
    assert_eq!((o.status, o.trap), (0, None));
    let it = x.batch_items();
    // fwd table: 0, 7 (no such output), 1, -1, 0; len table: 3, 3, 4096 (over the slot), 2, 1
    assert_eq!((it[0].status, it[0].forward), (10, Some((0, 3))));
    assert_eq!(it[1].status, abi::STATUS_BAD_VERDICT);
    assert_eq!(
        it[1].bad_verdict.unwrap().to_string(),
        "verdict forwards to output 7, but the offcode has 4 outputs"
    );
    assert_eq!(it[2].status, abi::STATUS_BAD_VERDICT);
    assert_eq!(
        it[2].bad_verdict,
        Some(BadVerdict::TooLong {
            len: 4096,
            cap: 2048
        })
    );
    assert_eq!((it[3].status, it[3].forward), (13, None));
    assert_eq!((it[4].status, it[4].forward), (14, Some((0, 1))));
    let mut got = Vec::new();
    x.for_each_batch_output(|buf, out, b| got.push((buf, out, b.to_vec())));
    let want = vec![
        (0, 1, vec![100]),
        (0, 2, vec![0]),
        (0, 0, vec![100; 3]),
        (1, 1, vec![101]),
        (1, 2, vec![1]),
        (2, 1, vec![102]),
        (2, 2, vec![2]),
        (3, 1, vec![103]),
        (3, 2, vec![3]),
        (4, 1, vec![104]),
        (4, 2, vec![4]),
        (4, 0, vec![104]),
    ];
    assert_eq!(got, want);
}

#[test]
fn a_violating_batch_is_one_violation_and_unloading_waits_for_the_batch_to_end() {
    // Checksums of 32 × 2 KiB take microseconds; a limit of 1 ns per buffer (× n for a
    // batch) with a huge inflation factor admits the module, and every batch violates.
    let mut c = cfg();
    c.policy.acceptable_limit_ns = 1.0;
    c.policy.inflation = 1e7;
    c.violations = ViolationPolicy { k: 2, window: 10 };
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("checksum"), &c);
    let h = x.batch_entry("batch").unwrap();
    let data = vec![1u8; 2048];
    let refs: Vec<&[u8]> = vec![&data[..]; 32];
    let o = x.invoke_batch(h, &refs).unwrap();
    assert!(o.violated && !o.unloaded, "{o:?}");
    assert_eq!((o.status, o.trap), (0, None), "never aborted");
    assert_eq!(
        x.tracker().total_invocations,
        1,
        "a batch is one invocation"
    );
    assert_eq!(x.tracker().total_violations, 1);
    let mut n = 0;
    x.for_each_batch_output(|_, _, b| {
        assert_eq!(b.len(), 2);
        n += 1;
    });
    assert_eq!(n, 32, "every buffer's output delivered");
    // The second violating batch marks the offcode; it is unloaded once it returns,
    // with every buffer of the batch handled.
    let o = x.invoke_batch(h, &refs).unwrap();
    assert!(o.violated && o.unloaded, "{o:?}");
    assert_eq!((o.status, o.trap), (0, None), "ran to completion");
    assert_eq!(x.batch_items().len(), 32);
    assert!(x.batch_items().iter().all(|i| i.status == 0));
    assert!(
        x.unload_reason()
            .unwrap()
            .to_string()
            .contains("2 violations")
    );
    assert!(matches!(
        x.invoke_batch(h, &refs),
        Err(InvokeError::Unloaded(_))
    ));
    assert!(matches!(x.stage(&data), Err(InvokeError::Unloaded(_))));
}

#[test]
fn a_batch_within_b_times_the_limit_does_not_violate() {
    // hdr_rewrite takes tens of ns per buffer: under a generous per-buffer limit a full
    // batch must not count as a violation although it takes far more than one limit.
    let mut c = cfg();
    c.policy.acceptable_limit_ns = 2000.0;
    c.violations = ViolationPolicy { k: 1, window: 1 };
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("hdr_rewrite"), &c);
    let h = x.batch_entry("batch").unwrap();
    let f = frame(1500, 6, 80, 64, 0x0800, 0);
    let refs: Vec<&[u8]> = vec![&f[..]; 32];
    // Warm up, then the batch must fit 32 × 2 µs comfortably.
    for _ in 0..3 {
        let o = x.invoke_batch(h, &refs).unwrap();
        assert!(!o.unloaded && !o.violated, "{o:?}");
    }
}
