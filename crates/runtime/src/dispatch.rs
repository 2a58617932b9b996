//! The dispatcher of a dedicated core that runs several offcodes (HYDRA
//! §6.2.5–6.3): at each yield — the end of an offcode's turn — it asks the
//! app's scheduler (`sidecore_sched`: <EDF>++, EDF or a cyclic executive)
//! which offcode's turn comes next, or how long to idle.
//!
//! An offcode with `period_ms` is a periodic task: a job is released every
//! period and each turn runs one job. The others are non-periodic: they are
//! ready while they make progress or have input waiting (and at least every
//! [`WAKE_AFTER`], so timers and control messages are served), and their
//! ticket is the worst-case time of their next turn — declared (`wcet_us`),
//! known to the offcode ([`sidecore_offcode::Offcode::ticket_ns`], a Wasm
//! handler's static bound), or measured: the longest recent turn.
//!
//! Admission ([`Dispatcher::admit`]) runs `sidecore_sched::admit` on the set
//! an offcode would join and refuses it, naming the tasks, when the set could
//! miss a deadline.

use std::time::Duration;

use sidecore_sched::{
    CoreView, CyclicExecutive, Decision, EdfPlusPlus, NonPeriodicState, NonPeriodicTask,
    PeriodicState, PeriodicTask, PickPolicy, PlainEdf, Scheduler, TaskId, TaskSet, admit,
};
use sidecore_types::SchedPolicy;

/// A waiting non-periodic offcode gets a turn at least this often.
pub const WAKE_AFTER: Duration = Duration::from_millis(1);

/// What the dispatcher knows of one offcode on the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    pub name: String,
    /// `Some` for a periodic offcode: (period, WCET), ns.
    pub periodic: Option<(u64, u64)>,
    /// A declared ticket (its `wcet_us`), ns.
    pub wcet_ns: Option<u64>,
    /// Manifest priority, as a tie-break.
    pub priority: u8,
}

/// Why an offcode cannot join a core's task set.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("the {policy} scheduler of {core} refuses it: {reason}")]
    Refused {
        policy: SchedPolicy,
        core: String,
        reason: String,
    },
}

/// The task set of a core and its run-time state, index for index with the
/// executor's started offcodes.
pub struct Dispatcher {
    policy: SchedPolicy,
    sched: Box<dyn Scheduler + Send>,
    tasks: TaskSet,
    /// Executor slot of each task: periodic first, then non-periodic.
    ids: Vec<TaskId>,
    periodic: Vec<PeriodicState>,
    non_periodic: Vec<NonPeriodicState>,
    /// Longest recent turn of each non-periodic task, ns (decays slowly).
    measured_ns: Vec<u64>,
    /// Declared ticket of each non-periodic task, ns.
    declared_ns: Vec<Option<u64>>,
    /// When each waiting non-periodic task last ran, ns.
    last_run_ns: Vec<u64>,
}

/// The task set of `specs`, periodic ones first released at `start_ns(name)`.
fn task_set(specs: &[TaskSpec], start_ns: impl Fn(&str) -> u64) -> (TaskSet, Vec<TaskId>) {
    let mut periodic = Vec::new();
    let mut non_periodic = Vec::new();
    let mut slot_of_p = Vec::new();
    let mut slot_of_n = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        match s.periodic {
            Some((p, e)) => {
                periodic.push(
                    PeriodicTask::new(s.name.clone(), e, p)
                        .with_start(start_ns(&s.name))
                        .with_priority(s.priority),
                );
                slot_of_p.push(i);
            }
            None => {
                non_periodic.push(
                    NonPeriodicTask::new(s.name.clone(), vec![s.wcet_ns.unwrap_or(1).max(1)])
                        .with_priority(s.priority),
                );
                slot_of_n.push(i);
            }
        }
    }
    let mut ids = vec![TaskId::Periodic(0); specs.len()];
    for (k, &i) in slot_of_p.iter().enumerate() {
        ids[i] = TaskId::Periodic(k);
    }
    for (k, &i) in slot_of_n.iter().enumerate() {
        ids[i] = TaskId::NonPeriodic(k);
    }
    (TaskSet::new(periodic, non_periodic), ids)
}

impl Dispatcher {
    /// Checks that `specs` may share `core` under `policy`.
    pub fn admit(policy: SchedPolicy, core: &str, specs: &[TaskSpec]) -> Result<(), AdmitError> {
        if policy == SchedPolicy::RoundRobin {
            return Ok(());
        }
        let (tasks, _) = task_set(specs, |_| 0);
        let refused = |reason: String| AdmitError::Refused {
            policy,
            core: core.to_string(),
            reason,
        };
        admit(&tasks).map_err(|e| refused(e.to_string()))?;
        if policy == SchedPolicy::Cyclic && !tasks.periodic.is_empty() {
            CyclicExecutive::build(&tasks).map_err(|e| refused(e.to_string()))?;
        }
        Ok(())
    }

