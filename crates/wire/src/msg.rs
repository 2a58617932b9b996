//! The messages of the node protocol: one enum, one variant per message, each a
//! JSON object tagged by `type` inside a frame ([`crate::frame`]).
//!
//! Who may send what, and when, is the business of the state machines in
//! [`crate::session`]; this module only says what each message carries.
//!
//! To add a message for a new conversation (Orion's monitor, Sikker's agents,
//! Metachory's sessions): add its variant here with a doc line saying who sends
//! it, name it in [`Message::kind`], and teach the grammar in
//! [`crate::session`] when it may arrive. Old peers refuse the unknown `type`
//! with an error naming it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sidecore_types::AppStatus;

use crate::agent_msg::{AgentHello, AgentResult, AgentSend, RateExchange};
use crate::mx_msg::{MxFrame, MxOpen};
use crate::orion_msg::{SenseRequest, SenseView};
use crate::part::RemotePart;

/// The origin's first message: who is asking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The origin's name (host name and process), for the peer's logs and names.
    pub origin: String,
    /// The origin's sidecore version.
    pub software: String,
}

/// What a peer says about itself in answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeInfo {
    /// The node's name (`sidecore daemon --name`).
    pub name: String,
    /// Its sidecore version.
    pub software: String,
    /// CPUs its daemon may use.
    pub cpus: u32,
    /// Memory available to it, in bytes.
    pub memory_bytes: u64,
}

/// A message of the node protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Message {
    /// Origin → peer, first: who is asking.
    Hello(Hello),
    /// Peer → origin, first: who answers.
    Welcome(NodeInfo),
    /// Origin → peer: run this part of an app here.
    Deploy(RemotePart),
    /// Peer → origin: where the peer listens for each channel coming in from
    /// the origin (channel name → `ip:port`).
    Listening { channels: BTreeMap<String, String> },
    /// Peer → origin: the part runs here, as app `app`.
    Deployed { app: String },
    /// Peer → origin: the part's status, periodically and once at the end.
    Status(AppStatus),
    /// Origin → peer: stop the part; the peer answers with its last status and
    /// closes.
    Stop,
    /// Either way: what went wrong. The sender closes after it.
    Error { error: String },
    /// Sikker agent → agent, first on an agent link ([`crate::agents`]).
    AgentHello(AgentHello),
    /// Sikker agent → agent: a message checked at its sender, to deliver.
    AgentSend(AgentSend),
    /// Sikker agent → agent: the receiver's verdict on an `agent-send`.
    AgentResult(AgentResult),
    /// Sikker agent → agent: an SE-TRE request for tokens and rate.
    RateRequest(RateExchange),
    /// Sikker agent → agent: the answer to a `rate-request`.
    RateResponse(RateExchange),
    /// Sikker agent → agent: still here (silence ends the link).
    AgentBeat,
    /// Orion monitor → node, after the welcome: send a view of your sensors
    /// ([`crate::orion_msg`]).
    Sense(SenseRequest),
    /// Node → Orion monitor: the view a `sense` asked for.
    SenseView(SenseView),
    /// Metachory client → node, after the welcome: run a program here with
    /// the client's files projected ([`crate::mx_msg`]).
    MxOpen(MxOpen),
    /// Metachory: one message between two endpoints of a session.
    Mx(Box<MxFrame>),
}

impl Message {
    /// The message's `type`, for errors about it.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "hello",
            Message::Welcome(_) => "welcome",
            Message::Deploy(_) => "deploy",
            Message::Listening { .. } => "listening",
            Message::Deployed { .. } => "deployed",
            Message::Status(_) => "status",
            Message::Stop => "stop",
            Message::Error { .. } => "error",
            Message::AgentHello(_) => "agent-hello",
            Message::AgentSend(_) => "agent-send",
            Message::AgentResult(_) => "agent-result",
            Message::RateRequest(_) => "rate-request",
            Message::RateResponse(_) => "rate-response",
            Message::AgentBeat => "agent-beat",
            Message::Sense(_) => "sense",
            Message::SenseView(_) => "sense-view",
            Message::MxOpen(_) => "mx-open",
            Message::Mx(_) => "mx",
        }
    }

    /// The payload of its frame.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every map has string keys and
        // every value is plain data.
        serde_json::to_vec(self).expect("node-protocol messages always serialize")
    }

    /// Reads a frame's payload.
    pub fn decode(payload: &[u8]) -> Result<Message, serde_json::Error> {
        serde_json::from_slice(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_json_and_round_trip() {
        let m = Message::Deployed { app: "a@b".into() };
        let bytes = m.encode();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"type":"deployed","app":"a@b"}"#
        );
        assert_eq!(Message::decode(&bytes).unwrap(), m);
        assert_eq!(Message::Stop.encode(), br#"{"type":"stop"}"#);
        let hello = Message::Hello(Hello {
            origin: "vm.1".into(),
            software: "0.1.0".into(),
        });
        assert_eq!(Message::decode(&hello.encode()).unwrap(), hello);
    }

    #[test]
    fn unknown_types_and_fields_are_named() {
        let e = Message::decode(br#"{"type":"explode"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `explode`"), "{e}");
        let e =
            Message::decode(br#"{"type":"hello","origin":"a","software":"1","x":1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `x`"), "{e}");
    }
}
