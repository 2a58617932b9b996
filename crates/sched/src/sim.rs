//! The reference simulation: a deterministic discrete-event run of one core under a
//! [`Scheduler`], for checking admission and comparing policies.
//!
//! Time is integer nanoseconds. Periodic task `i` releases job `k` at `s_i + k·p_i`
//! (deadline one period later) for every release before the horizon. A
//! non-periodic task is ready from its start time; each time it runs one segment
//! it yields, sleeps for a time drawn from its [`Sleep`](crate::Sleep) range and is
//! ready again (a closed loop: faster service means more segments get done). The
//! scheduler is asked for a decision whenever the core is free: at a completion,
//! and while idle at its timeout or at any release or readiness, whichever is
//! first (a polling dispatcher notices events).
//!
//! Each job or segment takes its actual execution time: its WCET under
//! [`ExecModel::WCET`], or a uniform draw in `[⌈f·e⌉, e]` under
//! [`ExecModel::random_fraction`]. Draws come from ChaCha8 seeded by the model's
//! seed, one stream per task and purpose, so the `k`-th job of a task takes the
//! same time under every scheduler (the same seeded workload); no OS entropy.
//!
//! Non-periodic segments start only before the horizon; periodic jobs released
//! before it are run to completion (or until one period past the horizon), so
//! every such job is judged. Busy and idle time are counted within `[0, horizon)`.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::scheduler::{CoreView, Decision, Job, NonPeriodicState, PeriodicState, Scheduler};
use crate::task::{TaskError, TaskId, TaskSet};

/// How long a job actually runs, relative to its WCET.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ExecModel {
    /// Actual time is uniform in `[⌈min_fraction·e⌉, e]`; `1.0` means always `e`.
    /// Must be in `(0, 1]`.
    pub min_fraction: f64,
    /// Seed for the execution-time draws and the non-periodic sleeps.
    pub seed: u64,
}

impl ExecModel {
    /// Every job takes its WCET (sleeps are still drawn, from seed 0).
    pub const WCET: Self = Self {
        min_fraction: 1.0,
        seed: 0,
    };

    /// Actual times uniform in `[⌈min_fraction·e⌉, e]`, seeded.
    #[must_use]
    pub fn random_fraction(min_fraction: f64, seed: u64) -> Self {
        Self { min_fraction, seed }
    }

    fn actual_ns(&self, wcet_ns: u64, rng: &mut ChaCha8Rng) -> u64 {
        if self.min_fraction >= 1.0 {
            return wcet_ns;
        }
        let lo = ((wcet_ns as f64) * self.min_fraction).ceil() as u64;
        let lo = lo.clamp(1, wcet_ns.max(1));
        if lo >= wcet_ns {
            wcet_ns
        } else {
            rng.random_range(lo..=wcet_ns)
        }
    }
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// Bad task parameters.
    #[error("invalid tasks: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidTasks(Vec<TaskError>),
    /// `min_fraction` outside `(0, 1]`.
    #[error("execution model: min_fraction {min_fraction} is not in (0, 1]")]
    BadExecModel {
        /// The offending fraction.
        min_fraction: f64,
    },
    /// A zero horizon has nothing to measure.
    #[error("horizon is 0 ns")]
    ZeroHorizon,
    /// The scheduler chose something that cannot run.
    #[error("{scheduler} at {at_ns} ns decided {decision:?}: {reason}")]
    BadDecision {
        /// The scheduler's name.
        scheduler: &'static str,
        /// When.
        at_ns: u64,
        /// What it decided.
        decision: Decision,
        /// Why that is impossible.
        reason: &'static str,
    },
}

/// Response-time statistics (population standard deviation).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct ResponseStats {
    /// Completed jobs or segments.
    pub count: u64,
    /// Mean response, ns (0 without samples).
    pub mean_ns: f64,
    /// Standard deviation, ns.
    pub std_ns: f64,
    /// Largest response, ns.
    pub max_ns: u64,
}

/// Exact running sums behind [`ResponseStats`].
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    count: u64,
    sum: u128,
    sumsq: u128,
    max: u64,
}

