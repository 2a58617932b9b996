//! Admission: whether a task set may share one core under the schedulers of this
//! crate without a periodic job ever missing its deadline.
//!
//! Four tests, all of which must pass (every failure is reported, each naming the
//! tasks and the numbers):
//!
//! 1. **Utilisation** — `Σ e_i/p_i ≤ 1` over the periodic tasks: HYDRA's compute
//!    capacity constraint (Eq. 7.6 of the digest) for one core of capacity 1.
//!    Compared exactly in rational arithmetic; only if the common denominator
//!    overflows `u128` is it compared in floating point, and then conservatively
//!    (refused from `1 − 10⁻⁹`).
//! 2. **Non-preemptive EDF** — Jeffay, Stanat & Martel (RTSS 1991), exact for
//!    sporadic tasks and sufficient for periodic ones with any offsets: with the
//!    tasks sorted by period, for every task `i` and every `L` with
//!    `p_1 < L < p_i`, `L ≥ e_i + Σ_{j<i} ⌊(L−1)/p_j⌋·e_j`. It bounds the blocking
//!    by a longer-period job that started just before the shorter ones were
//!    released. Only the `L` where the right-hand side steps (`k·p_j + 1`, and
//!    `p_1 + 1`) need checking.
//! 3. **Smallest gap** — every non-periodic ticket (the largest WCET of any of the
//!    task's segments) must fit the *smallest gap*
//!    `G = min_{L > p_1} (L − Σ_j ⌊(L−1)/p_j⌋·e_j)`: the least spare time, over
//!    every window that starts when a segment starts, that the periodic work
//!    released after it leaves. It is Jeffay's blocking term for a task with no
//!    deadline of its own, so a segment no longer than `G` may start at *any*
//!    moment no periodic job is released — even by a scheduler that never looks
//!    at the next release — and no periodic job misses. A longer ticket cannot be
//!    run whenever the core is free without risking a deadline: only a scheduler
//!    that checks the slack could run it, so it is refused.
//! 4. **Release gap** — a ticket longer than the longest gap between two
//!    consecutive periodic releases (over one hyperperiod from the last start
//!    time) can never fit the slack at all, so the task would never run. With
//!    synchronous starts test 3 already implies this; with offsets it can bite.
//!    Skipped (reported as `None`) when the hyperperiod holds more than
//!    [`MAX_RELEASES`] releases.
//!
//! Tests 2 and 3 examine at most [`MAX_CHECKPOINTS`] windows; a set that needs more
//! (periods many orders of magnitude apart, or utilisation within a hair of 1 with
//! non-periodic tasks present) is refused as unverified rather than accepted.
//!
//! Why this suffices: `<EDF>++` and plain EDF run released periodic jobs exactly as
//! work-conserving non-preemptive EDF would, and start a non-periodic segment only
//! when its ticket (or static bound) fits before the next release — so test 2
//! alone protects the periodic jobs; the work-conserving variant of plain EDF is
//! protected by test 3. The property tests check this on random sets.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use serde::Serialize;

use crate::cyclic::lcm;
use crate::task::{PeriodicTask, TaskError, TaskSet};

/// Most windows tests 2 and 3 examine before refusing a set as unverified.
pub const MAX_CHECKPOINTS: u64 = 2_000_000;
/// Most releases test 4 enumerates before skipping itself.
pub const MAX_RELEASES: u64 = 200_000;

/// An accepted task set, with what the tests found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admitted {
    /// `Σ e/p` over the periodic tasks.
    pub utilisation: f64,
    /// The smallest gap `G` (test 3), ns; `u64::MAX` without periodic tasks;
    /// `None` if it was too costly to compute and no non-periodic task needed it.
    pub smallest_gap_ns: Option<u64>,
    /// The longest gap between consecutive periodic releases in steady state, ns
    /// (test 4); `None` without periodic tasks or when the hyperperiod is too long.
    pub largest_release_gap_ns: Option<u64>,
}

