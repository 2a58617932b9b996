//! The RBAC case study (§4.5) as a chain policy: every handle it returns is
//! virtual (`vcn::Vfh`); each call on a real object is evaluated by Algorithm 2
//! (`rbac::evaluate`) for the caller's session (client IP, AUTH_SYS UID) and
//! forwarded with the server's handles — and, as the seed does, with the owner's
//! UID — or denied here with NFS3ERR_ACCES, never reaching the server; calls on
//! VCN objects are answered by the VCN handler (`vcn_handler`).
//!
//! What a decision needs and the policy has not seen yet, it fetches itself
//! (§4.2.3 injection): the owner of an object (a GETATTR), the object a REMOVE,
//! RMDIR or RENAME names (a LOOKUP), the real directory behind a shadow one. The
//! call waits meanwhile and is resumed or answered when the injected reply
//! arrives. Owners, names and paths are soft state learned from every reply;
//! matrices changed through the VCN, assignment changes, threats, export roots
//! and the audit log are kept in the store (`store::Store`, redb).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::chain::{Action, Policy};
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::handles::{accepted, call_handles, nfs_failure, reply_handles};
use crate::message::{Call, CallArgs, Msg, ReplyResults};
use crate::mount::{MountCall, MountReply, MountRes3, MountStat3};
use crate::nfs3::{
    DirOpArgs3, Fattr3, Ftype3, Nfs3Call, Nfs3Proc, Nfs3Reply, NfsFh3, NfsRes, NfsStat3,
};
use crate::rbac::{Allow, Matrix, Owner, RbacModel, RbacState, RoleId, Subject, Verdict, evaluate};
use crate::rpc::{Auth, AuthSys};
use crate::store::Store;
use crate::temporal::Clock;
use crate::vcn::{MAX_REAL, Vfh};
use crate::vcn_text::{apply_edits, parse_matrix_edits, render_matrix};

/// Entries of each soft-state map before it is cleared (it is rebuilt from traffic).
pub const MAX_SOFT: usize = 1 << 20;
/// How long a call may wait for what the policy fetched for it.
pub const INJECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The UID of AUTH_NONE callers.
pub const NOBODY: u32 = 65_534;
/// Requests the policy makes for one call at most (a name and two owners; what
/// the server will not tell after that is taken as unknown).
const MAX_ROUNDS: u8 = 3;
/// Machine name of the requests the policy makes itself.
const MACHINE: &[u8] = b"filewall-rbac";

/// The settings of `kind = "rbac"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbacSettings {
    /// The policy file.
    pub policy: PathBuf,
    /// The store.
    pub store: PathBuf,
    /// Send allowed calls as the object's owner (Algorithm 2, line 19).
    pub rewrite_uid: bool,
}

/// What is known of a real object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr {
    pub owner: Owner,
    pub ftype: Ftype3,
}

/// What a waiting call does when the reply to the request made for it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Evaluate it again (now that an owner or a name is known); the number of
    /// requests made for it so far.
    Evaluate(u8),
    /// Answer it in the VCN from the reply.
    Vcn,
}

pub(crate) struct Waiting {
    pub xid: u32,
    pub original: Msg,
    pub then: Then,
    pub deadline: Instant,
}

/// The RBAC policy and its state.
pub struct RbacPolicy {
    pub(crate) model: RbacModel,
    pub(crate) state: RbacState,
    pub(crate) store: Store,
    pub(crate) clock: Clock,
    pub(crate) rewrite_uid: bool,
    pub(crate) counters: Arc<Mutex<PolicyCounters>>,
    /// Export root handles (server's) → export path.
    pub(crate) roots: HashMap<Vec<u8>, Vec<u8>>,
    pub(crate) attrs: HashMap<Vec<u8>, Attr>,
    /// (directory, name) → object.
    pub(crate) names: HashMap<(Vec<u8>, Vec<u8>), Vec<u8>>,
    /// Object → path under its root ("" for a root).
    pub(crate) paths: HashMap<Vec<u8>, String>,
    /// Matrices read from the store (`None`: it has none).
    matrices: HashMap<Vec<u8>, Option<Matrix>>,
    /// Requests made by the policy, by their token (the call's XID field).
    pub(crate) waiting: HashMap<u32, Waiting>,
    next_token: u32,
    /// Client calls passed on, by server XID, with their arguments as sent (server
    /// handles; WRITE data left out): their replies come back here.
    forwarded: HashMap<u32, (Instant, CallArgs)>,
    /// Bumped on every VCN change (the virtual objects' times).
    pub(crate) generation: u32,
}

