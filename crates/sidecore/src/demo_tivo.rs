//! `sidecore demo tivo`: HYDRA's TiVoPC experiment (§8.1, Tables 8.2–8.4) on
//! a testbed of network namespaces. The video server (`file` Pull `streamer`)
//! is in the `server` namespace, the client (`stream-receiver` → `decoder`)
//! in the `client` one; every run is one manifest in the shape of
//! `examples/tivo.toml`, deployed through the runtime like any app.
//!
//! The machine is split as an offload would split it: the highest allowed
//! CPU is the dedicated core, the others are the application cores. Every
//! host thread of the demo (the runtime's, the host offcodes') is confined
//! to the application cores, so a host-placed streamer competes with the
//! application there; a core-placed one is pinned to the dedicated core.
//!
//! For each streamer mode — a socket loop, `sendfile`, io_uring (all on the
//! host, sleeping to each deadline), and the dedicated core (busy-waiting) —
//! it runs once on a quiet machine and once with a CPU-bound thread on every
//! application core, and prints the receiver's inter-arrival median, mean,
//! deviation and p99 (Table 8.2; kernel receive stamps) and the busy share of
//! the application cores and of the dedicated core from /proc/stat (Tables
//! 8.3–8.4, quiet runs). Two client rows put the decoder (a named stand-in
//! for MPEG decoding) on the host and on the dedicated core.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use sidecore_runtime::{AppStatus, Runtime, RuntimeConfig};
use sidecore_testbed::{Testbed, Topology, topology};

use crate::args::registry;

/// Time for the deployment to settle before the CPU window.
const WARM_UP: Duration = Duration::from_millis(300);
/// The port the client listens on.
const PORT: u16 = 5000;
/// The movie: arbitrary bytes (the seed's chunks were not frame-aligned).
const MOVIE_BYTES: usize = 4 << 20;

#[derive(Debug, Args)]
pub struct TivoArgs {
    /// Seconds measured per row.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Chunks per second (200: the seed's 1 KB every 5 ms).
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Bytes per chunk (1..=1472).
    #[arg(long, default_value_t = 1024)]
    pub chunk_bytes: usize,
    /// Streamer modes: socket, sendfile, io_uring (host), core (dedicated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "socket,sendfile,io_uring,core"
    )]
    pub modes: Vec<String>,
    /// Runs per mode: `quiet`, `load` (a CPU-bound thread on every
    /// application core), or `both`.
    #[arg(long, default_value = "both")]
    pub load: String,
    /// Rounds of the stand-in decoder per chunk.
    #[arg(long, default_value_t = 64)]
    pub decoder_rounds: u32,
    /// Leave the busy-waiting streamer under SCHED_OTHER (by default it asks
    /// for SCHED_FIFO 1, the streamer's `realtime` parameter, so ordinary
    /// threads on its CPU do not take turns with it).
    #[arg(long)]
    pub no_realtime: bool,
    /// Skip the client rows (decoder on the host vs the dedicated core).
    #[arg(long)]
    pub no_client: bool,
    /// Namespace prefix of the demo's testbed.
    #[arg(long, default_value = "sctivo")]
    pub prefix: String,
    #[arg(long)]
    pub json: bool,
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct TivoRow {
    pub mode: String,
    pub pe: String,
    pub decoder_pe: String,
    pub load: bool,
    pub target_rate: u64,
    pub sent: u64,
    pub received: u64,
    /// Arrivals per second between the first and the last.
    pub achieved_rate: f64,
    pub iat_median_ms: f64,
    pub iat_mean_ms: f64,
    pub iat_std_ms: f64,
    pub iat_p99_ms: f64,
    pub iat_max_ms: f64,
    /// Busy share of the application cores (100 = all of them all the time).
    pub app_cores_busy_pct: f64,
    /// Busy share of the dedicated core.
    pub dedicated_busy_pct: f64,
    /// The streamer's thread CPU time over its run.
    pub streamer_thread_pct: f64,
    /// The decoder's thread CPU time over its run.
    pub decoder_thread_pct: f64,
}

/// The CPUs of the run: the dedicated one and the application cores.
struct Cpus {
    dedicated: u32,
    app: Vec<u32>,
}

