//! HYDRA's run-to-completion schedulers for offcodes sharing one dedicated core
//! (Weinsberg 2007, §6.2.5–6.3.5), sans-IO.
//!
//! A dedicated core runs a dispatcher loop without preemption: the chosen task runs
//! until it yields. At every yield the loop asks a [`Scheduler`] what runs next,
//! giving it the time and the tasks' state ([`CoreView`]); the answer is a task or
//! "idle until `t`" ([`Decision`]). Three policies implement the trait:
//!
//! | policy | type | non-periodic work runs when |
//! |---|---|---|
//! | non-preemptive EDF (§6.3.1) | [`PlainEdf`] | no periodic job is released and the task's static WCET bound fits before the next release |
//! | `<EDF>++` (Fig. 6.3, `Nr ≤ t`) | [`EdfPlusPlus`] | no periodic job is released and its *ticket* (next segment's WCET) fits the slack |
//! | cyclic executive (§6.3.1) | [`CyclicExecutive`] | a frame's table entries are done and its ticket fits the rest of the frame |
//!
//! [`admit`] decides whether a [`TaskSet`] may share a core (utilisation, Jeffay's
//! non-preemptive EDF test, the smallest gap for tickets) and names the offending
//! tasks when not. [`simulate`] is the deterministic reference simulation, seeded,
//! that checks those answers and measures response times, misses and idle time.
//! [`section_6_3_5`] reruns the dissertation's `<EDF>++` evaluation on a documented
//! twenty-task set.
//!
//! Nothing here owns a thread, a clock or a socket: times are `u64` nanoseconds
//! passed in by the caller.

mod admission;
mod cyclic;
mod edf;
mod experiment;
mod scheduler;
mod sim;
mod task;

pub use admission::{Admitted, Infeasible, MAX_CHECKPOINTS, MAX_RELEASES, Share, Violation, admit};
pub use cyclic::{CyclicError, CyclicExecutive, MAX_TABLE};
pub use edf::{Background, EdfPlusPlus, PlainEdf};
pub use experiment::{
    Column, ExperimentError, Report, SEED_FIGURES, SeedFigures, section_6_3_5, section_6_3_5_tasks,
};
pub use scheduler::{
    CoreView, Decision, Job, NonPeriodicState, PeriodicState, PickPolicy, Scheduler,
};
pub use sim::{DeadlineMiss, ExecModel, ResponseStats, SimError, SimReport, TaskStats, simulate};
pub use task::{NonPeriodicTask, PeriodicTask, Sleep, TaskError, TaskId, TaskSet};
