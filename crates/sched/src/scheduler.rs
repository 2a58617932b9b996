//! The one decision every run-to-completion scheduler makes, at each `Yield()`:
//! given the time and the tasks' state, which task runs next, or idle until when.
//!
//! A dedicated core's dispatcher loop (or the reference simulation in
//! [`crate::simulate`]) keeps the state: which periodic jobs are released and
//! unfinished, when each periodic task releases next (`Nr` of §6.3.4), which
//! non-periodic tasks are ready and their current tickets. It calls
//! [`Scheduler::decide`] whenever the core is free — after a task yields, and when an
//! idle period ends or is interrupted by a release or a non-periodic task becoming
//! ready — and runs the chosen task to its next yield. Nothing here owns a clock.

use serde::{Deserialize, Serialize};

use crate::task::{TaskId, TaskSet};

/// A released, unfinished periodic job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// When it was released, ns.
    pub release_ns: u64,
    /// Its absolute deadline (`release + p`), ns: `Nd` of §6.3.4.
    pub deadline_ns: u64,
}

/// A periodic task's run-time state (the extended ticket `(e, p, Nr, Nd, Pr)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicState {
    /// The oldest released, unfinished job, if any; running the task runs this job.
    pub oldest_pending: Option<Job>,
    /// How many released jobs are unfinished (more than one only in overload).
    pub pending_jobs: u32,
    /// Release time of the next job not yet released (`Nr`), ns; `u64::MAX` if none.
    pub next_release_ns: u64,
}

/// A non-periodic task's run-time state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonPeriodicState {
    /// Since when the task has been ready, or `None` if it is waiting.
    pub ready_since_ns: Option<u64>,
    /// The ticket: WCET of the task's next segment, ns (§6.3.3's recycled ticket).
    pub ticket_ns: u64,
}

/// What a scheduler sees at a yield: the static task set and the run-time state,
/// index for index.
#[derive(Debug, Clone, Copy)]
pub struct CoreView<'a> {
    /// The task set (names, WCETs, priorities).
    pub tasks: &'a TaskSet,
    /// State of `tasks.periodic[i]` at index `i`.
    pub periodic: &'a [PeriodicState],
    /// State of `tasks.non_periodic[j]` at index `j`.
    pub non_periodic: &'a [NonPeriodicState],
}

impl CoreView<'_> {
    /// The earliest next release over all periodic tasks (`min Nr`), or `u64::MAX`.
    #[must_use]
    pub fn next_release_ns(&self) -> u64 {
        self.periodic
            .iter()
            .map(|p| p.next_release_ns)
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// A scheduler's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Run this task to its next yield: a periodic task runs its oldest pending job,
    /// a non-periodic task its next segment.
    Run(TaskId),
    /// Nothing should start now. Ask again at `until_ns` (the idle task's timeout of
    /// Fig. 6.3), or earlier if a job is released or a non-periodic task becomes
    /// ready; `u64::MAX` means "only when something happens".
    Idle {
        /// Time to ask again, ns; later than now.
        until_ns: u64,
    },
}

/// A run-to-completion scheduling policy for one core.
pub trait Scheduler {
    /// A short name for reports.
    fn name(&self) -> &'static str;

    /// The decision at `now_ns`. Every periodic job released at or before `now_ns`
    /// is in `view` already.
    fn decide(&self, now_ns: u64, view: &CoreView<'_>) -> Decision;
}

/// How to choose among the ready non-periodic tasks that fit the slack (Part II of
/// Fig. 6.3 leaves this open: "the algorithm can use various criteria").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PickPolicy {
    /// The largest size that fits, which leaves the least slack unused (the
    /// criterion of the seed's reference \[59\]); ties go to the higher priority, then to the task ready
    /// longest, then to the lower index.
    #[default]
    BestFit,
    /// The highest priority that fits; ties go to the task ready longest, then to
    /// the lower index.
    PriorityFirst,
}

/// Among ready non-periodic tasks whose `size(j)` is at most `slack_ns`, the one
/// `policy` prefers. `size` is the ticket for `<EDF>++` and the static bound for
/// plain EDF.
pub(crate) fn pick_non_periodic(
    view: &CoreView<'_>,
    slack_ns: u64,
    policy: PickPolicy,
    size: impl Fn(usize) -> u64,
) -> Option<usize> {
    let fitting = view
        .non_periodic
        .iter()
        .enumerate()
        .filter_map(|(j, s)| s.ready_since_ns.map(|since| (j, since)))
        .map(|(j, since)| {
            let prio = view.tasks.non_periodic.get(j).map_or(0, |t| t.priority);
            (j, since, size(j), prio)
        })
        .filter(|&(_, _, e, _)| e <= slack_ns);
    let best = match policy {
        // max by (size, priority, earliest ready, lowest index)
        PickPolicy::BestFit => fitting.max_by(|a, b| {
            (a.2, a.3)
                .cmp(&(b.2, b.3))
                .then_with(|| (b.1, b.0).cmp(&(a.1, a.0)))
        }),
        PickPolicy::PriorityFirst => {
            fitting.max_by(|a, b| a.3.cmp(&b.3).then_with(|| (b.1, b.0).cmp(&(a.1, a.0))))
        }
    };
    best.map(|(j, ..)| j)
}

/// The released periodic job with the earliest deadline (`Part I`); ties go to the
/// higher priority, then to the lower index.
pub(crate) fn earliest_deadline(view: &CoreView<'_>) -> Option<usize> {
    view.periodic
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.oldest_pending.map(|j| (i, j.deadline_ns)))
        .min_by(|a, b| {
            let pa = view.tasks.periodic.get(a.0).map_or(0, |t| t.priority);
            let pb = view.tasks.periodic.get(b.0).map_or(0, |t| t.priority);
            a.1.cmp(&b.1)
                .then_with(|| pb.cmp(&pa))
                .then_with(|| a.0.cmp(&b.0))
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::NonPeriodicTask;

    fn view_with<'a>(tasks: &'a TaskSet, np: &'a [NonPeriodicState]) -> CoreView<'a> {
        CoreView {
            tasks,
            periodic: &[],
            non_periodic: np,
        }
    }

    #[test]
    fn best_fit_takes_the_largest_ticket_that_fits_then_priority_then_fifo() {
        let tasks = TaskSet::new(
            vec![],
            vec![
                NonPeriodicTask::new("a", vec![5]),
                NonPeriodicTask::new("b", vec![5]).with_priority(3),
                NonPeriodicTask::new("c", vec![9]),
                NonPeriodicTask::new("d", vec![5]).with_priority(3),
            ],
        );
        let ready = |since, ticket| NonPeriodicState {
            ready_since_ns: Some(since),
            ticket_ns: ticket,
        };
        let np = [ready(0, 5), ready(7, 5), ready(0, 9), ready(4, 5)];
        let v = view_with(&tasks, &np);
        let size = |j: usize| np[j].ticket_ns;
        // c (9) does not fit 8; among the 5s, b and d have priority 3; d waited longer.
        assert_eq!(pick_non_periodic(&v, 8, PickPolicy::BestFit, size), Some(3));
        assert_eq!(pick_non_periodic(&v, 9, PickPolicy::BestFit, size), Some(2));
        assert_eq!(
            pick_non_periodic(&v, 9, PickPolicy::PriorityFirst, size),
            Some(3)
        );
        assert_eq!(pick_non_periodic(&v, 4, PickPolicy::BestFit, size), None);
    }
}
