//! The *parallel* channel order (HYDRA §4.2.2: "parallel (un-synchronized)"):
//! one producer, several workers, each message handled by exactly one worker,
//! possibly concurrently and out of order with the others.
//!
//! A bounded queue in the style of Vyukov's MPMC array queue, specialised to one
//! producer and kept zero-copy: a worker claims a slot with a compare-and-swap on
//! the shared head, reads the message in place, and frees the slot when its
//! [`Claimed`] guard drops. crossbeam's `ArrayQueue` moves values in and out, so it
//! cannot give in-place access; hence this small hand-rolled queue.

use std::alloc::{self, Layout};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::ring::{MessageTooLarge, RingConfigError, SLOT_HEADER};

struct Shared {
    buf: NonNull<u8>,
    layout: Layout,
    mask: u64,
    slots: u64,
    slot_size: usize,
    /// Next position a worker may claim.
    head: CachePadded<AtomicU64>,
    producer_closed: AtomicBool,
}

// SAFETY: slot memory is handed between threads by the per-slot sequence words
// (release store after writing, acquire load before reading), and a slot is
// claimed by at most one worker thanks to the CAS on `head`.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: allocated in `work_queue` with this layout; dropped once.
        unsafe { alloc::dealloc(self.buf.as_ptr(), self.layout) }
    }
}

impl Shared {
    fn slot(&self, pos: u64) -> *mut u8 {
        // SAFETY: the masked index is inside the allocation.
        unsafe {
            self.buf
                .as_ptr()
                .add((pos & self.mask) as usize * self.slot_size)
        }
    }
    fn seq(&self, pos: u64) -> &AtomicU64 {
        // SAFETY: each slot starts with an aligned u64 sequence word that lives
        // as long as `self`.
        unsafe { &*(self.slot(pos) as *const AtomicU64) }
    }
}

/// Builds a parallel work queue of `slots` slots of `slot_size` bytes.
pub fn work_queue(
    slots: usize,
    slot_size: usize,
) -> Result<(WorkProducer, WorkConsumer), RingConfigError> {
    if slots < 2 || !slots.is_power_of_two() {
        return Err(RingConfigError::Slots(slots));
    }
    if slot_size < 32 || !slot_size.is_multiple_of(16) {
        return Err(RingConfigError::SlotSize(slot_size));
    }
    let too_large = RingConfigError::TooLarge { slots, slot_size };
    let bytes = slots.checked_mul(slot_size).ok_or(too_large.clone())?;
    let layout = Layout::from_size_align(bytes, 128).map_err(|_| too_large)?;
    // SAFETY: non-zero size checked above.
    let raw = unsafe { alloc::alloc_zeroed(layout) };
    let Some(buf) = NonNull::new(raw) else {
        alloc::handle_alloc_error(layout)
    };
    let shared = Arc::new(Shared {
        buf,
        layout,
        mask: slots as u64 - 1,
        slots: slots as u64,
        slot_size,
        head: CachePadded::new(AtomicU64::new(0)),
        producer_closed: AtomicBool::new(false),
    });
    for pos in 0..slots as u64 {
        shared.seq(pos).store(pos, Ordering::Relaxed);
    }
    Ok((
        WorkProducer {
            shared: Arc::clone(&shared),
            tail: 0,
        },
        WorkConsumer { shared },
    ))
}

/// The single producer of a parallel queue.
pub struct WorkProducer {
    shared: Arc<Shared>,
    tail: u64,
}

impl WorkProducer {
    /// Largest message a slot carries.
    pub fn payload_capacity(&self) -> usize {
        self.shared.slot_size - SLOT_HEADER
    }

