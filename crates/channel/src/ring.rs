//! The shared-memory ring between cores: one producer, one or more consumers
//! (unicast is the one-consumer case, multicast the N-consumer case).
//!
//! The design follows HYDRA's InRing (§5.5) mapped to today's hardware, in the
//! shape of the fastest known single-producer rings (Lamport's queue with the
//! cached indices of Rigtorp's `SPSCQueue`, rtrb and folly's
//! `ProducerConsumerQueue`):
//!
//! * **Zero copy.** The producer reserves a slot and writes its message straight
//!   into it ([`Producer::try_reserve`], or [`Producer::try_reserve_batch`] for
//!   many); every consumer reads the message in place from that same slot.
//! * **Indices, not stamps.** The producer publishes by storing its position
//!   into one shared `tail` (release); a consumer releases slots by storing its
//!   position into its own `head` (release). Nothing else is shared: a slot's
//!   length lives in a side array of `u32`s (sixteen to a cache line), written
//!   and read with plain stores and loads that the index stores order.
//! * **Cached indices.** Each side keeps a private copy of the other's index
//!   and reloads the shared one only when its copy says full (producer) or
//!   empty (consumer). On the fast path neither side touches a line the other
//!   writes, apart from the slots themselves.
//! * **One release store per batch.** [`Producer::publish`] is a single store of
//!   the tail however many messages it publishes; the producer publishes on its
//!   own every `publish_batch` commits, and a [`BatchMut`] publishes once when
//!   it is committed. Consumers hand slots back every `release_batch` reads.
//!   No read-modify-write atomics and no fences anywhere on the data path.
//! * **Padding.** The tail, each consumer's head, the liveness count and the
//!   counters each sit in their own 128-byte block ([`CachePadded`]), so the
//!   adjacent-line prefetcher never pulls a line one side writes into the other
//!   side's pair. Payloads are laid out at a stride of their capacity rounded
//!   to a power of two up to 64 bytes and to whole cache lines above it, so a
//!   64-byte message occupies exactly one line instead of straddling two.
//! * **Power-of-two mask.** Positions are free-running `u64`s; a slot is
//!   `pos & (slots - 1)`.
//! * **Closing** is the top bit of the tail word, so a consumer that finds the
//!   ring empty learns from the same load whether it will stay empty.
//! * **Pooled buffers** (optional). [`Ring::create_pooled`] builds a ring on
//!   the buffer of one that went away, kept in a [`BufferPool`], for owners
//!   that build and drop many rings (a server's rings per connection). Nothing
//!   in a kept buffer is reset: every piece of ring state lives in the
//!   indices, which each ring starts at 0, and a consumer reads a slot's
//!   length and payload only below a tail its own producer published, after
//!   that producer wrote them. The previous ring's lengths and payloads are
//!   therefore never read; they are only what the new producer sees in a
//!   slot it reserved before it writes it, as it would see its own messages
//!   of a lap ago.
//!
//! **Why consumers wait on the tail and not on a per-slot stamp.** The ring
//! before issue 17 put an 8-byte stamp and the length in front of each payload
//! and had consumers wait on the stamp, so that a small message and its "ready"
//! signal shared a cache line. For the 64-byte messages the benchmark moves,
//! that header pushed every message onto two lines, and the producer paid a
//! release store per message into each slot besides the tail. Waiting on the
//! cached tail instead lets a 64-byte payload fill exactly one line. The cost
//! is on the round trip: the consumer now fetches the tail's line and then the
//! message's, where the stamp let one fetch do both for messages of up to 48
//! bytes. `benches/ring.rs` measures both designs in one run (the old ring is
//! kept there as `old_ring`) and BENCHMARKS.md records the result: throughput
//! gains several-fold, and the round trip for 64-byte messages, which spanned
//! two lines under the stamp design too, does not get measurably slower.
//!
//! `slot_size` still counts [`SLOT_HEADER`] bytes that are not payload, so
//! `slot_size - SLOT_HEADER` stays the payload capacity every user sizes by;
//! the length those bytes used to hold is now in the side array.
//!
//! Back-pressure and drops are policies layered on top (see `crate::sender`):
//! the ring itself only reports "full".
//!
//! Hand-rolled rather than taken from a crate because no maintained crate offers
//! in-place (zero-copy) variable-length slots with batched publication *and*
//! multicast; `benches/ring.rs` compares it with rtrb, ringbuf, crossbeam and
//! std mpsc. `tests/loom.rs` model-checks the publish/release protocol (run with
//! `RUSTFLAGS="--cfg loom" cargo test -p sidecore-channel --test loom --release`):
//! under `cfg(loom)` the protocol's atomics are loom's and every slot access is
//! registered with a loom cell, so a missing happens-before edge between a
//! write and a read of the same slot fails the model.

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use crossbeam_utils::CachePadded;

#[cfg(loom)]
use loom::sync::{
    Arc,
    atomic::{AtomicU64, AtomicUsize},
};
#[cfg(not(loom))]
use std::sync::{
    Arc,
    atomic::{AtomicU64, AtomicUsize},
};

