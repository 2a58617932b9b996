//! The PPE's side of one connection: the socket, the producing end of its
//! receive queue, the consuming end of its send queue, and the I/O the PPE
//! does for it — early demultiplexing into the receive queue (stopping, and
//! counting, when the queue is full), sending from the send queue or from a
//! registered blob, graceful and abortive close.
//!
//! A `PConn` is `Send`: it moves between PPEs when one is added or removed
//! (each receive queue still has exactly one producer at a time, E5).

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use sidecore_channel::ring::{Consumer, Producer, Recv};

use crate::conn::{AppEvent, AppSender, CloseReason, ConnShared, TxTag};
use crate::gr3::{Limits, Load, weight};
use crate::poller::Ready;
use crate::stats::PpeStats;

/// Registered in-memory blobs (files' bytes), by [`crate::conn::BlobId`].
pub type Blobs = RwLock<Vec<Arc<[u8]>>>;

/// Most bytes one `send` call hands the kernel.
const SEND_CHUNK: usize = 256 * 1024;

/// The PPE's state for one connection.
pub struct PConn {
    pub shared: Arc<ConnShared>,
    pub stream: TcpStream,
    pub rq: Producer,
    pub tx: Consumer,
    pub notify: AppSender,
    pub segment: u64,
    pub readable: bool,
    pub writable: bool,
    /// RDHUP seen: a FIN is waiting behind the data (teardown class).
    pub fin_seen: bool,
    /// End of file read and queued to the application.
    pub peer_eof: bool,
    pub error: bool,
    /// The application closed (Close message or dropped its end).
    pub app_closed: bool,
    /// SHUT_WR sent, waiting for the peer's FIN or the linger timeout.
    pub closing_since: Option<Instant>,
    /// Reading stopped: the receive queue is full.
    pub paused: bool,
    /// Readiness events since the connection was last served (W_q).
    pub pending_events: u64,
    out: Vec<u8>,
    out_pos: usize,
    blob: Option<(Arc<[u8]>, usize, usize)>,
    /// The last `send` took messages off the send queue (room for the app).
    tx_taken: bool,
    /// The send ring may hold messages: the application rang (a doorbell
    /// message reached this PPE), or the last `send` stopped before the ring
    /// was empty. While false the PPE neither reads the ring nor clears the
    /// shared doorbell flag: both live on cache lines the application
    /// writes, and reading them for nothing cost a cache miss each.
    pub tx_pending: bool,
    pub accepted_at: Instant,
    pub last_activity: Instant,
    pub got_bytes: bool,
    /// Handed over by another PPE (not fresh from accept): counted on adoption.
    pub moved: bool,
}

/// What one round of service did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Served {
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The application should look (data, end of file, space, close).
    pub notify: bool,
}

impl PConn {
    /// Wraps an accepted socket.
    pub fn new(
        shared: Arc<ConnShared>,
        stream: TcpStream,
        rq: Producer,
        tx: Consumer,
        notify: AppSender,
        segment: u64,
        now: Instant,
    ) -> PConn {
        PConn {
            shared,
            stream,
            rq,
            tx,
            notify,
            segment,
            readable: true,
            writable: true,
            fin_seen: false,
            peer_eof: false,
            error: false,
            app_closed: false,
            closing_since: None,
            paused: false,
            pending_events: 1,
            out: Vec::new(),
            out_pos: 0,
            blob: None,
            tx_taken: false,
            tx_pending: false,
            accepted_at: now,
            last_activity: now,
            got_bytes: false,
            moved: false,
        }
    }

    /// The connection's id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Folds in one readiness event.
    pub fn on_ready(&mut self, r: Ready) {
        self.readable |= r.readable || r.peer_closed;
        self.writable |= r.writable;
        self.fin_seen |= r.peer_closed;
        self.error |= r.error;
        self.pending_events += 1;
    }

