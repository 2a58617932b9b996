//! §6.3.5 reproduced: plain EDF against `<EDF>++` on one seeded twenty-task workload,
//! printed beside the dissertation's figures.
//!
//! **The seed does not give the task set.** §6.3.5 says only "twenty tasks where
//! half of them are periodic", run "with various periods and constraints", and
//! reports averages. The set below is therefore ours, chosen to be plausible for
//! offcodes on a dedicated core and *not* tuned to the seed's numbers:
//!
//! * Ten periodic tasks with periods of 5–100 ms and WCETs of 0.4–2 ms
//!   (`Σ e/p = 0.52`), all released at 0 (the synchronous, worst case).
//! * Ten non-periodic tasks, each a loop of segments whose WCETs differ (mostly
//!   short, occasionally long — e.g. a classifier that now and then rebuilds a
//!   table), sleeping 0–30 ms between segments. The longest segment, 3.8 ms, is
//!   within the set's smallest gap (4.1 ms), so admission accepts the set. `A` and
//!   `B` are the two tasks whose response times are reported, as in Fig. 6.5.
//! * Every job and segment actually runs a uniform 40–100 % of its WCET
//!   ([`ExecModel::random_fraction`]`(0.4, seed)`), so slack also appears when a
//!   task finishes early, as §6.3.4 notes.
//!
//! Each run simulates 10 s. The same seed gives every scheduler the same draws
//! (the `k`-th job of a task takes the same time everywhere).

use std::fmt;

use serde::Serialize;

use crate::admission::{Infeasible, admit};
use crate::cyclic::{CyclicError, CyclicExecutive};
use crate::edf::{EdfPlusPlus, PlainEdf};
use crate::scheduler::Scheduler;
use crate::sim::{ExecModel, ResponseStats, SimError, SimReport, simulate};
use crate::task::{NonPeriodicTask, PeriodicTask, TaskSet};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;
/// Simulated time per run.
const HORIZON_NS: u64 = 10_000 * MS;
/// Lower end of the actual/WCET fraction.
const MIN_FRACTION: f64 = 0.4;

/// The twenty tasks of the reproduction (see the module documentation).
#[must_use]
pub fn section_6_3_5_tasks() -> TaskSet {
    let p = |name: &str, e_us: u64, p_ms: u64| PeriodicTask::new(name, e_us * US, p_ms * MS);
    let periodic = vec![
        p("rx-poll", 500, 5),
        p("tx-reap", 400, 5),
        p("timer-wheel", 600, 10),
        p("stats", 1_000, 10),
        p("watchdog", 500, 20),
        p("flow-age", 1_500, 25),
        p("route-sync", 1_000, 40),
        p("heartbeat", 500, 50),
        p("log-flush", 2_000, 50),
        p("rate-update", 2_000, 100),
    ];
    let np = |name: &str, prio: u8, seg_us: &[u64], sleep_ms: (u64, u64)| {
        NonPeriodicTask::new(name, seg_us.iter().map(|s| s * US).collect())
            .with_priority(prio)
            .with_sleep(sleep_ms.0 * MS, sleep_ms.1 * MS)
    };
    let non_periodic = vec![
        np("A", 2, &[400, 400, 400, 2_500], (2, 10)),
        np("B", 1, &[1_000, 3_000], (5, 15)),
        np("C", 0, &[200], (1, 5)),
        np("D", 0, &[800, 800, 3_500], (10, 30)),
        np("E", 1, &[1_500], (5, 20)),
        np("F", 0, &[300, 2_000], (3, 12)),
        np("G", 0, &[2_500, 500], (8, 25)),
        np("H", 0, &[600, 600, 600, 600, 3_800], (0, 5)),
        np("I", 1, &[1_200, 1_200, 2_800], (4, 16)),
        np("J", 2, &[100, 100, 1_000], (1, 4)),
    ];
    TaskSet::new(periodic, non_periodic)
}

/// The dissertation's §6.3.5 figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeedFigures {
    /// Idle fraction, EDF and `<EDF>++`.
    pub idle: (f64, f64),
    /// Utilisation, EDF and `<EDF>++` (the text prints 85.2 for 100 − 14.7).
    pub utilisation: (f64, f64),
    /// Task A mean and std, ms: EDF, `<EDF>++`.
    pub task_a_ms: ((f64, f64), (f64, f64)),
    /// Task B mean and std, ms: EDF, `<EDF>++`.
    pub task_b_ms: ((f64, f64), (f64, f64)),
    /// Periodic mean and std, ms: EDF, `<EDF>++`.
    pub periodic_ms: ((f64, f64), (f64, f64)),
}