    /// A dispatcher for `specs`, started at `now_ns`; `None` under
    /// round-robin, which needs none.
    pub fn new(policy: SchedPolicy, specs: &[TaskSpec], now_ns: u64) -> Option<Self> {
        Self::rebuilt(policy, specs, now_ns, None)
    }

    /// The dispatcher for `specs` after an offcode joined or left the core
    /// at `now_ns`, when `previous` ran the set before. A periodic task that
    /// was in it keeps its schedule (first release, next release, pending
    /// jobs): a neighbour coming or going releases no extra job of it. A
    /// non-periodic one keeps its measured ticket and when it last ran.
    pub fn rebuilt(
        policy: SchedPolicy,
        specs: &[TaskSpec],
        now_ns: u64,
        previous: Option<&Dispatcher>,
    ) -> Option<Self> {
        let before = |name: &str| previous.and_then(|d| d.position(name));
        let start_ns = |name: &str| match before(name) {
            Some(TaskId::Periodic(k)) => previous.map_or(now_ns, |d| d.tasks.periodic[k].start_ns),
            _ => now_ns,
        };
        let mut d = Self::fresh(policy, specs, now_ns, start_ns)?;
        let Some(old) = previous else {
            return Some(d);
        };
        for (slot, id) in d.ids.clone().into_iter().enumerate() {
            match (id, before(&specs[slot].name)) {
                (TaskId::Periodic(k), Some(TaskId::Periodic(j))) => {
                    d.periodic[k] = old.periodic[j];
                }
                (TaskId::NonPeriodic(k), Some(TaskId::NonPeriodic(j))) => {
                    d.measured_ns[k] = old.measured_ns[j];
                    d.last_run_ns[k] = old.last_run_ns[j];
                }
                _ => {}
            }
        }
        Some(d)
    }

    /// The task `name` of this set.
    fn position(&self, name: &str) -> Option<TaskId> {
        let of = |id: &TaskId| match *id {
            TaskId::Periodic(k) => self.tasks.periodic[k].name.as_str(),
            TaskId::NonPeriodic(k) => self.tasks.non_periodic[k].name.as_str(),
        };
        self.ids.iter().find(|id| of(id) == name).copied()
    }

    /// A dispatcher with no history: non-periodic tasks ready at `now_ns`,
    /// periodic ones first released at `start_ns(name)`.
    fn fresh(
        policy: SchedPolicy,
        specs: &[TaskSpec],
        now_ns: u64,
        start_ns: impl Fn(&str) -> u64,
    ) -> Option<Self> {
        let (tasks, ids) = task_set(specs, start_ns);
        let sched: Box<dyn Scheduler + Send> = match policy {
            SchedPolicy::RoundRobin => return None,
            // Among offcodes that fit the slack, the higher priority, then the
            // one waiting longest: a pipeline's stages take turns.
            SchedPolicy::EdfPlusPlus => Box::new(EdfPlusPlus {
                pick: PickPolicy::PriorityFirst,
            }),
            SchedPolicy::Edf => Box::new(PlainEdf {
                pick: PickPolicy::PriorityFirst,
                ..PlainEdf::default()
            }),
            SchedPolicy::Cyclic => match CyclicExecutive::build(&tasks) {
                Ok(c) => Box::new(c),
                // Admission ran `build` on this set already; without periodic
                // tasks there is no table, and EDF++ is what remains of it.
                Err(_) => Box::new(EdfPlusPlus {
                    pick: PickPolicy::PriorityFirst,
                }),
            },
        };
        let periodic = tasks
            .periodic
            .iter()
            .map(|t| PeriodicState {
                oldest_pending: None,
                pending_jobs: 0,
                next_release_ns: t.start_ns,
            })
            .collect();
        let n = tasks.non_periodic.len();
        let declared_ns = specs
            .iter()
            .filter(|s| s.periodic.is_none())
            .map(|s| s.wcet_ns)
            .collect();
        Some(Dispatcher {
            policy,
            sched,
            non_periodic: vec![
                NonPeriodicState {
                    ready_since_ns: Some(now_ns),
                    ticket_ns: 1,
                };
                n
            ],
            measured_ns: vec![0; n],
            declared_ns,
            last_run_ns: vec![now_ns; n],
            periodic,
            tasks,
            ids,
        })
    }

