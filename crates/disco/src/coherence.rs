//! The coherence engine of one endpoint: Ivy's fixed distributed manager with
//! MOESI copies (see [`Moesi`]), extended as §5.1 says — asynchronous
//! releases and manager changes (`VNODECHMAN`) — over generic objects.
//!
//! Roles per object: the **manager** (a directory: it always knows the owner,
//! holds the lock and the queue), the **owner** (the endpoint that last got
//! write access: it keeps the copyset and serves requests) and **sharers**.
//!
//! ```text
//! read  fault at R:  R ─REQUEST→ manager ─FORWARD→ owner ─GRANT(data)→ R ─CONFIRM→ manager
//! write fault at W:  W ─REQUEST→ manager (owner := W at once) ─FORWARD→ old owner
//!                    ─GRANT(data, copyset)→ W ─INVALIDATE→ sharers ─INV_ACK→ W ─CONFIRM→ manager
//! sharer release:    S ─RELEASE(grant)→ manager ─→ owner drops S if that grant is still listed
//! owner release:     O ─RELEASE→ manager (locks) ─RELEASE_ACK→ O ─RELEASE_DATA→ manager owns
//! manager change:    M ─VNODECHMAN→ every open endpoint (the new one gets owner, queue,
//!                    and ownership if M owned) ─ACK→ M; M forwards what still reaches it
//! ```
//!
//! The rules that make the races of §5.1.1 safe: every copy has a grant
//! number, and an owner drops a sharer from its copyset only for the grant
//! the release names (a release that crossed an invalidation, or was
//! overtaken by a new grant, is dropped); a request says which grant the
//! requester still holds, so data is skipped only when it holds the current
//! one; an owner's release is acknowledged under the manager's lock, so no
//! request can reach the old owner after it has sent its state; a release
//! from an endpoint the manager no longer records as owner is dropped (the
//! write request in flight to it releases implicitly). Correctness needs
//! FIFO delivery between each pair of endpoints, as the seed's does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::msg::{Msg, Ownership, Queued, QueuedKind};
use crate::types::{Access, Endpoint, Moesi, ObjectId};

/// A message this endpoint cannot accept; its state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{from}: `{kind}` for {obj}, which this endpoint does not know")]
    UnknownObject {
        from: Endpoint,
        kind: &'static str,
        obj: ObjectId,
    },
    #[error("{from}: `{kind}` for {obj} does not fit: {why}")]
    Unexpected {
        from: Endpoint,
        kind: &'static str,
        obj: ObjectId,
        why: &'static str,
    },
    #[error("{obj}: {why}")]
    Local { obj: ObjectId, why: &'static str },
}

/// What happened that the endpoint's user cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An `access()` that returned false may now be retried: it is allowed.
    Granted { obj: ObjectId, access: Access },
    /// This endpoint learnt a new manager for `obj`.
    ManagerChanged { obj: ObjectId, manager: Endpoint },
    /// A manager change this endpoint started is complete (every open
    /// endpoint acknowledged): it no longer receives requests for `obj`.
    ChmanDone { obj: ObjectId },
}

/// What the manager's lock is held for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    Request(Endpoint),
    OwnerRelease(Endpoint),
}

#[derive(Debug, Clone)]
struct ManagerSide {
    owner: Endpoint,
    lock: Option<Lock>,
    queue: VecDeque<Queued>,
    /// A manager change waiting for the lock: the new manager, and whether
    /// this endpoint leaves (drops its copy) or stays as a sharer.
    chman: Option<(Endpoint, bool)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Invalidation for a write this endpoint was granted: confirm when done.
    Confirm,
}

/// One endpoint's view of one object.
#[derive(Debug, Clone)]
struct Object {
    manager: Endpoint,
    open: BTreeSet<Endpoint>,
    valid: bool,
    owner: bool,
    writable: bool,
    dirty: bool,
    data: Vec<u8>,
    /// The grant number of this endpoint's read copy.
    grant: u64,
    copyset: BTreeMap<Endpoint, u64>,
    next_grant: u64,
    invalidating: BTreeSet<Endpoint>,
    after: Option<After>,
    want: Option<Access>,
    requested: bool,
    releasing: bool,
    mgr: Option<ManagerSide>,
    /// Acknowledgements awaited, per manager change this endpoint started.
    chman_acks: BTreeMap<u64, BTreeSet<Endpoint>>,
    /// Manager changes seen.
    epoch: u64,
}

impl Object {
    fn state(&self) -> Moesi {
        match (self.valid, self.owner, self.writable, self.dirty) {
            (false, _, _, _) => Moesi::I,
            (true, true, true, true) => Moesi::M,
            (true, true, true, false) => Moesi::E,
            (true, true, false, true) => Moesi::O,
            _ => Moesi::S,
        }
    }

