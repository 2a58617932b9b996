//! A tuple-space classifier (Srinivasan, Suri & Varghese, SIGCOMM 1999):
//! the same decisions as the linear first-match scan, at a cost that grows
//! with the number of distinct rule *shapes*, not with the number of rules.
//!
//! Each rule is expanded into prefixes: its address fields already are, and a
//! port range splits into the few aligned power-of-two blocks that cover it
//! (at most 30 for 16 bits). A *shape* is the tuple of prefix lengths (and
//! whether the protocol is exact). Every shape gets one hash table from the
//! masked 5-tuple to the lowest rule index with that key. A packet is masked
//! with each shape in turn and looked up; the lowest index found is the first
//! match. Rule sets in practice have a handful of shapes whatever their
//! length, so a lookup is a handful of hash probes for 1 rule or 10,000.
//!
//! The kernel PE loads the same tables into BPF maps, and the dedicated-core
//! filter uses this type directly, so all three PEs decide alike; a property
//! test checks this classifier against [`RuleSet::decide`] on random rules.

use std::collections::HashMap;

use serde::Serialize;

use crate::rule::{Action, Packet, Proto, RuleSet, Verdict, mask32};

/// Most table entries a rule set may expand to.
pub const MAX_ENTRIES: usize = 1 << 20;

/// The prefix lengths of one tuple shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Shape {
    /// The protocol is compared (not a wildcard).
    pub proto_exact: bool,
    pub src_len: u8,
    pub sport_len: u8,
    pub dst_len: u8,
    pub dport_len: u8,
}

impl Shape {
    /// Masks a packet's fields with this shape.
    pub fn key(&self, p: &Packet) -> Key {
        Key {
            proto: if self.proto_exact { p.proto } else { 0 },
            src: p.src & mask32(self.src_len),
            sport: p.sport & mask16(self.sport_len),
            dst: p.dst & mask32(self.dst_len),
            dport: p.dport & mask16(self.dport_len),
        }
    }

    /// The masks of the shape's fields (for the kernel's table of shapes).
    pub fn masks(&self) -> (u8, u32, u16, u32, u16) {
        (
            if self.proto_exact { u8::MAX } else { 0 },
            mask32(self.src_len),
            mask16(self.sport_len),
            mask32(self.dst_len),
            mask16(self.dport_len),
        )
    }
}

/// The netmask of a `len`-bit port prefix.
pub fn mask16(len: u8) -> u16 {
    if len == 0 {
        0
    } else {
        u16::MAX << (16 - u32::from(len.min(16)))
    }
}

/// A masked 5-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Key {
    pub proto: u8,
    pub src: u32,
    pub sport: u16,
    pub dst: u32,
    pub dport: u16,
}

/// The aligned power-of-two blocks that exactly cover `lo..=hi`, as
/// (value, prefix length) pairs over 16 bits.
pub fn port_prefixes(lo: u16, hi: u16) -> Vec<(u16, u8)> {
    let (mut lo, hi) = (u32::from(lo), u32::from(hi));
    let mut out = Vec::new();
    while lo <= hi {
        // The largest block aligned at `lo` that does not run past `hi`.
        let mut size = if lo == 0 {
            1 << 16
        } else {
            1u32 << lo.trailing_zeros()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        #[allow(clippy::cast_possible_truncation)] // lo < 2^16, log2(size) <= 16
        out.push((lo as u16, (16 - size.trailing_zeros()) as u8));
        lo += size;
    }
    out
}

/// Why a rule set cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error(
        "the rule set expands to more than {MAX_ENTRIES} table entries (port ranges split into prefixes); at rule {rule} (line {line})"
    )]
    TooManyEntries { rule: usize, line: usize },
}

/// The compiled classifier.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    shapes: Vec<Shape>,
    tables: Vec<HashMap<Key, u32>>,
    verdicts: Vec<(Action, bool)>,
    entries: usize,
}