    /// The policy it runs.
    pub fn policy(&self) -> SchedPolicy {
        self.policy
    }

    /// Releases every periodic job due by `now_ns`.
    fn release_due(&mut self, now_ns: u64) {
        for (s, t) in self.periodic.iter_mut().zip(&self.tasks.periodic) {
            while s.next_release_ns <= now_ns {
                let r = s.next_release_ns;
                if s.oldest_pending.is_none() {
                    s.oldest_pending = Some(sidecore_sched::Job {
                        release_ns: r,
                        deadline_ns: r + t.period_ns,
                    });
                }
                s.pending_jobs += 1;
                s.next_release_ns = r + t.period_ns;
            }
        }
    }

    /// The executor slot whose turn is next, or how long to idle (ns since
    /// the executor's epoch). `has_input(slot)` says whether a waiting
    /// offcode has something to read; `ticket(slot)` is the offcode's own
    /// ticket if it knows one.
    pub fn next(
        &mut self,
        now_ns: u64,
        has_input: impl Fn(usize) -> bool,
        ticket: impl Fn(usize) -> Option<u64>,
    ) -> Result<usize, u64> {
        self.release_due(now_ns);
        let wake = u64::try_from(WAKE_AFTER.as_nanos()).unwrap_or(u64::MAX);
        for (slot, id) in self.ids.iter().enumerate() {
            let TaskId::NonPeriodic(j) = *id else {
                continue;
            };
            let st = &mut self.non_periodic[j];
            if st.ready_since_ns.is_none()
                && (has_input(slot) || now_ns.saturating_sub(self.last_run_ns[j]) >= wake)
            {
                st.ready_since_ns = Some(now_ns);
            }
            st.ticket_ns = ticket(slot)
                .or(self.declared_ns[j])
                .unwrap_or(self.measured_ns[j])
                .max(1);
        }
        let view = CoreView {
            tasks: &self.tasks,
            periodic: &self.periodic,
            non_periodic: &self.non_periodic,
        };
        match self.sched.decide(now_ns, &view) {
            Decision::Run(id) => Ok(self
                .ids
                .iter()
                .position(|x| *x == id)
                .expect("the scheduler picks a task of its set")),
            Decision::Idle { until_ns } => Err(until_ns.min(now_ns.saturating_add(wake))),
        }
    }

    /// Slot `slot`'s turn ended at `now_ns` after `took_ns`; `progress` says
    /// whether it did work (a non-periodic offcode that did stays ready).
    /// Returns the deadline a periodic job finished after, if it missed it:
    /// admission makes that impossible when tickets hold, so a miss means an
    /// offcode ran longer than it declared, and the executor reports it.
    pub fn ran(&mut self, slot: usize, now_ns: u64, took_ns: u64, progress: bool) -> Option<u64> {
        match self.ids[slot] {
            TaskId::Periodic(i) => {
                let (s, t) = (&mut self.periodic[i], &self.tasks.periodic[i]);
                let missed = s
                    .oldest_pending
                    .map(|j| j.deadline_ns)
                    .filter(|&d| now_ns > d);
                s.pending_jobs = s.pending_jobs.saturating_sub(1);
                s.oldest_pending = s.oldest_pending.and_then(|j| {
                    (s.pending_jobs > 0).then(|| sidecore_sched::Job {
                        release_ns: j.release_ns + t.period_ns,
                        deadline_ns: j.deadline_ns + t.period_ns,
                    })
                });
                missed
            }
            TaskId::NonPeriodic(j) => {
                let m = &mut self.measured_ns[j];
                *m = took_ns.max(*m - *m / 64);
                self.last_run_ns[j] = now_ns;
                self.non_periodic[j].ready_since_ns = progress.then_some(now_ns);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, periodic: Option<(u64, u64)>) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            periodic,
            wcet_ns: periodic.map(|(_, e)| e),
            priority: 2,
        }
    }

    #[test]
    fn a_periodic_offcode_runs_once_per_period_and_the_rest_fill_the_slack() {
        let specs = [spec("tick", Some((1_000_000, 100_000))), spec("work", None)];
        let mut d = Dispatcher::new(SchedPolicy::EdfPlusPlus, &specs, 0).unwrap();
        // At 0 the periodic job is released: it goes first.
        assert_eq!(d.next(0, |_| false, |_| Some(10_000)), Ok(0));
        d.ran(0, 100_000, 100_000, false);
        // Then the non-periodic offcode fills the slack, turn after turn.
        assert_eq!(d.next(100_000, |_| false, |_| Some(10_000)), Ok(1));
        d.ran(1, 110_000, 10_000, true);
        assert_eq!(d.next(110_000, |_| false, |_| Some(10_000)), Ok(1));
        // A ticket that would run past the next release (at 1 ms) waits.
        d.ran(1, 995_000, 10_000, true);
        assert_eq!(d.next(995_000, |_| false, |_| Some(10_000)), Err(1_000_000));
        assert_eq!(d.next(1_000_000, |_| false, |_| Some(10_000)), Ok(0));
    }