    fn allows(&self, a: Access) -> bool {
        match a {
            Access::Read => self.valid,
            Access::Write => self.writable,
        }
    }

    fn drop_copy(&mut self) {
        self.valid = false;
        self.owner = false;
        self.writable = false;
        self.dirty = false;
        self.data = Vec::new();
        self.copyset.clear();
    }
}

/// The coherence engine of one endpoint. Drive it with [`Engine::handle`]
/// for each message received, in order per sender; take what it sends with
/// [`Engine::take_output`] and what happened with [`Engine::take_events`].
#[derive(Debug)]
pub struct Engine {
    me: Endpoint,
    objects: BTreeMap<ObjectId, Object>,
    out: Vec<(Endpoint, Msg)>,
    local: VecDeque<Msg>,
    events: Vec<Event>,
}

impl Engine {
    /// The engine of endpoint `me`, knowing no object yet.
    #[must_use]
    pub fn new(me: Endpoint) -> Self {
        Engine {
            me,
            objects: BTreeMap::new(),
            out: Vec::new(),
            local: VecDeque::new(),
            events: Vec::new(),
        }
    }

    /// This endpoint.
    #[must_use]
    pub fn me(&self) -> Endpoint {
        self.me
    }

    /// Makes `obj` known, managed by `manager`, open on `open`. On the
    /// manager, `data` is its initial contents (the manager owns it, E);
    /// elsewhere the copy starts invalid.
    pub fn create(&mut self, obj: ObjectId, manager: Endpoint, open: &[Endpoint], data: Vec<u8>) {
        let home = manager == self.me;
        let mut set: BTreeSet<Endpoint> = open.iter().copied().collect();
        set.insert(manager);
        set.insert(self.me);
        self.objects.insert(
            obj,
            Object {
                manager,
                open: set,
                valid: home,
                owner: home,
                writable: home,
                dirty: false,
                data: if home { data } else { Vec::new() },
                grant: 0,
                copyset: BTreeMap::new(),
                next_grant: 1,
                invalidating: BTreeSet::new(),
                after: None,
                want: None,
                requested: false,
                releasing: false,
                mgr: home.then(|| ManagerSide {
                    owner: manager,
                    lock: None,
                    queue: VecDeque::new(),
                    chman: None,
                }),
                chman_acks: BTreeMap::new(),
                epoch: 0,
            },
        );
    }

    /// Whether `obj` is known here.
    #[must_use]
    pub fn knows(&self, obj: ObjectId) -> bool {
        self.objects.contains_key(&obj)
    }

    fn obj(&self, obj: ObjectId) -> Result<&Object, Error> {
        self.objects.get(&obj).ok_or(Error::Local {
            obj,
            why: "unknown object",
        })
    }

    fn obj_mut(&mut self, obj: ObjectId) -> Result<&mut Object, Error> {
        self.objects.get_mut(&obj).ok_or(Error::Local {
            obj,
            why: "unknown object",
        })
    }

    /// This endpoint's MOESI state for `obj` (I when unknown).
    #[must_use]
    pub fn state(&self, obj: ObjectId) -> Moesi {
        self.objects.get(&obj).map_or(Moesi::I, Object::state)
    }

    /// The manager this endpoint knows for `obj`.
    #[must_use]
    pub fn manager(&self, obj: ObjectId) -> Option<Endpoint> {
        self.objects.get(&obj).map(|o| o.manager)
    }

    /// Whether this endpoint manages `obj`.
    #[must_use]
    pub fn is_manager(&self, obj: ObjectId) -> bool {
        self.objects.get(&obj).is_some_and(|o| o.mgr.is_some())
    }

    /// Whether this endpoint owns `obj`.
    #[must_use]
    pub fn is_owner(&self, obj: ObjectId) -> bool {
        self.objects.get(&obj).is_some_and(|o| o.owner)
    }

    /// On the manager: the owner it records.
    #[must_use]
    pub fn recorded_owner(&self, obj: ObjectId) -> Option<Endpoint> {
        self.objects.get(&obj)?.mgr.as_ref().map(|m| m.owner)
    }

