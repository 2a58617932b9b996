//! `sidecore sim sikker` and `sidecore sim rate`: argument parsing and table printing.

use clap::{Args, Subcommand};

use std::path::PathBuf;

use sidecore_sikker_rate::Algorithm;

use crate::plot;
use crate::ratesim::{self, AlgoConfig, Arrivals, RateSimConfig, RateSimResult, SweepRow};
use crate::sikkersim::{self, Pattern, PatternKnobs, SikkerSimOptions};

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
        default_value = "ne,re,se-fa,se-te,se-re,se-tre"
    )]
    pub algorithms: Vec<String>,
    /// Bucket sizes of Table 8.2 (SE-TRE), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1500,2000,2500")]
    pub buckets: Vec<f64>,
    /// Skip the 1 ms change-interval variant (3 M cycles per run).
    #[arg(long)]
    pub no_1ms: bool,
    /// Cycles between traffic changes (40,000 = 25 kHz, Table 8.1).
    #[arg(long, default_value_t = 40_000.0)]
    pub interval: f64,
    /// Packet creation: paced (default) or poisson.
    #[arg(long, default_value = "paced")]
    pub arrivals: String,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Size of a control message (exchange request/response, RE credit), phits; the
    /// dissertation does not give it (2 is inferred from RE's published overhead).
    #[arg(long, default_value_t = 2.0)]
    pub ctrl_phits: f64,
    /// What-if, not in the dissertation: a giver never gives rate it is using (Eq. 5.6
    /// capped at `R_t` minus its send rate averaged over `S_b` cycles). Off for the
    /// reproduction of record; see BENCHMARKS.md.
    #[arg(long)]
    pub keep_used_rate: bool,
    /// Worker threads for the sweep.
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

/// Runs a `sim` subcommand.
pub fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd.which {
        SimWhich::Sikker(a) => run_sikker(a),
        SimWhich::Rate(a) => run_rate(a),
    }
}