/// Bytes of each configured `slot_size` that are not payload. The ring once
/// kept a 16-byte header (stamp and length) in front of each payload; the
/// length now lives in a side array, and the constant stays so that
/// `slot_size - SLOT_HEADER` remains the payload capacity.
pub const SLOT_HEADER: usize = 16;

/// Slot size used when a caller does not care: room for a 112-byte message.
pub const DEFAULT_SLOT_SIZE: usize = 128;

/// A cache line: payloads of up to this many bytes never straddle two.
const CACHE_LINE_BYTES: usize = 64;

/// Alignment of the slot memory and of the length array: a pair of lines,
/// the unit the adjacent-line prefetcher fetches.
const BLOCK_BYTES: usize = 128;

/// Set in the tail word once the producer is gone.
const CLOSED: u64 = 1 << 63;

/// The head a departed consumer leaves behind: far ahead of any position, so
/// it never holds the producer back.
const DEPARTED: u64 = u64::MAX / 2;

/// The shape of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of slots; a power of two, at least 2.
    pub slots: usize,
    /// Bytes per slot including the [`SLOT_HEADER`]; a multiple of 16.
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
        if Geometry::layout(self.slots, self.payload_capacity()).is_none() {
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
    pub dropped: std::sync::atomic::AtomicU64,
    /// Times a reliable sender had to wait for space.
    pub full_waits: std::sync::atomic::AtomicU64,
}

/// Where the slots and their lengths are: copied into every endpoint so the
/// hot path reads only its own fields, the slots and the length array.
#[derive(Clone, Copy)]
struct Geometry {
    slots: NonNull<u8>,
    lens: NonNull<u32>,
    mask: u64,
    /// Distance between two payloads.
    stride: usize,
    /// Largest message a slot carries (`slot_size - SLOT_HEADER`).
    payload_cap: usize,
}

// SAFETY: a Geometry points into the buffer owned by `Shared`; every endpoint
// that carries one also holds the `Arc<Shared>`, so the memory lives as long
// as the endpoint, on whatever thread it moves to. Access is synchronised by
// the tail and head protocol described on `Shared`.
unsafe impl Send for Geometry {}

impl Geometry {
    /// Bytes between payloads for a capacity: a power of two up to a cache
    /// line, whole lines above it, so no payload of up to a line straddles two.
    fn stride(payload_cap: usize) -> usize {
        if payload_cap <= CACHE_LINE_BYTES {
            payload_cap.next_power_of_two()
        } else {
            payload_cap.next_multiple_of(CACHE_LINE_BYTES)
        }
    }

    /// The allocation for `slots` payloads and their lengths, and the offset of
    /// the length array in it; `None` if it would not fit the address space.
    fn layout(slots: usize, payload_cap: usize) -> Option<(Layout, usize)> {
        let payload_bytes = slots.checked_mul(Self::stride(payload_cap))?;
        let lens_at = payload_bytes.checked_next_multiple_of(BLOCK_BYTES)?;
        let lens_bytes = slots
            .checked_mul(size_of::<u32>())?
            .checked_next_multiple_of(BLOCK_BYTES)?;
        let total = lens_at.checked_add(lens_bytes)?;
        if total > isize::MAX as usize / 2 {
            return None;
        }
        Some((Layout::from_size_align(total, BLOCK_BYTES).ok()?, lens_at))
    }

    #[inline(always)]
    fn payload_ptr(&self, pos: u64) -> *mut u8 {
        let idx = (pos & self.mask) as usize;
        // SAFETY: idx < slots and the payload area spans slots * stride bytes
        // from `slots`, so the offset stays inside the allocation.
        unsafe { self.slots.as_ptr().add(idx * self.stride) }
    }

    #[inline(always)]
    fn len_ptr(&self, pos: u64) -> *mut u32 {
        let idx = (pos & self.mask) as usize;
        // SAFETY: idx < slots and the length array holds `slots` u32s.
        unsafe { self.lens.as_ptr().add(idx) }
    }
}

