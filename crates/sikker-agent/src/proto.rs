//! What a process and its agent say to each other over the agent's Unix
//! socket (one `SOCK_SEQPACKET` datagram per message, postcard-encoded).
//! Services, processes and domains travel by name; the agent maps them to
//! the policy's identifiers. The source of a message is never in it: the agent
//! derives it from the socket ([`crate::attest`]).

use serde::{Deserialize, Serialize};

/// Largest message (header and payload) the agent accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// A destination or recipient: `service:process:domain`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dest {
    pub service: String,
    pub process: u32,
    pub domain: String,
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.service, self.process, self.domain)
    }
}

/// Why a text is not a `SERVICE:PROCESS:DOMAIN` destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadDest {
    #[error("`{0}` is not SERVICE:PROCESS:DOMAIN")]
    Shape(String),
    #[error("`{process}` in `{dest}` is not a process number")]
    Process { process: String, dest: String },
}

impl std::str::FromStr for Dest {
    type Err = BadDest;
    fn from_str(s: &str) -> Result<Self, BadDest> {
        let parts: Vec<&str> = s.split(':').collect();
        let [service, process, domain] = parts.as_slice() else {
            return Err(BadDest::Shape(s.to_string()));
        };
        let process = process.parse().map_err(|_| BadDest::Process {
            process: (*process).to_string(),
            dest: s.to_string(),
        })?;
        Ok(Dest {
            service: (*service).to_string(),
            process,
            domain: (*domain).to_string(),
        })
    }
}

/// A process identity: `service:process`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    pub service: String,
    pub process: u32,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.service, self.process)
    }
}

/// A request with the number its answer ([`FromAgent::Ok`] or
/// [`FromAgent::Denied`]) carries back, so answers never get mixed up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub body: ToAgent,
    /// The sender does not wait for this answer: an acceptance may be
    /// delayed and sent with later ones (a refusal is answered at once).
    /// What [`crate::Client::post`] sets, like TCP's delayed ACK.
    pub lazy: bool,
}

/// From a process to its agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToAgent {
    /// Deliver messages for this identity to this connection.
    Listen,
    /// Send `payload` to `to`. With `otp_for`, the message carries a one-time
    /// permission for the recipient to answer `otp_for` (§6.2.3). `claim` is a
    /// source the sender asserts: the agent refuses the message unless it is the
    /// sender's derived identity (a header field a process may not forge).
    Send {
        to: Dest,
        payload: Vec<u8>,
        otp_for: Option<Dest>,
        claim: Option<Identity>,
    },
    /// Answer using the one-time permission `otp` received with a message.
    Reply { otp: u32, payload: Vec<u8> },
    /// Answer every earlier request of this connection now (the delayed
    /// acceptances of lazy ones), then this one.
    Sync,
}

/// Why a message was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Denied {
    /// The policy does not permit it (the NMU's verdict, explained).
    #[error("not permitted: {0}")]
    Permission(String),
    /// A name the policy does not know.
    #[error("unknown {what} `{name}`")]
    Unknown { what: String, name: String },
    /// The message claimed a source that is not the sender.
    #[error("the message claims to come from {claimed}, but its sender is {actual}")]
    Forged { claimed: String, actual: String },
    /// The socket was attached by another process (a passed-along socket).
    #[error("this socket was attached by pid {attached}, but pid {sender} sent on it")]
    PassedSocket { attached: i32, sender: i32 },
    /// The process no longer runs the executable it was attested with.
    #[error("pid {pid} now runs {now}, not {attested}: its identity ended with the exec")]
    Exec {
        pid: i32,
        attested: String,
        now: String,
    },
    /// A one-time permission that does not exist, was used, or expired.
    #[error("one-time permission: {0}")]
    Otp(String),
    /// Permitted, but the destination cannot be reached from here.
    #[error("undeliverable: {0}")]
    Undeliverable(String),
    /// The bytes were not a message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message can never pass its rate limit as it is.
    #[error("rate limit: {0}")]
    Rate(String),
    /// The agent of the destination's host refused it (its receiver-side check).
    #[error("the agent of host {host} refused it: {why}")]
    Remote { host: String, why: String },
    /// The connection holds no identity.
    #[error("this connection has no identity: {0}")]
    NoIdentity(String),
}

/// From the agent to a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromAgent {
    /// The connection is attached as this identity.
    Attached(Identity),
    /// The agent refused to attach the process, and why; it closes the socket.
    Refused(String),
    /// Request `id` was accepted.
    Ok(u64),
    /// Request `id` was refused (`None`: bytes that were not a request).
    Denied { id: Option<u64>, why: Denied },
    /// A message for this process, with its sender's verified identity.
    Deliver {
        from: Identity,
        domain: String,
        payload: Vec<u8>,
        /// A one-time permission to answer with ([`ToAgent::Reply`]).
        otp: Option<u32>,
        /// On an answer sent with a one-time permission: who asked for it.
        requester: Option<Identity>,
    },
    /// Requests `first..=last` of this connection were all accepted: one
    /// answer for a run of pipelined messages ([`crate::Client::post`]).
    Oks { first: u64, last: u64 },
}

/// Why bytes did not decode.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(String);

/// Encodes a message.
pub fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    postcard::to_allocvec(m).unwrap_or_default()
}

/// Decodes a message. Never panics on any input.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError(format!(
            "{} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit",
            bytes.len()
        )));
    }
    postcard::from_bytes(bytes).map_err(|e| DecodeError(e.to_string()))
}
