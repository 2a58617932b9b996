//! What `sidecore sim rate` computes, as plain functions: an optional sweep, Table 8.1
//! and Table 8.2 under each requested seed, the 1 ms variant, and the plots; with the
//! dissertation's published figures to print beside them. The binary only parses
//! options into [`RateRunOptions`] and prints a [`RateReport`].

use std::path::Path;

use serde::Serialize;
use sidecore_sikker_rate::Algorithm;

use crate::error::{SimError, bad};
use crate::plot;
use crate::ratesim::{self, AlgoConfig, RateSimConfig, RateSimResult, SweepRow};

/// The largest packet, phits (§8.1): a bucket smaller than it never sends.
pub const LARGEST_PACKET_PHITS: f64 = 82.0;
/// The shortest change interval accepted, cycles.
pub const MIN_INTERVAL_CYCLES: f64 = 1000.0;
/// The change interval of the 1 ms variant, cycles (1 GHz).
pub const ONE_MS_CYCLES: f64 = 1_000_000.0;
/// The bucket size of Table 8.1, phits.
pub const TABLE_8_1_BUCKET: f64 = 2000.0;
/// Sweep rows kept per algorithm in a report.
pub const SWEEP_ROWS_KEPT: usize = 5;

/// Options of a RateSim reproduction.
#[derive(Clone, Debug)]
pub struct RateRunOptions {
    /// The experiment; its `seed` is replaced by each of `seeds` in turn.
    pub base: RateSimConfig,
    /// Seeds Tables 8.1 and 8.2 are reported under (the 1 ms variant runs under the
    /// first).
    pub seeds: Vec<u64>,
    /// Algorithms of Table 8.1.
    pub algorithms: Vec<Algorithm>,
    /// Bucket sizes of Table 8.2 (run only when SE-TRE is among the algorithms).
    pub buckets: Vec<f64>,
    /// Sweep the parameters under these seeds first and report each algorithm's best
    /// configuration; `None`: the tuned defaults ([`AlgoConfig::tuned`]).
    pub sweep_seeds: Option<Vec<u64>>,
    /// Also run the 1 ms change interval.
    pub one_ms: bool,
    /// Chapter 5's formulas exactly, without the assumption [A] that a giver
    /// keeps the rate it uses (`SeParams::keep_used`, on by default).
    pub exact_formulas: bool,
    /// Worker threads.
    pub threads: usize,
}

impl RateRunOptions {
    /// Checks every option's range; the error names the option as `sidecore sim
    /// rate` spells it.
    pub fn validate(&self) -> Result<(), SimError> {
        let interval = self.base.interval;
        if !(interval.is_finite() && interval >= MIN_INTERVAL_CYCLES) {
            return Err(bad(
                "--interval",
                format!("must be at least {MIN_INTERVAL_CYCLES} cycles, got {interval}"),
            ));
        }
        if let Some(b) = self
            .buckets
            .iter()
            .find(|b| !(b.is_finite() && **b >= LARGEST_PACKET_PHITS))
        {
            return Err(bad(
                "--buckets",
                format!("{b} cannot hold the largest packet ({LARGEST_PACKET_PHITS} phits)"),
            ));
        }
        if self.sweep_seeds.as_ref().is_some_and(Vec::is_empty) {
            return Err(bad("--sweep-seeds", "give at least one seed"));
        }
        if self.seeds.is_empty() {
            return Err(bad("--seeds", "give at least one seed"));
        }
        if self.algorithms.is_empty() {
            return Err(bad("--algorithms", "give at least one algorithm"));
        }
        let ctrl = self.base.ctrl_size;
        if !(ctrl.is_finite() && ctrl > 0.0) {
            return Err(bad(
                "--ctrl-phits",
                format!("must be a positive number, got {ctrl}"),
            ));
        }
        if self.threads == 0 {
            return Err(bad("--threads", "must be at least 1"));
        }
        Ok(())
    }

    /// `c` under the chosen formulas: keep-used-rate on (the default, [A]) or
    /// chapter 5 exactly. Algorithms that exchange no rate are unaffected.
    fn variant(&self, mut c: AlgoConfig) -> AlgoConfig {
        c.se.keep_used = match (self.exact_formulas, c.alg) {
            (false, Algorithm::SeRe | Algorithm::SeTre) => Some(c.se.bucket_size),
            _ => None,
        };
        c
    }

