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
        self.directory.unregister(&self.name);
    }
}

/// Name → endpoint map shared by everything in one runtime.
#[derive(Clone, Default)]
pub struct OobDirectory {
    inner: Arc<RwLock<HashMap<String, Sender<OobMessage>>>>,
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
        map.insert(name.to_string(), tx);
        Ok(OobEndpoint {
            name: name.to_string(),
            rx,
            directory: self.clone(),
        })
    }

    /// Sends `msg` to the endpoint named `to`, without waiting.
    pub fn send(&self, to: &str, msg: OobMessage) -> Result<(), OobError> {
        let map = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tx = map
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

    fn unregister(&self, name: &str) {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
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
