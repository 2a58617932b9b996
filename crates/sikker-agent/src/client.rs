//! The library a process links to talk through its agent: attach, send to
//! `(service, process, domain)`, receive with the sender's verified identity,
//! and answer with a one-time permission. The process never states who it is;
//! the agent works it out from the socket.
//!
//! [`Client::send`] waits for the agent's verdict on each message.
//! [`Client::post`] does not: it keeps up to [`POST_WINDOW`] messages
//! unanswered, files the verdicts as they come (the agent answers a run of
//! accepted messages with one [`FromAgent::Oks`], delayed a little so that it
//! rarely wakes the sender) and [`Client::flush`] asks for the rest and hands
//! back the refused ones by request number, so a sender streams at the
//! agent's pace instead of one round trip per message.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
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

/// How many posted messages may wait for their verdicts at once; a
/// [`Client::post`] beyond it first reads verdicts. It keeps the answers
/// within what the socket holds.
pub const POST_WINDOW: usize = 128;

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
    /// Requests sent and not answered yet.
    unanswered: BTreeSet<u64>,
    /// Requests refused and not handed back yet, by number.
    refused: BTreeMap<u64, Denied>,
    /// Answers that matched no request of this client (a denial of bytes
    /// that were not a request, say).
    stray: Vec<FromAgent>,
    /// One receive buffer, reused.
    buf: Vec<u8>,
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
        let mut c = Client::new(fd);
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
        // SAFETY: the caller hands over an open descriptor it owns.
        Client::new(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn new(fd: OwnedFd) -> Client {
        Client {
            fd,
            identity: None,
            inbox: VecDeque::new(),
            next_id: 1,
            unanswered: BTreeSet::new(),
            refused: BTreeMap::new(),
            stray: Vec::new(),
            buf: vec![0u8; MAX_MESSAGE_BYTES],
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

    /// Sends `payload` to `to` without waiting for the agent's verdict and
    /// returns the request's number. At most [`POST_WINDOW`] messages wait
    /// for verdicts; beyond that it reads verdicts first. A refusal comes back
    /// from [`Client::flush`] (or [`Client::take_refused`]) by this number.
    pub fn post(&mut self, to: &Dest, payload: &[u8]) -> Result<u64, ClientError> {
        while self.unanswered.len() >= POST_WINDOW {
            let m = self.next(ANSWER_TIMEOUT)?;
            self.absorb(m)?;
        }
        self.submit(
            ToAgent::Send {
                to: to.clone(),
                payload: payload.to_vec(),
                otp_for: None,
                claim: None,
            },
            true,
        )
    }

    /// Waits up to `timeout` until every posted message has its verdict, and
    /// hands back the refused ones (request number and reason), oldest first.
    pub fn flush(&mut self, timeout: Duration) -> Result<Vec<(u64, Denied)>, ClientError> {
        let deadline = Instant::now() + timeout;
        if !self.unanswered.is_empty() {
            // The agent may be holding acceptances back: ask for them now.
            self.submit(ToAgent::Sync, false)?;
        }
        while !self.unanswered.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout(timeout));
            }
            let m = self.next(left)?;
            self.absorb(m)?;
        }
        Ok(self.take_refused())
    }

    /// The refusals of posted messages received so far, oldest first.
    pub fn take_refused(&mut self) -> Vec<(u64, Denied)> {
        std::mem::take(&mut self.refused).into_iter().collect()
    }

    /// How many posted messages still wait for their verdicts.
    pub fn unanswered(&self) -> usize {
        self.unanswered.len()
    }

    /// The next message delivered to this process, waiting up to `timeout`.
    /// Verdicts that arrive meanwhile are filed.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Delivery>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self.inbox.pop_front() {
                return Ok(Some(d));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Ok(m) => self.absorb(m)?,
                Err(ClientError::Timeout(_)) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a request and waits for its answer, keeping deliveries and
    /// other verdicts that arrive meanwhile.
    fn request(&mut self, m: &ToAgent) -> Result<(), ClientError> {
        let id = self.submit(m.clone(), false)?;
        while self.unanswered.contains(&id) {
            let m = self.next(ANSWER_TIMEOUT)?;
            self.absorb(m)?;
        }
        match self.refused.remove(&id) {
            Some(why) => Err(ClientError::Denied(why)),
            None => Ok(()),
        }
    }

    /// Numbers and sends a request; its answer is awaited from then on
    /// (`lazy`: not at once, see [`Request::lazy`]).
    fn submit(&mut self, body: ToAgent, lazy: bool) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = proto::encode(&Request { id, body, lazy });
        sendmsg::<()>(
            self.fd.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| ClientError::Io(e.into()))?;
        self.unanswered.insert(id);
        Ok(id)
    }

    /// Files one message from the agent: a verdict against its request, a
    /// delivery in the inbox, an answer to nothing among the strays.
    fn absorb(&mut self, m: FromAgent) -> Result<(), ClientError> {
        match m {
            FromAgent::Ok(n) if self.unanswered.remove(&n) => {}
            FromAgent::Oks { first, last } if self.unanswered.contains(&first) => {
                let run: Vec<u64> = self.unanswered.range(first..=last).copied().collect();
                for n in run {
                    self.unanswered.remove(&n);
                }
            }
            FromAgent::Denied { id: Some(n), why } if self.unanswered.remove(&n) => {
                self.refused.insert(n, why);
            }
            m @ (FromAgent::Ok(_) | FromAgent::Oks { .. } | FromAgent::Denied { .. }) => {
                self.stray.push(m);
            }
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
        Ok(())
    }

    /// The next message from the agent: a non-blocking read first, and a
    /// `poll` only when nothing is waiting (one system call per message
    /// while a stream of verdicts or deliveries is flowing).
    fn next(&mut self, timeout: Duration) -> Result<FromAgent, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut iov = [IoSliceMut::new(&mut self.buf)];
            match recvmsg::<()>(self.fd.as_raw_fd(), &mut iov, None, MsgFlags::MSG_DONTWAIT) {
                Ok(r) if r.bytes == 0 => return Err(ClientError::Closed),
                Ok(r) => {
                    let n = r.bytes;
                    return proto::decode(&self.buf[..n])
                        .map_err(|e| ClientError::Protocol(e.to_string()));
                }
                Err(nix::Error::EAGAIN | nix::Error::EINTR) => {}
                Err(e) => return Err(ClientError::Io(e.into())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout(timeout));
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::Error::EINTR) => {}
                Err(e) => return Err(ClientError::Io(e.into())),
            }
        }
    }
}