    /// On the owner: the sharers it records.
    #[must_use]
    pub fn copyset(&self, obj: ObjectId) -> Vec<Endpoint> {
        self.objects
            .get(&obj)
            .map(|o| o.copyset.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether an access is outstanding here.
    #[must_use]
    pub fn pending(&self, obj: ObjectId) -> Option<Access> {
        self.objects.get(&obj).and_then(|o| o.want)
    }

    /// Whether this endpoint's copy is dirty (differs from the backing store).
    #[must_use]
    pub fn is_dirty(&self, obj: ObjectId) -> bool {
        self.objects.get(&obj).is_some_and(|o| o.valid && o.dirty)
    }

    /// The endpoints `obj` is open on, as this endpoint knows them.
    #[must_use]
    pub fn open_list(&self, obj: ObjectId) -> Vec<Endpoint> {
        self.objects
            .get(&obj)
            .map(|o| o.open.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The data of a valid copy.
    #[must_use]
    pub fn read(&self, obj: ObjectId) -> Option<&[u8]> {
        let o = self.objects.get(&obj)?;
        o.valid.then_some(o.data.as_slice())
    }

    /// Replaces the data of a writable copy (it becomes dirty).
    pub fn write(&mut self, obj: ObjectId, data: Vec<u8>) -> Result<(), Error> {
        let o = self.obj_mut(obj)?;
        if !o.writable {
            return Err(Error::Local {
                obj,
                why: "write without write access",
            });
        }
        o.data = data;
        o.dirty = true;
        Ok(())
    }

    /// Marks a copy clean: its data reached the backing store.
    pub fn mark_clean(&mut self, obj: ObjectId) -> Result<(), Error> {
        self.obj_mut(obj)?.dirty = false;
        Ok(())
    }

    /// Messages to send: (destination, message), in order.
    pub fn take_output(&mut self) -> Vec<(Endpoint, Msg)> {
        std::mem::take(&mut self.out)
    }

    /// What happened since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    fn send(&mut self, to: Endpoint, msg: Msg) {
        if to == self.me {
            self.local.push_back(msg);
        } else {
            self.out.push((to, msg));
        }
    }

    /// `access()` of §5: true if `access` is allowed now; otherwise starts
    /// acquiring it and returns false ([`Event::Granted`] says when to retry).
    pub fn access(&mut self, obj: ObjectId, access: Access) -> Result<bool, Error> {
        let me = self.me;
        let o = self.obj_mut(obj)?;
        if o.allows(access) {
            return Ok(true);
        }
        if o.want == Some(Access::Write) || o.want == Some(access) {
            return Ok(false);
        }
        o.want = Some(access);
        if o.releasing || o.requested {
            return Ok(false); // asked once the release or the request in flight ends
        }
        self.request(obj, me)?;
        self.drain()?;
        Ok(false)
    }

    fn request(&mut self, obj: ObjectId, me: Endpoint) -> Result<(), Error> {
        let o = self.obj_mut(obj)?;
        let Some(access) = o.want else {
            return Ok(());
        };
        if o.requested {
            return Ok(());
        }
        o.requested = true;
        let to = o.manager;
        let have = (o.valid && !o.owner).then_some(o.grant);
        self.send(
            to,
            Msg::Request {
                obj,
                from: me,
                access,
                have,
            },
        );
        Ok(())
    }

    /// `release()` of §5: gives the resource back to its manager; on the
    /// manager, with other endpoints holding it open, starts a manager change.
    pub fn release(&mut self, obj: ObjectId) -> Result<(), Error> {
        let me = self.me;
        let o = self.obj(obj)?;
        if o.mgr.is_some() {
            let next = o
                .open
                .iter()
                .copied()
                .find(|e| *e != me && o.copyset.contains_key(e))
                .or_else(|| o.open.iter().copied().find(|e| *e != me));
            if o.requested || o.want.is_some() {
                return Err(Error::Local {
                    obj,
                    why: "release while an access is in flight",
                });
            }
            if let Some(new) = next {
                self.move_manager(obj, new, true)?;
            }
            return Ok(());
        }
        let o = self.obj_mut(obj)?;
        if o.requested || o.releasing || o.after.is_some() {
            return Err(Error::Local {
                obj,
                why: "release while an access is in flight",
            });
        }
        let to = o.manager;
        if o.owner {
            o.releasing = true;
            self.send(
                to,
                Msg::Release {
                    obj,
                    from: me,
                    grant: 0,
                    owner: true,
                },
            );
        } else if o.valid {
            let grant = o.grant;
            o.drop_copy();
            self.send(
                to,
                Msg::Release {
                    obj,
                    from: me,
                    grant,
                    owner: false,
                },
            );
        }
        self.drain()
    }

    /// Starts moving the manager role for `obj` to `new` (§5.1.2); deferred
    /// until the manager's lock is free. This endpoint keeps a read copy.
    pub fn change_manager(&mut self, obj: ObjectId, new: Endpoint) -> Result<(), Error> {
        self.move_manager(obj, new, false)
    }

    fn move_manager(&mut self, obj: ObjectId, new: Endpoint, leaving: bool) -> Result<(), Error> {
        let me = self.me;
        let o = self.obj_mut(obj)?;
        if new == me || !o.open.contains(&new) {
            return Err(Error::Local {
                obj,
                why: "the new manager must be another endpoint with the object open",
            });
        }
        let Some(m) = o.mgr.as_mut() else {
            return Err(Error::Local {
                obj,
                why: "only the manager may start a manager change",
            });
        };
        m.chman = Some((new, leaving));
        self.pump(obj)?;
        self.drain()
    }

    /// Handles one message from `from`.
    pub fn handle(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        self.dispatch(from, msg)?;
        self.drain()
    }

    fn drain(&mut self) -> Result<(), Error> {
        let me = self.me;
        while let Some(m) = self.local.pop_front() {
            self.dispatch(me, m)?;
        }
        Ok(())
    }

    fn unexpected(from: Endpoint, msg: &Msg, why: &'static str) -> Error {
        Error::Unexpected {
            from,
            kind: msg.kind(),
            obj: msg.object().unwrap_or(ObjectId(0)),
            why,
        }
    }

    fn dispatch(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Some(obj) = msg.object() else {
            return Err(Self::unexpected(from, &msg, "not a coherence message"));
        };
        if !self.objects.contains_key(&obj) {
            return Err(Error::UnknownObject {
                from,
                kind: msg.kind(),
                obj,
            });
        }
        match msg {
            Msg::Request {
                from: r,
                access,
                have,
                ..
            } => self.on_request(obj, r, access, have),
            Msg::Forward { .. } => self.on_forward(from, msg),
            Msg::Grant { .. } => self.on_grant(from, msg),
            Msg::Confirm { from: r, .. } => self.on_confirm(from, obj, r),
            Msg::Invalidate { from: w, .. } => self.on_invalidate(obj, w),
            Msg::InvAck { .. } => self.on_inv_ack(from, msg),
            Msg::Release { .. } => self.on_release(from, msg),
            Msg::ReleaseAck { .. } => self.on_release_ack(from, msg),
            Msg::ReleaseData { .. } => self.on_release_data(from, msg),
            Msg::Vnodechman { .. } => self.on_chman(from, msg),
            Msg::Ack { .. } => self.on_ack(from, msg),
            other => Err(Self::unexpected(from, &other, "not a coherence message")),
        }
    }

    /// A message for the manager reached an endpoint that is not it: chase.
    fn chase(&mut self, obj: ObjectId, msg: Msg) -> Result<(), Error> {
        let to = self.obj(obj)?.manager;
        if to == self.me {
            return Err(Error::Local {
                obj,
                why: "knows itself as manager without the manager's state",
            });
        }
        self.send(to, msg);
        Ok(())
    }

    fn on_request(
        &mut self,
        obj: ObjectId,
        from: Endpoint,
        access: Access,
        have: Option<u64>,
    ) -> Result<(), Error> {
        let o = self.obj_mut(obj)?;
        o.open.insert(from);
        let Some(m) = o.mgr.as_mut() else {
            let msg = Msg::Request {
                obj,
                from,
                access,
                have,
            };
            return self.chase(obj, msg);
        };
        m.queue.push_back(Queued {
            from,
            kind: QueuedKind::Request(access),
            have,
        });
        self.pump(obj)
    }

    /// On the manager: serve queued entries while the lock is free, then a
    /// pending manager change.
    fn pump(&mut self, obj: ObjectId) -> Result<(), Error> {
        loop {
            let o = self.obj_mut(obj)?;
            let Some(m) = o.mgr.as_mut() else {
                return Ok(());
            };
            if m.lock.is_some() {
                return Ok(());
            }
            let Some(q) = m.queue.pop_front() else {
                if let Some((new, leaving)) = m.chman.take() {
                    return self.start_chman(obj, new, leaving);
                }
                return Ok(());
            };
            match q.kind {
                QueuedKind::Request(access) => {
                    let target = m.owner;
                    m.lock = Some(Lock::Request(q.from));
                    if access == Access::Write {
                        m.owner = q.from;
                    }
                    let (from, have) = (q.from, q.have);
                    self.send(
                        target,
                        Msg::Forward {
                            obj,
                            from,
                            access,
                            have,
                        },
                    );
                }
                QueuedKind::SharerRelease { grant } => {
                    let owner = m.owner;
                    let from = q.from;
                    self.send(
                        owner,
                        Msg::Release {
                            obj,
                            from,
                            grant,
                            owner: false,
                        },
                    );
                }
                QueuedKind::OwnerRelease => {
                    // An old owner's release that crossed a new owner's
                    // request is dropped: that request releases it.
                    if m.owner == q.from {
                        m.lock = Some(Lock::OwnerRelease(q.from));
                        self.send(q.from, Msg::ReleaseAck { obj });
                    }
                }
            }
        }
    }

    fn on_forward(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::Forward {
            obj,
            from: r,
            access,
            have,
        } = msg
        else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj(obj)?;
        if !o.owner || o.after.is_some() {
            return Err(Self::unexpected(
                from,
                &msg,
                "this endpoint does not own it",
            ));
        }
        let to = o.manager;
        match (access, r == me) {
            (Access::Read, true) => {
                // It became the owner while its read request travelled.
                self.send(to, Msg::Confirm { obj, from: me });
                let o = self.obj_mut(obj)?;
                o.requested = false;
                if o.want.take() == Some(Access::Write) {
                    o.want = Some(Access::Write);
                    self.request(obj, me)?;
                }
                self.events.push(Event::Granted { obj, access });
            }
            (Access::Read, false) => {
                let o = self.obj_mut(obj)?;
                let grant = o.next_grant;
                o.next_grant += 1;
                o.copyset.insert(r, grant);
                o.writable = false;
                let g = Msg::Grant {
                    obj,
                    access,
                    data: Some(o.data.clone()),
                    dirty: o.dirty,
                    grant,
                    copyset: Vec::new(),
                    next_grant: 0,
                };
                self.send(r, g);
            }
            (Access::Write, true) => {
                let o = self.obj_mut(obj)?;
                o.copyset.remove(&me);
                o.invalidating = o.copyset.keys().copied().collect();
                o.copyset.clear();
                o.after = Some(After::Confirm);
                self.invalidate_all(obj)?;
            }
            (Access::Write, false) => self.hand_over(obj, r, have)?,
        }
        Ok(())
    }

    /// The owner gives write access (and ownership) to `r`.
    fn hand_over(&mut self, obj: ObjectId, r: Endpoint, have: Option<u64>) -> Result<(), Error> {
        let o = self.obj_mut(obj)?;
        // Data is skipped only for the very copy the requester says it holds.
        let has_current = have.is_some() && o.copyset.get(&r) == have.as_ref();
        o.copyset.remove(&r);
        let g = Msg::Grant {
            obj,
            access: Access::Write,
            data: (!has_current).then(|| o.data.clone()),
            dirty: o.dirty,
            grant: 0,
            copyset: o.copyset.iter().map(|(e, g)| (*e, *g)).collect(),
            next_grant: o.next_grant,
        };
        let implicit_release = o.releasing;
        o.drop_copy();
        o.releasing = false;
        self.send(r, g);
        if implicit_release {
            let me = self.me;
            self.request(obj, me)?;
        }
        Ok(())
    }

    fn invalidate_all(&mut self, obj: ObjectId) -> Result<(), Error> {
        let me = self.me;
        let targets: Vec<Endpoint> = self.obj(obj)?.invalidating.iter().copied().collect();
        if targets.is_empty() {
            return self.finish_write(obj);
        }
        for t in targets {
            self.send(t, Msg::Invalidate { obj, from: me });
        }
        Ok(())
    }

    fn finish_write(&mut self, obj: ObjectId) -> Result<(), Error> {
        let me = self.me;
        let o = self.obj_mut(obj)?;
        o.after = None;
        o.valid = true;
        o.owner = true;
        o.writable = true;
        o.requested = false;
        let wanted = o.want.take();
        let to = o.manager;
        self.send(to, Msg::Confirm { obj, from: me });
        if wanted.is_some() {
            self.events.push(Event::Granted {
                obj,
                access: Access::Write,
            });
        }
        Ok(())
    }

    fn on_grant(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::Grant {
            obj,
            access,
            ref data,
            dirty,
            grant,
            ref copyset,
            next_grant,
        } = msg
        else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj(obj)?;
        if !o.requested || o.want.is_none() || o.after.is_some() {
            return Err(Self::unexpected(from, &msg, "nothing was requested"));
        }
        if data.is_none() && !o.valid {
            return Err(Self::unexpected(
                from,
                &msg,
                "no data and no current copy here",
            ));
        }
        let o = self.obj_mut(obj)?;
        if let Some(d) = data {
            o.data.clone_from(d);
        }
        o.valid = true;
        if access == Access::Read {
            o.grant = grant;
            o.requested = false;
            let wanted = o.want.take();
            let to = o.manager;
            self.send(to, Msg::Confirm { obj, from: me });
            if wanted == Some(Access::Write) {
                // A write was asked meanwhile: ask again.
                self.obj_mut(obj)?.want = Some(Access::Write);
                self.request(obj, me)?;
            }
            self.events.push(Event::Granted { obj, access });
            return Ok(());
        }
        o.owner = true;
        o.dirty = dirty;
        o.next_grant = next_grant;
        o.copyset.clear();
        o.invalidating = copyset
            .iter()
            .map(|(e, _)| *e)
            .filter(|e| *e != me)
            .collect();
        o.after = Some(After::Confirm);
        self.invalidate_all(obj)
    }

    fn on_invalidate(&mut self, obj: ObjectId, w: Endpoint) -> Result<(), Error> {
        let me = self.me;
        let o = self.obj_mut(obj)?;
        if !o.owner {
            o.valid = false;
            o.data = Vec::new();
        }
        // A sharer that released already still answers: the new owner waits.
        self.send(w, Msg::InvAck { obj, from: me });
        Ok(())
    }

    fn on_inv_ack(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::InvAck { obj, from: s } = msg else {
            return Ok(());
        };
        let o = self.obj_mut(obj)?;
        if !o.invalidating.remove(&s) {
            return Err(Self::unexpected(
                from,
                &msg,
                "no invalidation of it is in progress",
            ));
        }
        if o.invalidating.is_empty() && o.after == Some(After::Confirm) {
            return self.finish_write(obj);
        }
        Ok(())
    }

    fn on_confirm(&mut self, from: Endpoint, obj: ObjectId, r: Endpoint) -> Result<(), Error> {
        let msg = Msg::Confirm { obj, from: r };
        let o = self.obj_mut(obj)?;
        let Some(m) = o.mgr.as_mut() else {
            return self.chase(obj, msg);
        };
        if m.lock != Some(Lock::Request(r)) {
            return Err(Self::unexpected(from, &msg, "the lock is not held for it"));
        }
        m.lock = None;
        self.pump(obj)
    }

    fn on_release(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::Release {
            obj,
            from: r,
            grant,
            owner,
        } = msg
        else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj_mut(obj)?;
        if let Some(m) = o.mgr.as_mut() {
            let kind = if owner {
                QueuedKind::OwnerRelease
            } else {
                QueuedKind::SharerRelease { grant }
            };
            // A sharer's release reaching the manager that owns: apply here.
            if !owner && m.owner == me && m.lock.is_none() && m.queue.is_empty() {
                Self::drop_sharer(o, r, grant);
                return Ok(());
            }
            m.queue.push_back(Queued {
                from: r,
                kind,
                have: None,
            });
            return self.pump(obj);
        }
        if o.owner && !owner {
            Self::drop_sharer(o, r, grant);
            return Ok(());
        }
        let _ = from;
        self.chase(obj, msg)
    }

    fn drop_sharer(o: &mut Object, r: Endpoint, grant: u64) {
        // Crossed an invalidation, or overtaken by a newer grant: drop it.
        if !o.invalidating.contains(&r) && o.copyset.get(&r) == Some(&grant) {
            o.copyset.remove(&r);
            if o.copyset.is_empty() && o.after.is_none() && o.owner && o.valid {
                // Still the owner of the only copy, but it stays read-only
                // until a write request passes the manager's lock.
            }
        }
    }

    fn on_release_ack(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::ReleaseAck { obj } = msg else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj_mut(obj)?;
        // An acknowledgement of an old release that an implicit release
        // completed, reaching an endpoint that owns it again, is honoured
        // too: the manager holds its lock for it, and giving the state back
        // is always correct (a pending access asks again).
        if !o.owner || o.after.is_some() {
            return Err(Self::unexpected(
                from,
                &msg,
                "this endpoint does not own it",
            ));
        }
        let own = Ownership {
            data: std::mem::take(&mut o.data),
            dirty: o.dirty,
            copyset: o.copyset.iter().map(|(e, g)| (*e, *g)).collect(),
            next_grant: o.next_grant,
        };
        o.drop_copy();
        o.releasing = false;
        // To the manager that acknowledged (this endpoint may not have heard
        // of a manager change yet).
        self.send(from, Msg::ReleaseData { obj, from: me, own });
        self.request(obj, me)
    }

    fn take_ownership(o: &mut Object, me: Endpoint, own: Ownership) {
        o.copyset = own.copyset.into_iter().filter(|(e, _)| *e != me).collect();
        o.data = own.data;
        o.dirty = own.dirty;
        o.next_grant = own.next_grant;
        o.owner = true;
        o.valid = true;
        o.writable = o.copyset.is_empty();
    }

    fn on_release_data(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::ReleaseData { obj, from: r, own } = msg else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj_mut(obj)?;
        let locked = o.mgr.as_ref().and_then(|m| m.lock);
        if locked != Some(Lock::OwnerRelease(r)) {
            let m = Msg::ReleaseData { obj, from: r, own };
            return Err(Self::unexpected(
                from,
                &m,
                "no release of it is in progress",
            ));
        }
        Self::take_ownership(o, me, own);
        if let Some(m) = o.mgr.as_mut() {
            m.owner = me;
            m.lock = None;
        }
        self.pump(obj)
    }

    fn start_chman(&mut self, obj: ObjectId, new: Endpoint, leaving: bool) -> Result<(), Error> {
        let me = self.me;
        let o = self.obj_mut(obj)?;
        let Some(m) = o.mgr.take() else {
            return Ok(());
        };
        o.manager = new;
        o.epoch += 1;
        let epoch = o.epoch;
        // A staying owner keeps a read copy: it joins the copyset it hands over.
        let stay_grant = (o.owner && !leaving).then(|| {
            let g = o.next_grant;
            o.next_grant += 1;
            o.copyset.insert(me, g);
            g
        });
        let own = o.owner.then(|| Ownership {
            data: o.data.clone(),
            dirty: o.dirty,
            copyset: o.copyset.iter().map(|(e, g)| (*e, *g)).collect(),
            next_grant: o.next_grant,
        });
        let owner = if own.is_some() { new } else { m.owner };
        let sharer_grant = (leaving && !o.owner && o.valid).then_some(o.grant);
        if let Some(g) = stay_grant {
            o.owner = false;
            o.writable = false;
            o.dirty = false;
            o.copyset.clear();
            o.grant = g;
        } else if leaving || o.owner {
            o.drop_copy();
        }
        // An owner's release still travelling is done: ownership moves with
        // the change, and the new manager drops the stale release.
        o.releasing = false;
        let open: Vec<Endpoint> = o.open.iter().copied().collect();
        o.chman_acks
            .insert(epoch, open.iter().copied().filter(|e| *e != me).collect());
        let wanted = o.want.is_some() && !o.requested;
        for e in &open {
            if *e == me {
                continue;
            }
            let to_new = *e == new;
            let chman = Msg::Vnodechman {
                obj,
                epoch,
                manager: new,
                owner: to_new.then_some(owner),
                queue: if to_new {
                    m.queue.iter().cloned().collect()
                } else {
                    Vec::new()
                },
                open: open.clone(),
                own: if to_new { own.clone() } else { None },
            };
            self.send(*e, chman);
        }
        if let Some(grant) = sharer_grant {
            let rel = Msg::Release {
                obj,
                from: me,
                grant,
                owner: false,
            };
            self.send(new, rel);
        }
        if wanted {
            self.request(obj, me)?;
        }
        self.events
            .push(Event::ManagerChanged { obj, manager: new });
        Ok(())
    }

    fn on_chman(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::Vnodechman {
            obj,
            epoch,
            manager,
            owner,
            queue,
            open,
            own,
        } = msg
        else {
            return Ok(());
        };
        let me = self.me;
        let o = self.obj(obj)?;
        let rebuilt = || Msg::Vnodechman {
            obj,
            epoch,
            manager,
            owner,
            queue: Vec::new(),
            open: Vec::new(),
            own: None,
        };
        if epoch <= o.epoch {
            // Overtaken by a later change: only acknowledged.
            if manager == me {
                return Err(Self::unexpected(
                    from,
                    &rebuilt(),
                    "an old change names this endpoint",
                ));
            }
            self.send(
                from,
                Msg::Ack {
                    obj,
                    from: me,
                    epoch,
                },
            );
            return Ok(());
        }
        if o.mgr.is_some() {
            return Err(Self::unexpected(
                from,
                &rebuilt(),
                "this endpoint manages it",
            ));
        }
        if manager == me && owner.is_none() {
            return Err(Self::unexpected(
                from,
                &rebuilt(),
                "the new manager was not told the owner",
            ));
        }
        let o = self.obj_mut(obj)?;
        o.epoch = epoch;
        o.manager = manager;
        o.open.extend(open);
        if manager == me {
            if let Some(own) = own {
                Self::take_ownership(o, me, own);
            }
            o.mgr = Some(ManagerSide {
                owner: owner.unwrap_or(me),
                lock: None,
                queue: queue.into(),
                chman: None,
            });
        }
        self.send(
            from,
            Msg::Ack {
                obj,
                from: me,
                epoch,
            },
        );
        self.events.push(Event::ManagerChanged { obj, manager });
        self.pump(obj)
    }

    fn on_ack(&mut self, from: Endpoint, msg: Msg) -> Result<(), Error> {
        let Msg::Ack {
            obj,
            from: a,
            epoch,
        } = msg
        else {
            return Ok(());
        };
        let o = self.obj_mut(obj)?;
        let Some(waiting) = o.chman_acks.get_mut(&epoch) else {
            return Err(Self::unexpected(from, &msg, "no manager change awaits it"));
        };
        if !waiting.remove(&a) {
            return Err(Self::unexpected(from, &msg, "no manager change awaits it"));
        }
        if waiting.is_empty() {
            o.chman_acks.remove(&epoch);
            self.events.push(Event::ChmanDone { obj });
        }
        Ok(())
    }

    /// `VNODECLOSE` at the vnode's manager (§6.2.4): removes `from` from the
    /// copysets of `regions` this endpoint owns. Returns how many it left.
    pub fn close_from(&mut self, from: Endpoint, regions: &[ObjectId]) -> usize {
        let mut n = 0;
        for r in regions {
            if let Some(o) = self.objects.get_mut(r)
                && o.owner
                && o.copyset.remove(&from).is_some()
            {
                n += 1;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Endpoint = Endpoint(1);
    const B: Endpoint = Endpoint(2);
    const C: Endpoint = Endpoint(3);
    const X: ObjectId = ObjectId(0x1_0000_0000);

    fn net(n: u32) -> Vec<Engine> {
        let all: Vec<Endpoint> = (1..=n).map(Endpoint).collect();
        all.iter()
            .map(|e| {
                let mut g = Engine::new(*e);
                g.create(X, A, &all, b"v0".to_vec());
                g
            })
            .collect()
    }

    /// Delivers everything in flight, FIFO per pair.
    fn settle(es: &mut [Engine]) {
        loop {
            let mut moved = false;
            for i in 0..es.len() {
                let from = es[i].me();
                for (to, m) in es[i].take_output() {
                    es[(to.0 - 1) as usize].handle(from, m).unwrap();
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn read_then_write_invalidates_the_reader() {
        let mut es = net(3);
        assert!(!es[1].access(X, Access::Read).unwrap());
        settle(&mut es);
        assert_eq!(es[1].read(X), Some(&b"v0"[..]));
        assert_eq!(es[0].state(X), Moesi::S);
        assert_eq!(es[1].state(X), Moesi::S);
        assert!(!es[2].access(X, Access::Write).unwrap());
        settle(&mut es);
        assert!(es[2].access(X, Access::Write).unwrap());
        es[2].write(X, b"v1".to_vec()).unwrap();
        assert_eq!(es[2].state(X), Moesi::M);
        assert_eq!(es[1].state(X), Moesi::I);
        assert_eq!(es[0].state(X), Moesi::I);
        assert_eq!(es[0].recorded_owner(X), Some(C));
        assert!(!es[0].access(X, Access::Read).unwrap());
        settle(&mut es);
        assert_eq!(es[0].read(X), Some(&b"v1"[..]));
        assert_eq!(es[2].state(X), Moesi::O);
    }

    #[test]
    fn owner_release_returns_the_data_to_the_manager() {
        let mut es = net(2);
        es[1].access(X, Access::Write).unwrap();
        settle(&mut es);
        es[1].write(X, b"dirty".to_vec()).unwrap();
        es[1].release(X).unwrap();
        settle(&mut es);
        assert_eq!(es[0].state(X), Moesi::M);
        assert_eq!(es[0].read(X), Some(&b"dirty"[..]));
        assert_eq!(es[1].state(X), Moesi::I);
    }

    #[test]
    fn manager_change_moves_ownership_and_everyone_learns_it() {
        let mut es = net(3);
        es[1].access(X, Access::Read).unwrap();
        settle(&mut es);
        es[0].release(X).unwrap(); // the manager leaves: B holds a copy
        settle(&mut es);
        for e in &es {
            assert_eq!(e.manager(X), Some(B));
        }
        assert!(es[1].is_manager(X) && es[1].is_owner(X));
        assert!(es[0].take_events().contains(&Event::ChmanDone { obj: X }));
        assert!(!es[2].access(X, Access::Write).unwrap());
        settle(&mut es);
        assert!(es[2].access(X, Access::Write).unwrap());
    }

    #[test]
    fn protocol_violations_are_errors_not_panics() {
        let mut es = net(2);
        let e = es[1]
            .handle(
                A,
                Msg::Grant {
                    obj: X,
                    access: Access::Read,
                    data: None,
                    dirty: false,
                    grant: 1,
                    copyset: vec![],
                    next_grant: 0,
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("nothing was requested"), "{e}");
        let e = es[1]
            .handle(
                A,
                Msg::Ack {
                    obj: ObjectId(9),
                    from: A,
                    epoch: 1,
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("does not know"), "{e}");
        let e = es[1]
            .handle(
                A,
                Msg::Forward {
                    obj: X,
                    from: A,
                    access: Access::Read,
                    have: None,
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("does not own"), "{e}");
    }
}
