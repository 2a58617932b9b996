//! The task model of §6.3.2–6.3.3: periodic tasks `(e, p, d = p, s, Pr)` and
//! non-periodic tasks whose ticket `(e, Pr)` holds the WCET of their *next* segment.
//!
//! All times are `u64` nanoseconds. A periodic task releases a job at `s + k·p`
//! (`k = 0, 1, …`) whose deadline is the next release (`d = p`, as `<Sched>++`
//! assumes). A non-periodic task is a thread that runs in segments between two
//! yields; the compiler of §6.3.3 stores the WCET of the next segment in the task's
//! single ticket before each yield. Here the task lists the WCETs of its segments in
//! program order (`segments_ns`, repeated cyclically), so the ticket before segment
//! `m` is `segments_ns[m % len]`. Between a yield and being ready again the task
//! sleeps (waits for its next event) for a time drawn from [`Sleep`].

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// A periodic task `T̃ = (e, p, s, Pr)` with `d = p`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicTask {
    /// Name, unique within the task set; errors and reports use it.
    pub name: String,
    /// Worst-case execution time `e` of one job, ns.
    pub wcet_ns: u64,
    /// Period `p`, ns; also the relative deadline.
    pub period_ns: u64,
    /// First release `s`, ns.
    pub start_ns: u64,
    /// Ticket priority `Pr`: higher runs first. EDF uses it only to break ties
    /// between equal deadlines.
    pub priority: u8,
}

impl PeriodicTask {
    /// A task released at 0 with priority 0.
    #[must_use]
    pub fn new(name: impl Into<String>, wcet_ns: u64, period_ns: u64) -> Self {
        Self {
            name: name.into(),
            wcet_ns,
            period_ns,
            start_ns: 0,
            priority: 0,
        }
    }

    /// The same task first released at `start_ns`.
    #[must_use]
    pub fn with_start(mut self, start_ns: u64) -> Self {
        self.start_ns = start_ns;
        self
    }

    /// The same task with ticket priority `priority`.
    #[must_use]
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Release time of job `k` (`s + k·p`), or `None` past `u64::MAX`.
    #[must_use]
    pub fn release_ns(&self, k: u64) -> Option<u64> {
        k.checked_mul(self.period_ns)
            .and_then(|o| o.checked_add(self.start_ns))
    }
}

/// How long a non-periodic task waits after a yield before it is ready again:
/// uniform in `[min_ns, max_ns]` (seeded in the simulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sleep {
    /// Shortest wait, ns.
    pub min_ns: u64,
    /// Longest wait, ns.
    pub max_ns: u64,
}

impl Sleep {
    /// Ready again at once after each yield (a background task).
    pub const NONE: Self = Self {
        min_ns: 0,
        max_ns: 0,
    };
}

/// A non-periodic task: ticket `(e, Pr)` where `e` is the WCET of the next segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonPeriodicTask {
    /// Name, unique within the task set.
    pub name: String,
    /// Ticket priority `Pr`: higher is more urgent (see [`crate::PickPolicy`]).
    pub priority: u8,
    /// WCET of each segment between two yields, in program order, repeated
    /// cyclically; the ticket before segment `m` is `segments_ns[m % len]`.
    pub segments_ns: Vec<u64>,
    /// First time the task is ready, ns.
    pub start_ns: u64,
    /// Wait between a yield and the next readiness.
    pub sleep: Sleep,
}

impl NonPeriodicTask {
    /// A task ready at 0 with priority 0 that is ready again right after each yield.
    #[must_use]
    pub fn new(name: impl Into<String>, segments_ns: Vec<u64>) -> Self {
        Self {
            name: name.into(),
            priority: 0,
            segments_ns,
            start_ns: 0,
            sleep: Sleep::NONE,
        }
    }

    /// The same task with ticket priority `priority`.
    #[must_use]
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// The same task first ready at `start_ns`.
    #[must_use]
    pub fn with_start(mut self, start_ns: u64) -> Self {
        self.start_ns = start_ns;
        self
    }

