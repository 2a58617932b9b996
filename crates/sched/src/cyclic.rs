//! The cyclic executive of §6.3.1: a fixed table of frames, built offline from the
//! periods, that the core walks through forever.
//!
//! **How the table is built.** The major cycle is the hyperperiod `H = lcm(p_i)`.
//! The frame size `f` is chosen among the divisors of the periods (so `f` divides
//! `H`) with `max e_i ≤ f ≤ min p_i` (a job never spans a frame boundary, and
//! every job's window can hold a whole frame), largest first; the first `f` for
//! which packing succeeds wins (larger frames mean fewer dispatch points). Packing
//! places each job of one major cycle — job `k` of task `i` is released at
//! `ρ_i + k·p_i` with `ρ_i = s_i mod p_i`, `k < H/p_i` — into a frame lying wholly
//! inside its window `[release, release + p_i]`; frames are filled in time order,
//! each by the pending jobs in earliest-deadline order (first fit), with the frames
//! of the next cycle sharing the capacity of the same table slots, so jobs whose
//! window wraps past `H` are placed too. This greedy packing is a heuristic, not
//! the network-flow assignment of the textbook: it can refuse a set for which some
//! table exists. Liu's condition `2f − gcd(p_i, f) ≤ p_i` is not tested on its own;
//! the window check during packing subsumes it (and also covers offsets).
//!
//! **At run time** ([`Scheduler::decide`]), in the frame containing `now`, the
//! table's entries run in order: an entry for task `i` runs its oldest pending job
//! if that job was released by the start of the frame (else it is skipped — the task
//! has not started yet, or the entry belongs to the wrapped job of a cycle that
//! never ran). Since the windows of one task's jobs tile time, that job is exactly
//! the one the entry was packed for. When the frame's entries are done the rest of
//! the frame is slack, which the cyclic executive fills as `<Sched>++` fills any
//! scheduler's slack: a ready non-periodic task whose ticket fits the time to the
//! end of the frame ([`PickPolicy`]), else idle until the next frame.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::scheduler::{CoreView, Decision, PickPolicy, Scheduler, pick_non_periodic};
use crate::task::{PeriodicTask, TaskError, TaskId, TaskSet};

/// Largest table the builder makes: frames per major cycle, and jobs per cycle.
pub const MAX_TABLE: u64 = 100_000;

/// A cyclic executive with its frame table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CyclicExecutive {
    frame_ns: u64,
    frames: Vec<Vec<usize>>,
    /// Choice among the non-periodic tasks whose ticket fits the rest of a frame.
    pub pick: PickPolicy,
}

/// Why no frame table was built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CyclicError {
    /// Bad task parameters.
    #[error("invalid tasks: {}", join(.0))]
    InvalidTasks(Vec<TaskError>),
    /// A cyclic executive needs periodic tasks to build frames from.
    #[error("no periodic tasks to build a frame table from")]
    NoPeriodicTasks,
    /// `lcm` of the periods overflows or needs more than [`MAX_TABLE`] frames/jobs.
    #[error(
        "the major cycle (lcm of the periods) is too long for a table of at most {MAX_TABLE} frames and jobs"
    )]
    MajorCycleTooLong,
    /// A given frame is shorter than a job.
    #[error("frame {frame_ns} ns is shorter than task `{task}`'s WCET {wcet_ns} ns")]
    FrameTooSmall {
        /// The frame size.
        frame_ns: u64,
        /// The task.
        task: String,
        /// Its WCET.
        wcet_ns: u64,
    },
    /// A given frame size does not divide the major cycle.
    #[error("frame {frame_ns} ns does not divide the major cycle {major_cycle_ns} ns")]
    FrameDoesNotDivide {
        /// The frame size.
        frame_ns: u64,
        /// The hyperperiod.
        major_cycle_ns: u64,
    },
    /// Packing found no frame for a job.
    #[error(
        "frame {frame_ns} ns: no frame inside the window of task `{task}`'s job released at {release_ns} ns (mod the major cycle) has room"
    )]
    NoRoom {
        /// The frame size.
        frame_ns: u64,
        /// The task.
        task: String,
        /// The job's release within the major cycle.
        release_ns: u64,
    },
    /// No candidate frame size led to a table.
    #[error(
        "no frame size works (tried {tried:?} ns: divisors of the periods between the largest WCET and the smallest period)"
    )]
    NoFrameSize {
        /// The frame sizes tried, largest first.
        tried: Vec<u64>,
    },
}

