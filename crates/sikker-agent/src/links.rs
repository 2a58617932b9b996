//! The agent's links to other hosts' agents: TCP, inside mutual TLS
//! ([`crate::tls`]), carrying the node protocol's agent link
//! ([`sidecore_wire::agents`]). Non-blocking, driven by the server's `poll`
//! loop: the server asks for the descriptors to watch, hands back readiness,
//! and gets [`LinkEvent`]s. Of two agents, the one whose host name sorts
//! first dials (and redials every [`REDIAL`] while the link is down); the
//! other accepts.
//!
//! A link comes up only when the other side's hello names a host of the
//! placement, its certificate chains to the cluster's authority (rustls
//! checks this during the handshake) and names that host (checked here), and
//! — when this side dialed — the host is the one it dialed. Anything else is
//! refused, with the reason, and the connection closed. A link that is silent
//! for [`SILENCE`] is taken down; each side sends a heartbeat every [`BEAT`].

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use rustls::{ClientConnection, Connection, ServerConnection};
use sidecore_wire::{AgentHello, AgentLink, Message};

use crate::tls::{Tls, TlsError, names, server_name};

/// How often a down link is dialed again.
pub const REDIAL: Duration = Duration::from_millis(200);
/// How often a heartbeat goes out on a quiet link.
pub const BEAT: Duration = Duration::from_millis(100);
/// A link this long without a frame is down.
pub const SILENCE: Duration = Duration::from_secs(1);
/// A connection that has not proved who it is this long after it opened is closed.
pub const HANDSHAKE: Duration = Duration::from_secs(3);
/// How long one dial may block the loop.
const DIAL_TIMEOUT: Duration = Duration::from_millis(100);

/// What happened on the links.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    /// The agent of this host is linked.
    Up(String),
    /// The link to this host's agent is down, and why.
    Down(String, String),
    /// A message from this host's agent.
    Msg(String, Message),
    /// A connection was refused: who (its address) and why.
    Refused(String, String),
}

struct Conn {
    sock: TcpStream,
    tls: Connection,
    link: AgentLink,
    addr: SocketAddr,
    /// The host dialed (outgoing connections).
    dialed: Option<String>,
    /// The proved host, once its hello was checked.
    host: Option<String>,
    opened: Instant,
    last_rx: Instant,
    last_tx: Instant,
    /// Closed, with the reason (the event is sent once).
    closed: Option<String>,
    /// Closed without an event (replaced by a newer connection).
    silent: bool,
}

/// All links of one agent.
pub struct Links {
    me: String,
    known: BTreeSet<String>,
    tls: Tls,
    listener: TcpListener,
    dial: Vec<(String, SocketAddr, Instant)>,
    /// The addresses given when bound (`--peer`): used for hosts the
    /// placement gives no agent address.
    given: Vec<(String, SocketAddr)>,
    conns: Vec<Conn>,
    /// Connections refused so far.
    pub refused: u64,
}

