//! SikkerSim (dissertation ch. 7): the connectivity model of Table 4.1, one host's real
//! NMU tables built from it, and the latency of real software permission checks on this
//! machine under the UR, URR, GR and GRR access patterns.

use hdrhistogram::Histogram;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sidecore_sikker_nmu::{Address, LocalIndex, NmuConfig, NmuTables, TableStats, Triple};
use std::time::{Duration, Instant};

use crate::error::{SimError, bad};
use crate::timing;

/// Table 4.1 and the host count.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelParams {
    /// Hosts in the system.
    pub hosts: u32,
    /// Processes per NMU (`p_h`).
    pub procs_per_host: u32,
    /// Processes per service (`p_s`).
    pub procs_per_service: u32,
    /// Domains per service (`d_s`).
    pub doms_per_service: u32,
    /// Service coverage.
    pub service_coverage: f64,
    /// Process coverage.
    pub process_coverage: f64,
    /// Domain coverage.
    pub domain_coverage: f64,
}

impl ModelParams {
    /// Table 4.1 for `hosts` hosts.
    pub fn table_4_1(hosts: u32) -> Self {
        ModelParams {
            hosts,
            procs_per_host: 16,
            procs_per_service: 512,
            doms_per_service: 256,
            service_coverage: 0.20,
            process_coverage: 0.65,
            domain_coverage: 0.25,
        }
    }
    /// All processes.
    pub fn processes(&self) -> u64 {
        self.hosts as u64 * self.procs_per_host as u64
    }
    /// `s_t`.
    pub fn services(&self) -> u32 {
        (self.processes() / self.procs_per_service as u64) as u32
    }
    /// `s_a` (819.2 → 819, as the dissertation rounds).
    pub fn s_a(&self) -> u32 {
        ((self.services() as f64 * self.service_coverage).round() as u32)
            .min(self.services().saturating_sub(1))
    }
    /// `p_a` (332.8 → 333).
    pub fn p_a(&self) -> u32 {
        (self.procs_per_service as f64 * self.process_coverage).round() as u32
    }
    /// `d_a`.
    pub fn d_a(&self) -> u32 {
        (self.doms_per_service as f64 * self.domain_coverage).round() as u32
    }
    /// Eq. 4.5: per-host SACL entries.
    pub fn h_sacl(&self) -> u64 {
        self.procs_per_host as u64 * self.s_a() as u64 * (self.p_a() + self.d_a()) as u64
    }
    /// Eq. 4.4: per-host NACL entries.
    pub fn h_nacl(&self) -> u64 {
        self.procs_per_host as u64 * self.s_a() as u64 * self.p_a() as u64 * self.d_a() as u64
    }
    /// Eq. 4.3: NOS SACL entries.
    pub fn n_sacl(&self) -> u64 {
        self.services() as u64 * self.s_a() as u64 * (self.p_a() + self.d_a()) as u64
    }
    /// Eq. 4.2: NOS NACL entries.
    pub fn n_nacl(&self) -> u64 {
        self.services() as u64
            * self.procs_per_service as u64
            * self.s_a() as u64
            * self.p_a() as u64
            * self.d_a() as u64
    }
}

/// One resident source's permissions, as the NOS sees them (used to draw checks).
#[derive(Clone, Debug)]
pub struct SourcePerms {
    /// Register set of the resident process.
    pub local_index: LocalIndex,
    /// Its service.
    pub service: u32,
    /// Destination services, each with its permitted processes and domains.
    pub dsts: Vec<(u32, Vec<u32>, Vec<u32>)>,
}

/// One host of the model: its NMU tables and the permissions they were built from.
pub struct HostModel {
    /// Parameters.
    pub params: ModelParams,
    /// The NMU.
    pub tables: NmuTables,
    /// Per resident process.
    pub sources: Vec<SourcePerms>,
    /// Time to build the tables.
    pub build_time: Duration,
}

