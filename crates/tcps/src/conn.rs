//! The application's side of a connection: its receive queue (filled by the
//! PPE), its send queue (drained by the PPE), and the event queue through
//! which a PPE tells an application about new connections and new data.
//!
//! An application thread never enters the network stack: `recv` reads from
//! a shared-memory ring the PPE fills (the seed's per-socket receive queue,
//! one producer and one consumer), `send` writes to a ring the PPE drains.
//! Both are `sidecore-channel` rings of a fixed size.
//!
//! Messages on the send ring start with a tag byte ([`TxTag`]): plain bytes,
//! a reference to a registered in-memory blob (the seed's `sendfile` from an
//! in-memory file: the PPE sends straight from the blob, nothing is copied
//! through the ring), or a graceful close. On the receive ring a zero-length
//! message is the peer's end of file (FIN).

use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use sidecore_channel::ring::{Consumer, Producer, Recv};

/// Why a connection ended, as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum CloseReason {
    /// Still open.
    Open = 0,
    /// Closed after the application closed it.
    AppClosed = 1,
    /// The peer reset it or a socket error occurred.
    Reset = 2,
    /// Nothing moved for the idle timeout.
    IdleTimeout = 3,
    /// The peer never sent a byte within the first-byte timeout.
    HalfOpen = 4,
    /// The server shut down.
    Shutdown = 5,
}

impl CloseReason {
    fn from_u8(v: u8) -> CloseReason {
        match v {
            1 => CloseReason::AppClosed,
            2 => CloseReason::Reset,
            3 => CloseReason::IdleTimeout,
            4 => CloseReason::HalfOpen,
            5 => CloseReason::Shutdown,
            _ => CloseReason::Open,
        }
    }
}

/// Tags of send-ring messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TxTag {
    /// Bytes follow.
    Data = 0,
    /// Blob id (u32 LE), offset (u64 LE), length (u64 LE) follow.
    Blob = 1,
    /// Close gracefully once everything before it is sent.
    Close = 2,
}

/// A registered in-memory blob (a file's bytes), sent without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobId(pub u32);

/// State a connection's PPE and application share.
#[derive(Debug)]
pub struct ConnShared {
    pub id: u64,
    pub peer: SocketAddr,
    /// Index of the PPE that owns the connection now (its CPU).
    pub owner: AtomicUsize,
    /// The application put something on the send ring the PPE may not know of.
    pub doorbell: AtomicBool,
    /// The PPE told the application something it has not looked at yet.
    pub notified: AtomicBool,
    /// The application found the send ring full and waits for space.
    pub wants_space: AtomicBool,
    close: AtomicU8,
    /// Times the PPE stopped reading because the receive queue was full.
    pub rq_full: AtomicU64,
}

impl ConnShared {
    pub(crate) fn new(id: u64, peer: SocketAddr, owner: usize) -> ConnShared {
        ConnShared {
            id,
            peer,
            owner: AtomicUsize::new(owner),
            doorbell: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            wants_space: AtomicBool::new(false),
            close: AtomicU8::new(0),
            rq_full: AtomicU64::new(0),
        }
    }

    /// Why the connection ended ([`CloseReason::Open`] while it has not).
    pub fn close_reason(&self) -> CloseReason {
        CloseReason::from_u8(self.close.load(Ordering::Acquire))
    }

