//! `ticker`: a periodic offcode for a shared core (HYDRA §6.3). Each turn is
//! one job: it busy-works `work_us` (standing in for a real periodic task's
//! computation), and publishes how many jobs ran, the gaps between their
//! starts, and how late the latest started after its period's mark.

use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_offcode::{InitCx, Metric, Offcode, OffcodeError, Progress, RunCx, parse_params};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Busy work per job, µs.
    #[serde(default = "default_work")]
    work_us: u64,
    /// Stop after this many jobs; 0 = until stopped.
    #[serde(default)]
    jobs: u64,
}

fn default_work() -> u64 {
    50
}

/// The ticker offcode.
pub struct Ticker {
    work: Duration,
    limit: u64,
    n: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    jobs: Metric,
    min_gap_us: Metric,
    max_gap_us: Metric,
}

impl Ticker {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: Params = parse_params(params)?;
        if p.work_us > 10_000_000 {
            return Err(OffcodeError::Params(
                "`work_us` must be at most 10 s".into(),
            ));
        }
        Ok(Ticker {
            work: Duration::from_micros(p.work_us),
            limit: p.jobs,
            n: 0,
            first: None,
            last: None,
            jobs: Metric::default(),
            min_gap_us: Metric::default(),
            max_gap_us: Metric::default(),
        })
    }
}

impl Offcode for Ticker {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.jobs = cx.metric("jobs");
        self.min_gap_us = cx.metric("min_gap_us");
        self.max_gap_us = cx.metric("max_gap_us");
        self.min_gap_us.set(u64::MAX);
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let t0 = Instant::now();
        self.first.get_or_insert(t0);
        if let Some(prev) = self.last {
            let gap = u64::try_from(t0.duration_since(prev).as_micros()).unwrap_or(u64::MAX);
            self.min_gap_us.set(self.min_gap_us.get().min(gap));
            self.max_gap_us.set(self.max_gap_us.get().max(gap));
        }
        self.last = Some(t0);
        while t0.elapsed() < self.work {
            std::hint::spin_loop();
        }
        self.n += 1;
        self.jobs.set(self.n);
        if self.limit != 0 && self.n >= self.limit {
            return Ok(Progress::Done);
        }
        Ok(Progress::Busy)
    }
}
