//! The chain's configuration: the TOML file that orders the chain
//! (`[[policy]] kind = "stats"` …, errors as `file:line: what`), and building the
//! configured policies. A temporal policy carries its rules:
//!
//! ```toml
//! [[policy]]
//! kind = "temporal"
//! utc_offset = "+01:00"          # optional, default "Z"
//! [[policy.rule]]
//! deny = ["write"]               # "read", "write", "all" or NFSv3 procedure names
//! outside = "09:00-17:00"        # or during = "22:00-06:00"; exactly one
//! days = ["mon", "tue"]          # optional, default every day
//! uids = [1000, 1001]            # optional (AUTH_SYS), default every caller
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::chain::Policy;
use crate::flowstats::{PolicyCounters, StatsPolicy};
use crate::handles::{HandleKey, HandlePolicy};
pub use crate::message::Msg;
use crate::pending::MAX_POLICIES;
use crate::temporal::{
    DAYS, ProcSet, TemporalPolicy, TemporalRule, TemporalRules, When, Window, parse_offset,
};

/// A policy template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Statistics per flow and operation (§4.4).
    Stats,
    /// File-handle security: MAC-protected virtual handles (§4.4).
    Handles,
    /// Temporal access control: deny operations by time window (§4.4).
    Temporal,
}

