//! Moving the pages: the source reads them out of the frozen guest and
//! sends them ([`send_pages`]); the target writes them into the restored
//! one ([`receive_pages`]). Lazily, the target registers the anonymous
//! regions with userfaultfd ([`LazyTarget`]) and resumes the guest at once:
//! a fault asks the source for its pages (`want`), which it sends ahead of
//! its background push of all the rest ([`serve_lazy`]); each arrives with
//! `UFFDIO_COPY`, pages the source never had with `UFFDIO_ZEROPAGE`. The
//! source keeps the frozen guest (its memory is the image) until the target
//! says every page is resident.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use sidecore_wire::mx_image::{
    MAX_PAGES_RECORD_BYTES, MAX_WANT_PAGES, MxImage, MxRegion, MxRegionKind, PAGE_BYTES, Record,
};

use super::Error;
use super::checkpoint::Frozen;
use super::stream::{PageReader, PageWriter};
use super::tracee::Tracee;

/// Pages per record.
const CHUNK_PAGES: u64 = MAX_PAGES_RECORD_BYTES as u64 / PAGE_BYTES;
/// Pages a fault asks for at once (the faulting one and those after it).
const FAULT_AHEAD_PAGES: u64 = 16;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_MSG_BYTES: usize = 32;

/// Whether a region's pages go lazily (anonymous memory does).
#[must_use]
pub fn is_lazy(r: &MxRegion) -> bool {
    matches!(r.what, MxRegionKind::Anon { .. })
}

/// Pages of `r` sent before the guest resumes: all in an eager migration;
/// lazily, those of non-anonymous regions and the page of `must` (the
/// rseq area, which the kernel writes as soon as the task runs).
fn eager_runs(r: &MxRegion, lazy: bool, must: Option<u64>) -> Vec<(u64, u64)> {
    if !lazy || !is_lazy(r) {
        return r.pages.clone();
    }
    let Some(p) = must.filter(|a| (r.start..r.end).contains(a)) else {
        return Vec::new();
    };
    let i = (p - r.start) / PAGE_BYTES;
    if r.pages.iter().any(|&(f, n)| (f..f + n).contains(&i)) {
        vec![(i, 1)]
    } else {
        Vec::new()
    }
}

/// One set bit per page of each region.
#[derive(Debug, Clone)]
struct Bits(Vec<Vec<u64>>);

