//! The chain's configuration: the TOML file that orders the chain
//! (`[[policy]] kind = "stats"` …, errors as `file:line: what`), and building the
//! configured policies. Top-level keys choose the scheduler and the buffers;
//! policies that take settings carry them in their entry:
//!
//! ```toml
//! scheduler = "round-robin"      # or "longest-queue"; default round-robin
//! buffer_slots = 1024            # each policy's input buffer; default 1024
//!
//! [[policy]]
//! kind = "temporal"
//! utc_offset = "+01:00"          # optional, default "Z"
//! [[policy.rule]]
//! deny = ["write"]               # "read", "write", "all" or NFSv3 procedure names
//! outside = "09:00-17:00"        # or during = "22:00-06:00"; exactly one
//! days = ["mon", "tue"]          # optional, default every day
//! uids = [1000, 1001]            # optional (AUTH_SYS), default every caller
//!
//! [[policy]]
//! kind = "replicate"
//! reply = "all"                  # or "first", "majority"; default all
//! timeout_ms = 1000              # a replica silent this long is dead
//!
//! [[policy]]
//! kind = "rbac"                  # §4.5: Algorithm 2 and the VCN
//! policy = "rbac.toml"           # users, roles, permissions (see rbac_file)
//! store = "rbac.redb"            # persistent state; paths relative to this file
//! rewrite_uid = true             # forward as the object's owner; default true
//!
//! [[policy]]
//! kind = "synthetic"             # Fig. 4.12's extension; may repeat
//! keys = 20                      # default 20
//! key_bytes = 50                 # default 50
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::backend::Backend;
use crate::chain::{Policy, SCHEDULERS, Scheduler, scheduler};
use crate::flowstats::{PolicyCounters, StatsPolicy};
use crate::handles::{HandleKey, HandlePolicy};
pub use crate::message::Msg;
use crate::pending::MAX_POLICIES;
use crate::rbac::RbacModel;
use crate::rbac_file::load_rbac;
use crate::rbac_policy::{RbacPolicy, RbacSettings};
use crate::replicate::{ReplicatePolicy, ReplicateSettings, ReplyWhen};
use crate::store::Store;
use crate::synthetic::{MAX_KEY_BYTES, MAX_KEYS, SyntheticPolicy, SyntheticSettings};
use crate::temporal::{
    Clock, DAYS, ProcSet, TemporalPolicy, TemporalRule, TemporalRules, When, Window, parse_offset,
};

/// Slots of each policy's input buffer unless the file says otherwise.
pub const DEFAULT_BUFFER_SLOTS: usize = 1024;
/// The largest buffer accepted.
pub const MAX_BUFFER_SLOTS: usize = 1 << 20;

/// A policy template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Statistics per flow and operation (§4.4).
    Stats,
    /// File-handle security: MAC-protected virtual handles (§4.4).
    Handles,
    /// Temporal access control: deny operations by time window (§4.4).
    Temporal,
    /// Replication and failover across the servers (§4.4).
    Replicate,
    /// The synthetic extension of the scalability experiment (§4.7.2).
    Synthetic,
    /// Role-based access control with the Virtual Control Namespace (§4.5).
    Rbac,
}

impl PolicyKind {
    pub const NAMES: [&'static str; 6] = [
        "stats",
        "handles",
        "temporal",
        "replicate",
        "synthetic",
        "rbac",
    ];

    fn parse(s: &str) -> Option<Self> {
        match s {
            "stats" => Some(PolicyKind::Stats),
            "handles" => Some(PolicyKind::Handles),
            "temporal" => Some(PolicyKind::Temporal),
            "replicate" => Some(PolicyKind::Replicate),
            "synthetic" => Some(PolicyKind::Synthetic),
            "rbac" => Some(PolicyKind::Rbac),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Stats => "stats",
            PolicyKind::Handles => "handles",
            PolicyKind::Temporal => "temporal",
            PolicyKind::Replicate => "replicate",
            PolicyKind::Synthetic => "synthetic",
            PolicyKind::Rbac => "rbac",
        }
    }

