//! Charts drawn from figures already recorded in BENCHMARKS.md, for the
//! comparing tables whose runs are too costly (or impossible on a loaded
//! machine) to repeat just to draw them. Each data file under
//! `docs/plots/data/` is TOML:
//!
//! ```toml
//! source = "BENCHMARKS.md, TiVoPC after the host executor's idle fix (2026-11-25)"
//! [[chart]]
//! file = "tivo-stddev.svg"
//! title = "TiVoPC: inter-arrival standard deviation"
//! y = "stddev, ms"
//! log = false
//! groups = ["socket loop", "dedicated core"]
//! [[chart.series]]
//! name = "under load"
//! values = [0.6164, 0.0348]      # nan: no bar
//! ```
//!
//! `cargo run -p sidecore-plot --example recorded` writes every chart of
//! every file into [`crate::out_dir`], each with a note saying where its
//! figures come from.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{PlotError, Series, Style, grouped_bars_with};

/// One data file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    /// Where the figures come from (the section of BENCHMARKS.md, the date).
    pub source: String,
    #[serde(default)]
    pub chart: Vec<Chart>,
}

/// One chart of a data file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chart {
    /// The SVG's file name, in the plots folder.
    pub file: String,
    pub title: String,
    /// The y axis' description, with its unit.
    pub y: String,
    #[serde(default)]
    pub log: bool,
    pub groups: Vec<String>,
    pub series: Vec<RecordedSeries>,
}

/// One series of a chart.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedSeries {
    pub name: String,
    pub values: Vec<f64>,
}

/// Reads a data file; errors name the file (and the TOML error's place).
pub fn load(path: &Path) -> Result<DataFile, PlotError> {
    let data = |what: String| PlotError::Data {
        path: path.to_path_buf(),
        what,
    };
    let text = std::fs::read_to_string(path).map_err(|e| data(e.to_string()))?;
    let f: DataFile = toml::from_str(&text).map_err(|e| data(e.to_string()))?;
    for (i, c) in f.chart.iter().enumerate() {
        let bad = |what: &str| data(format!("chart[{i}] (`{}`): {what}", c.file));
        if !c.file.ends_with(".svg") || c.file.contains('/') {
            return Err(bad("`file` must be a plain name ending in .svg"));
        }
        if let Some(s) = c.series.iter().find(|s| s.values.len() != c.groups.len()) {
            return Err(bad(&format!(
                "series `{}` has {} values for {} groups",
                s.name,
                s.values.len(),
                c.groups.len()
            )));
        }
    }
    Ok(f)
}

/// Draws every chart of `file` into `dir`; returns the paths written.
pub fn draw(file: &DataFile, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let note = format!(
        "Drawn from figures recorded in {} (not re-measured).",
        file.source
    );
    let mut out = Vec::new();
    for c in &file.chart {
        let path = dir.join(&c.file);
        let series: Vec<Series> = c
            .series
            .iter()
            .map(|s| Series::new(s.name.clone(), s.values.clone()))
            .collect();
        let style = Style {
            title: &c.title,
            y_desc: &c.y,
            log: c.log,
            note: Some(&note),
        };
        grouped_bars_with(&path, &style, &c.groups, &series)?;
        out.push(path);
    }
    Ok(out)
}

/// The data files in `dir` (`*.toml`), sorted.
pub fn data_files(dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let rd = std::fs::read_dir(dir).map_err(|e| PlotError::Data {
        path: dir.to_path_buf(),
        what: e.to_string(),
    })?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("d.toml");
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        p
    }

    #[test]
    fn a_file_draws_its_charts_with_the_source_noted() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = write(
            d.path(),
            "source = \"BENCHMARKS.md, a section\"\n[[chart]]\nfile = \"a.svg\"\ntitle = \"T\"\ny = \"ms\"\nlog = true\ngroups = [\"x\", \"y\"]\n[[chart.series]]\nname = \"s\"\nvalues = [0.002, nan]\n",
        );
        let f = load(&p).unwrap_or_else(|e| panic!("{e}"));
        let out = draw(&f, d.path()).unwrap_or_else(|e| panic!("{e}"));
        let svg = std::fs::read_to_string(&out[0]).unwrap_or_default();
        assert!(
            svg.contains("not re-measured") && svg.contains("a section"),
            "{svg}"
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_file_and_chart() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = write(
            d.path(),
            "source = \"s\"\n[[chart]]\nfile = \"a.svg\"\ntitle = \"T\"\ny = \"ms\"\ngroups = [\"x\"]\n[[chart.series]]\nname = \"s\"\nvalues = [1, 2]\n",
        );
        let e = load(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("d.toml")
                && e.contains("chart[0] (`a.svg`)")
                && e.contains("2 values for 1 groups"),
            "{e}"
        );
        let p = write(
            d.path(),
            "source = \"s\"\n[[chart]]\nfile = \"../x.svg\"\ntitle = \"T\"\ny = \"\"\ngroups = []\nseries = []\n",
        );
        assert!(
            load(&p)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("plain name")
        );
        let p = write(d.path(), "sauce = 1\n");
        assert!(
            load(&p)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("d.toml")
        );
    }
}
