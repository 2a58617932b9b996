//! The text formats of the Virtual Control Namespace's files, parsed from what
//! clients WRITE and rendered for what they READ (sans-IO, fuzzed):
//!
//! - a permission cell, `allow=ROLE|owner|mode|anyone|nobody [deny=ROLE]
//!   [log=ROLE] [alarm=ROLE]` (`-` clears deny, log or alarm), used by the policy
//!   file too;
//! - a shadow file: one line per operation, `OP CELL`, where OP is an NFSv3
//!   procedure (`READ`, any case but the classes'), a class (`read`, `write`,
//!   `all`, lower case) or `*` (the default for
//!   procedures without a line); writing lines changes only the keys they name,
//!   `reset` restores the policy's matrix; `#` starts a comment;
//! - `roles/ctrl`: the roles to activate, separated by spaces, commas or lines,
//!   or `reset` for the initial ones;
//! - `users/ctrl`: administrator commands, one a line: `assign USER ROLE`,
//!   `revoke USER ROLE`, `lift USER`, `threat USER`.
//!
//! Errors name the line (1-based) and what is wrong.

use std::fmt::Write as _;

use crate::nfs3::Nfs3Proc;
use crate::rbac::{Allow, Cell, Matrix, RoleId};
use crate::temporal::{READ_CLASS, WRITE_CLASS};

/// The most bytes a control file accepts in one WRITE.
pub const MAX_CONTROL_BYTES: usize = 64 * 1024;

/// A control file that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TextError {
    pub line: usize,
    pub message: String,
}

/// Role names resolve through this (the policy's roles).
pub type Roles<'a> = &'a dyn Fn(&str) -> Option<RoleId>;

/// Which cells a shadow line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Proc(Nfs3Proc),
    Default,
}

/// A change to a cell: each key present replaces that part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CellEdit {
    pub allow: Option<Allow>,
    pub deny: Option<Option<RoleId>>,
    pub log: Option<Option<RoleId>>,
    pub alarm: Option<Option<RoleId>>,
}

impl CellEdit {
    /// Applies the edit to `base`.
    pub fn apply(&self, base: Cell) -> Cell {
        Cell {
            allow: self.allow.unwrap_or(base.allow),
            deny: self.deny.unwrap_or(base.deny),
            log: self.log.unwrap_or(base.log),
            alarm: self.alarm.unwrap_or(base.alarm),
        }
    }

    /// A whole cell: `allow` is required.
    pub fn to_cell(self) -> Option<Cell> {
        Some(Cell {
            allow: self.allow?,
            deny: self.deny.flatten(),
            log: self.log.flatten(),
            alarm: self.alarm.flatten(),
        })
    }
}

/// One line of a shadow file write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixEdit {
    Reset,
    Set {
        targets: Vec<Target>,
        edit: CellEdit,
    },
}

/// Why an operation or a cell's permissions were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadCell {
    #[error("{0:?} is not KEY=VALUE (allow, deny, log, alarm)")]
    NotKeyValue(String),
    #[error("{0} given twice")]
    Twice(String),
    #[error("no role {0:?} (or owner, mode, anyone, nobody)")]
    NoAllowRole(String),
    #[error("no role {0:?}")]
    NoRole(String),
    #[error("unknown key {0:?} (allow, deny, log, alarm)")]
    UnknownKey(String),
    #[error("no permission given (allow=, deny=, log=, alarm=)")]
    Nothing,
    #[error("unknown operation {0:?} (an NFSv3 procedure, read, write, all or *)")]
    UnknownOp(String),
    #[error("NULL carries no object and is always allowed")]
    Null,
}

fn role_ref(value: &str, roles: Roles<'_>) -> Result<Option<RoleId>, BadCell> {
    if value == "-" {
        return Ok(None);
    }
    roles(value)
        .map(Some)
        .ok_or_else(|| BadCell::NoRole(value.to_string()))
}