    /// After a move to another PPE: readiness edges may have gone to the old
    /// one, so assume everything until the kernel says otherwise.
    pub fn on_adopt(&mut self) {
        self.readable = true;
        self.writable = true;
        // Doorbells may have gone to the old owner.
        self.tx_pending = true;
        self.pending_events += 1;
    }

    /// A teardown is pending: Control queue.
    pub fn teardown_pending(&self) -> bool {
        self.error || (self.fin_seen && !self.peer_eof && !self.paused)
    }

    /// The connection can be closed now.
    pub fn finished(&self) -> bool {
        self.error || (self.app_closed && self.closing_since.is_some() && self.peer_eof)
    }

    fn send_backlog(&self) -> u64 {
        let blob = self.blob.as_ref().map_or(0, |(_, a, b)| b - a);
        let local = (self.out.len() - self.out_pos + blob) as u64;
        // The ring's messages only when there may be some (one shared read).
        let ring = if self.tx_pending {
            self.tx.available() * self.tx_payload() as u64
        } else {
            0
        };
        local + ring
    }

    /// The application rang: its send ring has news.
    pub fn on_doorbell(&mut self) {
        self.tx_pending = true;
    }

    fn tx_payload(&self) -> usize {
        // An estimate of a send message's bytes: a blob reference stands for
        // more, but W_s is approximate in the seed too.
        self.segment as usize
    }

    /// W(i) when the connection has work it can do now, else 0 (Wait).
    pub fn weight(&mut self, limits: &Limits, rq_bytes: u64, rq_slots: u64, tx_bytes: u64) -> u64 {
        let backlog = self.send_backlog();
        let can_read = self.readable && !self.paused && !self.peer_eof;
        let can_send = self.writable && backlog > 0;
        let tx_news = self.tx_pending;
        let finishing = self.app_closed && self.closing_since.is_none() && backlog == 0;
        if !(can_read || can_send || tx_news || finishing) {
            return 0;
        }
        // Messages the application has not released, as far as the
        // producer's cached view of its head says (no shared read unless
        // the ring looks full): PendingRcv of Eq. 2.2, approximately.
        let in_rq = rq_slots.saturating_sub(self.rq.free_slots());
        let load = Load {
            pending_send_bytes: backlog,
            max_snd_bytes: tx_bytes,
            pending_rcv_bytes: in_rq * (rq_bytes / rq_slots.max(1)),
            max_rcv_bytes: rq_bytes,
            pending_packets: self.pending_events,
            max_rq_size: rq_slots,
            segment_size: self.segment,
        };
        weight(&load, limits).max(1)
    }

    /// Early demultiplexing: reads into the receive queue, up to `slots`
    /// messages, stopping (and counting) when the queue is full.
    pub fn receive(&mut self, slots: usize, stats: &PpeStats, now: Instant) -> Served {
        let mut s = Served::default();
        if self.app_closed || self.rq.is_disconnected() {
            self.discard_input(stats);
            return s;
        }
        for _ in 0..slots {
            if !self.readable || self.peer_eof || self.error {
                break;
            }
            let fd = self.stream.as_raw_fd();
            let Some(mut slot) = self.rq.try_reserve() else {
                if !self.paused {
                    self.paused = true;
                    self.shared.rq_full.fetch_add(1, Ordering::Relaxed);
                    PpeStats::add(&stats.rq_full_stalls, 1);
                }
                break;
            };
            // SAFETY: the slot is ours until committed; recv writes at most
            // `slot.len()` bytes into it.
            let n =
                unsafe { libc::recv(fd, slot.as_mut_ptr().cast(), slot.len(), libc::MSG_DONTWAIT) };
            match n {
                0 => {
                    slot.commit(0);
                    self.peer_eof = true;
                    s.notify = true;
                }
                n if n > 0 => {
                    let n = n as usize;
                    // A short read emptied the socket: what arrives later
                    // raises a new readiness edge, so no second recv just to
                    // hear EAGAIN. Not once the peer's FIN was seen: its
                    // edge has come already, and the end of file is still
                    // to be read.
                    let drained = n < slot.len() && !self.fin_seen;
                    slot.commit(n);
                    s.bytes_in += n as u64;
                    s.notify = true;
                    self.got_bytes = true;
                    self.last_activity = now;
                    if drained {
                        self.readable = false;
                    }
                }
                _ => {
                    // The reserved slot is abandoned uncommitted.
                    let _ = slot;
                    self.on_io_error(io::Error::last_os_error(), true);
                }
            }
        }
        self.rq.publish();
        PpeStats::add(&stats.bytes_in, s.bytes_in);
        s
    }