/// §6.3.5's numbers.
pub const SEED_FIGURES: SeedFigures = SeedFigures {
    idle: (0.286, 0.147),
    utilisation: (0.714, 0.853),
    task_a_ms: ((22.86, 18.87), (10.83, 8.51)),
    task_b_ms: ((26.03, 2.54), (11.23, 5.78)),
    periodic_ms: ((1.33, 2.39), (1.37, 2.49)),
};

/// One scheduler's results on the workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Column {
    /// The scheduler.
    pub scheduler: String,
    /// Busy fraction.
    pub utilisation: f64,
    /// Idle fraction.
    pub idle: f64,
    /// Task A's segment response times.
    pub task_a: ResponseStats,
    /// Task B's segment response times.
    pub task_b: ResponseStats,
    /// All periodic jobs' response times.
    pub periodic: ResponseStats,
    /// Periodic deadline misses.
    pub deadline_misses: u64,
    /// Non-periodic segments completed.
    pub segments: u64,
}

impl Column {
    fn from_report(name: String, r: &SimReport) -> Self {
        let stats = |n: &str| r.task(n).map(|t| t.response).unwrap_or_default();
        Self {
            scheduler: name,
            utilisation: r.utilisation(),
            idle: r.idle_fraction(),
            task_a: stats("A"),
            task_b: stats("B"),
            periodic: r.periodic_response,
            deadline_misses: r.deadline_misses,
            segments: r.non_periodic.iter().map(|t| t.response.count).sum(),
        }
    }
}

/// The reproduction's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The seed of the execution-time and sleep draws.
    pub seed: u64,
    /// Simulated time per run, ns.
    pub horizon_ns: u64,
    /// `Σ e/p` of the periodic tasks.
    pub periodic_utilisation: f64,
    /// Plain EDF ([`PlainEdf::default`]).
    pub edf: Column,
    /// `<EDF>++`.
    pub edf_pp: Column,
    /// Other policies on the same workload: the cyclic executive and the
    /// work-conserving reading of plain EDF.
    pub others: Vec<Column>,
}