fn sub_rng(seed: u64, a: u64, b: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(
        seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f),
    )
}

/// Builds the connectivity model (§4.7) lazily around host `host`: processes are
/// placed on hosts by a seeded random permutation (so that a host's 16 processes
/// belong, almost surely, to 16 different services, as Eq. 4.5 counts), every service
/// reaches `s_a` other services drawn at random, and every (source, destination)
/// pair permits `p_a` random processes and `d_a` random domains of the destination.
/// Only the resident services' SACL entries are materialised.
pub fn build_host(params: ModelParams, host: u32, seed: u64) -> HostModel {
    let t0 = Instant::now();
    let n = params.processes() as usize;
    let mut slot_of: Vec<u32> = (0..n as u32).collect();
    slot_of.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    // slot_of[global process] = position; position / p_h is the host.
    let mut resident = Vec::new();
    let lo = host * params.procs_per_host;
    for (g, &pos) in slot_of.iter().enumerate() {
        if pos >= lo && pos < lo + params.procs_per_host {
            resident.push(g as u32);
        }
    }
    resident.sort_by_key(|&g| slot_of[g as usize]);
    let ps = params.procs_per_service;
    let s_t = params.services();
    let (s_a, p_a, d_a) = (params.s_a(), params.p_a(), params.d_a());
    let mut tables = NmuTables::with_capacity(
        NmuConfig::default(),
        resident.len() * s_a as usize,
        params.services() as usize,
    );
    let mut sources = Vec::new();
    let mut built: Vec<u32> = Vec::new();
    for &g in &resident {
        let svc = g / ps;
        let proc = g % ps;
        let li = tables.add_process(svc, proc).expect("fresh process");
        // Destination services: s_a of the other s_t − 1.
        let mut r = sub_rng(seed, 1, svc as u64);
        let mut dsts: Vec<u32> = sample(&mut r, s_t as usize - 1, s_a as usize)
            .into_iter()
            .map(|i| {
                if (i as u32) >= svc {
                    i as u32 + 1
                } else {
                    i as u32
                }
            })
            .collect();
        dsts.sort_unstable();
        let mut perms = Vec::with_capacity(dsts.len());
        for &d in &dsts {
            let mut r = sub_rng(seed, 2 + svc as u64, d as u64);
            let procs: Vec<u32> = sample(&mut r, ps as usize, p_a as usize)
                .into_iter()
                .map(|i| i as u32)
                .collect();
            let doms: Vec<u32> = sample(&mut r, params.doms_per_service as usize, d_a as usize)
                .into_iter()
                .map(|i| i as u32)
                .collect();
            perms.push((d, procs, doms));
        }
        if !built.contains(&svc) {
            built.push(svc);
            for (d, procs, doms) in &perms {
                let pa: Vec<(u32, Address)> = procs
                    .iter()
                    .map(|&p| (p, Address(slot_of[(d * ps + p) as usize])))
                    .collect();
                tables
                    .set_permission(svc, *d, &pa, doms, None)
                    .expect("resident service");
            }
        }
        sources.push(SourcePerms {
            local_index: li,
            service: svc,
            dsts: perms,
        });
    }
    HostModel {
        params,
        tables,
        sources,
        build_time: t0.elapsed(),
    }
}

/// The four access patterns of §7.1.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Pattern {
    /// Uniform Random.
    UR,
    /// Uniform Repeated Random.
    URR,
    /// Gaussian Random.
    GR,
    /// Gaussian Repeated Random.
    GRR,
    /// Control, not from the dissertation: UR checks cycling over only 1,000 distinct
    /// checks, so that every table line they touch stays cached. Its tail is what this
    /// machine adds to any check (interrupts, hypervisor, the other core's traffic).
    Cached,
    /// Control, not from the dissertation: no check at all, one dependent load per
    /// sample from a random cycle over [`SikkerSimOptions::memory_bytes`] (by
    /// default [`MEMORY_CONTROL_BYTES`], far beyond the caches,
    /// on huge pages where the kernel grants them), timed the same way. What one
    /// memory access costs on this machine: a check whose lines miss every cache cannot
    /// be faster.
    Memory,
}