impl Bits {
    fn new(image: &MxImage) -> Bits {
        Bits(
            image
                .regions
                .iter()
                .map(|r| vec![0; usize::try_from(r.len_pages().div_ceil(64)).unwrap_or(0)])
                .collect(),
        )
    }
    fn get(&self, r: usize, i: u64) -> bool {
        self.0[r][(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    fn set(&mut self, r: usize, i: u64) -> bool {
        let w = &mut self.0[r][(i / 64) as usize];
        let was = *w >> (i % 64) & 1 == 1;
        *w |= 1 << (i % 64);
        !was
    }
}

fn rseq_page(image: &MxImage) -> Option<u64> {
    image.task.rseq.map(|r| r.addr & !(PAGE_BYTES - 1))
}

/// Source: sends the pages due before the guest resumes, then `end`.
/// Returns the bytes sent and the pages marked sent (for [`serve_lazy`]).
pub fn send_pages(f: &Frozen, w: &mut PageWriter) -> Result<u64, Error> {
    let image = &f.image;
    let mut buf = vec![0u8; MAX_PAGES_RECORD_BYTES];
    let mut bytes = 0;
    for r in &image.regions {
        for (first, count) in eager_runs(r, image.lazy, rseq_page(image)) {
            let mut done = 0;
            while done < count {
                let n = (count - done).min(CHUNK_PAGES);
                let addr = r.start + (first + done) * PAGE_BYTES;
                let b = &mut buf[..(n * PAGE_BYTES) as usize];
                f.read(addr, b)?;
                w.send_pages(addr, b)?;
                bytes += n * PAGE_BYTES;
                done += n;
            }
        }
    }
    w.send(&Record::End)?;
    Ok(bytes)
}

/// Target: writes the pages that arrive until `end` into the restored
/// guest; returns the bytes written and which pages arrived.
pub fn receive_pages(
    t: &Tracee,
    image: &MxImage,
    r: &mut PageReader,
) -> Result<(u64, Vec<(u64, u64)>), Error> {
    let mut bytes = 0;
    let mut got = Vec::new();
    loop {
        match r.next_record()? {
            Record::Pages { addr, data } => {
                super::restore::write_pages(t, image, addr, &data)?;
                bytes += data.len() as u64;
                got.push((addr, data.len() as u64 / PAGE_BYTES));
            }
            Record::End => return Ok((bytes, got)),
            other => {
                return Err(Error::Peer {
                    peer: r.peer.clone(),
                    what: format!("sent `{}` among the pages", other.kind().name()),
                });
            }
        }
    }
}

/// Source, lazily: answers `want`s first and pushes every other page
/// behind them, until the target says all are resident.
pub fn serve_lazy(f: &Frozen, mut w: PageWriter, mut r: PageReader) -> Result<u64, Error> {
    let image = &f.image;
    let mut sent = Bits::new(image);
    for (ri, reg) in image.regions.iter().enumerate() {
        for (first, n) in eager_runs(reg, true, rseq_page(image)) {
            for i in first..first + n {
                sent.set(ri, i);
            }
        }
    }
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        loop {
            let rec = r.next_record();
            let stop = !matches!(rec, Ok(Record::Want { .. }));
            if tx.send(rec).is_err() || stop {
                return;
            }
        }
    });
    let mut cursor = Cursor::default();
    let mut buf = vec![0u8; MAX_PAGES_RECORD_BYTES];
    let mut bytes = 0;
    let mut end_sent = false;
    let result = loop {
        let msg = if end_sent {
            rx.recv_timeout(super::stream::STREAM_TIMEOUT).ok()
        } else {
            rx.try_recv().ok()
        };
        match msg {
            Some(Ok(Record::Want { addr, pages })) => {
                bytes += send_wanted(f, &mut w, &mut sent, addr, pages, &mut buf)?;
            }
            Some(Ok(Record::Resident)) => break Ok(bytes),
            Some(Ok(other)) => {
                break Err(Error::Peer {
                    peer: "the target".into(),
                    what: format!("sent `{}` while pages were served", other.kind().name()),
                });
            }
            Some(Err(e)) => break Err(e),
            None if end_sent => {
                break Err(Error::Peer {
                    peer: "the target".into(),
                    what: "fell silent before every page was resident".into(),
                });
            }
            None => match cursor.next(image, &sent) {
                Some((ri, first, n)) => {
                    bytes += send_run(f, &mut w, &mut sent, ri, first, n, &mut buf)?;
                }
                None => {
                    w.send(&Record::End)?;
                    end_sent = true;
                }
            },
        }
    };
    drop(rx);
    let _ = reader.join();
    result
}

fn send_wanted(
    f: &Frozen,
    w: &mut PageWriter,
    sent: &mut Bits,
    addr: u64,
    pages: u32,
    buf: &mut [u8],
) -> Result<u64, Error> {
    let image = &f.image;
    let Some(ri) = image
        .regions
        .iter()
        .position(|r| r.start <= addr && addr < r.end)
    else {
        return Ok(0);
    };
    let reg = &image.regions[ri];
    let first = (addr - reg.start) / PAGE_BYTES;
    let n = u64::from(pages).min(reg.len_pages() - first);
    send_run(f, w, sent, ri, first, n, buf)
}

/// Sends the pages of `first..first+n` in region `ri` the source holds and
/// has not sent.
#[allow(clippy::too_many_arguments)]
fn send_run(
    f: &Frozen,
    w: &mut PageWriter,
    sent: &mut Bits,
    ri: usize,
    first: u64,
    n: u64,
    buf: &mut [u8],
) -> Result<u64, Error> {
    let reg = &f.image.regions[ri];
    let held = |i: u64| reg.pages.iter().any(|&(a, c)| (a..a + c).contains(&i));
    let mut bytes = 0;
    let mut i = first;
    while i < first + n {
        if sent.get(ri, i) || !held(i) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < first + n && j - i < CHUNK_PAGES && !sent.get(ri, j) && held(j) {
            sent.set(ri, j);
            j += 1;
        }
        let addr = reg.start + i * PAGE_BYTES;
        let b = &mut buf[..((j - i) * PAGE_BYTES) as usize];
        f.read(addr, b)?;
        w.send_pages(addr, b)?;
        bytes += b.len() as u64;
        i = j;
    }
    Ok(bytes)
}

/// The background push's place: region, run, page within it.
#[derive(Default)]
struct Cursor {
    region: usize,
    run: usize,
    at: u64,
}

impl Cursor {
    /// The next stretch of unsent held pages of a lazy region.
    fn next(&mut self, image: &MxImage, sent: &Bits) -> Option<(usize, u64, u64)> {
        while let Some(r) = image.regions.get(self.region) {
            let Some(&(first, count)) = r.pages.get(self.run).filter(|_| is_lazy(r)) else {
                self.region += 1;
                self.run = 0;
                self.at = 0;
                continue;
            };
            if self.at >= count {
                self.run += 1;
                self.at = 0;
                continue;
            }
            let i = first + self.at;
            let n = (count - self.at).min(CHUNK_PAGES);
            self.at += n;
            if (i..i + n).all(|p| sent.get(self.region, p)) {
                continue;
            }
            return Some((self.region, i, n));
        }
        None
    }
}

fn ioctl<T>(fd: &OwnedFd, req: libc::c_ulong, arg: &mut T) -> Result<(), std::io::Error> {
    // SAFETY: a userfaultfd ioctl with the struct its number encodes.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, std::ptr::from_mut(arg)) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Counters of a lazy migration on the target.
#[derive(Debug, Default)]
pub struct LazyStats {
    pub faults: AtomicU64,
    pub bytes: AtomicU64,
}

struct LazyState {
    have: Bits,
    wanted: Bits,
    /// Held pages of lazy regions not yet here.
    remaining: u64,
}

/// The target's side of a lazy migration.
pub struct LazyTarget {
    /// Read-locked for each use (the fault loop's poll and the copies go
    /// on side by side), write-locked to close it.
    uffd: RwLock<Option<OwnedFd>>,
    image: Arc<MxImage>,
    state: Mutex<LazyState>,
    pub stats: LazyStats,
    done: AtomicBool,
}

impl LazyTarget {
    /// Registers the image's anonymous regions on `uffd` (after they are
    /// mapped, and after the eager pages `got` were written).
    pub fn register(
        uffd: OwnedFd,
        image: Arc<MxImage>,
        got: &[(u64, u64)],
    ) -> Result<Arc<LazyTarget>, Error> {
        let mut have = Bits::new(&image);
        let mut remaining = 0;
        for (ri, r) in image.regions.iter().enumerate().filter(|(_, r)| is_lazy(r)) {
            let mut reg = [r.start, r.end - r.start, UFFDIO_REGISTER_MODE_MISSING, 0];
            ioctl(&uffd, UFFDIO_REGISTER, &mut reg).map_err(|source| Error::Os {
                what: format!("UFFDIO_REGISTER {:#x}-{:#x}", r.start, r.end),
                source,
            })?;
            remaining += r.held_pages();
            for &(addr, n) in got.iter().filter(|(a, _)| (r.start..r.end).contains(a)) {
                for i in 0..n {
                    if have.set(ri, (addr - r.start) / PAGE_BYTES + i) {
                        remaining -= 1;
                    }
                }
            }
        }
        let wanted = Bits::new(&image);
        Ok(Arc::new(LazyTarget {
            uffd: RwLock::new(Some(uffd)),
            image,
            state: Mutex::new(LazyState {
                have,
                wanted,
                remaining,
            }),
            stats: LazyStats::default(),
            done: AtomicBool::new(false),
        }))
    }

    /// Whether every page arrived (or the guest is gone).
    #[must_use]
    pub fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LazyState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn with_uffd<R>(&self, f: impl FnOnce(&OwnedFd) -> R) -> Option<R> {
        self.uffd
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(f)
    }

    /// Ends the lazy phase: closing the userfaultfd unregisters every
    /// region and wakes any waiter (pages not held are zero pages anyway).
    pub fn finish_now(&self) {
        self.done.store(true, Ordering::Release);
        self.uffd
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }

    /// Fault loop: serves the guest's faults until done; `want` sends a
    /// request to the source.
    pub fn faults(&self, want: &dyn Fn(u64, u32) -> Result<(), Error>) {
        let mut buf = [0u8; UFFD_MSG_BYTES * 16];
        while !self.done() {
            let n = self
                .with_uffd(|u| {
                    let mut p = libc::pollfd {
                        fd: u.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one pollfd; then a read into our buffer.
                    unsafe {
                        if libc::poll(&raw mut p, 1, 100) <= 0 {
                            return 0;
                        }
                        libc::read(u.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                    }
                })
                .unwrap_or(-1);
            if n < 0 && self.done() {
                return;
            }
            for m in buf[..usize::try_from(n).unwrap_or(0)].chunks_exact(UFFD_MSG_BYTES) {
                if m[0] == UFFD_EVENT_PAGEFAULT {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&m[16..24]);
                    self.fault(u64::from_le_bytes(a) & !(PAGE_BYTES - 1), want);
                }
            }
        }
    }

    fn fault(&self, page: u64, want: &dyn Fn(u64, u32) -> Result<(), Error>) {
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        let image = &self.image;
        let Some(ri) = image
            .regions
            .iter()
            .position(|r| r.start <= page && page < r.end)
        else {
            return;
        };
        let r = &image.regions[ri];
        let i = (page - r.start) / PAGE_BYTES;
        let held = |p: u64| r.pages.iter().any(|&(a, c)| (a..a + c).contains(&p));
        let mut s = self.lock();
        if !s.have.get(ri, i) && held(i) {
            if !s.wanted.get(ri, i) {
                let mut n = 0;
                while n < FAULT_AHEAD_PAGES.min(u64::from(MAX_WANT_PAGES))
                    && i + n < r.len_pages()
                    && held(i + n)
                    && !s.have.get(ri, i + n)
                    && !s.wanted.get(ri, i + n)
                {
                    s.wanted.set(ri, i + n);
                    n += 1;
                }
                drop(s);
                if want(page, n as u32).is_err() {
                    self.finish_now();
                }
            }
            return;
        }
        // Never held (or dropped since with MADV_DONTNEED): a zero page.
        drop(s);
        self.with_uffd(|u| {
            let mut z = [page, PAGE_BYTES, 0, 0];
            if ioctl(u, UFFDIO_ZEROPAGE, &mut z).is_err() {
                let mut w = [page, PAGE_BYTES];
                let _ = ioctl(u, UFFDIO_WAKE, &mut w);
            }
        });
    }

    /// Pages from the source: copied in where still missing. True when
    /// every held page is here.
    pub fn arrived(&self, addr: u64, data: &[u8]) -> bool {
        let image = &self.image;
        let Some(ri) = image
            .regions
            .iter()
            .position(|r| r.start <= addr && addr < r.end)
        else {
            return self.done();
        };
        let r = &image.regions[ri];
        let pages = (data.len() as u64 / PAGE_BYTES).min(r.end.saturating_sub(addr) / PAGE_BYTES);
        let first = (addr - r.start) / PAGE_BYTES;
        let mut s = self.lock();
        let mut k = 0;
        while k < pages {
            if s.have.get(ri, first + k) {
                k += 1;
                continue;
            }
            // A run of missing pages goes in with one copy.
            let mut n = 1;
            while k + n < pages && !s.have.get(ri, first + k + n) {
                n += 1;
            }
            let at = (k * PAGE_BYTES) as usize;
            if !self.copy_in(
                addr + k * PAGE_BYTES,
                &data[at..at + (n * PAGE_BYTES) as usize],
            ) {
                // The guest is gone (or its memory changed under us).
                drop(s);
                self.finish_now();
                return true;
            }
            for p in k..k + n {
                s.have.set(ri, first + p);
            }
            s.remaining -= n;
            self.stats
                .bytes
                .fetch_add(n * PAGE_BYTES, Ordering::Relaxed);
            k += n;
        }
        let all = s.remaining == 0;
        drop(s);
        if all {
            self.finish_now();
        }
        all
    }

    /// `UFFDIO_COPY` of `data` to `addr`; page by page where a zero page
    /// raced the run (EEXIST: that page is there already, which is fine).
    fn copy_in(&self, addr: u64, data: &[u8]) -> bool {
        let copy = |u: &OwnedFd, a: u64, d: &[u8]| {
            let mut c = [a, d.as_ptr() as u64, d.len() as u64, 0, 0];
            ioctl(u, UFFDIO_COPY, &mut c).map_err(|e| e.raw_os_error() == Some(libc::EEXIST))
        };
        self.with_uffd(|u| match copy(u, addr, data) {
            Ok(()) => true,
            Err(false) => false,
            Err(true) => data
                .chunks_exact(PAGE_BYTES as usize)
                .enumerate()
                .all(|(k, page)| copy(u, addr + k as u64 * PAGE_BYTES, page) != Err(false)),
        })
        .unwrap_or(false)
    }

    /// Held pages still missing.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.lock().remaining
    }
}
