//! The two ends of a node connection as sans-IO state machines: bytes in, bytes
//! out, messages checked against who may send what when.
//!
//! ```text
//! origin                                   peer
//!   preamble + hello  ───────────────────▶   (answers at once)
//!                     ◀───────────────────   preamble + welcome
//!   [probe: close here]
//!   deploy(part)      ───────────────────▶
//!                     ◀───────────────────   listening {channel → addr}
//!   (connects its channels into the part; the peer connects its own out)
//!                     ◀───────────────────   deployed {app}
//!                     ◀───────────────────   status … (every 100 ms)
//!   stop              ───────────────────▶
//!                     ◀───────────────────   status (final), close
//!   error {..} may come from either side at any point after the preamble;
//!   its sender closes.
//! ```
//!
//! [`Session`] holds the framing ([`crate::frame`]) and a [`Grammar`], the
//! role's rules. [`Origin`] and [`Peer`] are the two roles. Nothing here does
//! I/O: [`Session::handle_input`] takes received bytes, [`Session::poll`]
//! returns the next checked message, [`Session::send`] queues one and
//! [`Session::take_output`] hands over the bytes to write. Tests drive an
//! origin and a peer against each other through byte buffers
//! (`tests/props.rs`); [`crate::tcp`] drives them over sockets.

use crate::frame::{FrameDecoder, FrameEncoder, FrameError, preamble};
use crate::msg::{Hello, Message, NodeInfo};
use crate::mx_msg::{MxOpenError, MxPhase};
use crate::part::PartError;

