//! Runs SE configurations given on the command line:
//! `explore ALG TH_LOW N_PEERS F_T TH_T F_R TH_R F_MR [S_B]` (thresholds as fractions of S_b).
use sidecore_sikker_rate::Algorithm;
use sidecore_sikker_sim::ratesim::*;
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let alg = Algorithm::parse(&a[0]).expect("algorithm");
    let f = |i: usize| a[i].parse::<f64>().expect("number");
    let s_b = if a.len() > 8 { f(8) } else { 2000.0 };
    let mut c = AlgoConfig::tuned(alg, s_b);
    c.se.th_low = f(1) * s_b;
    c.se.n_peers = f(2) as usize;
    c.se.f_t = f(3);
    c.se.th_t = f(4) * s_b;
    c.se.f_r = f(5);
    c.se.th_r = f(6) * s_b;
    c.se.f_mr = f(7);
    let r = simulate(&RateSimConfig::default(), c);
    println!(
        "{alg} {:?}: pen {:.0} L {:?} B {:?}",
        &a[1..],
        r.penalty,
        r.periods.iter().map(|p| p.p9999_ns).collect::<Vec<_>>(),
        r.periods
            .iter()
            .map(|p| (p.overhead * 100.0).round())
            .collect::<Vec<_>>()
    );
}