impl Acc {
    fn add(&mut self, x: u64) {
        self.count += 1;
        self.sum += u128::from(x);
        self.sumsq = self.sumsq.saturating_add(u128::from(x) * u128::from(x));
        self.max = self.max.max(x);
    }

    fn merge(mut self, o: &Self) -> Self {
        self.count += o.count;
        self.sum += o.sum;
        self.sumsq = self.sumsq.saturating_add(o.sumsq);
        self.max = self.max.max(o.max);
        self
    }

    fn stats(&self) -> ResponseStats {
        if self.count == 0 {
            return ResponseStats::default();
        }
        let n = u128::from(self.count);
        let mean = self.sum as f64 / n as f64;
        // n²·var = n·Σx² − (Σx)², exact when it fits.
        let var = n
            .checked_mul(self.sumsq)
            .zip(self.sum.checked_mul(self.sum))
            .map_or_else(
                || self.sumsq as f64 / n as f64 - mean * mean,
                |(a, b)| a.saturating_sub(b) as f64 / (n as f64 * n as f64),
            );
        ResponseStats {
            count: self.count,
            mean_ns: mean,
            std_ns: var.max(0.0).sqrt(),
            max_ns: self.max,
        }
    }
}

/// One task's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskStats {
    /// The task.
    pub name: String,
    /// Release → completion (periodic jobs) or ready → completion (segments).
    pub response: ResponseStats,
    /// Deadline misses (periodic tasks only).
    pub deadline_misses: u64,
}

/// A periodic job that finished after its deadline (or never finished).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadlineMiss {
    /// The task.
    pub task: String,
    /// Release, ns.
    pub release_ns: u64,
    /// Deadline, ns.
    pub deadline_ns: u64,
    /// Completion, ns, or `None` if it never completed.
    pub finish_ns: Option<u64>,
}

/// What a simulation recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// The scheduler's name.
    pub scheduler: &'static str,
    /// The horizon, ns.
    pub horizon_ns: u64,
    /// Time the core ran a task within `[0, horizon)`, ns.
    pub busy_ns: u64,
    /// `horizon − busy`, ns.
    pub idle_ns: u64,
    /// Per periodic task, in task order.
    pub periodic: Vec<TaskStats>,
    /// Per non-periodic task, in task order.
    pub non_periodic: Vec<TaskStats>,
    /// All periodic jobs pooled.
    pub periodic_response: ResponseStats,
    /// Total deadline misses.
    pub deadline_misses: u64,
    /// The first (up to 16) misses.
    pub first_misses: Vec<DeadlineMiss>,
    /// Non-periodic segments started with a ticket longer than the time to the next
    /// periodic release: a segment that could delay a release.
    pub slack_overruns: u64,
    /// How many times the scheduler was asked.
    pub decisions: u64,
}

impl SimReport {
    /// Busy fraction of the horizon.
    #[must_use]
    pub fn utilisation(&self) -> f64 {
        self.busy_ns as f64 / self.horizon_ns.max(1) as f64
    }

    /// Idle fraction of the horizon.
    #[must_use]
    pub fn idle_fraction(&self) -> f64 {
        self.idle_ns as f64 / self.horizon_ns.max(1) as f64
    }

    /// A task's results by name.
    #[must_use]
    pub fn task(&self, name: &str) -> Option<&TaskStats> {
        self.periodic
            .iter()
            .chain(&self.non_periodic)
            .find(|t| t.name == name)
    }
}

/// How many misses [`SimReport::first_misses`] keeps.
const KEPT_MISSES: usize = 16;

struct PeriodicRt {
    next_k: u64,
    next_release: Option<u64>,
    pending: VecDeque<Job>,
    rng: ChaCha8Rng,
    acc: Acc,
    misses: u64,
}

struct NonPeriodicRt {
    ready_at: Option<u64>,
    ready_since: Option<u64>,
    segment: u64,
    exec_rng: ChaCha8Rng,
    sleep_rng: ChaCha8Rng,
    acc: Acc,
}

fn stream(seed: u64, kind: u64, index: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream((kind << 32) | index as u64);
    rng
}

