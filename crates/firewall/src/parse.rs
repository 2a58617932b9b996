//! Reading rule files, in two layouts, with every problem located:
//!
//! * **TOML** (`*.toml`): `[[rule]]` tables with `proto`, `src`, `sport`,
//!   `dst`, `dport`, `action` and optional `log`; the file's order is the
//!   rules' order.
//! * **The table of Al-Shaer & Hamed's "Firewall policy advisor"** (any other
//!   name): one rule per line, `order protocol src_ip src_port dst_ip
//!   dst_port action [log]`, sorted by `order`. `#` starts a comment; a
//!   header line starting with `order` is skipped.
//!
//! In both, `*` and `any` are wildcards, addresses are CIDR (`10.0.0.0/8`),
//! single (`10.1.2.3`) or dotted with trailing `*` octets (`10.1.*.*`), ports
//! are single (`80`) or ranges (`1024-65535`), protocols are `tcp`, `udp`,
//! `icmp`, `any` or a number, and actions are `accept` (also `allow`,
//! `permit`) or `deny` (also `reject`, `drop`, `block`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::rule::{Action, PROTO_ICMP, PROTO_TCP, PROTO_UDP, Ports, Prefix, Proto, Rule, RuleSet};

/// Most rules one file may hold: the classifier and the BPF maps are sized
/// for it.
pub const MAX_RULES: usize = 100_000;

/// One problem in a rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Why a rule file was refused: every problem found, located.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read rule file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", render(.file, .problems))]
    Invalid {
        file: String,
        problems: Vec<Problem>,
    },
}

