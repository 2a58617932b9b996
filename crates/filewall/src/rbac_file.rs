//! The RBAC policy file (§4.5.1's initial policy 𝓕, in TOML rather than XACML),
//! read into an [`RbacModel`] with `file:line` errors:
//!
//! ```toml
//! [[user]]
//! name = "alice"
//! uid = 1001
//!
//! [[role]]
//! name = "developer"
//! juniors = ["user"]            # the hierarchy: developer inherits user
//! members = ["bob", "charles"]
//! superuser = false             # passes `owner` cells (the seed's admin)
//! exclusive = false             # active only alone (separation of duty)
//!
//! [session]
//! initial = ["user", "developer"]   # what a new session activates, if held
//!
//! [[delegation]]                # members of `to` may take `role` in the window
//! role = "admin"
//! to = "developer"
//! window = "17:00-09:00"
//! utc_offset = "Z"
//!
//! [threat]
//! role = "threat"
//! on_escalation = true          # asking for an unheld role makes a threat
//! max_denials = 20              # optional
//!
//! [[separation]]                # at most max_active of roles together
//! roles = ["developer", "threat"]
//! max_active = 1
//!
//! [permissions]                 # the default matrix (see `vcn_text` for cells)
//! "*" = "allow=user alarm=threat"
//! WRITE = "allow=developer log=admin alarm=threat"
//!
//! [[file]]                      # a path under the export root: its own cells
//! path = "secret.txt"
//! permissions = { READ = "allow=admin" }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::config::ConfigError;
use crate::rbac::{
    Cell, Delegation, Matrix, RbacModel, Role, RoleId, Separation, ThreatRule, User,
};
use crate::temporal::{Window, parse_offset};
use crate::vcn_text::{Target, parse_cell, targets};

/// Most users and roles a policy may define.
pub const MAX_USERS: usize = 65_536;
pub const MAX_ROLES: usize = 1024;