fn join(errors: &[TaskError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl CyclicExecutive {
    /// Builds the table with the largest frame size that works (see the module
    /// documentation).
    ///
    /// # Errors
    /// [`CyclicError`] if the tasks are invalid or no frame size packs.
    pub fn build(tasks: &TaskSet) -> Result<Self, CyclicError> {
        let (h, max_e, min_p) = prepare(tasks)?;
        let mut candidates: Vec<u64> = tasks
            .periodic
            .iter()
            .flat_map(|t| divisors_in(t.period_ns, max_e.max(h.div_ceil(MAX_TABLE)), min_p))
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        for &f in &candidates {
            if let Ok(frames) = pack(&tasks.periodic, h, f) {
                return Ok(Self {
                    frame_ns: f,
                    frames,
                    pick: PickPolicy::default(),
                });
            }
        }
        Err(CyclicError::NoFrameSize { tried: candidates })
    }

    /// Builds the table for a given frame size.
    ///
    /// # Errors
    /// [`CyclicError`] if the frame is too small, does not divide the major cycle,
    /// or packing fails.
    pub fn build_with_frame(tasks: &TaskSet, frame_ns: u64) -> Result<Self, CyclicError> {
        let (h, _, _) = prepare(tasks)?;
        if let Some(t) = tasks.periodic.iter().find(|t| t.wcet_ns > frame_ns) {
            return Err(CyclicError::FrameTooSmall {
                frame_ns,
                task: t.name.clone(),
                wcet_ns: t.wcet_ns,
            });
        }
        if !h.is_multiple_of(frame_ns) {
            return Err(CyclicError::FrameDoesNotDivide {
                frame_ns,
                major_cycle_ns: h,
            });
        }
        if h / frame_ns > MAX_TABLE {
            return Err(CyclicError::MajorCycleTooLong);
        }
        let frames = pack(&tasks.periodic, h, frame_ns)?;
        Ok(Self {
            frame_ns,
            frames,
            pick: PickPolicy::default(),
        })
    }

    /// The same executive choosing non-periodic tasks by `pick`.
    #[must_use]
    pub fn with_pick(mut self, pick: PickPolicy) -> Self {
        self.pick = pick;
        self
    }

    /// The frame size, ns.
    #[must_use]
    pub fn frame_ns(&self) -> u64 {
        self.frame_ns
    }

    /// The major cycle (frames × frame size), ns.
    #[must_use]
    pub fn major_cycle_ns(&self) -> u64 {
        self.frame_ns.saturating_mul(self.frames.len() as u64)
    }

    /// The table: for each frame, the periodic task indices to run, in order.
    #[must_use]
    pub fn frames(&self) -> &[Vec<usize>] {
        &self.frames
    }
}

impl Scheduler for CyclicExecutive {
    fn name(&self) -> &'static str {
        "cyclic executive"
    }

    fn decide(&self, now_ns: u64, view: &CoreView<'_>) -> Decision {
        let f = self.frame_ns.max(1);
        let n = (self.frames.len() as u64).max(1);
        let abs = now_ns / f;
        let start = abs * f;
        let pos = usize::try_from(abs % n).unwrap_or(0);
        for &i in self.frames.get(pos).map_or(&[][..], Vec::as_slice) {
            let released = view
                .periodic
                .get(i)
                .and_then(|s| s.oldest_pending)
                .is_some_and(|j| j.release_ns <= start);
            if released {
                return Decision::Run(TaskId::Periodic(i));
            }
        }
        let end = start.saturating_add(f);
        let slack = end - now_ns;
        let ticket = |j: usize| view.non_periodic.get(j).map_or(u64::MAX, |s| s.ticket_ns);
        match pick_non_periodic(view, slack, self.pick, ticket) {
            Some(j) => Decision::Run(TaskId::NonPeriodic(j)),
            None => Decision::Idle { until_ns: end },
        }
    }
}

/// Validates, and returns (hyperperiod, largest WCET, smallest period).
fn prepare(tasks: &TaskSet) -> Result<(u64, u64, u64), CyclicError> {
    tasks.validate().map_err(CyclicError::InvalidTasks)?;
    let p = &tasks.periodic;
    let (Some(max_e), Some(min_p)) = (
        p.iter().map(|t| t.wcet_ns).max(),
        p.iter().map(|t| t.period_ns).min(),
    ) else {
        return Err(CyclicError::NoPeriodicTasks);
    };
    let h = p
        .iter()
        .try_fold(1u64, |h, t| lcm(h, t.period_ns))
        .ok_or(CyclicError::MajorCycleTooLong)?;
    let jobs: u64 = p.iter().map(|t| h / t.period_ns).sum();
    if jobs > MAX_TABLE || h / min_p > MAX_TABLE {
        return Err(CyclicError::MajorCycleTooLong);
    }
    Ok((h, max_e, min_p))
}

pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

pub(crate) fn lcm(a: u64, b: u64) -> Option<u64> {
    if a == 0 || b == 0 {
        return Some(0);
    }
    (a / gcd(a, b)).checked_mul(b)
}

/// Divisors of `p` in `[lo, hi]`, found through their co-divisors `p / x`, which
/// lie in `[p / hi, p / lo]`: at most [`MAX_TABLE`] candidates when `lo ≥ H /
/// MAX_TABLE`, however large `p` is.
fn divisors_in(p: u64, lo: u64, hi: u64) -> Vec<u64> {
    let lo = lo.max(1);
    if hi < lo {
        return Vec::new();
    }
    ((p / hi).max(1)..=p / lo)
        .filter(|&d| p.is_multiple_of(d))
        .map(|d| p / d)
        .filter(|x| (lo..=hi).contains(x))
        .collect()
}

/// One job of the major cycle: the frames that lie inside its window.
struct Slot {
    first: u64,
    last: u64,
    task: usize,
    release: u64,
}

fn slots(tasks: &[PeriodicTask], h: u64, f: u64) -> Result<Vec<Slot>, CyclicError> {
    let mut out = Vec::new();
    for (task, t) in tasks.iter().enumerate() {
        let rho = t.start_ns % t.period_ns;
        for k in 0..h / t.period_ns {
            let release = rho + k * t.period_ns;
            let first = release.div_ceil(f);
            let deadline = release
                .checked_add(t.period_ns)
                .ok_or(CyclicError::MajorCycleTooLong)?;
            let end = deadline / f;
            if end == 0 || first > end - 1 {
                return Err(no_room(t, f, release));
            }
            out.push(Slot {
                first,
                last: end - 1,
                task,
                release,
            });
        }
    }
    out.sort_by_key(|s| (s.first, s.last, s.task));
    Ok(out)
}

fn no_room(t: &PeriodicTask, frame_ns: u64, release_ns: u64) -> CyclicError {
    CyclicError::NoRoom {
        frame_ns,
        task: t.name.clone(),
        release_ns,
    }
}

/// Greedy earliest-deadline first-fit packing of one major cycle's jobs into the
/// `h / f` table slots (see the module documentation).
fn pack(tasks: &[PeriodicTask], h: u64, f: u64) -> Result<Vec<Vec<usize>>, CyclicError> {
    let n = usize::try_from(h / f).map_err(|_| CyclicError::MajorCycleTooLong)?;
    let slots = slots(tasks, h, f)?;
    let wcet = |task: usize| tasks.get(task).map_or(u64::MAX, |t| t.wcet_ns);
    let min_e = tasks.iter().map(|t| t.wcet_ns).min().unwrap_or(1);
    let mut used = vec![0u64; n];
    let mut table = vec![Vec::new(); n];
    let mut heap = BinaryHeap::new();
    let mut next = 0;
    let last_frame = slots.iter().map(|s| s.last).max().unwrap_or(0);
    for a in 0..=last_frame {
        while let Some(s) = slots.get(next).filter(|s| s.first <= a) {
            heap.push(Reverse((s.last, s.task, next)));
            next += 1;
        }
        let pos = usize::try_from(a % n as u64).unwrap_or(0);
        let mut deferred = Vec::new();
        while let Some(Reverse((last, task, idx))) = heap.pop() {
            let room = f - used[pos];
            if wcet(task) <= room {
                used[pos] += wcet(task);
                table[pos].push(task);
            } else if last == a {
                let s = &slots[idx];
                return Err(no_room(&tasks[s.task], f, s.release));
            } else {
                deferred.push(Reverse((last, task, idx)));
            }
            if f - used[pos] < min_e {
                break;
            }
        }
        for d in deferred {
            heap.push(d);
        }
        if let Some(Reverse((last, _, idx))) = heap.peek().copied()
            && last <= a
        {
            let s = &slots[idx];
            return Err(no_room(&tasks[s.task], f, s.release));
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{Job, NonPeriodicState, PeriodicState};
    use crate::task::NonPeriodicTask;

    fn set() -> TaskSet {
        TaskSet::new(
            vec![
                PeriodicTask::new("a", 1, 4),
                PeriodicTask::new("b", 2, 8),
                PeriodicTask::new("c", 3, 16),
            ],
            vec![NonPeriodicTask::new("bg", vec![1])],
        )
    }

    #[test]
    fn the_table_uses_the_largest_workable_frame_and_holds_every_job_once() {
        let ce = CyclicExecutive::build(&set()).unwrap();
        // max e = 3, min p = 4, divisors of the periods in [3, 4]: 4.
        assert_eq!(ce.frame_ns(), 4);
        assert_eq!(ce.major_cycle_ns(), 16);
        let count = |task| ce.frames().iter().flatten().filter(|&&t| t == task).count();
        assert_eq!((count(0), count(1), count(2)), (4, 2, 1));
        for frame in ce.frames() {
            let load: u64 = frame.iter().map(|&t| set().periodic[t].wcet_ns).sum();
            assert!(load <= 4);
        }
        // Hand-checked: a runs in every frame; b's jobs need a frame in [0, 8) and
        // one in [8, 16); c (3 ns) first finds room in frame 1.
        assert_eq!(ce.frames(), &[vec![0, 1], vec![0, 2], vec![0, 1], vec![0]]);
    }

    #[test]
    fn bad_frames_and_overfull_sets_are_refused() {
        let s = set();
        assert!(matches!(
            CyclicExecutive::build_with_frame(&s, 2),
            Err(CyclicError::FrameTooSmall { .. })
        ));
        assert!(matches!(
            CyclicExecutive::build_with_frame(&s, 5),
            Err(CyclicError::FrameDoesNotDivide { .. })
        ));
        let full = TaskSet::new(
            vec![PeriodicTask::new("x", 3, 4), PeriodicTask::new("y", 2, 8)],
            vec![],
        );
        assert!(matches!(
            CyclicExecutive::build(&full),
            Err(CyclicError::NoFrameSize { .. })
        ));
        assert_eq!(
            CyclicExecutive::build(&TaskSet::default()),
            Err(CyclicError::NoPeriodicTasks)
        );
    }

    #[test]
    fn decide_walks_the_frame_then_fills_its_rest() {
        let s = set();
        let ce = CyclicExecutive::build(&s).unwrap();
        let job = |r: u64, p: u64| PeriodicState {
            oldest_pending: Some(Job {
                release_ns: r,
                deadline_ns: r + p,
            }),
            pending_jobs: 1,
            next_release_ns: r + p,
        };
        let done = |next: u64| PeriodicState {
            oldest_pending: None,
            pending_jobs: 0,
            next_release_ns: next,
        };
        let np = [NonPeriodicState {
            ready_since_ns: Some(0),
            ticket_ns: 1,
        }];
        // Frame 1 ([4, 8)): entries a, c. At 5, a is done, c pending since 0.
        let p = [done(8), job(0, 8), job(0, 16)];
        let v = CoreView {
            tasks: &s,
            periodic: &p,
            non_periodic: &np,
        };
        // b is pending but has no entry in frame 1: c runs.
        assert_eq!(ce.decide(5, &v), Decision::Run(TaskId::Periodic(2)));
        let p = [done(8), job(0, 8), done(16)];
        let v = CoreView {
            tasks: &s,
            periodic: &p,
            non_periodic: &np,
        };
        // Entries done; 3 ns of frame left, ticket 1 fits.
        assert_eq!(ce.decide(5, &v), Decision::Run(TaskId::NonPeriodic(0)));
        let np = [NonPeriodicState {
            ready_since_ns: None,
            ticket_ns: 1,
        }];
        let v = CoreView {
            tasks: &s,
            periodic: &p,
            non_periodic: &np,
        };
        assert_eq!(ce.decide(5, &v), Decision::Idle { until_ns: 8 });
    }

    #[test]
    fn divisors_and_lcm() {
        assert_eq!(divisors_in(12, 2, 6), vec![6, 4, 3, 2]);
        assert_eq!(
            divisors_in(1 << 62, 1 << 60, 1 << 61),
            vec![1 << 61, 1 << 60]
        );
        assert_eq!(lcm(4, 6), Some(12));
        assert_eq!(lcm(u64::MAX, u64::MAX - 1), None);
    }
}
