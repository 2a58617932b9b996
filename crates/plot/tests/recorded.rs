//! The charts drawn from recorded figures stay in step with BENCHMARKS.md:
//! every data file under `docs/plots/data/` loads, every chart it names is
//! in `docs/plots/` and embedded in BENCHMARKS.md.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..")
}

#[test]
fn every_recorded_chart_is_drawn_and_embedded() {
    let data = repo().join("docs/plots/data");
    let bench = std::fs::read_to_string(repo().join("BENCHMARKS.md")).unwrap();
    let files = sidecore_plot::recorded::data_files(&data).unwrap();
    assert!(!files.is_empty(), "no data files in {}", data.display());
    let mut charts = 0;
    for f in files {
        let d = sidecore_plot::recorded::load(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(!d.chart.is_empty(), "{} has no chart", f.display());
        for c in &d.chart {
            charts += 1;
            let svg = repo().join("docs/plots").join(&c.file);
            assert!(
                svg.exists(),
                "{} is not drawn: run `cargo run -p sidecore-plot --example recorded`",
                c.file
            );
            assert!(
                bench.contains(&format!("(docs/plots/{})", c.file)),
                "BENCHMARKS.md does not embed docs/plots/{}",
                c.file
            );
        }
    }
    assert!(charts >= 5);
}
