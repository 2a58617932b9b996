//! Why a module is not admitted: every reason names what is wrong and where.

use std::fmt;

/// One reason for rejecting a module.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Reason {
    #[error("not a valid WebAssembly module: {0}")]
    Malformed(String),
    #[error("unsupported WebAssembly feature: {0}")]
    Unsupported(String),
    #[error("operator `{op}` in {func} at offset {offset:#x} is not admitted ({why})")]
    BadOperator {
        func: String,
        offset: usize,
        op: String,
        why: String,
    },
    #[error("import `{import}`: {why}")]
    BadImport { import: String, why: String },
    #[error("invalid declared bounds: {0}")]
    BadBoundsSection(crate::bounds::BoundsError),
    #[error("declared bound: {0}")]
    BadDeclaredBound(String),
    #[error("recursion: {cycle} (the call graph must be acyclic)")]
    Recursion { cycle: String },
    #[error("call_indirect in {func} at offset {offset:#x} cannot be bounded: {why}")]
    IndirectCall {
        func: String,
        offset: usize,
        why: String,
    },
    #[error(
        "loop #{ordinal} in {func} at offset {offset:#x} has no provable bound and no declared bound: {why}"
    )]
    UnboundedLoop {
        func: String,
        ordinal: u32,
        offset: usize,
        why: String,
    },
    #[error(
        "loop #{ordinal} in {func} at offset {offset:#x}: declared bound {bound} exceeds the maximum {max} sidecore accepts"
    )]
    HugeDeclaredBound {
        func: String,
        ordinal: u32,
        offset: usize,
        bound: u64,
        max: u64,
    },
    #[error(
        "memory.grow in {func} at offset {offset:#x}: linear memory may not grow on the fast path; declare the pages you need as the memory's initial size"
    )]
    MemoryGrow { func: String, offset: usize },
    #[error("linear memory of {bytes} bytes exceeds the per-domain state cap of {cap} bytes")]
    MemoryTooLarge { bytes: u64, cap: u64 },
    #[error(
        "worst-case stack depth {bytes} bytes (call chain {chain}) exceeds the cap of {cap} bytes"
    )]
    StackTooDeep { bytes: u64, cap: u64, chain: String },
    #[error("missing export `{0}` required by the host ABI")]
    MissingExport(String),
    #[error("export `{name}` has type {got}; the ABI requires {want}")]
    BadExportType {
        name: String,
        got: String,
        want: String,
    },
    #[error(
        "handler `{handler}`: bound {bound_cycles:.0} cycles exceeds the inflated limit {inflated_cycles:.0} cycles (acceptable limit {limit_cycles:.0}{} × inflation {inflation})",
        batch_note(.batch)
    )]
    OverBudget {
        handler: String,
        /// For a batch entry, `B`: its limit is `B` × the per-buffer acceptable limit.
        batch: Option<u32>,
        bound_cycles: f64,
        inflated_cycles: f64,
        limit_cycles: f64,
        inflation: f64,
    },
    #[error("batch ABI: {0}")]
    BadBatch(String),
}

fn batch_note(b: &Option<u32>) -> String {
    match b {
        Some(b) => format!(" for a batch of B = {b} buffers, i.e. B × the per-buffer limit"),
        None => String::new(),
    }
}

impl Reason {
    /// A short stable tag for the kind of reason (used in tests and machine output).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::Malformed(_) => "malformed",
            Reason::Unsupported(_) => "unsupported",
            Reason::BadOperator { .. } => "bad-operator",
            Reason::BadImport { .. } => "bad-import",
            Reason::BadBoundsSection(_) => "bad-bounds-section",
            Reason::BadDeclaredBound(_) => "bad-declared-bound",
            Reason::Recursion { .. } => "recursion",
            Reason::IndirectCall { .. } => "indirect-call",
            Reason::UnboundedLoop { .. } => "unbounded-loop",
            Reason::HugeDeclaredBound { .. } => "huge-declared-bound",
            Reason::MemoryGrow { .. } => "memory-grow",
            Reason::MemoryTooLarge { .. } => "memory-too-large",
            Reason::StackTooDeep { .. } => "stack-too-deep",
            Reason::MissingExport(_) => "missing-export",
            Reason::BadExportType { .. } => "bad-export-type",
            Reason::OverBudget { .. } => "over-budget",
            Reason::BadBatch(_) => "bad-batch",
        }
    }
}

/// A rejection: all reasons found, plus the report if the analysis got that far.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub reasons: Vec<Reason>,
    pub report: Option<String>,
}

impl Rejection {
    pub fn has(&self, kind: &str) -> bool {
        self.reasons.iter().any(|r| r.kind() == kind)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "module rejected:")?;
        for r in &self.reasons {
            writeln!(f, "  - {r}")?;
        }
        if let Some(rep) = &self.report {
            write!(f, "{rep}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejection {}
