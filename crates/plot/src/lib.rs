//! SVG charts for the benchmarks, drawn with `plotters`: a grouped bar chart
//! (one group per table row, one bar per compared series) is what every
//! side-by-side table of BENCHMARKS.md needs. Benchmarks write into
//! [`out_dir`], `docs/plots/` of the workspace unless `$SIDECORE_PLOTS` says
//! otherwise, and BENCHMARKS.md embeds the files from there. [`progress`]
//! is the bar that long runs (the binary's and the benchmarks') show on a
//! terminal.

pub mod progress;

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Why a chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("{path}: {what}")]
    Data { path: PathBuf, what: String },
}

/// One compared series: a value per group (NaN: no bar).
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

impl Series {
    pub fn new(name: impl Into<String>, values: Vec<f64>) -> Series {
        Series {
            name: name.into(),
            values,
        }
    }
}

/// Where benchmarks put their charts: `$SIDECORE_PLOTS`, or `docs/plots` of
/// the workspace (found from the bench's `CARGO_MANIFEST_DIR` at run time).
pub fn out_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SIDECORE_PLOTS") {
        return PathBuf::from(d);
    }
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|m| PathBuf::from(m).join("../../docs/plots"))
        .unwrap_or_else(|| PathBuf::from("docs/plots"))
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// A grouped bar chart: `groups` along x, one bar per series in each.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Series],
) -> Result<(), PlotError> {
    let data = |what: String| PlotError::Data {
        path: path.to_path_buf(),
        what,
    };
    if groups.is_empty() || series.is_empty() {
        return Err(data("nothing to plot".into()));
    }
    if let Some(s) = series.iter().find(|s| s.values.len() != groups.len()) {
        return Err(data(format!(
            "series `{}` has {} values for {} groups",
            s.name,
            s.values.len(),
            groups.len()
        )));
    }
    draw(path, title, y_desc, groups, series).map_err(|e| PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn draw(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let y_max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.35;
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = groups.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(y_desc)
        .draw()?;
    // Each group's name under the middle of its bars.
    for (i, g) in groups.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let style = TextStyle::from(("sans-serif", 14)).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(g.clone(), (x, y + 8), style))?;
    }
    let width = 0.8 / series.len() as f64;
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let bars = s
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| {
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], colour.filled())
            });
        chart
            .draw_series(bars)?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_group_and_series() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.svg");
        let groups = vec!["64 B".to_string(), "1500 B".to_string()];
        let s = [
            Series::new("socket loop", vec![1.0, 2.0]),
            Series::new("dedicated core", vec![3.0, f64::NAN]),
        ];
        grouped_bars(&p, "t", "Mpps", &groups, &s).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        for w in ["64 B", "1500 B", "socket loop", "dedicated core", "Mpps"] {
            assert!(svg.contains(w), "{w} missing");
        }
    }

    #[test]
    fn mismatched_or_empty_data_is_refused_with_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("y.svg");
        let e = grouped_bars(
            &p,
            "t",
            "y",
            &["a".into()],
            &[Series::new("s", vec![1.0, 2.0])],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("y.svg") && e.contains("2 values for 1 groups"),
            "{e}"
        );
        assert!(grouped_bars(&p, "t", "y", &[], &[]).is_err());
        assert!(!p.exists());
    }
}