fn render(file: &str, problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("{file}:{}:{}: {}", p.line, p.column, p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

/// Reads a rule file, choosing the layout by its name.
pub fn load(path: &Path) -> Result<RuleSet, RulesError> {
    let text = std::fs::read_to_string(path).map_err(|source| RulesError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let name = path.display().to_string();
    if path.extension().is_some_and(|e| e == "toml") {
        parse_toml(&name, &text)
    } else {
        parse_table(&name, &text)
    }
}

/// What is wrong with one field of a rule (the caller adds where).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FieldError(pub String);

/// Parses a protocol field.
pub fn proto(s: &str) -> Result<Proto, FieldError> {
    match s.to_ascii_lowercase().as_str() {
        "*" | "any" | "ip" => Ok(Proto::Any),
        "tcp" => Ok(Proto::Is(PROTO_TCP)),
        "udp" => Ok(Proto::Is(PROTO_UDP)),
        "icmp" => Ok(Proto::Is(PROTO_ICMP)),
        n => n.parse::<u8>().map(Proto::Is).map_err(|_| {
            FieldError(format!(
                "`{s}` is not a protocol (tcp, udp, icmp, any, or 0-255)"
            ))
        }),
    }
}

/// Parses an address field: `any`, `*`, CIDR, a single address, or dotted
/// octets with trailing `*`s.
pub fn prefix(s: &str) -> Result<Prefix, FieldError> {
    let bad = |why: &str| FieldError(format!("`{s}` is not an address: {why}"));
    if s == "*" || s.eq_ignore_ascii_case("any") {
        return Ok(Prefix::ANY);
    }
    if let Some((a, l)) = s.split_once('/') {
        let addr: Ipv4Addr = a.parse().map_err(|_| bad("bad IPv4 address"))?;
        let len: u8 = l
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| bad("the prefix length must be 0 to 32"))?;
        return Ok(Prefix::new(u32::from(addr), len));
    }
    let octets: Vec<&str> = s.split('.').collect();
    if octets.len() != 4 {
        return Err(bad("expected four octets"));
    }
    let (mut addr, mut len, mut wild) = (0u32, 0u8, false);
    for o in &octets {
        addr <<= 8;
        if *o == "*" {
            wild = true;
            continue;
        }
        if wild {
            return Err(bad("a `*` octet may only be followed by `*`"));
        }
        let v: u8 = o.parse().map_err(|_| bad("each octet is 0-255 or `*`"))?;
        addr |= u32::from(v);
        len += 8;
    }
    Ok(Prefix::new(addr, len))
}

/// Parses a port field: `any`, `*`, a port or a range `lo-hi`.
pub fn ports(s: &str) -> Result<Ports, FieldError> {
    if s == "*" || s.eq_ignore_ascii_case("any") {
        return Ok(Ports::ANY);
    }
    let bad = || {
        FieldError(format!(
            "`{s}` is not a port or a range (`80`, `1024-65535`, `any`)"
        ))
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s, s),
    };
    let lo: u16 = lo.parse().map_err(|_| bad())?;
    let hi: u16 = hi.parse().map_err(|_| bad())?;
    if lo > hi {
        return Err(FieldError(format!("port range `{s}` runs backwards")));
    }
    Ok(Ports { lo, hi })
}

/// Parses an action field; `-log` or `+log` suffixes ask for logging.
pub fn action(s: &str) -> Result<(Action, bool), FieldError> {
    let lower = s.to_ascii_lowercase();
    let (base, log) = match lower
        .strip_suffix("-log")
        .or_else(|| lower.strip_suffix("+log"))
    {
        Some(b) => (b.to_string(), true),
        None => (lower, false),
    };
    let a = match base.as_str() {
        "accept" | "allow" | "permit" | "pass" => Action::Accept,
        "deny" | "reject" | "drop" | "block" => Action::Deny,
        _ => {
            return Err(FieldError(format!(
                "`{s}` is not an action (accept or deny, optionally -log)"
            )));
        }
    };
    Ok((a, log))
}

/// A field of a TOML rule: a string, or a number for ports and protocols.
#[derive(Deserialize)]
#[serde(untagged)]
enum Field {
    Text(String),
    Number(i64),
}

impl Field {
    fn text(&self) -> String {
        match self {
            Field::Text(s) => s.clone(),
            Field::Number(n) => n.to_string(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    proto: Option<Spanned<Field>>,
    src: Option<Spanned<Field>>,
    sport: Option<Spanned<Field>>,
    dst: Option<Spanned<Field>>,
    dport: Option<Spanned<Field>>,
    action: Spanned<String>,
    log: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

/// Line and column (1-based) of byte `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    (
        before.matches('\n').count() + 1,
        before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
    )
}

/// Parses the TOML layout.
pub fn parse_toml(file: &str, text: &str) -> Result<RuleSet, RulesError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        RulesError::Invalid {
            file: file.to_string(),
            problems: vec![Problem {
                line,
                column,
                message: e.message().trim().to_string(),
            }],
        }
    })?;
    let mut problems = Vec::new();
    let mut rules = Vec::new();
    for r in raw.rule {
        let (line, _) = line_col(text, r.span().start);
        let r = r.into_inner();
        let mut field = |f: &Option<Spanned<Field>>,
                         parse: &dyn Fn(&str) -> Result<(), FieldError>| {
            if let Some(f) = f
                && let Err(FieldError(message)) = parse(&f.get_ref().text())
            {
                let (line, column) = line_col(text, f.span().start);
                problems.push(Problem {
                    line,
                    column,
                    message,
                });
            }
        };
        field(&r.proto, &|s| proto(s).map(drop));
        field(&r.src, &|s| prefix(s).map(drop));
        field(&r.sport, &|s| ports(s).map(drop));
        field(&r.dst, &|s| prefix(s).map(drop));
        field(&r.dport, &|s| ports(s).map(drop));
        let act = action(r.action.get_ref());
        if let Err(message) = &act {
            let (line, column) = line_col(text, r.action.span().start);
            problems.push(Problem {
                line,
                column,
                message: message.0.clone(),
            });
        }
        let get =
            |f: &Option<Spanned<Field>>| f.as_ref().map_or("any".into(), |f| f.get_ref().text());
        if let (Ok(p), Ok(s), Ok(sp), Ok(d), Ok(dp), Ok((a, l))) = (
            proto(&get(&r.proto)),
            prefix(&get(&r.src)),
            ports(&get(&r.sport)),
            prefix(&get(&r.dst)),
            ports(&get(&r.dport)),
            act,
        ) {
            rules.push(Rule {
                line,
                proto: p,
                src: s,
                sport: sp,
                dst: d,
                dport: dp,
                action: a,
                log: r.log.unwrap_or(false) || l,
            });
        }
    }
    finish(file, rules, problems)
}