/// The caller of a call: client IP, UID, GID.
pub(crate) fn caller(msg: &Msg) -> (IpAddr, u32, u32) {
    match msg {
        Msg::Call { peer, call, .. } => match &call.cred {
            Auth::Sys(s) => (*peer, s.uid, s.gid),
            _ => (*peer, NOBODY, NOBODY),
        },
        _ => (crate::message::NO_PEER, NOBODY, NOBODY),
    }
}

pub(crate) fn nfs_args(msg: &Msg) -> Option<&Nfs3Call> {
    match msg {
        Msg::Call { call, .. } => match &call.args {
            CallArgs::Nfs3(a) => Some(a),
            _ => None,
        },
        _ => None,
    }
}

pub(crate) fn reply(results: Nfs3Reply) -> Msg {
    Msg::Reply(accepted(ReplyResults::Nfs3(results)))
}

pub(crate) fn fail(p: Nfs3Proc, stat: NfsStat3) -> Msg {
    reply(nfs_failure(p, stat))
}

/// The handles of a call's arguments, in order.
pub(crate) fn handles_of(args: &Nfs3Call) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut a = args.clone();
    call_handles(&mut a, &mut |h| {
        out.push(h.0.clone());
        true
    });
    out
}

/// `msg` with every handle decoded from its virtual form (all must be real).
fn untagged(msg: &Msg) -> Option<Msg> {
    let mut m = msg.clone();
    if let Msg::Call { call, .. } = &mut m
        && let CallArgs::Nfs3(args) = &mut call.args
    {
        let ok = call_handles(args, &mut |h| match Vfh::decode(&h.0) {
            Some(Vfh::Real(fh)) => {
                h.0 = fh;
                true
            }
            _ => false,
        });
        if !ok {
            return None;
        }
    }
    Some(m)
}

/// Bounded insert into a soft-state map.
fn remember<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>, k: K, v: V) {
    if m.len() >= MAX_SOFT && !m.contains_key(&k) {
        m.clear();
    }
    m.insert(k, v);
}

impl RbacPolicy {
    /// A policy over `model`, restoring the store's state.
    pub fn new(
        model: RbacModel,
        store: Store,
        clock: Clock,
        rewrite_uid: bool,
        counters: Arc<Mutex<PolicyCounters>>,
    ) -> Result<Self, crate::store::StoreError> {
        let mut state = RbacState::new(&model);
        for (user, roles) in store.assignments()? {
            if let Some(u) = model.user_by_name(&user) {
                state.assign[u] = roles.iter().filter_map(|r| model.role(r)).collect();
            }
        }
        for t in store.threats()? {
            if let Some((uid, ip)) = t.split_once('@')
                && let (Ok(uid), Ok(ip)) = (uid.parse(), ip.parse())
            {
                state.threats.insert((ip, uid));
            }
        }
        let roots = store.roots()?.into_iter().collect();
        Ok(Self {
            model,
            state,
            store,
            clock,
            rewrite_uid,
            counters,
            roots,
            attrs: HashMap::new(),
            names: HashMap::new(),
            paths: HashMap::new(),
            matrices: HashMap::new(),
            waiting: HashMap::new(),
            next_token: 1,
            forwarded: HashMap::new(),
            generation: 0,
        })
    }

    pub(crate) fn now(&self) -> SystemTime {
        (self.clock)()
    }

    pub(crate) fn role_name(&self, r: RoleId) -> String {
        self.model
            .roles
            .get(r)
            .map_or_else(|| format!("#{r}"), |x| x.name.clone())
    }

