//! Benchmarks of sidecore's Wasm extensions, all measured side by side in one run:
//!
//! 1. calibration of this machine (quick unless `SIDECORE_BENCH_FULL=1`);
//! 2. bound tightness per corpus module: static bound vs measured cycles on the module's
//!    worst-case input (thesis Tables 5.3–5.5), plus the fuel audit (static operator bound
//!    vs wasmtime fuel consumed);
//! 3. the same handlers run as native Rust, Wasm unchecked, Wasm + fuel, Wasm + epochs and
//!    sidecore's hybrid accounting (ns per invocation, rounds interleaved);
//! 4. the same handlers through the batch ABI (B = 32 buffers per guest call, in-place
//!    verdicts), again native / unchecked / fuel / epochs / hybrid, ns per packet;
//! 5. the cost of per-invocation accounting (ns);
//! 6. packets per second through a chain of three elements, per buffer and batched.
//!
//! Run: `cargo bench -p sidecore-ext --bench ext` (prints Markdown tables).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidecore_ext::calibrate::{self, Effort};
use sidecore_ext::verify::Calibration;
use sidecore_ext::{ExecMode, ExtConfig, ExtEngine, ViolationPolicy, WasmExtension, tsc};

fn corpus(name: &str) -> Vec<u8> {
    let p = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../ext-verify/corpus/benign")
        .join(format!("{name}.wat"));
    wat::parse_file(&p).unwrap()
}

fn cfg() -> ExtConfig {
    ExtConfig {
        violations: ViolationPolicy {
            k: u32::MAX,
            window: u32::MAX,
        },
        outputs: vec!["out".into(), "b".into(), "c".into(), "d".into()],
        ..ExtConfig::default()
    }
}

fn frame(len: usize, proto: u8, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[12] = 0x08;
    let ip = 14;
    f[ip] = 0x45;
    f[ip + 8] = 64;
    f[ip + 9] = proto;
    f[ip + 12..ip + 16].copy_from_slice(&[192, 168, 1, 2]);
    f[ip + 16..ip + 20].copy_from_slice(&[192, 168, 1, 99]);
    f[ip + 22..ip + 24].copy_from_slice(&dport.to_be_bytes());
    for (i, b) in f.iter_mut().enumerate().skip(54) {
        *b = (i * 13) as u8;
    }
    f
}

/// Worst-case input of each corpus module (and any preparation of its state).
fn worst_case(name: &str) -> Vec<u8> {
    match name {
        // 99 matches no rule: all 16 rules are tried
        "classifier" => frame(2048, 99, 9),
        _ => frame(2048, 6, 80),
    }
}

fn prepare(name: &str, x: &mut WasmExtension) {
    if name == "flowtable" {
        // Every slot taken by another flow: 8 probes that all miss, then the overflow path.
        let mut slot = [0u8; 32];
        slot[..4].copy_from_slice(&[0xff; 4]);
        slot[16] = 1;
        let table: Vec<u8> = slot.iter().copied().cycle().take(32 * 1024).collect();
        x.memory_write(8192, &table).unwrap();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p) as usize]
}

const MODULES: &[&str] = &[
    "counter",
    "classifier",
    "hdr_rewrite",
    "checksum",
    "chacha",
    "flowtable",
];