    /// The settings keys an entry of this kind may carry.
    fn keys(self) -> &'static [&'static str] {
        match self {
            PolicyKind::Stats | PolicyKind::Handles => &[],
            PolicyKind::Temporal => &["utc_offset", "rule"],
            PolicyKind::Replicate => &["reply", "timeout_ms"],
            PolicyKind::Synthetic => &["keys", "key_bytes"],
            PolicyKind::Rbac => &["policy", "store", "rewrite_uid"],
        }
    }
}

/// One configured policy, the line of its `kind` and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyEntry {
    pub kind: PolicyKind,
    pub line: usize,
    /// The rules of a temporal policy.
    pub temporal: Option<TemporalRules>,
    /// A replication policy's settings.
    pub replicate: Option<ReplicateSettings>,
    /// A synthetic policy's settings.
    pub synthetic: Option<SyntheticSettings>,
    /// An RBAC policy's settings, and its policy once read (by `load_chain`).
    pub rbac: Option<(RbacSettings, Option<RbacModel>)>,
}

impl PolicyEntry {
    fn new(kind: PolicyKind, line: usize) -> Self {
        Self {
            kind,
            line,
            temporal: None,
            replicate: None,
            synthetic: None,
            rbac: None,
        }
    }
}

/// The chain's order, first policy nearest the clients, and how it is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// Where it was read from (for messages).
    pub source: String,
    pub policies: Vec<PolicyEntry>,
    /// The scheduler's name (one of `chain::SCHEDULERS`).
    pub scheduler: String,
    /// Slots of each policy's input buffer.
    pub buffer_slots: usize,
}

impl Default for ChainSpec {
    fn default() -> Self {
        Self {
            source: String::new(),
            policies: Vec::new(),
            scheduler: SCHEDULERS[0].to_string(),
            buffer_slots: DEFAULT_BUFFER_SLOTS,
        }
    }
}

impl ChainSpec {
    pub fn has(&self, kind: PolicyKind) -> bool {
        self.policies.iter().any(|p| p.kind == kind)
    }

    /// The policies' names in order, e.g. `handles -> stats`.
    pub fn describe(&self) -> String {
        if self.policies.is_empty() {
            return "empty (pass-through)".into();
        }
        let names: Vec<&str> = self.policies.iter().map(|p| p.kind.name()).collect();
        names.join(" -> ")
    }
}

pub use crate::config::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    policy: Vec<EntryToml>,
    scheduler: Option<toml::Spanned<String>>,
    buffer_slots: Option<toml::Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    kind: toml::Spanned<String>,
    utc_offset: Option<toml::Spanned<String>>,
    rule: Option<toml::Spanned<Vec<RuleToml>>>,
    reply: Option<toml::Spanned<String>>,
    timeout_ms: Option<toml::Spanned<i64>>,
    keys: Option<toml::Spanned<i64>>,
    key_bytes: Option<toml::Spanned<i64>>,
    policy: Option<toml::Spanned<String>>,
    store: Option<toml::Spanned<String>>,
    rewrite_uid: Option<toml::Spanned<bool>>,
}

