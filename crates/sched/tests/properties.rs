//! Property tests on random task sets: whatever admission accepts never misses a
//! deadline in the reference simulation (under every EDF flavour and the cyclic
//! executive, with actual times at or below the WCET); `<EDF>++` never starts a
//! segment whose ticket exceeds the slack; plain EDF and `<EDF>++` run the periodic
//! jobs identically; over-utilised sets are refused with every task named; bad
//! input is an error, never a panic.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use proptest::prelude::*;
use sidecore_sched::{
    CyclicError, CyclicExecutive, EdfPlusPlus, ExecModel, Infeasible, NonPeriodicTask,
    PeriodicTask, PickPolicy, PlainEdf, SimError, SimReport, TaskSet, Violation, admit, simulate,
};

/// Periods whose lcm is 6000 ns, so hyperperiods stay short and the cyclic
/// executive can build tables; and arbitrary ones, for everything else.
fn period() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![20u64, 25, 30, 40, 50, 60, 75, 100, 120, 150, 200, 300])
            .prop_map(|p| p * 10),
        50u64..3_000,
    ]
}

/// (period, share of the period in ‰, offset in ‰ of the period, priority).
fn periodic_params() -> impl Strategy<Value = (u64, u64, u64, u8)> {
    (period(), 1u64..=250, 0u64..1000, 0u8..3)
}

/// (segment sizes in ‰ of the smallest period, sleep min, sleep extra, start, priority).
fn non_periodic_params() -> impl Strategy<Value = (Vec<u64>, u64, u64, u64, u8)> {
    (
        prop::collection::vec(1u64..=600, 1..4),
        0u64..400,
        0u64..400,
        0u64..500,
        0u8..3,
    )
}

fn build(
    periodic: &[(u64, u64, u64, u8)],
    non_periodic: &[(Vec<u64>, u64, u64, u64, u8)],
) -> TaskSet {
    let p: Vec<PeriodicTask> = periodic
        .iter()
        .enumerate()
        .map(|(i, &(p, share, off, prio))| {
            PeriodicTask::new(format!("p{i}"), (p * share / 1000).max(1), p)
                .with_start(p * off / 1000)
                .with_priority(prio)
        })
        .collect();
    let min_p = p.iter().map(|t| t.period_ns).min().unwrap_or(1_000);
    let n = non_periodic
        .iter()
        .enumerate()
        .map(|(j, (segs, smin, sextra, start, prio))| {
            let segs = segs.iter().map(|s| (min_p * s / 1000).max(1)).collect();
            NonPeriodicTask::new(format!("n{j}"), segs)
                .with_sleep(*smin, smin + sextra)
                .with_start(*start)
                .with_priority(*prio)
        })
        .collect();
    TaskSet::new(p, n)
}

fn task_set() -> impl Strategy<Value = TaskSet> {
    (
        prop::collection::vec(periodic_params(), 1..6),
        prop::collection::vec(non_periodic_params(), 0..5),
    )
        .prop_map(|(p, n)| build(&p, &n))
}

fn horizon(set: &TaskSet) -> u64 {
    20 * set
        .periodic
        .iter()
        .map(|t| t.period_ns)
        .max()
        .unwrap_or(1_000)
}

fn exec_model() -> impl Strategy<Value = ExecModel> {
    prop_oneof![
        Just(ExecModel::WCET),
        (0.05f64..=1.0, any::<u64>()).prop_map(|(f, s)| ExecModel::random_fraction(f, s)),
    ]
}