type S<T> = toml::Spanned<T>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    user: Vec<UserToml>,
    #[serde(default)]
    role: Vec<RoleToml>,
    session: Option<SessionToml>,
    #[serde(default)]
    delegation: Vec<DelegationToml>,
    threat: Option<ThreatToml>,
    #[serde(default)]
    separation: Vec<SeparationToml>,
    #[serde(default)]
    permissions: BTreeMap<String, S<String>>,
    #[serde(default)]
    file: Vec<PathToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserToml {
    name: S<String>,
    uid: S<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleToml {
    name: S<String>,
    #[serde(default)]
    juniors: Vec<S<String>>,
    #[serde(default)]
    members: Vec<S<String>>,
    #[serde(default)]
    superuser: bool,
    #[serde(default)]
    exclusive: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionToml {
    initial: Vec<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DelegationToml {
    role: S<String>,
    to: S<String>,
    window: S<String>,
    utc_offset: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThreatToml {
    role: S<String>,
    #[serde(default)]
    on_escalation: bool,
    max_denials: Option<S<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SeparationToml {
    roles: S<Vec<S<String>>>,
    max_active: S<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathToml {
    path: S<String>,
    permissions: BTreeMap<String, S<String>>,
}

struct Cx<'a> {
    text: &'a str,
    file: &'a str,
    roles: Vec<String>,
}

impl Cx<'_> {
    fn line<T>(&self, s: &S<T>) -> usize {
        let at = s.span().start.min(self.text.len());
        self.text[..at].bytes().filter(|&b| b == b'\n').count() + 1
    }

    fn err(&self, line: usize, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line,
            message,
        }
    }

    fn role(&self, s: &S<String>) -> Result<RoleId, ConfigError> {
        self.roles
            .iter()
            .position(|r| r == s.get_ref())
            .ok_or_else(|| {
                self.err(
                    self.line(s),
                    format!(
                        "no role {:?} (roles: {})",
                        s.get_ref(),
                        self.roles.join(", ")
                    ),
                )
            })
    }
}

fn users(cx: &Cx<'_>, list: &[UserToml]) -> Result<Vec<User>, ConfigError> {
    if list.len() > MAX_USERS {
        return Err(cx.err(0, format!("more than {MAX_USERS} users")));
    }
    let mut out: Vec<User> = Vec::new();
    for u in list {
        let uid = u32::try_from(*u.uid.get_ref()).map_err(|_| {
            cx.err(
                cx.line(&u.uid),
                format!("uid {} is not a 32-bit UID", u.uid.get_ref()),
            )
        })?;
        if let Some(o) = out
            .iter()
            .find(|o| o.name == *u.name.get_ref() || o.uid == uid)
        {
            return Err(cx.err(
                cx.line(&u.name),
                format!(
                    "user {:?} (uid {uid}) repeats the name or uid of {:?}",
                    u.name.get_ref(),
                    o.name
                ),
            ));
        }
        out.push(User {
            name: u.name.get_ref().clone(),
            uid,
        });
    }
    Ok(out)
}

/// The roles, and each user's direct assignment.
fn roles(
    cx: &Cx<'_>,
    list: &[RoleToml],
    users: &[User],
) -> Result<(Vec<Role>, Vec<BTreeSet<RoleId>>), ConfigError> {
    let mut out: Vec<Role> = Vec::new();
    let mut assign = vec![BTreeSet::new(); users.len()];
    for (i, r) in list.iter().enumerate() {
        let mut juniors = Vec::new();
        for j in &r.juniors {
            juniors.push(cx.role(j)?);
        }
        for m in &r.members {
            let u = users
                .iter()
                .position(|u| u.name == *m.get_ref())
                .ok_or_else(|| {
                    cx.err(
                        cx.line(m),
                        format!("no user {:?} (declare it in [[user]])", m.get_ref()),
                    )
                })?;
            assign[u].insert(i);
        }
        out.push(Role {
            name: r.name.get_ref().clone(),
            juniors,
            superuser: r.superuser,
            exclusive: r.exclusive,
        });
    }
    // The hierarchy must be a partial order: no role may be its own senior.
    for (i, r) in list.iter().enumerate() {
        let mut stack: Vec<RoleId> = out[i].juniors.clone();
        let mut seen = BTreeSet::new();
        while let Some(j) = stack.pop() {
            if j == i {
                return Err(cx.err(
                    cx.line(&r.name),
                    format!(
                        "role {:?} is its own senior (the hierarchy has a cycle)",
                        r.name.get_ref()
                    ),
                ));
            }
            if seen.insert(j) {
                stack.extend(out[j].juniors.iter().copied());
            }
        }
    }
    Ok((out, assign))
}

/// A matrix from `OP = "cells"` pairs over `base`.
fn matrix(
    cx: &Cx<'_>,
    base: &Matrix,
    cells: &BTreeMap<String, S<String>>,
) -> Result<Matrix, ConfigError> {
    let resolve = |n: &str| cx.roles.iter().position(|r| r == n);
    let mut m = base.clone();
    // Classes first, then single procedures, so a procedure overrides its class.
    let mut ordered: Vec<(&String, &S<String>)> = cells.iter().collect();
    ordered.sort_by_key(|(k, _)| !matches!(k.as_str(), "*" | "read" | "write" | "all"));
    for (op, v) in ordered {
        let line = cx.line(v);
        let ts = targets(op).map_err(|e| cx.err(line, e.to_string()))?;
        let edit =
            parse_cell(v.get_ref(), &resolve).map_err(|e| cx.err(line, format!("{op}: {e}")))?;
        let cell: Cell = edit
            .to_cell()
            .ok_or_else(|| cx.err(line, format!("{op}: a cell needs allow=")))?;
        for t in ts {
            match t {
                Target::Default => m.default = Some(cell),
                Target::Proc(p) => m.set(p, cell),
            }
        }
    }
    Ok(m)
}

fn delegations(cx: &Cx<'_>, list: &[DelegationToml]) -> Result<Vec<Delegation>, ConfigError> {
    let mut out = Vec::new();
    for d in list {
        let window = Window::parse(d.window.get_ref())
            .map_err(|e| cx.err(cx.line(&d.window), e.to_string()))?;
        let utc_offset_min = match &d.utc_offset {
            Some(o) => parse_offset(o.get_ref()).map_err(|e| cx.err(cx.line(o), e.to_string()))?,
            None => 0,
        };
        out.push(Delegation {
            role: cx.role(&d.role)?,
            to: cx.role(&d.to)?,
            window,
            utc_offset_min,
        });
    }
    Ok(out)
}

fn separations(cx: &Cx<'_>, list: &[SeparationToml]) -> Result<Vec<Separation>, ConfigError> {
    let mut out = Vec::new();
    for s in list {
        let mut roles = Vec::new();
        for r in s.roles.get_ref() {
            roles.push(cx.role(r)?);
        }
        let max = *s.max_active.get_ref();
        if max < 1 || max as usize >= roles.len().max(1) {
            return Err(cx.err(
                cx.line(&s.max_active),
                format!(
                    "max_active = {max} must be at least 1 and below the {} roles listed",
                    roles.len()
                ),
            ));
        }
        out.push(Separation {
            roles,
            max_active: max as usize,
        });
    }
    Ok(out)
}

fn threat(cx: &Cx<'_>, t: Option<&ThreatToml>) -> Result<Option<ThreatRule>, ConfigError> {
    let Some(t) = t else { return Ok(None) };
    let max_denials = match &t.max_denials {
        Some(m) => Some(
            u32::try_from(*m.get_ref())
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    cx.err(
                        cx.line(m),
                        format!("max_denials = {} must be at least 1", m.get_ref()),
                    )
                })?,
        ),
        None => None,
    };
    Ok(Some(ThreatRule {
        role: cx.role(&t.role)?,
        on_escalation: t.on_escalation,
        max_denials,
    }))
}

/// Parses a policy file's text; `file` names it in errors.
pub fn parse_rbac(text: &str, file: &str) -> Result<RbacModel, ConfigError> {
    let parsed: FileToml = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| {
            text[..s.start.min(text.len())]
                .bytes()
                .filter(|&b| b == b'\n')
                .count()
                + 1
        });
        ConfigError {
            file: file.to_string(),
            line,
            message: e.message().trim().to_string(),
        }
    })?;
    let mut cx = Cx {
        text,
        file,
        roles: Vec::new(),
    };
    if parsed.role.len() > MAX_ROLES {
        return Err(cx.err(0, format!("more than {MAX_ROLES} roles")));
    }
    for r in &parsed.role {
        if cx.roles.contains(r.name.get_ref()) {
            return Err(cx.err(
                cx.line(&r.name),
                format!("role {:?} is defined twice", r.name.get_ref()),
            ));
        }
        cx.roles.push(r.name.get_ref().clone());
    }
    let users = users(&cx, &parsed.user)?;
    let (roles, assign) = roles(&cx, &parsed.role, &users)?;
    let mut initial = Vec::new();
    for r in parsed.session.iter().flat_map(|s| &s.initial) {
        initial.push(cx.role(r)?);
    }
    let default_matrix = matrix(&cx, &Matrix::default(), &parsed.permissions)?;
    let mut files = Vec::new();
    for f in &parsed.file {
        let path = f.path.get_ref().trim_matches('/').to_string();
        if path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(cx.err(
                cx.line(&f.path),
                format!("path {:?} is not a path under the export", f.path.get_ref()),
            ));
        }
        files.push((path, matrix(&cx, &default_matrix, &f.permissions)?));
    }
    let delegations = delegations(&cx, &parsed.delegation)?;
    let separations = separations(&cx, &parsed.separation)?;
    let threat = threat(&cx, parsed.threat.as_ref())?;
    Ok(RbacModel::new(
        users,
        roles,
        assign,
        initial,
        delegations,
        separations,
        threat,
        default_matrix,
        files,
    ))
}