impl Links {
    /// Listens on `listen`; dials the `peers` (host, address) whose names
    /// sort after `me`. `known` are the placement's hosts.
    pub fn bind(
        me: &str,
        known: BTreeSet<String>,
        tls: Tls,
        listen: SocketAddr,
        peers: &[(String, SocketAddr)],
    ) -> std::io::Result<Links> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let now = Instant::now();
        Ok(Links {
            me: me.to_string(),
            known,
            tls,
            listener,
            dial: peers
                .iter()
                .filter(|(h, _)| h.as_str() > me)
                .map(|(h, a)| (h.clone(), *a, now))
                .collect(),
            given: peers.to_vec(),
            conns: Vec::new(),
            refused: 0,
        })
    }

    /// Follows a new placement: `known` are its hosts, `agents` where their
    /// agents listen (a host it gives none keeps the address given when
    /// bound). A connection to a host no longer known, or dialed at an
    /// address that is no longer its agent's, is closed (a link that was up
    /// goes down with that reason); new addresses are dialed at once.
    pub fn set_peers(
        &mut self,
        known: BTreeSet<String>,
        agents: &std::collections::BTreeMap<String, SocketAddr>,
        now: Instant,
    ) {
        let addr_of = |h: &String| {
            agents
                .get(h)
                .or_else(|| self.given.iter().find(|g| g.0 == *h).map(|g| &g.1))
                .copied()
        };
        let dial: Vec<(String, SocketAddr, Instant)> = known
            .iter()
            .filter(|h| h.as_str() > self.me.as_str())
            .filter_map(|h| addr_of(h).map(|a| (h.clone(), a)))
            .map(|(h, a)| {
                let due = self
                    .dial
                    .iter()
                    .find(|d| d.0 == h && d.1 == a)
                    .map_or(now, |d| d.2);
                (h, a, due)
            })
            .collect();
        for c in &mut self.conns {
            let Some(h) = c.host.clone().or_else(|| c.dialed.clone()) else {
                continue;
            };
            if c.closed.is_some() {
                continue;
            }
            if !known.contains(&h) {
                c.closed = Some(format!("host {h} is no longer in the placement"));
            } else if c.dialed.is_some()
                && let Some(a) = dial.iter().find(|d| d.0 == h).map(|d| d.1)
                && a != c.addr
            {
                c.closed = Some(format!("host {h}'s agent is now at {a}"));
            }
        }
        self.known = known;
        self.dial = dial;
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The descriptors to poll: the listener, then each connection.
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let mut v = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        for c in &self.conns {
            let mut f = PollFlags::POLLIN;
            if c.tls.wants_write() {
                f |= PollFlags::POLLOUT;
            }
            v.push(PollFd::new(c.sock.as_fd(), f));
        }
        v
    }

    /// The descriptor at `i` of the last [`Links::poll_fds`] is ready.
    pub fn ready(&mut self, i: usize, now: Instant, out: &mut Vec<LinkEvent>) {
        if i == 0 {
            self.accept(now);
        } else if let Some(c) = self.conns.get_mut(i - 1) {
            let was_up = c.host.is_some();
            pump(c, &self.me, &self.known, now, out);
            // A newer connection to the same host replaces the older one,
            // quietly: the link stays up.
            if let (false, Some(h)) = (was_up, c.host.clone()) {
                for (k, o) in self.conns.iter_mut().enumerate() {
                    if k != i - 1 && o.host.as_deref() == Some(h.as_str()) {
                        o.silent = true;
                        o.closed = Some("replaced by a newer connection".into());
                    }
                }
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        while let Ok((sock, addr)) = self.listener.accept() {
            let Ok(tls) = ServerConnection::new(Arc::clone(&self.tls.server)) else {
                continue;
            };
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = sock.set_nodelay(true);
            self.conns
                .push(conn(sock, tls.into(), addr, None, &self.me, now));
        }
    }

    /// Dials what is due, sends heartbeats, times out the silent and the
    /// unproved, and forgets the closed (reporting each once).
    pub fn maintain(&mut self, now: Instant, out: &mut Vec<LinkEvent>) {
        let up: BTreeSet<String> = self
            .conns
            .iter()
            .filter(|c| c.closed.is_none())
            .filter_map(|c| c.host.clone().or_else(|| c.dialed.clone()))
            .collect();
        for d in &mut self.dial {
            if up.contains(&d.0) || now < d.2 {
                continue;
            }
            d.2 = now + REDIAL;
            let Ok(sock) = TcpStream::connect_timeout(&d.1, DIAL_TIMEOUT) else {
                continue;
            };
            let (Ok(name), true) = (server_name(&d.0), sock.set_nonblocking(true).is_ok()) else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let Ok(tls) = ClientConnection::new(Arc::clone(&self.tls.client), name) else {
                continue;
            };
            let mut c = conn(sock, tls.into(), d.1, Some(d.0.clone()), &self.me, now);
            flush(&mut c);
            self.conns.push(c);
        }
        for c in &mut self.conns {
            if c.closed.is_some() {
                continue;
            }
            if c.host.is_none() && now.duration_since(c.opened) > HANDSHAKE {
                c.closed = Some("it did not prove which host it is in time".into());
            } else if c.host.is_some() && now.duration_since(c.last_rx) > SILENCE {
                c.closed = Some(format!("silent for {SILENCE:?}"));
            } else if c.host.is_some() && now.duration_since(c.last_tx) >= BEAT {
                let _ = c.link.send(&Message::AgentBeat);
                c.last_tx = now;
                flush(c);
            }
        }
        let mut kept = Vec::with_capacity(self.conns.len());
        for c in self.conns.drain(..) {
            match (&c.closed, &c.host) {
                (None, _) => kept.push(c),
                _ if c.silent => {}
                (Some(why), Some(h)) => out.push(LinkEvent::Down(h.clone(), why.clone())),
                (Some(why), None) => {
                    self.refused += 1;
                    let who = c
                        .dialed
                        .clone()
                        .map_or_else(|| c.addr.to_string(), |h| format!("{h} ({})", c.addr));
                    out.push(LinkEvent::Refused(who, why.clone()));
                }
            }
        }
        self.conns = kept;
    }

    /// Sends `msg` to the agent of `host`; false if it is not linked.
    pub fn send(&mut self, host: &str, msg: &Message, now: Instant) -> bool {
        let Some(c) = self
            .conns
            .iter_mut()
            .find(|c| c.closed.is_none() && c.host.as_deref() == Some(host))
        else {
            return false;
        };
        if c.link.send(msg).is_err() {
            return false;
        }
        c.last_tx = now;
        flush(c);
        c.closed.is_none()
    }
}

fn conn(
    sock: TcpStream,
    mut tls: Connection,
    addr: SocketAddr,
    dialed: Option<String>,
    me: &str,
    now: Instant,
) -> Conn {
    tls.set_buffer_limit(None);
    Conn {
        sock,
        tls,
        link: AgentLink::new(
            dialed.clone().unwrap_or_else(|| addr.to_string()),
            AgentHello {
                host: me.to_string(),
                software: sidecore_wire::SOFTWARE_VERSION.to_string(),
            },
        ),
        addr,
        dialed,
        host: None,
        opened: now,
        last_rx: now,
        last_tx: now,
        closed: None,
        silent: false,
    }
}

/// Moves queued frames into TLS and TLS records onto the socket.
fn flush(c: &mut Conn) {
    let bytes = c.link.take_output();
    if !bytes.is_empty() && c.tls.writer().write_all(&bytes).is_err() {
        c.closed = Some("TLS refused to take more data".into());
        return;
    }
    while c.tls.wants_write() {
        match c.tls.write_tls(&mut c.sock) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => {
                c.closed = Some(format!("write: {e}"));
                break;
            }
        }
    }
}

