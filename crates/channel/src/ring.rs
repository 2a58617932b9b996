//! The shared-memory ring between cores: one producer, one or more consumers
//! (unicast is the one-consumer case, multicast the N-consumer case).
//!
//! The design follows HYDRA's InRing (§5.5) as the digest maps it to today's
//! hardware:
//!
//! * **Zero copy.** The producer reserves a slot and writes its message straight
//!   into it; every consumer reads the message in place from that same slot.
//! * **Per-slot stamps.** Each slot starts with an 8-byte stamp that the producer
//!   sets to `position + 1` when it publishes the slot. A consumer waits on the
//!   stamp of the slot it wants, not on a shared tail index, so a small message
//!   and its "ready" signal travel in the same cache line.
//! * **Batched publishing.** Writes become visible only on [`Producer::publish`]
//!   (or automatically every `publish_batch` commits); consumers likewise hand
//!   slots back in batches of `release_batch`.
//! * **Padded indices.** The producer's published tail and each consumer's
//!   released head live on their own cache lines ([`CachePadded`]); each side
//!   keeps a private cached copy of the other's index and reads the shared one
//!   only when the cached copy says the ring is full (or empty).
//!
//! * **Pooled buffers** (optional). [`Ring::create_pooled`] takes the buffer
//!   of a ring that went away from a [`BufferPool`] and resets only its
//!   stamps, for owners that build and drop many rings (a server's rings per
//!   connection).
//!
//! Back-pressure and drops are policies layered on top (see `crate::sender`):
//! the ring itself only reports "full".
//!
//! Hand-rolled rather than taken from a crate because no maintained crate offers
//! in-place (zero-copy) slots with batched publication *and* multicast; the
//! benchmark in `benches/ring.rs` compares it with crossbeam-channel.

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
    /// Where the buffer goes when the ring does (kept for the next ring of
    /// the same shape instead of freed), if anywhere.
    pool: Option<Arc<BufferPool>>,
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
        if let Some(pool) = &self.pool
            && pool.give_back(self.geo.buf, self.layout)
        {
            return;
        }
        // SAFETY: `buf` was allocated in `Ring::create` with exactly `layout`,
        // and `Shared` is dropped once, when the last `Arc` goes away.
        unsafe { alloc::dealloc(self.geo.buf.as_ptr(), self.layout) }
    }
}

/// Buffers of rings that went away, kept for new rings of the same shape:
/// a ring built with [`Ring::create_pooled`] takes one if there is one
/// (resetting only its stamp words) and gives it back when both of its ends
/// are gone, so a server that builds rings per connection neither zeroes
/// nor faults in fresh pages, nor unmaps them (a TLB shootdown) on close.
/// At most `max_buffers` are kept; the rest are freed as usual.
pub struct BufferPool {
    layout: Layout,
    max_buffers: usize,
    free: std::sync::Mutex<Vec<NonNull<u8>>>,
    reused: AtomicU64,
    fresh: AtomicU64,
}

// SAFETY: the pool owns the buffers in `free` exclusively (no ring refers to
// them any more: a buffer enters the pool only when its ring's last endpoint
// is gone, and leaves it into exactly one new ring); the list is behind a mutex.
unsafe impl Send for BufferPool {}
// SAFETY: as for `Send`; every access to `free` takes the mutex.
unsafe impl Sync for BufferPool {}

impl BufferPool {
    /// A pool for rings shaped like `config`, keeping at most `max_buffers`.
    pub fn new(config: &RingConfig, max_buffers: usize) -> Result<BufferPool, RingConfigError> {
        config.validate()?;
        Ok(BufferPool {
            layout: ring_layout(config)?,
            max_buffers,
            free: std::sync::Mutex::new(Vec::new()),
            reused: AtomicU64::new(0),
            fresh: AtomicU64::new(0),
        })
    }

    /// Buffers waiting for a ring now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no buffer waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rings built from a kept buffer, and rings that needed a fresh one.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.reused.load(Ordering::Relaxed),
            self.fresh.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<NonNull<u8>>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(&self, layout: Layout) -> Option<NonNull<u8>> {
        if layout != self.layout {
            return None;
        }
        self.lock().pop()
    }

