//! Role-based access control for NFS (§4.5), sans-IO: users, roles and their
//! hierarchy, per-object permission matrices (ALLOW, DENY, LOG, ALARM per NFSv3
//! procedure), sessions per (client IP, UID) with their active roles, dynamic
//! separation of duty, time-window delegation and the threat role, and the
//! permission evaluation of Algorithm 2.
//!
//! Readings of the seed (digest errata E15, E16):
//! - the hierarchy's edges go senior → junior, and a role *dominates* another when
//!   it is the same or the other is reachable through juniors (the seed's DFS);
//! - `owner` in an ALLOW cell is not a role: the caller's UID must be the object's
//!   owner, or an active role must be a superuser role (the seed's "or the admin");
//! - DENY names a role: a session with a role dominating it is refused even where
//!   ALLOW admits it; LOG is evaluated when a call is allowed, ALARM when denied;
//! - a threat session is always denied, and every attempt raises an alarm.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::SystemTime;

use crate::nfs3::Nfs3Proc;
use crate::temporal::{READ_CLASS, WRITE_CLASS, Window, local_time};

/// A role, by its index in the model.
pub type RoleId = usize;

/// The number of NFSv3 procedures (cells per matrix).
pub const NFS3_PROCS: usize = 22;

/// A role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    /// Roles directly below this one (it inherits their permissions).
    pub juniors: Vec<RoleId>,
    /// Passes `owner` cells on any object (the seed's admin).
    pub superuser: bool,
    /// May only be active alone (dynamic separation of duty).
    pub exclusive: bool,
}

/// A user: a name and the AUTH_SYS UID it calls with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
}

/// Who an ALLOW cell admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    /// Sessions with an active role dominating this one.
    Role(RoleId),
    /// The object's owner, or a superuser role.
    Owner,
    /// The owner's least privileged role gets what the owner's mode bits give
    /// (r for reading procedures, w for changing ones): the seed's initial rights.
    Mode,
    /// Every session (but a threat's).
    Anyone,
    /// No session.
    Nobody,
}

/// One procedure's permissions on an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub allow: Allow,
    pub deny: Option<RoleId>,
    pub log: Option<RoleId>,
    pub alarm: Option<RoleId>,
}

impl Cell {
    pub fn allow(allow: Allow) -> Self {
        Self {
            allow,
            deny: None,
            log: None,
            alarm: None,
        }
    }
}

/// An object's permission matrix: a cell per procedure, and a default for the
/// procedures without one (none: those are denied).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Matrix {
    pub cells: [Option<Cell>; NFS3_PROCS],
    pub default: Option<Cell>,
}

impl Matrix {
    /// The cell that applies to `p`.
    pub fn cell(&self, p: Nfs3Proc) -> Option<Cell> {
        self.cells[p.to_u32() as usize].or(self.default)
    }

    pub fn set(&mut self, p: Nfs3Proc, cell: Cell) {
        self.cells[p.to_u32() as usize] = Some(cell);
    }
}

/// What is known of an object's owner (from its attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// A role delegated to the members of another during a daily window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    pub role: RoleId,
    pub to: RoleId,
    pub window: Window,
    pub utc_offset_min: i32,
}

/// A dynamic separation of duty constraint: at most `max_active` of `roles`
/// active in one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Separation {
    pub roles: Vec<RoleId>,
    pub max_active: usize,
}

/// How sessions become threats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreatRule {
    pub role: RoleId,
    /// Asking for a role the user neither holds nor is delegated makes a threat.
    pub on_escalation: bool,
    /// This many denied calls in one session make a threat.
    pub max_denials: Option<u32>,
}

/// The policy definition: the static part of §4.5's state (user assignment is
/// the starting point of [`RbacState::assign`], which may change at run time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbacModel {
    pub users: Vec<User>,
    pub roles: Vec<Role>,
    /// Direct assignment, per user.
    pub assign: Vec<BTreeSet<RoleId>>,
    /// Roles a new session activates, of those its user holds.
    pub initial: Vec<RoleId>,
    pub delegations: Vec<Delegation>,
    pub separations: Vec<Separation>,
    pub threat: Option<ThreatRule>,
    /// The matrix of objects without one of their own.
    pub default_matrix: Matrix,
    /// Matrices for paths under the export root (`a/b.txt`).
    pub files: Vec<(String, Matrix)>,
    /// `dominates[s][j]`: role `s` is `j` or above it (closure of the hierarchy).
    dominates: Vec<Vec<bool>>,
}