    /// After the application went away: read and drop what still arrives,
    /// looking for the peer's FIN.
    fn discard_input(&mut self, stats: &PpeStats) {
        let mut scratch = [0u8; 4096];
        for _ in 0..16 {
            if !self.readable || self.peer_eof || self.error {
                return;
            }
            match io::Read::read(&mut &self.stream, &mut scratch) {
                Ok(0) => self.peer_eof = true,
                Ok(n) => PpeStats::add(&stats.bytes_in, n as u64),
                Err(e) => self.on_io_error(e, true),
            }
        }
    }

    fn on_io_error(&mut self, e: io::Error, reading: bool) {
        if e.kind() == io::ErrorKind::WouldBlock {
            if reading {
                self.readable = false;
            } else {
                self.writable = false;
            }
        } else if e.kind() != io::ErrorKind::Interrupted {
            self.error = true;
        }
    }

    /// Resumes a paused connection when its receive queue has room again.
    pub fn try_resume(&mut self, stats: &PpeStats) -> bool {
        if self.paused && (self.rq.free_slots_at_least(1) > 0 || self.rq.is_disconnected()) {
            self.paused = false;
            PpeStats::add(&stats.rq_resumed, 1);
            return true;
        }
        false
    }

    /// Sends from the send queue (and blobs), up to `quantum` bytes.
    pub fn send(
        &mut self,
        quantum: usize,
        blobs: &Blobs,
        stats: &PpeStats,
        now: Instant,
    ) -> Served {
        let mut s = Served::default();
        self.tx_taken = false;
        let local = self.out_pos < self.out.len() || self.blob.is_some();
        if !local && !self.tx_pending {
            return s;
        }
        if self.tx_pending {
            // Cleared before the ring is read; see `Conn::after_send`.
            self.shared.doorbell.store(false, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }
        while (s.bytes_out as usize) < quantum && self.writable && !self.error {
            if self.out_pos == self.out.len() && self.blob.is_none() && !self.refill(blobs) {
                break;
            }
            // Bytes queued before a blob go first: `out` drains, then the blob.
            let chunk: &[u8] = match &self.blob {
                Some((b, a, e)) if self.out_pos == self.out.len() => {
                    &b[*a..(*a + SEND_CHUNK).min(*e)]
                }
                _ => &self.out[self.out_pos..(self.out_pos + SEND_CHUNK).min(self.out.len())],
            };
            // SAFETY: `chunk` is a live slice; MSG_NOSIGNAL turns a reset peer
            // into EPIPE instead of SIGPIPE.
            let n = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    chunk.as_ptr().cast(),
                    chunk.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                self.on_io_error(io::Error::last_os_error(), false);
                break;
            }
            let n = n as usize;
            s.bytes_out += n as u64;
            self.last_activity = now;
            self.advance(n);
        }
        // Slots were released (in `refill`) before this look; see
        // `Conn::has_room` for the other half.
        if self.tx_taken {
            fence(Ordering::SeqCst);
            if self.shared.wants_space.swap(false, Ordering::AcqRel) {
                s.notify = true;
            }
        }
        if self.app_closed && self.closing_since.is_none() && self.send_backlog() == 0 {
            // Everything the application queued is out: FIN to the peer.
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
            self.closing_since = Some(now);
        }
        PpeStats::add(&stats.bytes_out, s.bytes_out);
        s
    }