    /// Appends to the audit log (and counts a store failure's message).
    pub(crate) fn audit(&mut self, what: &str) {
        let secs = self
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.store.audit(format!("{secs} {what}"));
    }

    pub(crate) fn store_failed(&self, e: &crate::store::StoreError) {
        let mut c = lock_counters(&self.counters);
        c.rbac.store_errors += 1;
        c.rbac.last_store_error = Some(e.to_string());
    }

    /// Persists the set of threats.
    pub(crate) fn save_threats(&self) {
        let list: Vec<String> = self
            .state
            .threats
            .iter()
            .map(|(ip, uid)| format!("{uid}@{ip}"))
            .collect();
        if let Err(e) = self.store.set_threats(&list) {
            self.store_failed(&e);
        }
    }

    /// The matrix of real object `fh`: its own (stored), its path's in the policy,
    /// or the policy's default.
    pub(crate) fn matrix(&mut self, fh: &[u8]) -> Matrix {
        if !self.matrices.contains_key(fh) {
            let stored = match self.store.matrix(fh) {
                Ok(t) => t,
                Err(e) => {
                    self.store_failed(&e);
                    None
                }
            };
            let model = &self.model;
            let parsed = stored.and_then(|text| {
                let edits = parse_matrix_edits(&text, &|n| model.role(n)).ok()?;
                let mut m = Matrix::default();
                apply_edits(&mut m, &model.default_matrix, &edits);
                Some(m)
            });
            remember(&mut self.matrices, fh.to_vec(), parsed);
        }
        match self.matrices.get(fh) {
            Some(Some(m)) => m.clone(),
            _ => self
                .model
                .matrix_for_path(self.paths.get(fh).map(String::as_str))
                .clone(),
        }
    }

    /// Stores `m` as object `fh`'s own matrix.
    pub(crate) fn set_matrix(
        &mut self,
        fh: &[u8],
        m: Matrix,
    ) -> Result<(), crate::store::StoreError> {
        let model = &self.model;
        let text = render_matrix(&m, &|r| model.roles[r].name.clone());
        self.store.set_matrix(fh, Some(&text))?;
        remember(&mut self.matrices, fh.to_vec(), Some(m));
        Ok(())
    }

    /// A token for a request the policy makes, and the call itself (as root: the
    /// policy is in the server's trust domain).
    pub(crate) fn inject(
        &mut self,
        xid: u32,
        original: &Msg,
        args: Nfs3Call,
        then: Then,
        out: &mut Vec<Action<Msg>>,
    ) {
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let (peer, flow) = match original {
            Msg::Call { peer, flow, .. } => (*peer, *flow),
            _ => (crate::message::NO_PEER, 0),
        };
        self.waiting.insert(
            token,
            Waiting {
                xid,
                original: original.clone(),
                then,
                deadline: Instant::now() + INJECT_TIMEOUT,
            },
        );
        lock_counters(&self.counters).rbac.injected += 1;
        out.push(Action::Generate(Msg::Call {
            flow,
            peer,
            call: Call {
                xid: token,
                cred: Auth::Sys(AuthSys {
                    stamp: 0,
                    machine_name: MACHINE.to_vec(),
                    uid: 0,
                    gid: 0,
                    gids: vec![0],
                }),
                verf: Auth::None,
                args: CallArgs::Nfs3(args),
            },
        }));
    }

    /// Answers (or, `held`, completes) a call.
    pub(crate) fn answer(xid: u32, held: bool, response: Msg, out: &mut Vec<Action<Msg>>) {
        out.push(if held {
            Action::Complete { xid, response }
        } else {
            Action::Respond(response)
        });
    }

    /// The object a call is judged on, or the (directory, name) it must be found
    /// under first.
    fn target(args: &Nfs3Call) -> Result<Vec<u8>, (Vec<u8>, Vec<u8>)> {
        match args {
            Nfs3Call::Remove(a) | Nfs3Call::Rmdir(a) => Err((a.dir.0.clone(), a.name.clone())),
            Nfs3Call::Rename(a) => Err((a.from.dir.0.clone(), a.from.name.clone())),
            other => Ok(handles_of(other).into_iter().next().unwrap_or_default()),
        }
    }

