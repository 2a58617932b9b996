//! End-to-end tests of the dynamic side on real wasmtime instances: the benign corpus
//! computes the right answers, hostile modules are contained (never killed mid-packet by
//! sidecore: violations are recorded and the offcode is unloaded when idle), regions are
//! capped, and the four execution modes agree.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sidecore_ext::verify::{Calibration, Policy, RegionCaps};
use sidecore_ext::{
    ExecMode, ExtConfig, ExtEngine, InvokeError, LoadError, ViolationPolicy, WasmExtension,
};

fn corpus(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../ext-verify/corpus")
        .join(rel);
    wat::parse_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Functional tests run on a shared, noisy machine: cold first invocations may exceed a
/// realistic limit, so they use a violation policy that does not unload.
fn lenient() -> ExtConfig {
    ExtConfig {
        violations: ViolationPolicy {
            k: 1000,
            window: 1000,
        },
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

/// Ethernet + IPv4 + TCP frame of `len` bytes.
fn frame(len: usize, proto: u8, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[12] = 0x08;
    f[13] = 0x00;
    let ip = 14;
    f[ip] = 0x45;
    let tot = (len - 14) as u16;
    f[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
    f[ip + 8] = 64;
    f[ip + 9] = proto;
    f[ip + 12..ip + 16].copy_from_slice(&[192, 168, 1, 2]);
    f[ip + 16..ip + 20].copy_from_slice(&[192, 168, 1, 99]);
    let c = inet_csum(&f[ip..ip + 20]);
    f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
    f[ip + 20..ip + 22].copy_from_slice(&1234u16.to_be_bytes());
    f[ip + 22..ip + 24].copy_from_slice(&dport.to_be_bytes());
    for (i, b) in f.iter_mut().enumerate().skip(ip + 40) {
        *b = (i * 7) as u8;
    }
    f
}

fn inet_csum(b: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in b.chunks(2) {
        s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[test]
fn header_rewriter_rewrites_and_keeps_the_checksum_valid() {
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/hdr_rewrite.wat"), &lenient());
    let f = frame(64, 6, 80);
    let o = x.invoke(0, &f).unwrap();
    assert_eq!(o.status, 0);
    let out = x.emitted();
    assert_eq!(out.len(), 1);
    let g = out[0].1;
    assert_eq!(&g[30..34], &[10, 0, 0, 1], "destination rewritten");
    assert_eq!(g[22], 63, "TTL decremented");
    assert_eq!(inet_csum(&g[14..34]), 0, "header checksum still valid");
    // short frame: dropped with an error status, nothing emitted
    let o = x.invoke(0, &f[..20]).unwrap();
    assert_eq!(o.status, -1);
    assert!(x.emitted().is_empty());
}

#[test]
fn checksum_matches_rfc1071_with_its_declared_bound_enforced() {
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/checksum.wat"), &lenient());
    assert!(x.admission.instrumented);
    for len in [0usize, 1, 2, 61, 1500, 2047, 2048] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        let o = x.invoke(0, &data).unwrap();
        assert_eq!(o.trap, None, "len {len}");
        let out = x.emitted();
        // the module sums little-endian 16-bit loads; RFC 1071 is byte-order independent
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            s += u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        }
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        assert_eq!(out[0].1, (!(s as u16)).to_le_bytes(), "len {len}");
    }
}

fn chacha_block(key: &[u8; 32], counter: u32, nonce: &[u8; 12]) -> [u8; 64] {
    let mut s = [0u32; 16];
    s[..4].copy_from_slice(&[0x61707865, 0x3320646e, 0x79622d32, 0x6b206574]);
    for i in 0..8 {
        s[4 + i] = u32::from_le_bytes(key[4 * i..4 * i + 4].try_into().unwrap());
    }
    s[12] = counter;
    for i in 0..3 {
        s[13 + i] = u32::from_le_bytes(nonce[4 * i..4 * i + 4].try_into().unwrap());
    }
    let mut x = s;
    fn qr(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    }
    for _ in 0..10 {
        qr(&mut x, 0, 4, 8, 12);
        qr(&mut x, 1, 5, 9, 13);
        qr(&mut x, 2, 6, 10, 14);
        qr(&mut x, 3, 7, 11, 15);
        qr(&mut x, 0, 5, 10, 15);
        qr(&mut x, 1, 6, 11, 12);
        qr(&mut x, 2, 7, 8, 13);
        qr(&mut x, 3, 4, 9, 14);
    }
    let mut out = [0u8; 64];
    for i in 0..16 {
        out[4 * i..4 * i + 4].copy_from_slice(&x[i].wrapping_add(s[i]).to_le_bytes());
    }
    out
}

#[test]
fn chacha_matches_the_rfc8439_block_function() {
    // RFC 8439 §2.3.2 test vector: key 00..1f, counter 1, nonce 000000090000004a00000000.
    let key: [u8; 32] = std::array::from_fn(|i| i as u8);
    let nonce = [0, 0, 0, 9, 0, 0, 0, 0x4a, 0, 0, 0, 0];
    let b = chacha_block(&key, 1, &nonce);
    assert_eq!(
        &b[..4],
        &[0x10, 0xf1, 0xe7, 0xe4],
        "reference implementation agrees with the RFC"
    );
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/chacha.wat"), &lenient());
    let data: Vec<u8> = (0..200).map(|i| i as u8).collect();
    x.invoke(0, &data).unwrap();
    let out = x.emitted()[0].1.to_vec();
    for (i, (o, d)) in out.iter().zip(&data).enumerate() {
        let ks = chacha_block(&key, (i / 64) as u32, &nonce)[i % 64];
        assert_eq!(*o, d ^ ks, "byte {i}");
    }
}

#[test]
fn classifier_counter_and_flowtable_do_their_jobs() {
    let e = engine(ExecMode::Hybrid);
    let four = ExtConfig {
        outputs: vec!["a".into(), "b".into(), "c".into(), "other".into()],
        ..lenient()
    };
    let mut c = load(&e, &corpus("benign/classifier.wat"), &four);
    for (proto, port, want) in [
        (6u8, 443u16, 1u32),
        (6, 22, 0),
        (17, 53, 2),
        (6, 31337, 3),
        (1, 0, 2),
    ] {
        c.invoke(0, &frame(64, proto, port)).unwrap();
        assert_eq!(c.emitted()[0].0, want, "proto {proto} port {port}");
    }
    let mut n = load(&e, &corpus("benign/counter.wat"), &lenient());
    for _ in 0..5 {
        n.invoke(0, &frame(100, 6, 80)).unwrap();
        assert_eq!(n.emitted()[0].1.len(), 100);
    }
    assert_eq!(n.state_len(), 1, "one key in the host state store");
    let mut ft = load(&e, &corpus("benign/flowtable.wat"), &lenient());
    for _ in 0..3 {
        let o = ft.invoke(0, &frame(80, 6, 80)).unwrap();
        assert_eq!(o.status, 0);
    }
}

#[test]
fn a_lying_declared_bound_traps_and_the_offcode_is_unloaded() {
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("hostile/lying_bound.wat"), &lenient());
    let o = x.invoke(0, &[0u8; 5]).unwrap();
    assert_eq!(
        (o.status, o.trap.clone()),
        (15, None),
        "within its declaration it runs"
    );
    let o = x.invoke(0, &[0u8; 100]).unwrap();
    assert!(o.bound_exceeded, "{o:?}");
    assert!(
        o.trap
            .as_deref()
            .unwrap()
            .contains("declared loop bound exceeded: loop #0 in handle"),
        "{o:?}"
    );
    assert!(o.unloaded);
    match x.invoke(0, &[0u8; 5]) {
        Err(InvokeError::Unloaded(why)) => {
            assert!(why.contains("declared loop bound exceeded"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn consistent_violators_are_unloaded_when_idle_never_mid_packet() {
    // ChaCha over 2 KiB takes microseconds; an acceptable limit of 50 ns with a huge
    // inflation factor admits it, and every invocation violates.
    let mut cfg = ExtConfig::default();
    cfg.policy.acceptable_limit_ns = 50.0;
    cfg.policy.inflation = 1e6;
    cfg.violations = ViolationPolicy { k: 3, window: 10 };
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/chacha.wat"), &cfg);
    let data = vec![1u8; 2048];
    for i in 1..=3 {
        let o = x.invoke(0, &data).unwrap();
        assert!(o.violated, "{o:?}");
        assert_eq!(o.trap, None, "never aborted");
        assert_eq!(o.status, 0, "ran to completion");
        assert_eq!(
            x.emitted().len(),
            usize::from(i < 3),
            "output delivered (the third unloads right after)"
        );
        assert_eq!(o.unloaded, i == 3);
    }
    assert!(
        x.unload_reason()
            .unwrap()
            .to_string()
            .contains("3 violations")
    );
    assert!(matches!(x.invoke(0, &data), Err(InvokeError::Unloaded(_))));
}

#[test]
fn poll_points_are_placed_only_where_needed_and_drain_without_aborting() {
    let mut cfg = ExtConfig::default();
    cfg.policy.acceptable_limit_ns = 100.0;
    cfg.policy.inflation = 1e4;
    cfg.violations = ViolationPolicy {
        k: 1000,
        window: 1000,
    };
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/checksum.wat"), &cfg);
    assert!(
        x.admission.loops.iter().any(|l| l.poll_every.is_some()),
        "{}",
        x.admission.report
    );
    let drains = Arc::new(AtomicU64::new(0));
    let d2 = drains.clone();
    x.set_drain_hook(Box::new(move || {
        d2.fetch_add(1, Ordering::Relaxed);
    }));
    let o = x.invoke(0, &vec![3u8; 2048]).unwrap();
    assert_eq!(o.trap, None);
    assert!(o.violated);
    let (polls, dr) = x.poll_stats();
    assert!(polls > 0 && dr > 0, "polls {polls} drains {dr}");
    assert_eq!(drains.load(Ordering::Relaxed), dr);
    // A module within the limit gets no poll points at all.
    let y = load(&e, &corpus("benign/classifier.wat"), &ExtConfig::default());
    assert!(!y.admission.instrumented && y.admission.loops.iter().all(|l| l.poll_every.is_none()));
}

#[test]
fn epoch_mode_callback_records_and_continues() {
    // A loop that runs 20M iterations (declared, so admitted with a big factor).
    let wat = r#"(module
      (memory (export "memory") 1 1)
      (@custom "sidecore.bounds" "handle 0 30000000")
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "handle") (param $n i32) (result i32)
        (local $i i32) (local $acc i32) (local $end i32)
        (local.set $end (i32.mul (local.get $n) (i32.const 10000)))
        (block $d (loop $l
          (br_if $d (i32.ge_u (local.get $i) (local.get $end)))
          (local.set $acc (i32.add (local.get $acc) (i32.xor (local.get $i) (i32.const 5))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $l)))
        (local.get $acc)))"#;
    let bytes = wat::parse_str(wat).unwrap();
    let mut cfg = ExtConfig::default();
    cfg.policy.acceptable_limit_ns = 1000.0;
    cfg.policy.inflation = 1e7;
    cfg.policy.max_declared_bound = 1 << 26;
    cfg.violations = ViolationPolicy {
        k: 100,
        window: 100,
    };
    let e = engine(ExecMode::Epoch);
    let mut x = load(&e, &bytes, &cfg);
    let o = x.invoke(0, &[0u8; 2000]).unwrap(); // 20M iterations: tens of milliseconds
    assert_eq!(o.trap, None, "epoch deadline continued, never trapped");
    assert!(o.violated);
    let expect = (0..20_000_000u32).fold(0u32, |a, i| a.wrapping_add(i ^ 5));
    assert_eq!(
        o.status as u32, expect,
        "ran to completion with the right result"
    );
    let (polls, _) = x.poll_stats();
    assert!(polls > 0, "the deadline callback ran");
}

#[test]
fn all_modes_agree_on_results() {
    let f = frame(300, 17, 53);
    let mut outs = Vec::new();
    for mode in [
        ExecMode::Hybrid,
        ExecMode::Unchecked,
        ExecMode::Fuel,
        ExecMode::Epoch,
    ] {
        let e = engine(mode);
        let mut x = load(&e, &corpus("benign/chacha.wat"), &lenient());
        let o = x.invoke(0, &f).unwrap();
        assert_eq!(o.status, 0, "{mode:?}");
        if mode == ExecMode::Fuel {
            let used = o.fuel.unwrap();
            let bound = x.admission.entry("handle").unwrap().bound_fuel;
            assert!(
                used > 0 && used as f64 <= bound,
                "fuel {used} within the static bound {bound}"
            );
        }
        outs.push(x.emitted()[0].1.to_vec());
    }
    assert!(outs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn stack_overflow_is_contained_by_the_engine_backstop() {
    // Admitted under a deliberately lax static stack cap, then run on an engine whose
    // stack is smaller: the guest traps (it is its own fault), the trap is counted and the
    // offcode is unloaded; the host is unharmed.
    let mut src = String::from(
        "(module (memory (export \"memory\") 1 1)
         (func (export \"sc_input_ptr\") (result i32) (i32.const 4096))
         (func (export \"sc_input_cap\") (result i32) (i32.const 2048))\n",
    );
    // Every function keeps 400 values live across its call, so each frame spills them.
    let (n, live) = (40, 400);
    for i in 0..n {
        let call = if i + 1 < n {
            format!("(call $f{} (local.get 0))", i + 1)
        } else {
            "(local.get 0)".into()
        };
        let mut body = String::new();
        for j in 0..live {
            body.push_str(&format!(
                "(local.set {} (i64.load offset={} (i32.const 0)))",
                j + 1,
                j * 8
            ));
        }
        body.push_str(&format!("(drop {call})"));
        let mut sum = String::from("(i64.const 0)");
        for j in 0..live {
            sum = format!("(i64.add {sum} (local.get {}))", j + 1);
        }
        src.push_str(&format!(
            "(func $f{i} (param i32) (result i32) (local {}) {body} (i64.store (i32.const 8) {sum}) (local.get 0))\n",
            "i64 ".repeat(live)
        ));
    }
    src.push_str("(func (export \"handle\") (param i32) (result i32) (call $f0 (local.get 0))))");
    let bytes = wat::parse_str(&src).unwrap();
    let mut cfg = ExtConfig::default();
    cfg.policy.max_stack_bytes = 64 << 20;
    let e = ExtEngine::new(ExecMode::Hybrid, 32 << 10, Duration::from_millis(1)).unwrap();
    let mut x = load(&e, &bytes, &cfg);
    let o = x.invoke(0, &[1]).unwrap();
    let t = o.trap.expect("stack overflow traps");
    assert!(t.to_lowercase().contains("stack"), "{t}");
    assert!(o.unloaded);
}

#[test]
fn memory_growth_is_capped_even_without_the_static_check() {
    // The verifier rejects memory.grow; the store limiter caps memory regardless.
    let r = WasmExtension::load(
        &engine(ExecMode::Hybrid),
        &corpus("hostile/memory_grow.wat"),
        &ExtConfig::default(),
        &Calibration::fallback(),
        Arc::new(Vec::new()),
    );
    match r {
        Err(LoadError::Rejected(rej)) => assert!(rej.has("memory-grow")),
        _ => panic!("memory.grow bomb admitted"),
    }
    let caps = RegionCaps {
        memory_bytes: 4 << 16,
        ..RegionCaps::default()
    };
    let got =
        sidecore_ext::host::probe_memory_cap(&caps, &corpus("hostile/memory_grow.wat")).unwrap();
    assert!(got <= 4 << 16, "memory grew to {got} bytes past the 'C cap");
}

#[test]
fn regions_are_capped() {
    let wat = r#"(module
      (import "sc" "state_put" (func $put (param i64 i32 i32) (result i32)))
      (import "sc" "cache_put" (func $cput (param i32 i32 i32) (result i32)))
      (import "sc" "cache_get" (func $cget (param i32 i32 i32) (result i32)))
      (import "sc" "shared_lookup" (func $look (param i32 i32) (result i32)))
      (import "sc" "shared_read" (func $read (param i32 i32 i32 i32) (result i32)))
      (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
      (memory (export "memory") 1 1)
      (data (i32.const 16) "routes")
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "handle") (param $n i32) (result i32)
        ;; results of each call stored as i32s at 256.. and emitted
        (i32.store (i32.const 256) (call $put (i64.const 1) (i32.const 4096) (i32.const 300)))
        (i32.store (i32.const 260) (call $put (i64.const 2) (i32.const 4096) (i32.const 200)))
        (i32.store (i32.const 264) (call $cput (i32.const 0) (i32.const 4096) (local.get $n)))
        (i32.store (i32.const 268) (call $cget (i32.const 0) (i32.const 8192) (i32.const 2048)))
        (i32.store (i32.const 272) (call $cput (i32.const 99) (i32.const 4096) (i32.const 1)))
        (i32.store (i32.const 276) (call $look (i32.const 16) (i32.const 6)))
        (i32.store (i32.const 280) (call $read (i32.const 0) (i32.const 0) (i32.const 512) (i32.const 8)))
        (i32.store (i32.const 284) (call $read (i32.const 0) (i32.const 0) (i32.const 512) (i32.const 9000)))
        (drop (call $emit (i32.const 0) (i32.const 256) (i32.const 32)))
        (call $emit (i32.const 0) (i32.const 512) (i32.const 8))))"#;
    let bytes = wat::parse_str(wat).unwrap();
    let mut cfg = lenient();
    cfg.policy.caps = RegionCaps {
        state_value_bytes: 256,
        cache_slots: 4,
        ..RegionCaps::default()
    };
    let shared = Arc::new(vec![(
        "routes".to_string(),
        Arc::<[u8]>::from(vec![9u8; 64]),
    )]);
    let e = engine(ExecMode::Hybrid);
    let mut x = WasmExtension::load(&e, &bytes, &cfg, &Calibration::fallback(), shared).unwrap();
    let o = x.invoke(0, &[5u8; 100]).unwrap();
    assert_eq!(o.status, 0);
    let out = x.emitted();
    let r: Vec<i32> = out[0]
        .1
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(r[0], -2, "'C value over state_value_bytes refused");
    assert_eq!(r[1], 0, "'C value within the cap stored");
    assert_eq!(r[2], 0, "'B put");
    assert_eq!(r[3], 100, "'B get returns the cached packet");
    assert_eq!(r[4], -1, "'B slot beyond the cap");
    assert_eq!(r[5], 0, "'D area found by name");
    assert_eq!(r[6], 8, "'D read");
    assert_eq!(r[7], -1, "'D read past the area / cap refused");
    assert_eq!(out[1].1, &[9u8; 8]);
    // 'A: an input larger than the module's buffer is refused, not a violation
    assert!(matches!(
        x.invoke(0, &[0u8; 4000]),
        Err(InvokeError::InputTooLarge {
            len: 4000,
            cap: 2048
        })
    ));
    assert_eq!(
        x.tracker().total_invocations,
        1,
        "a refused input is not an invocation"
    );
}

#[test]
fn bad_abi_exports_are_reported_at_load() {
    let wat = r#"(module (memory (export "memory") 1 1)
      (func (export "sc_input_ptr") (result i32) (i32.const 65000))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "handle") (param i32) (result i32) (i32.const 0)))"#;
    let r = WasmExtension::load(
        &engine(ExecMode::Hybrid),
        &wat::parse_str(wat).unwrap(),
        &ExtConfig::default(),
        &Calibration::fallback(),
        Arc::new(Vec::new()),
    );
    match r {
        Err(LoadError::Abi(m)) => assert!(m.contains("outside linear memory"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded"),
    }
    let _ = Policy::default();
}

#[test]
fn entry_checked_declared_bound_is_exact() {
    // checksum declares PACKET_LEN_MAX/2+1 body starts; with PACKET_LEN_MAX = 100 that is
    // 51: a 100-byte input needs exactly 51 (50 iterations + the start that exits), a
    // 102-byte one needs 52 and must trap before the loop runs.
    let mut cfg = lenient();
    cfg.policy.symbols.insert("PACKET_LEN_MAX".into(), 100);
    let e = engine(ExecMode::Hybrid);
    let mut x = load(&e, &corpus("benign/checksum.wat"), &cfg);
    assert!(
        x.admission.loops[0].checked_at_entry,
        "{}",
        x.admission.report
    );
    assert_eq!(x.admission.loops[0].iterations, 51);
    let o = x.invoke(0, &[7u8; 100]).unwrap();
    assert_eq!(o.trap, None);
    assert_eq!(x.emitted().len(), 1);
    let o = x.invoke(0, &[7u8; 102]).unwrap();
    assert!(o.bound_exceeded, "{o:?}");
    assert!(o.unloaded);
}
