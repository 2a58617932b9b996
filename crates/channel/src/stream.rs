//! The stream channel to a peer node over TCP.
//!
//! A connection opens with a hello (`SCCHAN` magic, protocol version, channel
//! name), then carries length-prefixed frames (`u32` little-endian length, then
//! the bytes). Reliability follows the channel's delivery property: a reliable
//! sender buffers and writes everything (TCP applies the back-pressure); an
//! unreliable sender never waits: when the kernel send buffer and a bounded
//! local buffer are both full it drops the message and counts it.
//!
//! **Ends and losses.** A sender that goes away on purpose (dropped) writes an
//! end-of-stream mark ([`END_OF_STREAM`], in place of a frame length) before it
//! closes, and its receiver then reports the channel closed. A connection that
//! ends without the mark (the peer was killed, or its socket shut down because
//! it was declared dead) is *lost*: for [`LOST_GRACE`] each end waits as if
//! its peer were only slow — the receiver has nothing to read, a reliable
//! sender is full (an unreliable one drops and counts) — so that a
//! re-placement can give it a new channel in that time
//! (`sidecore_runtime::relocate`); after it, both report the channel closed.
//!
//! The wire parsing ([`parse_hello`], [`FrameDecoder`]) is sans-IO so it can be
//! fuzzed; errors name the peer and what was wrong.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use sidecore_types::Delivery;

use crate::sender::SendOutcome;

/// First bytes of every stream connection.
pub const MAGIC: &[u8; 6] = b"SCCHAN";
/// Version of the stream protocol (2: the end-of-stream mark).
pub const VERSION: u16 = 2;
/// Written in place of a frame length by a sender that closes on purpose.
pub const END_OF_STREAM: u32 = u32::MAX;
/// How long a lost connection's ends wait for a re-placement before they
/// report the channel closed: as long as the origin's lease deadline, past
/// any Orion monitor's detection deadline.
pub const LOST_GRACE: Duration = Duration::from_secs(5);
/// How long a closing sender may take to write what it still holds and the
/// end-of-stream mark.
const CLOSE_TIMEOUT: Duration = Duration::from_millis(200);
/// Default largest frame a receiver accepts.
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;
/// Longest channel name in a hello.
pub const MAX_NAME: usize = 255;
/// Buffer a stream end starts with (it grows to the largest burst).
const INITIAL_BUFFER_BYTES: usize = 64 * 1024;
/// Consumed bytes a decoder lets pile up at the front before it moves the
/// rest down.
const COMPACT_AFTER_BYTES: usize = 32 * 1024;

/// What went wrong on a stream channel, with the peer it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("peer {peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: io::Error,
    },
    #[error("peer {peer}: {problem}")]
    Protocol { peer: String, problem: WireError },
    #[error("peer {peer} closed the channel")]
    Closed { peer: String },
    #[error("peer {peer}: message of {len} bytes exceeds the {max}-byte frame limit")]
    TooLarge {
        peer: String,
        len: usize,
        max: usize,
    },
}

/// A malformed wire header, independent of any socket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a sidecore channel (expected magic {expected:?}, got {got:?})")]
    BadMagic { expected: String, got: String },
    #[error("unsupported stream protocol version {got} (this side speaks {VERSION})")]
    Version { got: u16 },
    #[error("hello names a channel of {len} bytes (at most {MAX_NAME})")]
    NameTooLong { len: usize },
    #[error("channel name is not UTF-8")]
    NameNotUtf8,
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge { len: usize, max: usize },
    #[error("expected channel `{expected}`, peer opened `{got}`")]
    WrongChannel { expected: String, got: String },
}