#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one flow of the simulator's set-up and report, left whole this session
fn run_sikker(a: SikkerArgs) -> anyhow::Result<()> {
    for &h in &a.hosts {
        if h < 32 || !h.is_power_of_two() {
            anyhow::bail!(
                "--hosts: {h} is not a power of two of at least 32 (Table 4.1 needs whole services of 512 processes at 16 per host)"
            );
        }
    }
    if a.batch == 0 || a.batch > a.checks.max(1) {
        anyhow::bail!("--batch must be between 1 and --checks");
    }
    if a.checks == 0 {
        anyhow::bail!("--checks must be at least 1");
    }
    if !(a.sigma > 0.0 && a.sigma.is_finite()) {
        anyhow::bail!("--sigma must be a positive number, got {}", a.sigma);
    }
    if !(1..=16384).contains(&a.memory_mib) {
        anyhow::bail!(
            "--memory-mib must be between 1 and 16384, got {}",
            a.memory_mib
        );
    }
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
        memory_bytes: a.memory_mib << 20,
    };
    let rows = sikkersim::run(&o);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
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
    for r in &rows {
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
    println!("Permission-check latency, software, this machine (ns; timer baseline subtracted)");
    println!(
        "{:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "hosts", "pat", "mean", "chain", "p99", "p99.9", "p99.99", "timer", "noise p9999"
    );
    for r in &rows {
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
    println!(
        "Dissertation (simulated hardware NMU, 131,072 hosts): GRR mean 41 ns; UR p99.99 91 ns; 20.8 MB per host."
    );
    Ok(())
}

/// Table 8.1 as published: (99.99th ns, overhead Gbps); `None` = ∞.
fn paper_8_1(a: Algorithm) -> (Option<f64>, f64) {
    match a {
        Algorithm::Ne => (Some(500.0), 0.0),
        Algorithm::Re => (Some(2168.0), 41978.0),
        Algorithm::SeFa => (None, 0.0),
        Algorithm::SeTe => (Some(500.0), 262.0),
        Algorithm::SeRe => (Some(4143.0), 463.0),
        Algorithm::SeTre => (Some(500.0), 142.0),
    }
}

/// Table 8.2 as published: (S_b, 99.99th ns, overhead Gbps, burst MB).
const PAPER_8_2: [(f64, f64, f64, f64); 3] = [
    (1500.0, 1010.0, 159.0, 18.7),
    (2000.0, 500.0, 142.0, 25.0),
    (2500.0, 500.0, 140.0, 31.0),
];

fn ns(v: f64) -> String {
    if v.is_infinite() {
        "∞".into()
    } else {
        format!("{v:.0}")
    }
}

#[derive(serde::Serialize)]
struct RateReport {
    config: RateSimConfig,
    sweep: Vec<(String, usize, Vec<SweepRow>)>,
    table_8_1: Vec<RateSimResult>,
    table_8_2: Vec<RateSimResult>,
    one_ms: Vec<RateSimResult>,
}

#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one flow of the simulator's set-up and report, left whole this session
fn run_rate(a: RateArgs) -> anyhow::Result<()> {
    let mut algs = Vec::new();
    for s in &a.algorithms {
        match Algorithm::parse(s) {
            Some(x) => algs.push(x),
            None => anyhow::bail!(
                "--algorithms: unknown algorithm `{s}` (one of ne, re, se-fa, se-te, se-re, se-tre)"
            ),
        }
    }
    let arrivals = match a.arrivals.as_str() {
        "paced" => Arrivals::Paced,
        "poisson" => Arrivals::Poisson,
        x => anyhow::bail!("--arrivals: `{x}` is neither `paced` nor `poisson`"),
    };
    if !(a.interval.is_finite() && a.interval >= 1000.0) {
        anyhow::bail!(
            "--interval must be at least 1000 cycles, got {}",
            a.interval
        );
    }
    for &b in &a.buckets {
        if !(b.is_finite() && b >= 82.0) {
            anyhow::bail!("--buckets: {b} cannot hold the largest packet (82 phits)");
        }
    }
    if a.sweep && a.sweep_seeds.is_empty() {
        anyhow::bail!("--sweep-seeds: give at least one seed");
    }
    if !(a.ctrl_phits.is_finite() && a.ctrl_phits > 0.0) {
        anyhow::bail!(
            "--ctrl-phits must be a positive number, got {}",
            a.ctrl_phits
        );
    }
    let cfg = RateSimConfig {
        interval: a.interval,
        arrivals,
        seed: a.seed,
        ctrl_size: a.ctrl_phits,
        ..Default::default()
    };
    let what_if = |mut c: AlgoConfig| {
        if a.keep_used_rate {
            c.se.keep_used = Some(c.se.bucket_size);
        }
        c
    };
    let mut best: Vec<AlgoConfig> = algs
        .iter()
        .map(|&x| what_if(AlgoConfig::tuned(x, 2000.0)))
        .collect();
    let mut sweep_out = Vec::new();
    if a.sweep {
        for (k, &alg) in algs.iter().enumerate() {
            let grid: Vec<AlgoConfig> = ratesim::sweep_grid(alg, 2000.0)
                .into_iter()
                .map(what_if)
                .collect();
            let n = grid.len();
            eprintln!(
                "sweep: {alg}: {n} configurations × {} seeds",
                a.sweep_seeds.len()
            );
            let mut rs = ratesim::sweep(&cfg, &a.sweep_seeds, &grid, a.threads);
            best[k] = rs[0].algo;
            rs.truncate(5);
            sweep_out.push((alg.name().to_string(), n, rs));
        }
    }
    let t81: Vec<RateSimResult> = best.iter().map(|&c| ratesim::simulate(&cfg, c)).collect();
    let mut t82 = Vec::new();
    if let Some(k) = algs.iter().position(|&x| x == Algorithm::SeTre) {
        for &b in &a.buckets {
            let mut c = best[k];
            let f = b / c.se.bucket_size;
            c.se.bucket_size = b;
            c.se.th_low *= f;
            c.se.th_t *= f;
            c.se.th_r *= f;
            t82.push(ratesim::simulate(&cfg, what_if(c)));
        }
    }
    let mut one_ms = Vec::new();
    if !a.no_1ms {
        let slow = RateSimConfig {
            interval: 1_000_000.0,
            ..cfg.clone()
        };
        let picks: Vec<AlgoConfig> = best
            .iter()
            .filter(|c| matches!(c.alg, Algorithm::SeTe | Algorithm::SeTre))
            .copied()
            .collect();
        one_ms = ratesim::run_many(&slow, &picks, a.threads);
    }
    if let Some(dir) = &a.plots {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("--plots {}: {e}", dir.display()))?;
        let named: Vec<(String, &RateSimResult)> = t81
            .iter()
            .map(|r| (r.algo.alg.name().to_string(), r))
            .collect();
        let err = |e: Box<dyn std::error::Error>| anyhow::anyhow!("plotting: {e}");
        plot::bandwidth(&dir.join("rate-bandwidth.svg"), &named, cfg.r_a).map_err(err)?;
        plot::overhead(&dir.join("rate-overhead.svg"), &named).map_err(err)?;
        plot::percentiles(
            &dir.join("rate-latency-percentiles.svg"),
            &named,
            "Worst-period latency percentiles (Fig. 8.4)",
        )
        .map_err(err)?;
        if !t82.is_empty() {
            let nb: Vec<(String, &RateSimResult)> = t82
                .iter()
                .map(|r| (format!("SE-TRE S_b={}", r.algo.se.bucket_size), r))
                .collect();
            plot::percentiles(
                &dir.join("rate-setre-buckets.svg"),
                &nb,
                "SE-TRE by bucket size (Fig. 8.6)",
            )
            .map_err(err)?;
            plot::overhead(&dir.join("rate-setre-buckets-overhead.svg"), &nb).map_err(err)?;
        }
        eprintln!("plots written to {}", dir.display());
    }
    if a.json {
        let mut rep = RateReport {
            config: cfg,
            sweep: sweep_out,
            table_8_1: t81,
            table_8_2: t82,
            one_ms,
        };
        for r in rep
            .table_8_1
            .iter_mut()
            .chain(rep.table_8_2.iter_mut())
            .chain(rep.one_ms.iter_mut())
        {
            r.series.clear();
        }
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(());
    }
    for (name, n, top) in &sweep_out {
        println!(
            "Sweep {name}: {n} configurations; best five by penalty = L + 75·max(B1, B2, 2·B3), \
             averaged over seeds {:?} (L ns / mean overhead Gbps per seed)",
            a.sweep_seeds
        );
        for r in top {
            let p = &r.algo.se;
            let per_seed = r
                .runs
                .iter()
                .map(|x| format!("{}/{:.0}", ns(x.latency_p9999_ns), x.overhead_mean_gbps))
                .collect::<Vec<_>>()
                .join(" ");
            println!(
                "  penalty {:>9.1}  {per_seed}  Th_low {:.0} N_peers {} F_t {} Th_t {:.0} F_r {} Th_r {:.0} F_mr {} N_o {:?}",
                r.penalty,
                p.th_low,
                p.n_peers,
                p.f_t,
                p.th_t,
                p.f_r,
                p.th_r,
                p.f_mr,
                r.algo.credits
            );
        }
    }
    println!(
        "Table 8.1 — rate control, S_b = 2000, {:.0} kHz changes (sidecore | dissertation)",
        1e6 / cfg.interval
    );
    if a.keep_used_rate {
        println!(
            "WHAT-IF (--keep-used-rate, not in the dissertation): givers keep the rate they use"
        );
    }
    println!(
        "overhead: mean of the three periods (Table 8.1's column, read as the run's aggregate); \
         worst period beside it"
    );
    println!(
        "{:<7} {:<7} {:>12} {:>8} {:>14} {:>8} {:>11} {:>9}  {:<24} overhead per period (Gbps)",
        "alg",
        "correct",
        "99.99th ns",
        "paper",
        "overhead Gbps",
        "paper",
        "worst period",
        "penalty",
        "99.99th per period",
    );
    for r in &t81 {
        let (pl, pb) = paper_8_1(r.algo.alg);
        println!(
            "{:<7} {:<7} {:>12} {:>8} {:>14.0} {:>8.0} {:>11.0} {:>9.0}  {:<24} {}",
            r.algo.alg.name(),
            if r.algo.alg.correct() { "yes" } else { "no" },
            ns(r.latency_p9999_ns),
            pl.map(ns).unwrap_or_else(|| "∞".into()),
            r.overhead_mean_gbps,
            pb,
            r.overhead_worst_gbps,
            r.penalty,
            r.periods
                .iter()
                .map(|p| ns(p.p9999_ns))
                .collect::<Vec<_>>()
                .join("/"),
            r.periods
                .iter()
                .map(|p| format!("{:.0}", p.overhead * 100.0))
                .collect::<Vec<_>>()
                .join("/"),
        );
    }
    if !t82.is_empty() {
        println!();
        println!("Table 8.2 — SE-TRE by bucket size (sidecore | dissertation)");
        println!(
            "{:>6} {:>12} {:>8} {:>14} {:>8} {:>12} {:>8}",
            "S_b", "99.99th ns", "paper", "overhead Gbps", "paper", "burst MB", "paper"
        );
        for r in &t82 {
            let paper = PAPER_8_2.iter().find(|p| p.0 == r.algo.se.bucket_size);
            println!(
                "{:>6.0} {:>12} {:>8} {:>14.0} {:>8} {:>12.2} {:>8}",
                r.algo.se.bucket_size,
                ns(r.latency_p9999_ns),
                paper.map(|p| format!("{:.0}", p.1)).unwrap_or_default(),
                r.overhead_mean_gbps,
                paper.map(|p| format!("{:.0}", p.2)).unwrap_or_default(),
                r.max_burst_bytes / 1e6,
                paper.map(|p| format!("{:.1}", p.3)).unwrap_or_default(),
            );
        }
    }
    if !one_ms.is_empty() {
        println!();
        println!("1 ms change interval (1 kHz) (sidecore | dissertation)");
        for r in &one_ms {
            let paper = if r.algo.alg == Algorithm::SeTe {
                "262"
            } else {
                "≈6"
            };
            println!(
                "{:<7} overhead {:>8.1} Gbps | {paper:>4}   99.99th {} ns",
                r.algo.alg.name(),
                r.overhead_mean_gbps,
                ns(r.latency_p9999_ns)
            );
        }
    }
    Ok(())
}
