//! The out-of-band (OOB) control channel (HYDRA §4.2.1): a connectionless
//! endpoint that the runtime gives every application and every offcode, for
//! initialization, control and management events (such as "a channel to you is
//! now available") — never for performance-critical traffic.
//!
//! Endpoints are registered by name in an [`OobDirectory`]; anyone holding the
//! directory can send to any endpoint by name. Each endpoint's queue is bounded,
//! so a stuck offcode cannot make its senders grow memory without limit.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use serde::{Deserialize, Serialize};

/// Messages an OOB endpoint may receive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum OobMessage {
    /// A specialised channel to one of your ports is connected (HYDRA: the
    /// runtime notifies the offcode over its OOB channel).
    ChannelAvailable { channel: String, port: String },
    /// The runtime asks you to stop, with the reason.
    Stop { reason: String },
    /// An application-level control message.
    Control {
        from: String,
        body: serde_json::Value,
    },
    /// A management event about another offcode (e.g. a watchdog expiry).
    Event { about: String, what: String },
}

/// Why an OOB send failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OobError {
    #[error("no OOB endpoint named `{0}`")]
    Unknown(String),
    #[error("OOB endpoint `{0}` is full (its owner is not reading)")]
    Full(String),
    #[error("OOB endpoint `{0}` is already registered")]
    Duplicate(String),
}

/// The receiving side of an endpoint.
pub struct OobEndpoint {
    name: String,
    /// Which registration of `name` this is (see [`OobDirectory::evict`]).
    id: u64,
    rx: Receiver<OobMessage>,
    directory: OobDirectory,
}

impl OobEndpoint {
    /// This endpoint's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next message, without waiting.
    pub fn try_recv(&self) -> Option<OobMessage> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `timeout` for a message.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<OobMessage> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The directory, to send to others by name.
    pub fn directory(&self) -> &OobDirectory {
        &self.directory
    }
}

impl Drop for OobEndpoint {
    fn drop(&mut self) {
        self.directory.unregister(&self.name, self.id);
    }
}

/// One name's registration: which one it is, and its queue.
type Registration = (u64, Sender<OobMessage>);

/// Name → endpoint map shared by everything in one runtime.
#[derive(Clone, Default)]
pub struct OobDirectory {
    /// Each name's registration: its number and its queue.
    inner: Arc<RwLock<HashMap<String, Registration>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl OobDirectory {
    /// Queue depth of each endpoint.
    pub const DEPTH: usize = 256;

    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an endpoint named `name`.
    pub fn open(&self, name: &str) -> Result<OobEndpoint, OobError> {
        let mut map = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.contains_key(name) {
            return Err(OobError::Duplicate(name.to_string()));
        }
        let (tx, rx) = bounded(Self::DEPTH);
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        map.insert(name.to_string(), (id, tx));
        Ok(OobEndpoint {
            name: name.to_string(),
            id,
            rx,
            directory: self.clone(),
        })
    }

    /// Takes `name` away from whoever registered it, so that it can be
    /// opened again while the old endpoint still lives: for an offcode left
    /// behind on a PE declared dead, whose executor may never run again to
    /// drop it. Messages to `name` then go to the new endpoint; the old one's
    /// eventual drop leaves the new registration alone. Whether it was there.
    pub fn evict(&self, name: &str) -> bool {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name)
            .is_some()
    }

    /// Sends `msg` to the endpoint named `to`, without waiting.
    pub fn send(&self, to: &str, msg: OobMessage) -> Result<(), OobError> {
        let map = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (_, tx) = map
            .get(to)
            .ok_or_else(|| OobError::Unknown(to.to_string()))?;
        tx.try_send(msg).map_err(|e| match e {
            TrySendError::Full(_) => OobError::Full(to.to_string()),
            TrySendError::Disconnected(_) => OobError::Unknown(to.to_string()),
        })
    }

    /// Names of the registered endpoints, sorted.
    pub fn names(&self) -> Vec<String> {
        let map = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<_> = map.keys().cloned().collect();
        v.sort();
        v
    }

    /// Removes registration `id` of `name`, if it is still the current one.
    fn unregister(&self, name: &str, id: u64) {
        let mut map = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.get(name).is_some_and(|(current, _)| *current == id) {
            map.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_by_name_and_unregister_on_drop() {
        let d = OobDirectory::new();
        let a = d.open("app/a").unwrap();
        d.send(
            "app/a",
            OobMessage::ChannelAvailable {
                channel: "c".into(),
                port: "in".into(),
            },
        )
        .unwrap();
        assert!(matches!(
            a.try_recv(),
            Some(OobMessage::ChannelAvailable { .. })
        ));
        assert_eq!(
            d.open("app/a").err(),
            Some(OobError::Duplicate("app/a".into()))
        );
        drop(a);
        assert_eq!(
            d.send("app/a", OobMessage::Stop { reason: "x".into() }),
            Err(OobError::Unknown("app/a".into()))
        );
    }

    #[test]
    fn an_evicted_name_opens_again_and_the_old_endpoint_s_drop_leaves_it_alone() {
        let d = OobDirectory::new();
        let old = d.open("app/a").unwrap();
        assert!(d.evict("app/a"));
        assert!(!d.evict("app/a"), "already gone");
        let new = d.open("app/a").unwrap();
        drop(old);
        let stop = || OobMessage::Stop { reason: "x".into() };
        d.send("app/a", stop()).unwrap();
        assert!(matches!(new.try_recv(), Some(OobMessage::Stop { .. })));
        drop(new);
        assert_eq!(
            d.send("app/a", stop()),
            Err(OobError::Unknown("app/a".into()))
        );
    }

    #[test]
    fn a_full_endpoint_refuses_instead_of_growing() {
        let d = OobDirectory::new();
        let _a = d.open("x").unwrap();
        for _ in 0..OobDirectory::DEPTH {
            d.send(
                "x",
                OobMessage::Stop {
                    reason: String::new(),
                },
            )
            .unwrap();
        }
        assert_eq!(
            d.send(
                "x",
                OobMessage::Stop {
                    reason: String::new()
                }
            ),
            Err(OobError::Full("x".into()))
        );
    }
}