    /// Algorithm 2 for a call on real objects. `round` counts the requests made
    /// for it so far: past the first it is held, and is resumed or completed
    /// rather than forwarded or answered.
    pub(crate) fn judge(&mut self, xid: u32, original: Msg, round: u8, out: &mut Vec<Action<Msg>>) {
        let held = round > 0;
        let may_ask = round < MAX_ROUNDS;
        let Some(plain) = untagged(&original) else {
            return;
        };
        let Some(args) = nfs_args(&plain).cloned() else {
            return;
        };
        let p = args.procedure();
        let (ip, uid, _) = caller(&original);
        let now = self.now();
        let session = self.state.session(&self.model, ip, uid).clone();
        let roles = RbacState::active(&self.model, &session, now);
        let fh = match Self::target(&args) {
            Ok(fh) => fh,
            Err((dir, name)) => match self.names.get(&(dir.clone(), name.clone())) {
                Some(child) => child.clone(),
                None if may_ask && !session.threat => {
                    let lookup = Nfs3Call::Lookup(DirOpArgs3 {
                        dir: NfsFh3(dir),
                        name,
                    });
                    self.inject(xid, &original, lookup, Then::Evaluate(round + 1), out);
                    return;
                }
                // Not found even by the server: let it answer (NOENT) as the caller.
                None => dir,
            },
        };
        let matrix = self.matrix(&fh);
        let owner = self.attrs.get(&fh).map(|a| a.owner);
        // The call runs as the owner of the object it acts on: the directory for
        // calls that change one (the server checks the directory), else the object.
        let acting = handles_of(&args).into_iter().next().unwrap_or_default();
        let actor = self.attrs.get(&acting).map(|a| a.owner);
        let needs_owner = matrix
            .cell(p)
            .is_some_and(|c| matches!(c.allow, Allow::Owner | Allow::Mode));
        if may_ask && !session.threat {
            let missing = if needs_owner && owner.is_none() {
                Some(fh.clone())
            } else if self.rewrite_uid && actor.is_none() {
                Some(acting.clone())
            } else {
                None
            };
            if let Some(m) = missing {
                self.inject(
                    xid,
                    &original,
                    Nfs3Call::Getattr(NfsFh3(m)),
                    Then::Evaluate(round + 1),
                    out,
                );
                return;
            }
        }
        let who = Subject {
            uid,
            roles: &roles,
            threat: session.threat,
        };
        let verdict = evaluate(&self.model, &self.state.assign, &who, &matrix, owner, p);
        let what = self.describe(&session, &roles, p, &fh);
        self.apply(xid, held, (ip, uid), verdict, &what, plain, actor, out);
    }

