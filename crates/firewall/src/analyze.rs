//! The SCIRON console's policy analysis, after Al-Shaer & Hamed, "Firewall
//! policy advisor for anomaly discovery and rule editing" (IM 2003): every
//! pair of rules is classified by the set relation of their 5-tuples, and
//! four anomalies are reported, each naming the two rules and their lines.
//!
//! For rules Ri before Rj (i < j):
//!
//! * **shadowing** — Rj matches only packets Ri already matched (Rj ⊆ Ri),
//!   with another action: Rj never applies.
//! * **redundancy** — Rj ⊆ Ri with the same action (Rj can go); or Ri ⊂ Rj with
//!   the same action and no rule between them that overlaps Ri with another
//!   action (Ri can go: Rj decides its packets the same way).
//! * **generalization** — Ri ⊂ Rj with another action: Rj is the general rule,
//!   Ri its exception. Often intended; reported as a warning.
//! * **correlation** — Ri and Rj overlap, neither contains the other, with
//!   other actions: their order decides the packets in the overlap.
//!
//! The pairwise scan is O(n²) with the redundancy condition kept incrementally
//! per rule, so 10,000 rules take about a second.

use std::fmt;

use serde::Serialize;

use crate::rule::{Rule, RuleSet};

/// How two rules' match sets relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    Disjoint,
    Equal,
    /// The first is strictly inside the second.
    Subset,
    /// The first strictly contains the second.
    Superset,
    /// They overlap; neither contains the other.
    Correlated,
}

/// The relation of `a` to `b`, field by field.
pub fn relation(a: &Rule, b: &Rule) -> Relation {
    let (mut sub, mut sup) = (true, true);
    for ((alo, ahi), (blo, bhi)) in a.ranges().into_iter().zip(b.ranges()) {
        if ahi < blo || bhi < alo {
            return Relation::Disjoint;
        }
        sub &= blo <= alo && ahi <= bhi;
        sup &= alo <= blo && bhi <= ahi;
    }
    match (sub, sup) {
        (true, true) => Relation::Equal,
        (true, false) => Relation::Subset,
        (false, true) => Relation::Superset,
        (false, false) => Relation::Correlated,
    }
}

/// A kind of anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Anomaly {
    Shadowing,
    Redundancy,
    Generalization,
    Correlation,
}

impl Anomaly {
    /// An error makes the policy wrong; a warning may be intended.
    pub fn is_error(self) -> bool {
        matches!(self, Anomaly::Shadowing | Anomaly::Redundancy)
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Anomaly::Shadowing => "shadowing",
            Anomaly::Redundancy => "redundancy",
            Anomaly::Generalization => "generalization",
            Anomaly::Correlation => "correlation",
        })
    }
}

/// A rule as a finding names it: its position (1-based) and line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    pub number: usize,
    pub line: usize,
}

/// One anomaly between two rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub anomaly: Anomaly,
    /// The earlier rule.
    pub first: RuleRef,
    /// The later rule.
    pub second: RuleRef,
    /// What it means, naming both rules.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.anomaly, self.message)
    }
}

