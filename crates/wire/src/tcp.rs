//! A thin blocking driver for the sans-IO sessions over a TCP socket: the one
//! place node-protocol bytes meet a socket. A [`Link`] is cheap to clone, so
//! one thread can wait for messages while another sends (the origin's status
//! mirror and its teardown, the peer's lease loop).

use std::io::{self, ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::msg::{Hello, Message, NodeInfo};
use crate::session::{Error, Grammar, Origin, OriginGrammar, Peer, PeerGrammar, Session};

/// Bytes read from the socket per `read` call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What waiting for a message produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Message(Message),
    /// The other side closed its end cleanly (where the grammar allows it).
    Closed,
    /// Nothing complete arrived in time; what did arrive is kept.
    TimedOut,
}

/// A node connection failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Wire(#[from] Error),
    #[error("{peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: io::Error,
    },
    #[error("{peer}: unreachable: cannot reach {addr}: {source}")]
    Unreachable {
        peer: String,
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("{peer}: no answer within {} ms while {state}", waited.as_millis())]
    TimedOut {
        peer: String,
        state: &'static str,
        waited: Duration,
    },
}

struct Inner<G> {
    session: Mutex<Session<G>>,
    /// The reading half and its buffer: one reader at a time.
    reader: Mutex<(TcpStream, Vec<u8>)>,
    /// The writing half: one writer at a time, so frames never interleave.
    writer: Mutex<TcpStream>,
    peer: String,
}

/// A node connection: a session driven over a TCP socket.
pub struct Link<G> {
    inner: Arc<Inner<G>>,
}