struct Sim<'a> {
    tasks: &'a TaskSet,
    horizon: u64,
    exec: ExecModel,
    periodic: Vec<PeriodicRt>,
    np: Vec<NonPeriodicRt>,
    busy: u64,
    misses: u64,
    first_misses: Vec<DeadlineMiss>,
    overruns: u64,
    decisions: u64,
    pview: Vec<PeriodicState>,
    npview: Vec<NonPeriodicState>,
}

/// Runs `tasks` on one core under `scheduler` until `horizon_ns`.
///
/// # Errors
/// [`SimError`] for invalid tasks, a bad execution model, a zero horizon, or a
/// decision that cannot be carried out (running a task with nothing to run).
pub fn simulate(
    tasks: &TaskSet,
    scheduler: &dyn Scheduler,
    horizon_ns: u64,
    exec: ExecModel,
) -> Result<SimReport, SimError> {
    tasks.validate().map_err(SimError::InvalidTasks)?;
    if !(exec.min_fraction > 0.0 && exec.min_fraction <= 1.0) {
        return Err(SimError::BadExecModel {
            min_fraction: exec.min_fraction,
        });
    }
    if horizon_ns == 0 {
        return Err(SimError::ZeroHorizon);
    }
    let mut sim = Sim::new(tasks, horizon_ns, exec);
    let max_period = tasks
        .periodic
        .iter()
        .map(|t| t.period_ns)
        .max()
        .unwrap_or(0);
    let drain_end = horizon_ns.saturating_add(max_period);
    let mut t = 0u64;
    loop {
        sim.release(t);
        let draining = t >= horizon_ns;
        let idle_core = sim.periodic.iter().all(|p| p.pending.is_empty());
        if (draining && (t > drain_end || idle_core)) || t == u64::MAX {
            break;
        }
        sim.refresh_view(draining);
        sim.decisions += 1;
        let view = CoreView {
            tasks,
            periodic: &sim.pview,
            non_periodic: &sim.npview,
        };
        let decision = scheduler.decide(t, &view);
        let bad = |reason| SimError::BadDecision {
            scheduler: scheduler.name(),
            at_ns: t,
            decision,
            reason,
        };
        t = match decision {
            Decision::Run(TaskId::Periodic(i)) => sim
                .run_periodic(i, t)
                .ok_or_else(|| bad("the task has no released, unfinished job"))?,
            Decision::Run(TaskId::NonPeriodic(j)) => (!draining)
                .then(|| sim.run_non_periodic(j, t))
                .flatten()
                .ok_or_else(|| bad("the non-periodic task is not ready"))?,
            Decision::Idle { until_ns } if until_ns <= t => {
                return Err(bad("idle until a time not after now"));
            }
            Decision::Idle { until_ns } => {
                let limit = if draining {
                    drain_end.saturating_add(1)
                } else {
                    horizon_ns
                };
                until_ns.min(sim.next_event()).min(limit)
            }
        };
    }
    Ok(sim.finish(scheduler.name()))
}

impl<'a> Sim<'a> {
    fn new(tasks: &'a TaskSet, horizon: u64, exec: ExecModel) -> Self {
        let periodic = tasks
            .periodic
            .iter()
            .enumerate()
            .map(|(i, t)| PeriodicRt {
                next_k: 0,
                next_release: Some(t.start_ns),
                pending: VecDeque::new(),
                rng: stream(exec.seed, 1, i),
                acc: Acc::default(),
                misses: 0,
            })
            .collect();
        let np = tasks
            .non_periodic
            .iter()
            .enumerate()
            .map(|(j, t)| NonPeriodicRt {
                ready_at: Some(t.start_ns),
                ready_since: None,
                segment: 0,
                exec_rng: stream(exec.seed, 2, j),
                sleep_rng: stream(exec.seed, 3, j),
                acc: Acc::default(),
            })
            .collect();
        Self {
            tasks,
            horizon,
            exec,
            periodic,
            np,
            busy: 0,
            misses: 0,
            first_misses: Vec::new(),
            overruns: 0,
            decisions: 0,
            pview: Vec::new(),
            npview: Vec::new(),
        }
    }

