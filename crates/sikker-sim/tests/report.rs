//! The simulators' library entry points as `sidecore sim` drives them: small real
//! runs whose reports are checked field by field, and each option's range error.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use sidecore_sikker_rate::Algorithm;
use sidecore_sikker_sim::SimError;
use sidecore_sikker_sim::ratesim::RateSimConfig;
use sidecore_sikker_sim::report::{RateRunOptions, rate_report};
use sidecore_sikker_sim::sikkersim::{self, Pattern, PatternKnobs, SikkerSimOptions};

/// 40 senders, R_a = 20: the shape of §8.1 at a size a debug build runs in a second.
fn small() -> RateSimConfig {
    RateSimConfig {
        senders: 40,
        receivers: 30,
        r_a: 20.0,
        warmup: 2_000.0,
        interval: 8_000.0,
        drain: 5_000.0,
        ..Default::default()
    }
}

fn options(algorithms: &[Algorithm], seeds: &[u64]) -> RateRunOptions {
    RateRunOptions {
        base: small(),
        seeds: seeds.to_vec(),
        algorithms: algorithms.to_vec(),
        buckets: vec![1500.0, 2000.0],
        sweep_seeds: None,
        one_ms: false,
        exact_formulas: true,
        threads: 2,
    }
}

#[test]
fn rate_report_runs_every_algorithm_under_every_seed() {
    let o = options(&[Algorithm::Ne, Algorithm::SeTre], &[1, 2, 3]);
    let r = rate_report(&o).unwrap();
    assert_eq!(r.seeds, [1, 2, 3]);
    assert_eq!(r.config.seed, 1, "the report's config is the first seed's");
    assert_eq!(r.table_8_1.len(), 2);
    let (ne, tre) = (&r.table_8_1[0], &r.table_8_1[1]);
    assert_eq!(ne.algo.alg, Algorithm::Ne);
    assert_eq!(tre.algo.alg, Algorithm::SeTre);
    for row in &r.table_8_1 {
        assert_eq!(row.runs.len(), 3, "one run per seed");
        for run in &row.runs {
            assert_eq!(run.algo.alg, row.algo.alg);
            assert!(run.events > 0);
            assert!(run.max_rate_sum <= small().r_a + 1e-6, "rate conserved");
            assert_eq!(run.periods.len(), 3);
        }
    }
    // NE sends no control message; SE-TRE exchanges tokens and rate.
    assert!(ne.runs.iter().all(|x| x.overhead_mean_gbps == 0.0));
    assert!(tre.runs.iter().all(|x| x.overhead_mean_gbps > 0.0));
    // The seeds really differ: SE-TRE's exchanges are randomised.
    assert!(
        tre.runs[0].events != tre.runs[1].events || tre.runs[1].events != tre.runs[2].events,
        "three seeds, three identical runs"
    );
    // The mean is over the seeds.
    let m = tre.mean(|x| x.penalty);
    let expect = tre.runs.iter().map(|x| x.penalty).sum::<f64>() / 3.0;
    assert!((m - expect).abs() < 1e-9);
    // Table 8.2: SE-TRE per bucket, thresholds scaled, Eq. 8.1 burst in proportion.
    assert_eq!(r.table_8_2.len(), 2);
    let (b15, b20) = (&r.table_8_2[0], &r.table_8_2[1]);
    assert_eq!(b15.algo.se.bucket_size, 1500.0);
    assert_eq!(b20.algo.se.bucket_size, 2000.0);
    assert!((b15.algo.se.th_low / b20.algo.se.th_low - 0.75).abs() < 1e-9);
    assert!((b15.runs[0].max_burst_bytes / b20.runs[0].max_burst_bytes - 0.75).abs() < 1e-9);
    // S_b = 2000 of Table 8.2 is Table 8.1's SE-TRE run.
    assert_eq!(b20.runs[0].penalty, tre.runs[0].penalty);
    assert!(r.one_ms.is_empty() && r.sweep.is_empty());
}

#[test]
fn without_se_tre_there_is_no_table_8_2() {
    let r = rate_report(&options(&[Algorithm::SeTe], &[1])).unwrap();
    assert!(r.table_8_2.is_empty());
    assert_eq!(r.table_8_1.len(), 1);
}

#[test]
fn what_if_reaches_every_se_run() {
    let mut o = options(&[Algorithm::SeRe, Algorithm::SeTre], &[1]);
    o.exact_formulas = false;
    let r = rate_report(&o).unwrap();
    assert!(!r.exact_formulas);
    for row in &r.table_8_1 {
        assert_eq!(row.algo.se.keep_used, Some(2000.0), "{}", row.algo.alg);
    }
    for row in &r.table_8_2 {
        assert_eq!(row.algo.se.keep_used, Some(row.algo.se.bucket_size));
    }
    // The option changes what SE-RE does (it gives only rate).
    let plain = rate_report(&options(&[Algorithm::SeRe], &[1])).unwrap();
    assert_ne!(
        plain.table_8_1[0].runs[0].events,
        r.table_8_1[0].runs[0].events
    );
}

