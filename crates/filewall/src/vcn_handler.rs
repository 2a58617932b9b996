//! The VCN handler (Fig. 4.5's "VCN handler", §4.5.2): calls on virtual objects
//! answered by the RBAC policy itself. READ, READDIR(PLUS), LOOKUP, GETATTR and
//! ACCESS render FileWall's state for the caller's session; WRITE to `roles/ctrl`
//! activates roles (a refusal is NFS3ERR_ACCES and leaves the session as it was),
//! WRITE to `users/ctrl` runs an administrator's commands, WRITE to a shadow file
//! changes that object's permissions (its owner or a superuser only). SETATTR is
//! refused except truncation (a no-op) on writable files, CREATE only finds an
//! existing file, so `>` redirection and copy tools work. Shadow directories are
//! the real ones seen through: their LOOKUP and listing are fetched from the
//! server and mapped to shadow handles. FSSTAT, FSINFO and PATHCONF go to the
//! server for the real object underneath.

use std::fmt::Write as _;

use crate::chain::Action;
use crate::flowstats::lock_counters;
use crate::message::{Msg, ReplyResults};
use crate::nfs3::{
    AccessOk, CommitOk, CreateOk, DirList, DirOpArgs3, Entry3, EntryPlus3, Fattr3, Ftype3,
    LookupOk, Nfs3Call, Nfs3Proc, Nfs3Reply, NfsFh3, NfsRes, NfsStat3, ReadOk, ReaddirOk,
    ReaddirplusOk, StableHow, WccData, WriteOk,
};
use crate::rbac::{RbacState, Session};
use crate::rbac_policy::{RbacPolicy, Then, caller, fail, handles_of, nfs_args, reply};
use crate::vcn::{Node, VCN_COOKIE, VCN_NAME, Vfh, attrs, children, node_mode, parent, read_slice};
use crate::vcn_text::{
    AdminCommand, RolesRequest, apply_edits, parse_admin_commands, parse_matrix_edits,
    parse_roles_request, render_matrix,
};

const ACCESS_READ: u32 = 0x1;
const ACCESS_LOOKUP: u32 = 0x2;
const ACCESS_MODIFY: u32 = 0x4;
const ACCESS_EXTEND: u32 = 0x8;

fn fh(v: &Vfh) -> NfsFh3 {
    NfsFh3(v.encode().unwrap_or_default())
}

/// A call on the VCN, with what the handler knows of its caller.
struct Ctx {
    xid: u32,
    held: bool,
    session: Session,
    superuser: bool,
}

impl RbacPolicy {
    /// Handles a call on a virtual object; `injected` is the reply to a request
    /// the handler made for it.
    pub(crate) fn vcn(
        &mut self,
        xid: u32,
        original: Msg,
        injected: Option<Msg>,
        out: &mut Vec<Action<Msg>>,
    ) {
        let Some(args) = nfs_args(&original).cloned() else {
            return;
        };
        let p = args.procedure();
        let (ip, uid, _) = caller(&original);
        let now = self.now();
        let session = self.state.session(&self.model, ip, uid).clone();
        let roles = RbacState::active(&self.model, &session, now);
        let cx = Ctx {
            xid,
            held: injected.is_some(),
            superuser: roles.iter().any(|&r| self.model.roles[r].superuser),
            session,
        };
        lock_counters(&self.counters).rbac.vcn_calls += 1;
        if cx.session.threat {
            lock_counters(&self.counters).rbac.alarms += 1;
            self.audit(&format!(
                "ALARM uid={uid} ip={ip} threat session {}",
                format!("{p:?}").to_uppercase()
            ));
            return Self::answer(xid, cx.held, fail(p, NfsStat3::Acces), out);
        }
        let hs: Vec<Vfh> = handles_of(&args)
            .iter()
            .filter_map(|h| Vfh::decode(h))
            .collect();
        let Some(first) = hs.first().cloned() else {
            return Self::answer(xid, cx.held, fail(p, NfsStat3::BadHandle), out);
        };
        if matches!(p, Nfs3Proc::Fsstat | Nfs3Proc::Fsinfo | Nfs3Proc::Pathconf) {
            return self.pass_to_server(&cx, original, &first, out);
        }
        let response = match first {
            Vfh::Real(root) => self.root_call(&args, &root),
            Vfh::Node { node, root } => self.node_call(&cx, &args, node, &root),
            Vfh::Shadow(real) => {
                match self.shadow_call(&cx, &original, &args, &real, injected, out) {
                    Some(r) => r,
                    None => return, // waiting for the server
                }
            }
        };
        Self::answer(xid, cx.held, response, out);
    }