    /// Forwards (as the actor, with `rewrite_uid`) or denies a judged call.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        xid: u32,
        held: bool,
        (ip, uid): (IpAddr, u32),
        verdict: Verdict,
        what: &str,
        plain: Msg,
        actor: Option<Owner>,
        out: &mut Vec<Action<Msg>>,
    ) {
        let p = nfs_args(&plain).map_or(Nfs3Proc::Null, Nfs3Call::procedure);
        match verdict {
            Verdict::Allow { log } => {
                lock_counters(&self.counters).rbac.allowed += 1;
                if log {
                    lock_counters(&self.counters).rbac.logged += 1;
                    self.audit(&format!("LOG {what}"));
                }
                let mut fwd = plain;
                if self.rewrite_uid
                    && let (Some(o), Msg::Call { call, .. }) = (actor, &mut fwd)
                    && let Auth::Sys(s) = &mut call.cred
                {
                    s.uid = o.uid;
                    s.gid = o.gid;
                    s.gids = vec![o.gid];
                }
                self.mark_forwarded(xid, &fwd);
                out.push(if held {
                    Action::Resume { xid, request: fwd }
                } else {
                    Action::Forward(fwd)
                });
            }
            Verdict::Deny { alarm } => {
                lock_counters(&self.counters).rbac.denied += 1;
                if alarm {
                    lock_counters(&self.counters).rbac.alarms += 1;
                    self.audit(&format!("ALARM {what}"));
                }
                if self.state.denied(&self.model, ip, uid) {
                    lock_counters(&self.counters).rbac.threats += 1;
                    self.audit(&format!("THREAT uid={uid} ip={ip}: too many denials"));
                    self.save_threats();
                }
                Self::answer(xid, held, fail(p, NfsStat3::Acces), out);
            }
        }
    }

    fn describe(
        &self,
        s: &crate::rbac::Session,
        roles: &[RoleId],
        p: Nfs3Proc,
        fh: &[u8],
    ) -> String {
        let names: Vec<String> = roles.iter().map(|&r| self.role_name(r)).collect();
        let obj = self
            .paths
            .get(fh)
            .cloned()
            .unwrap_or_else(|| fh.iter().map(|b| format!("{b:02x}")).collect());
        format!(
            "uid={} ip={} session={} roles={} {} /{obj}",
            s.uid,
            s.ip,
            s.id,
            names.join(","),
            format!("{p:?}").to_uppercase()
        )
    }

    /// Records an object's attributes.
    fn learn_attr(&mut self, fh: &[u8], a: &Fattr3) {
        let attr = Attr {
            owner: Owner {
                uid: a.uid,
                gid: a.gid,
                mode: a.mode,
            },
            ftype: a.ftype,
        };
        remember(&mut self.attrs, fh.to_vec(), attr);
    }

    /// Records that `name` in `dir` is `obj`.
    fn learn_name(&mut self, dir: &[u8], name: &[u8], obj: &[u8]) {
        if name == b"." || name == b".." {
            return;
        }
        remember(&mut self.names, (dir.to_vec(), name.to_vec()), obj.to_vec());
        if let Some(parent) = self.paths.get(dir)
            && let Ok(n) = std::str::from_utf8(name)
        {
            let path = if parent.is_empty() {
                n.to_string()
            } else {
                format!("{parent}/{n}")
            };
            let fresh = self.paths.get(obj) != Some(&path);
            remember(&mut self.paths, obj.to_vec(), path.clone());
            // A path the policy file names gets its matrix stored on first sight,
            // so the object keeps it even when next seen by handle only.
            if fresh
                && let Some((_, m)) = self.model.files.iter().find(|(p, _)| *p == path)
                && matches!(self.store.matrix(obj), Ok(None))
            {
                let m = m.clone();
                if let Err(e) = self.set_matrix(obj, m) {
                    self.store_failed(&e);
                }
            }
        }
    }

    /// Learns owners, names and paths from a reply to `args` (server handles).
    pub(crate) fn learn(&mut self, args: &Nfs3Call, results: &Nfs3Reply) {
        use Nfs3Call as C;
        use Nfs3Reply as R;
        match (args, results) {
            (C::Getattr(fh), R::Getattr(NfsRes::Ok(a))) => self.learn_attr(&fh.0, a),
            (C::Lookup(d), R::Lookup(NfsRes::Ok(ok))) => {
                if let Some(a) = &ok.obj_attributes {
                    self.learn_attr(&ok.object.0, a);
                }
                if let Some(a) = &ok.dir_attributes {
                    self.learn_attr(&d.dir.0, a);
                }
                self.learn_name(&d.dir.0, &d.name, &ok.object.0);
            }
            (C::Readdirplus(d), R::Readdirplus(NfsRes::Ok(ok))) => {
                for e in &ok.reply.entries {
                    if let Some(h) = &e.name_handle {
                        if let Some(a) = &e.name_attributes {
                            self.learn_attr(&h.0, a);
                        }
                        self.learn_name(&d.dir.0, &e.name, &h.0);
                    }
                }
            }
            (
                C::Create(crate::nfs3::CreateArgs { place, .. })
                | C::Mkdir(crate::nfs3::MkdirArgs { place, .. })
                | C::Symlink(crate::nfs3::SymlinkArgs { place, .. })
                | C::Mknod(crate::nfs3::MknodArgs { place, .. }),
                R::Create(NfsRes::Ok(ok))
                | R::Mkdir(NfsRes::Ok(ok))
                | R::Symlink(NfsRes::Ok(ok))
                | R::Mknod(NfsRes::Ok(ok)),
            ) => {
                if let Some(h) = &ok.obj {
                    if let Some(a) = &ok.obj_attributes {
                        self.learn_attr(&h.0, a);
                    }
                    self.learn_name(&place.dir.0, &place.name, &h.0);
                }
            }
            (C::Setattr(a), R::Setattr(NfsRes::Ok(w))) => {
                if let Some(at) = &w.after {
                    self.learn_attr(&a.object.0, at);
                }
            }
            (C::Write(a), R::Write(NfsRes::Ok(w))) => {
                if let Some(at) = &w.file_wcc.after {
                    self.learn_attr(&a.file.0, at);
                }
            }
            (C::Remove(d) | C::Rmdir(d), R::Remove(NfsRes::Ok(_)) | R::Rmdir(NfsRes::Ok(_))) => {
                self.names.remove(&(d.dir.0.clone(), d.name.clone()));
            }
            (C::Rename(r), R::Rename(NfsRes::Ok(_))) => {
                self.names
                    .remove(&(r.from.dir.0.clone(), r.from.name.clone()));
            }
            _ => {}
        }
    }

    /// A reply to a client call this policy passed on: learn from it, add the
    /// VCN to root listings, and make its handles virtual.
    fn pass_back(&mut self, sent: &CallArgs, mut response: Msg, out: &mut Vec<Action<Msg>>) {
        if let Msg::Reply(r) = &mut response
            && let Some(results) = &mut r.results
        {
            match (sent, &mut *results) {
                (CallArgs::Nfs3(args), ReplyResults::Nfs3(res)) => self.learn(args, res),
                (
                    CallArgs::Mount3(MountCall::Mnt(path)),
                    ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })),
                ) => {
                    if self.roots.get(&fhandle.0) != Some(&path.0) {
                        if let Err(e) = self.store.add_root(&fhandle.0, &path.0) {
                            self.store_failed(&e);
                        }
                        self.roots.insert(fhandle.0.clone(), path.0.clone());
                    }
                    remember(&mut self.paths, fhandle.0.clone(), String::new());
                }
                _ => {}
            }
            let ok = reply_handles(results, &mut |h| match Vfh::Real(h.0.clone()).encode() {
                Some(v) if h.0.len() <= MAX_REAL => {
                    h.0 = v;
                    true
                }
                _ => false,
            });
            if !ok {
                lock_counters(&self.counters).oversize_handles += 1;
                *results = match results {
                    ReplyResults::Nfs3(r) => {
                        ReplyResults::Nfs3(nfs_failure(r.procedure(), NfsStat3::ServerFault))
                    }
                    _ => ReplyResults::Mount3(MountReply::Mnt(MountRes3::Fail(
                        MountStat3::ServerFault,
                    ))),
                };
            } else if let (CallArgs::Nfs3(args), ReplyResults::Nfs3(res)) = (sent, &mut *results) {
                self.add_vcn_entry(args, res);
            }
        } else if let Msg::RawReply(_) = response {
            return; // undecodable results might carry real handles: dropped
        }
        out.push(Action::Forward(response));
    }

    /// A request the policy made came back.
    fn injected(&mut self, token: u32, request: &Msg, response: Msg, out: &mut Vec<Action<Msg>>) {
        let Some(w) = self.waiting.remove(&token) else {
            return;
        };
        if let (Some(args), Msg::Reply(r)) = (nfs_args(request), &response)
            && let Some(ReplyResults::Nfs3(res)) = &r.results
        {
            self.learn(args, res);
        }
        match w.then {
            Then::Evaluate(round) => self.judge(w.xid, w.original, round, out),
            Then::Vcn => self.vcn(w.xid, w.original, Some(response), out),
        }
    }
}