    /// Keeps `buf` if there is room and it has this pool's shape.
    fn give_back(&self, buf: NonNull<u8>, layout: Layout) -> bool {
        if layout != self.layout {
            return false;
        }
        let mut free = self.lock();
        if free.len() >= self.max_buffers {
            return false;
        }
        free.push(buf);
        true
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        for buf in self.lock().drain(..) {
            // SAFETY: every buffer in the pool was allocated with `layout` (checked
            // on the way in) and is owned by the pool alone.
            unsafe { alloc::dealloc(buf.as_ptr(), self.layout) }
        }
    }
}

fn ring_layout(config: &RingConfig) -> Result<Layout, RingConfigError> {
    Layout::from_size_align(config.slots * config.slot_size, 128).map_err(|_| {
        RingConfigError::TooLarge {
            slots: config.slots,
            slot_size: config.slot_size,
        }
    })
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
        let layout = ring_layout(&config)?;
        Ok(Ring::assemble(config, layout, Ring::fresh(layout), None))
    }

    /// Like [`Ring::create`], on a buffer from `pool` when it has one of this
    /// shape (a ring of another shape gets a fresh buffer, not kept after).
    /// The buffer goes back to the pool when the ring's last endpoint goes.
    pub fn create_pooled(
        config: RingConfig,
        pool: &Arc<BufferPool>,
    ) -> Result<(Producer, Vec<Consumer>), RingConfigError> {
        config.validate()?;
        let layout = ring_layout(&config)?;
        let buf = match pool.take(layout) {
            Some(buf) => {
                // Only the stamps matter: no stamp may equal `position + 1` for
                // a position the new ring has not published. Lengths and
                // payloads are written before their stamps, as always.
                for i in 0..config.slots {
                    // SAFETY: slot `i` lies inside the buffer (i < slots), and
                    // its first 8 bytes are an aligned stamp word; the buffer
                    // is ours alone until the ring is assembled.
                    unsafe {
                        (buf.as_ptr().add(i * config.slot_size) as *mut u64).write(0);
                    }
                }
                pool.reused.fetch_add(1, Ordering::Relaxed);
                buf
            }
            None => {
                pool.fresh.fetch_add(1, Ordering::Relaxed);
                Ring::fresh(layout)
            }
        };
        Ok(Ring::assemble(config, layout, buf, Some(Arc::clone(pool))))
    }

    /// A zeroed buffer for `layout`.
    fn fresh(layout: Layout) -> NonNull<u8> {
        // SAFETY: layout has non-zero size (slots >= 2, slot_size >= 32).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(buf) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        buf
    }

    /// The endpoints around `buf` (zeroed, or with every stamp reset).
    fn assemble(
        config: RingConfig,
        layout: Layout,
        buf: NonNull<u8>,
        pool: Option<Arc<BufferPool>>,
    ) -> (Producer, Vec<Consumer>) {
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
            pool,
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
        (producer, consumers)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(slots: usize, consumers: usize) -> (Producer, Vec<Consumer>) {
        Ring::create(RingConfig {
            slots,
            consumers,
            ..RingConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn config_errors_name_the_field() {
        let bad = |c: RingConfig| Ring::create(c).err().unwrap().to_string();
        let d = RingConfig::default();
        assert!(bad(RingConfig { slots: 3, ..d }).contains("power of two"));
        assert!(bad(RingConfig { slot_size: 40, ..d }).contains("slot_size"));
        assert!(bad(RingConfig { consumers: 0, ..d }).contains("consumer"));
        assert!(
            bad(RingConfig {
                publish_batch: 0,
                ..d
            })
            .contains("batch")
        );
        assert!(
            bad(RingConfig {
                slots: 1 << 60,
                slot_size: 1 << 10,
                ..d
            })
            .contains("too large")
        );
    }

    #[test]
    fn messages_arrive_in_order_and_in_place() {
        let (mut p, mut cs) = ring(8, 1);
        let c = &mut cs[0];
        for i in 0..5u8 {
            let mut s = p.try_reserve().unwrap();
            s[0] = i;
            s[1] = i * 2;
            s.commit(2);
        }
        for i in 0..5u8 {
            let m = c.try_recv().ok().unwrap();
            assert_eq!(&*m, &[i, i * 2]);
        }
        assert!(matches!(c.try_recv(), Err(Recv::Empty)));
    }

    #[test]
    fn unpublished_messages_are_invisible_until_publish() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 8,
            publish_batch: 4,
            ..RingConfig::default()
        })
        .unwrap();
        p.try_push(b"a").unwrap();
        p.try_push(b"b").unwrap();
        assert!(matches!(cs[0].try_recv(), Err(Recv::Empty)));
        assert_eq!(p.unpublished(), 2);
        p.publish();
        assert_eq!(&*cs[0].try_recv().ok().unwrap(), b"a");
        // The fourth commit publishes automatically.
        for m in [b"c", b"d", b"e", b"f"] {
            p.try_push(m).unwrap();
        }
        assert_eq!(&*cs[0].try_recv().ok().unwrap(), b"b");
        assert_eq!(&*cs[0].try_recv().ok().unwrap(), b"c");
    }

    #[test]
    fn full_ring_refuses_until_consumer_releases() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 4,
            release_batch: 4,
            ..RingConfig::default()
        })
        .unwrap();
        for i in 0..4u8 {
            assert!(p.try_push(&[i]).unwrap());
        }
        assert!(!p.try_push(&[9]).unwrap(), "a full ring must refuse");
        drop(cs[0].try_recv().ok().unwrap());
        // Read but not released (release batch 4): still full.
        assert!(!p.try_push(&[9]).unwrap());
        cs[0].release();
        assert!(p.try_push(&[9]).unwrap());
    }

    #[test]
    fn probe_sees_published_occupancy_and_departed_consumers() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 4,
            consumers: 2,
            publish_batch: 1,
            release_batch: 1,
            ..RingConfig::default()
        })
        .unwrap();
        let probe = p.probe();
        assert_eq!(
            probe.snapshot(),
            RingSnapshot {
                capacity: 4,
                ..RingSnapshot::default()
            }
        );
        for i in 0..3u8 {
            assert!(p.try_push(&[i]).unwrap());
        }
        drop(cs[0].try_recv().ok().unwrap());
        let s = probe.snapshot();
        assert_eq!(
            (s.published, s.occupancy),
            (3, 3),
            "the slower consumer holds all three"
        );
        // The slow consumer leaves: only the live one's head counts.
        drop(cs.remove(1));
        assert_eq!(probe.snapshot().occupancy, 2);
    }

    #[test]
    fn multicast_delivers_every_message_to_every_consumer() {
        let (mut p, mut cs) = ring(4, 3);
        for i in 0..3u8 {
            p.try_push(&[i]).unwrap();
        }
        for c in cs.iter_mut() {
            for i in 0..3u8 {
                assert_eq!(&*c.try_recv().ok().unwrap(), &[i]);
            }
        }
    }

    #[test]
    fn slowest_multicast_consumer_holds_the_producer() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 2,
            consumers: 2,
            release_batch: 1,
            ..RingConfig::default()
        })
        .unwrap();
        p.try_push(b"1").unwrap();
        p.try_push(b"2").unwrap();
        drop(cs[0].try_recv().ok().unwrap());
        drop(cs[0].try_recv().ok().unwrap());
        assert!(!p.try_push(b"3").unwrap(), "consumer 1 has read nothing");
        drop(cs[1].try_recv().ok().unwrap());
        assert!(p.try_push(b"3").unwrap());
    }

    #[test]
    fn departed_consumer_frees_the_producer() {
        let (mut p, mut cs) = ring(2, 2);
        p.try_push(b"1").unwrap();
        p.try_push(b"2").unwrap();
        let c1 = cs.pop().unwrap();
        drop(c1);
        drop(cs[0].try_recv().ok().unwrap());
        cs[0].release();
        assert!(p.try_push(b"3").unwrap());
        drop(cs);
        assert!(p.is_disconnected());
    }

    #[test]
    fn closed_after_producer_drop_and_drain() {
        let (mut p, mut cs) = ring(4, 1);
        p.try_push(b"x").unwrap();
        drop(p);
        assert_eq!(&*cs[0].try_recv().ok().unwrap(), b"x");
        assert!(matches!(cs[0].try_recv(), Err(Recv::Closed)));
    }

    #[test]
    fn oversized_message_is_an_error() {
        let (mut p, _cs) = ring(4, 1);
        let big = vec![0u8; 200];
        let e = p.try_push(&big).unwrap_err();
        assert_eq!(e.capacity, DEFAULT_SLOT_SIZE - SLOT_HEADER);
        assert!(e.to_string().contains("200 bytes"));
    }

    #[test]
    fn batch_reads_everything_published_in_order() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 8,
            publish_batch: 3,
            release_batch: 2,
            ..RingConfig::default()
        })
        .unwrap();
        let mut got = Vec::new();
        for round in 0..50u8 {
            for i in 0..5u8 {
                while !p.try_push(&[round, i]).unwrap() {
                    while let Ok(n) = cs[0].recv_batch(4, |m| {
                        got.push((m[0], m[1]));
                        true
                    }) {
                        assert!(n <= 4);
                    }
                }
            }
            p.publish();
        }
        while cs[0]
            .recv_batch(8, |m| {
                got.push((m[0], m[1]));
                true
            })
            .is_ok()
        {}
        let want: Vec<(u8, u8)> = (0..50u8)
            .flat_map(|r| (0..5u8).map(move |i| (r, i)))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn stamps_survive_many_laps() {
        let (mut p, mut cs) = ring(2, 1);
        for i in 0..1000u32 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
            let m = cs[0].try_recv().ok().unwrap();
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
        }
    }

    #[test]
    fn pooled_buffer_comes_back_without_stale_messages() {
        let cfg = RingConfig {
            slots: 8,
            slot_size: 64,
            consumers: 1,
            publish_batch: 1,
            release_batch: 1,
        };
        let pool = Arc::new(BufferPool::new(&cfg, 2).unwrap());
        // First life: 3 messages in the first lap (stamps 1, 2, 3: exactly what
        // a new ring's consumer waits for at positions 0, 1, 2), one read.
        let (mut p, mut cs) = Ring::create_pooled(cfg, &pool).unwrap();
        for i in 0..3u32 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
        }
        assert!(cs[0].try_recv().is_ok());
        drop(p);
        assert!(pool.is_empty(), "a consumer still holds the ring");
        drop(cs);
        assert_eq!(pool.len(), 1);
        // Second life on the same buffer: nothing readable until published.
        let (mut p, mut cs) = Ring::create_pooled(cfg, &pool).unwrap();
        assert_eq!(pool.counts(), (1, 1));
        assert!(pool.is_empty());
        for _ in 0..20 {
            assert!(matches!(cs[0].try_recv(), Err(Recv::Empty)));
            assert_eq!(cs[0].recv_batch(8, |_| true), Err(Recv::Empty));
        }
        for i in 100..120u32 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
            let m = cs[0].try_recv().ok().unwrap();
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
        }
    }

    #[test]
    fn pool_keeps_at_most_its_limit_and_only_its_shape() {
        let cfg = RingConfig {
            slots: 4,
            slot_size: 32,
            ..RingConfig::default()
        };
        let pool = Arc::new(BufferPool::new(&cfg, 1).unwrap());
        let a = Ring::create_pooled(cfg, &pool).unwrap();
        let b = Ring::create_pooled(cfg, &pool).unwrap();
        let other = RingConfig { slots: 8, ..cfg };
        let c = Ring::create_pooled(other, &pool).unwrap();
        drop((a, b, c));
        assert_eq!(pool.len(), 1, "one kept, one freed, the other shape freed");
        assert_eq!(pool.counts(), (0, 3));
    }
}