    /// The same task sleeping uniformly in `[min_ns, max_ns]` after each yield.
    #[must_use]
    pub fn with_sleep(mut self, min_ns: u64, max_ns: u64) -> Self {
        self.sleep = Sleep { min_ns, max_ns };
        self
    }

    /// The ticket before segment `m`: that segment's WCET (0 if there are none).
    #[must_use]
    pub fn ticket_ns(&self, m: u64) -> u64 {
        let len = self.segments_ns.len() as u64;
        if len == 0 {
            return 0;
        }
        usize::try_from(m % len)
            .ok()
            .and_then(|i| self.segments_ns.get(i).copied())
            .unwrap_or(0)
    }

    /// The largest ticket the task can ever hold: the static WCET bound of any of
    /// its segments, all a scheduler without `<Sched>++`'s per-yield tickets knows.
    #[must_use]
    pub fn max_ticket_ns(&self) -> u64 {
        self.segments_ns.iter().copied().max().unwrap_or(0)
    }
}

/// A task's place in a [`TaskSet`]: its kind and index in that kind's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskId {
    /// Index into [`TaskSet::periodic`].
    Periodic(usize),
    /// Index into [`TaskSet::non_periodic`].
    NonPeriodic(usize),
}

/// The offcodes sharing one dedicated core: a hybrid task system (§6.3.2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSet {
    /// Periodic tasks.
    pub periodic: Vec<PeriodicTask>,
    /// Non-periodic tasks.
    pub non_periodic: Vec<NonPeriodicTask>,
}

/// A task that no scheduler can take as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// `p = 0`.
    #[error("periodic task `{task}`: period is 0 ns")]
    ZeroPeriod {
        /// The task.
        task: String,
    },
    /// `e = 0`.
    #[error("periodic task `{task}`: WCET is 0 ns")]
    ZeroWcet {
        /// The task.
        task: String,
    },
    /// `e > p`: a job cannot finish before the next release even alone.
    #[error("periodic task `{task}`: WCET {wcet_ns} ns exceeds its period {period_ns} ns")]
    WcetExceedsPeriod {
        /// The task.
        task: String,
        /// Its WCET.
        wcet_ns: u64,
        /// Its period.
        period_ns: u64,
    },
    /// A non-periodic task without segments has no ticket.
    #[error("non-periodic task `{task}`: no segments, so no ticket")]
    NoSegments {
        /// The task.
        task: String,
    },
    /// A segment with WCET 0.
    #[error("non-periodic task `{task}`: segment {index} has WCET 0 ns")]
    ZeroSegment {
        /// The task.
        task: String,
        /// The segment's index.
        index: usize,
    },
    /// `min > max` in a sleep range.
    #[error("non-periodic task `{task}`: sleep range {min_ns}..={max_ns} ns is empty")]
    BadSleep {
        /// The task.
        task: String,
        /// Shortest wait.
        min_ns: u64,
        /// Longest wait.
        max_ns: u64,
    },
    /// Two tasks share a name, so errors could not say which is meant.
    #[error("task name `{task}` is used more than once")]
    DuplicateName {
        /// The name.
        task: String,
    },
}

impl TaskSet {
    /// A task set from its two lists.
    #[must_use]
    pub fn new(periodic: Vec<PeriodicTask>, non_periodic: Vec<NonPeriodicTask>) -> Self {
        Self {
            periodic,
            non_periodic,
        }
    }