/// Default size of the [`Pattern::Memory`] control's buffer.
pub const MEMORY_CONTROL_BYTES: usize = 256 << 20;

impl Pattern {
    /// All four.
    pub const ALL: [Pattern; 4] = [Pattern::UR, Pattern::URR, Pattern::GR, Pattern::GRR];
    fn gaussian(self) -> bool {
        matches!(self, Pattern::GR | Pattern::GRR)
    }
    fn repeated(self) -> bool {
        matches!(self, Pattern::URR | Pattern::GRR)
    }
}

/// The calibration knobs the dissertation does not publish (digest §3.5).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PatternKnobs {
    /// Gaussian σ as a fraction of the list drawn from (mean at its middle).
    pub sigma_frac: f64,
    /// Repeated patterns: checks that keep the same source process.
    pub repeat_source: u32,
    /// Repeated patterns: checks that keep the same destination service.
    pub repeat_service: u32,
    /// Repeated patterns: checks that keep the same destination process.
    pub repeat_process: u32,
}

impl Default for PatternKnobs {
    fn default() -> Self {
        PatternKnobs {
            sigma_frac: 0.1,
            repeat_source: 8,
            repeat_service: 4,
            repeat_process: 2,
        }
    }
}

fn pick<R: Rng>(rng: &mut R, n: usize, gaussian: bool, sigma_frac: f64) -> usize {
    if !gaussian || n <= 1 {
        return rng.random_range(0..n);
    }
    // Box–Muller (one normal draw; rand_distr would be one more dependency for three
    // lines), folded back into range so that the tails are kept, not clipped.
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let x = (n as f64 / 2.0 + z * sigma_frac * n as f64).floor() as i64;
    x.rem_euclid(n as i64) as usize
}

/// Draws `count` permitted checks from a pattern.
pub fn draw_checks(
    m: &HostModel,
    p: Pattern,
    k: &PatternKnobs,
    count: usize,
    seed: u64,
) -> Vec<(LocalIndex, Triple)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let g = p.gaussian();
    let (rs, rv, rp) = if p.repeated() {
        (k.repeat_source, k.repeat_service, k.repeat_process)
    } else {
        (1, 1, 1)
    };
    let mut out = Vec::with_capacity(count);
    let (mut src, mut dst, mut proc) = (0usize, 0usize, 0u32);
    for i in 0..count as u32 {
        if p == Pattern::Cached && i >= 1000 {
            out.push(out[i as usize % 1000]);
            continue;
        }
        if i % rs == 0 {
            src = pick(&mut rng, m.sources.len(), g, k.sigma_frac);
        }
        let s = &m.sources[src];
        if i % rs == 0 || i % rv == 0 {
            dst = pick(&mut rng, s.dsts.len(), g, k.sigma_frac);
        }
        let (svc, procs, doms) = &s.dsts[dst];
        if i % rs == 0 || i % rv == 0 || i % rp == 0 {
            proc = procs[pick(&mut rng, procs.len(), g, k.sigma_frac)];
        }
        let dom = doms[pick(&mut rng, doms.len(), g, k.sigma_frac)];
        out.push((s.local_index, Triple::new(*svc, proc, dom)));
    }
    out
}

/// Latency figures of one pattern, in ns per check.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyResult {
    /// Pattern.
    pub pattern: Pattern,
    /// Checks timed.
    pub checks: usize,
    /// Checks per timed batch.
    pub batch: usize,
    /// Mean over a dependent chain timed as a whole (no timer overhead).
    pub chain_mean_ns: f64,
    /// Mean of the per-check samples after subtracting the baseline.
    pub mean_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
    /// 99.99th percentile.
    pub p9999_ns: f64,
    /// Max.
    pub max_ns: f64,
    /// The timer's own cost per batch, subtracted (median of the empty-loop baseline).
    pub baseline_ns: f64,
    /// The 99.99th percentile of the empty loop itself, after the same subtraction:
    /// the machine's noise floor (interrupts, hypervisor, the other core's traffic)
    /// below which no tail figure of this run means anything.
    pub noise_p9999_ns: f64,
    /// Checks denied (must be 0: every check is drawn from the permissions).
    pub denied: usize,
}

