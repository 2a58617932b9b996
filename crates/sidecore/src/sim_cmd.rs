//! `sidecore sim sikker` and `sidecore sim rate`: options into the simulators'
//! option structs, and their results printed as tables beside the dissertation's
//! figures (or as JSON).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use sidecore_sikker_rate::Algorithm;
use sidecore_sikker_sim::ratesim::{Arrivals, RateSimConfig, RateSimResult};
use sidecore_sikker_sim::report::{
    self, PAPER_8_2, RateReport, RateRunOptions, SeedRuns, SweepSummary,
};
use sidecore_sikker_sim::sikkersim::{self, Pattern, PatternKnobs, SikkerSimOptions, SikkerSimRow};

/// Run the dissertation's simulators on sidecore's Sikker code.
#[derive(Args, Debug, Clone)]
pub struct SimCommand {
    #[command(subcommand)]
    pub which: SimWhich,
}

/// The two simulators.
#[derive(Subcommand, Debug, Clone)]
pub enum SimWhich {
    /// SikkerSim (ch. 7): NMU table size and permission-check latency per access pattern.
    Sikker(SikkerArgs),
    /// RateSim (ch. 8): Tables 8.1 and 8.2 and the 1 ms variant, with plots.
    Rate(RateArgs),
}

/// Options of `sim rate`.
#[derive(Args, Debug, Clone)]
pub struct RateArgs {
    /// Run the parameter sweep first (§8.1) and use each algorithm's best
    /// configuration (lowest penalty) for the tables; without it, the configurations
    /// sidecore's own sweep found (BENCHMARKS.md) are used.
    #[arg(long)]
    pub sweep: bool,
    /// Seeds the sweep scores each configuration under (its penalty is the mean over
    /// them), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub sweep_seeds: Vec<u64>,
    /// Algorithms to run (ne, re, se-fa, se-te, se-re, se-tre), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ne,re,se-fa,se-te,se-re,se-tre",
        value_parser = parse_algorithm
    )]
    pub algorithms: Vec<Algorithm>,
    /// Bucket sizes of Table 8.2 (SE-TRE), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1500,2000,2500")]
    pub buckets: Vec<f64>,
    /// Skip the 1 ms change-interval variant (3 M cycles per run).
    #[arg(long)]
    pub no_1ms: bool,
    /// Cycles between traffic changes (40,000 = 25 kHz, Table 8.1).
    #[arg(long = "interval", default_value_t = 40_000.0)]
    pub interval_cycles: f64,
    /// Packet creation: paced (default) or poisson.
    #[arg(long, default_value = "paced", value_parser = parse_arrivals)]
    pub arrivals: Arrivals,
    /// Seeds the tables are reported under, comma-separated: each cell shows every
    /// seed's figure. The defaults were tuned on 1–3; 4–10 are held out.
    #[arg(long, alias = "seed", value_delimiter = ',', default_value = "1")]
    pub seeds: Vec<u64>,
    /// Size of a control message (exchange request/response, RE credit), phits; the
    /// dissertation does not give it (2 is inferred from RE's published overhead).
    #[arg(long, default_value_t = 2.0)]
    pub ctrl_phits: f64,
    /// Run chapter 5's formulas exactly. By default SE-RE and SE-TRE assume [A]
    /// that a giver never gives rate it is using (Eq. 5.6 capped at `R_t` minus its
    /// send rate averaged over `S_b` cycles): not in the dissertation, adopted
    /// because it reproduces Table 8.1; see BENCHMARKS.md.
    #[arg(long)]
    pub exact_formulas: bool,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Directory for SVG plots (created if missing); no plots without it.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Options of `sim sikker`.