    /// The default configuration of `alg` under the chosen formulas.
    fn default_config(&self, alg: Algorithm) -> AlgoConfig {
        if self.exact_formulas {
            AlgoConfig::exact(alg, TABLE_8_1_BUCKET)
        } else {
            AlgoConfig::tuned(alg, TABLE_8_1_BUCKET)
        }
    }

    /// The experiment under `seed`.
    fn config(&self, seed: u64) -> RateSimConfig {
        RateSimConfig {
            seed,
            ..self.base.clone()
        }
    }
}

/// A sweep's outcome for one algorithm.
#[derive(Clone, Debug, Serialize)]
pub struct SweepSummary {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Configurations tried.
    pub configurations: usize,
    /// The best few ([`SWEEP_ROWS_KEPT`]), best first.
    pub best: Vec<SweepRow>,
}

/// One configuration run under each seed of the report.
#[derive(Clone, Debug, Serialize)]
pub struct SeedRuns {
    /// The configuration.
    pub algo: AlgoConfig,
    /// Its run under each of [`RateReport::seeds`], in order.
    pub runs: Vec<RateSimResult>,
}

impl SeedRuns {
    /// The mean over seeds of `f` (∞ when any run's is).
    pub fn mean(&self, f: impl Fn(&RateSimResult) -> f64) -> f64 {
        self.runs.iter().map(f).sum::<f64>() / self.runs.len().max(1) as f64
    }
}

/// Everything `sidecore sim rate` reports.
#[derive(Clone, Debug, Serialize)]
pub struct RateReport {
    /// The experiment (its seed is the first of `seeds`).
    pub config: RateSimConfig,
    /// Seeds of Tables 8.1 and 8.2.
    pub seeds: Vec<u64>,
    /// Whether chapter 5 ran exactly (no keep-used-rate assumption).
    pub exact_formulas: bool,
    /// Per algorithm, when a sweep ran.
    pub sweep: Vec<SweepSummary>,
    /// Table 8.1: one row per algorithm.
    pub table_8_1: Vec<SeedRuns>,
    /// Table 8.2: SE-TRE, one row per bucket size (empty without SE-TRE).
    pub table_8_2: Vec<SeedRuns>,
    /// SE-TE and SE-TRE at a 1 ms change interval, first seed only.
    pub one_ms: Vec<RateSimResult>,
}

impl RateReport {
    /// Drops the bandwidth time series (kept only for plots).
    pub fn drop_series(&mut self) {
        let rows = self.table_8_1.iter_mut().chain(self.table_8_2.iter_mut());
        for r in rows
            .flat_map(|r| r.runs.iter_mut())
            .chain(self.one_ms.iter_mut())
        {
            r.series.clear();
        }
    }
}

/// Runs the reproduction `o` describes.
pub fn rate_report(o: &RateRunOptions) -> Result<RateReport, SimError> {
    o.validate()?;
    let mut best: Vec<AlgoConfig> = o
        .algorithms
        .iter()
        .map(|&a| o.variant(o.default_config(a)))
        .collect();
    let mut sweep = Vec::new();
    if let Some(seeds) = &o.sweep_seeds {
        for (k, &alg) in o.algorithms.iter().enumerate() {
            let grid: Vec<AlgoConfig> = ratesim::sweep_grid(alg, TABLE_8_1_BUCKET)
                .into_iter()
                .map(|c| o.variant(c))
                .collect();
            let mut rows = ratesim::sweep(&o.config(seeds[0]), seeds, &grid, o.threads);
            best[k] = rows[0].algo;
            rows.truncate(SWEEP_ROWS_KEPT);
            sweep.push(SweepSummary {
                algorithm: alg,
                configurations: grid.len(),
                best: rows,
            });
        }
    }
    let table_8_2_configs: Vec<AlgoConfig> = o
        .algorithms
        .iter()
        .position(|&a| a == Algorithm::SeTre)
        .map(|k| o.buckets.iter().map(|&b| scaled(best[k], b)).collect())
        .unwrap_or_default();
    let one_ms = if o.one_ms {
        let slow = RateSimConfig {
            interval: ONE_MS_CYCLES,
            ..o.config(o.seeds[0])
        };
        let picks: Vec<AlgoConfig> = best
            .iter()
            .filter(|c| matches!(c.alg, Algorithm::SeTe | Algorithm::SeTre))
            .copied()
            .collect();
        ratesim::run_many(&slow, &picks, o.threads)
    } else {
        Vec::new()
    };
    Ok(RateReport {
        config: o.config(o.seeds[0]),
        seeds: o.seeds.clone(),
        exact_formulas: o.exact_formulas,
        sweep,
        table_8_1: under_each_seed(o, &best),
        table_8_2: under_each_seed(o, &table_8_2_configs),
        one_ms,
    })
}