/// Something wrong on a node connection, with the peer it concerns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{peer}: {kind}")]
pub struct Error {
    /// Who is at the other end (`node b (10.0.0.2:7400)`, `origin 10.0.0.1:51234`).
    pub peer: String,
    pub kind: ErrorKind,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ErrorKind {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("frame #{seq} holds a malformed message: {error}")]
    Malformed { seq: u32, error: String },
    #[error("sent `{got}` while {state}")]
    Unexpected {
        got: &'static str,
        state: &'static str,
    },
    #[error("bad deploy request: {0}")]
    Part(#[from] PartError),
    #[error("closed the connection while {0}")]
    Closed(&'static str),
    #[error("bad mx-open: {0}")]
    MxOpen(#[from] MxOpenError),
    #[error("this side may not send `{msg}` while {state}")]
    NotNow {
        msg: &'static str,
        state: &'static str,
    },
}

/// A role's rules: which messages it may receive and send in each state.
pub trait Grammar {
    /// A received message is legal now (and moves the state); an answer to
    /// queue at once, if the role answers automatically.
    fn on_receive(&mut self, msg: &Message) -> Result<Option<Message>, ErrorKind>;
    /// This side may send `msg` now (and the state moves).
    fn on_send(&mut self, msg: &Message) -> Result<(), ErrorKind>;
    /// The other side closed: fine in this state, or an error.
    fn on_close(&self) -> Result<(), ErrorKind>;
    /// What the state is waiting for, for messages.
    fn state(&self) -> &'static str;
}

/// One end of a node connection.
#[derive(Debug)]
pub struct Session<G> {
    peer: String,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    out: Vec<u8>,
    grammar: G,
}

impl<G: Grammar> Session<G> {
    pub(crate) fn with(peer: String, grammar: G) -> Self {
        Session {
            peer,
            decoder: FrameDecoder::new(),
            encoder: FrameEncoder::default(),
            out: preamble().to_vec(),
            grammar,
        }
    }

    fn err(&self, kind: impl Into<ErrorKind>) -> Error {
        Error {
            peer: self.peer.clone(),
            kind: kind.into(),
        }
    }

    pub(crate) fn push(&mut self, msg: &Message) {
        self.encoder.encode(&msg.encode(), &mut self.out);
    }

    /// Who is at the other end.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The role's state, in words.
    pub fn state(&self) -> &'static str {
        self.grammar.state()
    }

    /// The role's rules and state.
    pub fn grammar(&self) -> &G {
        &self.grammar
    }

    /// Takes bytes received from the other side, in any chunks.
    pub fn handle_input(&mut self, bytes: &[u8]) {
        self.decoder.feed(bytes);
    }

    /// The next complete, checked message, if one has arrived.
    pub fn poll(&mut self) -> Result<Option<Message>, Error> {
        let (seq, msg) = match self.decoder.next_frame() {
            Ok(None) => return Ok(None),
            Ok(Some((seq, payload))) => (seq, Message::decode(payload)),
            Err(e) => return Err(self.err(e)),
        };
        let msg = msg.map_err(|e| {
            self.err(ErrorKind::Malformed {
                seq,
                error: e.to_string(),
            })
        })?;
        match self.grammar.on_receive(&msg) {
            Ok(Some(answer)) => self.push(&answer),
            Ok(None) => {}
            Err(kind) => return Err(self.err(kind)),
        }
        Ok(Some(msg))
    }

    /// Queues a message, if the role may send it now.
    pub fn send(&mut self, msg: &Message) -> Result<(), Error> {
        self.grammar.on_send(msg).map_err(|k| self.err(k))?;
        self.push(msg);
        Ok(())
    }

    /// The bytes to write to the other side (empties the queue).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether bytes wait to be written.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// The other side closed its end: an error if it stopped mid-frame or in
    /// a state where closing breaks the conversation.
    pub fn handle_eof(&mut self) -> Result<(), Error> {
        self.decoder.finish().map_err(|e| self.err(e))?;
        self.grammar.on_close().map_err(|k| self.err(k))
    }
}

fn unexpected(got: &Message, state: &'static str) -> ErrorKind {
    ErrorKind::Unexpected {
        got: got.kind(),
        state,
    }
}

fn unexpected_mx(body: &'static str, p: MxPhase) -> ErrorKind {
    ErrorKind::Unexpected {
        got: body,
        state: p.describe(),
    }
}

fn not_now_mx(body: &'static str, p: MxPhase) -> ErrorKind {
    ErrorKind::NotNow {
        msg: body,
        state: p.describe(),
    }
}

fn not_now(msg: &Message, state: &'static str) -> ErrorKind {
    ErrorKind::NotNow {
        msg: msg.kind(),
        state,
    }
}

/// Where the origin's side of a conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginState {
    AwaitWelcome,
    /// Welcomed: may deploy a part, or close (a probe).
    Ready,
    AwaitListening,
    AwaitDeployed,
    /// The part runs on the peer; its status reports arrive.
    Running,
    /// Asked the peer to stop; its last status report arrives, then it closes.
    Stopping,
    /// An Orion monitor asking for views (`sense`, `sense-view`) until it closes.
    Monitoring,
    /// A Metachory client's session ([`crate::mx_msg`]).
    Mx(MxPhase),
    /// An error was sent or received.
    Over,
}

/// The origin's rules.
#[derive(Debug)]
pub struct OriginGrammar {
    state: OriginState,
}

impl OriginGrammar {
    /// Where the conversation stands.
    pub fn at(&self) -> OriginState {
        self.state
    }
}

impl Grammar for OriginGrammar {
    fn on_receive(&mut self, msg: &Message) -> Result<Option<Message>, ErrorKind> {
        use OriginState as S;
        self.state = match (self.state, msg) {
            (_, Message::Error { .. }) => S::Over,
            (S::AwaitWelcome, Message::Welcome(_)) => S::Ready,
            (S::AwaitListening, Message::Listening { .. }) => S::AwaitDeployed,
            (S::AwaitDeployed, Message::Deployed { .. }) => S::Running,
            (S::Running | S::Stopping, Message::Status(_)) => self.state,
            (S::Monitoring, Message::SenseView(_)) => S::Monitoring,
            (S::Mx(p), Message::Mx(f)) => match p.next(&f.body, true) {
                Some(p) => S::Mx(p),
                None => return Err(unexpected_mx(f.body.kind(), p)),
            },
            _ => return Err(unexpected(msg, self.state())),
        };
        Ok(None)
    }

    fn on_send(&mut self, msg: &Message) -> Result<(), ErrorKind> {
        use OriginState as S;
        self.state = match (self.state, msg) {
            (_, Message::Error { .. }) => S::Over,
            (S::Ready, Message::Deploy(_)) => S::AwaitListening,
            (S::Running, Message::Stop) => S::Stopping,
            (S::Ready | S::Monitoring, Message::Sense(_)) => S::Monitoring,
            (S::Ready, Message::MxOpen(_)) => S::Mx(MxPhase::Opening),
            (S::Mx(p), Message::Mx(f)) => match p.next(&f.body, false) {
                Some(p) => S::Mx(p),
                None => return Err(not_now_mx(f.body.kind(), p)),
            },
            _ => return Err(not_now(msg, self.state())),
        };
        Ok(())
    }

    fn on_close(&self) -> Result<(), ErrorKind> {
        match self.state {
            OriginState::AwaitWelcome
            | OriginState::AwaitListening
            | OriginState::AwaitDeployed
            | OriginState::Mx(MxPhase::Opening | MxPhase::Running | MxPhase::Exited) => {
                Err(ErrorKind::Closed(self.state()))
            }
            _ => Ok(()),
        }
    }

