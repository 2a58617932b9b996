//! The test corpus through the verifier: benign modules are admitted with their bounds,
//! hostile ones are rejected for the right reason (asserted on kind and message).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;

use sidecore_ext_verify::{BoundSource, Calibration, Policy, Rejection, verify};

fn corpus(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("corpus")
        .join(rel);
    wat::parse_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn reject(rel: &str) -> Rejection {
    match verify(&corpus(rel), &Policy::default(), &Calibration::fallback()) {
        Ok(a) => panic!("{rel} was admitted:\n{}", a.report),
        Err(r) => r,
    }
}

const BENIGN: &[&str] = &[
    "counter",
    "classifier",
    "hdr_rewrite",
    "checksum",
    "chacha",
    "flowtable",
];

#[test]
fn benign_modules_are_admitted_with_bounds() {
    for name in BENIGN {
        let bytes = corpus(&format!("benign/{name}.wat"));
        let a = verify(&bytes, &Policy::default(), &Calibration::fallback())
            .unwrap_or_else(|r| panic!("{name} rejected: {r}"));
        let h = a.entry("handle").expect("handler reported");
        assert!(h.admitted && h.handler, "{name}");
        assert!(
            h.bound_cycles > 0.0 && h.bound_fuel > 0.0,
            "{name}: {}",
            a.report
        );
        assert!(
            a.report.contains("handler `handle`: bound"),
            "{name}: {}",
            a.report
        );
        // The module to run is valid Wasm.
        wasmparser::Validator::new_with_features(sidecore_ext_verify::module::features())
            .validate_all(&a.module)
            .unwrap_or_else(|e| panic!("{name}: instrumented module invalid: {e}"));
    }
}

#[test]
fn proven_and_declared_loops_are_reported() {
    let a = verify(
        &corpus("benign/classifier.wat"),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap();
    let l = &a.loops[0];
    assert_eq!(
        l.iterations, 17,
        "16 rules + the exiting start: {}",
        a.report
    );
    assert!(matches!(l.source, BoundSource::Proven(_)));
    assert!(!a.instrumented, "nothing to instrument in the classifier");

    let a = verify(
        &corpus("benign/chacha.wat"),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap();
    let rounds = a.loops.iter().find(|l| l.ordinal == 1).unwrap();
    assert_eq!(rounds.iterations, 10, "{}", a.report);
    assert!(matches!(rounds.source, BoundSource::Proven(_)));
    let blocks = a.loops.iter().find(|l| l.ordinal == 0).unwrap();
    assert_eq!(blocks.iterations, 2048 / 64 + 1);
    assert!(matches!(&blocks.source, BoundSource::Declared(e) if e == "PACKET_LEN_MAX/64+1"));
    assert!(a.instrumented);
    assert!(
        a.report
            .contains("declared PACKET_LEN_MAX/64+1, enforced by one check at loop entry"),
        "{}",
        a.report
    );
}

#[test]
fn max_over_branches_not_sum() {
    // Two arms of very different cost: the bound must be the dearer arm, not both.
    let wat = r#"(module
      (memory (export "memory") 1 1)
      (func (export "sc_input_ptr") (result i32) (i32.const 0))
      (func (export "sc_input_cap") (result i32) (i32.const 64))
      (func (export "handle") (param $n i32) (result i32)
        (if (result i32) (local.get $n)
          (then (i32.div_u (i32.div_u (i32.div_u (local.get $n) (i32.const 3)) (i32.const 5)) (i32.const 7)))
          (else (i32.add (local.get $n) (i32.const 1))))))"#;
    let cal = Calibration::fallback();
    let a = verify(&wat::parse_str(wat).unwrap(), &Policy::default(), &cal).unwrap();
    let h = a.entry("handle").unwrap();
    let div = cal.class_cycles[&sidecore_ext_verify::OpClass::Div];
    // then-arm: 3 divs; the else arm's add must not be added on top.
    let body = h.bound_cycles - cal.invoke_cycles;
    assert!(body >= 3.0 * div, "{body}");
    assert!(body < 3.0 * div + 12.0, "sum of arms? {body}\n{}", a.report);
    assert!(
        h.path.iter().any(|s| s.contains("then arm")),
        "{:?}",
        h.path
    );
}

#[test]
fn unbounded_loop_is_rejected() {
    let r = reject("hostile/unbounded_loop.wat");
    assert!(r.has("unbounded-loop"), "{r}");
    assert!(r.to_string().contains("loop #0 in handle"), "{r}");
    assert!(r.to_string().contains("no induction variable"), "{r}");
}

#[test]
fn data_dependent_loop_without_declaration_is_rejected() {
    let r = reject("hostile/data_loop.wat");
    assert!(r.has("unbounded-loop"), "{r}");
    assert!(
        r.to_string()
            .contains("no provable bound and no declared bound"),
        "{r}"
    );
}

#[test]
fn recursion_is_rejected() {
    let r = reject("hostile/recursion.wat");
    assert!(r.has("recursion"), "{r}");
    assert!(r.to_string().contains("calls itself"), "{r}");
}

#[test]
fn mutual_recursion_is_rejected() {
    let r = reject("hostile/mutual_recursion.wat");
    assert!(r.has("recursion"), "{r}");
    let s = r.to_string();
    assert!(s.contains("→"), "cycle named: {s}");
}

#[test]
fn call_indirect_tricks_are_rejected() {
    let r = reject("hostile/indirect_cycle.wat");
    assert!(
        r.has("recursion"),
        "an indirect self-call is recursion: {r}"
    );
    let r = reject("hostile/indirect_table_set.wat");
    assert!(r.has("indirect-call"), "{r}");
    assert!(r.to_string().contains("table.set"), "{r}");
    let r = reject("hostile/indirect_exported_table.wat");
    assert!(r.has("indirect-call"), "{r}");
    assert!(r.to_string().contains("exported"), "{r}");
}

#[test]
fn memory_grow_bomb_is_rejected() {
    let r = reject("hostile/memory_grow.wat");
    assert!(r.has("memory-grow"), "{r}");
    assert!(r.to_string().contains("memory.grow in handle"), "{r}");
}

#[test]
fn huge_declared_bound_is_rejected() {
    let r = reject("hostile/huge_bound.wat");
    assert!(r.has("huge-declared-bound"), "{r}");
    assert!(r.to_string().contains("4000000000"), "{r}");
}

#[test]
fn large_but_allowed_bound_over_budget_is_rejected_with_report() {
    // 1M iterations is under max_declared_bound but blows the inflated limit; the report
    // names the handler, the path and the loop that dominates.
    let src = std::fs::read_to_string(
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("corpus/hostile/huge_bound.wat"),
    )
    .unwrap()
    .replace("4000000000", "1000000");
    let r = verify(
        &wat::parse_str(&src).unwrap(),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap_err();
    assert!(r.has("over-budget"), "{r}");
    let s = r.to_string();
    assert!(s.contains("handler `handle`"), "{s}");
    assert!(
        s.contains("dominating loops:") && s.contains("loop #0 in handle"),
        "{s}"
    );
    assert!(s.contains("worst path:"), "{s}");
}

#[test]
fn stack_exhaustion_is_rejected() {
    let mut src = String::from(
        "(module (memory (export \"memory\") 1 1)
         (func (export \"sc_input_ptr\") (result i32) (i32.const 4096))
         (func (export \"sc_input_cap\") (result i32) (i32.const 2048))\n",
    );
    let n = 24;
    for i in 0..n {
        let call = if i + 1 < n {
            format!("(call $f{} (local.get 0))", i + 1)
        } else {
            "(local.get 0)".into()
        };
        src.push_str(&format!(
            "(func $f{i} (param i32) (result i32) (local {}) (local.set 1 (i64.const {i})) {call})\n",
            "i64 ".repeat(4000)
        ));
    }
    src.push_str("(func (export \"handle\") (param i32) (result i32) (call $f0 (local.get 0))))");
    let r = verify(
        &wat::parse_str(&src).unwrap(),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap_err();
    assert!(r.has("stack-too-deep"), "{r}");
    assert!(
        r.to_string().contains("call chain handle → f0 → f1") || r.to_string().contains("handle →"),
        "{r}"
    );
}

#[test]
fn foreign_imports_are_rejected() {
    let r = reject("hostile/bad_import.wat");
    assert!(r.has("bad-import"), "{r}");
    assert!(
        r.to_string()
            .contains("`env.system`: not part of sidecore's host ABI"),
        "{r}"
    );
}

#[test]
fn garbage_is_rejected_not_panicking() {
    for bytes in [&b""[..], b"\0asm", b"\0asm\x01\0\0\0\x01", b"hello world"] {
        let r = verify(bytes, &Policy::default(), &Calibration::fallback()).unwrap_err();
        assert!(r.has("malformed"), "{r}");
    }
}

#[test]
fn missing_abi_exports_are_named() {
    let r = verify(
        &wat::parse_str("(module (func (export \"go\")))").unwrap(),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap_err();
    let s = r.to_string();
    assert!(s.contains("missing export `sc_input_ptr`"), "{s}");
    assert!(s.contains("missing export `handle"), "{s}");
    assert!(s.contains("missing export `memory`"), "{s}");
}

#[test]
fn every_report_states_each_entrys_bound_and_verdict() {
    // Also shows the reports with `--nocapture`.
    for name in BENIGN {
        let a = verify(
            &corpus(&format!("benign/{name}.wat")),
            &Policy::default(),
            &Calibration::fallback(),
        )
        .unwrap();
        println!("== {name}\n{}", a.report);
        assert!(!a.entries.is_empty(), "{name}: no entries");
        for e in &a.entries {
            let kind = match (e.handler, e.batch) {
                (true, _) => "handler",
                (false, Some(_)) => "batch entry",
                (false, None) => "entry",
            };
            // The line names the entry and its bound in cycles, exactly as admitted.
            let line = a
                .report
                .lines()
                .find(|l| l.starts_with(&format!("{kind} `{}`", e.name)) && l.contains(": bound"))
                .unwrap_or_else(|| panic!("{name}: no line for `{}` in\n{}", e.name, a.report));
            assert!(
                line.contains(&format!("bound {} cycles", e.bound_cycles.round()))
                    && line.contains("— ADMITTED"),
                "{name}: {line} (bound {})",
                e.bound_cycles
            );
        }
    }
}

/// Modules of the corpus that export a batch entry (`batch`, B = 32).
const BATCHED: &[&str] = &[
    "counter",
    "classifier",
    "hdr_rewrite",
    "checksum",
    "flowtable",
];

#[test]
fn batch_entries_are_admitted_with_the_batch_loop_proven_against_b() {
    let policy = Policy::default();
    for name in BATCHED {
        let a = verify(
            &corpus(&format!("benign/{name}.wat")),
            &policy,
            &Calibration::fallback(),
        )
        .unwrap_or_else(|r| panic!("{name} rejected: {r}"));
        assert_eq!(a.batch_max, Some(32), "{name}");
        let b = a.entry("batch").expect("batch entry reported");
        assert_eq!(b.batch, Some(32), "{name}");
        assert!(b.admitted && !b.handler, "{name}: {}", a.report);
        // The batch budget is B × the per-buffer limit.
        assert!(
            b.bound_cycles <= a.limit_cycles * 32.0 * policy.inflation,
            "{name}"
        );
        assert!(
            a.report.contains("batch entry `batch` (B = 32; limit"),
            "{name}: {}",
            a.report
        );
        // The buffer loop of `batch` is its loop #0: proven, 32 buffers + the exiting start.
        let lp = a
            .loops
            .iter()
            .find(|l| l.func == b.func && l.ordinal == 0)
            .unwrap_or_else(|| panic!("{name}: no batch loop\n{}", a.report));
        assert_eq!(lp.iterations, 33, "{name}: {}", a.report);
        match &lp.source {
            BoundSource::Proven(how) => {
                assert!(how.contains("batch size n, 1 ≤ n ≤ 32"), "{name}: {how}");
            }
            other => panic!("{name}: batch loop not proven: {other:?}"),
        }
        // Poll points only where a batch can exceed B × the limit: where one worst-case
        // buffer already exceeds the per-buffer limit (checksum of 2048 bytes under the
        // fallback calibration), never for handlers well within it.
        let h = a.entry("handle").unwrap();
        if h.over_limit {
            let every = lp
                .poll_every
                .expect("poll point in an over-limit batch loop");
            assert!((1..32).contains(&every), "{name}: {}", a.report);
        } else {
            assert_eq!(lp.poll_every, None, "{name}: {}", a.report);
        }
    }
}

fn batch_module(max_body: &str, batch_body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
      (memory (export "memory") 2 2)
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "sc_batch_max") (result i32) {max_body})
      (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
      (func (export "handle") (param i32) (result i32) (i32.const 0))
      (func (export "batch") (param $n i32) (result i32) (local $i i32) {batch_body}))"#
    ))
    .unwrap()
}

const COUNT_TO_N: &str = "(block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l))) (i32.const 0)";

#[test]
fn a_batch_loop_not_bounded_by_b_is_rejected_with_a_reason() {
    let cal = Calibration::fallback();
    // The reference: counting up to n is bounded by B.
    let a = verify(
        &batch_module("(i32.const 8)", COUNT_TO_N),
        &Policy::default(),
        &cal,
    )
    .unwrap();
    assert_eq!(a.loops[0].iterations, 9, "{}", a.report);

    // n is overwritten first: no longer the host's 1..=B.
    let body = format!("(local.set $n (i32.load (i32.const 0))) {COUNT_TO_N}");
    let r = verify(
        &batch_module("(i32.const 8)", &body),
        &Policy::default(),
        &cal,
    )
    .unwrap_err();
    assert!(r.has("unbounded-loop"), "{r}");
    assert!(r.to_string().contains("loop #0 in batch"), "{r}");

    // Counting to a value read from memory.
    let body = COUNT_TO_N.replace("(local.get $n)", "(i32.load (i32.const 0))");
    let r = verify(
        &batch_module("(i32.const 8)", &body),
        &Policy::default(),
        &cal,
    )
    .unwrap_err();
    assert!(r.has("unbounded-loop"), "{r}");

    // The same loop in a per-buffer handler: its parameter is a length, not n ≤ B.
    let src = format!(
        r#"(module (memory (export "memory") 1 1)
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "handle") (param $n i32) (result i32) (local $i i32) {COUNT_TO_N}))"#
    );
    let r = verify(&wat::parse_str(src).unwrap(), &Policy::default(), &cal).unwrap_err();
    assert!(r.has("unbounded-loop"), "{r}");

    // Declared instead: accepted against the BATCH_MAX symbol (= B), and enforced.
    let body = COUNT_TO_N.replace("(local.get $n)", "(i32.load (i32.const 0))");
    let a = verify(&declared_batch_module(&body), &Policy::default(), &cal).unwrap();
    let lp = &a.loops[0];
    assert_eq!(lp.iterations, 8, "{}", a.report);
    assert!(matches!(&lp.source, BoundSource::Declared(e) if e == "BATCH_MAX"));
    assert!(a.instrumented);
}

#[test]
fn a_bad_batch_size_is_rejected_with_a_reason() {
    let cal = Calibration::fallback();
    for (max, why) in [
        ("(i32.load (i32.const 0))", "must be exactly `i32.const B`"),
        (
            "(i32.const 0)",
            "B = 0 from `sc_batch_max` is outside 1..=256",
        ),
        ("(i32.const 100000)", "outside 1..=256"),
    ] {
        let r = verify(&batch_module(max, COUNT_TO_N), &Policy::default(), &cal).unwrap_err();
        assert!(r.has("bad-batch"), "{max}: {r}");
        assert!(r.to_string().contains(why), "{max}: {r}");
    }
    // A batch entry without `sc_batch_ptr`.
    let src = r#"(module (memory (export "memory") 1 1)
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "sc_batch_max") (result i32) (i32.const 4))
      (func (export "handle") (param i32) (result i32) (i32.const 0))
      (func (export "batch") (param i32) (result i32) (i32.const 0)))"#;
    let r = verify(&wat::parse_str(src).unwrap(), &Policy::default(), &cal).unwrap_err();
    assert!(
        r.to_string().contains("missing export `sc_batch_ptr`"),
        "{r}"
    );
}

