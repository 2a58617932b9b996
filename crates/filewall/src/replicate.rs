//! The replication and failover template (§4.4.4, flow coordination): every call
//! is fanned out to each live replica as a copy the policy generates
//! ([`Action::GenerateTo`]), the original is held, and one reply goes back to the
//! client ([`Action::Complete`]) when all, the first or a majority of the replicas
//! asked have answered (the `reply` setting). A replica that does not answer within
//! the policy's timeout is marked dead and gets nothing more (fail-stop, as the seed
//! assumes: bringing it back in sync is done outside FileWall).
//!
//! Replicas hand out different file handles for the same object. The client sees
//! the primary's: the policy keeps, per object, each replica's handle, keyed by the
//! handle the client knows (the *virtual* handle: the primary's handle, or, for an
//! object first named while the primary was dead, the handle of the replica whose
//! reply went to the client). Maps are filled from replies that name objects,
//! matching the replicas' replies to the same call: MNT (the root), LOOKUP, CREATE,
//! MKDIR, SYMLINK, MKNOD (the object) and READDIRPLUS (each entry, by name). So
//! that no client can hold a handle some live replica has no entry for, these calls
//! always wait for every live replica (or its timeout), whatever `reply` says;
//! `first` and `majority` apply to the rest. Each copy's handles are translated to
//! its replica's; MNT and UMNT paths are rewritten from the primary's export to the
//! replica's. A handle the map does not know (issued before a FileWall restart: the
//! maps are soft state) goes unchanged to the primary only; a replica that cannot
//! be sent a call that changes the file system is marked dead, since it would
//! diverge. Replies whose status differs between replicas are counted.
//!
//! Sans-IO: deadlines are checked in [`Policy::on_tick`] against the time given.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::chain::{Action, Policy};
pub use crate::flowstats::ReplicaCounters;
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::handles::{accepted, call_handles, nfs_failure, reply_handles};
use crate::message::{CallArgs, Msg, Procedure, ReplyResults};
use crate::mount::{DirPath, MountCall, MountProc, MountReply, MountRes3, MountStat3};
use crate::nfs3::{NFS3_FHSIZE, Nfs3Proc, Nfs3Reply, NfsRes, NfsStat3};
use crate::temporal::WRITE_CLASS;

/// How long a replica may take to answer before it is marked dead, by default.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);
/// Objects whose handles are mapped, at most (beyond it new objects are not
/// mapped, and calls on them reach the primary only).
pub const MAX_OBJECTS: usize = 1 << 20;
/// Most replicas.
pub const MAX_REPLICAS: usize = 16;

/// When the client gets its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyWhen {
    /// When every live replica asked has answered (the seed's choice).
    All,
    /// As soon as one replica has answered.
    First,
    /// When more than half of the replicas asked have answered.
    Majority,
}

impl ReplyWhen {
    pub const NAMES: [&'static str; 3] = ["all", "first", "majority"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            "first" => Some(Self::First),
            "majority" => Some(Self::Majority),
            _ => None,
        }
    }
}

/// The policy's settings (`kind = "replicate"` in the chain file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicateSettings {
    pub reply: ReplyWhen,
    /// How long a replica may take before it is marked dead.
    pub timeout: Duration,
}

impl Default for ReplicateSettings {
    fn default() -> Self {
        Self {
            reply: ReplyWhen::All,
            timeout: DEFAULT_REPLICA_TIMEOUT,
        }
    }
}

/// Where a handle sits in a reply, to match replicas' replies to one call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Slot {
    /// The one object a MNT, LOOKUP or CREATE-like reply names.
    Object,
    /// A READDIRPLUS entry, by name.
    Entry(Vec<u8>),
}

/// One client call fanned out.
struct Fanout {
    original: Msg,
    asked: Vec<bool>,
    replies: Vec<Option<Msg>>,
    /// Whether the client has its reply.
    answered: bool,
    /// Whether the call names objects (then every live replica is waited for).
    names_objects: bool,
    deadline: Instant,
}

