//! The Rust SDK end to end: builds `examples/ext` for wasm32-unknown-unknown with the
//! documented one command (scripts/setup.sh installs the target), then admits and runs
//! the modules the real compiler produced.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sidecore_ext::verify::{BoundSource, Calibration};
use sidecore_ext::{ExecMode, ExtConfig, ExtEngine, ViolationPolicy, WasmExtension};

fn build_examples() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
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
}