/// The memory and indices shared by the producer and the consumers. Every
/// field that one side writes sits in its own 128-byte block.
///
/// The protocol: the producer writes a slot's payload and length, then stores
/// a tail beyond it (release); a consumer loads the tail (acquire) before it
/// reads any slot below it. A consumer stores its head beyond a slot (release)
/// once it no longer reads the slot; the producer loads every head (acquire)
/// before it writes a slot one lap ahead of the smallest.
struct Shared {
    geo: Geometry,
    layout: Layout,
    /// Position up to which the producer has published (exclusive), with
    /// [`CLOSED`] set once the producer is gone.
    tail: CachePadded<AtomicU64>,
    /// Per consumer: position up to which it has released slots (exclusive),
    /// [`DEPARTED`] once it is gone.
    heads: Box<[CachePadded<AtomicU64>]>,
    /// Consumers still attached.
    consumers_alive: CachePadded<AtomicUsize>,
    stats: CachePadded<RingStats>,
    /// Where the buffer goes when the ring does (kept for the next ring of
    /// the same shape instead of freed), if anywhere.
    pool: Option<std::sync::Arc<BufferPool>>,
    /// Under loom: one cell per slot, touched wherever a slot is written or
    /// read, so that loom reports any access the protocol leaves unordered.
    #[cfg(loom)]
    cells: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: `Shared` owns its buffer; all cross-thread access to slot memory is
// ordered by the protocol above (release stores of the tail and of the heads,
// acquire loads of them before the slots they cover are touched). The indices
// themselves are atomics.
unsafe impl Send for Shared {}
// SAFETY: see the `Send` impl; no method hands out unsynchronised `&mut` to
// memory that another thread may access at the same time.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool
            && pool.give_back(self.geo.slots, self.layout)
        {
            return;
        }
        // SAFETY: the buffer was allocated with exactly `layout` (in
        // `Ring::fresh_buffer`, possibly for an earlier ring of the same pool),
        // starting at `geo.slots`, and `Shared` is dropped once, when the last
        // `Arc` goes away.
        unsafe { alloc::dealloc(self.geo.slots.as_ptr(), self.layout) }
    }
}

/// Buffers of rings that went away, kept for new rings of the same shape:
/// a ring built with [`Ring::create_pooled`] takes one if there is one and
/// gives it back when both of its ends are gone, so a server that builds
/// rings per connection neither zeroes nor faults in fresh pages, nor unmaps
/// them (a TLB shootdown) on close. A kept buffer is reused as it is (see the
/// module's "Pooled buffers": no ring state lives in it). At most
/// `max_buffers` are kept; the rest are freed as usual.
pub struct BufferPool {
    /// The shape of the rings this pool serves.
    slots: usize,
    slot_size: usize,
    layout: Layout,
    max_buffers: usize,
    free: std::sync::Mutex<Vec<NonNull<u8>>>,
    reused: std::sync::atomic::AtomicU64,
    fresh: std::sync::atomic::AtomicU64,
}

// SAFETY: the pool owns the buffers in `free` exclusively (no ring refers to
// them any more: a buffer enters the pool only when its ring's last endpoint
// is gone, and leaves it into exactly one new ring); the list is behind a
// mutex, whose lock and unlock also order the old ring's last accesses before
// the new ring's first.
unsafe impl Send for BufferPool {}
// SAFETY: as for `Send`; every access to `free` takes the mutex.
unsafe impl Sync for BufferPool {}

