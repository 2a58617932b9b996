//! Compiles the eBPF programs in `bpf/` (C) to BPF objects with clang, into
//! `OUT_DIR`, where `src/objects.rs` embeds them. clang and the libbpf headers
//! come from Debian's `clang` and `libbpf-dev` (`scripts/setup.sh`).

use std::path::PathBuf;
use std::process::Command;

fn multiarch_include() -> Option<String> {
    // With `-target bpf` clang does not look in the multiarch directory where
    // Debian keeps <asm/types.h>.
    let out = Command::new("gcc").arg("-print-multiarch").output().ok()?;
    let triple = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!triple.is_empty()).then(|| format!("-I/usr/include/{triple}"))
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    // The directory too, so that a new program is compiled.
    println!("cargo:rerun-if-changed=bpf");
    let mut sources: Vec<PathBuf> = std::fs::read_dir("bpf")
        .expect("crates/kernel/bpf exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".c"))
            .expect("a .bpf.c file name");
        let obj = out.join(format!("{name}.o"));
        let mut cmd = Command::new(&clang);
        cmd.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-c"])
            .arg(&src)
            .arg("-o")
            .arg(&obj);
        if let Some(inc) = multiarch_include() {
            cmd.arg(inc);
        }
        let status = match cmd.status() {
            Ok(s) => s,
            Err(e) => panic!(
                "cannot run `{clang}` to compile {}: {e}; install clang and libbpf-dev (scripts/setup.sh)",
                src.display()
            ),
        };
        assert!(
            status.success(),
            "clang failed to compile {} (see its messages above)",
            src.display()
        );
    }
}
