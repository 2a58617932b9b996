//! The chain's configuration: the TOML file that orders the chain
//! (`[[policy]] kind = "stats"` …, errors as `file:line: what`), and building the
//! configured policies.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::chain::Policy;
use crate::flowstats::{PolicyCounters, StatsPolicy};
use crate::handles::{HandleKey, HandlePolicy};
pub use crate::message::Msg;
use crate::pending::MAX_POLICIES;

/// A policy template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Statistics per flow and operation (§4.4).
    Stats,
    /// File-handle security: MAC-protected virtual handles (§4.4).
    Handles,
}

impl PolicyKind {
    pub const NAMES: [&'static str; 2] = ["stats", "handles"];

    fn parse(s: &str) -> Option<Self> {
        match s {
            "stats" => Some(PolicyKind::Stats),
            "handles" => Some(PolicyKind::Handles),
            _ => None,
        }
    }
}

/// One configured policy and the line of its `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyEntry {
    pub kind: PolicyKind,
    pub line: usize,
}

/// The chain's order, first policy nearest the clients.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainSpec {
    /// Where it was read from (for messages).
    pub source: String,
    pub policies: Vec<PolicyEntry>,
}

impl ChainSpec {
    pub fn has(&self, kind: PolicyKind) -> bool {
        self.policies.iter().any(|p| p.kind == kind)
    }
}

/// A policy file error: `file:line: message` (line 0: the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", if *line == 0 { String::new() } else { format!(":{line}") })]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    policy: Vec<EntryToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    kind: toml::Spanned<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.bytes().filter(|&b| b == b'\n').count() + 1)
}

/// Parses a chain file's text; `file` names it in errors.
pub fn parse_chain(text: &str, file: &str) -> Result<ChainSpec, ConfigError> {
    let err = |line, message: String| ConfigError {
        file: file.to_string(),
        line,
        message,
    };
    let parsed: FileToml = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s.start));
        err(line, e.message().trim().to_string())
    })?;
    let mut spec = ChainSpec {
        source: file.to_string(),
        policies: Vec::new(),
    };
    for entry in parsed.policy {
        let line = line_of(text, entry.kind.span().start);
        let name = entry.kind.get_ref();
        let Some(kind) = PolicyKind::parse(name) else {
            return Err(err(
                line,
                format!(
                    "unknown policy kind {name:?} (known: {})",
                    PolicyKind::NAMES.join(", ")
                ),
            ));
        };
        if let Some(first) = spec.policies.iter().find(|p| p.kind == kind) {
            return Err(err(
                line,
                format!(
                    "policy {name:?} appears twice (first at line {})",
                    first.line
                ),
            ));
        }
        if spec.policies.len() == MAX_POLICIES {
            return Err(err(
                line,
                format!("a chain holds at most {MAX_POLICIES} policies"),
            ));
        }
        spec.policies.push(PolicyEntry { kind, line });
    }
    Ok(spec)
}

/// Reads and parses a chain file.
pub fn load_chain(path: &Path) -> Result<ChainSpec, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 0,
        message: format!("reading: {e}"),
    })?;
    parse_chain(&text, &file)
}

/// Builds the policies of `spec`, in order; they report into `counters`.
pub fn build_policies(
    spec: &ChainSpec,
    key: Option<&HandleKey>,
    counters: &Arc<Mutex<PolicyCounters>>,
) -> Result<Vec<Box<dyn Policy<Msg>>>, ConfigError> {
    let mut out: Vec<Box<dyn Policy<Msg>>> = Vec::new();
    for p in &spec.policies {
        match p.kind {
            PolicyKind::Stats => out.push(Box::new(StatsPolicy::new(counters.clone()))),
            PolicyKind::Handles => {
                let Some(key) = key else {
                    return Err(ConfigError {
                        file: spec.source.clone(),
                        line: p.line,
                        message: "policy \"handles\" needs a key file (--key FILE)".into(),
                    });
                };
                out.push(Box::new(HandlePolicy::new(key.clone(), counters.clone())));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_lines() {
        let spec = parse_chain(
            "# chain\n[[policy]]\nkind = \"stats\"\n\n[[policy]]\nkind = \"handles\"\n",
            "p.toml",
        )
        .unwrap();
        assert_eq!(
            spec.policies,
            vec![
                PolicyEntry {
                    kind: PolicyKind::Stats,
                    line: 3
                },
                PolicyEntry {
                    kind: PolicyKind::Handles,
                    line: 6
                }
            ]
        );
        assert!(parse_chain("", "e.toml").unwrap().policies.is_empty());
    }

    #[test]
    fn errors_say_file_and_line() {
        let e = parse_chain(
            "[[policy]]\nkind = \"stats\"\n[[policy]]\nkind = \"nope\"\n",
            "p.toml",
        )
        .unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("p.toml", 4));
        assert!(
            e.to_string()
                .starts_with("p.toml:4: unknown policy kind \"nope\"")
        );
        let e = parse_chain(
            "[[policy]]\nkind = \"stats\"\n[[policy]]\nkind = \"stats\"\n",
            "p.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.message.contains("twice (first at line 2)"), "{e}");
        let e = parse_chain("[[policy]]\nkind = \"stats\"\ncolour = 1\n", "p.toml").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = parse_chain("[[policy]]\nkind = stats\n", "p.toml").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = parse_chain("[[policy]]\n", "p.toml").unwrap_err();
        assert!(e.message.contains("kind"), "{e}");
        let spec = parse_chain("[[policy]]\nkind = \"handles\"\n", "p.toml").unwrap();
        let counters = Arc::default();
        let e = build_policies(&spec, None, &counters).err().unwrap();
        assert_eq!(
            e.to_string(),
            "p.toml:2: policy \"handles\" needs a key file (--key FILE)"
        );
    }
}