/// Parses a cell's `key=value` words.
pub fn parse_cell(text: &str, roles: Roles<'_>) -> Result<CellEdit, BadCell> {
    let mut e = CellEdit::default();
    let mut any = false;
    for word in text.split_whitespace() {
        let (k, v) = word
            .split_once('=')
            .ok_or_else(|| BadCell::NotKeyValue(word.to_string()))?;
        let dup = || BadCell::Twice(k.to_string());
        match k {
            "allow" => {
                let a = match v {
                    "owner" => Allow::Owner,
                    "mode" => Allow::Mode,
                    "anyone" => Allow::Anyone,
                    "nobody" => Allow::Nobody,
                    role => Allow::Role(
                        roles(role).ok_or_else(|| BadCell::NoAllowRole(role.to_string()))?,
                    ),
                };
                if e.allow.replace(a).is_some() {
                    return Err(dup());
                }
            }
            "deny" | "log" | "alarm" => {
                let r = role_ref(v, roles)?;
                let slot = match k {
                    "deny" => &mut e.deny,
                    "log" => &mut e.log,
                    _ => &mut e.alarm,
                };
                if slot.replace(r).is_some() {
                    return Err(dup());
                }
            }
            other => return Err(BadCell::UnknownKey(other.to_string())),
        }
        any = true;
    }
    if !any {
        return Err(BadCell::Nothing);
    }
    Ok(e)
}

/// The cells an operation name covers.
pub fn targets(op: &str) -> Result<Vec<Target>, BadCell> {
    let procs = |ps: &[Nfs3Proc]| ps.iter().map(|&p| Target::Proc(p)).collect();
    // Classes are lower case; procedures any case ("READ" is the procedure, "read"
    // the class).
    Ok(match op {
        "*" => vec![Target::Default],
        "read" => procs(READ_CLASS),
        "write" => procs(WRITE_CLASS),
        "all" => procs(&[READ_CLASS, WRITE_CLASS].concat()),
        _ => {
            let p = Nfs3Proc::ALL
                .iter()
                .find(|p| format!("{p:?}").eq_ignore_ascii_case(op))
                .ok_or_else(|| BadCell::UnknownOp(op.to_string()))?;
            if *p == Nfs3Proc::Null {
                return Err(BadCell::Null);
            }
            vec![Target::Proc(*p)]
        }
    })
}

/// Lines of text with their 1-based numbers, comments and blanks skipped.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("").trim()))
        .filter(|(_, l)| !l.is_empty())
}

fn check_size(text: &str) -> Result<(), TextError> {
    if text.len() > MAX_CONTROL_BYTES {
        return Err(TextError {
            line: 0,
            message: format!("{} bytes exceed the limit {MAX_CONTROL_BYTES}", text.len()),
        });
    }
    Ok(())
}