/// The testbed and the movie, removed on drop (even when a row fails).
struct Bed {
    tb: Testbed,
    dir: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = topology::down(&self.tb.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one run deploys.
struct RunSpec<'a> {
    mode: &'a str,
    load: bool,
    decoder_on_core: bool,
}

pub fn run(a: &TivoArgs) -> anyhow::Result<ExitCode> {
    for m in &a.modes {
        mode_parts(m)?;
    }
    let loads: &[bool] = match a.load.as_str() {
        "quiet" => &[false],
        "load" => &[true],
        "both" => &[false, true],
        o => anyhow::bail!("--load: `{o}` is not one of quiet, load, both"),
    };
    anyhow::ensure!(
        a.rate > 0,
        "--rate: 0 chunks/s; give a positive rate (200 is 1 KB every 5 ms)"
    );
    anyhow::ensure!(
        (1..=1472).contains(&a.chunk_bytes),
        "--chunk-bytes: {} is outside 1..=1472 (one UDP datagram in a 1500-byte MTU)",
        a.chunk_bytes
    );
    anyhow::ensure!(a.seconds > 0.0, "--seconds: give a positive duration");
    let cpus = split_cpus()?;
    let tb = Testbed::up(&Topology::default(), &a.prefix).with_context(|| {
        format!(
            "building the demo testbed (if one is left over: `sidecore testbed down --prefix {}`)",
            a.prefix
        )
    })?;
    let dir = std::env::temp_dir().join(format!("sidecore-tivo-{}", std::process::id()));
    let bed = Bed { tb, dir };
    std::fs::create_dir_all(&bed.dir)?;
    let movie = bed.dir.join("movie.bin");
    std::fs::write(&movie, movie_bytes())?;
    let runs = a.modes.len() * loads.len() + if a.no_client { 0 } else { 2 };
    let bar = crate::progress::Progress::bar(runs as u64 + 1, "tivo: idle CPUs");
    let idle = measure_idle(a.seconds, &cpus)?;
    bar.step("tivo");
    let mut rows = Vec::new();
    let mut specs: Vec<RunSpec<'_>> = Vec::new();
    for m in &a.modes {
        for &load in loads {
            specs.push(RunSpec {
                mode: m,
                load,
                decoder_on_core: false,
            });
        }
    }
    if !a.no_client {
        specs.push(RunSpec {
            mode: "socket",
            load: false,
            decoder_on_core: false,
        });
        specs.push(RunSpec {
            mode: "socket",
            load: false,
            decoder_on_core: true,
        });
    }
    for s in &specs {
        let load = if s.load { ", loaded" } else { "" };
        let dec = if s.decoder_on_core {
            ", decoder on core"
        } else {
            ""
        };
        bar.say(format!("tivo: streamer {}{load}{dec}", s.mode));
        let text = manifest(&bed, a, &cpus, &movie, s)?;
        let row = measure(&text, a, &cpus, s)
            .with_context(|| format!("streamer mode {}, load {}", s.mode, s.load))?;
        if !a.json {
            bar.suspend(|| print_row(&row, rows.is_empty(), a));
        }
        bar.step("tivo");
        rows.push(row);
    }
    drop(bar);
    if a.json {
        let v = serde_json::json!({
            "dedicated_cpu": cpus.dedicated,
            "app_cpus": cpus.app,
            "idle_app_cores_busy_pct": idle.0,
            "idle_dedicated_busy_pct": idle.1,
            "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_cpu_table(&rows, idle);
    }
    drop(bed);
    Ok(ExitCode::SUCCESS)
}

/// A mode's PE kind and send method.
fn mode_parts(m: &str) -> anyhow::Result<(&'static str, &'static str)> {
    Ok(match m {
        "socket" => ("host", "socket"),
        "sendfile" => ("host", "sendfile"),
        "io_uring" => ("host", "io_uring"),
        "core" => ("core", "socket"),
        o => anyhow::bail!("--modes: `{o}` is not one of socket, sendfile, io_uring, core"),
    })
}

fn movie_bytes() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..MOVIE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// The highest allowed CPU is dedicated; the others run the application.
fn split_cpus() -> anyhow::Result<Cpus> {
    let mut allowed = sidecore_pe::cores::allowed_cpus();
    allowed.sort_unstable();
    let dedicated = allowed.pop().context("no CPU is allowed to this process")?;
    anyhow::ensure!(
        !allowed.is_empty(),
        "the demo needs two CPUs (one dedicated, one for the application); this process may use only CPU {dedicated}"
    );
    Ok(Cpus {
        dedicated,
        app: allowed,
    })
}

/// The run's manifest, in the shape of examples/tivo.toml.
fn manifest(
    bed: &Bed,
    a: &TivoArgs,
    cpus: &Cpus,
    movie: &std::path::Path,
    s: &RunSpec<'_>,
) -> anyhow::Result<String> {
    let (kind, send) = mode_parts(s.mode)?;
    let ns = |h: &str| format!("{}-{h}", bed.tb.prefix);
    let client = bed
        .tb
        .iface("client", "middlebox")
        .context("the testbed has no link client—middlebox")?
        .addr;
    let target = |kind: &str| {
        if kind == "core" {
            format!(
                "  [[offcode.target]]\n  kind = \"core\"\n  require = {{ cpu = {} }}\n",
                cpus.dedicated
            )
        } else {
            "  [[offcode.target]]\n  kind = \"host\"\n".to_string()
        }
    };
    let offcode = |name: &str, imp: &str, n: u32, params: String, extra: &str, kind: &str| {
        format!(
            "[[offcode]]\nname = \"{name}\"\nid = \"7d1c0f3a-1b2e-4c5d-8e9f-0a1b2c3d4e{n:02}\"\nimpl = \"{imp}\"\ncpu = 0.3\nmemory = \"16MiB\"\nparams = {{ {params} }}\n{extra}{}\n",
            target(kind)
        )
    };
    let movie = movie.display();
    let mut m = String::from("[app]\nname = \"demo-tivo\"\n\n");
    m.push_str(&offcode(
        "file",
        "file",
        1,
        format!("path = \"{movie}\", chunk_bytes = {}", a.chunk_bytes),
        "outputs = [\"out\"]\n  [[offcode.import]]\n  offcode = \"streamer\"\n  constraint = \"pull\"\n",
        kind,
    ));
    m.push_str(&offcode(
        "streamer",
        "streamer",
        2,
        format!(
            "netns = \"{}\", dst = \"{client}\", dport = {PORT}, rate = {}, send = \"{send}\", file = \"{movie}\", realtime = {}",
            ns("server"),
            a.rate,
            !a.no_realtime
        ),
        "inputs = [\"in\"]\n",
        kind,
    ));
    m.push_str(&offcode(
        "receiver",
        "stream-receiver",
        3,
        format!(
            "netns = \"{}\", addr = \"{client}\", port = {PORT}",
            ns("client")
        ),
        "outputs = [\"out\"]\n",
        "host",
    ));
    m.push_str(&offcode(
        "decoder",
        "decoder",
        4,
        format!("rounds = {}", a.decoder_rounds),
        "inputs = [\"in\"]\n",
        if s.decoder_on_core { "core" } else { "host" },
    ));
    for (name, from, to, delivery) in [
        ("chunks", "file.out", "streamer.in", "reliable"),
        ("frames", "receiver.out", "decoder.in", "unreliable"),
    ] {
        m.push_str(&format!(
            "[[channel]]\nname = \"{name}\"\nfrom = \"{from}\"\nto = \"{to}\"\ndelivery = \"{delivery}\"\nzero_copy = true\nslots = 256\nslot_size = 1536\n\n"
        ));
    }
    Ok(m)
}

/// Confines the calling thread (and the threads it starts) to `cpus`.
fn set_affinity(cpus: &[u32]) -> anyhow::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes one bit inside `set`; `c` is below CPU_SETSIZE
        // because it came from the kernel's own CPU list.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    anyhow::ensure!(
        r == 0,
        "sched_setaffinity to CPUs {cpus:?}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// One CPU's number, busy ticks and total ticks.
type CpuTicks = (u32, u64, u64);

/// Busy and total ticks of each CPU, from /proc/stat.
fn per_cpu_ticks() -> anyhow::Result<Vec<CpuTicks>> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let mut out = Vec::new();
    for line in stat.lines() {
        let mut w = line.split_whitespace();
        let Some(cpu) = w
            .next()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let v: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
        anyhow::ensure!(v.len() >= 5, "/proc/stat: unexpected line `{line}`");
        let total: u64 = v.iter().take(8).sum();
        out.push((cpu, total - v[3] - v[4], total));
    }
    Ok(out)
}

/// Busy percent of `cpus` between two samples.
fn busy_pct(a: &[CpuTicks], b: &[CpuTicks], cpus: &[u32]) -> f64 {
    let (mut busy, mut total) = (0u64, 0u64);
    for &(c, busy_b, total_b) in b {
        if let Some(&(_, busy_a, total_a)) = a.iter().find(|x| x.0 == c)
            && cpus.contains(&c)
        {
            busy += busy_b.saturating_sub(busy_a);
            total += total_b.saturating_sub(total_a);
        }
    }
    100.0 * busy as f64 / total.max(1) as f64
}

/// The machine with nothing deployed: (application cores, dedicated core) busy %.
fn measure_idle(seconds: f64, cpus: &Cpus) -> anyhow::Result<(f64, f64)> {
    let a = per_cpu_ticks()?;
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let b = per_cpu_ticks()?;
    Ok((
        busy_pct(&a, &b, &cpus.app),
        busy_pct(&a, &b, &[cpus.dedicated]),
    ))
}

/// A CPU-bound thread on each of `cpus` until the flag is cleared.
fn start_load(cpus: &[u32]) -> (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let run = Arc::new(AtomicBool::new(true));
    let threads = cpus
        .iter()
        .map(|&c| {
            let run = run.clone();
            std::thread::spawn(move || {
                let _ = sidecore_pe::cores::pin_current_thread(c);
                let mut x = 1u64;
                while run.load(Ordering::Relaxed) {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                        );
                    }
                }
            })
        })
        .collect();
    (run, threads)
}