/// Encodes a hello for `channel`.
pub fn encode_hello(channel: &str) -> Vec<u8> {
    let name = channel.as_bytes();
    let name = &name[..name.len().min(MAX_NAME)];
    let mut out = Vec::with_capacity(9 + name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out
}

/// Parses a hello from the start of `buf`: `Ok(None)` if more bytes are needed,
/// otherwise the channel name and the number of bytes consumed.
pub fn parse_hello(buf: &[u8]) -> Result<Option<(String, usize)>, WireError> {
    let have = buf.len().min(MAGIC.len());
    if buf[..have] != MAGIC[..have] {
        return Err(WireError::BadMagic {
            expected: String::from_utf8_lossy(MAGIC).into_owned(),
            got: String::from_utf8_lossy(&buf[..have]).into_owned(),
        });
    }
    if buf.len() < 9 {
        return Ok(None);
    }
    let version = u16::from_le_bytes([buf[6], buf[7]]);
    if version != VERSION {
        return Err(WireError::Version { got: version });
    }
    let len = buf[8] as usize;
    if buf.len() < 9 + len {
        return Ok(None);
    }
    let name = std::str::from_utf8(&buf[9..9 + len]).map_err(|_| WireError::NameNotUtf8)?;
    Ok(Some((name.to_string(), 9 + len)))
}

/// Splits a byte stream into frames. Sans-IO: feed bytes, take frames.
#[derive(Debug)]
pub struct FrameDecoder {
    /// `buf[start..end]` is received and not yet returned; `buf[end..]` is room
    /// already zeroed once, reused by [`spare`](Self::spare) without zeroing again.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: usize,
    /// The end-of-stream mark was read.
    ended: bool,
}

impl FrameDecoder {
    /// A decoder refusing frames over `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            buf: Vec::with_capacity(INITIAL_BUFFER_BYTES),
            start: 0,
            end: 0,
            max_frame,
            ended: false,
        }
    }

    /// Whether the sender's end-of-stream mark was read: no frame follows.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.spare(bytes.len()).copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Space to read into directly: returns a slice of `want` bytes to fill; call
    /// [`commit`](Self::commit) with how much was filled.
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        self.compact();
        if self.buf.len() < self.end + want {
            self.buf.resize(self.end + want, 0);
        }
        &mut self.buf[self.end..self.end + want]
    }

    /// Keeps `filled` bytes of the last [`spare`](Self::spare) slice of `want`.
    pub fn commit(&mut self, want: usize, filled: usize) {
        self.end += filled.min(want);
    }

    fn compact(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > COMPACT_AFTER_BYTES {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Whether a complete frame is buffered (so [`next_frame`](Self::next_frame)
    /// returns it without more bytes).
    pub fn has_frame(&self) -> bool {
        let b = &self.buf[self.start..self.end];
        if self.ended || b.len() < 4 {
            return false;
        }
        let mark = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
        mark != END_OF_STREAM && b.len() >= 4 + mark as usize
    }

    /// The next complete frame, if one is buffered. After the end-of-stream
    /// mark, none: what follows it is ignored.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, WireError> {
        let avail = &self.buf[self.start..self.end];
        if self.ended || avail.len() < 4 {
            return Ok(None);
        }
        let mark = u32::from_le_bytes(avail[..4].try_into().expect("4 bytes"));
        if mark == END_OF_STREAM {
            self.ended = true;
            self.start = self.end;
            return Ok(None);
        }
        let len = mark as usize;
        if len > self.max_frame {
            return Err(WireError::FrameTooLarge {
                len,
                max: self.max_frame,
            });
        }
        if avail.len() < 4 + len {
            return Ok(None);
        }
        let from = self.start + 4;
        self.start = from + len;
        Ok(Some(&self.buf[from..from + len]))
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }
}

/// The sending end of a stream channel.
pub struct StreamSender {
    sock: TcpStream,
    peer: String,
    delivery: Delivery,
    /// `out[written..end]` is queued; `out[end..]` is room zeroed once and
    /// reused, so a message is written in place without clearing it first.
    out: Vec<u8>,
    end: usize,
    written: usize,
    max_buffer: usize,
    max_frame: usize,
    sent: u64,
    dropped: u64,
    /// When the connection was found lost (closed without our end mark).
    lost: Option<Instant>,
    grace: Duration,
}

impl StreamSender {
    /// Connects to a peer's stream listener and opens `channel`.
    pub fn connect(
        addr: impl ToSocketAddrs,
        channel: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<Self, StreamError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| StreamError::Io {
                peer: "?".into(),
                source: e,
            })?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(sock) => return Self::over(sock, channel, delivery),
                Err(e) => last = Some((a.to_string(), e)),
            }
        }
        let (peer, source) = last.unwrap_or_else(|| {
            (
                "?".into(),
                io::Error::new(ErrorKind::NotFound, "no address"),
            )
        });
        Err(StreamError::Io { peer, source })
    }

    /// Opens `channel` over an already connected socket. `TCP_NODELAY` is
    /// set: the sender already batches a turn's messages into one write, so
    /// Nagle's algorithm would only add a round trip's delay to each batch.
    pub fn over(sock: TcpStream, channel: &str, delivery: Delivery) -> Result<Self, StreamError> {
        let peer = sock
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let io_err = |source| StreamError::Io {
            peer: peer.clone(),
            source,
        };
        sock.set_nodelay(true).map_err(io_err)?;
        let mut s = StreamSender {
            sock,
            peer: peer.clone(),
            delivery,
            out: vec![0; INITIAL_BUFFER_BYTES],
            end: 0,
            written: 0,
            max_buffer: 4 << 20,
            max_frame: DEFAULT_MAX_FRAME,
            sent: 0,
            dropped: 0,
            lost: None,
            grace: LOST_GRACE,
        };
        let hello = encode_hello(channel);
        s.room(hello.len())[..hello.len()].copy_from_slice(&hello);
        s.end += hello.len();
        s.flush_blocking()?;
        if delivery == Delivery::Unreliable {
            s.sock.set_nonblocking(true).map_err(io_err)?;
        }
        Ok(s)
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Turns Nagle's algorithm back on (`false`) or off (`true`, the default);
    /// for measuring the choice.
    pub fn set_nodelay(&self, on: bool) -> Result<(), StreamError> {
        self.sock.set_nodelay(on).map_err(|source| StreamError::Io {
            peer: self.peer.clone(),
            source,
        })
    }

    /// Messages accepted and messages dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent, self.dropped)
    }

    /// Whether the connection was lost (see the module's "Ends and losses").
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    /// A second handle on the socket, to shut it down from another thread
    /// (a writer blocked on a frozen peer then fails and finds it lost).
    pub fn socket(&self) -> io::Result<TcpStream> {
        self.sock.try_clone()
    }

    /// Waits `grace` instead of [`LOST_GRACE`] after a loss.
    #[must_use]
    pub fn with_lost_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Within the grace period of the loss: `Ok`; after it: closed.
    fn while_lost(&mut self) -> Result<(), StreamError> {
        let at = *self.lost.get_or_insert_with(Instant::now);
        if at.elapsed() < self.grace {
            Ok(())
        } else {
            Err(StreamError::Closed {
                peer: self.peer.clone(),
            })
        }
    }

    /// At least `want` bytes of room after what is queued.
    fn room(&mut self, want: usize) -> &mut [u8] {
        if self.out.len() < self.end + want {
            self.out.resize(self.end + want, 0);
        }
        &mut self.out[self.end..]
    }

    /// Queues a copy of `msg`; it goes out on the next [`publish`](Self::publish)
    /// (or when the local buffer fills).
    pub fn send(&mut self, msg: &[u8]) -> Result<SendOutcome, StreamError> {
        if msg.len() > self.max_frame {
            return Err(StreamError::TooLarge {
                peer: self.peer.clone(),
                len: msg.len(),
                max: self.max_frame,
            });
        }
        self.send_with(msg.len(), |slot| {
            slot[..msg.len()].copy_from_slice(msg);
            msg.len()
        })
    }

    /// Queues a message written in place: `fill` gets room for up to `max`
    /// bytes at the end of the send buffer and returns how many it wrote. A
    /// `fill` that claims more than `max` is an error and nothing is queued.
    pub fn send_with(
        &mut self,
        max: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<SendOutcome, StreamError> {
        if self.lost.is_some() {
            self.while_lost()?;
            return Ok(self.not_sent_while_lost());
        }
        match self.queue(max, fill) {
            Err(StreamError::Closed { .. }) => {
                self.while_lost()?;
                Ok(self.not_sent_while_lost())
            }
            r => r,
        }
    }

    /// What a send comes to while the connection is lost: a reliable
    /// channel is full (the sender waits), an unreliable one drops and counts.
    fn not_sent_while_lost(&mut self) -> SendOutcome {
        match self.delivery {
            Delivery::Reliable => SendOutcome::Full,
            Delivery::Unreliable => {
                self.dropped += 1;
                SendOutcome::Dropped
            }
        }
    }

    fn queue(
        &mut self,
        max: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<SendOutcome, StreamError> {
        let max = max.min(self.max_frame);
        if self.end - self.written + 4 + max > self.max_buffer {
            match self.delivery {
                Delivery::Reliable => self.flush_blocking()?,
                Delivery::Unreliable => {
                    self.try_flush()?;
                    if self.end - self.written + 4 + max > self.max_buffer {
                        self.dropped += 1;
                        return Ok(SendOutcome::Dropped);
                    }
                }
            }
        }
        let room = self.room(4 + max);
        let n = fill(&mut room[4..4 + max]);
        if n > max {
            return Err(StreamError::TooLarge {
                peer: self.peer.clone(),
                len: n,
                max,
            });
        }
        let len = u32::try_from(n).expect("bounded by max_frame");
        room[..4].copy_from_slice(&len.to_le_bytes());
        self.end += 4 + n;
        self.sent += 1;
        Ok(SendOutcome::Sent)
    }

    /// Writes out what is queued: all of it for a reliable channel, as much as
    /// the socket takes without waiting for an unreliable one.
    pub fn publish(&mut self) -> Result<(), StreamError> {
        if self.lost.is_some() {
            return self.while_lost();
        }
        match self.delivery {
            Delivery::Reliable => self.flush_blocking(),
            Delivery::Unreliable => self.try_flush(),
        }
        .or_else(|e| match e {
            StreamError::Closed { .. } => self.while_lost(),
            e => Err(e),
        })
    }

    /// Writes what is still queued and the end-of-stream mark, for at most
    /// [`CLOSE_TIMEOUT`].
    fn close(&mut self) -> io::Result<()> {
        self.sock.set_nonblocking(false)?;
        self.sock.set_write_timeout(Some(CLOSE_TIMEOUT))?;
        self.room(4)[..4].copy_from_slice(&END_OF_STREAM.to_le_bytes());
        self.end += 4;
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        while self.written < self.end && Instant::now() < deadline {
            match self.sock.write(&self.out[self.written..self.end]) {
                Ok(0) => break,
                Ok(n) => self.written += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn flush_blocking(&mut self) -> Result<(), StreamError> {
        while self.written < self.end {
            match self.sock.write(&self.out[self.written..self.end]) {
                Ok(0) => {
                    return Err(StreamError::Closed {
                        peer: self.peer.clone(),
                    });
                }
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => return Err(self.io(e)),
            }
        }
        self.end = 0;
        self.written = 0;
        Ok(())
    }

    fn try_flush(&mut self) -> Result<(), StreamError> {
        while self.written < self.end {
            match self.sock.write(&self.out[self.written..self.end]) {
                Ok(0) => {
                    return Err(StreamError::Closed {
                        peer: self.peer.clone(),
                    });
                }
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(self.io(e)),
            }
        }
        if self.written == self.end {
            self.end = 0;
            self.written = 0;
        } else if self.written > self.max_buffer / 2 {
            self.out.copy_within(self.written..self.end, 0);
            self.end -= self.written;
            self.written = 0;
        }
        Ok(())
    }

    fn io(&self, source: io::Error) -> StreamError {
        if matches!(
            source.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
        ) {
            return StreamError::Closed {
                peer: self.peer.clone(),
            };
        }
        StreamError::Io {
            peer: self.peer.clone(),
            source,
        }
    }
}

impl Drop for StreamSender {
    /// Closing on purpose: the receiver reads the end mark and reports the
    /// channel closed at once (a lost connection has no one to tell).
    fn drop(&mut self) {
        if self.lost.is_none() {
            let _ = self.close();
        }
    }
}

/// Accepts stream channels from peers.
pub struct StreamListener {
    listener: TcpListener,
}

impl StreamListener {
    /// Listens on `addr` (use port 0 for an ephemeral port).
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Self> {
        Ok(StreamListener {
            listener: TcpListener::bind(addr)?,
        })
    }

    /// Accepts on a listener bound elsewhere (in another network namespace,
    /// say: the socket keeps the namespace it was made in).
    pub fn from_std(listener: TcpListener) -> Self {
        StreamListener { listener }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one connection and reads its hello, both within `timeout`.
    pub fn accept(&self, timeout: Duration) -> Result<StreamReceiver, StreamError> {
        let io_err = |source| StreamError::Io {
            peer: "listener".into(),
            source,
        };
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true).map_err(io_err)?;
        let accepted = loop {
            match self.listener.accept() {
                Ok(a) => break Ok(a),
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    break Err(io::Error::new(
                        ErrorKind::TimedOut,
                        format!("no peer connected within {} ms", timeout.as_millis()),
                    ));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.listener.set_nonblocking(false).map_err(io_err)?;
        let (sock, addr) = accepted.map_err(io_err)?;
        // An accepted socket does not inherit the listener's O_NONBLOCK on Linux,
        // but say so explicitly: the handshake reads with a timeout.
        sock.set_nonblocking(false).map_err(io_err)?;
        let left = deadline.saturating_duration_since(Instant::now());
        StreamReceiver::handshake(sock, addr.to_string(), left.max(Duration::from_millis(1)))
    }
}

/// The receiving end of a stream channel.
pub struct StreamReceiver {
    sock: TcpStream,
    peer: String,
    channel: String,
    decoder: FrameDecoder,
    eof: bool,
    /// When the connection was found lost (ended without the end mark).
    lost: Option<Instant>,
    grace: Duration,
}

impl StreamReceiver {
    fn handshake(sock: TcpStream, peer: String, timeout: Duration) -> Result<Self, StreamError> {
        let io_err = |source| StreamError::Io {
            peer: peer.clone(),
            source,
        };
        sock.set_read_timeout(Some(timeout)).map_err(io_err)?;
        let deadline = Instant::now() + timeout;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 512];
        let mut s = sock;
        let (channel, used) = loop {
            match parse_hello(&buf) {
                Ok(Some(done)) => break done,
                Ok(None) => {}
                Err(problem) => return Err(StreamError::Protocol { peer, problem }),
            }
            if Instant::now() > deadline {
                return Err(io_err(io::Error::new(
                    ErrorKind::TimedOut,
                    "no hello before the deadline",
                )));
            }
            match s.read(&mut chunk) {
                Ok(0) => return Err(StreamError::Closed { peer }),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e)),
            }
        };
        s.set_read_timeout(None).map_err(io_err)?;
        s.set_nonblocking(true).map_err(io_err)?;
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME);
        decoder.feed(&buf[used..]);
        Ok(StreamReceiver {
            sock: s,
            peer,
            channel,
            decoder,
            eof: false,
            lost: None,
            grace: LOST_GRACE,
        })
    }

    /// Waits `grace` instead of [`LOST_GRACE`] after a loss.
    #[must_use]
    pub fn with_lost_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whether the connection was lost (see the module's "Ends and losses").
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    /// A second handle on the socket, to shut it down from another thread.
    pub fn socket(&self) -> io::Result<TcpStream> {
        self.sock.try_clone()
    }

    /// The channel name the peer opened.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Checks that the peer opened the channel we expect.
    pub fn expect_channel(&self, name: &str) -> Result<(), StreamError> {
        if self.channel != name {
            return Err(StreamError::Protocol {
                peer: self.peer.clone(),
                problem: WireError::WrongChannel {
                    expected: name.to_string(),
                    got: self.channel.clone(),
                },
            });
        }
        Ok(())
    }

    /// The next message without waiting: `Ok(None)` if none has arrived,
    /// `Err(Closed)` once the peer has closed and everything is read (at once
    /// after its end mark; [`LOST_GRACE`] after a connection lost without it).
    pub fn try_recv(&mut self) -> Result<Option<&[u8]>, StreamError> {
        if !self.decoder.has_frame() {
            self.fill()?;
            if !self.decoder.has_frame() {
                return self.nothing_yet().map(|()| None);
            }
        }
        let peer = &self.peer;
        self.decoder
            .next_frame()
            .map_err(|problem| StreamError::Protocol {
                peer: peer.clone(),
                problem,
            })
    }

    /// No whole frame is buffered: a malformed header, the end mark, a lost
    /// connection, or simply nothing yet.
    fn nothing_yet(&mut self) -> Result<(), StreamError> {
        let peer = &self.peer;
        if let Err(problem) = self.decoder.next_frame() {
            return Err(StreamError::Protocol {
                peer: peer.clone(),
                problem,
            });
        }
        if self.decoder.ended() {
            return Err(StreamError::Closed { peer: peer.clone() });
        }
        if self.eof {
            let at = *self.lost.get_or_insert_with(Instant::now);
            if at.elapsed() >= self.grace {
                return Err(StreamError::Closed { peer: peer.clone() });
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for the next message, copying it out.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, StreamError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(Some(m.to_vec()));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn fill(&mut self) -> Result<(), StreamError> {
        if self.eof {
            return Ok(());
        }
        const WANT: usize = INITIAL_BUFFER_BYTES;
        let spare = self.decoder.spare(WANT);
        let r = self.sock.read(spare);
        match r {
            Ok(0) => {
                self.decoder.commit(WANT, 0);
                self.eof = true;
                Ok(())
            }
            Ok(n) => {
                self.decoder.commit(WANT, n);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                self.decoder.commit(WANT, 0);
                Ok(())
            }
            // Reset by the peer's kernel: it ended without its end mark.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                self.decoder.commit(WANT, 0);
                self.eof = true;
                Ok(())
            }
            Err(e) => {
                self.decoder.commit(WANT, 0);
                Err(StreamError::Io {
                    peer: self.peer.clone(),
                    source: e,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_bad_ones_are_named() {
        let h = encode_hello("records");
        assert_eq!(
            parse_hello(&h).unwrap(),
            Some(("records".to_string(), h.len()))
        );
        assert_eq!(parse_hello(&h[..4]).unwrap(), None);
        let e = parse_hello(b"GET / HTTP/1.1").unwrap_err();
        assert!(e.to_string().contains("not a sidecore channel"), "{e}");
        let mut v = h.clone();
        v[6] = 9;
        assert_eq!(parse_hello(&v).unwrap_err(), WireError::Version { got: 9 });
        let mut u = h;
        u[9] = 0xff;
        assert_eq!(parse_hello(&u).unwrap_err(), WireError::NameNotUtf8);
    }

    #[test]
    fn decoder_splits_frames_across_arbitrary_chunks() {
        let mut wire = Vec::new();
        let msgs: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; i as usize]).collect();
        for m in &msgs {
            wire.extend_from_slice(&(m.len() as u32).to_le_bytes());
            wire.extend_from_slice(m);
        }
        let mut d = FrameDecoder::new(1024);
        let mut got = Vec::new();
        for chunk in wire.chunks(7) {
            d.feed(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f.to_vec());
            }
        }
        assert_eq!(got, msgs);
    }

    #[test]
    fn the_end_mark_ends_the_stream_and_what_follows_is_ignored() {
        let mut d = FrameDecoder::new(1024);
        d.feed(&3u32.to_le_bytes());
        d.feed(b"abc");
        d.feed(&END_OF_STREAM.to_le_bytes()[..2]);
        assert_eq!(d.next_frame().unwrap(), Some(&b"abc"[..]));
        assert!(!d.has_frame() && !d.ended(), "half a mark is not one");
        d.feed(&END_OF_STREAM.to_le_bytes()[2..]);
        d.feed(&1u32.to_le_bytes());
        d.feed(b"x");
        assert!(!d.has_frame());
        assert_eq!(d.next_frame().unwrap(), None);
        assert!(d.ended());
        assert_eq!(d.next_frame().unwrap(), None, "nothing after the mark");
    }

    #[test]
    fn oversized_frame_is_refused() {
        let mut d = FrameDecoder::new(16);
        d.feed(&100u32.to_le_bytes());
        assert_eq!(
            d.next_frame().unwrap_err(),
            WireError::FrameTooLarge { len: 100, max: 16 }
        );
    }
}
