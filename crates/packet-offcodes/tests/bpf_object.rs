//! The layout offers the kernel PE to an offcode built from a BPF object
//! (`module = ...` on a kernel target) only where `loader:kernel` is
//! registered: without it planning says there is no loader; with it the
//! offcode lands on `kernel`. Needs the kernel PE, so root (CI is).
#![allow(clippy::unwrap_used)] // test code

use sidecore_offcode::Registry;
use sidecore_pe::DiscoverOptions;
use sidecore_testbed::testing::root;
use sidecore_types::PeKind;

const MANIFEST: &str = r#"[app]
name = "obj"

[[offcode]]
name = "counter"
id = "6b1d3c2a-4e5f-4a7b-8c9d-0e1f2a3b4c09"
impl = "counter"
params = { counters = ["counts"] }

  [[offcode.target]]
  kind = "kernel"
  module = "counter.bpf.o"
"#;

#[test]
fn the_kernel_pe_is_offered_only_with_the_loader() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Planning only checks that the artifact exists; it is not loaded.
    std::fs::write(dir.path().join("counter.bpf.o"), b"\x7fELF").unwrap();
    let path = dir.path().join("obj.toml");
    std::fs::write(&path, MANIFEST).unwrap();
    let manifest = sidecore_manifest::load(&path).unwrap();
    let inventory = sidecore_pe::discover(&DiscoverOptions {
        probe_wasm: false,
        ..Default::default()
    });
    assert!(
        inventory.pes.iter().any(|p| p.kind == PeKind::Kernel),
        "this test needs the kernel PE: {:?}",
        inventory.absent
    );
    let plan = |reg: &Registry| {
        sidecore_runtime::plan_manifest(&manifest, &inventory, reg, &Default::default())
    };
    let e = plan(&Registry::new()).unwrap_err().to_string();
    assert!(
        e.contains("counter") && e.contains("this sidecore has no loader for kernel modules"),
        "{e}"
    );
    let mut reg = Registry::new();
    sidecore_packet_offcodes::register(&mut reg);
    let p = plan(&reg).unwrap();
    assert_eq!(p.offcodes[0].pe, "kernel");
    assert_eq!(p.offcodes[0].implementation.name, "loader:kernel");
}