impl RbacModel {
    /// A model; computes the hierarchy's closure. The caller has checked that it
    /// has no cycle and that every index is in range.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        users: Vec<User>,
        roles: Vec<Role>,
        assign: Vec<BTreeSet<RoleId>>,
        initial: Vec<RoleId>,
        delegations: Vec<Delegation>,
        separations: Vec<Separation>,
        threat: Option<ThreatRule>,
        default_matrix: Matrix,
        files: Vec<(String, Matrix)>,
    ) -> Self {
        let n = roles.len();
        let mut dominates = vec![vec![false; n]; n];
        for (s, row) in dominates.iter_mut().enumerate() {
            // Depth-first from s through juniors (the seed's DFS, done once).
            let mut stack = vec![s];
            while let Some(r) = stack.pop() {
                if r < n && !row[r] {
                    row[r] = true;
                    stack.extend(roles[r].juniors.iter().copied());
                }
            }
        }
        Self {
            users,
            roles,
            assign,
            initial,
            delegations,
            separations,
            threat,
            default_matrix,
            files,
            dominates,
        }
    }

    pub fn role(&self, name: &str) -> Option<RoleId> {
        self.roles.iter().position(|r| r.name == name)
    }

    pub fn user_by_uid(&self, uid: u32) -> Option<usize> {
        self.users.iter().position(|u| u.uid == uid)
    }

    pub fn user_by_name(&self, name: &str) -> Option<usize> {
        self.users.iter().position(|u| u.name == name)
    }

    /// DFS(HIER, senior, junior).
    pub fn dominates(&self, senior: RoleId, junior: RoleId) -> bool {
        self.dominates
            .get(senior)
            .and_then(|row| row.get(junior))
            .copied()
            .unwrap_or(false)
    }

    /// Every role `assigned` gives, directly or by inheritance.
    pub fn held(&self, assigned: &BTreeSet<RoleId>) -> BTreeSet<RoleId> {
        (0..self.roles.len())
            .filter(|&j| assigned.iter().any(|&a| self.dominates(a, j)))
            .collect()
    }

    /// The least privileged of `held`: one no other held role is below.
    fn least(&self, held: &BTreeSet<RoleId>) -> Option<RoleId> {
        held.iter()
            .copied()
            .find(|&r| !held.iter().any(|&o| o != r && self.dominates(r, o)))
    }

    /// The matrix for an object at `path` (relative to the export root) with no
    /// matrix of its own.
    pub fn matrix_for_path(&self, path: Option<&str>) -> &Matrix {
        path.and_then(|p| self.files.iter().find(|(f, _)| f == p))
            .map_or(&self.default_matrix, |(_, m)| m)
    }
}

/// Why a call was allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow { log: bool },
    Deny { alarm: bool },
}

/// Who is asking: the session's UID and its roles active now.
#[derive(Debug, Clone)]
pub struct Subject<'a> {
    pub uid: u32,
    /// In increasing privilege, as the seed keeps them.
    pub roles: &'a [RoleId],
    pub threat: bool,
}