/// Every anomaly of a rule set, in rule order.
pub fn analyze(rs: &RuleSet) -> Vec<Finding> {
    let mut out = Vec::new();
    let r = &rs.rules;
    let at = |i: usize| RuleRef {
        number: i + 1,
        line: r[i].line,
    };
    let name = |i: usize| format!("rule {} (line {})", i + 1, r[i].line);
    for i in 0..r.len() {
        // Whether a rule between i and the current j overlaps rule i with
        // another action (then i is not redundant to a later superset).
        let mut blocked = false;
        for j in i + 1..r.len() {
            let same = r[i].action == r[j].action;
            let rel = relation(&r[j], &r[i]);
            let finding = match rel {
                Relation::Equal | Relation::Subset if !same => Some((
                    Anomaly::Shadowing,
                    format!(
                        "{} is shadowed by {}: every packet it matches is {}ed first",
                        name(j),
                        name(i),
                        r[i].action
                    ),
                )),
                Relation::Equal | Relation::Subset => Some((
                    Anomaly::Redundancy,
                    format!(
                        "{} is redundant to {}: it matches only packets {} already {}",
                        name(j),
                        name(i),
                        name(i),
                        r[i].action.third_person()
                    ),
                )),
                Relation::Superset if !same => Some((
                    Anomaly::Generalization,
                    format!(
                        "{} is a generalization of {}: it {} what {} {}, and more",
                        name(j),
                        name(i),
                        r[j].action.third_person(),
                        name(i),
                        r[i].action.third_person()
                    ),
                )),
                Relation::Superset if !blocked => Some((
                    Anomaly::Redundancy,
                    format!(
                        "{} is redundant to {}: removing it changes nothing, {} {} the same packets",
                        name(i),
                        name(j),
                        name(j),
                        r[j].action.third_person()
                    ),
                )),
                Relation::Correlated if !same => Some((
                    Anomaly::Correlation,
                    format!(
                        "{} and {} are correlated: they overlap with different actions, and their order decides the overlap",
                        name(i),
                        name(j)
                    ),
                )),
                _ => None,
            };
            if let Some((anomaly, message)) = finding {
                out.push(Finding {
                    anomaly,
                    first: at(i),
                    second: at(j),
                    message,
                });
            }
            if !same && rel != Relation::Disjoint {
                blocked = true;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_table;

    /// The example policy of Al-Shaer & Hamed's Figure 2, in their layout.
    const PAPER: &str = "\
order protocol s_ip s_port d_ip d_port action
1  tcp 140.192.37.20 any *.*.*.*        80 deny
2  tcp 140.192.37.*  any *.*.*.*        80 accept
3  tcp *.*.*.*       any 161.120.33.40  80 accept
4  tcp 140.192.37.*  any 161.120.33.40  80 deny
5  tcp 140.192.37.30 any *.*.*.*        21 deny
6  tcp 140.192.37.*  any *.*.*.*        21 accept
7  tcp 140.192.37.*  any 161.120.33.40  21 accept
8  tcp *.*.*.*       any *.*.*.*        any deny
9  udp 140.192.37.*  any 161.120.33.40  53 accept
10 udp *.*.*.*       any 161.120.33.40  53 accept
11 udp 140.192.38.*  any 161.120.35.*   any accept
12 udp *.*.*.*       any *.*.*.*        any deny
";

    fn has(f: &[Finding], a: Anomaly, first: usize, second: usize) -> bool {
        f.iter()
            .any(|x| x.anomaly == a && x.first.number == first && x.second.number == second)
    }

    #[test]
    fn the_papers_example_policy() {
        let rs = parse_table("fig2.rules", PAPER).unwrap();
        let f = analyze(&rs);
        // The anomalies the paper reports for its Figure 2.
        assert!(has(&f, Anomaly::Shadowing, 3, 4), "{f:#?}");
        assert!(has(&f, Anomaly::Redundancy, 6, 7), "{f:#?}");
        assert!(has(&f, Anomaly::Redundancy, 9, 10), "{f:#?}");
        assert!(has(&f, Anomaly::Generalization, 1, 2), "{f:#?}");
        assert!(has(&f, Anomaly::Generalization, 5, 6), "{f:#?}");
        assert!(has(&f, Anomaly::Correlation, 1, 3), "{f:#?}");
        assert!(has(&f, Anomaly::Shadowing, 2, 4), "{f:#?}");
        assert!(has(&f, Anomaly::Generalization, 11, 12), "{f:#?}");
        // Each names both rules and their lines.
        let s = f
            .iter()
            .find(|x| x.anomaly == Anomaly::Shadowing && x.first.number == 3)
            .unwrap()
            .to_string();
        assert!(
            s.contains("rule 4 (line 5) is shadowed by rule 3 (line 4)"),
            "{s}"
        );
        // Disjoint rules are never paired.
        assert!(
            !f.iter()
                .any(|x| x.first.number == 9 && x.second.number == 11)
        );
    }

    #[test]
    fn redundancy_to_a_later_rule_needs_nothing_in_between() {
        // Rule 1 ⊂ rule 3, both accept: redundant, unless rule 2 (deny)
        // overlaps rule 1 in between.
        let clear = parse_table(
            "r",
            "1 tcp 10.1.0.0/16 any any 80 accept
2 udp any any any any deny
3 tcp 10.0.0.0/8 any any 80 accept
",
        )
        .unwrap();
        assert!(has(&analyze(&clear), Anomaly::Redundancy, 1, 3));
        let blocked = parse_table(
            "r",
            "1 tcp 10.1.0.0/16 any any 80 accept
2 tcp 10.1.2.0/24 any any any deny
3 tcp 10.0.0.0/8 any any 80 accept
",
        )
        .unwrap();
        let f = analyze(&blocked);
        assert!(!has(&f, Anomaly::Redundancy, 1, 3), "{f:#?}");
        assert!(has(&f, Anomaly::Correlation, 1, 2), "{f:#?}");
    }

    #[test]
    fn relations() {
        let rs = parse_table(
            "r",
            "1 tcp 10.0.0.0/8 any any 80 deny\n2 tcp 10.1.0.0/16 any any 80 deny\n3 udp any any any any deny\n4 tcp 10.0.0.0/8 any any 70-90 deny\n5 tcp 10.0.0.0/7 any any 80 deny\n",
        )
        .unwrap();
        let r = &rs.rules;
        assert_eq!(relation(&r[1], &r[0]), Relation::Subset);
        assert_eq!(relation(&r[0], &r[1]), Relation::Superset);
        assert_eq!(relation(&r[0], &r[2]), Relation::Disjoint);
        assert_eq!(relation(&r[0], &r[0]), Relation::Equal);
        assert_eq!(relation(&r[3], &r[4]), Relation::Correlated);
    }
}