fn metric(s: &AppStatus, offcode: &str, name: &str) -> u64 {
    s.offcodes
        .iter()
        .find(|o| o.name == offcode)
        .and_then(|o| o.metrics.get(name).copied())
        .unwrap_or(0)
}

/// Deploys one manifest with the host confined to the application cores,
/// measures a window, stops it.
fn measure(text: &str, a: &TivoArgs, cpus: &Cpus, s: &RunSpec<'_>) -> anyhow::Result<TivoRow> {
    let manifest = sidecore_manifest::parse_str("demo-tivo.toml", text)?;
    let inventory = sidecore_pe::discover(&sidecore_pe::DiscoverOptions::default());
    let plan = sidecore_runtime::plan_manifest(
        &manifest,
        &inventory,
        &registry(),
        &sidecore_layout::SolveOptions::default(),
    )?;
    let pe_of = |n: &str| {
        plan.offcodes
            .iter()
            .find(|o| o.name == n)
            .map_or_else(|| "-".to_string(), |o| o.pe.clone())
    };
    let (pe, decoder_pe) = (pe_of("streamer"), pe_of("decoder"));
    let everything: Vec<u32> = cpus.app.iter().copied().chain([cpus.dedicated]).collect();
    set_affinity(&cpus.app)?;
    let load = s.load.then(|| start_load(&cpus.app));
    let result = (|| {
        let rt = Runtime::new(RuntimeConfig::default());
        let id = rt.deploy(&plan)?;
        std::thread::sleep(WARM_UP);
        let t0 = per_cpu_ticks()?;
        std::thread::sleep(Duration::from_secs_f64(a.seconds));
        let t1 = per_cpu_ticks()?;
        let (_, status) = rt
            .stop_app_with_status(id)
            .context("the demo app vanished")?;
        rt.shutdown();
        anyhow::Ok((t0, t1, status))
    })();
    if let Some((flag, threads)) = load {
        flag.store(false, Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
    }
    set_affinity(&everything)?;
    let (t0, t1, status) = result?;
    if let Some(o) = status.offcodes.iter().find(|o| {
        o.stop_reason
            .as_deref()
            .is_some_and(|r| r.contains("error"))
    }) {
        anyhow::bail!("offcode `{}` failed: {:?}", o.name, o.stop_reason);
    }
    Ok(row(s, &status, a, (pe, decoder_pe), (&t0, &t1), cpus))
}

fn row(
    s: &RunSpec<'_>,
    st: &AppStatus,
    a: &TivoArgs,
    (pe, decoder_pe): (String, String),
    (t0, t1): (&[CpuTicks], &[CpuTicks]),
    cpus: &Cpus,
) -> TivoRow {
    let m = |o: &str, n: &str| metric(st, o, n);
    let ms = |n: &str| m("receiver", n) as f64 / 1e6;
    let span_ns = m("receiver", "last_ns").saturating_sub(m("receiver", "first_ns"));
    let received = m("receiver", "received");
    let elapsed_ns = (m("streamer", "elapsed_ms") as f64 * 1e6).max(1.0);
    let dec_ns = (st
        .offcodes
        .iter()
        .find(|o| o.name == "decoder")
        .map_or(0, |o| o.uptime_ms) as f64
        * 1e6)
        .max(1.0);
    TivoRow {
        mode: s.mode.to_string(),
        pe,
        decoder_pe,
        load: s.load,
        target_rate: a.rate,
        sent: m("streamer", "sent"),
        received,
        achieved_rate: received.saturating_sub(1) as f64 * 1e9 / span_ns.max(1) as f64,
        iat_median_ms: ms("iat_median_ns"),
        iat_mean_ms: ms("iat_mean_ns"),
        iat_std_ms: ms("iat_std_ns"),
        iat_p99_ms: ms("iat_p99_ns"),
        iat_max_ms: ms("iat_max_ns"),
        app_cores_busy_pct: busy_pct(t0, t1, &cpus.app),
        dedicated_busy_pct: busy_pct(t0, t1, &[cpus.dedicated]),
        streamer_thread_pct: 100.0 * m("streamer", "cpu_ns") as f64 / elapsed_ns,
        decoder_thread_pct: 100.0 * m("decoder", "cpu_ns") as f64 / dec_ns,
    }
}

fn print_row(r: &TivoRow, header: bool, a: &TivoArgs) {
    if header {
        println!(
            "Table 8.2 — inter-arrival times at the client, ms (target {:.3} ms; kernel receive stamps)",
            1e3 / a.rate as f64
        );
        println!(
            "{:<9} {:<8} {:<8} {:<5} {:>7} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "mode",
            "PE",
            "decoder",
            "load",
            "sent",
            "recv",
            "rate/s",
            "median",
            "mean",
            "std",
            "p99",
            "max"
        );
    }
    println!(
        "{:<9} {:<8} {:<8} {:<5} {:>7} {:>7} {:>9.1} {:>8.3} {:>8.3} {:>8.4} {:>8.3} {:>8.3}",
        r.mode,
        r.pe,
        r.decoder_pe,
        if r.load { "yes" } else { "no" },
        r.sent,
        r.received,
        r.achieved_rate,
        r.iat_median_ms,
        r.iat_mean_ms,
        r.iat_std_ms,
        r.iat_p99_ms,
        r.iat_max_ms
    );
}

fn print_cpu_table(rows: &[TivoRow], idle: (f64, f64)) {
    println!();
    println!("Tables 8.3–8.4 — CPU over the window (runs without the added load), % busy");
    println!(
        "{:<9} {:<8} {:>10} {:>10} {:>10} {:>10}",
        "mode", "decoder", "app cores", "dedicated", "streamer", "decoder"
    );
    println!(
        "{:<9} {:<8} {:>10.2} {:>10.2} {:>10} {:>10}",
        "idle", "-", idle.0, idle.1, "-", "-"
    );
    for r in rows.iter().filter(|r| !r.load) {
        println!(
            "{:<9} {:<8} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            r.mode,
            r.decoder_pe,
            r.app_cores_busy_pct,
            r.dedicated_busy_pct,
            r.streamer_thread_pct,
            r.decoder_thread_pct
        );
    }
}