/// `c` with bucket `b` and its thresholds scaled in proportion (Table 8.2).
fn scaled(mut c: AlgoConfig, b: f64) -> AlgoConfig {
    let f = b / c.se.bucket_size;
    c.se.bucket_size = b;
    c.se.th_low *= f;
    c.se.th_t *= f;
    c.se.th_r *= f;
    if let Some(k) = &mut c.se.keep_used {
        *k = b;
    }
    c
}

/// Each of `configs` under each of the report's seeds.
fn under_each_seed(o: &RateRunOptions, configs: &[AlgoConfig]) -> Vec<SeedRuns> {
    let per_seed: Vec<Vec<RateSimResult>> = o
        .seeds
        .iter()
        .map(|&s| ratesim::run_many(&o.config(s), configs, o.threads))
        .collect();
    configs
        .iter()
        .enumerate()
        .map(|(k, &algo)| SeedRuns {
            algo,
            runs: per_seed.iter().map(|runs| runs[k].clone()).collect(),
        })
        .collect()
}

/// Writes the report's SVG plots (first seed) into `dir`, creating it.
pub fn write_plots(dir: &Path, report: &RateReport) -> Result<(), SimError> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::PlotDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: Box<dyn std::error::Error>| SimError::Plot {
            path,
            message: e.to_string(),
        }
    };
    let named = first_runs(&report.table_8_1, |a| a.alg.name().to_string());
    let p = dir.join("rate-bandwidth.svg");
    plot::bandwidth(&p, &named, report.config.r_a).map_err(err(&p))?;
    let p = dir.join("rate-overhead.svg");
    plot::overhead(&p, &named).map_err(err(&p))?;
    let p = dir.join("rate-latency-percentiles.svg");
    plot::percentiles(&p, &named, "Worst-period latency percentiles (Fig. 8.4)")
        .map_err(err(&p))?;
    if !report.table_8_2.is_empty() {
        let nb = first_runs(&report.table_8_2, |a| {
            format!("SE-TRE S_b={}", a.se.bucket_size)
        });
        let p = dir.join("rate-setre-buckets.svg");
        plot::percentiles(&p, &nb, "SE-TRE by bucket size (Fig. 8.6)").map_err(err(&p))?;
        let p = dir.join("rate-setre-buckets-overhead.svg");
        plot::overhead(&p, &nb).map_err(err(&p))?;
    }
    Ok(())
}

/// Each row's first run, named by `name`.
fn first_runs(
    rows: &[SeedRuns],
    name: impl Fn(&AlgoConfig) -> String,
) -> Vec<(String, &RateSimResult)> {
    rows.iter()
        .filter_map(|r| r.runs.first().map(|x| (name(&r.algo), x)))
        .collect()
}

/// Table 8.1 as published: (99.99th ns, overhead Gbps); `None` = ∞.
pub fn paper_8_1(a: Algorithm) -> (Option<f64>, f64) {
    match a {
        Algorithm::Ne => (Some(500.0), 0.0),
        Algorithm::Re => (Some(2168.0), 41978.0),
        Algorithm::SeFa => (None, 0.0),
        Algorithm::SeTe => (Some(500.0), 262.0),
        Algorithm::SeRe => (Some(4143.0), 463.0),
        Algorithm::SeTre => (Some(500.0), 142.0),
    }
}

/// Table 8.2 as published: (S_b, 99.99th ns, overhead Gbps, burst MB). The burst
/// column is Eq. 8.1 in the paper as here: derived from `S_b`, not measured.
pub const PAPER_8_2: [(f64, f64, f64, f64); 3] = [
    (1500.0, 1010.0, 159.0, 18.7),
    (2000.0, 500.0, 142.0, 25.0),
    (2500.0, 500.0, 140.0, 31.0),
];

/// The 1 ms variant as published: overhead Gbps (SE-TRE is "≈6").
pub fn paper_one_ms(a: Algorithm) -> Option<&'static str> {
    match a {
        Algorithm::SeTe => Some("262"),
        Algorithm::SeTre => Some("≈6"),
        _ => None,
    }
}