/// Parses the table layout.
pub fn parse_table(file: &str, text: &str) -> Result<RuleSet, RulesError> {
    let mut problems = Vec::new();
    let mut by_order: BTreeMap<u64, Rule> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("");
        let words: Vec<(usize, &str)> = content
            .split_whitespace()
            .map(|w| (w.as_ptr() as usize - raw.as_ptr() as usize + 1, w))
            .collect();
        if words.is_empty() || words[0].1.eq_ignore_ascii_case("order") {
            continue;
        }
        match table_rule(line, &words) {
            Ok((order, rule)) => {
                if let Some(first) = by_order.get(&order) {
                    problems.push(Problem {
                        line,
                        column: words[0].0,
                        message: format!(
                            "order {order} is used twice (first on line {})",
                            first.line
                        ),
                    });
                } else {
                    by_order.insert(order, rule);
                }
            }
            Err(p) => problems.push(p),
        }
    }
    finish(file, by_order.into_values().collect(), problems)
}

/// One line of the table layout: its order and rule.
fn table_rule(line: usize, words: &[(usize, &str)]) -> Result<(u64, Rule), Problem> {
    let at = |k: usize, message: String| Problem {
        line,
        column: words.get(k).map_or(1, |w| w.0),
        message,
    };
    if !(7..=8).contains(&words.len()) {
        return Err(at(
            0,
            format!(
                "expected `order protocol src_ip src_port dst_ip dst_port action [log]`, got {} fields",
                words.len()
            ),
        ));
    }
    let order: u64 = words[0]
        .1
        .parse()
        .map_err(|_| at(0, format!("`{}` is not an order number", words[0].1)))?;
    let (action, mut log) = action(words[6].1).map_err(|m| at(6, m.0))?;
    if let Some((_, w)) = words.get(7) {
        if w.eq_ignore_ascii_case("log") {
            log = true;
        } else {
            return Err(at(
                7,
                format!("`{w}` after the action: only `log` may follow"),
            ));
        }
    }
    Ok((
        order,
        Rule {
            line,
            proto: proto(words[1].1).map_err(|m| at(1, m.0))?,
            src: prefix(words[2].1).map_err(|m| at(2, m.0))?,
            sport: ports(words[3].1).map_err(|m| at(3, m.0))?,
            dst: prefix(words[4].1).map_err(|m| at(4, m.0))?,
            dport: ports(words[5].1).map_err(|m| at(5, m.0))?,
            action,
            log,
        },
    ))
}

