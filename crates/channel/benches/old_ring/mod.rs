//! The ring as it was before issue 17 (commit ccaab24), kept verbatim (less its
//! unit tests) so that the benchmark measures the old and the new ring side by
//! side in one run: per-slot 16-byte headers (an 8-byte stamp and the length)
//! in front of each payload, one release store of the stamp per message and of
//! the shared tail per publish, and a consumer that waits on the stamp.
#![allow(dead_code, clippy::all)] // a frozen baseline, not maintained code

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// Bytes at the start of each slot: the stamp (8) and the message length (4),
/// padded to 16 so payloads stay 16-byte aligned.
pub const SLOT_HEADER: usize = 16;

/// Slot size used when a caller does not care: one 64-byte message plus header.
pub const DEFAULT_SLOT_SIZE: usize = 128;

/// The shape of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of slots; a power of two, at least 2.
    pub slots: usize,
    /// Bytes per slot including the 16-byte header; a multiple of 16.
    pub slot_size: usize,
    /// Number of consumers (1 = unicast, more = multicast).
    pub consumers: usize,
    /// Commits after which the producer publishes automatically (1 = every
    /// message); capped at the slot count.
    pub publish_batch: usize,
    /// Slots a consumer reads before it hands them back to the producer; capped
    /// at the slot count.
    pub release_batch: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            slots: 1024,
            slot_size: DEFAULT_SLOT_SIZE,
            consumers: 1,
            publish_batch: 1,
            release_batch: 32,
        }
    }
}

/// Why a ring could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingConfigError {
    #[error("ring slots must be a power of two and at least 2, got {0}")]
    Slots(usize),
    #[error("ring slot_size must be a multiple of 16 and at least 32 bytes, got {0}")]
    SlotSize(usize),
    #[error("a ring needs at least one consumer, got {0}")]
    Consumers(usize),
    #[error(
        "ring batch sizes must be at least 1, got publish {publish}, release {release} (for {slots} slots)"
    )]
    Batch {
        slots: usize,
        publish: usize,
        release: usize,
    },
    #[error("ring of {slots} slots of {slot_size} bytes is too large")]
    TooLarge { slots: usize, slot_size: usize },
}

impl RingConfig {
    /// Checks the configuration, returning the error that names the bad field.
    pub fn validate(&self) -> Result<(), RingConfigError> {
        if self.slots < 2 || !self.slots.is_power_of_two() {
            return Err(RingConfigError::Slots(self.slots));
        }
        if self.slot_size < 32 || !self.slot_size.is_multiple_of(16) {
            return Err(RingConfigError::SlotSize(self.slot_size));
        }
        if self.consumers == 0 {
            return Err(RingConfigError::Consumers(0));
        }
        if self.publish_batch == 0 || self.release_batch == 0 {
            return Err(RingConfigError::Batch {
                slots: self.slots,
                publish: self.publish_batch,
                release: self.release_batch,
            });
        }
        if self
            .slots
            .checked_mul(self.slot_size)
            .is_none_or(|b| b > isize::MAX as usize / 2)
        {
            return Err(RingConfigError::TooLarge {
                slots: self.slots,
                slot_size: self.slot_size,
            });
        }
        Ok(())
    }

    /// Largest message one slot can carry.
    pub fn payload_capacity(&self) -> usize {
        self.slot_size - SLOT_HEADER
    }
}

/// Counters shared by both ends, readable from any thread (for `sidecore ps`).
/// Messages published are the tail itself ([`Producer::published`]).
#[derive(Debug, Default)]
pub struct RingStats {
    /// Messages the policy layer dropped because the ring was full.
    pub dropped: AtomicU64,
    /// Times a reliable sender had to wait for space.
    pub full_waits: AtomicU64,
}

/// Where the slots are: copied into every endpoint so the hot path reads only
/// its own cache lines and the slots themselves.
#[derive(Clone, Copy)]
struct Geometry {
    buf: NonNull<u8>,
    mask: u64,
    slot_size: usize,
}

// SAFETY: a Geometry points into the buffer owned by `Shared`; every endpoint
// that carries one also holds the `Arc<Shared>`, so the memory lives as long
// as the endpoint, on whatever thread it moves to. Access is synchronised by
// the stamp and head protocol described on `Shared`.
unsafe impl Send for Geometry {}

impl Geometry {
    #[inline(always)]
    fn slot_ptr(&self, pos: u64) -> *mut u8 {
        let idx = (pos & self.mask) as usize;
        // SAFETY: idx < slots, so the offset stays inside the allocation.
        unsafe { self.buf.as_ptr().add(idx * self.slot_size) }
    }

