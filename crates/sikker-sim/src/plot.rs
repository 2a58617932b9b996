//! SVG plots of RateSim runs (Figs. 8.2, 8.4, 8.5 of the dissertation), drawn with
//! `plotters`.

use std::path::Path;

use plotters::prelude::*;

use crate::ratesim::{PERCENTILES, RateSimResult};

type R = Result<(), Box<dyn std::error::Error>>;

/// Bandwidth over time, one panel per run (Fig. 8.2): data sent by the source service,
/// received by the destination service, received by sources and relays (overhead),
/// and the limit `R_a`.
pub fn bandwidth(path: &Path, runs: &[(String, &RateSimResult)], r_a: f64) -> R {
    let root = SVGBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let cols = 2;
    let rows = runs.len().div_ceil(cols).max(1);
    let areas = root.split_evenly((rows, cols));
    for (area, (name, r)) in areas.iter().zip(runs) {
        let t_max = r.series.last().map(|b| b.t / 1000.0).unwrap_or(1.0);
        let y_max = r
            .series
            .iter()
            .map(|b| b.sent.max(b.received).max(b.at_sources + b.at_relays))
            .fold(r_a * 1.3, f64::max)
            .min(r_a * 3.0);
        let mut c = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
        c.configure_mesh()
            .x_desc("time (µs)")
            .y_desc("phits/cycle")
            .draw()?;
        let line = |f: fn(&crate::ratesim::Bin) -> f64| {
            r.series
                .iter()
                .map(move |b| (b.t / 1000.0, f(b)))
                .collect::<Vec<_>>()
        };
        c.draw_series(LineSeries::new(line(|b| b.sent), &RED))?
            .label("sent by sources")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
        c.draw_series(LineSeries::new(line(|b| b.received), &BLUE))?
            .label("received by destinations")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
        c.draw_series(LineSeries::new(
            line(|b| b.at_sources + b.at_relays),
            &GREEN,
        ))?
        .label("received by sources/relays")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], GREEN));
        c.draw_series(DashedLineSeries::new(
            vec![(0.0, r_a), (t_max, r_a)],
            6,
            4,
            ShapeStyle::from(&RGBColor(220, 180, 0)).stroke_width(2),
        ))?
        .label("R_a")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RGBColor(220, 180, 0)));
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Overhead over time in Gbps, one panel per run (Fig. 8.5).
pub fn overhead(path: &Path, runs: &[(String, &RateSimResult)]) -> R {
    let root = SVGBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let cols = 2;
    let rows = runs.len().div_ceil(cols).max(1);
    let areas = root.split_evenly((rows, cols));
    for (area, (name, r)) in areas.iter().zip(runs) {
        let t_max = r.series.last().map(|b| b.t / 1000.0).unwrap_or(1.0);
        let pts: Vec<(f64, f64)> = r
            .series
            .iter()
            .map(|b| (b.t / 1000.0, (b.at_sources + b.at_relays) * 100.0))
            .collect();
        let y_max = pts.iter().map(|p| p.1).fold(10.0, f64::max) * 1.1;
        let mut c = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
        c.configure_mesh()
            .x_desc("time (µs)")
            .y_desc("overhead (Gbps)")
            .draw()?;
        c.draw_series(LineSeries::new(pts, &GREEN))?;
    }
    root.present()?;
    Ok(())
}

/// Worst-case (over periods) latency at each percentile, one line per run (Fig. 8.4).
/// Infinite latencies are drawn at the top of the chart.
pub fn percentiles(path: &Path, runs: &[(String, &RateSimResult)], title: &str) -> R {
    let root = SVGBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let finite_max = runs
        .iter()
        .flat_map(|(_, r)| r.worst_percentiles.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(1000.0, f64::max);
    let top = finite_max * 2.0;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            0f64..(PERCENTILES.len() - 1) as f64,
            (300f64..top).log_scale(),
        )?;
    c.configure_mesh()
        .x_labels(PERCENTILES.len())
        .x_label_formatter(&|x| {
            PERCENTILES
                .get(x.round() as usize)
                .map(|p| {
                    if *p >= 100.0 {
                        "max".to_string()
                    } else {
                        format!("{p}")
                    }
                })
                .unwrap_or_default()
        })
        .x_desc("percentile")
        .y_desc("latency (ns, worst period)")
        .draw()?;
    let colors = [
        RGBColor(0, 0, 0),
        RGBColor(200, 0, 0),
        RGBColor(0, 120, 200),
        RGBColor(0, 160, 0),
        RGBColor(160, 0, 160),
        RGBColor(230, 140, 0),
        RGBColor(90, 90, 90),
    ];
    for (k, (name, r)) in runs.iter().enumerate() {
        let col = colors[k % colors.len()];
        let pts: Vec<(f64, f64)> = r
            .worst_percentiles
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, if p.1.is_finite() { p.1.max(300.0) } else { top }))
            .collect();
        c.draw_series(LineSeries::new(
            pts.clone(),
            ShapeStyle::from(&col).stroke_width(2),
        ))?
        .label(name.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], col));
        c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
