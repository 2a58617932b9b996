//! The `sidecore.bounds` custom section: loop bounds declared by a module's author.
//!
//! RBCyclone's only loop was `for (CONST) (...)`, whose body runs at most CONST times,
//! CONST possibly a deployment-time symbol such as `MTU` (thesis §4.2.3). A Wasm module
//! carries the same promise in a custom section named `sidecore.bounds`, UTF-8 text:
//!
//! ```text
//! // comment lines start with two slashes; entries are separated by newlines or `;`
//! FUNC LOOP MAX
//! ```
//!
//! * `FUNC` names the function: its index in the module's function index space (digits
//!   only), its export name, or its name in the `name` section.
//! * `LOOP` is the loop's ordinal within that function (0-based, in the order the
//!   `loop` opcodes appear), or `*` for every loop of the function whose bound the
//!   verifier cannot prove.
//! * `MAX` is the most times the loop body may start per entry into the loop: an
//!   integer, a deployment symbol (`MTU`, `PACKET_LEN_MAX`, ...), optionally followed by
//!   `/N` (divide, rounding up) and/or `+N`, e.g. `MTU/4+1`.
//!
//! A declared bound is a guarantee, not a hope: sidecore rewrites the module so that the
//! body's `MAX+1`-th start calls the host, which traps with "declared loop bound exceeded"
//! (see `instrument.rs`).

use std::collections::BTreeMap;

/// The custom section's name.
pub const SECTION: &str = "sidecore.bounds";

/// Which loops of a function an entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoopSel {
    /// One loop, by ordinal.
    Ordinal(u32),
    /// Every loop of the function without a proven bound.
    All,
}

/// How a function is named in an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FuncSel {
    Index(u32),
    Name(String),
}

/// One parsed entry, before symbols are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredBound {
    pub func: FuncSel,
    pub lp: LoopSel,
    pub max: BoundExpr,
    /// 1-based line in the section text, for error messages.
    pub line: usize,
}

/// What is wrong with the section's text or one of its bounds; every message says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("{SECTION}: not UTF-8 text ({0})")]
    NotUtf8(std::str::Utf8Error),
    #[error("{SECTION} line {line}: expected `FUNC LOOP MAX`, got `{entry}` ({fields} fields)")]
    FieldCount {
        line: usize,
        entry: String,
        fields: usize,
    },
    #[error("{SECTION} line {line}: function index `{index}` too large")]
    FuncIndexTooLarge { line: usize, index: String },
    #[error("{SECTION} line {line}: loop `{ordinal}` is neither an ordinal nor `*`")]
    BadLoop { line: usize, ordinal: String },
    #[error("{SECTION} line {line}: {what} `{text}` is not a non-negative integer")]
    NotInteger {
        line: usize,
        what: &'static str,
        text: String,
    },
    #[error("{SECTION} line {line}: divisor is zero in `{expr}`")]
    ZeroDivisor { line: usize, expr: String },
    #[error("{SECTION} line {line}: empty bound in `{expr}`")]
    EmptyBound { line: usize, expr: String },
    #[error("{SECTION} line {line}: bound `{base}` is neither an integer nor a symbol")]
    NotIntegerOrSymbol { line: usize, base: String },
    /// `known` lists the deployment's symbols, comma-separated.
    #[error("unknown bound symbol `{symbol}` (this deployment defines: {known})")]
    UnknownSymbol { symbol: String, known: String },
}

/// `BASE[/DIV][+ADD]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundExpr {
    pub base: BoundBase,
    pub div: u64,
    pub add: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundBase {
    Int(u64),
    Symbol(String),
}

impl BoundExpr {
    /// Resolves symbols against the deployment's table.
    pub fn resolve(&self, symbols: &BTreeMap<String, u64>) -> Result<u64, BoundsError> {
        let base = match &self.base {
            BoundBase::Int(v) => *v,
            BoundBase::Symbol(s) => *symbols.get(s).ok_or_else(|| {
                let known: Vec<&str> = symbols.keys().map(String::as_str).collect();
                BoundsError::UnknownSymbol {
                    symbol: s.clone(),
                    known: known.join(", "),
                }
            })?,
        };
        Ok(base.div_ceil(self.div).saturating_add(self.add))
    }
}

impl std::fmt::Display for BoundExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.base {
            BoundBase::Int(v) => write!(f, "{v}")?,
            BoundBase::Symbol(s) => write!(f, "{s}")?,
        }
        if self.div != 1 {
            write!(f, "/{}", self.div)?;
        }
        if self.add != 0 {
            write!(f, "+{}", self.add)?;
        }
        Ok(())
    }
}

fn parse_u64(s: &str, what: &'static str, line: usize) -> Result<u64, BoundsError> {
    s.parse::<u64>().map_err(|_| BoundsError::NotInteger {
        line,
        what,
        text: s.to_string(),
    })
}