/// Times `checks` in a dependent chain (the next check's register-set index depends on
/// the previous result, so the CPU cannot overlap checks: one check in flight, like the
/// NMU's single-outstanding-request engine). The chain is cut into batches of `batch`
/// checks, each bracketed by the fenced time-stamp counter (whose resolution on this
/// VM is about 10 ns, too coarse for one check); the median cost of the same batch
/// loop with an empty body, measured in the same run, is subtracted; the per-check
/// latency of a batch (its time / `batch`) goes into the histogram. Each slice's chain
/// is also timed at once, for a mean free of timer overhead. The run is cut into slices
/// of 131,072 checks separated by `pause` (under real-time scheduling, so that the
/// kernel's RT throttling never stops the thread mid-slice), each preceded by an
/// untimed warm-up on other checks of the same pattern.
pub fn measure(
    tables: &NmuTables,
    p: Pattern,
    checks: &[(LocalIndex, Triple)],
    batch: usize,
    ns_per_tick: f64,
    pause: Duration,
) -> LatencyResult {
    let zero = std::hint::black_box(0u32);
    time_chain(
        p,
        checks,
        |(li, t), dep| tables.check(li | (dep & zero), t).ok().map(|(a, _)| a.0),
        batch,
        ns_per_tick,
        pause,
    )
}

/// A random cyclic permutation of `0..n` (Sattolo's algorithm): following
/// `next[i]` from any slot visits every slot before it returns.
pub fn random_cycle(n: usize, seed: u64, huge_pages: bool) -> Vec<u32> {
    let mut next: Vec<u32> = (0..n as u32).collect();
    if huge_pages {
        timing::advise_huge_pages(next.as_ptr() as *const u8, n * std::mem::size_of::<u32>());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..n).rev() {
        let j = rng.random_range(0..i);
        next.swap(i, j);
    }
    next
}

/// The [`Pattern::Memory`] control: `samples` dependent loads chasing `next` (a
/// [`random_cycle`]), timed exactly as [`measure`] times checks.
pub fn measure_memory(
    next: &[u32],
    samples: usize,
    batch: usize,
    ns_per_tick: f64,
    pause: Duration,
) -> LatencyResult {
    let items = vec![(); samples];
    time_chain(
        Pattern::Memory,
        &items,
        |(), dep| Some(next[dep as usize]),
        batch,
        ns_per_tick,
        pause,
    )
}