    /// Writes a message in place; returns `Ok(false)` when the queue is full.
    pub fn try_send_with(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<bool, MessageTooLarge> {
        let pos = self.tail;
        if self.shared.seq(pos).load(Ordering::Acquire) != pos {
            return Ok(false);
        }
        let cap = self.payload_capacity();
        // SAFETY: seq == pos means every worker has freed this slot for this lap
        // and no worker can claim it until we store pos + 1.
        let payload =
            unsafe { std::slice::from_raw_parts_mut(self.shared.slot(pos).add(SLOT_HEADER), cap) };
        let len = fill(payload);
        if len > cap {
            return Err(MessageTooLarge { len, capacity: cap });
        }
        // SAFETY: bytes 8..12 of the slot hold the length.
        unsafe { (self.shared.slot(pos).add(8) as *mut u32).write(len as u32) };
        self.shared.seq(pos).store(pos + 1, Ordering::Release);
        self.tail += 1;
        Ok(true)
    }

    /// Copies `msg` into the queue; `Ok(false)` when full.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, MessageTooLarge> {
        if msg.len() > self.payload_capacity() {
            return Err(MessageTooLarge {
                len: msg.len(),
                capacity: self.payload_capacity(),
            });
        }
        self.try_send_with(|s| {
            s[..msg.len()].copy_from_slice(msg);
            msg.len()
        })
    }
}

impl Drop for WorkProducer {
    fn drop(&mut self) {
        self.shared.producer_closed.store(true, Ordering::Release);
    }
}

/// A worker's handle; clone it for every worker.
#[derive(Clone)]
pub struct WorkConsumer {
    shared: Arc<Shared>,
}

/// A message claimed by one worker, read in place; the slot is freed on drop.
pub struct Claimed<'a> {
    shared: &'a Shared,
    pos: u64,
    len: usize,
}

impl WorkConsumer {
    /// Claims the next message, if any. `Err(true)` means closed and drained.
    pub fn try_claim(&self) -> Result<Claimed<'_>, bool> {
        let sh = &*self.shared;
        let mut pos = sh.head.load(Ordering::Relaxed);
        loop {
            let seq = sh.seq(pos).load(Ordering::Acquire);
            if seq == pos + 1 {
                match sh.head.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: we won the claim for `pos`; the acquire load of
                        // its seq synchronised with the producer's write.
                        let len = unsafe { (sh.slot(pos).add(8) as *const u32).read() } as usize;
                        return Ok(Claimed {
                            shared: sh,
                            pos,
                            len: len.min(sh.slot_size - SLOT_HEADER),
                        });
                    }
                    Err(now) => pos = now,
                }
            } else if seq <= pos {
                // Not yet written for this lap: empty.
                let closed = sh.producer_closed.load(Ordering::Acquire)
                    && sh.seq(pos).load(Ordering::Acquire) != pos + 1;
                return Err(closed);
            } else {
                // Another worker took it; catch up.
                pos = sh.head.load(Ordering::Relaxed);
            }
        }
    }
}

impl Deref for Claimed<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: this worker exclusively holds the claimed slot until drop.
        unsafe { std::slice::from_raw_parts(self.shared.slot(self.pos).add(SLOT_HEADER), self.len) }
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.shared
            .seq(self.pos)
            .store(self.pos + self.shared.slots, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[test]
    fn each_message_goes_to_exactly_one_worker() {
        let (mut p, c) = work_queue(64, 64).unwrap();
        const N: u32 = 20_000;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let c = c.clone();
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        match c.try_claim() {
                            Ok(m) => mine.push(u32::from_le_bytes(m[..4].try_into().unwrap())),
                            Err(true) => break,
                            Err(false) => std::thread::yield_now(),
                        }
                    }
                    seen.lock().unwrap().extend(mine);
                })
            })
            .collect();
        for i in 0..N {
            while !p.try_send(&i.to_le_bytes()).unwrap() {
                std::thread::yield_now();
            }
        }
        drop(p);
        for w in workers {
            w.join().unwrap();
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), N as usize, "no loss, no duplicates");
        let set: BTreeSet<_> = seen.iter().copied().collect();
        assert_eq!(set.len(), N as usize);
    }

    #[test]
    fn full_queue_refuses() {
        let (mut p, c) = work_queue(2, 32).unwrap();
        assert!(p.try_send(b"a").unwrap());
        assert!(p.try_send(b"b").unwrap());
        assert!(!p.try_send(b"c").unwrap());
        drop(c.try_claim().ok().unwrap());
        assert!(p.try_send(b"c").unwrap());
    }
}