    #[inline(always)]
    fn stamp<'a>(&self, pos: u64) -> &'a AtomicU64 {
        // SAFETY: every slot begins with an 8-byte, 16-byte-aligned stamp word
        // (the buffer is 128-byte aligned and slot_size is a multiple of 16);
        // AtomicU64 has the same layout as u64. The memory outlives every
        // endpoint, each of which holds the `Arc<Shared>` that owns it.
        unsafe { &*(self.slot_ptr(pos) as *const AtomicU64) }
    }

    #[inline(always)]
    fn len_ptr(&self, pos: u64) -> *mut u32 {
        // SAFETY: bytes 8..12 of the slot hold the length; in bounds as above.
        unsafe { self.slot_ptr(pos).add(8) as *mut u32 }
    }

    #[inline(always)]
    fn payload_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: the payload starts after the header, inside the slot.
        unsafe { self.slot_ptr(pos).add(SLOT_HEADER) }
    }
}

/// The memory and indices shared by the producer and the consumers. Every
/// field that one side writes sits on its own cache line.
struct Shared {
    geo: Geometry,
    layout: Layout,
    /// Position up to which the producer has published (exclusive).
    tail: CachePadded<AtomicU64>,
    /// Per consumer: position up to which it has released slots (exclusive).
    heads: Box<[CachePadded<AtomicU64>]>,
    /// Consumers still attached.
    consumers_alive: CachePadded<AtomicUsize>,
    producer_closed: CachePadded<AtomicBool>,
    stats: CachePadded<RingStats>,
}

// SAFETY: `Shared` owns its buffer; all cross-thread access to slot memory is
// ordered by the stamp protocol (release store of the stamp after the payload is
// written, acquire load before it is read) and by the head indices (a slot is
// rewritten only after every consumer has released it with a release store that
// the producer reads with acquire). The indices themselves are atomics.
unsafe impl Send for Shared {}
// SAFETY: see the `Send` impl; no method hands out unsynchronised `&mut` to
// memory that another thread may access at the same time.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: `buf` was allocated in `Ring::create` with exactly `layout`,
        // and `Shared` is dropped once, when the last `Arc` goes away.
        unsafe { alloc::dealloc(self.geo.buf.as_ptr(), self.layout) }
    }
}

impl Shared {
    fn min_head(&self) -> u64 {
        self.heads
            .iter()
            .map(|h| h.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }
}

/// A read-only view of a ring's counters for observers (`sidecore ps`, the
/// metrics endpoint): it holds the ring's memory alive but touches only the
/// shared indices and counters, never the producer's or consumers' caches, so
/// reading it costs the data path nothing but a shared cache line now and then.
#[derive(Clone)]
pub struct RingProbe {
    shared: Arc<Shared>,
    capacity: u64,
}

/// What a [`RingProbe`] read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingSnapshot {
    /// Messages published so far.
    pub published: u64,
    /// Messages published and not yet released by the slowest live consumer.
    pub occupancy: u64,
    /// Slots in the ring.
    pub capacity: u64,
    /// Messages dropped because the ring was full.
    pub dropped: u64,
    /// Times a reliable sender waited for space (backpressure).
    pub full_waits: u64,
}

impl RingProbe {
    /// The counters now.
    pub fn snapshot(&self) -> RingSnapshot {
        let s = &self.shared;
        let published = s.tail.load(Ordering::Acquire);
        // A departed consumer parks its head far ahead (see `Consumer::drop`);
        // only live heads at or below the tail say how much is still held.
        let held = s
            .heads
            .iter()
            .map(|h| h.load(Ordering::Acquire))
            .filter(|&h| h <= published)
            .min()
            .map_or(0, |h| published - h);
        RingSnapshot {
            published,
            occupancy: held.min(self.capacity),
            capacity: self.capacity,
            dropped: s.stats.dropped.load(Ordering::Relaxed),
            full_waits: s.stats.full_waits.load(Ordering::Relaxed),
        }
    }
}

/// Constructor namespace for rings.
pub struct Ring;