    pub(crate) fn set_closed(&self, r: CloseReason) {
        let _ = self
            .close
            .compare_exchange(0, r as u8, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// What an application's event queue delivers.
pub enum AppEvent {
    /// A new connection, now the application's (boxed: a `Conn` is a few
    /// hundred bytes, and every `Ready` in the queue would pay for it).
    Accepted(Box<Conn>),
    /// Something happened on connection `id`: data, end of file, space to
    /// send, or its end. Look with [`Conn::try_recv`].
    Ready(u64),
}

/// How a PPE reaches the application and the other PPEs about one connection.
pub(crate) trait Doorbell: Send + Sync {
    /// The application put work on connection `id`'s send ring; tell its owner.
    fn ring(&self, owner: usize, id: u64);
}

/// What [`Conn::try_recv`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvStatus {
    /// This many bytes were appended.
    Data(usize),
    /// Nothing now.
    Empty,
    /// The peer closed its side: no more data will come (sending still works).
    Eof,
    /// The connection is gone, for this reason.
    Closed(CloseReason),
}

/// The application's end of one connection.
pub struct Conn {
    pub(crate) shared: Arc<ConnShared>,
    pub(crate) rq: Consumer,
    /// Dropped by hand in `Drop`, before the doorbell rings, so the PPE
    /// that answers the bell sees the ring closed.
    pub(crate) tx: ManuallyDrop<Producer>,
    pub(crate) bell: Arc<dyn Doorbell>,
    eof: bool,
}

impl Conn {
    pub(crate) fn new(
        shared: Arc<ConnShared>,
        rq: Consumer,
        tx: Producer,
        bell: Arc<dyn Doorbell>,
    ) -> Conn {
        Conn {
            shared,
            rq,
            tx: ManuallyDrop::new(tx),
            bell,
            eof: false,
        }
    }

    /// The connection's id (unique within the server).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// Times the PPE stopped reading this connection because its receive
    /// queue was full (TCP's window then held the peer back).
    pub fn rq_full_stalls(&self) -> u64 {
        self.shared.rq_full.load(Ordering::Relaxed)
    }

    /// Appends what the receive queue holds to `buf` (up to `max` bytes,
    /// whole messages), without blocking.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>, max: usize) -> RecvStatus {
        // "Looked" before looking: the fence orders this store before the
        // ring reads below, and pairs with the one in `PConn::notify_app`
        // (publish, fence, swap). Without it the ring could be read empty
        // while the PPE still saw `notified` set and sent no event: that
        // connection would never be looked at again.
        self.shared.notified.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.eof {
            return self.after_eof();
        }
        let mut got = 0usize;
        let mut eof = false;
        let res = self.rq.recv_batch(usize::MAX, |m| {
            if m.is_empty() {
                eof = true;
                return false;
            }
            buf.extend_from_slice(m);
            got += m.len();
            got < max
        });
        self.rq.release();
        if got > 0 {
            if eof {
                self.eof = true;
            }
            return RecvStatus::Data(got);
        }
        if eof {
            self.eof = true;
            return RecvStatus::Eof;
        }
        match res {
            Err(Recv::Closed) => RecvStatus::Closed(self.reason_or_reset()),
            _ => RecvStatus::Empty,
        }
    }

    fn after_eof(&self) -> RecvStatus {
        match self.shared.close_reason() {
            CloseReason::Open => RecvStatus::Eof,
            r => RecvStatus::Closed(r),
        }
    }

    fn reason_or_reset(&self) -> CloseReason {
        match self.shared.close_reason() {
            CloseReason::Open => CloseReason::Reset,
            r => r,
        }
    }

    /// Queues as much of `data` as the send ring takes; returns how many
    /// bytes it took (0 when full: wait for a [`AppEvent::Ready`]).
    pub fn send(&mut self, data: &[u8]) -> usize {
        let cap = self.tx.payload_capacity().saturating_sub(1);
        let mut sent = 0;
        while sent < data.len() {
            let n = (data.len() - sent).min(cap);
            if !self.has_room() {
                break;
            }
            let Some(mut slot) = self.tx.try_reserve() else {
                break;
            };
            slot[0] = TxTag::Data as u8;
            slot[1..=n].copy_from_slice(&data[sent..sent + n]);
            slot.commit(n + 1);
            sent += n;
        }
        self.after_send(sent > 0 || data.is_empty());
        sent
    }

    /// Queues `len` bytes of a registered blob from `offset`, sent by the PPE
    /// straight from memory. False when the send ring is full.
    pub fn send_blob(&mut self, blob: BlobId, offset: u64, len: u64) -> bool {
        let room = self.has_room();
        let ok = match self.tx.try_reserve().filter(|_| room) {
            Some(mut slot) => {
                slot[0] = TxTag::Blob as u8;
                slot[1..5].copy_from_slice(&blob.0.to_le_bytes());
                slot[5..13].copy_from_slice(&offset.to_le_bytes());
                slot[13..21].copy_from_slice(&len.to_le_bytes());
                slot.commit(21);
                true
            }
            None => false,
        };
        self.after_send(ok);
        ok
    }

    /// Whether the send ring has a free slot. When it has none, says so
    /// (`wants_space`) before looking once more: with the fence here and
    /// the PPE's (release slots, fence, read `wants_space`), either this
    /// second look finds the slots the PPE freed or the PPE sees the flag
    /// and sends an event. Flag first, look second: never a lost wake-up.
    fn has_room(&mut self) -> bool {
        if self.tx.free_slots() > 0 {
            return true;
        }
        self.shared.wants_space.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.tx.free_slots() > 0
    }

    fn after_send(&mut self, queued: bool) {
        self.tx.publish();
        // Pairs with the fence in `PConn::send` (clear `doorbell`, fence,
        // read the ring): either the PPE reads what was just published or
        // this swap finds the flag cleared and rings.
        fence(Ordering::SeqCst);
        if queued && !self.shared.doorbell.swap(true, Ordering::AcqRel) {
            self.bell
                .ring(self.shared.owner.load(Ordering::Acquire), self.shared.id);
        }
    }

    /// Free slots on the send ring.
    pub fn send_space(&mut self) -> u64 {
        self.tx.free_slots_at_least(1)
    }

    /// Why the connection ended, or [`CloseReason::Open`].
    pub fn close_reason(&self) -> CloseReason {
        self.shared.close_reason()
    }

    /// Closes gracefully: the PPE sends what is queued, then shuts the
    /// connection. Dropping a `Conn` does the same.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(mut slot) = self.tx.try_reserve() {
            slot[0] = TxTag::Close as u8;
            slot.commit(1);
        }
        self.tx.publish();
        // SAFETY: `tx` is not used again: this is `drop`, and no other method
        // runs after it. Dropping the producer marks the ring closed, which is
        // "close" for the PPE too when the Close message found no room.
        unsafe { ManuallyDrop::drop(&mut self.tx) };
        self.shared.doorbell.store(true, Ordering::Release);
        self.bell
            .ring(self.shared.owner.load(Ordering::Acquire), self.shared.id);
    }
}

/// An application's endpoint: new connections and readiness arrive here.
pub struct App {
    pub(crate) rx: Receiver<AppEvent>,
}

impl App {
    /// The next event, waiting up to `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<AppEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next event if one is queued.
    pub fn try_event(&self) -> Option<AppEvent> {
        self.rx.try_recv().ok()
    }
}

pub(crate) type AppSender = Sender<AppEvent>;