#[derive(Args, Debug, Clone)]
pub struct SikkerArgs {
    /// Host counts of the connectivity model (Table 4.1), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,2048,4096,8192,16384,32768,65536,131072"
    )]
    pub hosts: Vec<u32>,
    /// Permission checks timed per pattern and host count.
    #[arg(long, default_value_t = 2_000_000)]
    pub checks: usize,
    /// Seed of the model and the access patterns.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Gaussian σ as a fraction of the list drawn from (GR, GRR).
    #[arg(long, default_value_t = 0.1)]
    pub sigma: f64,
    /// Checks per timed batch (the VM's time-stamp counter resolves about 10 ns).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Measure under SCHED_FIFO (needs root or CAP_SYS_NICE) so that other work on a
    /// shared machine does not preempt the timed loops.
    #[arg(long)]
    pub realtime: bool,
    /// Pause between slices of 131,072 timed checks, in ms (lets a real-time run
    /// stay below the kernel's RT throttling on long runs).
    #[arg(long, default_value_t = 0)]
    pub pause_ms: u64,
    /// Do not ask for huge pages.
    #[arg(long)]
    pub no_huge_pages: bool,
    /// Size of the `Memory` control's buffer (one random cycle of loads), MiB; it
    /// must be far larger than the caches to measure a miss.
    #[arg(long, default_value_t = 256)]
    pub memory_mib: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!("unknown algorithm `{s}` (one of ne, re, se-fa, se-te, se-re, se-tre)")
    })
}

fn parse_arrivals(s: &str) -> Result<Arrivals, String> {
    match s {
        "paced" => Ok(Arrivals::Paced),
        "poisson" => Ok(Arrivals::Poisson),
        x => Err(format!("`{x}` is neither `paced` nor `poisson`")),
    }
}

/// Runs a `sim` subcommand.
pub fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd.which {
        SimWhich::Sikker(a) => run_sikker(&a),
        SimWhich::Rate(a) => run_rate(&a),
    }
}

fn run_sikker(a: &SikkerArgs) -> anyhow::Result<()> {
    let o = SikkerSimOptions {
        hosts: a.hosts.clone(),
        checks: a.checks,
        seed: a.seed,
        patterns: Pattern::ALL.to_vec(),
        knobs: PatternKnobs {
            sigma_frac: a.sigma,
            ..Default::default()
        },
        huge_pages: !a.no_huge_pages,
        batch: a.batch,
        realtime: a.realtime,
        pause: std::time::Duration::from_millis(a.pause_ms),
        control: true,
        memory_bytes: a.memory_mib.saturating_mul(1 << 20),
    };
    let rows = sikkersim::run(&o)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_tables(&rows);
        print_latency(&rows);
    }
    Ok(())
}

/// SikkerSim's table sizes: the model's formula beside the tables really built.
fn print_tables(rows: &[SikkerSimRow]) {
    println!("SikkerSim — one host's NMU tables (Table 4.1 model, Eq. 4.5)");
    println!(
        "{:>8} {:>6} {:>5} {:>4} {:>4} {:>12} {:>12} {:>12} {:>12} {:>9}",
        "hosts",
        "s_t",
        "s_a",
        "p_a",
        "d_a",
        "Eq4.5 entr",
        "Eq4.5 MB",
        "held entr",
        "real MB",
        "huge MB"
    );
    for r in rows {
        println!(
            "{:>8} {:>6} {:>5} {:>4} {:>4} {:>12} {:>12.2} {:>12} {:>12.2} {:>9.1}",
            r.params.hosts,
            r.s_t,
            r.s_a,
            r.p_a,
            r.d_a,
            r.formula_entries,
            r.formula_bytes as f64 / 1e6,
            r.tables.process_entries + r.tables.domain_entries,
            r.tables.total_bytes as f64 / 1e6,
            r.huge_page_bytes as f64 / 1e6
        );
    }
    println!();
}

/// SikkerSim's permission-check latency per host count and pattern.
fn print_latency(rows: &[SikkerSimRow]) {
    println!("Permission-check latency, software, this machine (ns; timer baseline subtracted)");
    println!(
        "{:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "hosts", "pat", "mean", "chain", "p99", "p99.9", "p99.99", "timer", "noise p9999"
    );
    for r in rows {
        for l in &r.latency {
            println!(
                "{:>8} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>11.1}",
                r.params.hosts,
                format!("{:?}", l.pattern),
                l.mean_ns,
                l.chain_mean_ns,
                l.p99_ns,
                l.p999_ns,
                l.p9999_ns,
                l.baseline_ns,
                l.noise_p9999_ns
            );
        }
    }
    println!();
    if let Some(r) = rows.last() {
        println!(
            "realtime scheduling: {}; load average after the run: {:.2}",
            r.realtime, r.load_average
        );
    }
    if let Some(r) = rows.last() {
        print_check_targets(r);
    }
    println!(
        "Dissertation (simulated hardware NMU, 131,072 hosts): GRR mean 41 ns; UR p99.99 91 ns; 20.8 MB per host."
    );
}