impl Ring {
    /// Builds a ring and returns its producer and `config.consumers` consumers.
    pub fn create(config: RingConfig) -> Result<(Producer, Vec<Consumer>), RingConfigError> {
        config.validate()?;
        let bytes = config.slots * config.slot_size;
        let layout =
            Layout::from_size_align(bytes, 128).map_err(|_| RingConfigError::TooLarge {
                slots: config.slots,
                slot_size: config.slot_size,
            })?;
        // SAFETY: layout has non-zero size (slots >= 2, slot_size >= 32).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(buf) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let heads = (0..config.consumers)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        let geo = Geometry {
            buf,
            mask: (config.slots - 1) as u64,
            slot_size: config.slot_size,
        };
        let shared = Arc::new(Shared {
            geo,
            layout,
            tail: CachePadded::new(AtomicU64::new(0)),
            heads,
            consumers_alive: CachePadded::new(AtomicUsize::new(config.consumers)),
            producer_closed: CachePadded::new(AtomicBool::new(false)),
            stats: CachePadded::new(RingStats::default()),
        });
        let producer = Producer {
            geo,
            shared: Arc::clone(&shared),
            capacity: config.slots as u64,
            payload_cap: config.payload_capacity(),
            next: 0,
            published: 0,
            head_cache: 0,
            publish_batch: config.publish_batch.min(config.slots) as u64,
            _not_sync: PhantomData,
        };
        let consumers = (0..config.consumers)
            .map(|i| Consumer {
                geo,
                shared: Arc::clone(&shared),
                index: i,
                head: 0,
                released: 0,
                release_batch: config.release_batch.min(config.slots) as u64,
                _not_sync: PhantomData,
            })
            .collect();
        Ok((producer, consumers))
    }
}

/// The producing end. Not `Sync`: exactly one thread produces.
pub struct Producer {
    geo: Geometry,
    shared: Arc<Shared>,
    capacity: u64,
    payload_cap: usize,
    /// Next position to write.
    next: u64,
    /// Positions below this are published.
    published: u64,
    /// Cached minimum of the consumers' heads.
    head_cache: u64,
    publish_batch: u64,
    _not_sync: PhantomData<Cell<()>>,
}

/// A slot reserved by the producer: write the message into it, then
/// [`commit`](SlotMut::commit) it. Dropping it without committing abandons the
/// reservation (nothing is sent).
pub struct SlotMut<'a> {
    producer: &'a mut Producer,
    len: usize,
}

impl Producer {
    /// Largest message a slot can carry.
    pub fn payload_capacity(&self) -> usize {
        self.payload_cap
    }

    /// Counters shared with the consumers.
    pub fn stats(&self) -> &RingStats {
        &self.shared.stats
    }

    /// A probe of this ring's counters for observers on other threads.
    pub fn probe(&self) -> RingProbe {
        RingProbe {
            shared: Arc::clone(&self.shared),
            capacity: self.capacity,
        }
    }

    /// True when every consumer has gone away: sending is pointless.
    pub fn is_disconnected(&self) -> bool {
        self.shared.consumers_alive.load(Ordering::Acquire) == 0
    }

    /// Free slots as far as this producer knows, refreshing the consumers' heads
    /// only if the cached view shows none.
    #[inline]
    pub fn free_slots(&mut self) -> u64 {
        let used = self.next.saturating_sub(self.head_cache);
        if used < self.capacity {
            return self.capacity - used;
        }
        self.head_cache = self.shared.min_head();
        self.capacity - self.next.saturating_sub(self.head_cache).min(self.capacity)
    }

    /// Free slots, reloading the consumers' heads when the cached view shows
    /// fewer than `want`: for once-a-turn back-pressure decisions, where a
    /// stale small count would hold a sender that needs `want` slots back
    /// for good, while a roomy cached view costs no shared-line read.
    pub fn free_slots_at_least(&mut self, want: u64) -> u64 {
        let used = self.next.saturating_sub(self.head_cache);
        if used + want <= self.capacity {
            return self.capacity - used;
        }
        self.head_cache = self.shared.min_head();
        self.capacity - self.next.saturating_sub(self.head_cache).min(self.capacity)
    }

