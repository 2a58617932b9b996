//! Runs the RateSim parameter sweep for the named algorithms and prints the best five
//! of each (`sidecore sim rate --sweep` prints the same, plus JSON).
use sidecore_sikker_rate::Algorithm;
use sidecore_sikker_sim::ratesim::*;
fn main() {
    let cfg = RateSimConfig::default();
    for a in std::env::args()
        .skip(1)
        .filter_map(|x| Algorithm::parse(&x))
    {
        let grid = sweep_grid(a, 2000.0);
        let t = std::time::Instant::now();
        let mut rs = run_many(&cfg, &grid, 2);
        rs.sort_by(|x, y| x.penalty.total_cmp(&y.penalty));
        println!(
            "{a}: {} runs in {:.0}s",
            grid.len(),
            t.elapsed().as_secs_f64()
        );
        for r in rs.iter().take(5) {
            println!(
                "  pen {:>8.1} L {:>6.0} B {:>7.1} Gbps per-period L {:?} B {:?} se {:?} credits {:?}",
                r.penalty,
                r.latency_p9999_ns,
                r.overhead_gbps,
                r.periods.iter().map(|p| p.p9999_ns).collect::<Vec<_>>(),
                r.periods
                    .iter()
                    .map(|p| (p.overhead * 100.0).round())
                    .collect::<Vec<_>>(),
                r.algo.se,
                r.algo.credits
            );
        }
    }
}