    fn state(&self) -> &'static str {
        match self.state {
            OriginState::AwaitWelcome => "waiting for its welcome",
            OriginState::Ready => "welcomed, before any deploy request",
            OriginState::AwaitListening => "waiting for the addresses it listens on",
            OriginState::AwaitDeployed => "waiting for it to report the part deployed",
            OriginState::Running => "the part is running",
            OriginState::Stopping => "the part is stopping",
            OriginState::Monitoring => "monitoring the node",
            OriginState::Mx(p) => p.describe(),
            OriginState::Over => "the conversation is over",
        }
    }
}

/// The origin's end: it opens the connection with a hello.
pub type Origin = Session<OriginGrammar>;

impl Origin {
    /// An origin talking to `peer` (a label for errors), opening with `hello`.
    pub fn new(peer: impl Into<String>, hello: Hello) -> Origin {
        let mut s = Session::with(
            peer.into(),
            OriginGrammar {
                state: OriginState::AwaitWelcome,
            },
        );
        s.push(&Message::Hello(hello));
        s
    }
}

/// Where the peer's side of a conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    AwaitHello,
    /// Welcomed the origin: a deploy request may come, or the close of a probe.
    Ready,
    /// Deploying a part; `listening` once the addresses were sent.
    Deploying {
        listening: bool,
    },
    /// The part runs; status reports go out.
    Running,
    /// The origin asked to stop: the last report goes out, then the close.
    Stopping,
    /// An Orion monitor asks for views; each `sense` is answered with a
    /// `sense-view`.
    Monitored {
        /// A `sense` not yet answered.
        asked: bool,
    },
    /// Serving a Metachory client's session ([`crate::mx_msg`]).
    Mx(MxPhase),
    /// An error was sent or received.
    Over,
}

/// The peer's rules.
#[derive(Debug)]
pub struct PeerGrammar {
    state: PeerState,
    info: NodeInfo,
}

impl PeerGrammar {
    /// Where the conversation stands.
    pub fn at(&self) -> PeerState {
        self.state
    }
}

impl Grammar for PeerGrammar {
    fn on_receive(&mut self, msg: &Message) -> Result<Option<Message>, ErrorKind> {
        use PeerState as S;
        let mut answer = None;
        self.state = match (self.state, msg) {
            (_, Message::Error { .. }) => S::Over,
            (S::AwaitHello, Message::Hello(_)) => {
                answer = Some(Message::Welcome(self.info.clone()));
                S::Ready
            }
            (S::Ready, Message::Deploy(part)) => {
                part.validate()?;
                S::Deploying { listening: false }
            }
            (S::Running, Message::Stop) => S::Stopping,
            (S::Ready | S::Monitored { .. }, Message::Sense(_)) => S::Monitored { asked: true },
            (S::Ready, Message::MxOpen(open)) => {
                open.validate()?;
                S::Mx(MxPhase::Opening)
            }
            (S::Mx(p), Message::Mx(f)) => match p.next(&f.body, false) {
                Some(p) => S::Mx(p),
                None => return Err(unexpected_mx(f.body.kind(), p)),
            },
            _ => return Err(unexpected(msg, self.state())),
        };
        Ok(answer)
    }

    fn on_send(&mut self, msg: &Message) -> Result<(), ErrorKind> {
        use PeerState as S;
        self.state = match (self.state, msg) {
            (_, Message::Error { .. }) => S::Over,
            (S::Deploying { listening: false }, Message::Listening { .. }) => {
                S::Deploying { listening: true }
            }
            (S::Deploying { listening: true }, Message::Deployed { .. }) => S::Running,
            (S::Running | S::Stopping, Message::Status(_)) => self.state,
            (S::Monitored { asked: true }, Message::SenseView(_)) => S::Monitored { asked: false },
            (S::Mx(p), Message::Mx(f)) => match p.next(&f.body, true) {
                Some(p) => S::Mx(p),
                None => return Err(not_now_mx(f.body.kind(), p)),
            },
            _ => return Err(not_now(msg, self.state())),
        };
        Ok(())
    }

    fn on_close(&self) -> Result<(), ErrorKind> {
        match self.state {
            PeerState::AwaitHello
            | PeerState::Deploying { .. }
            | PeerState::Mx(MxPhase::Opening | MxPhase::Running | MxPhase::Approving) => {
                Err(ErrorKind::Closed(self.state()))
            }
            _ => Ok(()),
        }
    }

    fn state(&self) -> &'static str {
        match self.state {
            PeerState::AwaitHello => "waiting for its hello",
            PeerState::Ready => "welcomed, before any deploy request",
            PeerState::Deploying { listening: false } => "deploying its part",
            PeerState::Deploying { listening: true } => "connecting the part's channels",
            PeerState::Running => "its part is running",
            PeerState::Stopping => "its part is stopping",
            PeerState::Monitored { .. } => "monitored by it",
            PeerState::Mx(p) => p.describe(),
            PeerState::Over => "the conversation is over",
        }
    }
}