    /// Reserves the next slot for writing in place, or returns `None` if the
    /// ring is full (the slowest consumer has not released it yet).
    #[inline]
    pub fn try_reserve(&mut self) -> Option<SlotMut<'_>> {
        if self.free_slots() == 0 {
            // Make sure what we wrote can be read, or the consumers may never free
            // space for us.
            self.publish();
            return None;
        }
        Some(SlotMut {
            producer: self,
            len: 0,
        })
    }

    /// Copies `msg` into the next slot and commits it. Returns `false` if the ring
    /// is full. Panics never; a message larger than a slot is an error.
    #[inline]
    pub fn try_push(&mut self, msg: &[u8]) -> Result<bool, MessageTooLarge> {
        if msg.len() > self.payload_cap {
            return Err(MessageTooLarge {
                len: msg.len(),
                capacity: self.payload_cap,
            });
        }
        match self.try_reserve() {
            Some(mut slot) => {
                slot[..msg.len()].copy_from_slice(msg);
                slot.commit(msg.len());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Makes every committed slot visible to the consumers.
    #[inline]
    pub fn publish(&mut self) {
        if self.published == self.next {
            return;
        }
        assert!(
            self.published < self.next && self.next - self.published <= self.capacity,
            "ring producer: publishing positions {}..{} of a {}-slot ring",
            self.published,
            self.next,
            self.capacity
        );
        for pos in self.published..self.next {
            self.geo.stamp(pos).store(pos + 1, Ordering::Release);
        }
        self.shared.tail.store(self.next, Ordering::Release);
        self.published = self.next;
    }

    /// Messages published so far.
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Committed messages not yet published.
    pub fn unpublished(&self) -> u64 {
        self.next - self.published
    }

    /// Messages published and not yet released by the slowest consumer.
    pub fn in_flight(&self) -> u64 {
        self.published.saturating_sub(self.shared.min_head())
    }

    fn commit_slot(&mut self, len: usize) {
        // The slot was free when reserved: the slowest consumer released it.
        assert!(
            self.next.saturating_sub(self.head_cache) < self.capacity,
            "ring producer: committing position {} with the slowest consumer at {} ({} slots)",
            self.next,
            self.head_cache,
            self.capacity
        );
        // SAFETY: the slot at `next` is reserved for us (free_slots() > 0 was
        // checked by try_reserve and no consumer reads it until its stamp is set).
        unsafe { self.geo.len_ptr(self.next).write(len as u32) };
        self.next += 1;
        if self.next - self.published >= self.publish_batch {
            self.publish();
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.publish();
        self.shared.producer_closed.store(true, Ordering::Release);
    }
}

impl SlotMut<'_> {
    /// Commits the first `len` bytes of the slot as a message.
    ///
    /// # Panics
    /// If `len` exceeds the slot's payload capacity (a programming error: the
    /// slot's length is known to the writer).
    #[inline]
    pub fn commit(self, len: usize) {
        assert!(
            len <= self.producer.payload_cap,
            "commit of {len} bytes into a {}-byte slot",
            self.producer.payload_cap
        );
        self.producer.commit_slot(len);
    }

    /// Sets the length that `Deref` exposes (for writers that append).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.producer.payload_cap);
    }
}

impl Deref for SlotMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let cap = self.producer.payload_cap;
        // SAFETY: the slot at `next` belongs to the producer until it is
        // published; its payload spans `payload_cap` bytes inside the buffer.
        unsafe {
            std::slice::from_raw_parts(self.producer.geo.payload_ptr(self.producer.next), cap)
        }
    }
}

impl DerefMut for SlotMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let cap = self.producer.payload_cap;
        // SAFETY: as in `deref`; we hold `&mut Producer`, so this is the only
        // live reference to the slot's payload.
        unsafe {
            std::slice::from_raw_parts_mut(self.producer.geo.payload_ptr(self.producer.next), cap)
        }
    }
}

/// A message larger than a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("message of {len} bytes does not fit a {capacity}-byte slot")]
pub struct MessageTooLarge {
    pub len: usize,
    pub capacity: usize,
}

/// A consuming end. Not `Sync`: exactly one thread consumes from it.
pub struct Consumer {
    geo: Geometry,
    shared: Arc<Shared>,
    index: usize,
    /// Next position to read.
    head: u64,
    /// Positions below this have been handed back to the producer.
    released: u64,
    release_batch: u64,
    _not_sync: PhantomData<Cell<()>>,
}

/// What a receive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// Nothing to read now.
    Empty,
    /// Nothing to read, ever: the producer is gone and everything is read.
    Closed,
}

/// A message read in place. Dropping it hands the slot back (in batches).
pub struct SlotRef<'a> {
    consumer: &'a mut Consumer,
    len: usize,
}

impl Consumer {
    /// Which consumer of the ring this is (0 for unicast).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Counters shared with the producer.
    pub fn stats(&self) -> &RingStats {
        &self.shared.stats
    }