/// Algorithm 2 (lines 10–25) for a call of procedure `p` on an object with
/// `matrix` and `owner`, with `assign` the current user assignment (for `mode`
/// cells).
pub fn evaluate(
    model: &RbacModel,
    assign: &[BTreeSet<RoleId>],
    who: &Subject<'_>,
    matrix: &Matrix,
    owner: Option<Owner>,
    p: Nfs3Proc,
) -> Verdict {
    let cell = matrix.cell(p);
    let any = |target: Option<RoleId>| {
        target.is_some_and(|t| who.roles.iter().any(|&r| model.dominates(r, t)))
    };
    let alarm = cell.is_some_and(|c| any(c.alarm));
    if who.threat {
        return Verdict::Deny { alarm: true };
    }
    let Some(cell) = cell else {
        return Verdict::Deny { alarm };
    };
    if any(cell.deny) {
        return Verdict::Deny { alarm };
    }
    let superuser = who.roles.iter().any(|&r| model.roles[r].superuser);
    let allowed = match cell.allow {
        Allow::Anyone => true,
        Allow::Nobody => false,
        Allow::Role(min) => any(Some(min)),
        Allow::Owner => superuser || owner.is_some_and(|o| o.uid == who.uid),
        Allow::Mode => owner.is_some_and(|o| {
            let bit = if WRITE_CLASS.contains(&p) {
                0o200
            } else {
                0o400
            };
            let needs_bit = WRITE_CLASS.contains(&p) || READ_CLASS.contains(&p);
            (!needs_bit || o.mode & bit != 0)
                && model
                    .user_by_uid(o.uid)
                    .and_then(|u| model.least(&model.held(&assign[u])))
                    .is_some_and(|least| any(Some(least)))
        }),
    };
    if allowed {
        Verdict::Allow { log: any(cell.log) }
    } else {
        Verdict::Deny { alarm }
    }
}

/// How a session got a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Held by assignment or inheritance.
    Assigned,
    /// By delegation `n`: active only inside its window.
    Delegated(usize),
}

/// A session: one per (client IP, UID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: u64,
    pub uid: u32,
    pub ip: IpAddr,
    /// In increasing privilege.
    pub roles: Vec<(RoleId, Grant)>,
    pub threat: bool,
    pub denials: u32,
}

/// Why a role change was refused (the session stays as it was, unless a threat).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActivateError {
    #[error("a threat session cannot change roles (an administrator must lift it)")]
    Threat,
    #[error("no role {0:?}")]
    Unknown(String),
    #[error("role {0:?} is neither held nor delegated now (escalation)")]
    Escalation(String),
    #[error("roles {0:?} and {1:?} may not be active together (separation of duty)")]
    Separation(String, String),
    #[error("no role named")]
    Empty,
}

/// The run-time state: user assignment (persistent), threats (persistent) and
/// sessions (soft).
#[derive(Debug, Clone, Default)]
pub struct RbacState {
    pub assign: Vec<BTreeSet<RoleId>>,
    /// (IP, UID) of threat sessions, until an administrator lifts them.
    pub threats: BTreeSet<(IpAddr, u32)>,
    pub sessions: HashMap<(IpAddr, u32), Session>,
    next_session: u64,
}

impl RbacState {
    pub fn new(model: &RbacModel) -> Self {
        Self {
            assign: model.assign.clone(),
            threats: BTreeSet::new(),
            sessions: HashMap::new(),
            next_session: 1,
        }
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_session;
        self.next_session += 1;
        id
    }

    /// Orders roles by privilege: a junior before its seniors.
    fn sorted(model: &RbacModel, mut roles: Vec<(RoleId, Grant)>) -> Vec<(RoleId, Grant)> {
        roles.sort_by_key(|&(r, _)| {
            (0..model.roles.len())
                .filter(|&j| model.dominates(r, j))
                .count()
        });
        roles
    }

