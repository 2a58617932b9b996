//! What Sikker's agents on different nodes say to each other (issue 15): the
//! messages' bodies, and the grammar of an agent link. Both ends of a link are
//! agents, so the link is symmetric: each side opens with [`AgentHello`],
//! after which either may forward messages, answer them, exchange rate and
//! send heartbeats.
//!
//! ```text
//! agent a                                  agent b
//!   preamble + agent-hello  ◀────────────▶  preamble + agent-hello
//!   agent-send {fid, header, payload} ───▶  (receiver-side check, delivery)
//!                            ◀────────────  agent-result {fid, error?}
//!   rate-request / rate-response      ◀──▶  (SE-TRE exchange, either way)
//!   agent-beat                        ◀──▶  (every 100 ms; silence ends the link)
//! ```
//!
//! Who the other agent *is* is not in these messages: the link runs inside
//! mutually authenticated TLS, and the hello's `host` must match the name the
//! peer's certificate proves (checked by the agent, which holds the
//! certificates). The header fields mirror `sidecore-sikker-nmu`'s `Header`
//! as plain numbers, so that this crate does not depend on Sikker.

use crate::agent_msg::AgentHello;
use crate::msg::Message;
use crate::session::{ErrorKind, Grammar, Session};

/// Where an agent link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentLinkState {
    /// Waiting for the other agent's hello.
    AwaitHello,
    /// Both hellos exchanged.
    Linked,
    /// An error was sent or received.
    Over,
}

/// The rules of an agent link (the same on both ends).
#[derive(Debug)]
pub struct AgentGrammar {
    state: AgentLinkState,
}

impl AgentGrammar {
    /// Where the link stands.
    pub fn at(&self) -> AgentLinkState {
        self.state
    }
}

fn is_agent_traffic(m: &Message) -> bool {
    matches!(
        m,
        Message::AgentSend(_)
            | Message::AgentResult(_)
            | Message::RateRequest(_)
            | Message::RateResponse(_)
            | Message::AgentBeat
    )
}

impl Grammar for AgentGrammar {
    fn on_receive(&mut self, msg: &Message) -> Result<Option<Message>, ErrorKind> {
        use AgentLinkState as S;
        self.state = match (self.state, msg) {
            (_, Message::Error { .. }) => S::Over,
            (S::AwaitHello, Message::AgentHello(_)) => S::Linked,
            (S::Linked, m) if is_agent_traffic(m) => S::Linked,
            _ => {
                return Err(ErrorKind::Unexpected {
                    got: msg.kind(),
                    state: self.state(),
                });
            }
        };
        Ok(None)
    }

    fn on_send(&mut self, msg: &Message) -> Result<(), ErrorKind> {
        // The hello is queued by `AgentLink::new`; afterwards only traffic.
        if matches!(msg, Message::Error { .. }) {
            self.state = AgentLinkState::Over;
            return Ok(());
        }
        if self.state == AgentLinkState::Over || !is_agent_traffic(msg) {
            return Err(ErrorKind::NotNow {
                msg: msg.kind(),
                state: self.state(),
            });
        }
        Ok(())
    }

    fn on_close(&self) -> Result<(), ErrorKind> {
        match self.state {
            AgentLinkState::Over => Ok(()),
            _ => Err(ErrorKind::Closed(self.state())),
        }
    }

    fn state(&self) -> &'static str {
        match self.state {
            AgentLinkState::AwaitHello => "waiting for the other agent's hello",
            AgentLinkState::Linked => "linked",
            AgentLinkState::Over => "the link is over",
        }
    }
}

/// One end of an agent link.
pub type AgentLink = Session<AgentGrammar>;

impl AgentLink {
    /// A link to `peer` (a label for errors) that opens with `hello`.
    pub fn new(peer: impl Into<String>, hello: AgentHello) -> AgentLink {
        let mut s = Session::with(
            peer.into(),
            AgentGrammar {
                state: AgentLinkState::AwaitHello,
            },
        );
        s.push(&Message::AgentHello(hello));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_msg::RateExchange;

    fn hello(h: &str) -> AgentHello {
        AgentHello {
            host: h.into(),
            software: "0.1.0".into(),
        }
    }

    fn pump(a: &mut AgentLink, b: &mut AgentLink) {
        let x = a.take_output();
        b.handle_input(&x);
        let x = b.take_output();
        a.handle_input(&x);
    }

    #[test]
    fn both_ends_say_hello_then_exchange_traffic() {
        let (mut a, mut b) = (
            AgentLink::new("b", hello("a")),
            AgentLink::new("a", hello("b")),
        );
        pump(&mut a, &mut b);
        assert_eq!(a.poll().unwrap(), Some(Message::AgentHello(hello("b"))));
        assert_eq!(b.poll().unwrap(), Some(Message::AgentHello(hello("a"))));
        assert_eq!(a.grammar().at(), AgentLinkState::Linked);
        let r = Message::RateRequest(RateExchange {
            slot: 0,
            from: 1,
            to: 2,
            view: 7,
            id: 3,
            tokens: 10.0,
            rate: 0.5,
        });
        a.send(&r).unwrap();
        a.send(&Message::AgentBeat).unwrap();
        pump(&mut a, &mut b);
        assert_eq!(b.poll().unwrap(), Some(r));
        assert_eq!(b.poll().unwrap(), Some(Message::AgentBeat));
        assert_eq!(b.poll().unwrap(), None);
    }

    #[test]
    fn traffic_before_the_hello_and_node_messages_are_refused() {
        let mut a = AgentLink::new("b", hello("a"));
        let mut b = AgentLink::new("a", hello("b"));
        // b sends a beat before its hello reached a: impossible through the
        // API (the hello is queued first), so forge the bytes directly.
        let mut bytes = crate::frame::preamble().to_vec();
        crate::frame::FrameEncoder::default().encode(&Message::AgentBeat.encode(), &mut bytes);
        a.handle_input(&bytes);
        let e = a.poll().unwrap_err();
        assert!(
            e.to_string()
                .contains("sent `agent-beat` while waiting for the other agent's hello"),
            "{e}"
        );
        // A node-protocol message on an agent link.
        pump(&mut a, &mut b);
        b.poll().unwrap();
        assert!(b.send(&Message::Stop).is_err());
        let e = b.handle_eof().unwrap_err();
        assert!(
            e.to_string().contains("closed the connection while linked"),
            "{e}"
        );
    }
}