fn tightness(cal: &Calibration) {
    println!("\n### Bound tightness (estimated vs measured cycles, worst-case input)\n");
    println!(
        "| module | worst-case input | bound (cycles) | measured median | measured p99 | est/median | est/p99 | fuel bound | fuel used | fuel ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let he = ExtEngine::new(ExecMode::Hybrid, 256 << 10, Duration::from_micros(100)).unwrap();
    let fe = ExtEngine::new(ExecMode::Fuel, 256 << 10, Duration::from_micros(100)).unwrap();
    let mut ratios = Vec::new();
    for name in MODULES {
        let bytes = corpus(name);
        let mut x = WasmExtension::load(&he, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap();
        prepare(name, &mut x);
        let input = worst_case(name);
        for _ in 0..2000 {
            x.invoke(0, &input).unwrap();
        }
        let mut v: Vec<f64> = (0..20000)
            .map(|_| x.invoke(0, &input).unwrap().cycles as f64)
            .collect();
        let bound = x.admission.entry("handle").unwrap().bound_cycles;
        let fuel_bound = x.admission.entry("handle").unwrap().bound_fuel;
        let med = median(&mut v);
        let p99 = pct(&mut v, 0.99);
        let mut f = WasmExtension::load(&fe, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap();
        prepare(name, &mut f);
        let used = f.invoke(0, &input).unwrap().fuel.unwrap();
        ratios.push(bound / med);
        println!(
            "| {name} | {} B | {bound:.0} | {med:.0} | {p99:.0} | {:.2} | {:.2} | {fuel_bound:.0} | {used} | {:.2} |",
            input.len(),
            bound / med,
            bound / p99,
            fuel_bound / used as f64
        );
    }
    let mut r = ratios.clone();
    println!(
        "\nmedian est/measured {:.2}, worst {:.2}, best {:.2}; underestimates (est < median): {}",
        median(&mut r),
        ratios.iter().cloned().fold(0.0, f64::max),
        ratios.iter().cloned().fold(f64::MAX, f64::min),
        ratios.iter().filter(|x| **x < 1.0).count()
    );
}

// ---- native reference handlers (same work: copy in, process, copy out) ----

fn native_hdr_rewrite(buf: &mut [u8]) -> i32 {
    if buf.len() < 34 || buf[12..14] != [0x08, 0x00] {
        return -1;
    }
    let ip = 14;
    if buf[ip + 8] <= 1 {
        return -2;
    }
    let be = |b: &[u8], p: usize| u16::from_be_bytes([b[p], b[p + 1]]) as u32;
    let add = |a: u32, b: u32| {
        let s = a + b;
        (s + (s >> 16)) & 0xffff
    };
    let old = be(buf, ip + 8);
    buf[ip + 8] -= 1;
    let new = be(buf, ip + 8);
    let mut c = be(buf, ip + 10) ^ 0xffff;
    c = add(c, old ^ 0xffff);
    c = add(c, new);
    c = add(c, be(buf, ip + 16) ^ 0xffff);
    c = add(c, be(buf, ip + 18) ^ 0xffff);
    c = add(c, 0x0a00);
    c = add(c, 0x0001);
    buf[ip + 16..ip + 20].copy_from_slice(&[10, 0, 0, 1]);
    c ^= 0xffff;
    buf[ip + 10] = (c >> 8) as u8;
    buf[ip + 11] = c as u8;
    0
}

fn native_checksum(buf: &[u8]) -> u16 {
    let mut s: u32 = 0;
    let mut it = buf.chunks_exact(2);
    for c in &mut it {
        s = s.wrapping_add(u16::from_le_bytes([c[0], c[1]]) as u32);
    }
    if let [b] = it.remainder() {
        s = s.wrapping_add(*b as u32);
    }
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

fn native_chacha(buf: &mut [u8]) {
    let key: [u32; 8] =
        std::array::from_fn(|i| u32::from_le_bytes(std::array::from_fn(|j| (4 * i + j) as u8)));
    for (blk, chunk) in buf.chunks_mut(64).enumerate() {
        let mut s = [0u32; 16];
        s[..4].copy_from_slice(&[0x61707865, 0x3320646e, 0x79622d32, 0x6b206574]);
        s[4..12].copy_from_slice(&key);
        s[12] = blk as u32;
        s[13] = 0x09000000;
        s[14] = 0x4a000000;
        let mut x = s;
        macro_rules! qr {
            ($a:expr, $b:expr, $c:expr, $d:expr) => {
                x[$a] = x[$a].wrapping_add(x[$b]);
                x[$d] = (x[$d] ^ x[$a]).rotate_left(16);
                x[$c] = x[$c].wrapping_add(x[$d]);
                x[$b] = (x[$b] ^ x[$c]).rotate_left(12);
                x[$a] = x[$a].wrapping_add(x[$b]);
                x[$d] = (x[$d] ^ x[$a]).rotate_left(8);
                x[$c] = x[$c].wrapping_add(x[$d]);
                x[$b] = (x[$b] ^ x[$c]).rotate_left(7);
            };
        }
        for _ in 0..10 {
            qr!(0, 4, 8, 12);
            qr!(1, 5, 9, 13);
            qr!(2, 6, 10, 14);
            qr!(3, 7, 11, 15);
            qr!(0, 5, 10, 15);
            qr!(1, 6, 11, 12);
            qr!(2, 7, 8, 13);
            qr!(3, 4, 9, 14);
        }
        let mut ks = [0u8; 64];
        for i in 0..16 {
            ks[4 * i..4 * i + 4].copy_from_slice(&x[i].wrapping_add(s[i]).to_le_bytes());
        }
        for (b, k) in chunk.iter_mut().zip(ks.iter()) {
            *b ^= k;
        }
    }
}

/// Runs `f` `batch` times per round for `rounds` rounds, interleaving the closures;
/// returns the median ns per call of each.
fn interleaved(fs: &mut [Box<dyn FnMut() + '_>], batch: usize, rounds: usize) -> Vec<f64> {
    let mut res = vec![Vec::new(); fs.len()];
    let n = fs.len();
    for round in 0..rounds {
        // Rotate the order every round: no mode always runs first or last.
        for k in 0..n {
            let i = (round + k) % n;
            let f = &mut fs[i];
            let t0 = Instant::now();
            for _ in 0..batch {
                f();
            }
            res[i].push(t0.elapsed().as_nanos() as f64 / batch as f64);
        }
    }
    res.iter_mut().map(|v| median(v)).collect()
}

fn four_ways(cal: &Calibration) {
    println!(
        "\n### The same handler five ways (ns per invocation, median of interleaved rounds)\n"
    );
    println!(
        "| handler | input | native Rust | Wasm unchecked | Wasm + fuel | Wasm + epochs | sidecore hybrid | hybrid / unchecked | fuel / unchecked | epochs / unchecked | unchecked / native |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let engines: Vec<ExtEngine> = [
        ExecMode::Unchecked,
        ExecMode::Fuel,
        ExecMode::Epoch,
        ExecMode::Hybrid,
    ]
    .iter()
    .map(|m| ExtEngine::new(*m, 256 << 10, Duration::from_micros(100)).unwrap())
    .collect();
    for (name, input) in [
        ("hdr_rewrite", frame(64, 6, 80)),
        ("hdr_rewrite", frame(1500, 6, 80)),
        ("classifier", frame(64, 99, 9)),
        ("counter", frame(64, 6, 80)),
        ("flowtable", frame(64, 6, 80)),
        ("checksum", frame(1500, 6, 80)),
        ("chacha", frame(1500, 6, 80)),
    ] {
        let bytes = corpus(name);
        let mut exts: Vec<WasmExtension> = engines
            .iter()
            .map(|e| WasmExtension::load(e, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap())
            .collect();
        let mut scratch = vec![0u8; 2048];
        let mut out = Vec::with_capacity(2048);
        let native: Option<Box<dyn FnMut()>> = match name {
            "hdr_rewrite" => Some(Box::new(|| {
                let b = &mut scratch[..input.len()];
                b.copy_from_slice(&input);
                let r = native_hdr_rewrite(std::hint::black_box(b));
                out.clear();
                if r == 0 {
                    out.extend_from_slice(b);
                }
                std::hint::black_box(&out);
            })),
            "checksum" => Some(Box::new(|| {
                let b = &mut scratch[..input.len()];
                b.copy_from_slice(&input);
                let c = native_checksum(std::hint::black_box(b));
                out.clear();
                out.extend_from_slice(&c.to_le_bytes());
                std::hint::black_box(&out);
            })),
            "chacha" => Some(Box::new(|| {
                let b = &mut scratch[..input.len()];
                b.copy_from_slice(&input);
                native_chacha(std::hint::black_box(b));
                out.clear();
                out.extend_from_slice(b);
                std::hint::black_box(&out);
            })),
            _ => None,
        };
        let has_native = native.is_some();
        let mut fs: Vec<Box<dyn FnMut() + '_>> = Vec::new();
        if let Some(n) = native {
            fs.push(n);
        }
        for x in exts.iter_mut() {
            let inp = &input;
            fs.push(Box::new(move || {
                let o = x.invoke(0, inp).unwrap();
                std::hint::black_box(o.status);
            }));
        }
        let batch = if input.len() > 1000 { 500 } else { 5000 };
        let r = interleaved(&mut fs, batch, 21);
        let (nat, w) = if has_native {
            (Some(r[0]), &r[1..])
        } else {
            (None, &r[..])
        };
        let (u, f, e, h) = (w[0], w[1], w[2], w[3]);
        println!(
            "| {name} | {} B | {} | {u:.1} | {f:.1} | {e:.1} | {h:.1} | {:.3} | {:.3} | {:.3} | {} |",
            input.len(),
            nat.map(|n| format!("{n:.1}")).unwrap_or_else(|| "—".into()),
            h / u,
            f / u,
            e / u,
            nat.map(|n| format!("{:.2}", u / n))
                .unwrap_or_else(|| "—".into()),
        );
    }
}

/// Buffers per batch in the batched benchmarks (the corpus modules' B).
const B: usize = 32;

fn batched(cal: &Calibration) {
    println!(
        "\n### The same handlers through the batch ABI (B = {B} buffers per call; ns per packet, median of interleaved rounds)\n"
    );
    println!(
        "| handler | input | native Rust | Wasm unchecked | Wasm + fuel | Wasm + epochs | sidecore hybrid | hybrid / unchecked | fuel / unchecked | epochs / unchecked | unchecked / native | hybrid / native |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let engines: Vec<ExtEngine> = [
        ExecMode::Unchecked,
        ExecMode::Fuel,
        ExecMode::Epoch,
        ExecMode::Hybrid,
    ]
    .iter()
    .map(|m| ExtEngine::new(*m, 256 << 10, Duration::from_micros(100)).unwrap())
    .collect();
    for (name, input) in [
        ("hdr_rewrite", frame(64, 6, 80)),
        ("hdr_rewrite", frame(1500, 6, 80)),
        ("classifier", frame(64, 99, 9)),
        ("counter", frame(64, 6, 80)),
        ("flowtable", frame(64, 6, 80)),
        ("checksum", frame(1500, 6, 80)),
    ] {
        let bytes = corpus(name);
        let mut exts: Vec<WasmExtension> = engines
            .iter()
            .map(|e| WasmExtension::load(e, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap())
            .collect();
        let inputs: Vec<Vec<u8>> = vec![input.clone(); B];
        let refs: Vec<&[u8]> = inputs.iter().map(std::vec::Vec::as_slice).collect();
        // Native: the same batch, the same copies in (into per-buffer slots) and out.
        let mut slots = vec![0u8; B * 2048];
        let mut out: Vec<u8> = Vec::with_capacity(B * 2048);
        let native: Option<Box<dyn FnMut()>> = match name {
            "hdr_rewrite" => Some(Box::new(|| {
                out.clear();
                for (i, x) in inputs.iter().enumerate() {
                    let b = &mut slots[i * 2048..i * 2048 + x.len()];
                    b.copy_from_slice(x);
                    if native_hdr_rewrite(std::hint::black_box(b)) == 0 {
                        out.extend_from_slice(b);
                    }
                }
                std::hint::black_box(&out);
            })),
            "checksum" => Some(Box::new(|| {
                out.clear();
                for (i, x) in inputs.iter().enumerate() {
                    let b = &mut slots[i * 2048..i * 2048 + x.len()];
                    b.copy_from_slice(x);
                    let c = native_checksum(std::hint::black_box(b));
                    out.extend_from_slice(&c.to_le_bytes());
                }
                std::hint::black_box(&out);
            })),
            _ => None,
        };
        let has_native = native.is_some();
        let mut fs: Vec<Box<dyn FnMut() + '_>> = Vec::new();
        if let Some(n) = native {
            fs.push(n);
        }
        for x in exts.iter_mut() {
            let refs = &refs;
            let h = x.batch_entry("batch").unwrap();
            let mut out: Vec<u8> = Vec::with_capacity(B * 2048);
            fs.push(Box::new(move || {
                let o = x.invoke_batch(h, refs).unwrap();
                out.clear();
                x.for_each_batch_output(|_, _, b| out.extend_from_slice(b));
                std::hint::black_box((o.status, &out));
            }));
        }
        // Short rounds, many of them: a packet takes ~10 ns here, so a burst of the other
        // tenants' work must not land in one mode's round only.
        let calls = if input.len() > 1000 { 4 } else { 40 };
        interleaved(&mut fs, calls, 15); // warm-up, discarded
        let r = interleaved(&mut fs, calls, 151);
        let r: Vec<f64> = r.iter().map(|v| v / B as f64).collect();
        let (nat, w) = if has_native {
            (Some(r[0]), &r[1..])
        } else {
            (None, &r[..])
        };
        let (u, f, e, h) = (w[0], w[1], w[2], w[3]);
        let vs = |x: f64| {
            nat.map(|n| format!("{:.2}", x / n))
                .unwrap_or_else(|| "—".into())
        };
        println!(
            "| {name} | {B} × {} B | {} | {u:.1} | {f:.1} | {e:.1} | {h:.1} | {:.3} | {:.3} | {:.3} | {} | {} |",
            input.len(),
            nat.map(|n| format!("{n:.1}")).unwrap_or_else(|| "—".into()),
            h / u,
            f / u,
            e / u,
            vs(u),
            vs(h),
        );
    }
}

fn accounting_cost(cal: &Calibration) {
    println!("\n### Per-invocation accounting cost\n");
    let wat = r#"(module (memory (export "memory") 1 1)
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "handle") (param i32) (result i32) (local.get 0)))"#;
    let bytes = wat::parse_str(wat).unwrap();
    let ue = ExtEngine::new(ExecMode::Unchecked, 256 << 10, Duration::from_micros(100)).unwrap();
    let he = ExtEngine::new(ExecMode::Hybrid, 256 << 10, Duration::from_micros(100)).unwrap();
    let mut u = WasmExtension::load(&ue, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap();
    let mut h = WasmExtension::load(&he, &bytes, &cfg(), cal, Arc::new(Vec::new())).unwrap();
    let mut tr = sidecore_ext::Tracker::new(ViolationPolicy::default());
    let mut fs: Vec<Box<dyn FnMut()>> = vec![
        Box::new(|| {
            std::hint::black_box(u.invoke(0, &[]).unwrap());
        }),
        Box::new(|| {
            std::hint::black_box(h.invoke(0, &[]).unwrap());
        }),
        Box::new(|| {
            let a = tsc::now();
            let b = tsc::now();
            std::hint::black_box(b.wrapping_sub(a));
        }),
        Box::new(|| {
            std::hint::black_box(tr.record(false, None));
        }),
    ];
    let r = interleaved(&mut fs, 20000, 21);
    println!("| quantity | ns | thesis |");
    println!("|---|---|---|");
    println!("| empty handler, unchecked invocation | {:.1} | — |", r[0]);
    println!(
        "| empty handler, hybrid (accounted) invocation | {:.1} | — |",
        r[1]
    );
    println!(
        "| per-invocation accounting (hybrid − unchecked) | {:.1} | ~80 (2 × 40 ns timestamp, §3.3) |",
        r[1] - r[0]
    );
    println!("| two cycle-counter reads (rdtsc) | {:.1} | 2 × 40 |", r[2]);
    println!("| violation-window update | {:.1} | — |", r[3]);
    let _ = cal;
}

fn chain(cal: &Calibration) {
    println!(
        "\n### Packets per second through a chain of 3 elements (classifier → hdr_rewrite → counter, 64-byte frames)\n"
    );
    println!(
        "| mode | packets/s (per buffer) | ns/packet | packets/s (batches of {B}) | ns/packet | batched / per buffer |"
    );
    println!("|---|---|---|---|---|---|");
    for mode in [
        ExecMode::Unchecked,
        ExecMode::Hybrid,
        ExecMode::Fuel,
        ExecMode::Epoch,
    ] {
        let e = ExtEngine::new(mode, 256 << 10, Duration::from_micros(100)).unwrap();
        let mut c =
            WasmExtension::load(&e, &corpus("classifier"), &cfg(), cal, Arc::new(Vec::new()))
                .unwrap();
        let mut r = WasmExtension::load(
            &e,
            &corpus("hdr_rewrite"),
            &cfg(),
            cal,
            Arc::new(Vec::new()),
        )
        .unwrap();
        let mut n =
            WasmExtension::load(&e, &corpus("counter"), &cfg(), cal, Arc::new(Vec::new())).unwrap();
        let input = frame(64, 6, 443);
        let mut buf = Vec::with_capacity(2048);
        let mut done = 0u64;
        let mut run = |iters: u64, done: &mut u64| {
            for _ in 0..iters {
                c.invoke(0, &input).unwrap();
                buf.clear();
                c.for_each_emitted(|_, b| buf.extend_from_slice(b));
                r.invoke(0, &buf).unwrap();
                buf.clear();
                r.for_each_emitted(|_, b| buf.extend_from_slice(b));
                let o = n.invoke(0, &buf).unwrap();
                assert_eq!((o.status, n.emitted().len()), (0, 1), "the chain delivers");
                *done += 1;
            }
        };
        run(10_000, &mut done);
        done = 0;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(700) {
            run(2000, &mut done);
        }
        let pps = done as f64 / t0.elapsed().as_secs_f64();

        // The same chain through the batch entries: B frames per call of each element,
        // each element's outputs staged straight into the next one's batch slots.
        let (hc, hr, hn) = (
            c.batch_entry("batch").unwrap(),
            r.batch_entry("batch").unwrap(),
            n.batch_entry("batch").unwrap(),
        );
        let frames: Vec<&[u8]> = vec![&input[..]; B];
        let mut bdone = 0u64;
        let mut brun = |iters: u64, done: &mut u64| {
            for _ in 0..iters {
                c.invoke_batch(hc, &frames).unwrap();
                c.for_each_batch_output(|_, _, b| {
                    r.stage(b).unwrap();
                });
                r.invoke_staged(hr).unwrap();
                r.for_each_batch_output(|_, _, b| {
                    n.stage(b).unwrap();
                });
                let o = n.invoke_staged(hn).unwrap();
                let mut got = 0;
                n.for_each_batch_output(|_, _, b| {
                    std::hint::black_box(b);
                    got += 1;
                });
                assert_eq!((o.status, got), (0, B), "the chain delivers");
                *done += B as u64;
            }
        };
        brun(400, &mut bdone);
        bdone = 0;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(700) {
            brun(100, &mut bdone);
        }
        let bpps = bdone as f64 / t0.elapsed().as_secs_f64();
        println!(
            "| {mode:?} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2} |",
            pps,
            1e9 / pps,
            bpps,
            1e9 / bpps,
            bpps / pps
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let full = std::env::var("SIDECORE_BENCH_FULL").is_ok();
    let t0 = Instant::now();
    let cal = calibrate::calibrate(if full { Effort::FULL } else { Effort::QUICK }).unwrap();
    println!("## Extensions (Wasm) — run of `cargo bench -p sidecore-ext --bench ext`\n");
    println!(
        "Machine: {} ({} cores); TSC {:.3} ticks/ns; calibration took {:.1} s.",
        cal.machine,
        std::thread::available_parallelism()
            .map(std::num::NonZero::get)
            .unwrap_or(1),
        cal.tsc_per_ns,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "\n### Calibration (cycles per operator class; memory latency by working set, cf. Tables 3.1 and 5.1)\n"
    );
    println!("| class | cycles |\n|---|---|");
    for (c, v) in &cal.class_cycles {
        println!("| {c:?} | {v} |");
    }
    println!("| accounted invocation | {} |", cal.invoke_cycles);
    println!(
        "\n| working set | strided read | strided write | dependent read (chase) |\n|---|---|---|---|"
    );
    for r in &cal.latency {
        println!(
            "| {} KiB | {} | {} | {} |",
            r.ws_bytes >> 10,
            r.read_cycles,
            r.write_cycles,
            r.chase_cycles
        );
    }
    // `SIDECORE_BENCH_ONLY=batched,chain` runs only the named sections (for iterating).
    let only = std::env::var("SIDECORE_BENCH_ONLY").ok();
    let run = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|x| x == name))
    };
    if run("tightness") {
        tightness(&cal);
    }
    if run("single") {
        four_ways(&cal);
    }
    if run("batched") {
        batched(&cal);
    }
    if run("accounting") {
        accounting_cost(&cal);
    }
    if run("chain") {
        chain(&cal);
    }
}