/// The replication policy.
pub struct ReplicatePolicy {
    settings: ReplicateSettings,
    /// Each replica's export path (index 0: the primary's).
    exports: Vec<Option<Vec<u8>>>,
    alive: Vec<bool>,
    /// Virtual handle → each replica's handle.
    objects: HashMap<Vec<u8>, Vec<Option<Vec<u8>>>>,
    /// Per replica: its handle → the virtual handle.
    reverse: Vec<HashMap<Vec<u8>, Vec<u8>>>,
    /// By the original's server XID.
    fanouts: HashMap<u32, Fanout>,
    /// A copy's token (its call's XID field) → (original, replica).
    tokens: HashMap<u32, (u32, usize)>,
    next_token: u32,
    counters: Arc<Mutex<PolicyCounters>>,
}

/// Whether a reply to `p` names objects by handle.
fn names_objects(p: Procedure) -> bool {
    matches!(
        p,
        Procedure::Mount3(MountProc::Mnt)
            | Procedure::Nfs3(
                Nfs3Proc::Lookup
                    | Nfs3Proc::Create
                    | Nfs3Proc::Mkdir
                    | Nfs3Proc::Symlink
                    | Nfs3Proc::Mknod
                    | Nfs3Proc::Readdirplus
            )
    )
}

/// The handles a reply names, by slot.
fn slots(msg: &Msg) -> Vec<(Slot, Vec<u8>)> {
    use Nfs3Reply as R;
    let Msg::Reply(r) = msg else {
        return Vec::new();
    };
    match &r.results {
        Some(ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. }))) => {
            vec![(Slot::Object, fhandle.0.clone())]
        }
        Some(ReplyResults::Nfs3(R::Lookup(NfsRes::Ok(ok)))) => {
            vec![(Slot::Object, ok.object.0.clone())]
        }
        Some(ReplyResults::Nfs3(
            R::Create(NfsRes::Ok(ok))
            | R::Mkdir(NfsRes::Ok(ok))
            | R::Symlink(NfsRes::Ok(ok))
            | R::Mknod(NfsRes::Ok(ok)),
        )) => ok.obj.iter().map(|h| (Slot::Object, h.0.clone())).collect(),
        Some(ReplyResults::Nfs3(R::Readdirplus(NfsRes::Ok(ok)))) => ok
            .reply
            .entries
            .iter()
            .filter_map(|e| {
                e.name_handle
                    .as_ref()
                    .map(|h| (Slot::Entry(e.name.clone()), h.0.clone()))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A reply's status, to notice replicas that disagree (0 for success or no status).
fn status(msg: &Msg) -> u32 {
    match msg {
        Msg::Reply(r) => match &r.results {
            Some(ReplyResults::Nfs3(n)) => n.status().to_u32(),
            Some(ReplyResults::Mount3(MountReply::Mnt(MountRes3::Fail(s)))) => s.to_u32(),
            None => u32::MAX,
            Some(_) => 0,
        },
        _ => u32::MAX - 1,
    }
}

/// The reply a call gets when no replica can answer it (none for MOUNT calls but
/// MNT: the client's retransmission or timeout handles those).
fn no_replica(original: &Msg) -> Option<Msg> {
    let Msg::Call { call, .. } = original else {
        return None;
    };
    let results = match &call.args {
        CallArgs::Nfs3(a) => ReplyResults::Nfs3(nfs_failure(a.procedure(), NfsStat3::Io)),
        CallArgs::Mount3(MountCall::Mnt(_)) => {
            ReplyResults::Mount3(MountReply::Mnt(MountRes3::Fail(MountStat3::ServerFault)))
        }
        _ => return None,
    };
    Some(Msg::Reply(accepted(results)))
}

impl ReplicatePolicy {
    /// A policy over `exports.len()` replicas (index 0 the primary), each with the
    /// path it exports if it differs from the primary's.
    pub fn new(
        settings: ReplicateSettings,
        exports: Vec<Option<Vec<u8>>>,
        counters: Arc<Mutex<PolicyCounters>>,
    ) -> Self {
        let n = exports.len();
        assert!(
            (1..=MAX_REPLICAS).contains(&n),
            "between 1 and {MAX_REPLICAS} replicas"
        );
        lock_counters(&counters).replicas = vec![
            ReplicaCounters {
                alive: true,
                ..ReplicaCounters::default()
            };
            n
        ];
        Self {
            settings,
            exports,
            alive: vec![true; n],
            objects: HashMap::new(),
            reverse: vec![HashMap::new(); n],
            fanouts: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 1,
            counters,
        }
    }

    /// Which replicas are alive.
    pub fn alive(&self) -> &[bool] {
        &self.alive
    }

    fn mark_dead(&mut self, r: usize) {
        if self.alive[r] {
            self.alive[r] = false;
            lock_counters(&self.counters).replicas[r].alive = false;
        }
    }

    /// Replica `r`'s handle for the client's handle `vfh`, if it has one.
    fn to_replica(&self, vfh: &[u8], r: usize) -> Option<Vec<u8>> {
        match self.objects.get(vfh) {
            Some(per) => per[r].clone(),
            None if r == 0 => Some(vfh.to_vec()),
            None => None,
        }
    }

    /// The copy of `original` for replica `r`, or `None` if a handle has no mapping.
    fn copy_for(&self, original: &Msg, r: usize, token: u32) -> Option<Msg> {
        let mut copy = original.clone();
        let Msg::Call { call, .. } = &mut copy else {
            return None;
        };
        call.xid = token;
        match &mut call.args {
            CallArgs::Nfs3(args) => {
                let mapped = call_handles(args, &mut |h| match self.to_replica(&h.0, r) {
                    Some(fh) => {
                        h.0 = fh;
                        true
                    }
                    None => false,
                });
                if !mapped {
                    return None;
                }
            }
            CallArgs::Mount3(MountCall::Mnt(path) | MountCall::Umnt(path)) => {
                self.rewrite_export(path, r);
            }
            _ => {}
        }
        Some(copy)
    }

    /// Rewrites a MNT/UMNT path under the primary's export to replica `r`'s.
    fn rewrite_export(&self, path: &mut DirPath, r: usize) {
        if let (Some(Some(primary)), Some(Some(mine))) = (self.exports.first(), self.exports.get(r))
            && let Some(rest) = path.0.strip_prefix(primary.as_slice())
            && (rest.is_empty() || rest[0] == b'/')
        {
            let mut p = mine.clone();
            p.extend_from_slice(rest);
            path.0 = p;
        }
    }

    fn fan_out(&mut self, xid: u32, original: Msg, out: &mut Vec<Action<Msg>>) {
        let Msg::Call { call, .. } = &original else {
            out.push(Action::Forward(original));
            return;
        };
        let procedure = call.args.procedure();
        let changes = matches!(procedure, Procedure::Nfs3(p) if WRITE_CLASS.contains(&p));
        let n = self.alive.len();
        let mut asked = vec![false; n];
        for (r, asked_r) in asked.iter_mut().enumerate() {
            if !self.alive[r] {
                continue;
            }
            let token = self.next_token;
            self.next_token = self.next_token.wrapping_add(1).max(1);
            match self.copy_for(&original, r, token) {
                Some(copy) => {
                    self.tokens.insert(token, (xid, r));
                    *asked_r = true;
                    lock_counters(&self.counters).replicas[r].sent += 1;
                    out.push(Action::GenerateTo {
                        server: r,
                        msg: copy,
                    });
                }
                None => {
                    lock_counters(&self.counters).replicas[r].unmapped += 1;
                    if changes {
                        self.mark_dead(r);
                    }
                }
            }
        }
        if !asked.contains(&true) {
            // Without an answer (a MOUNT call but MNT), the client retransmits.
            if let Some(reply) = no_replica(&original) {
                out.push(Action::Respond(reply));
            }
            return;
        }
        self.fanouts.insert(
            xid,
            Fanout {
                original,
                asked,
                replies: vec![None; n],
                answered: false,
                names_objects: names_objects(procedure),
                deadline: Instant::now() + self.settings.timeout,
            },
        );
    }

    /// Answers the client and forgets the fan-out when their time has come.
    fn settle(&mut self, xid: u32, out: &mut Vec<Action<Msg>>) {
        let Some(f) = self.fanouts.get(&xid) else {
            return;
        };
        let n = self.alive.len();
        let waiting = (0..n)
            .filter(|&r| f.asked[r] && self.alive[r] && f.replies[r].is_none())
            .count();
        let got = f.replies.iter().filter(|r| r.is_some()).count();
        let asked = f.asked.iter().filter(|&&a| a).count();
        let enough = waiting == 0
            || (!f.names_objects
                && match self.settings.reply {
                    ReplyWhen::All => false,
                    ReplyWhen::First => got >= 1,
                    ReplyWhen::Majority => 2 * got > asked,
                });
        if !f.answered && enough {
            let response = match (0..n).find(|&r| f.replies[r].is_some()) {
                Some(k) => Some(self.answer_from(xid, k)),
                None => no_replica(&f.original),
            };
            if let Some(f) = self.fanouts.get_mut(&xid) {
                f.answered = true;
            }
            if let Some(response) = response {
                out.push(Action::Complete { xid, response });
            }
        }
        if waiting == 0
            && let Some(f) = self.fanouts.remove(&xid)
        {
            let mut statuses = f.replies.iter().flatten().map(status);
            if let Some(first) = statuses.next()
                && statuses.any(|s| s != first)
            {
                lock_counters(&self.counters).replica_divergences += 1;
            }
        }
    }

    /// The reply to send from replica `k`, its handles mapped to virtual ones after
    /// learning every replica's handles for the objects it names.
    fn answer_from(&mut self, xid: u32, k: usize) -> Msg {
        let Some(f) = self.fanouts.get(&xid) else {
            return Msg::RawReply(Vec::new());
        };
        let mut chosen = f.replies[k].clone().unwrap_or(Msg::RawReply(Vec::new()));
        if !f.names_objects {
            return chosen;
        }
        let others: Vec<(usize, HashMap<Slot, Vec<u8>>)> = (0..self.alive.len())
            .filter(|&j| j != k && self.alive[j])
            .filter_map(|j| {
                f.replies[j]
                    .as_ref()
                    .map(|m| (j, slots(m).into_iter().collect()))
            })
            .collect();
        for (slot, h_k) in slots(&chosen) {
            let Some(vfh) = self.virtual_for(k, &h_k) else {
                continue;
            };
            for (j, theirs) in &others {
                if let Some(h_j) = theirs.get(&slot) {
                    self.learn(&vfh, *j, h_j.clone());
                }
            }
        }
        if let Msg::Reply(r) = &mut chosen
            && let Some(results) = &mut r.results
        {
            let reverse = &self.reverse[k];
            reply_handles(results, &mut |h| {
                if let Some(v) = reverse.get(&h.0) {
                    h.0.clone_from(v);
                }
                true
            });
        }
        chosen
    }

    /// The virtual handle of replica `k`'s handle `h`, made if it is new.
    fn virtual_for(&mut self, k: usize, h: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.reverse[k].get(h) {
            return Some(v.clone());
        }
        if self.objects.len() >= MAX_OBJECTS {
            return None;
        }
        let mut vfh = h.to_vec();
        if self
            .objects
            .get(&vfh)
            .is_some_and(|per| per[k].as_deref() != Some(h))
        {
            // Another object already goes by this handle (a replica's handle equal
            // to one the primary issued): tell them apart.
            vfh.extend_from_slice(&[0xff, k as u8]);
            if vfh.len() > NFS3_FHSIZE || self.objects.contains_key(&vfh) {
                return None;
            }
        }
        self.learn(&vfh, k, h.to_vec());
        Some(vfh)
    }

    fn learn(&mut self, vfh: &[u8], r: usize, h: Vec<u8>) {
        let n = self.alive.len();
        let per = self
            .objects
            .entry(vfh.to_vec())
            .or_insert_with(|| vec![None; n]);
        if let Some(old) = per[r].replace(h.clone())
            && old != h
        {
            self.reverse[r].remove(&old);
        }
        self.reverse[r].insert(h, vfh.to_vec());
    }
}

impl Policy<Msg> for ReplicatePolicy {
    fn name(&self) -> &str {
        "replicate"
    }

    fn on_request(&mut self, xid: u32, request: Msg, out: &mut Vec<Action<Msg>>) {
        self.fan_out(xid, request, out);
    }

    fn on_response(&mut self, _xid: u32, request: &Msg, response: Msg, out: &mut Vec<Action<Msg>>) {
        let Msg::Call { call, .. } = request else {
            return;
        };
        let Some((original, r)) = self.tokens.remove(&call.xid) else {
            return; // a copy whose fan-out is over: consumed
        };
        if !self.alive[r] {
            return; // dead replicas stay dead
        }
        lock_counters(&self.counters).replicas[r].replied += 1;
        if let Some(f) = self.fanouts.get_mut(&original) {
            f.replies[r] = Some(response);
            self.settle(original, out);
        }
    }

    fn on_tick(&mut self, now: Instant, out: &mut Vec<Action<Msg>>) {
        let late: Vec<u32> = self
            .fanouts
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(&x, _)| x)
            .collect();
        for xid in &late {
            let Some(f) = self.fanouts.get(xid) else {
                continue;
            };
            let silent: Vec<usize> = (0..self.alive.len())
                .filter(|&r| f.asked[r] && f.replies[r].is_none() && self.alive[r])
                .collect();
            for r in silent {
                lock_counters(&self.counters).replicas[r].timed_out += 1;
                self.mark_dead(r);
            }
        }
        if late.is_empty() {
            return;
        }
        // A death may complete fan-outs that were only waiting for that replica.
        let all: Vec<u32> = self.fanouts.keys().copied().collect();
        for xid in all {
            self.settle(xid, out);
        }
        let fanouts = &self.fanouts;
        self.tokens.retain(|_, (x, _)| fanouts.contains_key(x));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Call, Reply};
    use crate::nfs3::{DirOpArgs3, LookupOk, Nfs3Call, NfsFh3, ReadArgs};
    use crate::rpc::Auth;

    fn call(args: CallArgs) -> Msg {
        Msg::Call {
            flow: 1,
            peer: std::net::Ipv4Addr::LOCALHOST.into(),
            call: Call {
                xid: 9,
                cred: Auth::None,
                verf: Auth::None,
                args,
            },
        }
    }

    fn reply(results: ReplyResults) -> Msg {
        Msg::Reply(accepted(results))
    }

    fn mnt_ok(h: &[u8]) -> Msg {
        reply(ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok {
            fhandle: NfsFh3(h.to_vec()),
            auth_flavors: vec![1],
        })))
    }

    fn lookup_ok(h: &[u8]) -> Msg {
        reply(ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Ok(
            LookupOk {
                object: NfsFh3(h.to_vec()),
                obj_attributes: None,
                dir_attributes: None,
            },
        ))))
    }

    fn policy(n: usize, reply: ReplyWhen) -> (ReplicatePolicy, Arc<Mutex<PolicyCounters>>) {
        let counters = Arc::<Mutex<PolicyCounters>>::default();
        let mut exports = vec![Some(b"/srv/a".to_vec())];
        exports.extend((1..n).map(|i| Some(format!("/srv/r{i}").into_bytes())));
        let settings = ReplicateSettings {
            reply,
            timeout: Duration::from_millis(100),
        };
        (
            ReplicatePolicy::new(settings, exports, counters.clone()),
            counters,
        )
    }

    /// Sends `msg` as original `xid`; returns the copies (replica, copy).
    fn fan(p: &mut ReplicatePolicy, xid: u32, msg: Msg) -> Vec<(usize, Msg)> {
        let mut out = Vec::new();
        p.on_request(xid, msg, &mut out);
        out.into_iter()
            .map(|a| match a {
                Action::GenerateTo { server, msg } => (server, msg),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn answer(p: &mut ReplicatePolicy, copy: &Msg, response: Msg) -> Vec<Action<Msg>> {
        let mut out = Vec::new();
        p.on_response(0, copy, response, &mut out);
        out
    }

    fn args_of(m: &Msg) -> &CallArgs {
        match m {
            Msg::Call { call, .. } => &call.args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn handles_are_mapped_per_replica_and_paths_rewritten() {
        let (mut p, _) = policy(2, ReplyWhen::All);
        let copies = fan(
            &mut p,
            1,
            call(CallArgs::Mount3(MountCall::Mnt(DirPath(
                b"/srv/a".to_vec(),
            )))),
        );
        assert_eq!(copies.len(), 2);
        assert_eq!(
            args_of(&copies[1].1),
            &CallArgs::Mount3(MountCall::Mnt(DirPath(b"/srv/r1".to_vec())))
        );
        assert!(
            answer(&mut p, &copies[1].1, mnt_ok(b"root-B")).is_empty(),
            "waits for all"
        );
        let out = answer(&mut p, &copies[0].1, mnt_ok(b"root-A"));
        assert_eq!(
            out,
            vec![Action::Complete {
                xid: 1,
                response: mnt_ok(b"root-A")
            }]
        );
        // A LOOKUP in the root goes to each replica with its own root handle.
        let lookup = call(CallArgs::Nfs3(Nfs3Call::Lookup(DirOpArgs3 {
            dir: NfsFh3(b"root-A".to_vec()),
            name: b"f".to_vec(),
        })));
        let copies = fan(&mut p, 2, lookup);
        let dirs: Vec<_> = copies
            .iter()
            .map(|(_, m)| match args_of(m) {
                CallArgs::Nfs3(Nfs3Call::Lookup(a)) => a.dir.0.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(dirs, vec![b"root-A".to_vec(), b"root-B".to_vec()]);
        answer(&mut p, &copies[0].1, lookup_ok(b"f-A"));
        let out = answer(&mut p, &copies[1].1, lookup_ok(b"f-B"));
        assert_eq!(
            out,
            vec![Action::Complete {
                xid: 2,
                response: lookup_ok(b"f-A")
            }]
        );
        assert_eq!(p.to_replica(b"f-A", 1), Some(b"f-B".to_vec()));
    }

    #[test]
    fn first_and_majority_answer_early_and_a_silent_replica_dies() {
        let (mut p, counters) = policy(3, ReplyWhen::Majority);
        let read = call(CallArgs::Nfs3(Nfs3Call::Read(ReadArgs {
            file: NfsFh3(b"x".to_vec()),
            offset: 0,
            count: 1,
        })));
        // Unknown handles reach the primary only; replicas 1 and 2 are skipped.
        let copies = fan(&mut p, 1, read);
        assert_eq!(copies.len(), 1);
        assert_eq!(counters.lock().unwrap().replicas[1].unmapped, 1);
        assert!(p.alive().iter().all(|&a| a), "a read does not kill");

        let (mut p, counters) = policy(3, ReplyWhen::Majority);
        let null = call(CallArgs::Nfs3(Nfs3Call::Null(())));
        let copies = fan(&mut p, 7, null);
        assert_eq!(copies.len(), 3);
        let ok = reply(ReplyResults::Nfs3(Nfs3Reply::Null(())));
        assert!(answer(&mut p, &copies[2].1, ok.clone()).is_empty());
        let out = answer(&mut p, &copies[0].1, ok.clone());
        assert_eq!(
            out,
            vec![Action::Complete {
                xid: 7,
                response: ok.clone()
            }]
        );
        // Replica 1 never answers: marked dead at the deadline.
        let mut out = Vec::new();
        p.on_tick(Instant::now() + Duration::from_secs(1), &mut out);
        assert!(out.is_empty(), "already answered: {out:?}");
        assert_eq!(p.alive(), &[true, false, true]);
        let c = counters.lock().unwrap();
        assert_eq!((c.replicas[1].timed_out, c.replicas[1].alive), (1, false));
        drop(c);
        assert_eq!(
            fan(&mut p, 8, call(CallArgs::Nfs3(Nfs3Call::Null(())))).len(),
            2
        );
    }

    #[test]
    fn all_waits_then_completes_when_the_laggard_dies() {
        let (mut p, _) = policy(2, ReplyWhen::All);
        let copies = fan(&mut p, 3, call(CallArgs::Nfs3(Nfs3Call::Null(()))));
        let ok = reply(ReplyResults::Nfs3(Nfs3Reply::Null(())));
        assert!(answer(&mut p, &copies[1].1, ok.clone()).is_empty());
        let mut out = Vec::new();
        p.on_tick(Instant::now() + Duration::from_secs(1), &mut out);
        assert_eq!(
            out,
            vec![Action::Complete {
                xid: 3,
                response: ok
            }]
        );
        assert_eq!(p.alive(), &[false, true]);
        // With every replica dead, an NFS call is answered NFS3ERR_IO at once.
        let copies = fan(&mut p, 4, call(CallArgs::Nfs3(Nfs3Call::Null(()))));
        assert_eq!(copies.len(), 1);
        let mut out = Vec::new();
        p.on_tick(Instant::now() + Duration::from_secs(5), &mut out);
        let mut out = Vec::new();
        p.on_request(5, call(CallArgs::Nfs3(Nfs3Call::Null(()))), &mut out);
        assert!(
            matches!(&out[..], [Action::Respond(Msg::Reply(Reply { .. }))]),
            "{out:?}"
        );
    }
}