    fn advance(&mut self, n: usize) {
        if self.out_pos == self.out.len()
            && let Some((_, a, e)) = &mut self.blob
        {
            *a += n;
            if *a >= *e {
                self.blob = None;
            }
        } else {
            self.out_pos += n;
            if self.out_pos == self.out.len() {
                self.out.clear();
                self.out_pos = 0;
            }
        }
    }

    /// Takes the next send-queue messages into `out` (or `blob`); false
    /// when there is nothing to send.
    fn refill(&mut self, blobs: &Blobs) -> bool {
        let mut blob = None;
        let mut closed = false;
        let out = &mut self.out;
        let res = self.tx.recv_batch(64, |m| match m.first().copied() {
            Some(t) if t == TxTag::Data as u8 => {
                out.extend_from_slice(&m[1..]);
                out.len() < SEND_CHUNK
            }
            Some(t) if t == TxTag::Blob as u8 && m.len() >= 21 => {
                blob = Some(decode_blob(m));
                false
            }
            Some(t) if t == TxTag::Close as u8 => {
                closed = true;
                false
            }
            // A malformed message from the application: ignore it.
            _ => true,
        });
        self.tx.release();
        let took = matches!(res, Ok(n) if n > 0);
        self.tx_taken |= took;
        if !took {
            // Empty (or closed): nothing more until the application rings.
            self.tx_pending = false;
        }
        if matches!(res, Err(Recv::Closed)) {
            closed = true;
        }
        if closed {
            self.app_closed = true;
        }
        if let Some((id, off, len)) = blob {
            let table = blobs
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(b) = table.get(id as usize) {
                let a = (off as usize).min(b.len());
                let e = a.saturating_add(len as usize).min(b.len());
                if e > a {
                    self.blob = Some((Arc::clone(b), a, e));
                }
            }
        }
        self.out_pos < self.out.len() || self.blob.is_some()
    }

    /// Tells the application, once until it looks.
    pub fn notify_app(&self) {
        // What the application should see was published before this; see
        // `Conn::try_recv` for the other half.
        fence(Ordering::SeqCst);
        if !self.shared.notified.swap(true, Ordering::AcqRel) {
            let _ = self.notify.send(AppEvent::Ready(self.shared.id));
        }
    }

    /// Ends the connection: records why, tells the application, and drops
    /// the socket (an abortive close sends RST).
    pub fn close(self, reason: CloseReason, abortive: bool) {
        self.shared.set_closed(reason);
        if abortive {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a valid socket and a live `linger` of the size passed.
            unsafe {
                libc::setsockopt(
                    self.stream.as_fd().as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&raw const linger).cast(),
                    size_of::<libc::linger>() as u32,
                );
            }
        }
        let PConn {
            rq, notify, shared, ..
        } = self;
        // The receive queue's producer goes first, so the application's
        // next look finds it closed.
        drop(rq);
        shared.notified.store(true, Ordering::Release);
        let _ = notify.send(AppEvent::Ready(shared.id));
    }
}

fn decode_blob(m: &[u8]) -> (u32, u64, u64) {
    let mut id = [0u8; 4];
    let mut off = [0u8; 8];
    let mut len = [0u8; 8];
    id.copy_from_slice(&m[1..5]);
    off.copy_from_slice(&m[5..13]);
    len.copy_from_slice(&m[13..21]);
    (
        u32::from_le_bytes(id),
        u64::from_le_bytes(off),
        u64::from_le_bytes(len),
    )
}

/// The segment size of a connected socket (TCP_MAXSEG), or 1448.
pub fn mss(stream: &TcpStream) -> u64 {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket; `v` and `len` are live and sized for the option.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if rc == 0 && v > 0 { v as u64 } else { 1448 }
}