    /// FSSTAT, FSINFO, PATHCONF: asked of the real object underneath.
    fn pass_to_server(&mut self, cx: &Ctx, mut original: Msg, v: &Vfh, out: &mut Vec<Action<Msg>>) {
        let real = match v {
            Vfh::Real(fh) | Vfh::Shadow(fh) => fh.clone(),
            Vfh::Node { root, .. } => root.clone(),
        };
        if let Msg::Call { call, .. } = &mut original
            && let crate::message::CallArgs::Nfs3(
                Nfs3Call::Fsstat(h) | Nfs3Call::Fsinfo(h) | Nfs3Call::Pathconf(h),
            ) = &mut call.args
        {
            h.0 = real;
        }
        self.mark_forwarded(cx.xid, &original);
        out.push(if cx.held {
            Action::Resume {
                xid: cx.xid,
                request: original,
            }
        } else {
            Action::Forward(original)
        });
    }

    /// LOOKUP of `.filewall` in a root, or a root listing past the VCN's entry.
    fn root_call(&self, args: &Nfs3Call, root: &[u8]) -> Msg {
        let top = Vfh::Node {
            node: Node::Top,
            root: root.to_vec(),
        };
        match args {
            Nfs3Call::Lookup(_) => reply(Nfs3Reply::Lookup(NfsRes::Ok(LookupOk {
                object: fh(&top),
                obj_attributes: Some(self.node_attrs(&top, Node::Top, 0)),
                dir_attributes: None,
            }))),
            Nfs3Call::Readdir(a) => reply(Nfs3Reply::Readdir(NfsRes::Ok(ReaddirOk {
                dir_attributes: None,
                cookieverf: a.cookieverf,
                reply: DirList {
                    entries: Vec::new(),
                    eof: true,
                },
            }))),
            Nfs3Call::Readdirplus(a) => reply(Nfs3Reply::Readdirplus(NfsRes::Ok(ReaddirplusOk {
                dir_attributes: None,
                cookieverf: a.cookieverf,
                reply: DirList {
                    entries: Vec::new(),
                    eof: true,
                },
            }))),
            other => fail(other.procedure(), NfsStat3::Acces),
        }
    }

    fn node_attrs(&self, v: &Vfh, node: Node, size: usize) -> Fattr3 {
        let size = if node.is_dir() { 4096 } else { size as u64 };
        attrs(
            v,
            node.is_dir(),
            node_mode(node),
            (0, 0),
            size,
            self.generation,
        )
    }

    /// The names of the policy's users and roles.
    fn names(&self) -> (Vec<String>, Vec<String>) {
        (
            self.model.users.iter().map(|u| u.name.clone()).collect(),
            self.model.roles.iter().map(|r| r.name.clone()).collect(),
        )
    }