fn finish(file: &str, rules: Vec<Rule>, mut problems: Vec<Problem>) -> Result<RuleSet, RulesError> {
    if rules.len() > MAX_RULES {
        problems.push(Problem {
            line: rules[MAX_RULES].line,
            column: 1,
            message: format!("more than {MAX_RULES} rules"),
        });
    }
    if problems.is_empty() {
        Ok(RuleSet {
            source: file.to_string(),
            rules,
        })
    } else {
        problems.sort_by_key(|p| (p.line, p.column));
        Err(RulesError::Invalid {
            file: file.to_string(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_and_refuse_with_reasons() {
        assert_eq!(prefix("10.1.*.*").unwrap(), Prefix::new(0x0a01_0000, 16));
        assert_eq!(prefix("any").unwrap(), Prefix::ANY);
        assert_eq!(prefix("*.*.*.*").unwrap(), Prefix::ANY);
        assert_eq!(prefix("10.0.0.0/8").unwrap().len, 8);
        assert_eq!(prefix("1.2.3.4").unwrap().len, 32);
        assert!(
            prefix("10.*.1.*")
                .unwrap_err()
                .0
                .contains("only be followed by `*`")
        );
        assert!(prefix("10.0.0.0/33").unwrap_err().0.contains("0 to 32"));
        assert!(prefix("10.0.0").unwrap_err().0.contains("four octets"));
        assert!(prefix("300.1.1.1").unwrap_err().0.contains("0-255"));
        assert_eq!(
            ports("1024-65535").unwrap(),
            Ports {
                lo: 1024,
                hi: 65535
            }
        );
        assert!(ports("9-3").unwrap_err().0.contains("backwards"));
        assert!(ports("http").unwrap_err().0.contains("not a port"));
        assert_eq!(proto("TCP").unwrap(), Proto::Is(PROTO_TCP));
        assert!(proto("sctpx").unwrap_err().0.contains("not a protocol"));
        assert_eq!(action("deny-log").unwrap(), (Action::Deny, true));
        assert_eq!(action("permit").unwrap(), (Action::Accept, false));
        assert!(action("maybe").unwrap_err().0.contains("not an action"));
    }

    #[test]
    fn the_papers_table_layout() {
        let text = "order protocol s_ip s_port d_ip d_port action\n\
                    2 tcp 140.192.37.* any *.*.*.* 80 deny\n\
                    1 tcp 140.192.37.20 any *.*.*.* 80 deny   # shadowed below? no: first\n\
                    \n\
                    3 udp any any 161.120.33.40 53 accept log\n";
        let rs = parse_table("t.rules", text).unwrap();
        assert_eq!(rs.rules.len(), 3);
        assert_eq!(rs.rules[0].line, 3, "sorted by order");
        assert_eq!(rs.rules[0].src.len, 32);
        assert!(rs.rules[2].log);
    }

    #[test]
    fn every_problem_is_located() {
        let text = "1 tcp 10.0.0.0/8 any any 80 deny\n\
                    1 tcp any any any 81 deny\n\
                    2 tcp any any any 99999 deny\n\
                    3 tcp any any\n\
                    4 tcp any any any 22 deny twice\n";
        let e = parse_table("bad.rules", text).unwrap_err().to_string();
        assert!(
            e.contains("bad.rules:2:1: order 1 is used twice (first on line 1)"),
            "{e}"
        );
        assert!(e.contains("bad.rules:3:19: `99999` is not a port"), "{e}");
        assert!(e.contains("bad.rules:4:1: expected `order protocol"), "{e}");
        assert!(
            e.contains("bad.rules:5:27: `twice` after the action"),
            "{e}"
        );

        let toml = "[[rule]]\nproto = \"tcp\"\ndport = 80\naction = \"deny\"\n\n[[rule]]\nsrc = \"10.0.0.0/99\"\naction = \"nope\"\n";
        let e = parse_toml("r.toml", toml).unwrap_err().to_string();
        assert!(
            e.contains("r.toml:7:7: `10.0.0.0/99` is not an address"),
            "{e}"
        );
        assert!(e.contains("r.toml:8:10: `nope` is not an action"), "{e}");
        let e = parse_toml("r.toml", "[[rule]]\nactoin = \"deny\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("r.toml:2:1: unknown field `actoin`"), "{e}");
        let ok = parse_toml(
            "r.toml",
            "[[rule]]\nproto = \"udp\"\ndport = \"53\"\naction = \"accept\"\nlog = true\n",
        )
        .unwrap();
        assert_eq!(ok.rules[0].line, 1);
        assert!(ok.rules[0].log);
    }
}
