//! Bundles the dashboard (dashboard/, TypeScript) with esbuild into OUT_DIR,
//! so the daemon serves it from its own binary with no CDN and no files to
//! install. esbuild comes from npm (`scripts/setup.sh` runs `npm ci` in
//! dashboard/); without it the build stops and says so.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let dash = manifest.join("../../dashboard");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in [
        "src",
        "index.html",
        "style.css",
        "package.json",
        "package-lock.json",
    ] {
        println!("cargo:rerun-if-changed={}", dash.join(f).display());
    }
    let esbuild = dash.join("node_modules/.bin/esbuild");
    if !esbuild.exists() {
        panic!(
            "the dashboard needs esbuild from npm: run `scripts/setup.sh` (or `npm ci` in {}) first",
            dash.display()
        );
    }
    let status = Command::new(&esbuild)
        .current_dir(&dash)
        .args([
            "src/main.ts",
            "--bundle",
            "--format=iife",
            "--target=es2020",
            "--minify",
            "--log-level=warning",
        ])
        .arg(format!("--outfile={}", out.join("app.js").display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", esbuild.display()));
    assert!(
        status.success(),
        "esbuild could not bundle the dashboard ({status})"
    );
    for f in ["index.html", "style.css"] {
        std::fs::copy(dash.join(f), out.join(f))
            .unwrap_or_else(|e| panic!("cannot copy dashboard/{f}: {e}"));
    }
}