impl Policy<Msg> for RbacPolicy {
    fn name(&self) -> &str {
        "rbac"
    }

    fn on_request(&mut self, xid: u32, request: Msg, out: &mut Vec<Action<Msg>>) {
        let Some(args) = nfs_args(&request) else {
            // MOUNT (its replies are learned from and made virtual) and the rest.
            self.mark_forwarded(xid, &request);
            out.push(Action::Forward(request));
            return;
        };
        if matches!(args, Nfs3Call::Null(())) {
            self.mark_forwarded(xid, &request);
            out.push(Action::Forward(request));
            return;
        }
        let decoded: Option<Vec<Vfh>> = handles_of(args).iter().map(|h| Vfh::decode(h)).collect();
        let p = args.procedure();
        match decoded {
            None => {
                lock_counters(&self.counters).bad_handles += 1;
                out.push(Action::Respond(fail(p, NfsStat3::BadHandle)));
            }
            Some(hs)
                if hs.iter().all(|h| matches!(h, Vfh::Real(_))) && !self.is_vcn_call(args, &hs) =>
            {
                self.judge(xid, request, 0, out);
            }
            Some(_) => self.vcn(xid, request, None, out),
        }
    }

    fn on_response(&mut self, xid: u32, request: &Msg, response: Msg, out: &mut Vec<Action<Msg>>) {
        if let Some((_, sent)) = self.forwarded.remove(&xid) {
            self.pass_back(&sent, response, out);
            return;
        }
        if let Msg::Call { call, .. } = request {
            self.injected(call.xid, request, response, out);
        }
    }