/// The check-latency targets as ratios to the same run's controls (Sikker
/// part 2's decision: a shared VM cannot reach the absolute figures, one memory
/// access alone costs more than the hardware NMU's whole check).
fn print_check_targets(r: &SikkerSimRow) {
    let of = |p: Pattern| r.latency.iter().find(|l| l.pattern == p);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "n/a (pattern not run)".to_string(),
    };
    println!(
        "targets at {} hosts, as ratios to this run's controls: UR p99.99 ÷ Memory p99.99 = {} (target ≤ 1.0); GRR mean ÷ Cached mean = {} (target ≤ 1.5)",
        r.params.hosts,
        ratio(
            of(Pattern::UR).map(|l| l.p9999_ns),
            of(Pattern::Memory).map(|l| l.p9999_ns)
        ),
        ratio(
            of(Pattern::GRR).map(|l| l.mean_ns),
            of(Pattern::Cached).map(|l| l.mean_ns)
        ),
    );
}

fn run_rate(a: &RateArgs) -> anyhow::Result<()> {
    let o = RateRunOptions {
        base: RateSimConfig {
            interval: a.interval_cycles,
            arrivals: a.arrivals,
            ctrl_size: a.ctrl_phits,
            ..Default::default()
        },
        seeds: a.seeds.clone(),
        algorithms: a.algorithms.clone(),
        buckets: a.buckets.clone(),
        sweep_seeds: a.sweep.then(|| a.sweep_seeds.clone()),
        one_ms: !a.no_1ms,
        exact_formulas: a.exact_formulas,
        threads: a.threads,
    };
    o.validate()?;
    for alg in &o.algorithms {
        if o.sweep_seeds.is_some() {
            eprintln!(
                "sweep: {alg}: {} configurations × {} seeds",
                sidecore_sikker_sim::ratesim::sweep_grid(*alg, report::TABLE_8_1_BUCKET).len(),
                a.sweep_seeds.len()
            );
        }
    }
    let spin = crate::progress::Progress::spinner(if o.sweep_seeds.is_some() {
        "RateSim: sweeping, then Tables 8.1 and 8.2"
    } else {
        "RateSim: Tables 8.1 and 8.2"
    });
    let mut rep = report::rate_report(&o)?;
    drop(spin);
    if let Some(dir) = &a.plots {
        report::write_plots(dir, &rep)?;
        eprintln!("plots written to {}", dir.display());
    }
    if a.json {
        rep.drop_series();
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(());
    }
    for s in &rep.sweep {
        print_sweep(s, &a.sweep_seeds);
    }
    print_table_8_1(&rep);
    print_table_8_2(&rep);
    print_one_ms(&rep.one_ms);
    Ok(())
}

/// ∞ for an infinite latency, else whole nanoseconds.
fn ns(v: f64) -> String {
    if v.is_infinite() {
        "∞".into()
    } else {
        format!("{v:.0}")
    }
}

/// Every seed's `f`, joined by `/`.
fn per_seed(r: &SeedRuns, f: impl Fn(&RateSimResult) -> String) -> String {
    r.runs.iter().map(f).collect::<Vec<_>>().join("/")
}

fn print_sweep(s: &SweepSummary, seeds: &[u64]) {
    println!(
        "Sweep {}: {} configurations; best five by penalty = L + 75·max(B1, B2, 2·B3), \
         averaged over seeds {seeds:?} (L ns / mean overhead Gbps per seed)",
        s.algorithm.name(),
        s.configurations,
    );
    for r in &s.best {
        let p = &r.algo.se;
        let per_seed = r
            .runs
            .iter()
            .map(|x| format!("{}/{:.0}", ns(x.latency_p9999_ns), x.overhead_mean_gbps))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "  penalty {:>9.1}  {per_seed}  Th_low {:.0} N_peers {} F_t {} Th_t {:.0} F_r {} Th_r {:.0} F_mr {} N_o {:?}",
            r.penalty, p.th_low, p.n_peers, p.f_t, p.th_t, p.f_r, p.th_r, p.f_mr, r.algo.credits
        );
    }
}

