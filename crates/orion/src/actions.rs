//! The action log: every detection, lock, kill, thaw and release, with the evidence
//! that triggered it, kept in memory and optionally appended as JSON lines to a file.

use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// One logged action.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    /// CLOCK_MONOTONIC, ns.
    pub at_ns: u64,
    /// `detected`, `freeze`, `kill`, `thaw`, `release`, `skipped`, `error`.
    pub kind: String,
    /// What it was done to (a cgroup, a pid).
    pub target: String,
    /// Why: the evidence, as JSON.
    pub evidence: serde_json::Value,
}

/// The log.
#[derive(Debug, Default)]
pub struct ActionLog {
    entries: Vec<Action>,
    file: Option<PathBuf>,
}

impl ActionLog {
    /// A log kept in memory, and appended to `file` when given.
    pub fn new(file: Option<PathBuf>) -> ActionLog {
        ActionLog {
            entries: Vec::new(),
            file,
        }
    }

    /// Records an action.
    pub fn record(&mut self, kind: &str, target: impl Into<String>, evidence: impl Serialize) {
        let a = Action {
            at_ns: crate::shm::now_ns(),
            kind: kind.to_owned(),
            target: target.into(),
            evidence: serde_json::to_value(evidence).unwrap_or(serde_json::Value::Null),
        };
        if let Some(path) = &self.file
            && let Ok(line) = serde_json::to_string(&a)
            && let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
        self.entries.push(a);
    }

    /// Everything recorded.
    pub fn entries(&self) -> &[Action] {
        &self.entries
    }
}
