//! The Sensor Box in shared memory: a sealed memfd holding a header, a table of sensor
//! slots (each value behind a seqlock) and an append-only event log, mapped by the
//! target, by publishers in other processes and by the monitor.
//!
//! Every shared field is an atomic, so concurrent access from several processes is
//! defined behaviour; consistency of a slot's (timestamp, value) pair comes from its
//! seqlock, and a log record becomes visible when its `commit` word holds its position
//! plus one. The monitor consumes records in `[tail, head)` and flushes by advancing
//! `tail`; a writer never reserves a position more than `log_cap` ahead of `tail`, so
//! unread records are never overwritten: the box is then full and says so.

use crate::error::OrionError;
use crate::sensor::{SensorKind, SensorSpec, SensorValue, pack_name, unpack_name};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use serde::Serialize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

const MAGIC: u64 = u64::from_le_bytes(*b"ORIONSB1");
const VERSION: u32 = 1;
const FREE: u32 = 0;
const CLAIMING: u32 = 1;
const LIVE: u32 = 2;
/// How many times a writer retries a slot another writer holds before giving up.
const WRITER_SPINS: u32 = 1 << 20;
/// How many times a reader retries a slot that keeps changing under it (or whose writer
/// died mid-update) before leaving it out of the view.
const READER_TRIES: u32 = 1 << 16;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    sensor_cap: AtomicU32,
    log_cap: AtomicU32,
    pad: AtomicU32,
    period_us: AtomicU64,
    owner_pid: AtomicU64,
    name: [AtomicU64; 8],
    head: AtomicU64,
    tail: AtomicU64,
    dropped: AtomicU64,
    updates: AtomicU64,
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    generation: AtomicU32,
    kind: AtomicU32,
    pad: AtomicU32,
    name: [AtomicU64; 4],
    seq: AtomicU64,
    ts_ns: AtomicU64,
    value: [AtomicU64; 2],
    updates: AtomicU64,
}

#[repr(C)]
struct Record {
    commit: AtomicU64,
    sensor: AtomicU64,
    ts_ns: AtomicU64,
    value: [AtomicU64; 2],
}

/// Bytes a box with these capacities occupies.
pub fn box_size(sensor_cap: u32, log_cap: u32) -> usize {
    size_of::<Header>()
        + sensor_cap as usize * size_of::<Slot>()
        + log_cap as usize * size_of::<Record>()
}

/// The parameters of `sbcreate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SbParams {
    /// Sensor slots (1..=4096).
    pub sensors: u32,
    /// Event-log records kept until a monitor flushes (1..=1,048,576).
    pub log_records: u32,
    /// Update period of the slowest sensor, in microseconds: the monitor's refresh period.
    pub period_us: u64,
}

impl Default for SbParams {
    fn default() -> Self {
        SbParams {
            sensors: 64,
            log_records: 1024,
            period_us: 25_000,
        }
    }
}

/// A handle naming one registration of a sensor (slot and generation), so a handle
/// kept past `rmsensor` is refused rather than writing into a reused slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct SensorHandle {
    /// The sensor ID (its slot).
    pub id: u32,
    /// The registration's generation.
    pub generation: u32,
}

/// One sensor as the monitor reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SensorReading {
    /// ID and generation.
    pub handle: SensorHandle,
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: SensorKind,
    /// Time of the latest update (CLOCK_MONOTONIC, ns); 0 if never updated.
    pub ts_ns: u64,
    /// Latest value.
    pub value: SensorValue,
    /// Updates so far.
    pub updates: u64,
}

/// One event-log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// Position in the log (0, 1, 2, … since creation).
    pub pos: u64,
    /// The sensor.
    pub handle: SensorHandle,
    /// When (CLOCK_MONOTONIC, ns).
    pub ts_ns: u64,
    /// The value.
    pub value: SensorValue,
}

/// The box-wide counters.
#[derive(Debug, Clone, Serialize)]
pub struct BoxInfo {
    /// Its name.
    pub name: String,
    /// The creating process.
    pub owner_pid: u64,
    /// Its parameters.
    pub params: SbParams,
    /// Log records appended since creation.
    pub head: u64,
    /// Log records flushed.
    pub tail: u64,
    /// Event updates dropped because the log was full.
    pub dropped: u64,
    /// Updates of any kind.
    pub updates: u64,
}

/// The current CLOCK_MONOTONIC time in nanoseconds.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// A mapping of a box's memfd, shared by whoever holds the descriptor.
pub struct SharedBox {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    sensor_cap: u32,
    log_cap: u32,
}