/// Parses a write to a shadow file.
pub fn parse_matrix_edits(text: &str, roles: Roles<'_>) -> Result<Vec<MatrixEdit>, TextError> {
    check_size(text)?;
    let mut out = Vec::new();
    for (line, l) in lines(text) {
        let err = |e: BadCell| TextError {
            line,
            message: e.to_string(),
        };
        if l.eq_ignore_ascii_case("reset") {
            out.push(MatrixEdit::Reset);
            continue;
        }
        let (op, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
        let targets = targets(op).map_err(err)?;
        let edit = parse_cell(rest, roles).map_err(err)?;
        out.push(MatrixEdit::Set { targets, edit });
    }
    if out.is_empty() {
        return Err(TextError {
            line: 1,
            message: "nothing to change (OP allow=ROLE ..., or reset)".into(),
        });
    }
    Ok(out)
}

/// Applies edits to `m`; `policy` is what `reset` restores.
pub fn apply_edits(m: &mut Matrix, policy: &Matrix, edits: &[MatrixEdit]) {
    for e in edits {
        match e {
            MatrixEdit::Reset => *m = policy.clone(),
            MatrixEdit::Set { targets, edit } => {
                for t in targets {
                    let base = match t {
                        Target::Default => m.default,
                        Target::Proc(p) => m.cells[p.to_u32() as usize].or(m.default),
                    }
                    .unwrap_or(Cell::allow(Allow::Nobody));
                    let cell = edit.apply(base);
                    match t {
                        Target::Default => m.default = Some(cell),
                        Target::Proc(p) => m.set(*p, cell),
                    }
                }
            }
        }
    }
}

/// Renders a cell with role names from `name`.
pub fn render_cell(c: &Cell, name: &dyn Fn(RoleId) -> String) -> String {
    let mut s = format!(
        "allow={}",
        match c.allow {
            Allow::Role(r) => name(r),
            Allow::Owner => "owner".into(),
            Allow::Mode => "mode".into(),
            Allow::Anyone => "anyone".into(),
            Allow::Nobody => "nobody".into(),
        }
    );
    for (k, v) in [("deny", c.deny), ("log", c.log), ("alarm", c.alarm)] {
        if let Some(r) = v {
            let _ = write!(s, " {k}={}", name(r));
        }
    }
    s
}

/// Renders a matrix as a shadow file's body (parses back to the same matrix).
pub fn render_matrix(m: &Matrix, name: &dyn Fn(RoleId) -> String) -> String {
    let mut s = String::new();
    if let Some(d) = &m.default {
        let _ = writeln!(s, "* {}", render_cell(d, name));
    }
    for p in Nfs3Proc::ALL {
        if let Some(c) = &m.cells[p.to_u32() as usize] {
            let _ = writeln!(
                s,
                "{} {}",
                format!("{p:?}").to_uppercase(),
                render_cell(c, name)
            );
        }
    }
    s
}

/// What a write to `roles/ctrl` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolesRequest {
    /// Back to the initial roles.
    Reset,
    Roles(Vec<String>),
}

/// Parses a write to `roles/ctrl`.
pub fn parse_roles_request(text: &str) -> Result<RolesRequest, TextError> {
    check_size(text)?;
    let mut names = Vec::new();
    for (line, l) in lines(text) {
        for w in l.split([' ', '\t', ',']).filter(|w| !w.is_empty()) {
            if w.eq_ignore_ascii_case("reset") {
                return Ok(RolesRequest::Reset);
            }
            if !w
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(TextError {
                    line,
                    message: format!("{w:?} is not a role name"),
                });
            }
            names.push(w.to_string());
        }
    }
    if names.is_empty() {
        return Err(TextError {
            line: 1,
            message: "no role named (write role names, or reset)".into(),
        });
    }
    Ok(RolesRequest::Roles(names))
}

/// An administrator's command (`users/ctrl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    Assign {
        user: String,
        role: String,
    },
    Revoke {
        user: String,
        role: String,
    },
    /// Lifts the user's threat sessions.
    Lift {
        user: String,
    },
    /// Makes the user's sessions threats.
    Threat {
        user: String,
    },
}

