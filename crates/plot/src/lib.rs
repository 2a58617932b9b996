//! SVG charts for the benchmarks, drawn with `plotters`: a grouped bar chart
//! (one group per table row, one bar per compared series) is what every
//! side-by-side table of BENCHMARKS.md needs. Benchmarks write into
//! [`out_dir`], `docs/plots/` of the workspace unless `$SIDECORE_PLOTS` says
//! otherwise, and BENCHMARKS.md embeds the files from there. Tables whose
//! runs are too costly to repeat are drawn from their recorded figures
//! ([`recorded`], data in `docs/plots/data/`). [`progress`]
//! is the bar that long runs (the binary's and the benchmarks') show on a
//! terminal.

pub mod progress;
pub mod recorded;

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

/// How a chart is drawn besides its data.
#[derive(Debug, Clone, Default)]
pub struct Style<'a> {
    pub title: &'a str,
    /// The y axis' description, with its unit.
    pub y_desc: &'a str,
    /// A logarithmic y axis (for series that differ by orders of magnitude);
    /// values must then be positive (others get no bar).
    pub log: bool,
    /// A line under the chart (where its figures come from).
    pub note: Option<&'a str>,
}

/// A grouped bar chart: `groups` along x, one bar per series in each.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Series],
) -> Result<(), PlotError> {
    let style = Style {
        title,
        y_desc,
        ..Style::default()
    };
    grouped_bars_with(path, &style, groups, series)
}

/// [`grouped_bars`] with a [`Style`]: a log axis, a note.
pub fn grouped_bars_with(
    path: &Path,
    style: &Style<'_>,
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
    if style.log && !series.iter().flat_map(|s| &s.values).any(|v| *v > 0.0) {
        return Err(data("a log axis needs a positive value".into()));
    }
    draw(path, style, groups, series).map_err(|e| PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The y axis: its range, and how a value maps onto it (log10 on a log axis).
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn new(log: bool, series: &[Series]) -> Axis {
        let values = || series.iter().flat_map(|s| s.values.iter().copied());
        if log {
            let pos = || values().filter(|v| v.is_finite() && *v > 0.0);
            let lo = pos().fold(f64::INFINITY, f64::min).log10().floor();
            let hi = pos().fold(0.0f64, f64::max).log10().ceil() + 0.6;
            return Axis { log, lo, hi };
        }
        let max = values().filter(|v| v.is_finite()).fold(0.0f64, f64::max) * 1.35;
        Axis {
            log,
            lo: 0.0,
            hi: if max > 0.0 { max } else { 1.0 },
        }
    }

    /// Where a value's bar ends, if it has one.
    fn y(&self, v: f64) -> Option<f64> {
        match (v.is_finite(), self.log) {
            (false, _) => None,
            (true, false) => Some(v),
            (true, true) => (v > 0.0).then(|| v.log10()),
        }
    }

    /// A tick's label: decades only on a log axis.
    fn label(&self, y: f64) -> String {
        if !self.log {
            return short(y);
        }
        if (y - y.round()).abs() > 1e-6 {
            return String::new();
        }
        short(10f64.powf(y.round()))
    }

    fn ticks(&self) -> usize {
        if self.log {
            (self.hi - self.lo).ceil() as usize + 1
        } else {
            10
        }
    }
}

/// A number in few characters: 1.5 k, 20 M, 0.003.
fn short(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, " G")
    } else if a >= 1e6 {
        (v / 1e6, " M")
    } else if a >= 1e3 {
        (v / 1e3, " k")
    } else {
        (v, "")
    };
    let digits = if x.abs() >= 100.0 || x == x.round() {
        0
    } else if x.abs() >= 10.0 {
        1
    } else if x.abs() >= 0.1 {
        2
    } else {
        4
    };
    let mut t = format!("{x:.digits$}");
    if t.contains('.') {
        t = t.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{t}{suffix}")
}

fn draw(
    path: &Path,
    style: &Style<'_>,
    groups: &[String],
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let axis = Axis::new(style.log, series);
    let height = if style.note.is_some() { 510 } else { 480 };
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot_area, foot) = root.split_vertically(480);
    if let Some(note) = style.note {
        let st = TextStyle::from(("sans-serif", 12)).pos(Pos::new(HPos::Left, VPos::Top));
        foot.draw(&Text::new(note.to_string(), (12, 6), st))?;
    }
    let n = groups.len();
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(style.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, axis.lo..axis.hi)?;
    let label = |y: &f64| axis.label(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(axis.ticks())
        .y_label_formatter(&label)
        .y_desc(style.y_desc)
        .draw()?;
    // Each group's name under the middle of its bars.
    for (i, g) in groups.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, axis.lo));
        let st = TextStyle::from(("sans-serif", 14)).pos(Pos::new(HPos::Center, VPos::Top));
        plot_area.draw(&Text::new(g.clone(), (x, y + 8), st))?;
    }
    let width = 0.8 / series.len() as f64;
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let bars = s.values.iter().enumerate().filter_map(|(i, &v)| {
            let top = axis.y(v)?;
            let x0 = i as f64 + 0.1 + k as f64 * width;
            Some(Rectangle::new(
                [(x0, axis.lo), (x0 + width * 0.92, top)],
                colour.filled(),
            ))
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
    fn short_numbers_and_log_axes() {
        assert_eq!(short(0.01), "0.01");
        assert_eq!(short(1500.0), "1.5 k");
        assert_eq!(short(2_000_000.0), "2 M");
        assert_eq!(short(0.8), "0.8");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.svg");
        let style = Style {
            title: "t",
            y_desc: "ms",
            log: true,
            note: Some("from a table"),
        };
        let s = [Series::new("a", vec![0.005, 1290.0])];
        grouped_bars_with(&p, &style, &["x".into(), "y".into()], &s).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        for w in ["0.001", "10 k", "from a table"] {
            assert!(svg.contains(w), "{w} missing");
        }
        let zero = [Series::new("a", vec![0.0, -1.0])];
        let e = grouped_bars_with(&p, &style, &["x".into(), "y".into()], &zero);
        assert!(e.is_err_and(|e| e.to_string().contains("positive")));
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