impl<G> Clone for Link<G> {
    fn clone(&self) -> Self {
        Link {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<G: Grammar> Link<G> {
    fn new(sock: TcpStream, session: Session<G>) -> Result<Self, LinkError> {
        let peer = session.peer().to_string();
        let io = |source| LinkError::Io {
            peer: peer.clone(),
            source,
        };
        sock.set_nodelay(true).map_err(io)?;
        let reader = sock.try_clone().map_err(io)?;
        let link = Link {
            inner: Arc::new(Inner {
                session: Mutex::new(session),
                reader: Mutex::new((reader, vec![0; READ_CHUNK_BYTES])),
                writer: Mutex::new(sock),
                peer: peer.clone(),
            }),
        };
        link.flush()?;
        Ok(link)
    }

    /// Who is at the other end.
    pub fn peer(&self) -> &str {
        &self.inner.peer
    }

    fn io(&self, source: io::Error) -> LinkError {
        LinkError::Io {
            peer: self.inner.peer.clone(),
            source,
        }
    }

    /// Writes whatever the session has queued.
    fn flush(&self) -> Result<(), LinkError> {
        let mut w = lock(&self.inner.writer);
        let bytes = lock(&self.inner.session).take_output();
        if !bytes.is_empty() {
            w.write_all(&bytes).map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// Sends a message, if the role may send it now.
    pub fn send(&self, msg: &Message) -> Result<(), LinkError> {
        let mut w = lock(&self.inner.writer);
        let bytes = {
            let mut s = lock(&self.inner.session);
            s.send(msg)?;
            s.take_output()
        };
        w.write_all(&bytes).map_err(|e| self.io(e))
    }

    /// Waits up to `timeout` (`None`: for ever) for the next message.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Received, LinkError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut guard = lock(&self.inner.reader);
        let (sock, buf) = &mut *guard;
        loop {
            let polled = lock(&self.inner.session).poll()?;
            if let Some(m) = polled {
                // A role may answer at once (a peer's welcome).
                self.flush()?;
                return Ok(Received::Message(m));
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(Received::TimedOut),
                },
            };
            sock.set_read_timeout(left).map_err(|e| self.io(e))?;
            match sock.read(buf) {
                Ok(0) => {
                    lock(&self.inner.session).handle_eof()?;
                    return Ok(Received::Closed);
                }
                Ok(n) => lock(&self.inner.session).handle_input(&buf[..n]),
                Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                    return Ok(Received::TimedOut);
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    /// Waits for the next message, which must arrive within `timeout`; a close
    /// or a timeout is an error naming what was awaited.
    pub fn expect(&self, timeout: Duration) -> Result<Message, LinkError> {
        match self.recv(Some(timeout))? {
            Received::Message(m) => Ok(m),
            Received::Closed => Err(LinkError::Wire(Error {
                peer: self.inner.peer.clone(),
                kind: crate::session::ErrorKind::Closed(self.state()),
            })),
            Received::TimedOut => Err(LinkError::TimedOut {
                peer: self.inner.peer.clone(),
                state: self.state(),
                waited: timeout,
            }),
        }
    }

    /// The role's state, in words.
    pub fn state(&self) -> &'static str {
        lock(&self.inner.session).state()
    }

    /// Closes this side's writing half: the other side reads the end.
    pub fn shutdown_write(&self) {
        let _ = lock(&self.inner.writer).shutdown(Shutdown::Write);
    }

    /// The socket's local address.
    pub fn local_addr(&self) -> Result<SocketAddr, LinkError> {
        lock(&self.inner.writer)
            .local_addr()
            .map_err(|e| self.io(e))
    }

    /// The other side's address.
    pub fn peer_addr(&self) -> Result<SocketAddr, LinkError> {
        lock(&self.inner.writer).peer_addr().map_err(|e| self.io(e))
    }
}

impl Link<OriginGrammar> {
    /// Connects to a peer's node port and sends the hello. `peer` labels the
    /// peer in errors.
    pub fn connect(
        addr: &str,
        peer: &str,
        hello: Hello,
        timeout: Duration,
    ) -> Result<Self, LinkError> {
        let io = |source| LinkError::Io {
            peer: peer.to_string(),
            source,
        };
        let sa = addr.to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
            io(io::Error::new(
                IoKind::NotFound,
                format!("{addr} resolves to nothing"),
            ))
        })?;
        let sock =
            TcpStream::connect_timeout(&sa, timeout).map_err(|source| LinkError::Unreachable {
                peer: peer.to_string(),
                addr: addr.to_string(),
                source,
            })?;
        sock.set_write_timeout(Some(timeout)).map_err(io)?;
        Link::new(sock, Origin::new(peer, hello))
    }

    /// Connects, exchanges hello and welcome, and returns what the peer said
    /// about itself (then closes: a probe).
    pub fn probe(
        addr: &str,
        peer: &str,
        hello: Hello,
        timeout: Duration,
    ) -> Result<NodeInfo, LinkError> {
        let link = Self::connect(addr, peer, hello, timeout)?;
        match link.expect(timeout)? {
            Message::Welcome(info) => Ok(info),
            Message::Error { error } => Err(LinkError::Io {
                peer: peer.to_string(),
                source: io::Error::other(format!("refused the hello: {error}")),
            }),
            // The grammar lets only a welcome or an error through first.
            other => unreachable!("origin grammar admitted `{}` first", other.kind()),
        }
    }
}

impl Link<PeerGrammar> {
    /// Serves an accepted connection as the peer `info`; the preamble goes out
    /// at once, the welcome as soon as the hello is read.
    pub fn accept(sock: TcpStream, info: NodeInfo) -> Result<Self, LinkError> {
        let label = match sock.peer_addr() {
            Ok(a) => format!("origin {a}"),
            Err(_) => "origin (address unknown)".to_string(),
        };
        Link::new(sock, Peer::new(label, info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

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
            origin: "t.1".into(),
            software: "0.1.0".into(),
        }
    }

    #[test]
    fn a_probe_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let link = Link::accept(s, info()).unwrap();
            assert_eq!(
                link.recv(Some(Duration::from_secs(5))).unwrap(),
                Received::Message(Message::Hello(hello()))
            );
            // The origin closes after the welcome.
            assert_eq!(
                link.recv(Some(Duration::from_secs(5))).unwrap(),
                Received::Closed
            );
        });
        let got = Link::probe(&addr, "node b", hello(), Duration::from_secs(5)).unwrap();
        assert_eq!(got, info());
        t.join().unwrap();
    }

    #[test]
    fn impostors_and_silence_are_named() {
        // Something that is not sidecore.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let e = Link::probe(&addr, "node web", hello(), Duration::from_secs(5)).unwrap_err();
        assert!(
            e.to_string().starts_with("node web: not a sidecore node"),
            "{e}"
        );
        t.join().unwrap();

        // Something that accepts and says nothing.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let e = Link::probe(&addr, "node mute", hello(), Duration::from_millis(200)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node mute: no answer within 200 ms while waiting for its welcome"
        );
        drop(l);

        // Nobody listening.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let e = Link::probe(&addr, "node gone", hello(), Duration::from_millis(300)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("node gone: unreachable: cannot reach {addr}: ")),
            "{e}"
        );
        assert!(matches!(e, LinkError::Unreachable { .. }), "{e}");
    }
}
