//! The synthetic extension of the scalability experiment (§4.7.2, Fig. 4.12): on
//! each request it stores `keys` keys of `key_bytes` bytes in its access context;
//! on the reply it looks every one of them up and deletes it. The seed's access
//! context was a BerkeleyDB B-tree in the process; here it is an in-memory B-tree
//! (`BTreeMap`), the same structure without the database around it. A chain of N
//! of these measures how the per-message cost T_F grows with the number of
//! policies.

use std::collections::BTreeMap;

use crate::chain::{Action, Policy};
use crate::message::Msg;

/// The seed's figures: 20 keys of 50 bytes.
pub const DEFAULT_KEYS: usize = 20;
pub const DEFAULT_KEY_BYTES: usize = 50;
/// Limits on the settings.
pub const MAX_KEYS: usize = 10_000;
pub const MAX_KEY_BYTES: usize = 4096;
/// Requests whose keys are kept at most (their replies may never come).
const MAX_OUTSTANDING: usize = 65_536;

/// The settings (`kind = "synthetic"`, `keys`, `key_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticSettings {
    pub keys: usize,
    pub key_bytes: usize,
}

impl Default for SyntheticSettings {
    fn default() -> Self {
        Self {
            keys: DEFAULT_KEYS,
            key_bytes: DEFAULT_KEY_BYTES,
        }
    }
}

/// One synthetic extension.
pub struct SyntheticPolicy {
    settings: SyntheticSettings,
    context: BTreeMap<Vec<u8>, u32>,
    /// Lookups that found their key (every one, unless keys were evicted).
    pub hits: u64,
}

impl SyntheticPolicy {
    pub fn new(settings: SyntheticSettings) -> Self {
        Self {
            settings,
            context: BTreeMap::new(),
            hits: 0,
        }
    }

    fn key(&self, xid: u32, i: usize) -> Vec<u8> {
        let mut k = vec![b'k'; self.settings.key_bytes.max(8)];
        k[..4].copy_from_slice(&xid.to_be_bytes());
        k[4..8].copy_from_slice(&(i as u32).to_be_bytes());
        k
    }
}

impl Policy<Msg> for SyntheticPolicy {
    fn name(&self) -> &str {
        "synthetic"
    }

    fn on_request(&mut self, xid: u32, request: Msg, out: &mut Vec<Action<Msg>>) {
        if self.context.len() >= MAX_OUTSTANDING * self.settings.keys.max(1) {
            self.context.clear();
        }
        for i in 0..self.settings.keys {
            let k = self.key(xid, i);
            self.context.insert(k, xid);
        }
        out.push(Action::Forward(request));
    }

    fn on_response(&mut self, xid: u32, _request: &Msg, response: Msg, out: &mut Vec<Action<Msg>>) {
        for i in 0..self.settings.keys {
            let k = self.key(xid, i);
            if self.context.get(&k) == Some(&xid) {
                self.hits += 1;
            }
            self.context.remove(&k);
        }
        out.push(Action::Forward(response));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stored_then_found_and_deleted() {
        let mut p = SyntheticPolicy::new(SyntheticSettings::default());
        let mut out = Vec::new();
        p.on_request(5, Msg::RawReply(vec![]), &mut out);
        p.on_request(6, Msg::RawReply(vec![]), &mut out);
        assert_eq!(p.context.len(), 2 * DEFAULT_KEYS);
        assert!(p.context.keys().all(|k| k.len() == DEFAULT_KEY_BYTES));
        p.on_response(5, &Msg::RawReply(vec![]), Msg::RawReply(vec![]), &mut out);
        assert_eq!(p.hits, DEFAULT_KEYS as u64);
        assert_eq!(p.context.len(), DEFAULT_KEYS);
        assert_eq!(out.len(), 3);
    }
}