/// Why the reproduction could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExperimentError {
    /// The task set was not admitted.
    #[error(transparent)]
    Admission(#[from] Infeasible),
    /// A simulation failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// No cyclic-executive table.
    #[error(transparent)]
    Cyclic(#[from] CyclicError),
}

/// Runs [`section_6_3_5_tasks`] for 10 s under plain EDF, `<EDF>++`, the cyclic
/// executive and work-conserving EDF with actual times drawn from `seed`.
///
/// # Errors
/// [`ExperimentError`] if the set is not admitted or a run fails (neither happens
/// for the fixed set; the error exists so that nothing here panics).
pub fn section_6_3_5(seed: u64) -> Result<Report, ExperimentError> {
    let tasks = section_6_3_5_tasks();
    let admitted = admit(&tasks)?;
    let exec = ExecModel::random_fraction(MIN_FRACTION, seed);
    let run = |s: &dyn Scheduler, name: String| -> Result<Column, ExperimentError> {
        let r = simulate(&tasks, s, HORIZON_NS, exec)?;
        Ok(Column::from_report(name, &r))
    };
    let edf = PlainEdf::default();
    let pp = EdfPlusPlus::default();
    let ce = CyclicExecutive::build(&tasks)?;
    let ce_name = format!("cyclic executive ({} ms frames)", ce.frame_ns() / MS);
    let wc = PlainEdf::work_conserving();
    Ok(Report {
        seed,
        horizon_ns: HORIZON_NS,
        periodic_utilisation: admitted.utilisation,
        edf: run(&edf, edf.name().into())?,
        edf_pp: run(&pp, pp.name().into())?,
        others: vec![run(&ce, ce_name)?, run(&wc, wc.name().into())?],
    })
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn ms(s: &ResponseStats) -> String {
    format!("{:.2} ({:.2})", s.mean_ns / 1e6, s.std_ns / 1e6)
}

fn pair(x: (f64, f64)) -> String {
    format!("{:.2} ({:.2})", x.0, x.1)
}

impl Report {
    /// The comparison table's rows: label, then seed EDF, seed `<EDF>++`, ours EDF,
    /// ours `<EDF>++`.
    fn rows(&self) -> Vec<(&'static str, [String; 4])> {
        let s = SEED_FIGURES;
        let (e, p) = (&self.edf, &self.edf_pp);
        let dash = || String::from("-");
        vec![
            (
                "",
                [
                    "seed: EDF".into(),
                    "seed: <EDF>++".into(),
                    "ours: EDF".into(),
                    "ours: <EDF>++".into(),
                ],
            ),
            (
                "idle",
                [pct(s.idle.0), pct(s.idle.1), pct(e.idle), pct(p.idle)],
            ),
            (
                "utilisation (busy)",
                [
                    pct(s.utilisation.0),
                    format!("{} [1]", pct(s.utilisation.1)),
                    pct(e.utilisation),
                    pct(p.utilisation),
                ],
            ),
            (
                "task A response, mean (std) ms",
                [
                    pair(s.task_a_ms.0),
                    pair(s.task_a_ms.1),
                    ms(&e.task_a),
                    ms(&p.task_a),
                ],
            ),
            (
                "task B response, mean (std) ms",
                [
                    pair(s.task_b_ms.0),
                    pair(s.task_b_ms.1),
                    ms(&e.task_b),
                    ms(&p.task_b),
                ],
            ),
            (
                "periodic response, mean (std) ms",
                [
                    pair(s.periodic_ms.0),
                    pair(s.periodic_ms.1),
                    ms(&e.periodic),
                    ms(&p.periodic),
                ],
            ),
            (
                "deadline misses",
                [
                    dash(),
                    dash(),
                    e.deadline_misses.to_string(),
                    p.deadline_misses.to_string(),
                ],
            ),
            (
                "non-periodic segments completed",
                [
                    dash(),
                    dash(),
                    e.segments.to_string(),
                    p.segments.to_string(),
                ],
            ),
        ]
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "§6.3.5 <EDF>++ evaluation, reproduced: seed {}, {} s simulated, 10 periodic + 10 non-periodic tasks,",
            self.seed,
            self.horizon_ns / 1_000_000_000
        )?;
        writeln!(
            f,
            "periodic Σe/p = {:.3}, actual times uniform in [{:.0} %, 100 %] of WCET (task set: ours, the seed gives none)\n",
            self.periodic_utilisation,
            MIN_FRACTION * 100.0
        )?;
        for (what, c) in self.rows() {
            writeln!(
                f,
                "{what:<34}|{:>15} |{:>15} |{:>15} |{:>15}",
                c[0], c[1], c[2], c[3]
            )?;
        }
        writeln!(f, "[1] the text prints 85.2 %, but 100 - 14.7 = 85.3.\n")?;
        writeln!(f, "Other policies on the same workload:")?;
        for c in &self.others {
            writeln!(
                f,
                "  {:<38} idle {:>7}, A {}, B {}, periodic {} ms, misses {}, segments {}",
                c.scheduler,
                pct(c.idle),
                ms(&c.task_a),
                ms(&c.task_b),
                ms(&c.periodic),
                c.deadline_misses,
                c.segments
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reproduction_runs_admitted_and_without_misses() {
        let tasks = section_6_3_5_tasks();
        assert_eq!((tasks.periodic.len(), tasks.non_periodic.len()), (10, 10));
        let admitted = admit(&tasks).unwrap();
        assert!((admitted.utilisation - 0.52).abs() < 1e-9);
        let r = section_6_3_5(1).unwrap();
        assert_eq!(r.edf.deadline_misses, 0);
        assert_eq!(r.edf_pp.deadline_misses, 0);
        assert!(r.others.iter().all(|c| c.deadline_misses == 0));
        // The theorem behind the seed's "periodic response unchanged": both run the
        // periodic jobs exactly as non-preemptive EDF on the same draws.
        assert_eq!(r.edf.periodic, r.edf_pp.periodic);
        // The ticket lets <EDF>++ fill gaps plain EDF must leave idle.
        assert!(r.edf_pp.idle < r.edf.idle);
        assert!(r.edf_pp.task_a.mean_ns < r.edf.task_a.mean_ns);
        let table = r.to_string();
        assert!(table.contains("task A response"), "{table}");
        assert_eq!(section_6_3_5(1).unwrap(), r, "deterministic for a seed");
    }
}