    /// Releases every periodic job and readies every non-periodic task due by `t`
    /// (and before the horizon).
    fn release(&mut self, t: u64) {
        for (rt, task) in self.periodic.iter_mut().zip(&self.tasks.periodic) {
            while let Some(r) = rt.next_release.filter(|&r| r <= t && r < self.horizon) {
                rt.pending.push_back(Job {
                    release_ns: r,
                    deadline_ns: r.saturating_add(task.period_ns),
                });
                rt.next_k += 1;
                rt.next_release = task.release_ns(rt.next_k);
            }
        }
        for rt in &mut self.np {
            if let Some(r) = rt.ready_at.filter(|&r| r <= t && r < self.horizon) {
                rt.ready_since = Some(r);
                rt.ready_at = None;
            }
        }
    }

    fn refresh_view(&mut self, draining: bool) {
        self.pview.clear();
        self.pview
            .extend(self.periodic.iter().map(|rt| PeriodicState {
                oldest_pending: rt.pending.front().copied(),
                pending_jobs: u32::try_from(rt.pending.len()).unwrap_or(u32::MAX),
                next_release_ns: rt.next_release.unwrap_or(u64::MAX),
            }));
        self.npview.clear();
        self.npview.extend(
            self.np
                .iter()
                .zip(&self.tasks.non_periodic)
                .map(|(rt, task)| NonPeriodicState {
                    ready_since_ns: rt.ready_since.filter(|_| !draining),
                    ticket_ns: task.ticket_ns(rt.segment),
                }),
        );
    }

    /// The next release or readiness before the horizon, or `u64::MAX`.
    fn next_event(&self) -> u64 {
        let releases = self.periodic.iter().filter_map(|rt| rt.next_release);
        let readies = self.np.iter().filter_map(|rt| rt.ready_at);
        releases
            .chain(readies)
            .filter(|&x| x < self.horizon)
            .min()
            .unwrap_or(u64::MAX)
    }

    fn account_busy(&mut self, start: u64, end: u64) {
        self.busy += end
            .min(self.horizon)
            .saturating_sub(start.min(self.horizon));
    }

    /// Runs task `i`'s oldest pending job from `t`; its completion time.
    fn run_periodic(&mut self, i: usize, t: u64) -> Option<u64> {
        let task = self.tasks.periodic.get(i)?;
        let rt = self.periodic.get_mut(i)?;
        let job = rt.pending.pop_front()?;
        let end = t.saturating_add(self.exec.actual_ns(task.wcet_ns, &mut rt.rng));
        rt.acc.add(end - job.release_ns);
        if end > job.deadline_ns {
            rt.misses += 1;
            self.record_miss(i, job, Some(end));
        }
        self.account_busy(t, end);
        Some(end)
    }

    fn record_miss(&mut self, i: usize, job: Job, finish_ns: Option<u64>) {
        self.misses += 1;
        if self.first_misses.len() < KEPT_MISSES {
            self.first_misses.push(DeadlineMiss {
                task: self
                    .tasks
                    .periodic
                    .get(i)
                    .map(|t| t.name.clone())
                    .unwrap_or_default(),
                release_ns: job.release_ns,
                deadline_ns: job.deadline_ns,
                finish_ns,
            });
        }
    }

    /// Runs task `j`'s next segment from `t`; its completion time.
    fn run_non_periodic(&mut self, j: usize, t: u64) -> Option<u64> {
        let task = self.tasks.non_periodic.get(j)?;
        let next_release = self
            .periodic
            .iter()
            .filter_map(|rt| rt.next_release)
            .min()
            .unwrap_or(u64::MAX);
        let rt = self.np.get_mut(j)?;
        let since = rt.ready_since.take()?;
        let ticket = task.ticket_ns(rt.segment);
        if ticket > next_release.saturating_sub(t) {
            self.overruns += 1;
        }
        let end = t.saturating_add(self.exec.actual_ns(ticket, &mut rt.exec_rng));
        rt.acc.add(end - since);
        rt.segment += 1;
        let sleep = if task.sleep.min_ns >= task.sleep.max_ns {
            task.sleep.min_ns
        } else {
            rt.sleep_rng
                .random_range(task.sleep.min_ns..=task.sleep.max_ns)
        };
        rt.ready_at = Some(end.saturating_add(sleep));
        self.account_busy(t, end);
        Some(end)
    }