    fn on_tick(&mut self, now: Instant, _out: &mut Vec<Action<Msg>>) {
        self.waiting.retain(|_, w| w.deadline > now);
        if self.forwarded.len() > MAX_SOFT {
            self.forwarded
                .retain(|_, (t, _)| now.duration_since(*t) < INJECT_TIMEOUT * 30);
        }
        if let Err(e) = self.store.flush_audit() {
            self.store_failed(&e);
        }
    }
}

impl Drop for RbacPolicy {
    fn drop(&mut self) {
        let _ = self.store.flush_audit();
    }
}

/// Whether a call on real objects is really for the VCN: LOOKUP of `.filewall`
/// in a root, or a root listing continued past the VCN's own entry.
impl RbacPolicy {
    fn is_vcn_call(&self, args: &Nfs3Call, hs: &[Vfh]) -> bool {
        let root = |h: &Vfh| matches!(h, Vfh::Real(fh) if self.roots.contains_key(fh));
        match args {
            Nfs3Call::Lookup(a) => a.name == crate::vcn::VCN_NAME && hs.first().is_some_and(root),
            Nfs3Call::Readdir(a) => {
                a.cookie == crate::vcn::VCN_COOKIE && hs.first().is_some_and(root)
            }
            Nfs3Call::Readdirplus(a) => {
                a.cookie == crate::vcn::VCN_COOKIE && hs.first().is_some_and(root)
            }
            _ => false,
        }
    }

    /// Whether `fh` is an export root (server's handle).
    pub(crate) fn known_root(&self, fh: &[u8]) -> bool {
        self.roots.contains_key(fh)
    }

    /// Notes that `sent` (server handles) goes on to the server as `xid`: its reply
    /// comes back through `pass_back`.
    pub(crate) fn mark_forwarded(&mut self, xid: u32, sent: &Msg) {
        let Msg::Call { call, .. } = sent else { return };
        let args = match &call.args {
            // The data is not needed to read the reply.
            CallArgs::Nfs3(Nfs3Call::Write(w)) => {
                CallArgs::Nfs3(Nfs3Call::Write(crate::nfs3::WriteArgs {
                    file: w.file.clone(),
                    offset: w.offset,
                    count: w.count,
                    stable: w.stable,
                    data: Vec::new(),
                }))
            }
            other => other.clone(),
        };
        self.forwarded.insert(xid, (Instant::now(), args));
    }
}