/// The timing harness of [`measure`] for any chain of dependent steps: `step(item,
/// dep)` returns the next `dep` (or `None` for a denied check).
fn time_chain<T: Copy>(
    p: Pattern,
    checks: &[T],
    step: impl Fn(T, u32) -> Option<u32>,
    batch: usize,
    ns_per_tick: f64,
    pause: Duration,
) -> LatencyResult {
    const SLICE: usize = 1 << 17;
    let batch = batch.max(1);
    let slices: Vec<&[T]> = checks.chunks(SLICE).collect();
    let mut dep = 0u32;
    let run = |c: &[T], dep: &mut u32| {
        for &x in c {
            if let Some(d) = step(x, *dep) {
                *dep = d;
            }
        }
    };
    // Whole warm-up pass: steady state, as in a running NMU.
    run(checks, &mut dep);
    let mut base_raw: Vec<(u64, usize)> = Vec::with_capacity(checks.len() / batch + 1);
    let mut check_raw: Vec<(u64, usize)> = Vec::with_capacity(checks.len() / batch + 1);
    let mut denied = 0usize;
    let mut chain_ns = 0u128;
    for (i, s) in slices.iter().enumerate() {
        // Re-warm with *other* checks of the same pattern (the next slice), so that a
        // pause or a preemption before this slice does not leave the caches cold, yet
        // the timed checks are not replays of just-touched ones.
        run(slices[(i + 1) % slices.len()], &mut dep);
        // Baseline: the same batch loop with an empty body.
        for c in s.chunks(batch) {
            let t0 = timing::ticks();
            for &x in c {
                std::hint::black_box((x, dep));
            }
            let t1 = timing::ticks();
            base_raw.push((t1 - t0, c.len()));
        }
        for c in s.chunks(batch) {
            let t0 = timing::ticks();
            for &x in c {
                match step(x, dep) {
                    Some(d) => dep = d,
                    None => denied += 1,
                }
            }
            let t1 = timing::ticks();
            check_raw.push((t1 - t0, c.len()));
        }
        // The slice's chain timed as a whole.
        let c0 = Instant::now();
        run(s, &mut dep);
        chain_ns += c0.elapsed().as_nanos();
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    std::hint::black_box(dep);
    let mut base = Histogram::<u64>::new(3).expect("histogram");
    for &(t, _) in &base_raw {
        let _ = base.record(t);
    }
    let base_ticks = base.value_at_quantile(0.5);
    let ps =
        |t: u64, n: usize| t.saturating_sub(base_ticks) as f64 * ns_per_tick * 1000.0 / n as f64;
    // Histogram unit: picoseconds per check.
    let mut noise = Histogram::<u64>::new(3).expect("histogram");
    for &(t, n) in &base_raw {
        let _ = noise.record(ps(t, n) as u64);
    }
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    let mut sum_ps = 0.0;
    for &(t, n) in &check_raw {
        let v = ps(t, n);
        sum_ps += v * n as f64;
        let _ = h.record(v as u64);
    }
    let ns = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    LatencyResult {
        pattern: p,
        checks: checks.len(),
        batch,
        chain_mean_ns: chain_ns as f64 / checks.len() as f64,
        mean_ns: sum_ps / 1000.0 / checks.len() as f64,
        p99_ns: ns(0.99),
        p999_ns: ns(0.999),
        p9999_ns: ns(0.9999),
        max_ns: h.max() as f64 / 1000.0,
        baseline_ns: base_ticks as f64 * ns_per_tick,
        noise_p9999_ns: noise.value_at_quantile(0.9999) as f64 / 1000.0,
        denied,
    }
}

/// One host count's results.
#[derive(Clone, Debug, Serialize)]
pub struct SikkerSimRow {
    /// Model.
    pub params: ModelParams,
    /// `s_t`, `s_a`, `p_a`, `d_a`.
    pub s_t: u32,
    /// `s_a`.
    pub s_a: u32,
    /// `p_a`.
    pub p_a: u32,
    /// `d_a`.
    pub d_a: u32,
    /// Eq. 4.5 entries.
    pub formula_entries: u64,
    /// Eq. 4.5 × 4 bytes.
    pub formula_bytes: u64,
    /// Real tables.
    pub tables: TableStats,
    /// Bytes backed by huge pages.
    pub huge_page_bytes: usize,
    /// Build time, ms.
    pub build_ms: f64,
    /// Whether every measurement ran under the real-time scheduler.
    pub realtime: bool,
    /// The machine's 1-minute load average after the run (the machine is shared).
    pub load_average: f64,
    /// Latency per pattern.
    pub latency: Vec<LatencyResult>,
}

/// Options of a SikkerSim run.
#[derive(Clone, Debug)]
pub struct SikkerSimOptions {
    /// Host counts.
    pub hosts: Vec<u32>,
    /// Checks per pattern.
    pub checks: usize,
    /// Seed.
    pub seed: u64,
    /// Patterns to run.
    pub patterns: Vec<Pattern>,
    /// Unpublished knobs.
    pub knobs: PatternKnobs,
    /// Advise huge pages for the tables.
    pub huge_pages: bool,
    /// Checks per timed batch.
    pub batch: usize,
    /// Measure under the real-time scheduler.
    pub realtime: bool,
    /// Pause between slices of 131,072 checks.
    pub pause: Duration,
    /// Also run the [`Pattern::Cached`] and [`Pattern::Memory`] controls.
    pub control: bool,
    /// Size of the [`Pattern::Memory`] control's buffer, bytes.
    pub memory_bytes: usize,
}

impl SikkerSimOptions {
    /// Checks every option's range; the error names the option as `sidecore sim
    /// sikker` spells it.
    pub fn validate(&self) -> Result<(), SimError> {
        if let Some(h) = self.hosts.iter().find(|&&h| h < 32 || !h.is_power_of_two()) {
            return Err(bad(
                "--hosts",
                format!(
                    "{h} is not a power of two of at least 32 (Table 4.1 needs whole \
                     services of 512 processes at 16 per host)"
                ),
            ));
        }
        if self.checks == 0 {
            return Err(bad("--checks", "must be at least 1"));
        }
        if self.batch == 0 || self.batch > self.checks {
            return Err(bad("--batch", "must be between 1 and --checks"));
        }
        if !(self.knobs.sigma_frac > 0.0 && self.knobs.sigma_frac.is_finite()) {
            return Err(bad(
                "--sigma",
                format!("must be a positive number, got {}", self.knobs.sigma_frac),
            ));
        }
        if !(MEMORY_MIN_BYTES..=MEMORY_MAX_BYTES).contains(&self.memory_bytes) {
            return Err(bad(
                "--memory-mib",
                format!(
                    "must be between {} and {} MiB, got {} bytes",
                    MEMORY_MIN_BYTES >> 20,
                    MEMORY_MAX_BYTES >> 20,
                    self.memory_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// The smallest `Memory` control buffer: 1 MiB.
pub const MEMORY_MIN_BYTES: usize = 1 << 20;
/// The largest `Memory` control buffer: 16 GiB (the machine has 24).
pub const MEMORY_MAX_BYTES: usize = 16 << 30;

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Runs SikkerSim for each host count, after [`SikkerSimOptions::validate`].
pub fn run(o: &SikkerSimOptions) -> Result<Vec<SikkerSimRow>, SimError> {
    o.validate()?;
    let npt = timing::ns_per_tick(Duration::from_millis(200));
    let mut rows = Vec::new();
    let mut memory = None;
    for &hosts in &o.hosts {
        let params = ModelParams::table_4_1(hosts);
        let m = build_host(params, 0, o.seed);
        let mut huge = 0;
        if o.huge_pages {
            for (p, l) in m.tables.regions() {
                huge += timing::advise_huge_pages(p, l);
            }
        }
        let mut latency = Vec::new();
        let mut realtime = o.realtime;
        let mut pats = o.patterns.clone();
        if o.control {
            pats.push(Pattern::Cached);
        }
        for (i, &p) in pats.iter().enumerate() {
            let checks = draw_checks(&m, p, &o.knobs, o.checks, o.seed ^ ((i as u64 + 1) * 7919));
            let (r, rt) = timing::with_realtime(o.realtime, || {
                measure(&m.tables, p, &checks, o.batch, npt, o.pause)
            });
            realtime &= rt;
            latency.push(r);
        }
        if o.control {
            // Measured once, beside the first host count's patterns, and repeated in
            // every row: it does not depend on the tables.
            let r = memory.get_or_insert_with(|| {
                let n = (o.memory_bytes / std::mem::size_of::<u32>()).max(2);
                let next = random_cycle(n, o.seed, o.huge_pages);
                timing::with_realtime(o.realtime, || {
                    measure_memory(&next, o.checks, o.batch, npt, o.pause)
                })
            });
            realtime &= r.1;
            latency.push(r.0.clone());
        }
        rows.push(SikkerSimRow {
            params,
            s_t: params.services(),
            s_a: params.s_a(),
            p_a: params.p_a(),
            d_a: params.d_a(),
            formula_entries: params.h_sacl(),
            formula_bytes: params.h_sacl() * 4,
            tables: m.tables.stats(),
            huge_page_bytes: huge,
            build_ms: m.build_time.as_secs_f64() * 1e3,
            realtime,
            load_average: load_average(),
            latency,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_4_1_worked_case() {
        let p = ModelParams::table_4_1(131_072);
        assert_eq!(p.processes(), 2_097_152);
        assert_eq!(p.services(), 4096);
        assert_eq!(p.s_a(), 819);
        assert_eq!(p.p_a(), 333);
        assert_eq!(p.d_a(), 64);
        assert_eq!(p.h_sacl(), 5_202_288);
        // 20.8 MB, 1.12 GB, 5.33 GB, 146 TB at 4 bytes per entry.
        assert_eq!((p.h_sacl() * 4) / 100_000, 208);
        assert_eq!((p.h_nacl() * 4) / 10_000_000, 111);
        assert_eq!((p.n_sacl() * 4) / 10_000_000, 532);
        assert_eq!((p.n_nacl() * 4) / 1_000_000_000_000, 146);
    }

    #[test]
    fn small_host_tables_match_the_formula_and_checks_pass() {
        let p = ModelParams::table_4_1(1024);
        let m = build_host(p, 3, 42);
        let s = m.tables.stats();
        assert_eq!(s.processes, 16);
        // Distinct resident services hold one entry each; the formula counts per process.
        let per_service = (p.s_a() * (p.p_a() + p.d_a())) as usize;
        assert_eq!(
            s.process_entries + s.domain_entries,
            s.services * per_service
        );
        assert!(s.services <= 16);
        for pat in Pattern::ALL {
            let checks = draw_checks(&m, pat, &PatternKnobs::default(), 2000, 1);
            for (li, t) in &checks {
                assert!(
                    m.tables.check(*li, *t).is_ok(),
                    "{pat:?} drew a denied check {t}"
                );
            }
        }
        let r = measure(
            &m.tables,
            Pattern::UR,
            &draw_checks(&m, Pattern::UR, &PatternKnobs::default(), 5000, 2),
            16,
            1.0,
            Duration::ZERO,
        );
        assert_eq!(r.denied, 0);
        assert_eq!(r.checks, 5000);
    }

    #[test]
    fn memory_control_chases_one_cycle_through_every_slot() {
        let n = 1 << 12;
        let next = random_cycle(n, 5, false);
        let mut seen = vec![false; n];
        let mut i = 0usize;
        for _ in 0..n {
            assert!(!seen[i], "slot {i} visited twice before the cycle closed");
            seen[i] = true;
            i = next[i] as usize;
        }
        assert_eq!(i, 0, "the chase returns to its start after n steps");
        assert!(seen.iter().all(|&x| x));
        let r = measure_memory(&next, 3000, 4, 1.0, Duration::ZERO);
        assert_eq!(r.pattern, Pattern::Memory);
        assert_eq!((r.checks, r.denied), (3000, 0));
    }

    #[test]
    fn repeated_patterns_repeat() {
        let m = build_host(ModelParams::table_4_1(1024), 0, 7);
        let k = PatternKnobs::default();
        let c = draw_checks(&m, Pattern::URR, &k, 64, 3);
        for w in c.chunks(k.repeat_source as usize) {
            assert!(w.iter().all(|x| x.0 == w[0].0));
        }
        for w in c.chunks(k.repeat_process as usize) {
            assert!(
                w.iter()
                    .all(|x| x.1.svc == w[0].1.svc && x.1.proc == w[0].1.proc)
            );
        }
    }
}