    /// What a fixed file reads as for this caller (`None`: not for them).
    fn node_content(&mut self, cx: &Ctx, node: Node) -> Option<String> {
        let mut s = String::new();
        match node {
            Node::RolesCtrl => {
                let now = self.now();
                let active: Vec<String> = RbacState::active(&self.model, &cx.session, now)
                    .into_iter()
                    .map(|r| self.role_name(r))
                    .collect();
                let held: Vec<String> = self
                    .model
                    .user_by_uid(cx.session.uid)
                    .map(|u| self.model.held(&self.state.assign[u]))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| self.role_name(r))
                    .collect();
                let _ = writeln!(
                    s,
                    "session {} uid {} ip {}",
                    cx.session.id, cx.session.uid, cx.session.ip
                );
                let _ = writeln!(s, "active: {}", active.join(" "));
                let _ = writeln!(s, "held: {}", held.join(" "));
                s.push_str("# write role names here to start a session with them, or reset\n");
            }
            Node::UsersCtrl => {
                s.push_str("# administrators: assign USER ROLE | revoke USER ROLE | lift USER | threat USER\n");
                for (ip, uid) in &self.state.threats {
                    let _ = writeln!(s, "threat uid {uid} ip {ip}");
                }
            }
            Node::User(i) => {
                let u = self.model.users.get(usize::from(i))?;
                let assigned: Vec<String> = self.state.assign[usize::from(i)]
                    .iter()
                    .map(|&r| self.role_name(r))
                    .collect();
                let _ = writeln!(s, "user {} uid {}", u.name, u.uid);
                let _ = writeln!(s, "assigned: {}", assigned.join(" "));
                for x in self.state.sessions.values().filter(|x| x.uid == u.uid) {
                    let roles: Vec<String> =
                        x.roles.iter().map(|&(r, _)| self.role_name(r)).collect();
                    let _ = writeln!(
                        s,
                        "session {} ip {}{}: {}",
                        x.id,
                        x.ip,
                        if x.threat { " THREAT" } else { "" },
                        roles.join(" ")
                    );
                }
            }
            Node::Role(i) => s = self.role_content(usize::from(i))?,
            Node::Log => {
                if !cx.superuser {
                    return None;
                }
                match self.store.audit_tail(200) {
                    Ok(lines) => lines.iter().for_each(|l| {
                        s.push_str(l);
                        s.push('\n');
                    }),
                    Err(e) => self.store_failed(&e),
                }
            }
            Node::Top | Node::Users | Node::Roles => {}
        }
        Some(s)
    }

    /// What `roles/<name>` reads as.
    fn role_content(&self, i: usize) -> Option<String> {
        let mut s = String::new();
        let r = self.model.roles.get(i)?;
        let juniors: Vec<String> = r.juniors.iter().map(|&j| self.role_name(j)).collect();
        let members: Vec<String> = self
            .model
            .users
            .iter()
            .enumerate()
            .filter(|(u, _)| self.state.assign[*u].contains(&i))
            .map(|(_, u)| u.name.clone())
            .collect();
        let _ = writeln!(
            s,
            "role {}\njuniors: {}\nmembers: {}",
            r.name,
            juniors.join(" "),
            members.join(" ")
        );
        let _ = writeln!(s, "superuser: {}\nexclusive: {}", r.superuser, r.exclusive);
        for d in self.model.delegations.iter().filter(|d| d.role == i) {
            let _ = writeln!(
                s,
                "delegated to {} {:02}:{:02}-{:02}:{:02}",
                self.role_name(d.to),
                d.window.start / 60,
                d.window.start % 60,
                d.window.end / 60,
                d.window.end % 60
            );
        }

        Some(s)
    }

    fn node_call(&mut self, cx: &Ctx, args: &Nfs3Call, node: Node, root: &[u8]) -> Msg {
        let me = Vfh::Node {
            node,
            root: root.to_vec(),
        };
        let content = self.node_content(cx, node);
        let size = content.as_ref().map_or(0, String::len);
        let attr = self.node_attrs(&me, node, size);
        let p = args.procedure();
        match args {
            Nfs3Call::Getattr(_) => reply(Nfs3Reply::Getattr(NfsRes::Ok(attr))),
            Nfs3Call::Access(a) => {
                let bits = if node.is_dir() {
                    ACCESS_READ | ACCESS_LOOKUP
                } else if node.writable() {
                    ACCESS_READ | ACCESS_MODIFY | ACCESS_EXTEND
                } else {
                    ACCESS_READ
                };
                reply(Nfs3Reply::Access(NfsRes::Ok(AccessOk {
                    obj_attributes: Some(attr),
                    access: a.access & bits,
                })))
            }
            Nfs3Call::Lookup(a) => self.node_lookup(node, root, &a.name, attr),
            Nfs3Call::Readdir(_) | Nfs3Call::Readdirplus(_) if node.is_dir() => {
                self.node_listing(args, node, root, attr)
            }
            Nfs3Call::Read(a) if !node.is_dir() => match content {
                Some(c) => {
                    let (data, eof) = read_slice(c.as_bytes(), a.offset, a.count);
                    reply(Nfs3Reply::Read(NfsRes::Ok(ReadOk {
                        file_attributes: Some(attr),
                        count: data.len() as u32,
                        eof,
                        data,
                    })))
                }
                None => fail(p, NfsStat3::Acces),
            },
            Nfs3Call::Write(a) if node.writable() => {
                let status = self.control_write(cx, node, &a.data);
                self.write_reply(status, a.data.len(), attr)
            }
            Nfs3Call::Setattr(a) if node.writable() => self.truncate_only(a, attr),
            Nfs3Call::Create(a) if node.is_dir() => {
                let found = children(node, root, &self.names().0, &self.names().1)
                    .into_iter()
                    .find(|(n, v)| *n == a.place.name && !matches!(v, Vfh::Shadow(_)));
                match found {
                    Some((_, v)) => reply(Nfs3Reply::Create(NfsRes::Ok(CreateOk {
                        obj: Some(fh(&v)),
                        obj_attributes: None,
                        dir_wcc: WccData {
                            before: None,
                            after: None,
                        },
                    }))),
                    None => fail(p, NfsStat3::Acces),
                }
            }
            Nfs3Call::Commit(_) if node.writable() => {
                reply(Nfs3Reply::Commit(NfsRes::Ok(CommitOk {
                    file_wcc: WccData {
                        before: None,
                        after: Some(attr),
                    },
                    verf: [0; 8],
                })))
            }
            _ => fail(p, NfsStat3::Acces),
        }
    }

    fn node_lookup(&mut self, node: Node, root: &[u8], name: &[u8], dir_attr: Fattr3) -> Msg {
        let me = Vfh::Node {
            node,
            root: root.to_vec(),
        };
        let (users, roles) = self.names();
        let found = match name {
            b"." => Some(me),
            b".." => Some(parent(node, root)),
            _ => children(node, root, &users, &roles)
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v),
        };
        let Some(v) = found else {
            return reply(Nfs3Reply::Lookup(NfsRes::Fail(
                NfsStat3::NoEnt,
                Some(dir_attr),
            )));
        };
        let obj_attributes = match &v {
            Vfh::Node { node: n, .. } => Some(self.node_attrs(&v, *n, 0)),
            _ => None,
        };
        reply(Nfs3Reply::Lookup(NfsRes::Ok(LookupOk {
            object: fh(&v),
            obj_attributes,
            dir_attributes: Some(dir_attr),
        })))
    }

    fn node_listing(&mut self, args: &Nfs3Call, node: Node, root: &[u8], attr: Fattr3) -> Msg {
        let me = Vfh::Node {
            node,
            root: root.to_vec(),
        };
        let (users, roles) = self.names();
        let mut all = vec![(b".".to_vec(), me), (b"..".to_vec(), parent(node, root))];
        all.extend(children(node, root, &users, &roles));
        let (cookie, verf) = match args {
            Nfs3Call::Readdir(a) => (a.cookie, a.cookieverf),
            Nfs3Call::Readdirplus(a) => (a.cookie, a.cookieverf),
            _ => (0, [0; 8]),
        };
        let skip = usize::try_from(cookie).unwrap_or(usize::MAX);
        let rest = all.into_iter().enumerate().skip(skip);
        if let Nfs3Call::Readdir(_) = args {
            let entries = rest
                .map(|(i, (name, v))| Entry3 {
                    fileid: v.fileid(),
                    name,
                    cookie: i as u64 + 1,
                })
                .collect();
            return reply(Nfs3Reply::Readdir(NfsRes::Ok(ReaddirOk {
                dir_attributes: Some(attr),
                cookieverf: verf,
                reply: DirList { entries, eof: true },
            })));
        }
        let entries = rest
            .map(|(i, (name, v))| {
                let name_attributes = match &v {
                    Vfh::Node { node: n, .. } => Some(self.node_attrs(&v, *n, 0)),
                    _ => None,
                };
                EntryPlus3 {
                    fileid: v.fileid(),
                    name,
                    cookie: i as u64 + 1,
                    name_attributes,
                    name_handle: Some(fh(&v)),
                }
            })
            .collect();
        reply(Nfs3Reply::Readdirplus(NfsRes::Ok(ReaddirplusOk {
            dir_attributes: Some(attr),
            cookieverf: verf,
            reply: DirList { entries, eof: true },
        })))
    }

    fn write_reply(&self, status: NfsStat3, len: usize, attr: Fattr3) -> Msg {
        if status != NfsStat3::Ok {
            return fail(Nfs3Proc::Write, status);
        }
        reply(Nfs3Reply::Write(NfsRes::Ok(WriteOk {
            file_wcc: WccData {
                before: None,
                after: Some(attr),
            },
            count: len as u32,
            committed: StableHow::FileSync,
            verf: [0; 8],
        })))
    }

    fn truncate_only(&self, a: &crate::nfs3::SetattrArgs, attr: Fattr3) -> Msg {
        let s = &a.new_attributes;
        let only_size = s.mode.is_none() && s.uid.is_none() && s.gid.is_none();
        if only_size && matches!(s.size, Some(0) | None) {
            reply(Nfs3Reply::Setattr(NfsRes::Ok(WccData {
                before: None,
                after: Some(attr),
            })))
        } else {
            fail(Nfs3Proc::Setattr, NfsStat3::Acces)
        }
    }

    /// A WRITE to `roles/ctrl` or `users/ctrl`.
    fn control_write(&mut self, cx: &Ctx, node: Node, data: &[u8]) -> NfsStat3 {
        lock_counters(&self.counters).rbac.vcn_writes += 1;
        let Ok(text) = std::str::from_utf8(data) else {
            return self.refused("not UTF-8 text", NfsStat3::Inval);
        };
        let (ip, uid) = (cx.session.ip, cx.session.uid);
        match node {
            Node::RolesCtrl => match parse_roles_request(text) {
                Err(e) => self.refused(&format!("roles/ctrl {e}"), NfsStat3::Inval),
                Ok(RolesRequest::Reset) => {
                    self.state.sessions.remove(&(ip, uid));
                    self.generation += 1;
                    NfsStat3::Ok
                }
                Ok(RolesRequest::Roles(names)) => {
                    let now = self.now();
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    let was_threat = self.state.threats.len();
                    match self.state.activate(&self.model, ip, uid, &refs, now) {
                        Ok(id) => {
                            self.generation += 1;
                            self.audit(&format!(
                                "ROLES uid={uid} ip={ip} session={id}: {}",
                                names.join(",")
                            ));
                            NfsStat3::Ok
                        }
                        Err(e) => {
                            if self.state.threats.len() != was_threat {
                                lock_counters(&self.counters).rbac.threats += 1;
                                self.audit(&format!("THREAT uid={uid} ip={ip}: {e}"));
                                self.save_threats();
                            }
                            self.refused(&format!("uid {uid}: {e}"), NfsStat3::Acces)
                        }
                    }
                }
            },
            _ if !cx.superuser => self.refused("users/ctrl: administrators only", NfsStat3::Acces),
            _ => match parse_admin_commands(text) {
                Err(e) => self.refused(&format!("users/ctrl {e}"), NfsStat3::Inval),
                Ok(cmds) => self.admin(cx, &cmds),
            },
        }
    }

    /// Counts a refused VCN write and says why.
    fn refused(&self, why: &str, status: NfsStat3) -> NfsStat3 {
        let mut c = lock_counters(&self.counters);
        c.rbac.vcn_refused += 1;
        c.rbac.last_vcn_error = Some(why.to_string());
        status
    }

    /// Runs administrator commands: all are checked before any is applied.
    fn admin(&mut self, cx: &Ctx, cmds: &[AdminCommand]) -> NfsStat3 {
        let mut assign = self.state.assign.clone();
        let mut lift = Vec::new();
        let mut threat = Vec::new();
        for c in cmds {
            let user = match c {
                AdminCommand::Assign { user, .. }
                | AdminCommand::Revoke { user, .. }
                | AdminCommand::Lift { user }
                | AdminCommand::Threat { user } => user,
            };
            let Some(u) = self.model.user_by_name(user) else {
                return self.refused(&format!("users/ctrl: no user {user:?}"), NfsStat3::Inval);
            };
            match c {
                AdminCommand::Assign { role, .. } | AdminCommand::Revoke { role, .. } => {
                    let Some(r) = self.model.role(role) else {
                        return self
                            .refused(&format!("users/ctrl: no role {role:?}"), NfsStat3::Inval);
                    };
                    if matches!(c, AdminCommand::Assign { .. }) {
                        assign[u].insert(r);
                    } else {
                        assign[u].remove(&r);
                    }
                }
                AdminCommand::Lift { .. } => lift.push(self.model.users[u].uid),
                AdminCommand::Threat { .. } => threat.push(self.model.users[u].uid),
            }
        }
        for (u, roles) in assign.iter().enumerate() {
            if *roles != self.state.assign[u] {
                let names: Vec<String> = roles.iter().map(|&r| self.role_name(r)).collect();
                if let Err(e) = self.store.set_assignment(&self.model.users[u].name, &names) {
                    self.store_failed(&e);
                    return NfsStat3::ServerFault;
                }
            }
        }
        self.state.assign = assign;
        for uid in lift {
            self.state.lift(uid);
        }
        for uid in threat {
            let ips: Vec<_> = self
                .state
                .sessions
                .values()
                .filter(|s| s.uid == uid)
                .map(|s| s.ip)
                .collect();
            for ip in ips {
                self.state.make_threat(&self.model, ip, uid);
            }
        }
        self.save_threats();
        self.generation += 1;
        let text: Vec<String> = cmds.iter().map(|c| format!("{c:?}")).collect();
        self.audit(&format!(
            "ADMIN uid={} ip={}: {}",
            cx.session.uid,
            cx.session.ip,
            text.join("; ")
        ));
        NfsStat3::Ok
    }

    /// Adds `.filewall` to the last page of a root's listing.
    pub(crate) fn add_vcn_entry(&self, args: &Nfs3Call, res: &mut Nfs3Reply) {
        let (dir, plus) = match (args, &*res) {
            (Nfs3Call::Readdir(a), Nfs3Reply::Readdir(NfsRes::Ok(ok))) if ok.reply.eof => {
                (&a.dir.0, false)
            }
            (Nfs3Call::Readdirplus(a), Nfs3Reply::Readdirplus(NfsRes::Ok(ok))) if ok.reply.eof => {
                (&a.dir.0, true)
            }
            _ => return,
        };
        if !self.known_root(dir) {
            return;
        }
        let top = Vfh::Node {
            node: Node::Top,
            root: dir.clone(),
        };
        match res {
            Nfs3Reply::Readdir(NfsRes::Ok(ok)) if !plus => ok.reply.entries.push(Entry3 {
                fileid: top.fileid(),
                name: VCN_NAME.to_vec(),
                cookie: VCN_COOKIE,
            }),
            Nfs3Reply::Readdirplus(NfsRes::Ok(ok)) => ok.reply.entries.push(EntryPlus3 {
                fileid: top.fileid(),
                name: VCN_NAME.to_vec(),
                cookie: VCN_COOKIE,
                name_attributes: Some(self.node_attrs(&top, Node::Top, 0)),
                name_handle: Some(fh(&top)),
            }),
            _ => {}
        }
    }

    /// Attributes of a shadow object, from the real one's.
    fn shadow_attrs(&mut self, real: &[u8], size: usize) -> Option<Fattr3> {
        let a = *self.attrs.get(real)?;
        let dir = a.ftype == Ftype3::Dir;
        let mode = if dir { 0o555 } else { 0o644 };
        let size = if dir { 4096 } else { size };
        Some(attrs(
            &Vfh::Shadow(real.to_vec()),
            dir,
            mode,
            (a.owner.uid, a.owner.gid),
            size as u64,
            self.generation,
        ))
    }

    /// What a shadow file reads as.
    fn shadow_content(&mut self, real: &[u8]) -> String {
        let m = self.matrix(real);
        let model = &self.model;
        let body = render_matrix(&m, &|r| model.roles[r].name.clone());
        let path = self
            .paths
            .get(real)
            .cloned()
            .unwrap_or_else(|| real.iter().map(|b| format!("{b:02x}")).collect());
        let owner = self.attrs.get(real).map(|a| a.owner);
        let mut s = format!("# /{path}");
        if let Some(o) = owner {
            let _ = write!(
                s,
                ": owner uid {} gid {} mode {:04o}",
                o.uid,
                o.gid,
                o.mode & 0o7777
            );
        }
        s.push_str(
            "\n# OP allow=ROLE|owner|mode|anyone|nobody [deny=ROLE] [log=ROLE] [alarm=ROLE]\n",
        );
        s.push_str(&body);
        s
    }

    /// A call on a shadow object; `None` while the server is asked first.
    fn shadow_call(
        &mut self,
        cx: &Ctx,
        original: &Msg,
        args: &Nfs3Call,
        real: &[u8],
        injected: Option<Msg>,
        out: &mut Vec<Action<Msg>>,
    ) -> Option<Msg> {
        let p = args.procedure();
        // Name lookups and listings are the server's, seen through.
        match args {
            Nfs3Call::Lookup(a) if a.name == b".." && self.known_root(real) => {
                let top = Vfh::Node {
                    node: Node::Top,
                    root: real.to_vec(),
                };
                let attr = self.node_attrs(&top, Node::Top, 0);
                return Some(reply(Nfs3Reply::Lookup(NfsRes::Ok(LookupOk {
                    object: fh(&top),
                    obj_attributes: Some(attr),
                    dir_attributes: None,
                }))));
            }
            Nfs3Call::Lookup(a) | Nfs3Call::Create(crate::nfs3::CreateArgs { place: a, .. }) => {
                let Some(r) = injected else {
                    let lookup = Nfs3Call::Lookup(DirOpArgs3 {
                        dir: NfsFh3(real.to_vec()),
                        name: a.name.clone(),
                    });
                    self.inject(cx.xid, original, lookup, Then::Vcn, out);
                    return None;
                };
                return Some(self.shadow_lookup(p, real, &r));
            }
            Nfs3Call::Readdir(_) | Nfs3Call::Readdirplus(_) => {
                let Some(r) = injected else {
                    let mut real_args = args.clone();
                    if let Nfs3Call::Readdir(x) = &mut real_args {
                        x.dir = NfsFh3(real.to_vec());
                    } else if let Nfs3Call::Readdirplus(x) = &mut real_args {
                        x.dir = NfsFh3(real.to_vec());
                    }
                    self.inject(cx.xid, original, real_args, Then::Vcn, out);
                    return None;
                };
                return Some(self.shadow_listing(real, r));
            }
            _ => {}
        }
        // The rest needs the real object's attributes.
        if !self.attrs.contains_key(real) {
            if injected.is_none() {
                self.inject(
                    cx.xid,
                    original,
                    Nfs3Call::Getattr(NfsFh3(real.to_vec())),
                    Then::Vcn,
                    out,
                );
                return None;
            }
            let stat = match injected {
                Some(Msg::Reply(r)) => match r.results {
                    Some(ReplyResults::Nfs3(Nfs3Reply::Getattr(NfsRes::Fail(s, ())))) => s,
                    _ => NfsStat3::Io,
                },
                _ => NfsStat3::Io,
            };
            return Some(fail(p, stat));
        }
        Some(self.shadow_object(cx, args, real))
    }

    /// GETATTR, ACCESS, READ, WRITE, SETATTR, COMMIT on a shadow object whose real
    /// object's attributes are known.
    fn shadow_object(&mut self, cx: &Ctx, args: &Nfs3Call, real: &[u8]) -> Msg {
        let p = args.procedure();
        let content = self.shadow_content(real);
        let Some(attr) = self.shadow_attrs(real, content.len()) else {
            return fail(p, NfsStat3::Io);
        };
        let dir = attr.ftype == Ftype3::Dir;
        let owner_uid = self.attrs.get(real).map(|a| a.owner.uid);
        let may_write = !dir && (cx.superuser || owner_uid == Some(cx.session.uid));
        match args {
            Nfs3Call::Getattr(_) => reply(Nfs3Reply::Getattr(NfsRes::Ok(attr))),
            Nfs3Call::Access(a) => {
                let mut bits = ACCESS_READ | if dir { ACCESS_LOOKUP } else { 0 };
                if may_write {
                    bits |= ACCESS_MODIFY | ACCESS_EXTEND;
                }
                reply(Nfs3Reply::Access(NfsRes::Ok(AccessOk {
                    obj_attributes: Some(attr),
                    access: a.access & bits,
                })))
            }
            Nfs3Call::Read(a) if !dir => {
                let (data, eof) = read_slice(content.as_bytes(), a.offset, a.count);
                reply(Nfs3Reply::Read(NfsRes::Ok(ReadOk {
                    file_attributes: Some(attr),
                    count: data.len() as u32,
                    eof,
                    data,
                })))
            }
            Nfs3Call::Write(a) if !dir => {
                let status = if may_write {
                    self.shadow_write(cx, real, &a.data)
                } else {
                    self.refused(
                        "shadow: only the owner or an administrator may change permissions",
                        NfsStat3::Acces,
                    )
                };
                let after = self.shadow_content(real);
                let attr = self.shadow_attrs(real, after.len()).unwrap_or(attr);
                self.write_reply(status, a.data.len(), attr)
            }
            Nfs3Call::Setattr(a) if may_write => self.truncate_only(a, attr),
            Nfs3Call::Commit(_) if may_write => reply(Nfs3Reply::Commit(NfsRes::Ok(CommitOk {
                file_wcc: WccData {
                    before: None,
                    after: Some(attr),
                },
                verf: [0; 8],
            }))),
            _ => fail(p, NfsStat3::Acces),
        }
    }

    fn shadow_write(&mut self, cx: &Ctx, real: &[u8], data: &[u8]) -> NfsStat3 {
        lock_counters(&self.counters).rbac.vcn_writes += 1;
        let Ok(text) = std::str::from_utf8(data) else {
            return self.refused("shadow: not UTF-8 text", NfsStat3::Inval);
        };
        let model = &self.model;
        let edits = match parse_matrix_edits(text, &|n| model.role(n)) {
            Ok(e) => e,
            Err(e) => return self.refused(&format!("shadow {e}"), NfsStat3::Inval),
        };
        let mut m = self.matrix(real);
        let policy = self
            .model
            .matrix_for_path(self.paths.get(real).map(String::as_str))
            .clone();
        apply_edits(&mut m, &policy, &edits);
        if let Err(e) = self.set_matrix(real, m) {
            self.store_failed(&e);
            return NfsStat3::ServerFault;
        }
        self.generation += 1;
        let path = self.paths.get(real).cloned().unwrap_or_default();
        self.audit(&format!(
            "SHADOW uid={} ip={} /{path}: {}",
            cx.session.uid,
            cx.session.ip,
            text.trim().replace('\n', "; ")
        ));
        NfsStat3::Ok
    }

    /// The answer to a LOOKUP (or CREATE) in a shadow directory, from the server's
    /// answer to the same LOOKUP in the real one.
    fn shadow_lookup(&mut self, p: Nfs3Proc, dir: &[u8], r: &Msg) -> Msg {
        let found = match r {
            Msg::Reply(x) => match &x.results {
                Some(ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Ok(ok)))) => {
                    Ok(ok.object.0.clone())
                }
                Some(ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Fail(s, _)))) => Err(*s),
                _ => Err(NfsStat3::Io),
            },
            _ => Err(NfsStat3::Io),
        };
        let child = match found {
            Ok(c) => c,
            Err(s) if p == Nfs3Proc::Create => {
                return fail(
                    p,
                    if s == NfsStat3::NoEnt {
                        NfsStat3::Acces
                    } else {
                        s
                    },
                );
            }
            Err(s) => return fail(p, s),
        };
        let v = Vfh::Shadow(child.clone());
        let content = self.shadow_content(&child);
        let obj_attributes = self.shadow_attrs(&child, content.len());
        let dir_attributes = self.shadow_attrs(dir, 4096);
        if p == Nfs3Proc::Create {
            return reply(Nfs3Reply::Create(NfsRes::Ok(CreateOk {
                obj: Some(fh(&v)),
                obj_attributes,
                dir_wcc: WccData {
                    before: None,
                    after: dir_attributes,
                },
            })));
        }
        reply(Nfs3Reply::Lookup(NfsRes::Ok(LookupOk {
            object: fh(&v),
            obj_attributes,
            dir_attributes,
        })))
    }

    /// A shadow directory's listing, from the server's listing of the real one.
    fn shadow_listing(&mut self, dir: &[u8], r: Msg) -> Msg {
        let Msg::Reply(mut x) = r else {
            return fail(Nfs3Proc::Readdirplus, NfsStat3::Io);
        };
        let at_root = self.known_root(dir);
        let top = Vfh::Node {
            node: Node::Top,
            root: dir.to_vec(),
        };
        let dir_attr = self.shadow_attrs(dir, 4096);
        match &mut x.results {
            Some(ReplyResults::Nfs3(Nfs3Reply::Readdirplus(NfsRes::Ok(ok)))) => {
                ok.dir_attributes = dir_attr;
                for e in &mut ok.reply.entries {
                    let Some(h) = e.name_handle.take() else {
                        continue;
                    };
                    let v = if at_root && e.name == b".." {
                        top.clone()
                    } else {
                        Vfh::Shadow(h.0.clone())
                    };
                    let size = self.shadow_content(&h.0).len();
                    e.name_attributes = match &v {
                        Vfh::Shadow(real) => self.shadow_attrs(real, size),
                        _ => Some(self.node_attrs(&v, Node::Top, 0)),
                    };
                    e.fileid = v.fileid();
                    e.name_handle = v.encode().map(NfsFh3);
                }
            }
            Some(ReplyResults::Nfs3(Nfs3Reply::Readdir(NfsRes::Ok(ok)))) => {
                ok.dir_attributes = dir_attr;
            }
            _ => {}
        }
        Msg::Reply(x)
    }
}
