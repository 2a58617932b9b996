//! `sidecore sim sikker` and `sidecore sim rate`: argument parsing and table printing.

use clap::{Args, Subcommand};

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
}

/// Options of `sim sikker`.
#[derive(Args, Debug, Clone)]
pub struct SikkerArgs {
    /// Host counts of the connectivity model (Table 4.1), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,4096,16384,32768,131072"
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
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `sim` subcommand.
pub fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd.which {
        SimWhich::Sikker(a) => run_sikker(a),
    }
}

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