fn no_misses(r: &SimReport) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        r.deadline_misses,
        0,
        "{} missed: {:?}",
        r.scheduler,
        r.first_misses
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// (a) Admitted sets never miss, under `<EDF>++` (both pick policies), plain EDF
    /// (both readings) and, where a table exists, the cyclic executive.
    /// (b) `<EDF>++` and plain EDF never start a segment longer than the slack, and
    /// run every periodic job at the same time as each other.
    #[test]
    fn admitted_sets_never_miss_a_deadline(set in task_set(), exec in exec_model()) {
        if admit(&set).is_err() {
            return Ok(());
        }
        let h = horizon(&set);
        let pp = simulate(&set, &EdfPlusPlus::default(), h, exec).unwrap();
        let pf = EdfPlusPlus { pick: PickPolicy::PriorityFirst };
        let pf = simulate(&set, &pf, h, exec).unwrap();
        let plain = simulate(&set, &PlainEdf::default(), h, exec).unwrap();
        let wc = simulate(&set, &PlainEdf::work_conserving(), h, exec).unwrap();
        for r in [&pp, &pf, &plain, &wc] {
            no_misses(r)?;
        }
        for r in [&pp, &pf, &plain] {
            prop_assert_eq!(r.slack_overruns, 0, "{} overran the slack", r.scheduler);
        }
        prop_assert_eq!(&pp.periodic, &plain.periodic);
        prop_assert_eq!(&pp.periodic, &pf.periodic);
        match CyclicExecutive::build(&set) {
            Ok(ce) => no_misses(&simulate(&set, &ce, h, exec).unwrap())?,
            Err(CyclicError::NoFrameSize { .. } | CyclicError::MajorCycleTooLong) => {}
            Err(e) => prop_assert!(false, "unexpected cyclic error {e}"),
        }
    }

    /// The smallest gap is sound at its boundary: a background task that is always
    /// ready and always holds a ticket of exactly the gap is admitted, and even the
    /// work-conserving reading of plain EDF, which starts it whenever no periodic
    /// job is released, never makes a periodic job miss. One more nanosecond is
    /// refused.
    #[test]
    fn a_ticket_of_exactly_the_smallest_gap_is_safe_even_work_conserving(
        periodic in prop::collection::vec(periodic_params(), 1..6),
        exec in exec_model(),
    ) {
        let set = build(&periodic, &[]);
        let Ok(ok) = admit(&set) else { return Ok(()) };
        let Some(gap) = ok.smallest_gap_ns else { return Ok(()) };
        let mut with = set.clone();
        with.non_periodic.push(NonPeriodicTask::new("bg", vec![gap]));
        let mut over = set.clone();
        over.non_periodic.push(NonPeriodicTask::new("bg", vec![gap + 1]));
        let refused = admit(&over).unwrap_err();
        let exceeds = matches!(refused.violations(), [Violation::TicketExceedsSmallestGap { .. }]);
        prop_assert!(exceeds, "{}", refused);
        match admit(&with) {
            Ok(_) => {}
            // With offsets the releases may never leave that much room.
            Err(e) => {
                let never = matches!(e.violations(), [Violation::TicketNeverFits { .. }]);
                prop_assert!(never, "{}", e);
                return Ok(());
            }
        }
        let h = horizon(&with);
        no_misses(&simulate(&with, &PlainEdf::work_conserving(), h, exec).unwrap())?;
        no_misses(&simulate(&with, &EdfPlusPlus::default(), h, exec).unwrap())?;
    }

    /// (c) Sets over a utilisation of 1 are refused by the utilisation test, which
    /// names every periodic task; and the simulation does show misses whenever the
    /// jobs due by the horizon need more than the horizon.
    #[test]
    fn over_utilised_sets_are_refused_naming_every_task(
        periodic in prop::collection::vec(periodic_params(), 1..6),
        hog in period(),
    ) {
        let mut set = build(&periodic, &[]);
        set.periodic.push(PeriodicTask::new("hog", hog, hog));
        let err = admit(&set).unwrap_err();
        let Some(Violation::Utilisation { shares, exact, .. }) = err.violations().first() else {
            return Err(TestCaseError::fail(format!("no utilisation violation: {err}")));
        };
        prop_assert!(*exact);
        let mut named: Vec<&str> = shares.iter().map(|s| s.task.as_str()).collect();
        let mut all: Vec<&str> = set.periodic.iter().map(|t| t.name.as_str()).collect();
        named.sort_unstable();
        all.sort_unstable();
        prop_assert_eq!(named, all);
        let msg = err.to_string();
        for t in &set.periodic {
            let quoted = format!("`{}`", t.name);
            prop_assert!(msg.contains(&quoted), "{}", msg);
        }
        let h = horizon(&set);
        let due: u64 = set
            .periodic
            .iter()
            .map(|t| {
                let jobs = (h + 1).saturating_sub(t.start_ns + t.period_ns).div_ceil(t.period_ns);
                jobs * t.wcet_ns
            })
            .sum();
        let r = simulate(&set, &EdfPlusPlus::default(), h, ExecModel::WCET).unwrap();
        if due > h {
            prop_assert!(r.deadline_misses > 0);
        }
    }

    /// Any parameters at all, down to 0 and up to `u64::MAX`: every entry point
    /// returns, with a result or an error.
    #[test]
    fn arbitrary_parameters_never_panic(
        periodic in prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..4),
        segments in prop::collection::vec(prop::collection::vec(any::<u64>(), 0..3), 0..3),
        small in any::<bool>(),
    ) {
        let shrink = |x: u64| if small { x % 5_000 } else { x };
        let p = periodic
            .iter()
            .enumerate()
            .map(|(i, &(e, p, s))| {
                PeriodicTask::new(format!("p{i}"), shrink(e), shrink(p)).with_start(shrink(s))
            })
            .collect();
        let n = segments
            .iter()
            .enumerate()
            .map(|(j, segs)| NonPeriodicTask::new(format!("n{j}"), segs.iter().map(|&x| shrink(x)).collect()))
            .collect();
        let set = TaskSet::new(p, n);
        let _ = admit(&set);
        let _ = CyclicExecutive::build(&set);
        for s in [&EdfPlusPlus::default() as &dyn sidecore_sched::Scheduler, &PlainEdf::default()] {
            let _ = simulate(&set, s, 20_000, ExecModel::random_fraction(0.5, 3));
        }
    }

    /// Bad parameters are errors from every entry point.
    #[test]
    fn bad_input_is_an_error_not_a_panic(set in task_set(), which in 0u8..5, pick in any::<prop::sample::Index>()) {
        let mut set = set;
        match which {
            0 => pick.get_mut(&mut set.periodic).period_ns = 0,
            1 => pick.get_mut(&mut set.periodic).wcet_ns = 0,
            2 => {
                let t = pick.get_mut(&mut set.periodic);
                t.wcet_ns = t.period_ns + 1;
            }
            3 => set.non_periodic.push(NonPeriodicTask::new("empty", vec![])),
            _ => set.non_periodic.push(NonPeriodicTask::new("zero", vec![5, 0])),
        }
        prop_assert!(matches!(admit(&set), Err(Infeasible::Invalid(_))));
        let r = simulate(&set, &EdfPlusPlus::default(), 1_000, ExecModel::WCET);
        prop_assert!(matches!(r, Err(SimError::InvalidTasks(_))));
        prop_assert!(matches!(CyclicExecutive::build(&set), Err(CyclicError::InvalidTasks(_))));
    }
}

/// The generator must produce admitted sets often enough for (a) to mean something.
#[test]
fn the_generator_produces_admitted_sets() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut admitted, mut with_np) = (0, 0);
    for _ in 0..200 {
        let set = task_set().new_tree(&mut runner).unwrap().current();
        if admit(&set).is_ok() {
            admitted += 1;
            with_np += usize::from(!set.non_periodic.is_empty());
        }
    }
    assert!(admitted >= 40, "only {admitted}/200 admitted");
    assert!(
        with_np >= 20,
        "only {with_np} admitted sets with non-periodic tasks"
    );
}
