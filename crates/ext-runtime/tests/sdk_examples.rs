//! The Rust SDK end to end: builds `examples/ext` for wasm32-unknown-unknown with the
//! documented one command (scripts/setup.sh installs the target), then admits and runs
//! the modules the real compiler produced.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sidecore_ext::verify::{BoundSource, Calibration};
use sidecore_ext::{ExecMode, ExtConfig, ExtEngine, ViolationPolicy, WasmExtension};

fn build_examples() -> PathBuf {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("ext-examples");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-unknown-unknown",
            "--release",
            "--examples",
            "--manifest-path",
        ])
        .arg(root.join("examples/ext/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building examples/ext failed (is the wasm32-unknown-unknown target installed? scripts/setup.sh adds it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("wasm32-unknown-unknown/release/examples")
}

/// Per buffer: (status, outputs as (output, bytes)).
type PerBuffer = Vec<(i32, Vec<(u32, Vec<u8>)>)>;

#[test]
fn sdk_examples_build_are_admitted_and_run() {
    let dir = build_examples();
    let cal = Calibration::fallback();
    let cfg = ExtConfig {
        violations: ViolationPolicy {
            k: 1000,
            window: 1000,
        },
        ..ExtConfig::default()
    };
    let e = ExtEngine::new(
        ExecMode::Hybrid,
        cfg.policy.max_stack_bytes,
        Duration::from_millis(1),
    )
    .unwrap();
    let load = |name: &str| {
        let bytes = std::fs::read(dir.join(format!("{name}.wasm"))).unwrap();
        WasmExtension::load(&e, &bytes, &cfg, &cal, Arc::new(Vec::new()))
            .unwrap_or_else(|err| panic!("{name}: {err}"))
    };

    // Header rewriter: straight-line code.
    let mut h = load("hdr_rewrite");
    let mut f = vec![0u8; 64];
    f[12] = 0x08;
    f[14] = 0x45;
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[192, 168, 1, 2]);
    f[30..34].copy_from_slice(&[192, 168, 1, 99]);
    let mut s: u32 = f[14..34]
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    f[24..26].copy_from_slice(&(!(s as u16)).to_be_bytes());
    let o = h.invoke(0, &f).unwrap();
    assert_eq!(o.status, 0);
    let g = h.emitted()[0].1.to_vec();
    assert_eq!(&g[30..34], &[10, 0, 0, 1]);
    assert_eq!(g[22], 63);

    // Checksum: the compiler's loop carries the declared bound, which is enforced.
    let mut c = load("checksum");
    assert!(
        c.admission
            .loops
            .iter()
            .all(|l| matches!(l.source, BoundSource::Declared(_))
                || matches!(l.source, BoundSource::Proven(_))),
        "{}",
        c.admission.report
    );
    let data: Vec<u8> = (0..1500).map(|i| (i * 3) as u8).collect();
    let o = c.invoke(0, &data).unwrap();
    assert_eq!(o.trap, None, "{}", c.admission.report);
    let mut s: u32 = data
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    assert_eq!(c.emitted()[0].1, (!(s as u16)).to_le_bytes());

    // Counter: per-domain state through the host ABI.
    let mut n = load("counter");
    for _ in 0..3 {
        assert_eq!(n.invoke(0, &[1, 2, 3]).unwrap().status, 0);
    }
    assert_eq!(n.state_len(), 1);

    // The batch entries `batch_handler!` adds: admitted with the compiler's buffer loop
    // proven against B, and giving exactly the per-buffer results.
    let frames: Vec<Vec<u8>> = (0..45)
        .map(|i| {
            let mut g = f.clone();
            g.resize([64, 1500, 20, 1][i % 4], i as u8);
            if g.len() > 22 {
                g[22] = [64, 1, 9][i % 3];
            }
            g
        })
        .collect();
    for name in ["hdr_rewrite", "checksum", "counter"] {
        let mut single = load(name);
        let mut batch = load(name);
        let a = &batch.admission;
        assert_eq!(a.batch_max, Some(32), "{name}");
        let entry = a.entry("batch").expect("batch entry");
        assert!(entry.admitted, "{name}: {}", a.report);
        let outer =
            a.loops.iter().filter(|l| l.func == entry.func).find(
                |l| matches!(&l.source, BoundSource::Proven(h) if h.contains("batch size n")),
            );
        assert!(
            outer.is_some_and(|l| l.iterations <= 33),
            "{name}: the buffer loop is not proven against B\n{}",
            a.report
        );
        let h = batch.batch_entry("batch").unwrap();
        let mut want = Vec::new();
        for x in &frames {
            let o = single.invoke(0, x).unwrap();
            let outs: Vec<(u32, Vec<u8>)> = single
                .emitted()
                .into_iter()
                .map(|(o, b)| (o, b.to_vec()))
                .collect();
            want.push((o.status, outs));
        }
        let mut got: PerBuffer = Vec::new();
        for chunk in frames.chunks(32) {
            let refs: Vec<&[u8]> = chunk.iter().map(std::vec::Vec::as_slice).collect();
            let o = batch.invoke_batch(h, &refs).unwrap();
            assert_eq!((o.status, o.trap), (0, None), "{name}");
            let base = got.len();
            got.extend(batch.batch_items().iter().map(|i| (i.status, Vec::new())));
            batch.for_each_batch_output(|i, out, b| got[base + i].1.push((out, b.to_vec())));
        }
        assert_eq!(got, want, "{name}: batch and per-buffer results differ");
        assert_eq!(single.state_value(1), batch.state_value(1), "{name}");
    }
}
