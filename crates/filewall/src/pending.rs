//! The pending-request map (§4.3.2): every request on its way to a server, keyed
//! both by the client's (flow, XID) and by the fresh XID FileWall puts on the
//! server-side connection, with the bitmap of policies that handled it and a
//! deadline after which it is purged (and its late response discarded). Sans-IO: the
//! caller passes the time in.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The driver's name for a client connection (TCP) or peer address (UDP).
pub type FlowId = u64;

/// A client's request as the client named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey {
    pub flow: FlowId,
    pub xid: u32,
}

/// The most policies a chain may hold (one bit each).
pub const MAX_POLICIES: usize = 64;

/// The set of policies that handled a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyBitmap(u64);

impl PolicyBitmap {
    pub fn set(&mut self, policy: usize) {
        if policy < MAX_POLICIES {
            self.0 |= 1 << policy;
        }
    }
    pub fn contains(self, policy: usize) -> bool {
        policy < MAX_POLICIES && self.0 & (1 << policy) != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// One outstanding request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending<T> {
    /// `None` for a request a policy generated (no client waits for it).
    pub client: Option<ClientKey>,
    /// The XID used towards the server.
    pub server_xid: u32,
    pub handled: PolicyBitmap,
    pub deadline: Instant,
    /// What the caller keeps with the request (the decoded call, its procedure…).
    pub payload: T,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PendingError {
    /// The client retransmitted a request still pending; resend under the same
    /// server XID so the server's duplicate-request cache recognises it.
    #[error("flow {} xid {:#x} is already pending as server xid {server_xid:#x}", .client.flow, .client.xid)]
    Retransmission { client: ClientKey, server_xid: u32 },
    /// Treated like a network loss: the client will retransmit.
    #[error("pending-request map full ({capacity} requests)")]
    Full { capacity: usize },
}

/// Outstanding requests, by server XID and by client key.
#[derive(Debug)]
pub struct PendingMap<T> {
    by_server: HashMap<u32, Pending<T>>,
    by_client: HashMap<ClientKey, u32>,
    /// Deadlines in insertion order (the timeout is constant, so also in time order);
    /// entries already completed are skipped lazily.
    deadlines: VecDeque<(Instant, u32)>,
    next_xid: u32,
    timeout: Duration,
    capacity: usize,
}

impl<T> PendingMap<T> {
    /// `first_xid` should differ between runs (e.g. random) so a restarted FileWall
    /// does not reuse XIDs the server may still cache.
    pub fn new(first_xid: u32, timeout: Duration, capacity: usize) -> Self {
        Self {
            by_server: HashMap::new(),
            by_client: HashMap::new(),
            deadlines: VecDeque::new(),
            next_xid: first_xid,
            timeout,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.by_server.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_server.is_empty()
    }

    fn fresh_xid(&mut self) -> u32 {
        // At most `capacity` XIDs are in use, so this ends within capacity + 1 steps.
        loop {
            let xid = self.next_xid;
            self.next_xid = self.next_xid.wrapping_add(1);
            if !self.by_server.contains_key(&xid) {
                return xid;
            }
        }
    }

    /// Registers a request and returns its fresh server XID. `handled_by` is the
    /// policy that generated it, if any (its bit is set from the start).
    pub fn insert(
        &mut self,
        client: Option<ClientKey>,
        handled_by: Option<usize>,
        payload: T,
        now: Instant,
    ) -> Result<u32, PendingError> {
        if let Some(key) = client
            && let Some(&server_xid) = self.by_client.get(&key)
        {
            return Err(PendingError::Retransmission {
                client: key,
                server_xid,
            });
        }
        if self.by_server.len() >= self.capacity {
            return Err(PendingError::Full {
                capacity: self.capacity,
            });
        }
        let server_xid = self.fresh_xid();
        let mut handled = PolicyBitmap::default();
        if let Some(p) = handled_by {
            handled.set(p);
        }
        let deadline = now + self.timeout;
        self.by_server.insert(
            server_xid,
            Pending {
                client,
                server_xid,
                handled,
                deadline,
                payload,
            },
        );
        if let Some(key) = client {
            self.by_client.insert(key, server_xid);
        }
        self.deadlines.push_back((deadline, server_xid));
        Ok(server_xid)
    }

    pub fn get(&self, server_xid: u32) -> Option<&Pending<T>> {
        self.by_server.get(&server_xid)
    }

    pub fn get_mut(&mut self, server_xid: u32) -> Option<&mut Pending<T>> {
        self.by_server.get_mut(&server_xid)
    }

    /// Sets `policy`'s bit; false if the request is no longer pending.
    pub fn mark(&mut self, server_xid: u32, policy: usize) -> bool {
        match self.by_server.get_mut(&server_xid) {
            Some(p) => {
                p.handled.set(policy);
                true
            }
            None => false,
        }
    }

    /// The server XID of a client's pending request.
    pub fn server_xid(&self, client: ClientKey) -> Option<u32> {
        self.by_client.get(&client).copied()
    }

    /// Removes the request a response answers. `None` means the response is late
    /// (purged), duplicate or unsolicited: discard it.
    pub fn complete(&mut self, server_xid: u32) -> Option<Pending<T>> {
        let p = self.by_server.remove(&server_xid)?;
        if let Some(key) = p.client {
            self.by_client.remove(&key);
        }
        Some(p)
    }

    /// Purges every request whose deadline is at or before `now` and returns them.
    pub fn expire(&mut self, now: Instant) -> Vec<Pending<T>> {
        let mut out = Vec::new();
        while let Some(&(deadline, xid)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            // Skip entries completed earlier, or a reused XID with a later deadline.
            if self
                .by_server
                .get(&xid)
                .is_some_and(|p| p.deadline == deadline)
                && let Some(p) = self.complete(xid)
            {
                out.push(p);
            }
        }
        if self.by_server.is_empty() {
            self.deadlines.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(flow: u64, xid: u32) -> Option<ClientKey> {
        Some(ClientKey { flow, xid })
    }

    #[test]
    fn same_xid_on_two_flows_gets_two_server_xids() {
        let now = Instant::now();
        let mut m = PendingMap::new(100, Duration::from_secs(1), 10);
        let a = m.insert(key(1, 7), None, "a", now).unwrap();
        let b = m.insert(key(2, 7), None, "b", now).unwrap();
        assert_ne!(a, b);
        assert_eq!(m.complete(b).unwrap().payload, "b");
        assert_eq!(m.complete(a).unwrap().client, key(1, 7));
        assert!(m.complete(a).is_none(), "a duplicate response is discarded");
    }

    #[test]
    fn retransmission_reuses_the_server_xid() {
        let now = Instant::now();
        let mut m = PendingMap::new(0, Duration::from_secs(1), 10);
        let x = m.insert(key(1, 7), None, (), now).unwrap();
        assert_eq!(
            m.insert(key(1, 7), None, (), now),
            Err(PendingError::Retransmission {
                client: ClientKey { flow: 1, xid: 7 },
                server_xid: x
            })
        );
    }

    #[test]
    fn full_map_refuses_and_xids_wrap_around_in_use_ones() {
        let now = Instant::now();
        let mut m = PendingMap::new(u32::MAX, Duration::from_secs(1), 2);
        assert_eq!(m.insert(None, Some(0), (), now), Ok(u32::MAX));
        assert_eq!(m.insert(None, Some(0), (), now), Ok(0));
        assert_eq!(
            m.insert(None, None, (), now),
            Err(PendingError::Full { capacity: 2 })
        );
        m.complete(0);
        assert_eq!(m.insert(None, None, (), now), Ok(1));
    }

    #[test]
    fn timeout_purges_and_late_responses_are_discarded() {
        let t0 = Instant::now();
        let mut m = PendingMap::new(0, Duration::from_millis(100), 10);
        let a = m.insert(key(1, 1), Some(3), (), t0).unwrap();
        let b = m
            .insert(key(1, 2), None, (), t0 + Duration::from_millis(50))
            .unwrap();
        assert!(m.get(a).unwrap().handled.contains(3));
        assert!(m.mark(b, 5));
        assert!(m.expire(t0 + Duration::from_millis(99)).is_empty());
        let gone = m.expire(t0 + Duration::from_millis(100));
        assert_eq!(
            gone.iter().map(|p| p.server_xid).collect::<Vec<_>>(),
            vec![a]
        );
        assert!(m.complete(a).is_none());
        assert!(!m.mark(a, 1));
        assert_eq!(
            m.server_xid(ClientKey { flow: 1, xid: 1 }),
            None,
            "the client may retry afresh"
        );
        assert_eq!(m.len(), 1);
    }
}