#[test]
fn a_batch_over_b_times_the_limit_is_rejected_and_says_so() {
    // Each buffer costs ~the whole per-buffer budget: fine for `handle`, but 64 of them
    // exceed B × the limit only if the body does; here the batch loop runs an inner
    // loop of 1M declared iterations per buffer.
    let body = r#"(block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (block $x (loop $inner (br_if $x (i32.eqz (i32.load (i32.const 0)))) (br $inner)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l))) (i32.const 0)"#;
    let src = format!(
        r#"(module
      (memory (export "memory") 2 2)
      (@custom "sidecore.bounds" "batch 1 1000000")
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "sc_batch_max") (result i32) (i32.const 16))
      (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
      (func (export "handle") (param i32) (result i32) (i32.const 0))
      (func (export "batch") (param $n i32) (result i32) (local $i i32) {body}))"#
    );
    let r = verify(
        &wat::parse_str(src).unwrap(),
        &Policy::default(),
        &Calibration::fallback(),
    )
    .unwrap_err();
    assert!(r.has("over-budget"), "{r}");
    assert!(
        r.to_string()
            .contains("for a batch of B = 16 buffers, i.e. B × the per-buffer limit"),
        "{r}"
    );
}

/// A module whose batch loop bound is declared as `batch 0 BATCH_MAX` (B = 8).
fn declared_batch_module(body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
      (memory (export "memory") 2 2)
      (@custom "sidecore.bounds" "batch 0 BATCH_MAX")
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "sc_batch_max") (result i32) (i32.const 8))
      (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
      (func (export "handle") (param i32) (result i32) (i32.const 0))
      (func (export "batch") (param $n i32) (result i32) (local $i i32) {body}))"#
    ))
    .unwrap()
}