impl Classifier {
    /// Compiles a rule set.
    pub fn compile(rs: &RuleSet) -> Result<Classifier, CompileError> {
        let mut c = Classifier::default();
        let mut shape_index: HashMap<Shape, usize> = HashMap::new();
        for (i, r) in rs.rules.iter().enumerate() {
            let rule = u32::try_from(i).expect("MAX_RULES fits in 32 bits");
            c.verdicts.push((r.action, r.log));
            let sports = port_prefixes(r.sport.lo, r.sport.hi);
            let dports = port_prefixes(r.dport.lo, r.dport.hi);
            for &(sport, sport_len) in &sports {
                for &(dport, dport_len) in &dports {
                    let shape = Shape {
                        proto_exact: r.proto != Proto::Any,
                        src_len: r.src.len,
                        sport_len,
                        dst_len: r.dst.len,
                        dport_len,
                    };
                    let s = *shape_index.entry(shape).or_insert_with(|| {
                        c.shapes.push(shape);
                        c.tables.push(HashMap::new());
                        c.shapes.len() - 1
                    });
                    let key = Key {
                        proto: match r.proto {
                            Proto::Any => 0,
                            Proto::Is(p) => p,
                        },
                        src: r.src.addr,
                        sport,
                        dst: r.dst.addr,
                        dport,
                    };
                    // Rules come in order: an earlier rule with the same key wins.
                    if let std::collections::hash_map::Entry::Vacant(v) = c.tables[s].entry(key) {
                        v.insert(rule);
                        c.entries += 1;
                        if c.entries > MAX_ENTRIES {
                            return Err(CompileError::TooManyEntries {
                                rule: i + 1,
                                line: r.line,
                            });
                        }
                    }
                }
            }
        }
        Ok(c)
    }

    /// The first matching rule's verdict, by one probe per shape.
    pub fn decide(&self, p: &Packet) -> Verdict {
        let best = self
            .shapes
            .iter()
            .zip(&self.tables)
            .filter_map(|(s, t)| t.get(&s.key(p)).copied())
            .min();
        match best {
            None => Verdict::DEFAULT_DENY,
            Some(i) => {
                let (action, log) = self.verdicts[i as usize];
                Verdict {
                    rule: Some(i as usize),
                    action,
                    log,
                }
            }
        }
    }

    /// The distinct shapes, in the order their tables are probed.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// Every table entry: (shape index, masked key, rule index).
    pub fn entries(&self) -> impl Iterator<Item = (usize, Key, u32)> + '_ {
        self.tables
            .iter()
            .enumerate()
            .flat_map(|(s, t)| t.iter().map(move |(k, r)| (s, *k, *r)))
    }

    /// How many entries the tables hold.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when the rule set is empty (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Each rule's action and log flag, by rule index.
    pub fn verdicts(&self) -> &[(Action, bool)] {
        &self.verdicts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_split_into_aligned_blocks() {
        assert_eq!(port_prefixes(0, u16::MAX), vec![(0, 0)]);
        assert_eq!(port_prefixes(80, 80), vec![(80, 16)]);
        assert_eq!(port_prefixes(1024, 2047), vec![(1024, 6)]);
        let v = port_prefixes(1, 65534);
        assert_eq!(v.len(), 30, "the worst case over 16 bits");
        // The blocks tile the range exactly.
        for (lo, hi) in [
            (3u16, 77u16),
            (1000, 1999),
            (0, 0),
            (65535, 65535),
            (1, 65534),
        ] {
            let mut covered = 0u32;
            let mut next = u32::from(lo);
            for (v, len) in port_prefixes(lo, hi) {
                assert_eq!(u32::from(v), next, "blocks are contiguous");
                let size = 1u32 << (16 - len);
                assert_eq!(u32::from(v) % size, 0, "block aligned");
                next += size;
                covered += size;
            }
            assert_eq!(covered, u32::from(hi) - u32::from(lo) + 1);
        }
        assert_eq!(mask16(0), 0);
        assert_eq!(mask16(16), u16::MAX);
    }
}