    fn finish(mut self, scheduler: &'static str) -> SimReport {
        for i in 0..self.periodic.len() {
            while let Some(job) = self.periodic[i].pending.pop_front() {
                self.periodic[i].misses += 1;
                self.record_miss(i, job, None);
            }
        }
        let stats = |name: &str, acc: &Acc, misses| TaskStats {
            name: name.to_owned(),
            response: acc.stats(),
            deadline_misses: misses,
        };
        let periodic = self
            .periodic
            .iter()
            .zip(&self.tasks.periodic)
            .map(|(rt, t)| stats(&t.name, &rt.acc, rt.misses))
            .collect();
        let non_periodic = self
            .np
            .iter()
            .zip(&self.tasks.non_periodic)
            .map(|(rt, t)| stats(&t.name, &rt.acc, 0))
            .collect();
        let pooled = self
            .periodic
            .iter()
            .fold(Acc::default(), |a, rt| a.merge(&rt.acc));
        SimReport {
            scheduler,
            horizon_ns: self.horizon,
            busy_ns: self.busy,
            idle_ns: self.horizon - self.busy,
            periodic,
            non_periodic,
            periodic_response: pooled.stats(),
            deadline_misses: self.misses,
            first_misses: self.first_misses,
            slack_overruns: self.overruns,
            decisions: self.decisions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edf::{EdfPlusPlus, PlainEdf};
    use crate::task::{NonPeriodicTask, PeriodicTask};

    fn hand_set() -> TaskSet {
        TaskSet::new(
            vec![PeriodicTask::new("a", 2, 5), PeriodicTask::new("b", 3, 10)],
            vec![NonPeriodicTask::new("n", vec![3, 1, 1])],
        )
    }

    #[test]
    fn edf_pp_on_a_hand_checked_schedule() {
        // a 0–2, b 2–5, a 5–7, n(3) 7–10, a 10–12, b 12–15, a 15–17, n(1) 17–18,
        // n(1) 18–19, then n's ticket 3 exceeds the slack 1: idle 19–20.
        let r = simulate(&hand_set(), &EdfPlusPlus::default(), 20, ExecModel::WCET).unwrap();
        assert_eq!((r.busy_ns, r.idle_ns), (19, 1));
        assert_eq!(r.deadline_misses, 0);
        assert_eq!(r.slack_overruns, 0);
        let a = r.task("a").unwrap().response;
        assert_eq!((a.count, a.mean_ns, a.std_ns), (4, 2.0, 0.0));
        assert_eq!(r.task("b").unwrap().response.mean_ns, 5.0);
        let n = r.task("n").unwrap().response;
        // ready 0 → done 10, ready 10 → 18, ready 18 → 19.
        assert_eq!((n.count, n.mean_ns, n.max_ns), (3, 19.0 / 3.0, 10));
    }

    #[test]
    fn plain_edf_leaves_the_gap_its_static_bound_does_not_fit() {
        // Same as above until 18; there plain EDF sees n's bound 3 > slack 2.
        let r = simulate(&hand_set(), &PlainEdf::default(), 20, ExecModel::WCET).unwrap();
        assert_eq!((r.busy_ns, r.idle_ns), (18, 2));
        assert_eq!(r.task("n").unwrap().response.count, 2);
        // a: 2, 2, 2, 2 and b: 5, 5.
        assert_eq!(r.periodic_response.mean_ns, 18.0 / 6.0);
    }

    #[test]
    fn a_deadline_miss_is_recorded() {
        // b (5 ns) starts at 0; a's job released at 1 (deadline 5) ends at 6.
        let set = TaskSet::new(
            vec![
                PeriodicTask::new("a", 1, 4).with_start(1),
                PeriodicTask::new("b", 5, 10),
            ],
            vec![],
        );
        assert!(crate::admit(&set).is_err());
        let r = simulate(&set, &PlainEdf::default(), 10, ExecModel::WCET).unwrap();
        assert_eq!(r.deadline_misses, 1);
        assert_eq!(
            r.first_misses,
            [DeadlineMiss {
                task: "a".into(),
                release_ns: 1,
                deadline_ns: 5,
                finish_ns: Some(6)
            }]
        );
        assert_eq!(r.task("a").unwrap().deadline_misses, 1);
    }

    #[test]
    fn actual_times_stay_within_the_fraction_and_the_wcet() {
        let set = TaskSet::new(vec![PeriodicTask::new("a", 1_000, 2_000)], vec![]);
        let exec = ExecModel::random_fraction(0.5, 7);
        let r = simulate(&set, &EdfPlusPlus::default(), 2_000_000, exec).unwrap();
        let a = r.task("a").unwrap().response;
        // Alone on the core: response = actual execution time.
        assert_eq!(a.count, 1_000);
        assert!(a.max_ns <= 1_000);
        assert!(a.mean_ns > 700.0 && a.mean_ns < 800.0, "{a:?}");
        assert!(a.std_ns > 100.0);
        let again = simulate(&set, &PlainEdf::default(), 2_000_000, exec).unwrap();
        assert_eq!(again.task("a").unwrap().response, a);
    }

    #[test]
    fn a_ticket_beyond_the_smallest_gap_breaks_only_the_work_conserving_reading() {
        // G = 4 (admission's unit test); "long" holds 5. Work-conserving EDF starts
        // it at 3, one tick before a's release at 4 (deadline 8): a ends at 9.
        let set = TaskSet::new(
            vec![PeriodicTask::new("a", 1, 4), PeriodicTask::new("b", 2, 8)],
            vec![NonPeriodicTask::new("long", vec![5])],
        );
        assert!(crate::admit(&set).is_err());
        let wc = simulate(&set, &PlainEdf::work_conserving(), 8, ExecModel::WCET).unwrap();
        assert_eq!(wc.first_misses[0].finish_ns, Some(9));
        assert_eq!(wc.slack_overruns, 1);
        for s in [
            &EdfPlusPlus::default() as &dyn Scheduler,
            &PlainEdf::default(),
        ] {
            let r = simulate(&set, s, 80, ExecModel::WCET).unwrap();
            assert_eq!(r.deadline_misses, 0);
        }
    }

    struct Stubborn;
    impl Scheduler for Stubborn {
        fn name(&self) -> &'static str {
            "stubborn"
        }
        fn decide(&self, now_ns: u64, _: &CoreView<'_>) -> Decision {
            if now_ns < 2 {
                Decision::Run(TaskId::Periodic(0))
            } else {
                Decision::Idle { until_ns: now_ns }
            }
        }
    }

    #[test]
    fn impossible_decisions_and_bad_inputs_are_errors() {
        let set = hand_set();
        let err = simulate(&set, &Stubborn, 20, ExecModel::WCET).unwrap_err();
        assert!(
            matches!(err, SimError::BadDecision { at_ns: 2, .. }),
            "{err}"
        );
        let set1 = TaskSet::new(vec![PeriodicTask::new("a", 5, 10)], vec![]);
        let err = simulate(&set1, &Stubborn, 20, ExecModel::WCET).unwrap_err();
        assert!(err.to_string().contains("idle until a time not after now"));
        for f in [0.0, -1.0, 1.5, f64::NAN] {
            let e = simulate(
                &set,
                &EdfPlusPlus::default(),
                20,
                ExecModel::random_fraction(f, 1),
            );
            assert!(matches!(e, Err(SimError::BadExecModel { .. })));
        }
        let e = simulate(&set, &EdfPlusPlus::default(), 0, ExecModel::WCET);
        assert_eq!(e.unwrap_err(), SimError::ZeroHorizon);
        let bad = TaskSet::new(vec![PeriodicTask::new("z", 1, 0)], vec![]);
        let e = simulate(&bad, &EdfPlusPlus::default(), 20, ExecModel::WCET);
        assert!(matches!(e, Err(SimError::InvalidTasks(_))));
    }
}