// SAFETY: the mapping is only accessed through atomics (every field of Header, Slot and
// Record is atomic), so sharing the pointer between threads is as safe as sharing
// `&AtomicU64`s.
unsafe impl Send for SharedBox {}
// SAFETY: as above: all accesses through the pointer are atomic operations.
unsafe impl Sync for SharedBox {}

impl Drop for SharedBox {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned in `map`, and no reference into
        // the mapping outlives `self` (all accessors borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn map(fd: &OwnedFd, len: usize, what: &str) -> Result<NonNull<u8>, OrionError> {
    use rustix::mm::{MapFlags, ProtFlags, mmap};
    // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long; no
    // existing Rust object aliases it, and we only ever touch it through atomics.
    let ptr = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| OrionError::sys(format!("{what}: mmap of {len} bytes"), e))?;
    NonNull::new(ptr.cast()).ok_or_else(|| OrionError::NotABox {
        what: what.to_owned(),
        why: "mmap returned a null pointer".to_owned(),
    })
}

impl SharedBox {
    /// `sbcreate`: a new box in a sealed memfd (it can neither grow nor shrink, so a
    /// mapping can never fault on truncation).
    pub fn create(name: &str, params: SbParams) -> Result<SharedBox, OrionError> {
        use rustix::fs::{MemfdFlags, SealFlags, fcntl_add_seals, ftruncate, memfd_create};
        crate::sensor::check_name(name.as_bytes(), crate::sensor::BOX_NAME_MAX).map_err(|why| {
            OrionError::BadParams {
                sb: name.to_owned(),
                why: format!("bad box name: {why}"),
            }
        })?;
        let bad = |why: String| OrionError::BadParams {
            sb: name.to_owned(),
            why,
        };
        if !(1..=4096).contains(&params.sensors) {
            return Err(bad(format!(
                "{} sensors; 1 to 4096 allowed",
                params.sensors
            )));
        }
        if !(1..=1 << 20).contains(&params.log_records) {
            return Err(bad(format!(
                "{} log records; 1 to 1048576 allowed",
                params.log_records
            )));
        }
        if params.period_us == 0 {
            return Err(bad("update period 0 µs; it must be positive".to_owned()));
        }
        let len = box_size(params.sensors, params.log_records);
        let what = format!("sensor box `{name}`");
        let fd = memfd_create(
            format!("orion-sb:{name}"),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| OrionError::sys(format!("{what}: memfd_create"), e))?;
        ftruncate(&fd, len as u64).map_err(|e| OrionError::sys(format!("{what}: ftruncate"), e))?;
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| OrionError::sys(format!("{what}: sealing the memfd"), e))?;
        let ptr = map(&fd, len, &what)?;
        let sb = SharedBox {
            fd,
            ptr,
            len,
            name: name.to_owned(),
            sensor_cap: params.sensors,
            log_cap: params.log_records,
        };
        let h = sb.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.sensor_cap.store(params.sensors, Ordering::Relaxed);
        h.log_cap.store(params.log_records, Ordering::Relaxed);
        h.period_us.store(params.period_us, Ordering::Relaxed);
        h.owner_pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        for (w, v) in h.name.iter().zip(pack_name::<8>(name)) {
            w.store(v, Ordering::Relaxed);
        }
        h.magic.store(MAGIC, Ordering::Release);
        Ok(sb)
    }

    /// Maps a box from its descriptor (the monitor's and the publishers' side), checking
    /// the magic, the version and that the capacities fit the file.
    pub fn attach(fd: OwnedFd, what: &str) -> Result<SharedBox, OrionError> {
        let not = |why: String| OrionError::NotABox {
            what: what.to_owned(),
            why,
        };
        let st =
            rustix::fs::fstat(&fd).map_err(|e| OrionError::sys(format!("{what}: fstat"), e))?;
        let len = usize::try_from(st.st_size).unwrap_or(0);
        if len < size_of::<Header>() {
            return Err(not(format!("{len} bytes is smaller than a box header")));
        }
        let ptr = map(&fd, len, what)?;
        let mut sb = SharedBox {
            fd,
            ptr,
            len,
            name: String::new(),
            sensor_cap: 0,
            log_cap: 0,
        };
        let h = sb.header();
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(not("bad magic".to_owned()));
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(not(format!(
                "layout version {version}; this build reads {VERSION}"
            )));
        }
        let (sc, lc) = (
            h.sensor_cap.load(Ordering::Relaxed),
            h.log_cap.load(Ordering::Relaxed),
        );
        if sc == 0 || lc == 0 || box_size(sc, lc) != len {
            return Err(not(format!(
                "{sc} sensors and {lc} log records do not fill its {len} bytes"
            )));
        }
        let name_words: Vec<u64> = h.name.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        sb.name = unpack_name(&name_words);
        sb.sensor_cap = sc;
        sb.log_cap = lc;
        Ok(sb)
    }

    /// The descriptor (`sbexport`'s memory descriptor: the memfd itself).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A second descriptor for the same box (to hand to another process).
    pub fn dup_fd(&self) -> Result<OwnedFd, OrionError> {
        rustix::io::fcntl_dupfd_cloexec(&self.fd, 0)
            .map_err(|e| OrionError::sys(format!("sensor box `{}`: dup", self.name), e))
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least size_of::<Header>() bytes (checked in create
        // and attach), page aligned, and Header is made of atomics valid for any bits.
        unsafe { &*self.ptr.as_ptr().cast::<Header>() }
    }

    fn slot(&self, i: u32) -> Option<&Slot> {
        if i >= self.sensor_cap {
            return None;
        }
        let off = size_of::<Header>() + i as usize * size_of::<Slot>();
        // SAFETY: i < sensor_cap, and box_size(sensor_cap, log_cap) == len, so the slot
        // lies inside the mapping; offsets are multiples of 8 (all sizes are), and Slot
        // is made of atomics valid for any bits.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<Slot>() })
    }

    fn record(&self, pos: u64) -> &Record {
        let i = (pos % u64::from(self.log_cap)) as usize;
        let off = size_of::<Header>()
            + self.sensor_cap as usize * size_of::<Slot>()
            + i * size_of::<Record>();
        // SAFETY: i < log_cap, so the record lies inside the mapping (see `slot`).
        unsafe { &*self.ptr.as_ptr().add(off).cast::<Record>() }
    }

    /// The parameters and counters of the box.
    pub fn info(&self) -> BoxInfo {
        let h = self.header();
        BoxInfo {
            name: self.name.clone(),
            owner_pid: h.owner_pid.load(Ordering::Relaxed),
            params: SbParams {
                sensors: self.sensor_cap,
                log_records: self.log_cap,
                period_us: h.period_us.load(Ordering::Relaxed),
            },
            head: h.head.load(Ordering::Acquire),
            tail: h.tail.load(Ordering::Acquire),
            dropped: h.dropped.load(Ordering::Relaxed),
            updates: h.updates.load(Ordering::Relaxed),
        }
    }

    /// `addsensor`: registers a sensor in a free slot. Refused when the name is already
    /// registered ([`OrionError::BadSensor`]) or every slot is taken
    /// ([`OrionError::TooManySensors`]).
    pub fn add_sensor(&self, spec: &SensorSpec) -> Result<SensorHandle, OrionError> {
        if self.find(&spec.name).is_some() {
            return Err(OrionError::BadSensor {
                sb: self.name.clone(),
                name: spec.name.clone(),
                why: "a sensor of that name is already registered".to_owned(),
            });
        }
        for i in 0..self.sensor_cap {
            let Some(s) = self.slot(i) else { break };
            if s.state
                .compare_exchange(FREE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let generation = s.generation.load(Ordering::Relaxed).wrapping_add(1);
            s.generation.store(generation, Ordering::Relaxed);
            s.kind.store(spec.kind.code(), Ordering::Relaxed);
            for (w, v) in s.name.iter().zip(pack_name::<4>(&spec.name)) {
                w.store(v, Ordering::Relaxed);
            }
            s.ts_ns.store(0, Ordering::Relaxed);
            s.value[0].store(0, Ordering::Relaxed);
            s.value[1].store(0, Ordering::Relaxed);
            s.updates.store(0, Ordering::Relaxed);
            s.state.store(LIVE, Ordering::Release);
            return Ok(SensorHandle { id: i, generation });
        }
        Err(OrionError::TooManySensors {
            sb: self.name.clone(),
            capacity: self.sensor_cap,
        })
    }

    /// The live sensor of that name, if any.
    pub fn find(&self, name: &str) -> Option<SensorHandle> {
        let want = pack_name::<4>(name);
        (0..self.sensor_cap).find_map(|i| {
            let s = self.slot(i)?;
            (s.state.load(Ordering::Acquire) == LIVE
                && s.name
                    .iter()
                    .zip(want)
                    .all(|(w, v)| w.load(Ordering::Relaxed) == v))
            .then(|| SensorHandle {
                id: i,
                generation: s.generation.load(Ordering::Relaxed),
            })
        })
    }

    fn live_slot(&self, h: SensorHandle) -> Result<&Slot, OrionError> {
        let none = || OrionError::NoSuchSensor {
            sb: self.name.clone(),
            sensor: h.id,
        };
        let s = self.slot(h.id).ok_or_else(none)?;
        if s.state.load(Ordering::Acquire) != LIVE
            || s.generation.load(Ordering::Relaxed) != h.generation
        {
            return Err(none());
        }
        Ok(s)
    }

    /// `rmsensor`: frees the sensor's slot; its handle is refused from then on.
    pub fn remove_sensor(&self, h: SensorHandle) -> Result<(), OrionError> {
        let s = self.live_slot(h)?;
        s.state
            .compare_exchange(LIVE, FREE, Ordering::AcqRel, Ordering::Relaxed)
            .map(|_| ())
            .map_err(|_| OrionError::NoSuchSensor {
                sb: self.name.clone(),
                sensor: h.id,
            })
    }

    /// `updatesensor`: stamps the time and stores the value; an event sensor's update is
    /// also appended to the log, and refused with [`OrionError::BoxFull`] (counted as
    /// dropped, latest value still stored) when the log holds `log_records` unflushed
    /// records. A counter that would go backwards is refused.
    pub fn update(&self, h: SensorHandle, value: SensorValue) -> Result<(), OrionError> {
        let s = self.live_slot(h)?;
        let kind =
            SensorKind::from_code(s.kind.load(Ordering::Relaxed)).unwrap_or(SensorKind::Gauge);
        let ts = now_ns();
        self.write_slot(s, h, kind, ts, value)?;
        self.header().updates.fetch_add(1, Ordering::Relaxed);
        if kind == SensorKind::Event {
            self.append(h, ts, value)?;
        }
        Ok(())
    }

    fn write_slot(
        &self,
        s: &Slot,
        h: SensorHandle,
        kind: SensorKind,
        ts: u64,
        value: SensorValue,
    ) -> Result<(), OrionError> {
        let mut spins = 0u32;
        let seq = loop {
            let q = s.seq.load(Ordering::Relaxed);
            if q & 1 == 0
                && s.seq
                    .compare_exchange_weak(q, q + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                break q;
            }
            spins += 1;
            if spins > WRITER_SPINS {
                return Err(OrionError::WrongValue {
                    sb: self.name.clone(),
                    sensor: h.id,
                    kind: kind.name(),
                    why: "another writer holds it and does not finish (a publisher that died mid-update?)".to_owned(),
                });
            }
            std::hint::spin_loop();
        };
        fence(Ordering::Release);
        if kind == SensorKind::Counter {
            let old = s.value[0].load(Ordering::Relaxed);
            if value[0] < old {
                s.seq.store(seq, Ordering::Release);
                return Err(OrionError::WrongValue {
                    sb: self.name.clone(),
                    sensor: h.id,
                    kind: kind.name(),
                    why: format!("it cannot go back from {old} to {}", value[0]),
                });
            }
        }
        s.ts_ns.store(ts, Ordering::Relaxed);
        s.value[0].store(value[0], Ordering::Relaxed);
        s.value[1].store(value[1], Ordering::Relaxed);
        s.updates.fetch_add(1, Ordering::Relaxed);
        s.seq.store(seq + 2, Ordering::Release);
        Ok(())
    }

    fn append(&self, h: SensorHandle, ts: u64, value: SensorValue) -> Result<(), OrionError> {
        let hd = self.header();
        let cap = u64::from(self.log_cap);
        let pos = loop {
            let head = hd.head.load(Ordering::Acquire);
            let tail = hd.tail.load(Ordering::Acquire);
            if head.wrapping_sub(tail) >= cap {
                hd.dropped.fetch_add(1, Ordering::Relaxed);
                return Err(OrionError::BoxFull {
                    sb: self.name.clone(),
                    sensor: h.id,
                    capacity: self.log_cap,
                });
            }
            if hd
                .head
                .compare_exchange_weak(head, head + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break head;
            }
        };
        let r = self.record(pos);
        r.sensor.store(
            u64::from(h.id) | (u64::from(h.generation) << 32),
            Ordering::Relaxed,
        );
        r.ts_ns.store(ts, Ordering::Relaxed);
        r.value[0].store(value[0], Ordering::Relaxed);
        r.value[1].store(value[1], Ordering::Relaxed);
        r.commit.store(pos + 1, Ordering::Release);
        Ok(())
    }

    /// Reads every live sensor, seqlock-consistent: a slot that never reads the same
    /// twice in [`READER_TRIES`] tries (a writer died mid-update) is left out.
    pub fn read_sensors(&self) -> Vec<SensorReading> {
        (0..self.sensor_cap)
            .filter_map(|i| self.read_slot(i))
            .collect()
    }

    fn read_slot(&self, i: u32) -> Option<SensorReading> {
        let s = self.slot(i)?;
        if s.state.load(Ordering::Acquire) != LIVE {
            return None;
        }
        let generation = s.generation.load(Ordering::Relaxed);
        let kind = SensorKind::from_code(s.kind.load(Ordering::Relaxed))?;
        let words: Vec<u64> = s.name.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        let mut last = None;
        for _ in 0..READER_TRIES {
            let q1 = s.seq.load(Ordering::Acquire);
            let read = (
                s.ts_ns.load(Ordering::Relaxed),
                [
                    s.value[0].load(Ordering::Relaxed),
                    s.value[1].load(Ordering::Relaxed),
                ],
                s.updates.load(Ordering::Relaxed),
            );
            fence(Ordering::Acquire);
            let q2 = s.seq.load(Ordering::Relaxed);
            if q1 == q2 && q1 & 1 == 0 {
                last = Some(read);
                break;
            }
            std::hint::spin_loop();
        }
        let last = last?;
        Some(SensorReading {
            handle: SensorHandle { id: i, generation },
            name: unpack_name(&words),
            kind,
            ts_ns: last.0,
            value: last.1,
            updates: last.2,
        })
    }

    /// The committed records from the flushed position on, in order (stops at the
    /// first record a writer has reserved but not yet committed).
    pub fn read_log(&self) -> Vec<EventRecord> {
        let hd = self.header();
        let tail = hd.tail.load(Ordering::Acquire);
        let head = hd.head.load(Ordering::Acquire);
        let mut out = Vec::new();
        for pos in tail..head {
            let r = self.record(pos);
            if r.commit.load(Ordering::Acquire) != pos + 1 {
                break;
            }
            let sensor = r.sensor.load(Ordering::Relaxed);
            out.push(EventRecord {
                pos,
                handle: SensorHandle {
                    id: (sensor & 0xffff_ffff) as u32,
                    generation: (sensor >> 32) as u32,
                },
                ts_ns: r.ts_ns.load(Ordering::Relaxed),
                value: [
                    r.value[0].load(Ordering::Relaxed),
                    r.value[1].load(Ordering::Relaxed),
                ],
            });
        }
        out
    }

    /// `sbflush`: the monitor is done with every record before `upto`; their space is
    /// free again. Never moves backwards nor past the head.
    pub fn flush(&self, upto: u64) {
        let hd = self.header();
        let upto = upto.min(hd.head.load(Ordering::Acquire));
        hd.tail.fetch_max(upto, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(name: &str, kind: SensorKind) -> SensorSpec {
        SensorSpec::new("t", name, kind).unwrap()
    }

    #[test]
    fn register_update_read_remove() {
        let sb = SharedBox::create(
            "t",
            SbParams {
                sensors: 2,
                log_records: 4,
                period_us: 1000,
            },
        )
        .unwrap();
        let a = sb.add_sensor(&spec("ticks", SensorKind::Counter)).unwrap();
        sb.update(a, [5, 0]).unwrap();
        sb.update(a, [7, 0]).unwrap();
        let r = sb.read_sensors();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].name.as_str(), r[0].value[0], r[0].updates),
            ("ticks", 7, 2)
        );
        let e = sb.update(a, [6, 0]).unwrap_err().to_string();
        assert!(e.contains("cannot go back from 7 to 6"), "{e}");
        let dup = sb
            .add_sensor(&spec("ticks", SensorKind::Gauge))
            .unwrap_err()
            .to_string();
        assert!(dup.contains("already registered"), "{dup}");
        sb.remove_sensor(a).unwrap();
        assert!(sb.read_sensors().is_empty());
        let e = sb.update(a, [8, 0]).unwrap_err().to_string();
        assert!(e.contains("sensor 0 is not registered"), "{e}");
        // The slot is reused with a new generation; the old handle stays refused.
        let b = sb.add_sensor(&spec("other", SensorKind::Gauge)).unwrap();
        assert_eq!(b.id, a.id);
        assert_ne!(b.generation, a.generation);
        assert!(sb.update(a, [1, 0]).is_err());
    }

    #[test]
    fn a_full_box_says_so_and_keeps_working() {
        let sb = SharedBox::create(
            "full",
            SbParams {
                sensors: 1,
                log_records: 3,
                period_us: 1000,
            },
        )
        .unwrap();
        let f = sb.add_sensor(&spec("FORK_REC", SensorKind::Event)).unwrap();
        let e = sb
            .add_sensor(&spec("more", SensorKind::Counter))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sensor box `full` is full: all 1 sensor slots"),
            "{e}"
        );
        for c in 0..3 {
            sb.update(f, [1, 100 + c]).unwrap();
        }
        let e = sb.update(f, [1, 200]).unwrap_err().to_string();
        assert!(
            e.contains("event log holds 3 records not yet flushed"),
            "{e}"
        );
        assert_eq!(sb.info().dropped, 1);
        let log = sb.read_log();
        assert_eq!(
            log.iter().map(|r| r.value[1]).collect::<Vec<_>>(),
            vec![100, 101, 102]
        );
        sb.flush(log[2].pos + 1);
        sb.update(f, [1, 300]).unwrap();
        assert_eq!(
            sb.read_log().iter().map(|r| r.value[1]).collect::<Vec<_>>(),
            vec![300]
        );
    }

    #[test]
    fn attach_checks_what_it_maps() {
        let sb = SharedBox::create("x", SbParams::default()).unwrap();
        let other = SharedBox::attach(sb.dup_fd().unwrap(), "copy").unwrap();
        assert_eq!(other.name(), "x");
        let h = sb.add_sensor(&spec("a", SensorKind::Gauge)).unwrap();
        sb.update(h, [42, 0]).unwrap();
        assert_eq!(other.read_sensors()[0].value[0], 42);
        let tmp = std::env::temp_dir().join(format!("orion-notabox-{}", std::process::id()));
        std::fs::write(&tmp, vec![0u8; 4096]).unwrap();
        let f: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&tmp)
            .unwrap()
            .into();
        let e = SharedBox::attach(f, "junk").err().unwrap().to_string();
        assert!(e.contains("junk: not a sensor box: bad magic"), "{e}");
        let _ = std::fs::remove_file(&tmp);
    }

    #[test]
    fn concurrent_writers_never_tear_a_slot() {
        let sb = std::sync::Arc::new(SharedBox::create("c", SbParams::default()).unwrap());
        let h = sb.add_sensor(&spec("pair", SensorKind::Gauge)).unwrap();
        sb.update(h, [0, !0]).unwrap();
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let sb = sb.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let v = i * 2 + t;
                        sb.update(h, [v, !v]).unwrap();
                    }
                })
            })
            .collect();
        // A reader that finds a writer preempted mid-update for all of its
        // READER_TRIES leaves the slot out of that view (by design: a writer
        // may have died there); what it returns is never torn.
        let mut seen = 0;
        for _ in 0..20_000 {
            let Some(r) = sb.read_sensors().into_iter().next() else {
                continue;
            };
            assert_eq!(r.value[1], !r.value[0], "torn read");
            seen += 1;
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(seen > 0, "no view ever held the sensor");
        assert_eq!(
            sb.read_sensors().len(),
            1,
            "it is back once the writers are done"
        );
    }

    proptest! {
        #[test]
        fn the_log_returns_exactly_what_fit(cap in 1u32..16, ops in proptest::collection::vec(any::<bool>(), 0..64)) {
            // true: update; false: flush everything read so far.
            let sb = SharedBox::create("p", SbParams { sensors: 1, log_records: cap, period_us: 1 }).unwrap();
            let h = sb.add_sensor(&spec("e", SensorKind::Event)).unwrap();
            let mut model: std::collections::VecDeque<u64> = Default::default();
            for (n, op) in ops.iter().enumerate() {
                if *op {
                    let ok = sb.update(h, [n as u64, 0]).is_ok();
                    prop_assert_eq!(ok, model.len() < cap as usize);
                    if ok { model.push_back(n as u64); }
                } else {
                    let log = sb.read_log();
                    if let Some(last) = log.last() { sb.flush(last.pos + 1); }
                    model.clear();
                }
                let got: Vec<u64> = sb.read_log().iter().map(|r| r.value[0]).collect();
                prop_assert_eq!(got, model.iter().copied().collect::<Vec<_>>());
            }
        }
    }
}