impl BufferPool {
    /// A pool for rings shaped like `config` (its `slots` and `slot_size`),
    /// keeping at most `max_buffers`.
    pub fn new(config: &RingConfig, max_buffers: usize) -> Result<BufferPool, RingConfigError> {
        config.validate()?;
        let (layout, _) = Geometry::layout(config.slots, config.payload_capacity()).ok_or(
            RingConfigError::TooLarge {
                slots: config.slots,
                slot_size: config.slot_size,
            },
        )?;
        Ok(BufferPool {
            slots: config.slots,
            slot_size: config.slot_size,
            layout,
            max_buffers,
            free: std::sync::Mutex::new(Vec::new()),
            reused: std::sync::atomic::AtomicU64::new(0),
            fresh: std::sync::atomic::AtomicU64::new(0),
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

    /// True when rings shaped like `config` use this pool's buffers.
    fn fits(&self, config: &RingConfig) -> bool {
        config.slots == self.slots && config.slot_size == self.slot_size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<NonNull<u8>>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `buf` if there is room (it has this pool's layout: only rings
    /// that `fits` are given the pool).
    fn give_back(&self, buf: NonNull<u8>, layout: Layout) -> bool {
        assert_eq!(
            layout, self.layout,
            "ring buffer pool: given a buffer of another layout"
        );
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
            // SAFETY: every buffer in the pool was allocated with `layout`
            // (asserted on the way in) and is owned by the pool alone.
            unsafe { alloc::dealloc(buf.as_ptr(), self.layout) }
        }
    }
}

impl Shared {
    /// The smallest head of the consumers (a departed one counts as
    /// [`DEPARTED`], so it holds nobody back).
    fn min_head(&self) -> u64 {
        self.heads
            .iter()
            .map(|h| h.load(Ordering::Acquire))
            .min()
            .unwrap_or(DEPARTED)
    }

    /// Registers a write of the slot at `pos` with loom; nothing otherwise.
    #[inline(always)]
    fn track_write(&self, pos: u64) {
        #[cfg(loom)]
        self.cells[(pos & self.geo.mask) as usize].with_mut(|_| ());
        let _ = pos;
    }

    /// Registers a read of the slot at `pos` with loom; nothing otherwise.
    #[inline(always)]
    fn track_read(&self, pos: u64) {
        #[cfg(loom)]
        self.cells[(pos & self.geo.mask) as usize].with(|_| ());
        let _ = pos;
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
        let published = s.tail.load(Ordering::Acquire) & !CLOSED;
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
        let (layout, lens_at) = Ring::layout(&config)?;
        let buf = Ring::fresh_buffer(layout);
        Ok(Ring::assemble(config, layout, lens_at, buf, None))
    }

    /// Like [`Ring::create`], on a buffer kept in `pool` when it has one
    /// (reused as it is: no ring state lives in the buffer). The buffer goes
    /// back to the pool when the ring's last endpoint goes. A ring of another
    /// shape than the pool's gets a fresh buffer, freed after.
    pub fn create_pooled(
        config: RingConfig,
        pool: &std::sync::Arc<BufferPool>,
    ) -> Result<(Producer, Vec<Consumer>), RingConfigError> {
        let (layout, lens_at) = Ring::layout(&config)?;
        if !pool.fits(&config) {
            pool.fresh.fetch_add(1, Ordering::Relaxed);
            let buf = Ring::fresh_buffer(layout);
            return Ok(Ring::assemble(config, layout, lens_at, buf, None));
        }
        let kept = pool.lock().pop();
        let buf = match kept {
            Some(buf) => {
                pool.reused.fetch_add(1, Ordering::Relaxed);
                buf
            }
            None => {
                pool.fresh.fetch_add(1, Ordering::Relaxed);
                Ring::fresh_buffer(layout)
            }
        };
        let pool = Some(std::sync::Arc::clone(pool));
        Ok(Ring::assemble(config, layout, lens_at, buf, pool))
    }

    /// The checked configuration's buffer layout and the offset of its length
    /// array.
    fn layout(config: &RingConfig) -> Result<(Layout, usize), RingConfigError> {
        config.validate()?;
        Geometry::layout(config.slots, config.payload_capacity()).ok_or(RingConfigError::TooLarge {
            slots: config.slots,
            slot_size: config.slot_size,
        })
    }

    /// A zeroed buffer for `layout`.
    fn fresh_buffer(layout: Layout) -> NonNull<u8> {
        // SAFETY: layout has non-zero size (at least one 128-byte block for
        // the lengths). Zeroed, so a reserved slot reads as bytes, never as
        // uninitialised memory.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(buf) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        buf
    }

    /// The endpoints around `slots`, a buffer of `layout` (fresh, or kept by
    /// `pool`, which takes it back when the ring goes).
    fn assemble(
        config: RingConfig,
        layout: Layout,
        lens_at: usize,
        slots: NonNull<u8>,
        pool: Option<std::sync::Arc<BufferPool>>,
    ) -> (Producer, Vec<Consumer>) {
        let payload_cap = config.payload_capacity();
        // SAFETY: lens_at + slots * 4 <= layout.size() (see Geometry::layout),
        // and lens_at is a multiple of 128, so the array is aligned for u32.
        let lens = unsafe { slots.add(lens_at) }.cast::<u32>();
        let geo = Geometry {
            slots,
            lens,
            mask: (config.slots - 1) as u64,
            stride: Geometry::stride(payload_cap),
            payload_cap,
        };
        let shared = Arc::new(Shared {
            geo,
            layout,
            tail: CachePadded::new(AtomicU64::new(0)),
            heads: (0..config.consumers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            consumers_alive: CachePadded::new(AtomicUsize::new(config.consumers)),
            stats: CachePadded::new(RingStats::default()),
            pool,
            #[cfg(loom)]
            cells: (0..config.slots)
                .map(|_| loom::cell::UnsafeCell::new(()))
                .collect(),
        });
        let capacity = config.slots as u64;
        let producer = Producer {
            geo,
            shared: Arc::clone(&shared),
            capacity,
            next: 0,
            published: 0,
            head_cache: 0,
            publish_batch: config.publish_batch.min(config.slots) as u64,
            _not_sync: PhantomData,
        };
        let consumers = (0..config.consumers)
            .map(|index| Consumer {
                geo,
                shared: Arc::clone(&shared),
                index,
                capacity,
                head: 0,
                tail_cache: Cell::new(0),
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
    /// Next position to write.
    next: u64,
    /// Positions below this are published (the last tail stored).
    published: u64,
    /// Cached minimum of the consumers' heads: positions below it are free
    /// to rewrite one lap on.
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

/// Up to `capacity()` slots reserved at once ([`Producer::try_reserve_batch`]):
/// write messages into them in order with [`push_with`](BatchMut::push_with)
/// or [`push`](BatchMut::push), then [`commit`](BatchMut::commit) — one release
/// store publishes them all. Dropping the batch commits what was written.
pub struct BatchMut<'a> {
    producer: &'a mut Producer,
    /// Position one past the last reserved slot.
    end: u64,
    /// Position of the first slot of the batch.
    start: u64,
}

impl Producer {
    /// Largest message a slot can carry.
    pub fn payload_capacity(&self) -> usize {
        self.geo.payload_cap
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

    /// Free slots by the cached view of the consumers' heads.
    #[inline(always)]
    fn cached_free(&self) -> u64 {
        self.capacity - self.next.saturating_sub(self.head_cache)
    }

    /// Reloads the consumers' heads and returns the free slots.
    #[cold]
    fn refresh_heads(&mut self) -> u64 {
        let head = self.shared.min_head();
        // A live consumer never releases what was not written; a departed one
        // parks at DEPARTED. Heads only grow.
        assert!(
            (head >= self.head_cache && head <= self.next) || head == DEPARTED,
            "ring producer at {}: consumers' head went from {} to {head}",
            self.next,
            self.head_cache
        );
        self.head_cache = head;
        self.cached_free()
    }

    /// Free slots as far as this producer knows, refreshing the consumers' heads
    /// only if the cached view shows none.
    #[inline]
    pub fn free_slots(&mut self) -> u64 {
        match self.cached_free() {
            0 => self.refresh_heads(),
            free => free,
        }
    }

    /// Free slots, reloading the consumers' heads when the cached view shows
    /// fewer than `want`: for once-a-turn back-pressure decisions, where a
    /// stale small count would hold a sender that needs `want` slots back
    /// for good, while a roomy cached view costs no shared-line read.
    pub fn free_slots_at_least(&mut self, want: u64) -> u64 {
        match self.cached_free() {
            free if free >= want => free,
            _ => self.refresh_heads(),
        }
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
        self.shared.track_write(self.next);
        Some(SlotMut {
            producer: self,
            len: 0,
        })
    }

    /// Reserves up to `max` slots at once (as many as are free, reloading the
    /// consumers' heads only when the cached view shows fewer than `max`), or
    /// returns `None` if the ring is full or `max` is 0. Committing the batch
    /// publishes everything committed so far with one release store.
    #[inline]
    pub fn try_reserve_batch(&mut self, max: usize) -> Option<BatchMut<'_>> {
        let free = self.free_slots_at_least(max as u64);
        let n = free.min(max as u64);
        if n == 0 {
            self.publish();
            return None;
        }
        let start = self.next;
        Some(BatchMut {
            producer: self,
            end: start + n,
            start,
        })
    }

    /// Copies `msg` into the next slot and commits it. Returns `false` if the ring
    /// is full. Panics never; a message larger than a slot is an error.
    #[inline]
    pub fn try_push(&mut self, msg: &[u8]) -> Result<bool, MessageTooLarge> {
        if msg.len() > self.geo.payload_cap {
            return Err(MessageTooLarge {
                len: msg.len(),
                capacity: self.geo.payload_cap,
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

    /// Makes every committed slot visible to the consumers: one release store
    /// of the tail, however many slots.
    #[inline]
    pub fn publish(&mut self) {
        if self.published == self.next {
            return;
        }
        assert!(
            self.published < self.next
                && self.next - self.published <= self.capacity
                && self.next < CLOSED,
            "ring producer: publishing positions {}..{} of a {}-slot ring",
            self.published,
            self.next,
            self.capacity
        );
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

    /// Writes the length of the slot at `next` and moves past it.
    #[inline(always)]
    fn commit_at_next(&mut self, len: usize) {
        // The slot was free when reserved: the slowest consumer released it.
        assert!(
            self.next.saturating_sub(self.head_cache) < self.capacity
                && len <= self.geo.payload_cap,
            "ring producer: committing {len} bytes at position {} with the slowest consumer at {} ({} slots)",
            self.next,
            self.head_cache,
            self.capacity
        );
        self.shared.track_write(self.next);
        // SAFETY: the slot at `next` is reserved for us (the cached head, which
        // only trails the real one, says a consumer released it), and no
        // consumer reads it before a tail beyond it is published.
        unsafe { self.geo.len_ptr(self.next).write(len as u32) };
        self.next += 1;
    }

    #[inline]
    fn commit_slot(&mut self, len: usize) {
        self.commit_at_next(len);
        if self.next - self.published >= self.publish_batch {
            self.publish();
        }
    }

    /// The payload of the slot at `next`, which the caller has reserved.
    #[inline(always)]
    fn next_payload(&mut self) -> &mut [u8] {
        // SAFETY: the slot at `next` belongs to the producer until a tail
        // beyond it is published; its payload spans `payload_cap` bytes of the
        // buffer, and `&mut self` makes this the only live reference to it.
        unsafe {
            std::slice::from_raw_parts_mut(self.geo.payload_ptr(self.next), self.geo.payload_cap)
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        assert!(
            self.next < CLOSED,
            "ring producer: position {} overflows",
            self.next
        );
        self.shared
            .tail
            .store(self.next | CLOSED, Ordering::Release);
        self.published = self.next;
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
            len <= self.producer.geo.payload_cap,
            "commit of {len} bytes into a {}-byte slot",
            self.producer.geo.payload_cap
        );
        self.producer.commit_slot(len);
    }

    /// Sets the length that `Deref` exposes (for writers that append).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.producer.geo.payload_cap);
    }
}

impl Deref for SlotMut<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        let p = &*self.producer;
        // SAFETY: the slot at `next` belongs to the producer until it is
        // published; its payload spans `payload_cap` bytes inside the buffer.
        unsafe { std::slice::from_raw_parts(p.geo.payload_ptr(p.next), p.geo.payload_cap) }
    }
}

impl DerefMut for SlotMut<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.producer.next_payload()
    }
}

impl BatchMut<'_> {
    /// Slots reserved by this batch.
    pub fn capacity(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Messages written into the batch so far.
    pub fn len(&self) -> usize {
        (self.producer.next - self.start) as usize
    }

    /// True while nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.producer.next == self.start
    }

    /// Slots still free in the batch.
    pub fn remaining(&self) -> usize {
        (self.end - self.producer.next) as usize
    }

    /// Writes the next message in place: `write` gets the slot's payload and
    /// returns the message length. Returns `false` (without calling `write`)
    /// when every reserved slot is written.
    ///
    /// # Panics
    /// If `write` returns more than the slot's payload capacity.
    #[inline]
    pub fn push_with(&mut self, write: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if self.producer.next == self.end {
            return false;
        }
        self.producer.shared.track_write(self.producer.next);
        let len = write(self.producer.next_payload());
        self.producer.commit_at_next(len);
        true
    }

    /// Copies `msg` into the next slot. `Ok(false)` when the batch is full.
    #[inline]
    pub fn push(&mut self, msg: &[u8]) -> Result<bool, MessageTooLarge> {
        let capacity = self.producer.geo.payload_cap;
        if msg.len() > capacity {
            return Err(MessageTooLarge {
                len: msg.len(),
                capacity,
            });
        }
        Ok(self.push_with(|slot| {
            slot[..msg.len()].copy_from_slice(msg);
            msg.len()
        }))
    }

    /// Publishes every message written (and any committed before the batch)
    /// with one release store of the tail.
    #[inline]
    pub fn commit(self) {
        drop(self); // Drop publishes.
    }
}

impl Drop for BatchMut<'_> {
    #[inline]
    fn drop(&mut self) {
        self.producer.publish();
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
    capacity: u64,
    /// Next position to read.
    head: u64,
    /// Cached published tail: positions below it are readable. A `Cell` so that
    /// [`Consumer::available`] can refresh it through `&self`.
    tail_cache: Cell<u64>,
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

    /// Largest message a slot can carry.
    pub fn payload_capacity(&self) -> usize {
        self.geo.payload_cap
    }

    /// Loads the shared tail into the cache and returns the raw word (with
    /// [`CLOSED`] if the producer is gone).
    #[inline]
    fn refresh_tail(&self) -> u64 {
        let word = self.shared.tail.load(Ordering::Acquire);
        let tail = word & !CLOSED;
        // The tail only grows, and never laps a consumer that has not
        // released: the producer writes a slot only after every head passed it.
        assert!(
            tail >= self.tail_cache.get() && tail - self.head <= self.capacity,
            "ring consumer {}: tail went from {} to {tail} with head {} ({} slots)",
            self.index,
            self.tail_cache.get(),
            self.head,
            self.capacity
        );
        self.tail_cache.set(tail);
        word
    }

    /// Messages readable by the cached tail, reloading it when that shows
    /// none; `Err` (after releasing what was read) when there are none.
    #[inline(always)]
    fn ready(&mut self) -> Result<u64, Recv> {
        let ready = self.tail_cache.get() - self.head;
        if ready > 0 {
            return Ok(ready);
        }
        let word = self.refresh_tail();
        match self.tail_cache.get() - self.head {
            0 => {
                // Empty: hand back what we hold so a waiting producer can go on.
                self.release();
                Err(if word & CLOSED != 0 {
                    Recv::Closed
                } else {
                    Recv::Empty
                })
            }
            ready => Ok(ready),
        }
    }

    /// The length of the published message at `head`.
    #[inline(always)]
    fn len_at_head(&self) -> usize {
        self.shared.track_read(self.head);
        // SAFETY: head < tail_cache, a tail loaded with acquire, which
        // synchronises with the producer's release store after it wrote this
        // length; the producer does not rewrite it before we release it.
        let len = unsafe { self.geo.len_ptr(self.head).read() } as usize;
        // A published length never exceeds the slot's payload: the producer
        // checked it when it committed. Anything else is corrupted memory.
        assert!(
            len <= self.geo.payload_cap,
            "ring consumer {}: slot at position {} claims {len} bytes in a {}-byte slot",
            self.index,
            self.head,
            self.geo.payload_cap
        );
        len
    }

    /// Reads the next message in place.
    #[inline]
    pub fn try_recv(&mut self) -> Result<SlotRef<'_>, Recv> {
        self.ready()?;
        let len = self.len_at_head();
        Ok(SlotRef {
            consumer: self,
            len,
        })
    }

    /// Reads up to `max` messages in place, handing each to `f`, and returns how
    /// many were read. `f` returns `false` to stop after the current message.
    ///
    /// The batched path: the cached tail (reloaded only when it shows nothing)
    /// tells how many slots are ready, and their payloads are then read with
    /// no shared access in between, so the loads of consecutive slots overlap.
    #[inline]
    pub fn recv_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> Result<usize, Recv> {
        let ready = self.ready()?.min(max as u64);
        for n in 1..=ready {
            let len = self.len_at_head();
            // SAFETY: as in `len_at_head`; the payload spans `len` bytes of the
            // slot, within its capacity (checked there).
            let msg = unsafe { std::slice::from_raw_parts(self.geo.payload_ptr(self.head), len) };
            let go_on = f(msg);
            self.advance();
            if !go_on {
                return Ok(n as usize);
            }
        }
        Ok(ready as usize)
    }

    /// Number of messages ready to read: reloads the shared tail, so it is
    /// exact at the moment of the load.
    pub fn available(&self) -> u64 {
        self.refresh_tail();
        self.tail_cache.get() - self.head
    }

    /// Hands every slot read so far back to the producer.
    #[inline]
    pub fn release(&mut self) {
        if self.released != self.head {
            assert!(
                self.released < self.head && self.head <= self.tail_cache.get(),
                "ring consumer {}: releasing {}..{} past the tail {}",
                self.index,
                self.released,
                self.head,
                self.tail_cache.get()
            );
            self.shared.heads[self.index].store(self.head, Ordering::Release);
            self.released = self.head;
        }
    }

    /// True once the producer has gone away (there may still be messages to read).
    pub fn is_producer_closed(&self) -> bool {
        self.shared.tail.load(Ordering::Acquire) & CLOSED != 0
    }

    #[inline(always)]
    fn advance(&mut self) {
        self.shared.track_read(self.head);
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
        self.shared.heads[self.index].store(DEPARTED, Ordering::Release);
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
        let c = &*self.consumer;
        // SAFETY: the slot at `head` is published (try_recv found it below a
        // tail loaded with acquire) and cannot be rewritten until this
        // consumer releases it, which happens only after this SlotRef is
        // dropped; `len` was checked against the payload capacity.
        unsafe { std::slice::from_raw_parts(c.geo.payload_ptr(c.head), self.len) }
    }
}

impl Drop for SlotRef<'_> {
    #[inline]
    fn drop(&mut self) {
        self.consumer.advance();
    }
}

// Not under loom: loom's atomics work only inside a loom model.
#[cfg(not(loom))]
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
    fn indices_survive_many_laps() {
        let (mut p, mut cs) = ring(2, 1);
        for i in 0..1000u32 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
            let m = cs[0].try_recv().ok().unwrap();
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
        }
    }

    #[test]
    fn batch_reserve_takes_what_is_free_and_publishes_once_on_commit() {
        let (mut p, mut cs) = Ring::create(RingConfig {
            slots: 8,
            publish_batch: 1,
            release_batch: 8,
            ..RingConfig::default()
        })
        .unwrap();
        let mut b = p.try_reserve_batch(5).unwrap();
        assert_eq!((b.capacity(), b.len(), b.remaining()), (5, 0, 5));
        for i in 0..3u8 {
            assert!(b.push(&[i; 3]).unwrap());
        }
        assert!(b.push(&[0; 200]).is_err(), "too large for a slot");
        b.commit();
        assert_eq!((p.published(), p.unpublished()), (3, 0));
        // Five free slots are left, whatever is asked.
        let mut b = p.try_reserve_batch(64).unwrap();
        assert_eq!(b.capacity(), 5);
        while b.push_with(|s| {
            s[0] = 9;
            1
        }) {}
        assert_eq!(b.len(), 5);
        drop(b); // dropping commits too
        assert_eq!(p.published(), 8);
        assert!(p.try_reserve_batch(1).is_none(), "full");
        assert!(p.try_reserve_batch(0).is_none(), "nothing asked");
        let mut got = Vec::new();
        cs[0]
            .recv_batch(usize::MAX, |m| {
                got.push(m.to_vec());
                true
            })
            .unwrap();
        assert_eq!(got.len(), 8);
        assert_eq!(&got[..3], &[vec![0; 3], vec![1; 3], vec![2; 3]]);
        assert!(got[3..].iter().all(|m| m == &[9]));
        cs[0].release();
        assert_eq!(p.try_reserve_batch(64).unwrap().capacity(), 8);
    }

    #[test]
    fn payloads_never_straddle_a_cache_line() {
        for (cap, stride) in [
            (16, 16),
            (32, 32),
            (48, 64),
            (64, 64),
            (80, 128),
            (112, 128),
        ] {
            assert_eq!(Geometry::stride(cap), stride, "capacity {cap}");
        }
        assert_eq!(Geometry::stride(4096), 4096);
        let (p, _cs) = ring(4, 1);
        // The buffer is 128-byte aligned and a 112-byte payload gets 128 bytes.
        for pos in 0..4 {
            let at = p.geo.payload_ptr(pos) as usize;
            assert_eq!(at % 128, 0, "slot {pos}");
        }
        assert_eq!(p.geo.lens.as_ptr() as usize % 128, 0);
    }

    #[test]
    fn the_tail_word_carries_the_close() {
        let (mut p, mut cs) = ring(4, 2);
        p.try_push(b"last").unwrap();
        assert!(!cs[0].is_producer_closed());
        drop(p);
        assert!(cs[1].is_producer_closed());
        assert_eq!(cs[1].available(), 1, "closing does not count as a message");
        assert_eq!(&*cs[1].try_recv().ok().unwrap(), b"last");
        assert!(matches!(cs[1].try_recv(), Err(Recv::Closed)));
        assert!(matches!(cs[0].recv_batch(4, |m| m == b"last"), Ok(1)));
        assert!(matches!(cs[0].recv_batch(4, |_| true), Err(Recv::Closed)));
    }

    fn pool_config(consumers: usize) -> RingConfig {
        RingConfig {
            slots: 8,
            slot_size: 64,
            consumers,
            publish_batch: 1,
            release_batch: 1,
        }
    }

    /// Reads everything readable from `c` as owned messages.
    fn drain(c: &mut Consumer) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while let Ok(m) = c.try_recv() {
            got.push(m.to_vec());
        }
        got
    }

    #[test]
    fn a_kept_buffer_never_shows_the_previous_rings_messages() {
        let cfg = pool_config(2);
        let pool = Arc::new(BufferPool::new(&cfg, 2).unwrap());
        // First life: more than a lap of full-size messages, so that every
        // slot's payload and length hold one, eight of them published and
        // never read by consumer 1 when the ring goes.
        let (mut p, mut cs) = Ring::create_pooled(cfg, &pool).unwrap();
        let stale = |i: u8| [0xE0 | i; 48];
        for i in 0..8 {
            assert!(p.try_push(&stale(i)).unwrap());
        }
        for c in cs.iter_mut() {
            for _ in 0..5 {
                assert!(c.try_recv().is_ok());
            }
            c.release();
        }
        for i in 8..13 {
            assert!(p.try_push(&stale(i)).unwrap());
        }
        assert_eq!(drain(&mut cs[0]).len(), 8);
        drop(p);
        assert!(pool.is_empty(), "consumers still hold the ring");
        drop(cs);
        assert_eq!(pool.len(), 1);

        // Second life on the same buffer: nothing readable, not closed (the
        // close was the old ring's), until the new producer publishes.
        let (mut p, mut cs) = Ring::create_pooled(cfg, &pool).unwrap();
        assert_eq!(pool.counts(), (1, 1));
        assert!(pool.is_empty());
        for c in cs.iter_mut() {
            assert_eq!(c.available(), 0);
            assert!(!c.is_producer_closed());
            assert!(matches!(c.try_recv(), Err(Recv::Empty)));
            assert_eq!(c.recv_batch(8, |_| true), Err(Recv::Empty));
        }
        // Shorter messages (empty ones too) over three laps: each consumer
        // reads exactly what was sent, never an old length or old bytes.
        for i in 0..24u8 {
            let msg = vec![i; usize::from(i % 5)];
            assert!(p.try_push(&msg).unwrap());
            for c in cs.iter_mut() {
                assert_eq!(drain(c), vec![msg.clone()], "message {i}");
            }
        }
        drop(p);
        for c in cs.iter_mut() {
            assert!(matches!(c.try_recv(), Err(Recv::Closed)));
        }
    }

    #[test]
    fn kept_buffers_move_between_threads_and_rings() {
        // Twenty rings in turn on one kept buffer, each with its consumer on
        // another thread: every message names its ring and its number.
        let cfg = pool_config(1);
        let pool = Arc::new(BufferPool::new(&cfg, 1).unwrap());
        for r in 0..20u8 {
            let (mut p, mut cs) = Ring::create_pooled(cfg, &pool).unwrap();
            let mut c = cs.pop().unwrap();
            let reader = std::thread::spawn(move || {
                let mut next = 0u32;
                loop {
                    match c.try_recv() {
                        Ok(m) => {
                            assert_eq!(m.len(), 5 + (next % 40) as usize, "ring {r}");
                            assert_eq!(m[0], r, "a message of ring {} in ring {r}", m[0]);
                            assert_eq!(u32::from_le_bytes(m[1..5].try_into().unwrap()), next);
                            assert!(m[5..].iter().all(|&b| b == r));
                            next += 1;
                        }
                        Err(Recv::Empty) => std::thread::yield_now(),
                        Err(Recv::Closed) => return next,
                    }
                }
            });
            for i in 0..500u32 {
                let mut msg = vec![r; 5 + (i % 40) as usize];
                msg[1..5].copy_from_slice(&i.to_le_bytes());
                while !p.try_push(&msg).unwrap() {
                    std::thread::yield_now();
                }
            }
            drop(p);
            assert_eq!(reader.join().unwrap(), 500);
        }
        assert_eq!(pool.counts(), (19, 1));
        assert_eq!(pool.len(), 1);
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
        // Twice the slots in a buffer of the same size (the length array's
        // padding absorbs them): still another shape.
        let other = RingConfig { slots: 8, ..cfg };
        let c = Ring::create_pooled(other, &pool).unwrap();
        drop((a, b, c));
        assert_eq!(pool.len(), 1, "one kept, one freed, the other shape freed");
        assert_eq!(pool.counts(), (0, 3));
        let bad = RingConfig { slots: 3, ..cfg };
        assert!(BufferPool::new(&bad, 1).is_err());
        assert!(Ring::create_pooled(bad, &pool).is_err());
    }
}
