//! Stage 3 of the pipeline, **place**: the resolved problem goes to the layout
//! solver (`sidecore-layout`: a MILP on HiGHS with capacities, pull, gang and
//! asymmetric gang, most weighted offload first, then least cross-PE
//! bandwidth), which returns where each offcode goes and why.

use sidecore_layout::{Layout, SolveOptions};

use crate::error::PlanError;
use crate::resolve::Resolved;

/// A resolved manifest with its layout.
#[derive(Debug)]
pub struct Placed<'a> {
    pub resolved: Resolved<'a>,
    pub layout: Layout,
}

/// Solves the layout of a resolved manifest.
pub fn place<'a>(resolved: Resolved<'a>, opts: &SolveOptions) -> Result<Placed<'a>, PlanError> {
    let layout = sidecore_layout::solve(&resolved.problem, opts)?;
    assert_eq!(
        layout.assignment.len(),
        resolved.manifest.offcodes.len(),
        "the layout places every offcode exactly once"
    );
    Ok(Placed { resolved, layout })
}
