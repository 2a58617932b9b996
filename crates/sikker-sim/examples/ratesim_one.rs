//! Runs one RateSim configuration per algorithm at full scale and prints its figures
//! (a quick check; `sidecore sim rate` is the real command).
use sidecore_sikker_rate::Algorithm;
use sidecore_sikker_sim::ratesim::*;
use std::time::Instant;
fn main() {
    let cfg = RateSimConfig::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    for a in Algorithm::ALL {
        if !args.is_empty() && !args.iter().any(|x| Algorithm::parse(x) == Some(a)) {
            continue;
        }
        let t = Instant::now();
        let r = simulate(&cfg, AlgoConfig::tuned(a, 2000.0));
        println!(
            "{:7} L {:>8.0} ns  B {:>8.1} Gbps  pen {:>10.1}  per-period L {:?} B {:?}  rate≤{:.3}  {} ev {:.1}s",
            a.name(),
            r.latency_p9999_ns,
            r.overhead_mean_gbps,
            r.penalty,
            r.periods.iter().map(|p| p.p9999_ns).collect::<Vec<_>>(),
            r.periods
                .iter()
                .map(|p| (p.overhead * 100.0).round())
                .collect::<Vec<_>>(),
            r.max_rate_sum,
            r.events,
            t.elapsed().as_secs_f64()
        );
    }
}