    #[test]
    fn a_neighbour_joining_releases_no_extra_job_of_a_periodic_offcode() {
        let tick = spec("tick", Some((1_000_000, 100_000)));
        let mut d =
            Dispatcher::new(SchedPolicy::EdfPlusPlus, std::slice::from_ref(&tick), 0).unwrap();
        assert_eq!(d.next(0, |_| false, |_| None), Ok(0));
        d.ran(0, 100_000, 100_000, false);
        // `work` starts at 0.2 ms, in a slot before the ticker's: the
        // ticker's next job is still the one at 1 ms.
        let specs = [spec("work", None), tick];
        let mut d =
            Dispatcher::rebuilt(SchedPolicy::EdfPlusPlus, &specs, 200_000, Some(&d)).unwrap();
        assert_eq!(d.next(200_000, |_| false, |_| Some(10_000)), Ok(0));
        d.ran(0, 210_000, 10_000, true);
        assert_eq!(d.next(995_000, |_| false, |_| Some(10_000)), Err(1_000_000));
        assert_eq!(d.next(1_000_000, |_| false, |_| Some(10_000)), Ok(1));
        // Without its history the rebuilt set would run the ticker at once.
        let mut fresh = Dispatcher::new(SchedPolicy::EdfPlusPlus, &specs, 200_000).unwrap();
        assert_eq!(fresh.next(200_000, |_| false, |_| Some(10_000)), Ok(1));
    }

    #[test]
    fn a_job_that_ends_after_its_deadline_is_reported_as_a_miss() {
        let specs = [spec("tick", Some((1_000_000, 100_000))), spec("work", None)];
        let mut d = Dispatcher::new(SchedPolicy::EdfPlusPlus, &specs, 0).unwrap();
        assert_eq!(d.next(0, |_| false, |_| None), Ok(0));
        assert_eq!(d.ran(0, 100_000, 100_000, false), None, "in time");
        assert_eq!(
            d.ran(1, 150_000, 50_000, true),
            None,
            "non-periodic: no deadline"
        );
        // The job released at 1 ms is due at 2 ms; it overran its ticket and
        // ends at 2.5 ms.
        assert_eq!(d.next(1_000_000, |_| false, |_| Some(1)), Ok(0));
        assert_eq!(d.ran(0, 2_500_000, 1_500_000, false), Some(2_000_000));
        // The job released at 2 ms (due at 3 ms) still has time.
        assert_eq!(d.next(2_500_000, |_| false, |_| Some(1)), Ok(0));
        assert_eq!(d.ran(0, 2_600_000, 100_000, false), None);
    }

    #[test]
    fn waiting_offcodes_wake_on_input_or_after_a_while() {
        let specs = [spec("a", None), spec("b", None)];
        let mut d = Dispatcher::new(SchedPolicy::EdfPlusPlus, &specs, 0).unwrap();
        let first = d.next(0, |_| false, |_| None).unwrap();
        d.ran(first, 10, 10, false);
        let second = d.next(10, |_| false, |_| None).unwrap();
        assert_ne!(first, second, "both take turns");
        d.ran(second, 20, 10, false);
        // Both idle now: nothing runs until input or WAKE_AFTER.
        assert!(d.next(30, |_| false, |_| None).is_err());
        assert_eq!(d.next(40, |s| s == 1, |_| None), Ok(1));
        d.ran(1, 50, 10, false);
        let wake = u64::try_from(WAKE_AFTER.as_nanos()).unwrap();
        assert_eq!(d.next(10 + wake, |_| false, |_| None), Ok(0));
    }

    #[test]
    fn admission_names_the_tasks_of_an_overloaded_core() {
        let specs = [
            spec("a", Some((1_000_000, 600_000))),
            spec("b", Some((1_000_000, 600_000))),
        ];
        let e = Dispatcher::admit(SchedPolicy::EdfPlusPlus, "core:1", &specs)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("core:1") && e.contains("`a`") && e.contains("`b`"),
            "{e}"
        );
        assert!(Dispatcher::admit(SchedPolicy::RoundRobin, "core:1", &specs).is_ok());
    }
}