fn print_table_8_1(rep: &RateReport) {
    println!(
        "Table 8.1 — rate control, S_b = {}, {:.0} kHz changes, seeds {:?} (sidecore | dissertation)",
        report::TABLE_8_1_BUCKET,
        1e6 / rep.config.interval,
        rep.seeds
    );
    if rep.exact_formulas {
        println!("chapter 5's formulas exactly (--exact-formulas)");
    } else {
        println!(
            "[A] SE-RE and SE-TRE: a giver keeps the rate it uses (an assumption, not in the \
             dissertation; --exact-formulas runs chapter 5 literally)"
        );
    }
    println!(
        "overhead: mean of the three periods (Table 8.1's column, read as the run's aggregate); \
         worst period beside it; one figure per seed"
    );
    let rows: Vec<Vec<String>> = rep
        .table_8_1
        .iter()
        .map(|r| {
            let (pl, pb) = report::paper_8_1(r.algo.alg);
            vec![
                r.algo.alg.name().to_string(),
                (if r.algo.alg.correct() { "yes" } else { "no" }).to_string(),
                per_seed(r, |x| ns(x.latency_p9999_ns)),
                pl.map_or_else(|| "∞".into(), ns),
                per_seed(r, |x| format!("{:.0}", x.overhead_mean_gbps)),
                format!("{pb:.0}"),
                per_seed(r, |x| format!("{:.0}", x.overhead_worst_gbps)),
                format!("{:.0}", r.mean(|x| x.penalty)),
            ]
        })
        .collect();
    let header = [
        "alg",
        "correct",
        "99.99th ns",
        "paper",
        "overhead Gbps",
        "paper",
        "worst period",
        "mean penalty",
    ];
    print_aligned(&header, &rows, 2);
}

/// Prints `rows` under `header` in columns as wide as their widest cell, the first
/// `left` left-aligned and the rest right-aligned. (Hand-written: a table crate for
/// two tables of plain text is more than this needs.)
fn print_aligned(header: &[&str], rows: &[Vec<String>], left: usize) {
    let width = |c: usize| {
        rows.iter()
            .map(|r| r[c].chars().count())
            .chain([header[c].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .enumerate()
            .map(|(c, x)| {
                let pad = " ".repeat(widths[c].saturating_sub(x.chars().count()));
                if c < left {
                    format!("{x}{pad}")
                } else {
                    format!("{pad}{x}")
                }
            })
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
}

fn print_table_8_2(rep: &RateReport) {
    if rep.table_8_2.is_empty() {
        return;
    }
    println!();
    println!(
        "Table 8.2 — SE-TRE by bucket size, seeds {:?} (sidecore | dissertation)",
        rep.seeds
    );
    println!("burst MB is Eq. 8.1 (S_b × N_tb × 100 bits / 8): derived, not measured");
    let rows: Vec<Vec<String>> = rep
        .table_8_2
        .iter()
        .map(|r| {
            let b = r.algo.se.bucket_size;
            let paper = PAPER_8_2.iter().find(|p| p.0 == b);
            let burst = r.runs.first().map_or(f64::NAN, |x| x.max_burst_bytes / 1e6);
            vec![
                format!("{b:.0}"),
                per_seed(r, |x| ns(x.latency_p9999_ns)),
                paper.map(|p| format!("{:.0}", p.1)).unwrap_or_default(),
                per_seed(r, |x| format!("{:.0}", x.overhead_mean_gbps)),
                paper.map(|p| format!("{:.0}", p.2)).unwrap_or_default(),
                format!("{burst:.2}"),
                paper.map(|p| format!("{:.1}", p.3)).unwrap_or_default(),
            ]
        })
        .collect();
    let header = [
        "S_b",
        "99.99th ns",
        "paper",
        "overhead Gbps",
        "paper",
        "burst MB (Eq8.1)",
        "paper",
    ];
    print_aligned(&header, &rows, 0);
}

fn print_one_ms(runs: &[RateSimResult]) {
    if runs.is_empty() {
        return;
    }
    println!();
    println!("1 ms change interval (1 kHz), first seed (sidecore | dissertation)");
    for r in runs {
        println!(
            "{:<7} overhead {:>8.1} Gbps | {:>4}   99.99th {} ns",
            r.algo.alg.name(),
            r.overhead_mean_gbps,
            report::paper_one_ms(r.algo.alg).unwrap_or("–"),
            ns(r.latency_p9999_ns)
        );
    }
}