impl PolicyKind {
    pub const NAMES: [&'static str; 3] = ["stats", "handles", "temporal"];

    fn parse(s: &str) -> Option<Self> {
        match s {
            "stats" => Some(PolicyKind::Stats),
            "handles" => Some(PolicyKind::Handles),
            "temporal" => Some(PolicyKind::Temporal),
            _ => None,
        }
    }
}

/// One configured policy and the line of its `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyEntry {
    pub kind: PolicyKind,
    pub line: usize,
    /// The rules of a temporal policy (`None` for other kinds).
    pub temporal: Option<TemporalRules>,
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
    utc_offset: Option<toml::Spanned<String>>,
    rule: Option<Vec<RuleToml>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleToml {
    deny: toml::Spanned<Vec<toml::Spanned<String>>>,
    outside: Option<toml::Spanned<String>>,
    during: Option<toml::Spanned<String>>,
    days: Option<Vec<toml::Spanned<String>>>,
    uids: Option<Vec<u32>>,
}

/// The rules of a temporal policy whose `kind` is at `kind_line`.
fn temporal_rules(
    text: &str,
    entry: &EntryToml,
    kind_line: usize,
    err: &dyn Fn(usize, String) -> ConfigError,
) -> Result<TemporalRules, ConfigError> {
    let at = |s: &toml::Spanned<String>| line_of(text, s.span().start);
    let mut rules = TemporalRules::default();
    if let Some(o) = &entry.utc_offset {
        rules.utc_offset_min = parse_offset(o.get_ref()).map_err(|m| err(at(o), m))?;
    }
    let Some(list) = entry.rule.as_ref().filter(|l| !l.is_empty()) else {
        return Err(err(
            kind_line,
            "policy \"temporal\" needs at least one [[policy.rule]]".into(),
        ));
    };
    for r in list {
        let line = line_of(text, r.deny.span().start);
        let mut ops = ProcSet::default();
        for name in r.deny.get_ref() {
            ops.add_name(name.get_ref()).map_err(|m| err(at(name), m))?;
        }
        if ops == ProcSet::default() {
            return Err(err(line, "deny lists no operation".into()));
        }
        let window =
            |w: &toml::Spanned<String>| Window::parse(w.get_ref()).map_err(|m| err(at(w), m));
        let when = match (&r.outside, &r.during) {
            (Some(w), None) => When::Outside(window(w)?),
            (None, Some(w)) => When::During(window(w)?),
            _ => {
                return Err(err(
                    line,
                    "a rule needs exactly one of outside = \"HH:MM-HH:MM\" or during = \"HH:MM-HH:MM\""
                        .into(),
                ));
            }
        };
        let mut days = 0x7f;
        if let Some(list) = &r.days {
            days = 0;
            for d in list {
                let Some(i) = DAYS
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(d.get_ref()))
                else {
                    return Err(err(
                        at(d),
                        format!("unknown day {:?} (known: {})", d.get_ref(), DAYS.join(", ")),
                    ));
                };
                days |= 1 << i;
            }
            if days == 0 {
                return Err(err(line, "days lists no day".into()));
            }
        }
        rules.rules.push(TemporalRule {
            ops,
            when,
            days,
            uids: r.uids.clone(),
            line,
        });
    }
    Ok(rules)
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
        let temporal = if kind == PolicyKind::Temporal {
            Some(temporal_rules(text, &entry, line, &err)?)
        } else {
            if entry.rule.is_some() || entry.utc_offset.is_some() {
                return Err(err(
                    line,
                    format!("policy {name:?} takes no rule or utc_offset (only \"temporal\" does)"),
                ));
            }
            None
        };
        spec.policies.push(PolicyEntry {
            kind,
            line,
            temporal,
        });
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
            PolicyKind::Temporal => out.push(Box::new(TemporalPolicy::new(
                p.temporal.clone().unwrap_or_default(),
                counters.clone(),
            ))),
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
                    line: 3,
                    temporal: None
                },
                PolicyEntry {
                    kind: PolicyKind::Handles,
                    line: 6,
                    temporal: None
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

    #[test]
    fn temporal_schema() {
        let text = "[[policy]]\nkind = \"temporal\"\nutc_offset = \"+01:00\"\n\
                    [[policy.rule]]\ndeny = [\"write\", \"READ\"]\noutside = \"09:00-17:00\"\n\
                    days = [\"mon\", \"Fri\"]\nuids = [1000]\n\
                    [[policy.rule]]\ndeny = [\"all\"]\nduring = \"22:00-06:00\"\n";
        let spec = parse_chain(text, "t.toml").unwrap();
        let rules = spec.policies[0].temporal.as_ref().unwrap();
        assert_eq!(rules.utc_offset_min, 60);
        assert_eq!(rules.rules.len(), 2);
        let r = &rules.rules[0];
        assert_eq!(
            (r.line, r.days, r.uids.clone()),
            (5, 0b1_0001, Some(vec![1000]))
        );
        assert!(r.ops.contains(crate::nfs3::Nfs3Proc::Read));
        assert!(r.ops.contains(crate::nfs3::Nfs3Proc::Remove));
        assert_eq!(
            rules.rules[1].when,
            When::During(Window {
                start: 1320,
                end: 360
            })
        );
        assert_eq!(rules.rules[1].line, 10);
        let counters = Arc::default();
        assert_eq!(build_policies(&spec, None, &counters).unwrap().len(), 1);
    }

    #[test]
    fn temporal_errors_say_file_and_line() {
        let head = "[[policy]]\nkind = \"temporal\"\n";
        let cases: &[(&str, usize, &str)] = &[
            ("", 2, "needs at least one [[policy.rule]]"),
            (
                "utc_offset = \"CET\"\n[[policy.rule]]\ndeny=[\"write\"]\noutside=\"09:00-17:00\"\n",
                3,
                "not a UTC offset",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\", \"wrte\"]\noutside = \"09:00-17:00\"\n",
                4,
                "unknown operation \"wrte\"",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\n",
                4,
                "exactly one of outside",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\noutside = \"09:00-17:00\"\nduring = \"01:00-02:00\"\n",
                4,
                "exactly one of outside",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\n\noutside = \"9-17\"\n",
                6,
                "window \"9-17\": \"9\" is not a time",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\nduring = \"09:00-25:00\"\n",
                5,
                "not a time",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\nduring = \"0900\"\n",
                5,
                "not a window",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\nduring = \"09:00-10:00\"\ndays = [\"mon\", \"funday\"]\n",
                6,
                "unknown day \"funday\"",
            ),
            (
                "[[policy.rule]]\ndeny = []\nduring = \"09:00-10:00\"\n",
                4,
                "deny lists no operation",
            ),
            (
                "[[policy.rule]]\ndeny = [\"null\"]\nduring = \"09:00-10:00\"\n",
                4,
                "NULL cannot be denied",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\nduring = \"09:00-10:00\"\nuids = [-1]\n",
                6,
                "",
            ),
            (
                "[[policy.rule]]\ndeny = [\"write\"]\nduring = \"09:00-10:00\"\ncolour = 1\n",
                6,
                "",
            ),
        ];
        for (tail, line, what) in cases {
            let e = parse_chain(&format!("{head}{tail}"), "t.toml").unwrap_err();
            assert_eq!(e.line, *line, "{tail}: {e}");
            assert!(e.message.contains(what), "{tail}: {e}");
            assert!(
                e.to_string().starts_with(&format!("t.toml:{line}: ")),
                "{e}"
            );
        }
        let e = parse_chain(
            "[[policy]]\nkind = \"stats\"\n[[policy.rule]]\ndeny = [\"write\"]\nduring = \"09:00-10:00\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("takes no rule"), "{e}");
    }
}
