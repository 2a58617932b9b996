//! The bodies of the messages Sikker's agents send each other over an agent
//! link ([`crate::agents`] has the link's grammar): plain data, so that
//! [`crate::msg::Message`] can carry them without knowing the grammar.

use serde::{Deserialize, Serialize};

/// An agent's first message on a link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentHello {
    /// The sender's host name in the placement (its certificate must prove it).
    pub host: String,
    /// The sender's sidecore version.
    pub software: String,
}

/// The OTP block of a forwarded header (the NMU's `OtpBlock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireOtp {
    /// Recipient of the answer: service, process, domain.
    pub recipient: [u32; 3],
    /// The recipient's physical address.
    pub recipient_addr: u32,
    /// On an answer: the requester (service, process).
    pub requester: Option<[u32; 2]>,
}

/// A message's trusted header (the NMU's `Header`), written by the sending agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireHeader {
    /// Source service and process, as the sending agent derived them.
    pub src: [u32; 2],
    /// Destination service, process and domain.
    pub dst: [u32; 3],
    /// The one-time-permission block, if any.
    pub otp: Option<WireOtp>,
}

/// A message forwarded from the sender's agent to the receiver's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSend {
    /// Numbered by the sending agent; the result names it.
    pub fid: u64,
    pub header: WireHeader,
    /// The payload, base64 (standard alphabet, padded).
    pub payload: String,
}

/// The receiving agent's verdict on a forwarded message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentResult {
    pub fid: u64,
    /// `None`: delivered. Otherwise the denial's kind (`permission`,
    /// `undeliverable`, `otp`, `forged`, …) and its explanation.
    pub denied: Option<(String, String)>,
}

/// One SE-TRE exchange message (§5.6) between two processes of the same
/// source service on different hosts, for the rate limit `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateExchange {
    /// The rate limit (index into the policy's rate limits).
    pub slot: u32,
    /// Asking (on a request) or answering (on a response) process.
    pub from: u32,
    /// The process asked (on a request) or answered (on a response).
    pub to: u32,
    /// The membership view the sender is in: messages from another view are
    /// not applied (shares were reset when the view changed).
    pub view: u64,
    /// The request's id (unique per asking process).
    pub id: u64,
    /// `T_ask` / `T_give`, bytes.
    pub tokens: f64,
    /// `R_ask` / `R_give`, bytes per ns.
    pub rate: f64,
}