/// A periodic task's share of the core, as the utilisation test names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Share {
    /// The task.
    pub task: String,
    /// Its WCET, ns.
    pub wcet_ns: u64,
    /// Its period, ns.
    pub period_ns: u64,
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` {}/{} = {:.4}",
            self.task,
            self.wcet_ns,
            self.period_ns,
            self.wcet_ns as f64 / self.period_ns as f64
        )
    }
}

/// One failed admission test.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
pub enum Violation {
    /// Test 1.
    #[error(
        "utilisation test (Σ e/p ≤ 1, Eq. 7.6): Σ e/p = {utilisation:.6}{} over {}",
        if *.exact { " > 1" } else { ", too close to 1 to verify (hyperperiod overflows)" },
        list(.shares)
    )]
    Utilisation {
        /// `Σ e/p`.
        utilisation: f64,
        /// Whether the comparison was exact.
        exact: bool,
        /// Every periodic task's share, largest first.
        shares: Vec<Share>,
    },
    /// Test 2.
    #[error(
        "non-preemptive EDF test (Jeffay): task `{task}` (e = {wcet_ns} ns, p = {period_ns} ns), started 1 ns before {} release, leaves a window of {window_ns} ns that must hold {demand_ns} ns of work",
        names(.interferers)
    )]
    NonPreemptive {
        /// The blocking task.
        task: String,
        /// Its WCET.
        wcet_ns: u64,
        /// Its period.
        period_ns: u64,
        /// The shorter-period tasks whose jobs miss.
        interferers: Vec<String>,
        /// `L`.
        window_ns: u64,
        /// `e_i + Σ ⌊(L−1)/p_j⌋·e_j > L`.
        demand_ns: u64,
    },
    /// Test 3.
    #[error(
        "smallest-gap test: non-periodic task `{task}`'s ticket {ticket_ns} ns exceeds the smallest gap {smallest_gap_ns} ns, so it can never run whenever the core is free without risking a deadline (a window of {window_ns} ns from its start must also hold {demand_ns} ns of periodic work)"
    )]
    TicketExceedsSmallestGap {
        /// The non-periodic task.
        task: String,
        /// Its largest ticket.
        ticket_ns: u64,
        /// `G`.
        smallest_gap_ns: u64,
        /// The window `L` where `G` is attained.
        window_ns: u64,
        /// The periodic work due in that window.
        demand_ns: u64,
    },
    /// Test 4.
    #[error(
        "release-gap test: non-periodic task `{task}`'s ticket {ticket_ns} ns exceeds the longest gap between periodic releases ({largest_gap_ns} ns): it can never run without overrunning a release"
    )]
    TicketNeverFits {
        /// The non-periodic task.
        task: String,
        /// Its largest ticket.
        ticket_ns: u64,
        /// The longest release gap.
        largest_gap_ns: u64,
    },
    /// Test 2 or 3 would need more than [`MAX_CHECKPOINTS`] windows.
    #[error(
        "{test}: more than {MAX_CHECKPOINTS} windows to check (periods too far apart, or utilisation too close to 1); refused as unverified"
    )]
    Unverified {
        /// Which test.
        test: &'static str,
    },
}

fn list(shares: &[Share]) -> String {
    shares
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn names(tasks: &[String]) -> String {
    let quoted: Vec<String> = tasks.iter().map(|t| format!("`{t}`")).collect();
    format!("{}'s", quoted.join(", "))
}

/// Why a task set was not admitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Infeasible {
    /// Bad parameters; no test was run.
    #[error("invalid tasks: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<TaskError>),
    /// One or more tests failed.
    #[error("task set refused: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Vec<Violation>),
}

impl Infeasible {
    /// The failed tests (empty for invalid input).
    #[must_use]
    pub fn violations(&self) -> &[Violation] {
        match self {
            Self::Invalid(_) => &[],
            Self::Refused(v) => v,
        }
    }
}

/// Admits `tasks` or says which tests fail, for which tasks, with what numbers.
///
/// # Errors
/// [`Infeasible::Invalid`] for bad parameters, [`Infeasible::Refused`] listing
/// every failed test.
pub fn admit(tasks: &TaskSet) -> Result<Admitted, Infeasible> {
    tasks.validate().map_err(Infeasible::Invalid)?;
    let periodic = &tasks.periodic;
    let mut violations = Vec::new();
    let (over, exact) = utilisation_exceeds_one(periodic);
    let utilisation = tasks.periodic_utilisation();
    if over {
        violations.push(utilisation_violation(periodic, utilisation, exact));
    }
    jeffay(periodic, &mut violations);
    let gap = if over {
        None
    } else {
        smallest_gap(periodic, utilisation)
    };
    let release_gap = largest_release_gap(periodic);
    if !over {
        check_tickets(tasks, gap, release_gap, &mut violations);
    }
    if violations.is_empty() {
        Ok(Admitted {
            utilisation,
            smallest_gap_ns: gap.map(|g| g.gap_ns),
            largest_release_gap_ns: release_gap,
        })
    } else {
        Err(Infeasible::Refused(violations))
    }
}

fn utilisation_violation(periodic: &[PeriodicTask], utilisation: f64, exact: bool) -> Violation {
    let mut shares: Vec<Share> = periodic
        .iter()
        .map(|t| Share {
            task: t.name.clone(),
            wcet_ns: t.wcet_ns,
            period_ns: t.period_ns,
        })
        .collect();
    // Largest share first: e_a/p_a > e_b/p_b ⟺ e_a·p_b > e_b·p_a.
    shares.sort_by(|a, b| {
        (u128::from(b.wcet_ns) * u128::from(a.period_ns))
            .cmp(&(u128::from(a.wcet_ns) * u128::from(b.period_ns)))
    });
    Violation::Utilisation {
        utilisation,
        exact,
        shares,
    }
}

fn gcd128(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `(Σ e/p > 1, exact)`: exact rationals, or a conservative float comparison if
/// the denominator overflows.
fn utilisation_exceeds_one(periodic: &[PeriodicTask]) -> (bool, bool) {
    let exact = periodic.iter().try_fold((0u128, 1u128), |(num, den), t| {
        let (e, p) = (u128::from(t.wcet_ns), u128::from(t.period_ns));
        let l = (den / gcd128(den, p)).checked_mul(p)?;
        let num = num
            .checked_mul(l / den)?
            .checked_add(e.checked_mul(l / p)?)?;
        let g = gcd128(num, l).max(1);
        Some((num / g, l / g))
    });
    match exact {
        Some((num, den)) => (num > den, true),
        None => {
            let u: f64 = periodic
                .iter()
                .map(|t| t.wcet_ns as f64 / t.period_ns as f64)
                .sum();
            (u > 1.0 - 1e-9, false)
        }
    }
}

/// Periodic task indices sorted by period (then index).
fn by_period(periodic: &[PeriodicTask]) -> Vec<&PeriodicTask> {
    let mut v: Vec<&PeriodicTask> = periodic.iter().collect();
    v.sort_by_key(|t| t.period_ns);
    v
}

/// `Σ_j ⌊(L−1)/p_j⌋·e_j` over `tasks`, saturating.
fn demand(tasks: &[&PeriodicTask], window_ns: u64) -> u64 {
    let d: u128 = tasks
        .iter()
        .map(|t| u128::from((window_ns - 1) / t.period_ns) * u128::from(t.wcet_ns))
        .sum();
    u64::try_from(d).unwrap_or(u64::MAX)
}

/// Test 2.
fn jeffay(periodic: &[PeriodicTask], violations: &mut Vec<Violation>) {
    let sorted = by_period(periodic);
    let Some(p1) = sorted.first().map(|t| t.period_ns) else {
        return;
    };
    let mut budget = MAX_CHECKPOINTS;
    for (i, ti) in sorted.iter().enumerate().skip(1) {
        let shorter = &sorted[..i];
        let mut worst: Option<(u64, u64)> = None;
        let mut check = |l: u64| {
            let d = demand(shorter, l).saturating_add(ti.wcet_ns);
            if d > l && worst.is_none_or(|(wl, _)| l < wl) {
                worst = Some((l, d));
            }
        };
        // Windows k·p_j + 1 < p_i: k ≤ (p_i − 2)/p_j for each shorter task j.
        let n: u64 = shorter
            .iter()
            .map(|tj| ti.period_ns.saturating_sub(2) / tj.period_ns)
            .fold(1, u64::saturating_add);
        if n > budget {
            violations.push(Violation::Unverified {
                test: "non-preemptive EDF test (Jeffay)",
            });
            return;
        }
        let mut windows = vec![p1.saturating_add(1)];
        for tj in shorter {
            let mut l = tj.period_ns.saturating_add(1);
            while l < ti.period_ns {
                windows.push(l);
                l = l.saturating_add(tj.period_ns);
            }
        }
        windows.retain(|&l| l > p1 && l < ti.period_ns);
        budget -= n;
        windows.into_iter().for_each(&mut check);
        if let Some((window_ns, demand_ns)) = worst {
            violations.push(Violation::NonPreemptive {
                task: ti.name.clone(),
                wcet_ns: ti.wcet_ns,
                period_ns: ti.period_ns,
                interferers: shorter
                    .iter()
                    .filter(|t| t.period_ns < window_ns)
                    .map(|t| t.name.clone())
                    .collect(),
                window_ns,
                demand_ns,
            });
        }
    }
}

/// The smallest gap `G` and where it is attained.
#[derive(Debug, Clone, Copy)]
struct Gap {
    gap_ns: u64,
    window_ns: u64,
    demand_ns: u64,
}

/// Test 3's `G = min_{L > p_1} (L − Σ_j ⌊(L−1)/p_j⌋·e_j)`, walking the windows
/// `k·p_j + 1` in increasing order until `L − U·(L−1)` (a lower bound for every
/// later window) reaches the best so far. `None` past the budget.
fn smallest_gap(periodic: &[PeriodicTask], utilisation: f64) -> Option<Gap> {
    let sorted = by_period(periodic);
    if sorted.is_empty() {
        return Some(Gap {
            gap_ns: u64::MAX,
            window_ns: 0,
            demand_ns: 0,
        });
    }
    let u_hi = utilisation + 1e-9;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = sorted
        .iter()
        .enumerate()
        .filter_map(|(j, t)| t.period_ns.checked_add(1).map(|l| Reverse((l, j))))
        .collect();
    let mut best: Option<Gap> = None;
    for _ in 0..MAX_CHECKPOINTS {
        let Reverse((l, j)) = heap.pop()?;
        if let Some(next) = l.checked_add(sorted[j].period_ns) {
            heap.push(Reverse((next, j)));
        }
        if best.is_some_and(|b| b.window_ns == l) {
            continue;
        }
        let d = demand(&sorted, l);
        let g = l.saturating_sub(d);
        if best.is_none_or(|b| g < b.gap_ns) {
            best = Some(Gap {
                gap_ns: g,
                window_ns: l,
                demand_ns: d,
            });
        }
        let bound = l as f64 * (1.0 - u_hi) + u_hi;
        if best.is_some_and(|b| bound >= b.gap_ns as f64) {
            return best;
        }
    }
    None
}

/// Test 4's longest gap between consecutive releases over one hyperperiod from
/// the last start time.
fn largest_release_gap(periodic: &[PeriodicTask]) -> Option<u64> {
    let h = periodic.iter().try_fold(1u64, |h, t| lcm(h, t.period_ns))?;
    let count: u64 = periodic.iter().map(|t| h / t.period_ns).sum();
    if periodic.is_empty() || count > MAX_RELEASES {
        return None;
    }
    let s = periodic.iter().map(|t| t.start_ns).max()?;
    let end = s.checked_add(h)?;
    let mut releases = Vec::new();
    for t in periodic {
        let k = (s - t.start_ns).div_ceil(t.period_ns);
        let mut r = t.release_ns(k)?;
        while r < end {
            releases.push(r);
            r = r.checked_add(t.period_ns)?;
        }
    }
    releases.sort_unstable();
    releases.dedup();
    let first = *releases.first()?;
    let last = *releases.last()?;
    let inner = releases.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Some(inner.max(first.checked_add(h)? - last))
}

fn check_tickets(
    tasks: &TaskSet,
    gap: Option<Gap>,
    release_gap: Option<u64>,
    violations: &mut Vec<Violation>,
) {
    if tasks.non_periodic.is_empty() {
        return;
    }
    let Some(gap) = gap else {
        violations.push(Violation::Unverified {
            test: "smallest-gap test",
        });
        return;
    };
    for t in &tasks.non_periodic {
        let ticket_ns = t.max_ticket_ns();
        if ticket_ns > gap.gap_ns {
            violations.push(Violation::TicketExceedsSmallestGap {
                task: t.name.clone(),
                ticket_ns,
                smallest_gap_ns: gap.gap_ns,
                window_ns: gap.window_ns,
                demand_ns: gap.demand_ns,
            });
        } else if let Some(g) = release_gap.filter(|&g| ticket_ns > g) {
            violations.push(Violation::TicketNeverFits {
                task: t.name.clone(),
                ticket_ns,
                largest_gap_ns: g,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::NonPeriodicTask;

    fn p(name: &str, e: u64, period: u64) -> PeriodicTask {
        PeriodicTask::new(name, e, period)
    }

    #[test]
    fn a_light_set_is_admitted_with_its_gaps() {
        let set = TaskSet::new(
            vec![p("a", 1, 4), p("b", 2, 8)],
            vec![NonPeriodicTask::new("n", vec![1, 2])],
        );
        let ok = admit(&set).unwrap();
        assert!((ok.utilisation - 0.5).abs() < 1e-12);
        // L = 5: 5 − 1 = 4; L = 9: 9 − (2·1 + 2) = 5; L = 13: 13 − (3 + 2) = 8 …
        assert_eq!(ok.smallest_gap_ns, Some(4));
        // Releases at 0, 4 (wrap 8): gaps of 4.
        assert_eq!(ok.largest_release_gap_ns, Some(4));
    }

    #[test]
    fn utilisation_over_one_names_every_task_largest_share_first() {
        let set = TaskSet::new(vec![p("a", 1, 4), p("b", 7, 8)], vec![]);
        let err = admit(&set).unwrap_err();
        let Violation::Utilisation { exact, shares, .. } = &err.violations()[0] else {
            panic!("{err}");
        };
        assert!(exact);
        assert_eq!(
            shares.iter().map(|s| s.task.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
        let msg = err.to_string();
        assert!(msg.contains("Σ e/p = 1.125000 > 1"), "{msg}");
        assert!(msg.contains("`b` 7/8 = 0.8750"), "{msg}");
    }

    #[test]
    fn exactly_one_passes_the_utilisation_test() {
        let set = TaskSet::new(vec![p("a", 1, 3), p("b", 2, 3)], vec![]);
        assert!(admit(&set).is_ok());
    }

    #[test]
    fn jeffay_catches_blocking_the_utilisation_test_misses() {
        // U = 0.75, but b (5 ns) started just before a's release delays a's job
        // (deadline 4 ns after release) by up to 4 ns: L = 5 must hold 5 + 1.
        let set = TaskSet::new(vec![p("a", 1, 4), p("b", 5, 10)], vec![]);
        let err = admit(&set).unwrap_err();
        assert_eq!(
            err.violations(),
            &[Violation::NonPreemptive {
                task: "b".into(),
                wcet_ns: 5,
                period_ns: 10,
                interferers: vec!["a".into()],
                window_ns: 5,
                demand_ns: 6,
            }]
        );
        assert!(
            err.to_string()
                .contains("window of 5 ns that must hold 6 ns")
        );
    }

    #[test]
    fn a_ticket_beyond_the_smallest_gap_is_refused_with_its_numbers() {
        let set = TaskSet::new(
            vec![p("a", 1, 4), p("b", 2, 8)],
            vec![
                NonPeriodicTask::new("fits", vec![4]),
                NonPeriodicTask::new("long", vec![1, 5]),
            ],
        );
        let err = admit(&set).unwrap_err();
        assert_eq!(
            err.violations(),
            &[Violation::TicketExceedsSmallestGap {
                task: "long".into(),
                ticket_ns: 5,
                smallest_gap_ns: 4,
                window_ns: 5,
                demand_ns: 1,
            }]
        );
    }

    #[test]
    fn offsets_can_leave_no_gap_long_enough() {
        // Releases every 5 ns (two tasks of period 10, offset by 5): G = 9 but
        // no slack ever exceeds 5.
        let set = TaskSet::new(
            vec![p("a", 1, 10), p("b", 1, 10).with_start(5)],
            vec![NonPeriodicTask::new("n", vec![8])],
        );
        let err = admit(&set).unwrap_err();
        assert_eq!(
            err.violations(),
            &[Violation::TicketNeverFits {
                task: "n".into(),
                ticket_ns: 8,
                largest_gap_ns: 5,
            }]
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let set = TaskSet::new(vec![p("z", 1, 0)], vec![]);
        assert!(matches!(admit(&set), Err(Infeasible::Invalid(_))));
    }

    #[test]
    fn huge_denominators_fall_back_conservatively() {
        // Six periods near 2^40 with small pairwise gcds: the common denominator
        // overflows u128, so the comparison is in floating point.
        let periods = [1u64, 3, 7, 9, 13, 19].map(|d| (1u64 << 40) + d);
        let set = |div: u64| -> Vec<PeriodicTask> {
            periods
                .iter()
                .enumerate()
                .map(|(i, &q)| p(&format!("t{i}"), q / div, q))
                .collect()
        };
        // Σ ≈ 6/12: clearly below 1.
        assert_eq!(utilisation_exceeds_one(&set(12)), (false, false));
        // Σ ≈ 6/6 − 10⁻¹²: within the margin, refused as unverifiable.
        assert_eq!(utilisation_exceeds_one(&set(6)), (true, false));
        let err = admit(&TaskSet::new(set(6), vec![])).unwrap_err();
        assert!(
            err.to_string().contains("too close to 1 to verify"),
            "{err}"
        );
    }
}