/// Parses a write to `users/ctrl`.
pub fn parse_admin_commands(text: &str) -> Result<Vec<AdminCommand>, TextError> {
    check_size(text)?;
    let mut out = Vec::new();
    for (line, l) in lines(text) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let cmd = match w.as_slice() {
            ["assign", u, r] => AdminCommand::Assign {
                user: (*u).into(),
                role: (*r).into(),
            },
            ["revoke", u, r] => AdminCommand::Revoke {
                user: (*u).into(),
                role: (*r).into(),
            },
            ["lift", u] => AdminCommand::Lift { user: (*u).into() },
            ["threat", u] => AdminCommand::Threat { user: (*u).into() },
            _ => {
                return Err(TextError {
                    line,
                    message: format!(
                        "{l:?} is not a command (assign USER ROLE, revoke USER ROLE, lift USER, threat USER)"
                    ),
                });
            }
        };
        out.push(cmd);
    }
    if out.is_empty() {
        return Err(TextError {
            line: 1,
            message: "no command".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(n: &str) -> Option<RoleId> {
        ["user", "developer", "admin", "threat"]
            .iter()
            .position(|r| *r == n)
    }

    fn name(r: RoleId) -> String {
        ["user", "developer", "admin", "threat"][r].to_string()
    }

    #[test]
    fn shadow_edits_apply_and_render_back() {
        let policy = Matrix {
            default: Some(Cell::allow(Allow::Role(0))),
            ..Matrix::default()
        };
        let mut m = policy.clone();
        let edits = parse_matrix_edits(
            "# mine\nREAD allow=admin log=admin\nwrite allow=owner alarm=threat\n\n",
            &roles,
        )
        .unwrap();
        apply_edits(&mut m, &policy, &edits);
        assert_eq!(m.cell(Nfs3Proc::Read).unwrap().allow, Allow::Role(2));
        assert_eq!(m.cell(Nfs3Proc::Read).unwrap().log, Some(2));
        assert_eq!(m.cell(Nfs3Proc::Remove).unwrap().alarm, Some(3));
        assert_eq!(
            m.cell(Nfs3Proc::Getattr).unwrap().allow,
            Allow::Role(0),
            "default"
        );
        let text = render_matrix(&m, &name);
        assert!(text.contains("READ allow=admin log=admin\n"), "{text}");
        let mut again = Matrix::default();
        apply_edits(
            &mut again,
            &policy,
            &parse_matrix_edits(&text, &roles).unwrap(),
        );
        assert_eq!(again, m);
        // Clearing a key, and reset.
        apply_edits(
            &mut m,
            &policy,
            &parse_matrix_edits("READ log=-", &roles).unwrap(),
        );
        assert_eq!(m.cell(Nfs3Proc::Read).unwrap().log, None);
        apply_edits(
            &mut m,
            &policy,
            &parse_matrix_edits("reset", &roles).unwrap(),
        );
        assert_eq!(m, policy);
    }

    #[test]
    fn errors_name_the_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("READ allow=boss", 1, "no role \"boss\""),
            ("\nFLY allow=user", 2, "unknown operation \"FLY\""),
            ("READ", 1, "no permission given"),
            ("READ allow=user allow=admin", 1, "allow given twice"),
            ("READ colour=red", 1, "unknown key"),
            ("READ admin", 1, "is not KEY=VALUE"),
            ("NULL allow=user", 1, "always allowed"),
            ("# only a comment", 1, "nothing to change"),
        ];
        for (text, line, what) in cases {
            let e = parse_matrix_edits(text, &roles).unwrap_err();
            assert_eq!(e.line, *line, "{text}: {e}");
            assert!(e.message.contains(what), "{text}: {e}");
        }
        assert!(parse_matrix_edits(&"x".repeat(MAX_CONTROL_BYTES + 1), &roles).is_err());
    }

    #[test]
    fn roles_and_admin_commands() {
        assert_eq!(
            parse_roles_request("admin\n").unwrap(),
            RolesRequest::Roles(vec!["admin".into()])
        );
        assert_eq!(
            parse_roles_request("user, developer").unwrap(),
            RolesRequest::Roles(vec!["user".into(), "developer".into()])
        );
        assert_eq!(parse_roles_request("reset").unwrap(), RolesRequest::Reset);
        assert_eq!(parse_roles_request("\n\n").unwrap_err().line, 1);
        assert_eq!(parse_roles_request("user\nad$min").unwrap_err().line, 2);
        assert_eq!(
            parse_admin_commands("assign bob admin\nlift alice # done\n").unwrap(),
            vec![
                AdminCommand::Assign {
                    user: "bob".into(),
                    role: "admin".into()
                },
                AdminCommand::Lift {
                    user: "alice".into()
                }
            ]
        );
        let e = parse_admin_commands("lift\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 1: \"lift\" is not a command"),
            "{e}"
        );
    }
}