    /// The session of (ip, uid), started with the initial roles if there is none.
    pub fn session(&mut self, model: &RbacModel, ip: IpAddr, uid: u32) -> &mut Session {
        match self.sessions.entry((ip, uid)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let id = self.next_session;
                self.next_session += 1;
                let threat = self.threats.contains(&(ip, uid));
                let roles = match (threat, model.threat) {
                    (true, Some(t)) => vec![(t.role, Grant::Assigned)],
                    (true, None) => Vec::new(),
                    (false, _) => {
                        let held = model
                            .user_by_uid(uid)
                            .map(|u| model.held(&self.assign[u]))
                            .unwrap_or_default();
                        let roles = model
                            .initial
                            .iter()
                            .filter(|r| held.contains(r))
                            .map(|&r| (r, Grant::Assigned))
                            .collect();
                        Self::sorted(model, roles)
                    }
                };
                v.insert(Session {
                    id,
                    uid,
                    ip,
                    roles,
                    threat,
                    denials: 0,
                })
            }
        }
    }

    /// The roles of a session active at `now` (delegated ones only inside their
    /// window).
    pub fn active(model: &RbacModel, s: &Session, now: SystemTime) -> Vec<RoleId> {
        s.roles
            .iter()
            .filter(|(_, g)| match g {
                Grant::Assigned => true,
                Grant::Delegated(d) => model.delegations.get(*d).is_some_and(|d| {
                    let (_, minute) = local_time(now, d.utc_offset_min);
                    d.window.contains(minute)
                }),
            })
            .map(|&(r, _)| r)
            .collect()
    }

    /// Replaces the session of (ip, uid) by a new one with the roles `names`;
    /// refused roles leave it as it was, except that an escalation under a threat
    /// rule turns it into a threat session (reported as the error still).
    pub fn activate(
        &mut self,
        model: &RbacModel,
        ip: IpAddr,
        uid: u32,
        names: &[&str],
        now: SystemTime,
    ) -> Result<u64, ActivateError> {
        let threat = self.session(model, ip, uid).threat;
        if threat {
            return Err(ActivateError::Threat);
        }
        if names.is_empty() {
            return Err(ActivateError::Empty);
        }
        let held = model
            .user_by_uid(uid)
            .map(|u| model.held(&self.assign[u]))
            .unwrap_or_default();
        let mut roles = Vec::new();
        for name in names {
            let r = model
                .role(name)
                .ok_or_else(|| ActivateError::Unknown((*name).to_string()))?;
            let grant = if held.contains(&r) {
                Grant::Assigned
            } else if let Some(d) = model.delegations.iter().position(|d| {
                d.role == r && held.contains(&d.to) && {
                    let (_, minute) = local_time(now, d.utc_offset_min);
                    d.window.contains(minute)
                }
            }) {
                Grant::Delegated(d)
            } else {
                if model.threat.is_some_and(|t| t.on_escalation) {
                    self.make_threat(model, ip, uid);
                }
                return Err(ActivateError::Escalation((*name).to_string()));
            };
            if !roles.iter().any(|&(x, _)| x == r) {
                roles.push((r, grant));
            }
        }
        check_separation(model, &roles)?;
        let id = self.fresh_id();
        let s = self.session(model, ip, uid);
        s.id = id;
        s.roles = Self::sorted(model, roles);
        s.denials = 0;
        Ok(id)
    }

    /// Ends the session of (ip, uid) and starts a threat session in its place.
    pub fn make_threat(&mut self, model: &RbacModel, ip: IpAddr, uid: u32) {
        self.threats.insert((ip, uid));
        self.sessions.remove(&(ip, uid));
        self.session(model, ip, uid);
    }

    /// Lifts every threat of `uid` and ends its sessions; returns how many.
    pub fn lift(&mut self, uid: u32) -> usize {
        let before = self.threats.len();
        self.threats.retain(|&(_, u)| u != uid);
        self.sessions.retain(|_, s| s.uid != uid);
        before - self.threats.len()
    }

    /// Counts a denial; true if the session has just become a threat.
    pub fn denied(&mut self, model: &RbacModel, ip: IpAddr, uid: u32) -> bool {
        let Some(limit) = model.threat.and_then(|t| t.max_denials) else {
            return false;
        };
        let s = self.session(model, ip, uid);
        if s.threat {
            return false;
        }
        s.denials += 1;
        if s.denials >= limit {
            self.make_threat(model, ip, uid);
            return true;
        }
        false
    }
}

