//! The library a process links to talk through its agent: attach, send to
//! `(service, process, domain)`, receive with the sender's verified identity,
//! and answer with a one-time permission. The process never states who it is;
//! the agent works it out from the socket.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, recvmsg, sendmsg, socket,
};

use crate::proto::{self, Denied, Dest, FromAgent, Identity, MAX_MESSAGE_BYTES, Request, ToAgent};

/// How long a client waits for its agent's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("agent socket {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent refused to attach this process: {0}")]
    Refused(String),
    #[error("denied: {0}")]
    Denied(Denied),
    #[error("the agent closed the connection")]
    Closed,
    #[error("no answer from the agent within {0:?}")]
    Timeout(Duration),
    #[error("agent I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the agent sent something unexpected: {0}")]
    Protocol(String),
}

/// A message delivered to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Who sent it, as the sender's agent derived it.
    pub from: Identity,
    pub domain: String,
    pub payload: Vec<u8>,
    /// A one-time permission to answer with.
    pub otp: Option<u32>,
    /// On an answer: who asked for the permission it used.
    pub requester: Option<Identity>,
}

/// An attached connection to the agent.
pub struct Client {
    fd: OwnedFd,
    identity: Option<Identity>,
    inbox: VecDeque<Delivery>,
    next_id: u64,
    /// Answers that matched no request of this client (a denial of bytes
    /// that were not a request, say).
    stray: Vec<FromAgent>,
}

impl Client {
    /// Connects to the agent at `path` and waits to be attested.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        Self::connect_with(path, SockFlag::SOCK_CLOEXEC)
    }

    /// As [`Client::connect`], with the socket inheritable by a child (only
    /// useful to show that a passed-along socket lends no identity).
    pub fn connect_inheritable(path: &Path) -> Result<Client, ClientError> {
        Self::connect_with(path, SockFlag::empty())
    }

    fn connect_with(path: &Path, flags: SockFlag) -> Result<Client, ClientError> {
        let err = |e: nix::Error| ClientError::Connect {
            path: path.display().to_string(),
            source: e.into(),
        };
        let fd = socket(AddressFamily::Unix, SockType::SeqPacket, flags, None).map_err(err)?;
        connect(fd.as_raw_fd(), &UnixAddr::new(path).map_err(err)?).map_err(err)?;
        let mut c = Client {
            fd,
            identity: None,
            inbox: VecDeque::new(),
            next_id: 1,
            stray: Vec::new(),
        };
        match c.next(ANSWER_TIMEOUT)? {
            FromAgent::Attached(id) => {
                c.identity = Some(id);
                Ok(c)
            }
            FromAgent::Refused(why) => Err(ClientError::Refused(why)),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// A client on an already attached socket (inherited from its parent).
    ///
    /// # Safety
    /// `fd` must be an open socket descriptor that nothing else owns.
    pub unsafe fn from_raw_fd(fd: RawFd) -> Client {
        Client {
            // SAFETY: the caller hands over an open descriptor it owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            identity: None,
            inbox: VecDeque::new(),
            next_id: 1,
            stray: Vec::new(),
        }
    }

    /// The descriptor (for passing it on).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Answers that matched none of this client's requests.
    pub fn stray(&self) -> &[FromAgent] {
        &self.stray
    }

    /// Who the agent attested this process as.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Asks for the messages sent to this identity.
    pub fn listen(&mut self) -> Result<(), ClientError> {
        self.request(&ToAgent::Listen)
    }

    /// Sends `payload` to `to`.
    pub fn send(&mut self, to: &Dest, payload: &[u8]) -> Result<(), ClientError> {
        self.request(&ToAgent::Send {
            to: to.clone(),
            payload: payload.to_vec(),
            otp_for: None,
            claim: None,
        })
    }

    /// Sends with every option: a one-time permission for the recipient to
    /// answer `otp_for`, and a claimed source (refused unless it is true).
    pub fn send_with(
        &mut self,
        to: &Dest,
        payload: &[u8],
        otp_for: Option<&Dest>,
        claim: Option<&Identity>,
    ) -> Result<(), ClientError> {
        self.request(&ToAgent::Send {
            to: to.clone(),
            payload: payload.to_vec(),
            otp_for: otp_for.cloned(),
            claim: claim.cloned(),
        })
    }

    /// Answers with the one-time permission `otp`.
    pub fn reply(&mut self, otp: u32, payload: &[u8]) -> Result<(), ClientError> {
        self.request(&ToAgent::Reply {
            otp,
            payload: payload.to_vec(),
        })
    }

    /// The next message delivered to this process, waiting up to `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Delivery>, ClientError> {
        if let Some(d) = self.inbox.pop_front() {
            return Ok(Some(d));
        }
        match self.next(timeout) {
            Ok(FromAgent::Deliver {
                from,
                domain,
                payload,
                otp,
                requester,
            }) => Ok(Some(Delivery {
                from,
                domain,
                payload,
                otp,
                requester,
            })),
            Ok(other) => Err(ClientError::Protocol(format!("{other:?}"))),
            Err(ClientError::Timeout(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends a request and waits for its answer, keeping deliveries that
    /// arrive meanwhile.
    fn request(&mut self, m: &ToAgent) -> Result<(), ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = proto::encode(&Request {
            id,
            body: m.clone(),
        });
        sendmsg::<()>(
            self.fd.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| ClientError::Io(e.into()))?;
        loop {
            match self.next(ANSWER_TIMEOUT)? {
                FromAgent::Ok(n) if n == id => return Ok(()),
                FromAgent::Denied { id: Some(n), why } if n == id => {
                    return Err(ClientError::Denied(why));
                }
                m @ (FromAgent::Ok(_) | FromAgent::Denied { .. }) => self.stray.push(m),
                FromAgent::Deliver {
                    from,
                    domain,
                    payload,
                    otp,
                    requester,
                } => self.inbox.push_back(Delivery {
                    from,
                    domain,
                    payload,
                    otp,
                    requester,
                }),
                other => return Err(ClientError::Protocol(format!("{other:?}"))),
            }
        }
    }

    /// The next message from the agent.
    fn next(&mut self, timeout: Duration) -> Result<FromAgent, ClientError> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) if Instant::now() >= deadline => return Err(ClientError::Timeout(timeout)),
                Ok(0) | Err(nix::Error::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(ClientError::Io(e.into())),
            }
            let mut iov = [IoSliceMut::new(&mut buf)];
            let n = recvmsg::<()>(self.fd.as_raw_fd(), &mut iov, None, MsgFlags::empty())
                .map_err(|e| ClientError::Io(e.into()))?
                .bytes;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            return proto::decode(&buf[..n]).map_err(|e| ClientError::Protocol(e.to_string()));
        }
    }
}