impl EntryToml {
    /// The settings keys present, with the line each starts on.
    fn present(&self, text: &str) -> Vec<(&'static str, usize)> {
        let at = |s: std::ops::Range<usize>| line_of(text, s.start);
        let mut v = Vec::new();
        if let Some(x) = &self.utc_offset {
            v.push(("utc_offset", at(x.span())));
        }
        if let Some(x) = &self.rule {
            v.push(("rule", at(x.span())));
        }
        if let Some(x) = &self.reply {
            v.push(("reply", at(x.span())));
        }
        if let Some(x) = &self.timeout_ms {
            v.push(("timeout_ms", at(x.span())));
        }
        if let Some(x) = &self.keys {
            v.push(("keys", at(x.span())));
        }
        if let Some(x) = &self.key_bytes {
            v.push(("key_bytes", at(x.span())));
        }
        if let Some(x) = &self.policy {
            v.push(("policy", at(x.span())));
        }
        if let Some(x) = &self.store {
            v.push(("store", at(x.span())));
        }
        if let Some(x) = &self.rewrite_uid {
            v.push(("rewrite_uid", at(x.span())));
        }
        v
    }
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

type ErrFn<'a> = &'a dyn Fn(usize, String) -> ConfigError;

/// The rules of a temporal policy whose `kind` is at `kind_line`.
fn temporal_rules(
    text: &str,
    entry: &EntryToml,
    kind_line: usize,
    err: ErrFn<'_>,
) -> Result<TemporalRules, ConfigError> {
    let at = |s: &toml::Spanned<String>| line_of(text, s.span().start);
    let mut rules = TemporalRules::default();
    if let Some(o) = &entry.utc_offset {
        rules.utc_offset_min = parse_offset(o.get_ref()).map_err(|m| err(at(o), m.to_string()))?;
    }
    let Some(list) = entry.rule.as_ref().filter(|l| !l.get_ref().is_empty()) else {
        return Err(err(
            kind_line,
            "policy \"temporal\" needs at least one [[policy.rule]]".into(),
        ));
    };
    for r in list.get_ref() {
        rules.rules.push(temporal_rule(text, r, err)?);
    }
    Ok(rules)
}

fn temporal_rule(text: &str, r: &RuleToml, err: ErrFn<'_>) -> Result<TemporalRule, ConfigError> {
    let at = |s: &toml::Spanned<String>| line_of(text, s.span().start);
    let line = line_of(text, r.deny.span().start);
    let mut ops = ProcSet::default();
    for name in r.deny.get_ref() {
        ops.add_name(name.get_ref())
            .map_err(|m| err(at(name), m.to_string()))?;
    }
    if ops == ProcSet::default() {
        return Err(err(line, "deny lists no operation".into()));
    }
    let window = |w: &toml::Spanned<String>| {
        Window::parse(w.get_ref()).map_err(|m| err(at(w), m.to_string()))
    };
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
    Ok(TemporalRule {
        ops,
        when,
        days,
        uids: r.uids.clone(),
        line,
    })
}

/// An integer setting within `lo..=hi`.
fn bounded(
    text: &str,
    v: &toml::Spanned<i64>,
    name: &str,
    lo: i64,
    hi: i64,
    err: ErrFn<'_>,
) -> Result<usize, ConfigError> {
    let x = *v.get_ref();
    if !(lo..=hi).contains(&x) {
        return Err(err(
            line_of(text, v.span().start),
            format!("{name} = {x} is out of range ({lo} to {hi})"),
        ));
    }
    // In range 0..=hi with hi below usize::MAX on every target we build for.
    Ok(usize::try_from(x).unwrap_or(usize::MAX))
}

fn replicate_settings(
    text: &str,
    entry: &EntryToml,
    err: ErrFn<'_>,
) -> Result<ReplicateSettings, ConfigError> {
    let mut s = ReplicateSettings::default();
    if let Some(r) = &entry.reply {
        s.reply = ReplyWhen::parse(r.get_ref()).ok_or_else(|| {
            err(
                line_of(text, r.span().start),
                format!(
                    "reply = {:?} is not one of {}",
                    r.get_ref(),
                    ReplyWhen::NAMES.join(", ")
                ),
            )
        })?;
    }
    if let Some(t) = &entry.timeout_ms {
        let ms = bounded(text, t, "timeout_ms", 1, 3_600_000, err)?;
        s.timeout = Duration::from_millis(ms as u64);
    }
    Ok(s)
}

fn synthetic_settings(
    text: &str,
    entry: &EntryToml,
    err: ErrFn<'_>,
) -> Result<SyntheticSettings, ConfigError> {
    let mut s = SyntheticSettings::default();
    if let Some(k) = &entry.keys {
        s.keys = bounded(text, k, "keys", 0, MAX_KEYS as i64, err)?;
    }
    if let Some(b) = &entry.key_bytes {
        s.key_bytes = bounded(text, b, "key_bytes", 8, MAX_KEY_BYTES as i64, err)?;
    }
    Ok(s)
}

/// An RBAC entry's settings; paths are relative to the chain file's directory.
fn rbac_settings(
    file: &str,
    entry: &EntryToml,
    line: usize,
    err: ErrFn<'_>,
) -> Result<RbacSettings, ConfigError> {
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    let (Some(policy), Some(store)) = (&entry.policy, &entry.store) else {
        return Err(err(
            line,
            "policy \"rbac\" needs policy = \"FILE\" and store = \"FILE\"".into(),
        ));
    };
    Ok(RbacSettings {
        policy: dir.join(policy.get_ref()),
        store: dir.join(store.get_ref()),
        rewrite_uid: entry.rewrite_uid.as_ref().is_none_or(|b| *b.get_ref()),
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.bytes().filter(|&b| b == b'\n').count() + 1)
}

/// One `[[policy]]` entry.
fn parse_entry(
    text: &str,
    file: &str,
    entry: &EntryToml,
    spec: &ChainSpec,
    err: ErrFn<'_>,
) -> Result<PolicyEntry, ConfigError> {
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
    if kind != PolicyKind::Synthetic
        && let Some(first) = spec.policies.iter().find(|p| p.kind == kind)
    {
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
    if let Some((key, _)) = entry
        .present(text)
        .into_iter()
        .find(|(k, _)| !kind.keys().contains(k))
    {
        let takes = if kind.keys().is_empty() {
            "no settings".to_string()
        } else {
            kind.keys().join(", ")
        };
        return Err(err(
            line,
            format!("policy {name:?} takes no `{key}` (it takes {takes})"),
        ));
    }
    let mut p = PolicyEntry::new(kind, line);
    match kind {
        PolicyKind::Temporal => p.temporal = Some(temporal_rules(text, entry, line, err)?),
        PolicyKind::Replicate => p.replicate = Some(replicate_settings(text, entry, err)?),
        PolicyKind::Synthetic => p.synthetic = Some(synthetic_settings(text, entry, err)?),
        PolicyKind::Rbac => p.rbac = Some((rbac_settings(file, entry, line, err)?, None)),
        PolicyKind::Stats | PolicyKind::Handles => {}
    }
    Ok(p)
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
        ..ChainSpec::default()
    };
    if let Some(s) = &parsed.scheduler {
        if !SCHEDULERS.contains(&s.get_ref().as_str()) {
            return Err(err(
                line_of(text, s.span().start),
                format!(
                    "scheduler = {:?} is not one of {}",
                    s.get_ref(),
                    SCHEDULERS.join(", ")
                ),
            ));
        }
        spec.scheduler.clone_from(s.get_ref());
    }
    if let Some(b) = &parsed.buffer_slots {
        spec.buffer_slots = bounded(text, b, "buffer_slots", 1, MAX_BUFFER_SLOTS as i64, &err)?;
    }
    for entry in &parsed.policy {
        let p = parse_entry(text, file, entry, &spec, &err)?;
        spec.policies.push(p);
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
    let mut spec = parse_chain(&text, &file)?;
    for p in &mut spec.policies {
        if let Some((settings, model)) = &mut p.rbac {
            *model = Some(load_rbac(&settings.policy)?);
        }
    }
    Ok(spec)
}

/// What building a chain needs beyond its file.
pub struct BuildEnv<'a> {
    /// The handle policy's key.
    pub key: Option<&'a HandleKey>,
    /// Where the policies count.
    pub counters: &'a Arc<Mutex<PolicyCounters>>,
    /// The servers (the replication policy's replicas).
    pub servers: &'a [Backend],
    /// The clock of time-based policies (`None`: the system clock).
    pub clock: Option<Clock>,
}

/// Builds the policies of `spec`, in order; they report into `env.counters`.
pub fn build_policies(
    spec: &ChainSpec,
    env: &BuildEnv<'_>,
) -> Result<Vec<Box<dyn Policy<Msg>>>, ConfigError> {
    let mut out: Vec<Box<dyn Policy<Msg>>> = Vec::new();
    let err = |line, message: String| ConfigError {
        file: spec.source.clone(),
        line,
        message,
    };
    for p in &spec.policies {
        let counters = env.counters.clone();
        match p.kind {
            PolicyKind::Stats => out.push(Box::new(StatsPolicy::new(counters))),
            PolicyKind::Handles => {
                let Some(key) = env.key else {
                    return Err(err(
                        p.line,
                        "policy \"handles\" needs a key file (--key FILE)".into(),
                    ));
                };
                out.push(Box::new(HandlePolicy::new(key.clone(), counters)));
            }
            PolicyKind::Temporal => {
                let rules = p.temporal.clone().unwrap_or_default();
                out.push(Box::new(match &env.clock {
                    Some(c) => TemporalPolicy::with_clock(rules, counters, c.clone()),
                    None => TemporalPolicy::new(rules, counters),
                }));
            }
            PolicyKind::Replicate => {
                let n = env.servers.len();
                if !(1..=crate::replicate::MAX_REPLICAS).contains(&n) {
                    return Err(err(
                        p.line,
                        format!(
                            "policy \"replicate\" needs 1 to {} servers, {n} given",
                            crate::replicate::MAX_REPLICAS
                        ),
                    ));
                }
                let exports = env.servers.iter().map(|b| b.export.clone()).collect();
                out.push(Box::new(ReplicatePolicy::new(
                    p.replicate.unwrap_or_default(),
                    exports,
                    counters,
                )));
            }
            PolicyKind::Synthetic => out.push(Box::new(SyntheticPolicy::new(
                p.synthetic.unwrap_or_default(),
            ))),
            PolicyKind::Rbac => out.push(Box::new(build_rbac(p, env, &err)?)),
        }
    }
    Ok(out)
}

fn build_rbac(
    p: &PolicyEntry,
    env: &BuildEnv<'_>,
    err: ErrFn<'_>,
) -> Result<RbacPolicy, ConfigError> {
    let Some((settings, model)) = &p.rbac else {
        return Err(err(p.line, "policy \"rbac\" without its settings".into()));
    };
    let model = match model {
        Some(m) => m.clone(),
        None => load_rbac(&settings.policy)?,
    };
    let store = Store::open(&settings.store).map_err(|e| err(p.line, e.to_string()))?;
    let clock = env
        .clock
        .clone()
        .unwrap_or_else(|| Arc::new(std::time::SystemTime::now));
    RbacPolicy::new(
        model,
        store,
        clock,
        settings.rewrite_uid,
        env.counters.clone(),
    )
    .map_err(|e| err(p.line, e.to_string()))
}

/// A built chain: its policies in order, its scheduler and its buffer size.
pub type BuiltChain = (Vec<Box<dyn Policy<Msg>>>, Box<dyn Scheduler>, usize);

/// The policies, the scheduler and the buffer size of `spec`.
pub fn build_chain(spec: &ChainSpec, env: &BuildEnv<'_>) -> Result<BuiltChain, ConfigError> {
    let policies = build_policies(spec, env)?;
    let sched = scheduler(&spec.scheduler).ok_or_else(|| ConfigError {
        file: spec.source.clone(),
        line: 0,
        message: format!("unknown scheduler {:?}", spec.scheduler),
    })?;
    Ok((policies, sched, spec.buffer_slots))
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
                PolicyEntry::new(PolicyKind::Stats, 3),
                PolicyEntry::new(PolicyKind::Handles, 6)
            ]
        );
        assert_eq!(spec.describe(), "stats -> handles");
        assert_eq!(spec.scheduler, "round-robin");
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
        let e = build_policies(&spec, &env(&counters)).err().unwrap();
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
        assert_eq!(build_policies(&spec, &env(&counters)).unwrap().len(), 1);
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
        assert!(e.message.contains("takes no `rule`"), "{e}");
    }

    fn env(counters: &Arc<Mutex<PolicyCounters>>) -> BuildEnv<'_> {
        BuildEnv {
            key: None,
            counters,
            servers: &[],
            clock: None,
        }
    }

    #[test]
    fn scheduler_replication_and_synthetic_settings() {
        let text = "scheduler = \"longest-queue\"\nbuffer_slots = 8\n\
                    [[policy]]\nkind = \"replicate\"\nreply = \"majority\"\ntimeout_ms = 250\n\
                    [[policy]]\nkind = \"synthetic\"\nkeys = 3\n\
                    [[policy]]\nkind = \"synthetic\"\n";
        let spec = parse_chain(text, "c.toml").unwrap();
        assert_eq!(
            (spec.scheduler.as_str(), spec.buffer_slots),
            ("longest-queue", 8)
        );
        assert_eq!(
            spec.policies[0].replicate,
            Some(ReplicateSettings {
                reply: ReplyWhen::Majority,
                timeout: Duration::from_millis(250)
            })
        );
        assert_eq!(spec.policies[1].synthetic.unwrap().keys, 3);
        assert_eq!(
            spec.policies[2].synthetic,
            Some(SyntheticSettings::default())
        );
        let counters = Arc::default();
        let e = build_policies(&spec, &env(&counters)).err().unwrap();
        assert!(
            e.to_string()
                .starts_with("c.toml:4: policy \"replicate\" needs 1 to"),
            "{e}"
        );
        let one = Backend::any("127.0.0.1:1".parse().unwrap());
        let servers = [one.clone(), one];
        let mut with = env(&counters);
        with.servers = &servers;
        let (policies, sched, slots) = build_chain(&spec, &with).unwrap();
        assert_eq!(
            (policies.len(), sched.name(), slots),
            (3, "longest-queue", 8)
        );
    }

    #[test]
    fn rbac_entries_resolve_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let chain = dir.path().join("chain.toml");
        std::fs::write(
            &chain,
            "[[policy]]\nkind = \"rbac\"\npolicy = \"r.toml\"\nstore = \"s.redb\"\n",
        )
        .unwrap();
        // The policy file's own error, with its own file and line.
        std::fs::write(
            dir.path().join("r.toml"),
            "[[role]]\nname = \"user\"\n\n[session]\ninitial = [\"usr\"]\n",
        )
        .unwrap();
        let e = load_chain(&chain).unwrap_err();
        assert_eq!(
            e.file,
            dir.path().join("r.toml").display().to_string(),
            "{e}"
        );
        assert_eq!(e.line, 5, "{e}");
        std::fs::write(dir.path().join("r.toml"), "[[role]]\nname = \"user\"\n").unwrap();
        let spec = load_chain(&chain).unwrap();
        let (settings, model) = spec.policies[0].rbac.as_ref().unwrap();
        assert_eq!(settings.store, dir.path().join("s.redb"));
        assert!(settings.rewrite_uid);
        assert_eq!(model.as_ref().unwrap().roles.len(), 1);
        let counters = Arc::default();
        assert_eq!(build_policies(&spec, &env(&counters)).unwrap().len(), 1);
        assert!(dir.path().join("s.redb").exists(), "the store was created");
        let e = parse_chain(
            "[[policy]]\nkind = \"rbac\"\npolicy = \"r.toml\"\n",
            "c.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(
            e.message
                .contains("needs policy = \"FILE\" and store = \"FILE\""),
            "{e}"
        );
    }

    #[test]
    fn settings_errors_say_file_and_line() {
        let cases: &[(&str, usize, &str)] = &[
            (
                "scheduler = \"fifo\"\n",
                1,
                "scheduler = \"fifo\" is not one of round-robin",
            ),
            ("buffer_slots = 0\n", 1, "buffer_slots = 0 is out of range"),
            (
                "[[policy]]\nkind = \"replicate\"\nreply = \"most\"\n",
                3,
                "reply = \"most\" is not one of all",
            ),
            (
                "[[policy]]\nkind = \"replicate\"\n\ntimeout_ms = -5\n",
                4,
                "timeout_ms = -5 is out of range",
            ),
            (
                "[[policy]]\nkind = \"synthetic\"\nkey_bytes = 2\n",
                3,
                "key_bytes = 2 is out of range",
            ),
            (
                "[[policy]]\nkind = \"stats\"\nreply = \"all\"\n",
                2,
                "takes no `reply` (it takes no settings)",
            ),
            (
                "[[policy]]\nkind = \"synthetic\"\ntimeout_ms = 5\n",
                2,
                "takes no `timeout_ms` (it takes keys, key_bytes)",
            ),
            (
                "[[policy]]\nkind = \"replicate\"\n[[policy]]\nkind = \"replicate\"\n",
                4,
                "appears twice",
            ),
        ];
        for (text, line, what) in cases {
            let e = parse_chain(text, "s.toml").unwrap_err();
            assert_eq!(e.line, *line, "{text}: {e}");
            assert!(e.message.contains(what), "{text}: {e}");
        }
    }
}