fn check_separation(model: &RbacModel, roles: &[(RoleId, Grant)]) -> Result<(), ActivateError> {
    let name = |r: RoleId| model.roles[r].name.clone();
    if roles.len() > 1
        && let Some(&(x, _)) = roles.iter().find(|(r, _)| model.roles[*r].exclusive)
        && let Some(&(y, _)) = roles.iter().find(|(r, _)| *r != x)
    {
        return Err(ActivateError::Separation(name(x), name(y)));
    }
    for sep in &model.separations {
        let active: Vec<RoleId> = roles
            .iter()
            .map(|&(r, _)| r)
            .filter(|r| sep.roles.contains(r))
            .collect();
        if active.len() > sep.max_active && active.len() >= 2 {
            return Err(ActivateError::Separation(name(active[0]), name(active[1])));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::{Duration, UNIX_EPOCH};

    /// The seed's policy 𝓕 (Tables 4.2 and 4.3): user ≤ developer ≤ admin, threat;
    /// alice user, bob and charles developers, root admin (exclusive); developers
    /// may take admin from 17:00 to 09:00; escalation makes a threat.
    pub(crate) fn seed_model() -> RbacModel {
        let role = |name: &str, juniors: Vec<RoleId>, superuser, exclusive| Role {
            name: name.into(),
            juniors,
            superuser,
            exclusive,
        };
        let roles = vec![
            role("user", vec![], false, false),
            role("developer", vec![0], false, false),
            role("admin", vec![1], true, true),
            role("threat", vec![], false, false),
        ];
        let users = ["alice", "bob", "charles", "root"]
            .iter()
            .zip([1001, 1002, 1003, 0])
            .map(|(n, uid)| User {
                name: (*n).into(),
                uid,
            })
            .collect();
        let assign = vec![
            BTreeSet::from([0]),
            BTreeSet::from([1]),
            BTreeSet::from([1]),
            BTreeSet::from([2]),
        ];
        let cell = |allow| Cell {
            allow,
            deny: None,
            log: Some(2),
            alarm: Some(3),
        };
        let mut m = Matrix::default();
        m.set(Nfs3Proc::Getattr, cell(Allow::Role(0)));
        m.set(Nfs3Proc::Read, cell(Allow::Role(0)));
        m.set(Nfs3Proc::Write, cell(Allow::Role(1)));
        m.set(Nfs3Proc::Remove, cell(Allow::Owner));
        RbacModel::new(
            users,
            roles,
            assign,
            vec![0, 1],
            vec![Delegation {
                role: 2,
                to: 1,
                window: Window {
                    start: 17 * 60,
                    end: 9 * 60,
                },
                utc_offset_min: 0,
            }],
            vec![],
            Some(ThreatRule {
                role: 3,
                on_escalation: true,
                max_denials: None,
            }),
            m,
            vec![],
        )
    }

    /// 2026-11-23 (a Monday) at h:00 UTC.
    fn at(h: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_392_000 + h * 3600)
    }

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn hierarchy_closure_and_initial_sessions() {
        let m = seed_model();
        assert!(m.dominates(2, 0) && m.dominates(1, 0) && !m.dominates(0, 1));
        assert!(!m.dominates(2, 3), "threat is outside the chain");
        let mut st = RbacState::new(&m);
        let names = |s: &Session| {
            s.roles
                .iter()
                .map(|&(r, _)| m.roles[r].name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(st.session(&m, IP, 1001)), ["user"]);
        assert_eq!(names(st.session(&m, IP, 1002)), ["user", "developer"]);
        assert_eq!(
            names(st.session(&m, IP, 0)),
            ["user", "developer"],
            "admin is not initial"
        );
        assert!(
            st.session(&m, IP, 4242).roles.is_empty(),
            "unknown users hold nothing"
        );
    }

    #[test]
    fn algorithm_2_with_table_4_3() {
        let m = seed_model();
        let a = m.assign.clone();
        let who = |uid, roles: &'static [RoleId]| Subject {
            uid,
            roles,
            threat: false,
        };
        let alice = Owner {
            uid: 1001,
            gid: 1001,
            mode: 0o644,
        };
        let owner = Some(alice);
        let e = |s: &Subject<'_>, p| evaluate(&m, &a, s, &m.default_matrix, owner, p);
        assert_eq!(
            e(&who(1001, &[0]), Nfs3Proc::Read),
            Verdict::Allow { log: false }
        );
        assert_eq!(
            e(&who(1001, &[0]), Nfs3Proc::Write),
            Verdict::Deny { alarm: false }
        );
        assert_eq!(
            e(&who(1002, &[0, 1]), Nfs3Proc::Write),
            Verdict::Allow { log: false }
        );
        assert_eq!(
            e(&who(0, &[2]), Nfs3Proc::Write),
            Verdict::Allow { log: true }
        );
        assert_eq!(
            e(&who(1001, &[0]), Nfs3Proc::Remove),
            Verdict::Allow { log: false },
            "owner"
        );
        assert_eq!(
            e(&who(1002, &[0, 1]), Nfs3Proc::Remove),
            Verdict::Deny { alarm: false }
        );
        assert_eq!(
            e(&who(0, &[2]), Nfs3Proc::Remove),
            Verdict::Allow { log: true },
            "superuser"
        );
        assert_eq!(
            e(&who(1001, &[0]), Nfs3Proc::Rmdir),
            Verdict::Deny { alarm: false },
            "no cell"
        );
        let threat = Subject {
            uid: 1001,
            roles: &[3],
            threat: true,
        };
        assert_eq!(e(&threat, Nfs3Proc::Read), Verdict::Deny { alarm: true });
        // DENY overrides ALLOW; mode cells follow the owner's least role and bits.
        let mut mx = m.default_matrix.clone();
        mx.set(
            Nfs3Proc::Read,
            Cell {
                deny: Some(1),
                ..Cell::allow(Allow::Role(0))
            },
        );
        mx.set(Nfs3Proc::Write, Cell::allow(Allow::Mode));
        assert_eq!(
            evaluate(&m, &a, &who(1002, &[0, 1]), &mx, owner, Nfs3Proc::Read),
            Verdict::Deny { alarm: false }
        );
        assert_eq!(
            evaluate(&m, &a, &who(1001, &[0]), &mx, owner, Nfs3Proc::Read),
            Verdict::Allow { log: false }
        );
        assert_eq!(
            evaluate(&m, &a, &who(1003, &[0]), &mx, owner, Nfs3Proc::Write),
            Verdict::Allow { log: false }
        );
        let ro = Some(Owner {
            mode: 0o444,
            ..alice
        });
        assert_eq!(
            evaluate(&m, &a, &who(1001, &[0]), &mx, ro, Nfs3Proc::Write),
            Verdict::Deny { alarm: false }
        );
    }

    #[test]
    fn separation_delegation_and_threats() {
        let m = seed_model();
        let mut st = RbacState::new(&m);
        // root: admin alone, never with another role.
        assert!(st.activate(&m, IP, 0, &["admin"], at(12)).is_ok());
        assert_eq!(
            st.activate(&m, IP, 0, &["admin", "user"], at(12)),
            Err(ActivateError::Separation("admin".into(), "user".into()))
        );
        // bob may take admin by delegation only between 17:00 and 09:00.
        assert_eq!(
            st.activate(&m, IP, 1002, &["admin"], at(12)),
            Err(ActivateError::Escalation("admin".into()))
        );
        assert!(
            st.session(&m, IP, 1002).threat,
            "an escalation outside the window is a threat"
        );
        assert_eq!(
            st.activate(&m, IP, 1002, &["user"], at(12)),
            Err(ActivateError::Threat)
        );
        assert_eq!(st.lift(1002), 1);
        assert!(!st.session(&m, IP, 1002).threat);
        assert!(st.activate(&m, IP, 1002, &["admin"], at(18)).is_ok());
        let s = st.session(&m, IP, 1002).clone();
        assert_eq!(RbacState::active(&m, &s, at(20)), vec![2]);
        assert!(
            RbacState::active(&m, &s, at(10)).is_empty(),
            "the window closed"
        );
        // alice asking for admin becomes a threat; her session is threat-only.
        assert!(st.activate(&m, IP, 1001, &["admin"], at(20)).is_err());
        let s = st.session(&m, IP, 1001);
        assert!(s.threat);
        assert_eq!(s.roles, vec![(3, Grant::Assigned)]);
        // Another machine is another session.
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        assert!(!st.session(&m, other, 1001).threat);
        assert_eq!(
            st.activate(&m, IP, 0, &["nope"], at(1)),
            Err(ActivateError::Unknown("nope".into()))
        );
    }
}