/// Reads what arrived, checks the hello, and reports messages.
fn pump(c: &mut Conn, me: &str, known: &BTreeSet<String>, now: Instant, out: &mut Vec<LinkEvent>) {
    if c.closed.is_some() {
        return;
    }
    // Read a TLS chunk, decrypt it, and move its plaintext out before the
    // next: rustls holds a bounded plaintext buffer and refuses to read
    // more while it is full.
    let mut buf = [0u8; 16 * 1024];
    'read: loop {
        match c.tls.read_tls(&mut c.sock) {
            Ok(0) => {
                c.closed = Some("the other agent closed the connection".into());
                break;
            }
            Ok(_) => {
                if let Err(e) = c.tls.process_new_packets() {
                    c.closed = Some(format!("TLS: {e}"));
                    // Tell the other side why (the alert), best effort.
                    let _ = c.tls.write_tls(&mut c.sock);
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => {
                c.closed = Some(format!("read: {e}"));
                break;
            }
        }
        loop {
            match c.tls.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    c.last_rx = now;
                    c.link.handle_input(&buf[..n]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    c.closed = Some(format!("TLS: {e}"));
                    break 'read;
                }
            }
        }
    }
    loop {
        match c.link.poll() {
            Ok(None) => break,
            Ok(Some(Message::AgentHello(h))) => match prove(c, &h, me, known) {
                Ok(()) => {
                    c.host = Some(h.host.clone());
                    out.push(LinkEvent::Up(h.host));
                }
                Err(why) => {
                    c.closed = Some(why.to_string());
                    break;
                }
            },
            Ok(Some(Message::AgentBeat)) => {}
            Ok(Some(m)) => match &c.host {
                Some(h) => out.push(LinkEvent::Msg(h.clone(), m)),
                None => {
                    c.closed = Some("sent traffic before its hello".into());
                    break;
                }
            },
            Err(e) => {
                c.closed = Some(e.to_string());
                break;
            }
        }
    }
    flush(c);
}

/// Why a peer's hello was not believed (the link is closed with this reason).
#[derive(Debug, thiserror::Error)]
enum Unproved {
    #[error("it says it is host `{0}`, which is this agent's own name")]
    OwnName(String),
    #[error("it says it is host `{0}`, which is not in the placement")]
    NotPlaced(String),
    #[error("dialed host `{dialed}` but it says it is `{host}`")]
    NotDialed { dialed: String, host: String },
    #[error("it presented no certificate")]
    NoCertificate,
    #[error("it says it is host `{host}`, but {reason}")]
    Certificate {
        host: String,
        #[source]
        reason: TlsError,
    },
}

/// Whether the hello's host is what the certificate proves.
fn prove(c: &Conn, h: &AgentHello, me: &str, known: &BTreeSet<String>) -> Result<(), Unproved> {
    if h.host == me {
        return Err(Unproved::OwnName(me.to_string()));
    }
    if !known.contains(&h.host) {
        return Err(Unproved::NotPlaced(h.host.clone()));
    }
    if let Some(d) = &c.dialed
        && *d != h.host
    {
        return Err(Unproved::NotDialed {
            dialed: d.clone(),
            host: h.host.clone(),
        });
    }
    let cert = c
        .tls
        .peer_certificates()
        .and_then(|v| v.first())
        .ok_or(Unproved::NoCertificate)?;
    names(cert, &h.host).map_err(|reason| Unproved::Certificate {
        host: h.host.clone(),
        reason,
    })
}