    /// Every problem with the tasks' parameters, or `Ok` if there is none.
    ///
    /// # Errors
    /// The list of [`TaskError`]s, in task order.
    pub fn validate(&self) -> Result<(), Vec<TaskError>> {
        let mut errors = Vec::new();
        let mut names = HashSet::new();
        for t in &self.periodic {
            if !names.insert(t.name.as_str()) {
                errors.push(TaskError::DuplicateName {
                    task: t.name.clone(),
                });
            }
            let task = || t.name.clone();
            if t.period_ns == 0 {
                errors.push(TaskError::ZeroPeriod { task: task() });
            }
            if t.wcet_ns == 0 {
                errors.push(TaskError::ZeroWcet { task: task() });
            } else if t.period_ns != 0 && t.wcet_ns > t.period_ns {
                errors.push(TaskError::WcetExceedsPeriod {
                    task: task(),
                    wcet_ns: t.wcet_ns,
                    period_ns: t.period_ns,
                });
            }
        }
        for t in &self.non_periodic {
            if !names.insert(t.name.as_str()) {
                errors.push(TaskError::DuplicateName {
                    task: t.name.clone(),
                });
            }
            validate_non_periodic(t, &mut errors);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// `Σ e/p` over the periodic tasks, in floating point (for reports; admission
    /// compares exactly where it can). Tasks with a zero period are skipped.
    #[must_use]
    pub fn periodic_utilisation(&self) -> f64 {
        self.periodic
            .iter()
            .filter(|t| t.period_ns > 0)
            .map(|t| t.wcet_ns as f64 / t.period_ns as f64)
            .sum()
    }

    /// The name of a task, if the id is in range.
    #[must_use]
    pub fn name(&self, id: TaskId) -> Option<&str> {
        match id {
            TaskId::Periodic(i) => self.periodic.get(i).map(|t| t.name.as_str()),
            TaskId::NonPeriodic(j) => self.non_periodic.get(j).map(|t| t.name.as_str()),
        }
    }
}

fn validate_non_periodic(t: &NonPeriodicTask, errors: &mut Vec<TaskError>) {
    if t.segments_ns.is_empty() {
        errors.push(TaskError::NoSegments {
            task: t.name.clone(),
        });
    }
    for (index, &e) in t.segments_ns.iter().enumerate() {
        if e == 0 {
            errors.push(TaskError::ZeroSegment {
                task: t.name.clone(),
                index,
            });
        }
    }
    if t.sleep.min_ns > t.sleep.max_ns {
        errors.push(TaskError::BadSleep {
            task: t.name.clone(),
            min_ns: t.sleep.min_ns,
            max_ns: t.sleep.max_ns,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_parameters_are_reported_not_panicked_on() {
        let set = TaskSet::new(
            vec![
                PeriodicTask::new("zero-p", 1, 0),
                PeriodicTask::new("zero-e", 0, 10),
                PeriodicTask::new("e>p", 11, 10),
                PeriodicTask::new("ok", 1, 10),
            ],
            vec![
                NonPeriodicTask::new("empty", vec![]),
                NonPeriodicTask::new("zero-seg", vec![3, 0]),
                NonPeriodicTask::new("ok", vec![1]).with_sleep(5, 1),
            ],
        );
        let errors = set.validate().unwrap_err();
        assert_eq!(
            errors,
            vec![
                TaskError::ZeroPeriod {
                    task: "zero-p".into()
                },
                TaskError::ZeroWcet {
                    task: "zero-e".into()
                },
                TaskError::WcetExceedsPeriod {
                    task: "e>p".into(),
                    wcet_ns: 11,
                    period_ns: 10
                },
                TaskError::NoSegments {
                    task: "empty".into()
                },
                TaskError::ZeroSegment {
                    task: "zero-seg".into(),
                    index: 1
                },
                TaskError::DuplicateName { task: "ok".into() },
                TaskError::BadSleep {
                    task: "ok".into(),
                    min_ns: 5,
                    max_ns: 1
                },
            ]
        );
        assert!(errors[2].to_string().contains("exceeds its period 10 ns"));
    }

    #[test]
    fn tickets_cycle_through_the_segments() {
        let t = NonPeriodicTask::new("a", vec![3, 1, 7]);
        assert_eq!(
            (0..5).map(|m| t.ticket_ns(m)).collect::<Vec<_>>(),
            [3, 1, 7, 3, 1]
        );
        assert_eq!(t.max_ticket_ns(), 7);
        assert_eq!(NonPeriodicTask::new("b", vec![]).ticket_ns(4), 0);
    }
}
