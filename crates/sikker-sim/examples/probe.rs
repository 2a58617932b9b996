//! Scratch probe of check cost (not part of the product).
use sidecore_sikker_sim::sikkersim::*;
use std::time::Instant;
fn main() {
    let hosts: u32 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(4096);
    let m = build_host(ModelParams::table_4_1(hosts), 0, 1);
    let checks = draw_checks(&m, Pattern::UR, &PatternKnobs::default(), 1_000_000, 5);
    let same = vec![checks[0]; 1_000_000];
    for (name, c) in [("same", &same), ("ur", &checks)] {
        for _ in 0..3 {
            let t0 = Instant::now();
            let mut ok = 0u64;
            for &(li, t) in c.iter() { if m.tables.check(li, t).is_ok() { ok += 1; } }
            let indep = t0.elapsed().as_nanos() as f64 / c.len() as f64;
            let z = std::hint::black_box(0u32);
            let mut dep = 0u32;
            let t0 = Instant::now();
            for &(li, t) in c.iter() { if let Ok((a, _)) = m.tables.check(li | (dep & z), t) { dep = a.0; } }
            let chain = t0.elapsed().as_nanos() as f64 / c.len() as f64;
            println!("{name}: indep {indep:.1} ns chain {chain:.1} ns ok {ok} {dep}");
        }
    }
}
#[allow(dead_code)]
fn _unused() {}