#[test]
fn sweep_picks_the_configuration_the_tables_use() {
    let mut o = options(&[Algorithm::Re], &[1]);
    o.sweep_seeds = Some(vec![1]);
    o.buckets.clear();
    let r = rate_report(&o).unwrap();
    assert_eq!(r.sweep.len(), 1);
    let s = &r.sweep[0];
    assert_eq!(s.algorithm, Algorithm::Re);
    assert_eq!(s.configurations, 5, "RE's grid: five credit counts");
    assert!(s.best.windows(2).all(|w| w[0].penalty <= w[1].penalty));
    assert_eq!(r.table_8_1[0].algo.credits, s.best[0].algo.credits);
    assert_eq!(r.table_8_1[0].runs[0].penalty, s.best[0].penalty);
}

#[test]
fn one_ms_runs_the_exchange_algorithms_only() {
    let mut o = options(&[Algorithm::Ne, Algorithm::SeTe], &[1]);
    o.one_ms = true;
    o.base.drain = 1_000.0;
    let r = rate_report(&o).unwrap();
    assert_eq!(r.one_ms.len(), 1);
    assert_eq!(r.one_ms[0].algo.alg, Algorithm::SeTe);
}

#[test]
fn rate_options_out_of_range_say_which() {
    let e = |f: &dyn Fn(&mut RateRunOptions)| {
        let mut o = options(&[Algorithm::Ne], &[1]);
        f(&mut o);
        let err = rate_report(&o).unwrap_err();
        assert!(matches!(err, SimError::BadOption { .. }), "{err:?}");
        err.to_string()
    };
    assert!(e(&|o| o.base.interval = 10.0).contains("--interval: must be at least 1000"));
    assert!(e(&|o| o.base.interval = f64::NAN).contains("--interval"));
    assert!(
        e(&|o| o.buckets = vec![50.0]).contains("--buckets: 50 cannot hold the largest packet")
    );
    assert!(e(&|o| o.sweep_seeds = Some(vec![])).contains("--sweep-seeds: give at least one seed"));
    assert!(e(&|o| o.seeds.clear()).contains("--seeds: give at least one seed"));
    assert!(e(&|o| o.algorithms.clear()).contains("--algorithms"));
    assert!(e(&|o| o.base.ctrl_size = 0.0).contains("--ctrl-phits: must be a positive number"));
    assert!(e(&|o| o.threads = 0).contains("--threads: must be at least 1"));
}

fn sikker_options() -> SikkerSimOptions {
    SikkerSimOptions {
        hosts: vec![1024],
        checks: 5000,
        seed: 1,
        patterns: Pattern::ALL.to_vec(),
        knobs: PatternKnobs::default(),
        huge_pages: false,
        batch: 1,
        realtime: false,
        pause: std::time::Duration::ZERO,
        control: true,
        // A small Memory control: the default 256 MiB takes seconds to build in debug.
        memory_bytes: 4 << 20,
    }
}

#[test]
fn sikker_run_reports_every_pattern_with_no_denial() {
    let rows = sikkersim::run(&sikker_options()).unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.params.hosts, 1024);
    assert!(r.formula_entries > 0 && r.formula_bytes == 4 * r.formula_entries);
    assert!(r.tables.process_entries + r.tables.domain_entries > 0);
    let pats: Vec<Pattern> = r.latency.iter().map(|l| l.pattern).collect();
    for p in Pattern::ALL
        .into_iter()
        .chain([Pattern::Cached, Pattern::Memory])
    {
        assert!(pats.contains(&p), "{p:?} missing from {pats:?}");
    }
    for l in &r.latency {
        assert_eq!(l.checks, 5000, "{:?}", l.pattern);
        assert_eq!(
            l.denied, 0,
            "{:?}: every check is drawn from the permissions",
            l.pattern
        );
        assert!(l.chain_mean_ns > 0.0, "{:?}", l.pattern);
        assert!(l.p99_ns <= l.p999_ns && l.p999_ns <= l.p9999_ns && l.p9999_ns <= l.max_ns);
    }
}

#[test]
fn sikker_options_out_of_range_say_which() {
    let e = |f: &dyn Fn(&mut SikkerSimOptions)| {
        let mut o = sikker_options();
        f(&mut o);
        sikkersim::run(&o).unwrap_err().to_string()
    };
    assert!(e(&|o| o.hosts = vec![1000]).contains("--hosts: 1000 is not a power of two"));
    assert!(
        e(&|o| o.hosts = vec![16]).contains("--hosts: 16 is not a power of two of at least 32")
    );
    assert!(e(&|o| o.checks = 0).contains("--checks: must be at least 1"));
    assert!(e(&|o| o.batch = 0).contains("--batch: must be between 1 and --checks"));
    assert!(e(&|o| o.batch = 6000).contains("--batch: must be between 1 and --checks"));
    assert!(e(&|o| o.knobs.sigma_frac = -1.0).contains("--sigma: must be a positive number"));
    assert!(e(&|o| o.memory_bytes = 0).contains("--memory-mib: must be between 1 and 16384 MiB"));
}