/// The peer's end: it answers a hello with a welcome carrying `info`.
pub type Peer = Session<PeerGrammar>;

impl Peer {
    /// A peer answering `origin` (a label for errors) as `info`.
    pub fn new(origin: impl Into<String>, info: NodeInfo) -> Peer {
        Session::with(
            origin.into(),
            PeerGrammar {
                state: PeerState::AwaitHello,
                info,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::part::tests::part;

    fn info() -> NodeInfo {
        NodeInfo {
            name: "b".into(),
            software: "0.1.0".into(),
            cpus: 2,
            memory_bytes: 1 << 30,
        }
    }

    fn hello() -> Hello {
        Hello {
            origin: "vm.1".into(),
            software: "0.1.0".into(),
        }
    }

    /// Moves everything each side has queued to the other.
    fn pump(o: &mut Origin, p: &mut Peer) {
        let b = o.take_output();
        p.handle_input(&b);
        let b = p.take_output();
        o.handle_input(&b);
    }

    #[test]
    fn a_probe_is_a_hello_and_a_welcome() {
        let (mut o, mut p) = (
            Origin::new("node b", hello()),
            Peer::new("origin x", info()),
        );
        pump(&mut o, &mut p);
        assert_eq!(p.poll().unwrap(), Some(Message::Hello(hello())));
        pump(&mut o, &mut p);
        assert_eq!(o.poll().unwrap(), Some(Message::Welcome(info())));
        assert_eq!(o.grammar().at(), OriginState::Ready);
        // The origin closes: fine for the peer after a welcome.
        p.handle_eof().unwrap();
    }

    #[test]
    fn messages_out_of_turn_are_refused_with_the_peer_named() {
        let (mut o, mut p) = (
            Origin::new("node b", hello()),
            Peer::new("origin x", info()),
        );
        // The origin may not deploy before it is welcomed.
        let e = o.send(&Message::Deploy(part())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node b: this side may not send `deploy` while waiting for its welcome"
        );
        pump(&mut o, &mut p);
        p.poll().unwrap();
        // The peer may not report deployed before it listened.
        let e = p.send(&Message::Deployed { app: "x".into() }).unwrap_err();
        assert!(e.to_string().contains("may not send `deployed`"), "{e}");
        // A peer that jumps ahead is caught by the origin.
        pump(&mut o, &mut p);
        o.poll().unwrap();
        o.send(&Message::Deploy(part())).unwrap();
        pump(&mut o, &mut p);
        assert!(matches!(p.poll().unwrap(), Some(Message::Deploy(_))));
        // Force the peer past `listening`, as a buggy or hostile one would be.
        p.grammar.state = PeerState::Deploying { listening: true };
        p.send(&Message::Deployed { app: "a".into() }).unwrap();
        pump(&mut o, &mut p);
        let e = o.poll().unwrap_err();
        assert_eq!(
            e.to_string(),
            "node b: sent `deployed` while waiting for the addresses it listens on"
        );
    }

    #[test]
    fn a_bad_part_is_refused_before_anything_is_built() {
        let (mut o, mut p) = (
            Origin::new("node b", hello()),
            Peer::new("origin x", info()),
        );
        pump(&mut o, &mut p);
        p.poll().unwrap();
        pump(&mut o, &mut p);
        o.poll().unwrap();
        let mut bad = part();
        bad.offcodes.clear();
        o.send(&Message::Deploy(bad)).unwrap();
        pump(&mut o, &mut p);
        let e = p.poll().unwrap_err();
        assert_eq!(
            e.to_string(),
            "origin x: bad deploy request: the part has no offcodes"
        );
    }

    #[test]
    fn closing_mid_conversation_is_an_error_for_the_waiting_side() {
        let (mut o, mut p) = (
            Origin::new("node b", hello()),
            Peer::new("origin x", info()),
        );
        pump(&mut o, &mut p);
        p.poll().unwrap();
        // The peer vanishes before its welcome arrives.
        let e = o.handle_eof().unwrap_err();
        assert_eq!(
            e.to_string(),
            "node b: closed the connection while waiting for its welcome"
        );
        // A malformed payload in a well-formed frame.
        let mut q = Peer::new("origin y", info());
        let mut bytes = preamble().to_vec();
        FrameEncoder::default().encode(b"{not json", &mut bytes);
        q.handle_input(&bytes);
        let e = q.poll().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("origin y: frame #0 holds a malformed message"),
            "{e}"
        );
    }
}