/// Reads and parses a policy file.
pub fn load_rbac(path: &Path) -> Result<RbacModel, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 0,
        message: format!("reading: {e}"),
    })?;
    parse_rbac(&text, &file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs3::Nfs3Proc;
    use crate::rbac::Allow;

    /// The seed's policy 𝓕 as a file.
    pub(crate) const SEED: &str = r#"
[[user]]
name = "alice"
uid = 1001
[[user]]
name = "bob"
uid = 1002
[[user]]
name = "charles"
uid = 1003
[[user]]
name = "root"
uid = 0

[[role]]
name = "user"
members = ["alice"]
[[role]]
name = "developer"
juniors = ["user"]
members = ["bob", "charles"]
[[role]]
name = "admin"
juniors = ["developer"]
members = ["root"]
superuser = true
exclusive = true
[[role]]
name = "threat"

[session]
initial = ["user", "developer"]

[[delegation]]
role = "admin"
to = "developer"
window = "17:00-09:00"

[threat]
role = "threat"
on_escalation = true

[permissions]
"*" = "allow=user alarm=threat"
GETATTR = "allow=user log=admin alarm=threat"
READ = "allow=user log=admin alarm=threat"
WRITE = "allow=developer log=admin alarm=threat"
REMOVE = "allow=owner log=admin alarm=threat"

[[file]]
path = "secret.txt"
permissions = { READ = "allow=admin log=admin alarm=threat" }
"#;

    #[test]
    fn the_shipped_example_is_the_seed_policy() {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
        let path = Path::new(&dir).join("../../examples/filewall/rbac.toml");
        assert_eq!(
            load_rbac(&path).unwrap(),
            parse_rbac(SEED, "f.toml").unwrap()
        );
    }

    #[test]
    fn the_seed_policy_reads_as_table_4_3() {
        let m = parse_rbac(SEED, "f.toml").unwrap();
        let expect = crate::rbac::tests::seed_model();
        assert_eq!(m.users, expect.users);
        assert_eq!(m.roles, expect.roles);
        assert_eq!(m.assign, expect.assign);
        assert_eq!(m.initial, expect.initial);
        assert_eq!(m.delegations, expect.delegations);
        assert_eq!(m.threat, expect.threat);
        for p in [
            Nfs3Proc::Getattr,
            Nfs3Proc::Read,
            Nfs3Proc::Write,
            Nfs3Proc::Remove,
        ] {
            assert_eq!(
                m.default_matrix.cell(p),
                expect.default_matrix.cell(p),
                "{p:?}"
            );
        }
        assert_eq!(
            m.default_matrix.cell(Nfs3Proc::Lookup).unwrap().allow,
            Allow::Role(0)
        );
        let secret = m.matrix_for_path(Some("secret.txt"));
        assert_eq!(secret.cell(Nfs3Proc::Read).unwrap().allow, Allow::Role(2));
        assert_eq!(
            secret.cell(Nfs3Proc::Write).unwrap().allow,
            Allow::Role(1),
            "inherited from [permissions]"
        );
        assert!(m.dominates(2, 0));
    }

    #[test]
    fn errors_say_file_and_line() {
        let cases: &[(&str, &str, usize, &str)] = &[
            (
                "members = [\"alice\"]",
                "members = [\"alicia\"]",
                17,
                "no user \"alicia\"",
            ),
            (
                "juniors = [\"user\"]",
                "juniors = [\"usr\"]",
                20,
                "no role \"usr\"",
            ),
            ("uid = 1002", "uid = 1001", 6, "repeats the name or uid"),
            (
                "window = \"17:00-09:00\"",
                "window = \"17:00\"",
                37,
                "not a window",
            ),
            (
                "WRITE = \"allow=developer",
                "WRITE = \"allow=dev",
                47,
                "WRITE: no role \"dev\"",
            ),
            (
                "REMOVE = \"allow",
                "REMOVE = \"alow",
                48,
                "unknown key \"alow\"",
            ),
            (
                "path = \"secret.txt\"",
                "path = \"../etc\"",
                51,
                "not a path under the export",
            ),
            ("[session]", "[sessions]", 31, "unknown field"),
            (
                "role = \"threat\"",
                "role = \"danger\"",
                40,
                "no role \"danger\"",
            ),
        ];
        for (from, to, line, what) in cases {
            assert!(SEED.contains(from), "{from}");
            let text = SEED.replacen(from, to, 1);
            let e = parse_rbac(&text, "f.toml").unwrap_err();
            assert_eq!(e.line, *line, "{to}: {e}");
            assert!(e.message.contains(what), "{to}: {e}");
            assert!(
                e.to_string().starts_with(&format!("f.toml:{line}: ")),
                "{e}"
            );
        }
        let cyclic = SEED.replacen(
            "name = \"user\"\n",
            "name = \"user\"\njuniors = [\"admin\"]\n",
            1,
        );
        let e = parse_rbac(&cyclic, "f.toml").unwrap_err();
        assert!(e.message.contains("cycle"), "{e}");
    }
}