    /// Reads the next message in place.
    #[inline]
    pub fn try_recv(&mut self) -> Result<SlotRef<'_>, Recv> {
        let stamp = self.geo.stamp(self.head).load(Ordering::Acquire);
        if stamp != self.head + 1 {
            // Empty: hand back what we hold so a waiting producer can go on.
            self.release();
            if self.shared.producer_closed.load(Ordering::Acquire)
                && self.geo.stamp(self.head).load(Ordering::Acquire) != self.head + 1
            {
                return Err(Recv::Closed);
            }
            return Err(Recv::Empty);
        }
        // SAFETY: the acquire load of the stamp synchronises with the producer's
        // release store, which followed its write of the length.
        let len = unsafe { self.geo.len_ptr(self.head).read() } as usize;
        self.check_len(len);
        Ok(SlotRef {
            consumer: self,
            len,
        })
    }

    /// Reads up to `max` messages in place, handing each to `f`, and returns how
    /// many were read. `f` returns `false` to stop after the current message.
    ///
    /// The batched path: one read of the published tail tells how many slots
    /// are ready, and their payloads are then read without a stamp check each,
    /// so the loads of consecutive slots overlap. When the tail shows nothing
    /// (a publish may be in flight) it falls back to the per-slot stamp.
    #[inline]
    pub fn recv_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> Result<usize, Recv> {
        let tail = self.shared.tail.load(Ordering::Acquire);
        let ready = tail.saturating_sub(self.head).min(max as u64);
        if ready == 0 {
            return self.recv_by_stamp(max, f);
        }
        assert!(
            tail - self.head <= self.geo.mask + 1,
            "ring consumer {}: tail {tail} is more than a ring ahead of head {}",
            self.index,
            self.head
        );
        for n in 1..=ready {
            // SAFETY: positions below the published tail are written and
            // published (the acquire load of `tail` synchronises with the
            // producer's release store after the stamps), and cannot be
            // rewritten before this consumer releases them.
            let len = unsafe { self.geo.len_ptr(self.head).read() } as usize;
            self.check_len(len);
            // SAFETY: as above; the payload spans `len` bytes of the slot,
            // within its payload (checked).
            let msg = unsafe { std::slice::from_raw_parts(self.geo.payload_ptr(self.head), len) };
            let go_on = f(msg);
            self.advance();
            if !go_on {
                return Ok(n as usize);
            }
        }
        Ok(ready as usize)
    }

    /// Up to `max` messages, each found by its stamp (a publish may have set
    /// the stamps and not yet the shared tail).
    fn recv_by_stamp(
        &mut self,
        max: usize,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> Result<usize, Recv> {
        let mut n = 0;
        while n < max {
            let m = match self.try_recv() {
                Ok(m) => m,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            };
            n += 1;
            if !f(&m) {
                break;
            }
        }
        Ok(n)
    }

    /// A published length never exceeds the slot's payload: the producer
    /// checked it when it committed. Anything else is corrupted memory.
    #[inline(always)]
    fn check_len(&self, len: usize) {
        assert!(
            len <= self.geo.slot_size - SLOT_HEADER,
            "ring consumer {}: slot at position {} claims {len} bytes in a {}-byte slot",
            self.index,
            self.head,
            self.geo.slot_size
        );
    }

    /// Number of messages ready to read, at least: what the shared tail says,
    /// or 1 if the next slot's stamp says it is published.
    pub fn available(&self) -> u64 {
        let by_tail = self
            .shared
            .tail
            .load(Ordering::Acquire)
            .saturating_sub(self.head);
        let next = self.geo.stamp(self.head).load(Ordering::Acquire) == self.head + 1;
        by_tail.max(u64::from(next))
    }

    /// Hands every slot read so far back to the producer.
    #[inline]
    pub fn release(&mut self) {
        if self.released != self.head {
            debug_assert!(
                self.released < self.head,
                "ring consumer released past its head"
            );
            self.shared.heads[self.index].store(self.head, Ordering::Release);
            self.released = self.head;
        }
    }

    /// True once the producer has gone away (there may still be messages to read).
    pub fn is_producer_closed(&self) -> bool {
        self.shared.producer_closed.load(Ordering::Acquire)
    }

    #[inline]
    fn advance(&mut self) {
        self.head += 1;
        if self.head - self.released >= self.release_batch {
            self.release();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // A departed consumer must never hold the producer back: release
        // everything, up to "infinitely far ahead".
        self.shared.heads[self.index].store(u64::MAX / 2, Ordering::Release);
        self.shared.consumers_alive.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SlotRef<'_> {
    /// The message length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for SlotRef<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the slot at `head` is published (stamp checked with acquire in
        // try_recv) and cannot be rewritten until this consumer releases it,
        // which happens only after this SlotRef is dropped.
        unsafe {
            std::slice::from_raw_parts(self.consumer.geo.payload_ptr(self.consumer.head), self.len)
        }
    }
}

impl Drop for SlotRef<'_> {
    #[inline]
    fn drop(&mut self) {
        self.consumer.advance();
    }
}