fn parse_expr(s: &str, line: usize) -> Result<BoundExpr, BoundsError> {
    let (rest, add) = match s.split_once('+') {
        Some((a, b)) => (a, parse_u64(b, "addend", line)?),
        None => (s, 0),
    };
    let (base, div) = match rest.split_once('/') {
        Some((a, b)) => {
            let d = parse_u64(b, "divisor", line)?;
            if d == 0 {
                return Err(BoundsError::ZeroDivisor {
                    line,
                    expr: s.to_string(),
                });
            }
            (a, d)
        }
        None => (rest, 1),
    };
    if base.is_empty() {
        return Err(BoundsError::EmptyBound {
            line,
            expr: s.to_string(),
        });
    }
    let base = if base.bytes().all(|b| b.is_ascii_digit()) {
        BoundBase::Int(parse_u64(base, "bound", line)?)
    } else if base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        BoundBase::Symbol(base.to_string())
    } else {
        return Err(BoundsError::NotIntegerOrSymbol {
            line,
            base: base.to_string(),
        });
    };
    Ok(BoundExpr { base, div, add })
}

/// Parses the section's bytes.
pub fn parse(data: &[u8]) -> Result<Vec<DeclaredBound>, BoundsError> {
    let text = std::str::from_utf8(data).map_err(BoundsError::NotUtf8)?;
    let mut out = Vec::new();
    for (i, raw_line) in text.lines().enumerate() {
        let line = i + 1;
        for entry in raw_line.split(';') {
            let entry = entry.trim().trim_matches('\0').trim();
            if entry.is_empty() || entry.starts_with("//") {
                continue;
            }
            let fields: Vec<&str> = entry.split_whitespace().collect();
            if fields.len() != 3 {
                return Err(BoundsError::FieldCount {
                    line,
                    entry: entry.to_string(),
                    fields: fields.len(),
                });
            }
            let func =
                if fields[0].bytes().all(|b| b.is_ascii_digit()) {
                    FuncSel::Index(fields[0].parse().map_err(|_| {
                        BoundsError::FuncIndexTooLarge {
                            line,
                            index: fields[0].to_string(),
                        }
                    })?)
                } else {
                    FuncSel::Name(fields[0].to_string())
                };
            let lp = if fields[1] == "*" {
                LoopSel::All
            } else {
                LoopSel::Ordinal(fields[1].parse().map_err(|_| BoundsError::BadLoop {
                    line,
                    ordinal: fields[1].to_string(),
                })?)
            };
            let max = parse_expr(fields[2], line)?;
            out.push(DeclaredBound {
                func,
                lp,
                max,
                line,
            });
        }
    }
    Ok(out)
}

/// Encodes entries back to section text (used by `sidecore ext annotate` and tests).
pub fn encode(entries: &[(String, Option<u32>, String)]) -> String {
    let mut s = String::new();
    for (f, l, m) in entries {
        let l = l.map(|v| v.to_string()).unwrap_or_else(|| "*".into());
        s.push_str(&format!("{f} {l} {m}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_symbols() {
        let e = parse(b"// c\nhandle 0 64; 3 * MTU/4+1\n").unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].func, FuncSel::Name("handle".into()));
        assert_eq!(e[1].func, FuncSel::Index(3));
        assert_eq!(e[1].lp, LoopSel::All);
        let mut syms = BTreeMap::new();
        syms.insert("MTU".to_string(), 1500);
        assert_eq!(e[1].max.resolve(&syms).unwrap(), 376);
        assert_eq!(e[0].max.resolve(&syms).unwrap(), 64);
    }

    #[test]
    fn messages_keep_their_wording() {
        assert_eq!(
            parse(b"a 0\n").unwrap_err().to_string(),
            "sidecore.bounds line 1: expected `FUNC LOOP MAX`, got `a 0` (2 fields)"
        );
        assert_eq!(
            parse(b"a 0 5+x\n").unwrap_err().to_string(),
            "sidecore.bounds line 1: addend `x` is not a non-negative integer"
        );
        let mut syms = BTreeMap::new();
        syms.insert("MTU".to_string(), 1500);
        syms.insert("N".to_string(), 4);
        assert_eq!(
            parse(b"a 0 FOO\n").unwrap()[0]
                .max
                .resolve(&syms)
                .unwrap_err()
                .to_string(),
            "unknown bound symbol `FOO` (this deployment defines: MTU, N)"
        );
    }

    #[test]
    fn bad_entries_say_where() {
        assert!(
            parse(b"a 0\n")
                .unwrap_err()
                .to_string()
                .contains("line 1: expected `FUNC LOOP MAX`")
        );
        assert!(
            parse(b"\na x 3\n")
                .unwrap_err()
                .to_string()
                .contains("line 2: loop `x`")
        );
        assert!(
            parse(b"a 0 MTU/0\n")
                .unwrap_err()
                .to_string()
                .contains("divisor is zero")
        );
        assert!(
            parse(b"a 0 1-2\n")
                .unwrap_err()
                .to_string()
                .contains("neither an integer nor a symbol")
        );
        let e = parse(b"a 0 FOO\n").unwrap();
        assert!(
            e[0].max
                .resolve(&BTreeMap::new())
                .unwrap_err()
                .to_string()
                .contains("unknown bound symbol `FOO`")
        );
        assert!(
            parse(&[0xff, 0xfe])
                .unwrap_err()
                .to_string()
                .contains("not UTF-8")
        );
    }
}
