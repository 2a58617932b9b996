//! AF_XDP sockets: whole Ethernet frames in and out of one queue of one
//! interface through four rings shared with the kernel, over a region of
//! frames (the UMEM) registered once.
//!
//! * **TX**: the sender writes frames into UMEM chunks it owns, puts their
//!   descriptors on the TX ring and kicks the kernel (`sendto` with no data);
//!   the kernel hands each chunk back on the completion ring once it is gone.
//! * **RX**: the receiver stocks the fill ring with chunks; an XDP program on
//!   the interface redirects frames into the socket through an XSKMAP (see
//!   `sidecore-kernel`'s `XskRedirect`), the kernel copies (or, zero-copy,
//!   DMAs) each into a fill chunk and puts its descriptor on the RX ring.
//!
//! Binding asks for zero-copy and takes copy mode when the driver has no
//! zero-copy support (veth, and most virtual devices, only copy);
//! [`XskSocket::zerocopy`] says which it got. Copy mode still saves the
//! per-call work of AF_PACKET's `sendmmsg` (no message headers, no socket
//! lookups, one kick per up to 32 frames in the kernel's loop).
//!
//! Hand-rolled over libc rather than a crate: `xsk-rs` and `afxdp` build
//! libbpf/libxdp from C at build time and attach libxdp's own dispatcher
//! program, which would clash with the aya-owned XDP links of this project
//! (whose detach-on-crash guarantee depends on owning the link); `xdpilone`
//! is EUPL-1.2, a copyleft licence in this Apache-2.0 workspace. The kernel
//! ABI is small and stable (`<linux/if_xdp.h>`, all of it in libc), and the
//! rings are a few lines each.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use sidecore_testbed::NetnsError;

/// Bytes per UMEM chunk: one frame at a 1500-byte MTU, with headroom.
pub const CHUNK_BYTES: u32 = 2048;
/// Chunks in the UMEM.
pub const DEFAULT_FRAMES: u32 = 4096;
/// Entries per ring (each of fill, completion, RX and TX).
pub const DEFAULT_RING: u32 = 2048;
/// Frames the kernel's copy-mode transmit takes per kick before it asks to
/// be kicked again (`TX_BATCH_SIZE` in net/xdp/xsk.c).
const KERNEL_TX_BATCH: usize = 32;
/// Kicks per [`XskSocket::send`] at most, so a stalled device cannot hold
/// the caller.
const MAX_KICKS: usize = 64;
// Enough kicks to drain a full default ring.
const _: () = assert!(KERNEL_TX_BATCH * MAX_KICKS >= DEFAULT_RING as usize);

/// How to bind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XskBind {
    /// Zero-copy where the driver has it, else copy.
    #[default]
    Auto,
    /// Copy mode only.
    Copy,
    /// Zero-copy or nothing.
    ZeroCopy,
}

/// How to open an AF_XDP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XskOptions {
    /// Network namespace of the interface (`None`: this thread's).
    pub netns: Option<String>,
    pub iface: String,
    /// The interface's queue to bind.
    pub queue: u32,
    /// Receive (stocks the fill ring; needs an XDP redirect program).
    pub rx: bool,
    /// Send.
    pub tx: bool,
    pub bind: XskBind,
    /// UMEM chunks (a power of two, at least twice `ring`).
    pub frames: u32,
    /// Ring entries (a power of two).
    pub ring: u32,
}

impl XskOptions {
    /// Sending only, on queue 0, with the default sizes.
    pub fn tx(netns: Option<String>, iface: &str) -> XskOptions {
        XskOptions {
            netns,
            iface: iface.to_string(),
            queue: 0,
            rx: false,
            tx: true,
            bind: XskBind::Auto,
            frames: DEFAULT_FRAMES,
            ring: DEFAULT_RING,
        }
    }
}

/// Why an AF_XDP socket could not be opened: the step the kernel refused and
/// its error.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("AF_XDP socket on {iface} queue {queue}: {what}: {source}{}", hint(.source))]
    Io {
        iface: String,
        queue: u32,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("AF_XDP socket on {iface}: {what}")]
    Config { iface: String, what: String },
}

impl XskError {
    /// The kernel's error number, if the kernel refused a step.
    pub fn errno(&self) -> Option<i32> {
        match self {
            XskError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// What to do about a refusal.
fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EAFNOSUPPORT) => " (this kernel has no AF_XDP: CONFIG_XDP_SOCKETS)",
        Some(libc::EPERM) => " (needs CAP_NET_RAW)",
        Some(libc::EBUSY) => " (another AF_XDP socket or program holds this queue)",
        _ => "",
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A memory mapping, unmapped on drop.
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    /// Anonymous, populated memory for the UMEM.
    fn anonymous(len: usize) -> io::Result<Mmap> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched, and the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }

    /// A ring of socket `fd` at page offset `pgoff`.
    fn ring(fd: BorrowedFd<'_>, len: usize, pgoff: u64) -> io::Result<Mmap> {
        let off = libc::off_t::try_from(pgoff)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: maps the kernel's ring of an AF_XDP socket that `fd` keeps
        // open; `len` is the size the kernel's offsets describe; checked
        // against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one mapping made by `mmap` above,
        // and nothing borrows it past the owner's life.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One single-producer single-consumer ring shared with the kernel. This
/// side is the producer of fill and TX rings and the consumer of completion
/// and RX rings; indices run freely and wrap, masked on access.
struct Ring {
    /// Keeps the mapping the pointers below point into.
    _map: Mmap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
    size: u32,
    /// This side's copy of its own index and of the other side's.
    local: u32,
    remote: u32,
}

impl Ring {
    fn new(map: Mmap, off: &libc::xdp_ring_offset, size: u32) -> Ring {
        let at = |o: u64| {
            let o = usize::try_from(o).unwrap_or(usize::MAX);
            assert!(
                o < map.len,
                "ring offset {o} beyond its {}-byte map",
                map.len
            );
            // SAFETY: `o` is inside the mapping (checked just above).
            unsafe { map.ptr.add(o) }
        };
        let (producer, consumer, flags, desc) = (
            at(off.producer).cast::<AtomicU32>().cast_const(),
            at(off.consumer).cast::<AtomicU32>().cast_const(),
            at(off.flags).cast::<AtomicU32>().cast_const(),
            at(off.desc),
        );
        Ring {
            _map: map,
            producer,
            consumer,
            flags,
            desc,
            mask: size - 1,
            size,
            local: 0,
            remote: 0,
        }
    }

    fn load(p: *const AtomicU32) -> u32 {
        // SAFETY: `p` points at a u32 index inside the ring's mapping, which
        // lives as long as `self`; the kernel updates it concurrently, hence
        // the atomic.
        unsafe { (*p).load(Ordering::Acquire) }
    }

    fn store(p: *const AtomicU32, v: u32) {
        // SAFETY: as in `load`.
        unsafe { (*p).store(v, Ordering::Release) }
    }

    /// Whether the kernel asks to be woken up for this ring.
    fn needs_wakeup(&self) -> bool {
        Ring::load(self.flags) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // Producer side (fill, TX): `local` is our producer index, `remote` the
    // kernel's consumer index as last read.

    /// Free entries, re-reading the kernel's index if fewer than `want`.
    fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.local.wrapping_sub(self.remote);
        if free >= want {
            return free;
        }
        self.remote = Ring::load(self.consumer);
        self.size - self.local.wrapping_sub(self.remote)
    }

    /// Makes the entries written so far visible to the kernel.
    fn submit(&self) {
        Ring::store(self.producer, self.local);
    }

    // Consumer side (completion, RX): `local` is our consumer index,
    // `remote` the kernel's producer index as last read.

    /// Entries ready, re-reading the kernel's index when none are left.
    fn ready(&mut self) -> u32 {
        let ready = self.remote.wrapping_sub(self.local);
        if ready > 0 {
            return ready;
        }
        self.remote = Ring::load(self.producer);
        self.remote.wrapping_sub(self.local)
    }

    /// Hands the entries read so far back to the kernel.
    fn release(&self) {
        Ring::store(self.consumer, self.local);
    }

    fn u64_at(&self, i: u32) -> *mut u64 {
        // SAFETY: `i & mask` < size, and the kernel sized the descriptor
        // area for `size` u64 entries (fill and completion rings).
        unsafe { self.desc.cast::<u64>().add((i & self.mask) as usize) }
    }

    fn desc_at(&self, i: u32) -> *mut libc::xdp_desc {
        // SAFETY: as above, for `size` xdp_desc entries (RX and TX rings).
        unsafe {
            self.desc
                .cast::<libc::xdp_desc>()
                .add((i & self.mask) as usize)
        }
    }
}

/// What one [`XskSocket::send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Frames put on the TX ring by this call.
    pub queued: usize,
    /// Frames the kernel took off the TX ring since the previous call: they
    /// have left (this call's or earlier ones').
    pub left: usize,
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM.
pub struct XskSocket {
    // Rings before the UMEM and the socket: unmapped before either goes.
    fill: Option<Ring>,
    comp: Option<Ring>,
    rx: Option<Ring>,
    tx: Option<Ring>,
    umem: Mmap,
    fd: OwnedFd,
    /// UMEM chunk addresses this side owns (not in any ring).
    free: Vec<u64>,
    zerocopy: bool,
    ifindex: u32,
    mac: [u8; 6],
    iface: String,
    queue: u32,
    /// Frames the kernel has taken off the TX ring (its consumer index).
    tx_taken: u32,
}

// SAFETY: the raw pointers point into mappings this value owns; nothing else
// in the process refers to them, so moving the socket to another thread moves
// sole access with it (the kernel's concurrent side is synchronised by the
// atomic indices).
unsafe impl Send for XskSocket {}

fn setsockopt<T>(fd: &OwnedFd, name: libc::c_int, v: &T) -> io::Result<()> {
    let len = libc::socklen_t::try_from(std::mem::size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `v` is a live value of the type the option expects, `len` its
    // size; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            std::ptr::from_ref(v).cast(),
            len,
        )
    };
    cvt(r).map(drop)
}

fn getsockopt<T: Copy>(fd: &OwnedFd, name: libc::c_int, v: &mut T) -> io::Result<()> {
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `v` is a live, writable value of the option's type and `len`
    // its size; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            std::ptr::from_mut(v).cast(),
            &mut len,
        )
    };
    cvt(r).map(drop)
}

impl XskSocket {
    /// Opens, registers the UMEM, maps the rings and binds (inside
    /// `o.netns`). Every refusal names the step.
    pub fn open(o: &XskOptions) -> Result<XskSocket, XskError> {
        if !o.frames.is_power_of_two()
            || !o.ring.is_power_of_two()
            || o.frames < 2 * o.ring
            || !(o.rx || o.tx)
        {
            return Err(XskError::Config {
                iface: o.iface.clone(),
                what: format!(
                    "{} frames and {}-entry rings: both powers of two, frames at least twice the ring, and rx or tx",
                    o.frames, o.ring
                ),
            });
        }
        sidecore_testbed::within(o.netns.as_deref(), || Self::open_here(o))?
    }

    fn open_here(o: &XskOptions) -> Result<XskSocket, XskError> {
        let err = |what| {
            let iface = o.iface.clone();
            let queue = o.queue;
            move |source| XskError::Io {
                iface,
                queue,
                what,
                source,
            }
        };
        let name = CString::new(o.iface.as_str())
            .map_err(|_| err("interface name")(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let ifindex = crate::raw::ifindex(&name).map_err(err("no such interface"))?;
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        let raw = cvt(raw).map_err(err("socket"))?;
        // SAFETY: socket(2) returned a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = o.frames as usize * CHUNK_BYTES as usize;
        let umem = Mmap::anonymous(umem_len).map_err(err("UMEM mmap"))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr as u64,
            len: umem_len as u64,
            chunk_size: CHUNK_BYTES,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(&fd, libc::XDP_UMEM_REG, &reg).map_err(err("XDP_UMEM_REG"))?;
        // The UMEM's fill and completion rings are needed even by a socket
        // that only sends (the kernel refuses to bind without them).
        setsockopt(&fd, libc::XDP_UMEM_FILL_RING, &o.ring).map_err(err("XDP_UMEM_FILL_RING"))?;
        setsockopt(&fd, libc::XDP_UMEM_COMPLETION_RING, &o.ring)
            .map_err(err("XDP_UMEM_COMPLETION_RING"))?;
        if o.rx {
            setsockopt(&fd, libc::XDP_RX_RING, &o.ring).map_err(err("XDP_RX_RING"))?;
        }
        if o.tx {
            setsockopt(&fd, libc::XDP_TX_RING, &o.ring).map_err(err("XDP_TX_RING"))?;
        }
        // SAFETY: all-zero offsets are a valid value for the kernel to fill.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        getsockopt(&fd, libc::XDP_MMAP_OFFSETS, &mut off).map_err(err("XDP_MMAP_OFFSETS"))?;
        let ring_len = |ro: &libc::xdp_ring_offset, entry: usize| {
            usize::try_from(ro.desc).unwrap_or(usize::MAX) + o.ring as usize * entry
        };
        let u64_bytes = 8;
        let fill = Mmap::ring(
            fd.as_fd(),
            ring_len(&off.fr, u64_bytes),
            libc::XDP_UMEM_PGOFF_FILL_RING,
        )
        .map_err(err("fill ring mmap"))?;
        let comp = Mmap::ring(
            fd.as_fd(),
            ring_len(&off.cr, u64_bytes),
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )
        .map_err(err("completion ring mmap"))?;
        let mut s = XskSocket {
            fill: Some(Ring::new(fill, &off.fr, o.ring)),
            comp: Some(Ring::new(comp, &off.cr, o.ring)),
            rx: None,
            tx: None,
            umem,
            fd,
            free: (0..u64::from(o.frames))
                .rev()
                .map(|i| i * u64::from(CHUNK_BYTES))
                .collect(),
            zerocopy: false,
            ifindex,
            mac: [0; 6],
            iface: o.iface.clone(),
            queue: o.queue,
            tx_taken: 0,
        };
        s.map_rx_tx(o, &off).map_err(|(what, e)| err(what)(e))?;
        s.bind(o).map_err(err("bind"))?;
        let mut opts = libc::xdp_options { flags: 0 };
        getsockopt(&s.fd, libc::XDP_OPTIONS, &mut opts).map_err(err("XDP_OPTIONS"))?;
        s.zerocopy = opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0;
        s.mac = crate::raw::hwaddr_of(&name).map_err(err("SIOCGIFHWADDR"))?;
        Ok(s)
    }

    /// Maps the RX and TX rings asked for (and stocks the fill ring).
    fn map_rx_tx(
        &mut self,
        o: &XskOptions,
        off: &libc::xdp_mmap_offsets,
    ) -> Result<(), (&'static str, io::Error)> {
        let desc_bytes = std::mem::size_of::<libc::xdp_desc>();
        let len = |ro: &libc::xdp_ring_offset| {
            usize::try_from(ro.desc).unwrap_or(usize::MAX) + o.ring as usize * desc_bytes
        };
        if o.rx {
            #[allow(clippy::cast_sign_loss)] // a page offset constant, 0
            let pg = libc::XDP_PGOFF_RX_RING as u64;
            let m =
                Mmap::ring(self.fd.as_fd(), len(&off.rx), pg).map_err(|e| ("RX ring mmap", e))?;
            self.rx = Some(Ring::new(m, &off.rx, o.ring));
            self.stock_fill();
        }
        if o.tx {
            #[allow(clippy::cast_sign_loss)] // a page offset constant, 2^31
            let pg = libc::XDP_PGOFF_TX_RING as u64;
            let m =
                Mmap::ring(self.fd.as_fd(), len(&off.tx), pg).map_err(|e| ("TX ring mmap", e))?;
            self.tx = Some(Ring::new(m, &off.tx, o.ring));
        }
        Ok(())
    }

    fn bind(&self, o: &XskOptions) -> io::Result<()> {
        let mode = match o.bind {
            XskBind::Auto => 0,
            XskBind::Copy => libc::XDP_COPY,
            XskBind::ZeroCopy => libc::XDP_ZEROCOPY,
        };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: mode | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: self.ifindex,
            sxdp_queue_id: o.queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a live sockaddr_xdp and its exact size is passed.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                std::ptr::from_ref(&sa).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        cvt(r).map(drop)
    }

    /// Puts free chunks on the fill ring, keeping half of the free chunks
    /// back for sending.
    fn stock_fill(&mut self) {
        let Some(fill) = self.fill.as_mut() else {
            return;
        };
        let keep = if self.tx.is_some() {
            self.free.len() / 2
        } else {
            0
        };
        let n = fill
            .free(1)
            .min(u32::try_from(self.free.len() - keep).unwrap_or(0));
        for _ in 0..n {
            let addr = self.free.pop().expect("counted above");
            // SAFETY: the entry at the producer index is this side's to write
            // until it is submitted.
            unsafe { *fill.u64_at(fill.local) = addr };
            fill.local = fill.local.wrapping_add(1);
        }
        fill.submit();
    }

    /// Whether the kernel bound it zero-copy.
    pub fn zerocopy(&self) -> bool {
        self.zerocopy
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The queue it is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The socket, to put into an XSKMAP.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Takes back the chunks the kernel has finished sending.
    fn reclaim(&mut self) {
        let Some(comp) = self.comp.as_mut() else {
            return;
        };
        let n = comp.ready();
        for _ in 0..n {
            // SAFETY: entries between our consumer index and the kernel's
            // producer index are filled and ours to read until released.
            let addr = unsafe { *comp.u64_at(comp.local) };
            comp.local = comp.local.wrapping_add(1);
            debug_assert!(
                addr < self.umem.len as u64,
                "completion of a chunk outside the UMEM"
            );
            self.free.push(addr & !(u64::from(CHUNK_BYTES) - 1));
        }
        if n > 0 {
            comp.release();
        }
    }

    /// Queues up to `n` frames for sending, each written in place into a
    /// UMEM chunk by `build(i, chunk)` (`i` from 0), which returns the
    /// frame's length; then kicks the kernel until it has taken them (or is
    /// busy). Fewer than `n` are queued when the ring or the free chunks run
    /// out.
    ///
    /// # Errors
    /// The kick's error when it is not a transient one (busy device, full
    /// queue: the frames then stay queued for the next call).
    pub fn send(
        &mut self,
        n: usize,
        mut build: impl FnMut(usize, &mut [u8]) -> usize,
    ) -> io::Result<Sent> {
        self.reclaim();
        let Some(tx) = self.tx.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this AF_XDP socket was opened without a TX ring",
            ));
        };
        let room = tx.free(u32::try_from(n).unwrap_or(u32::MAX)) as usize;
        let k = n.min(room).min(self.free.len());
        for i in 0..k {
            let addr = self.free.pop().expect("counted above");
            let start = usize::try_from(addr).expect("inside the UMEM");
            // SAFETY: the chunk [addr, addr + CHUNK_BYTES) is inside the UMEM
            // and owned by this side (it came from the free list), so no
            // one else reads or writes it until it is queued.
            let chunk = unsafe {
                std::slice::from_raw_parts_mut(self.umem.ptr.add(start), CHUNK_BYTES as usize)
            };
            let len = build(i, chunk);
            assert!(len <= CHUNK_BYTES as usize, "a {len}-byte frame in a chunk");
            // SAFETY: the entry at the producer index is this side's to write.
            unsafe {
                *tx.desc_at(tx.local) = libc::xdp_desc {
                    addr,
                    len: u32::try_from(len).expect("at most CHUNK_BYTES"),
                    options: 0,
                };
            }
            tx.local = tx.local.wrapping_add(1);
        }
        if k > 0 {
            tx.submit();
        }
        self.kick()?;
        let tx = self.tx.as_ref().expect("checked above");
        let taken = Ring::load(tx.consumer);
        let left = taken.wrapping_sub(self.tx_taken) as usize;
        self.tx_taken = taken;
        Ok(Sent { queued: k, left })
    }

    /// Frames queued on the TX ring that the kernel has not taken yet.
    pub fn tx_pending(&self) -> usize {
        self.tx.as_ref().map_or(0, |tx| {
            tx.local.wrapping_sub(Ring::load(tx.consumer)) as usize
        })
    }

    /// Asks the kernel to transmit what is queued: in copy mode each kick
    /// sends up to 32 frames, so kick until the ring is drained.
    fn kick(&self) -> io::Result<()> {
        let Some(tx) = self.tx.as_ref() else {
            return Ok(());
        };
        for _ in 0..MAX_KICKS {
            if tx.local == Ring::load(tx.consumer) || (!tx.needs_wakeup() && self.zerocopy) {
                return Ok(());
            }
            // SAFETY: a zero-length send with no buffer or address: the kernel
            // reads nothing from user memory.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // The kernel's loop stopped after its batch: go on.
                Some(libc::EAGAIN) => {}
                // Busy device or full queue: try again on the next call.
                Some(libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => return Ok(()),
                _ => return Err(e),
            }
        }
        Ok(())
    }

    /// Hands up to `max` received frames to `f` (in place, writable: a
    /// forwarder may rewrite headers), then gives their chunks back to the
    /// fill ring. Returns how many.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&mut [u8])) -> usize {
        let Some(rx) = self.rx.as_mut() else {
            return 0;
        };
        let n = (rx.ready() as usize).min(max);
        for _ in 0..n {
            // SAFETY: entries between our consumer index and the kernel's
            // producer index are filled and ours until released.
            let d = unsafe { *rx.desc_at(rx.local) };
            rx.local = rx.local.wrapping_add(1);
            let start = usize::try_from(d.addr).unwrap_or(usize::MAX);
            let len = d.len as usize;
            assert!(
                start.saturating_add(len) <= self.umem.len,
                "an RX descriptor outside the UMEM"
            );
            // SAFETY: the kernel handed this chunk over with the descriptor;
            // it is inside the UMEM (checked) and not touched by the kernel
            // until we put it back on the fill ring.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(start), len) };
            f(frame);
            self.free.push(d.addr & !(u64::from(CHUNK_BYTES) - 1));
        }
        if n > 0 {
            rx.release();
            self.stock_fill();
        }
        if self.fill.as_ref().is_some_and(Ring::needs_wakeup) && n == 0 {
            // SAFETY: a zero-length receive with no buffer: the kernel writes
            // nothing to user memory; it only wakes the driver.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        n
    }

    /// The kernel's drop counters for this socket.
    pub fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: all-zero statistics are a valid value for the kernel to fill.
        let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        getsockopt(&self.fd, libc::XDP_STATISTICS, &mut s)?;
        Ok(s)
    }
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("iface", &self.iface)
            .field("queue", &self.queue)
            .field("zerocopy", &self.zerocopy)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sizes_and_missing_interfaces_are_named() {
        let mut o = XskOptions::tx(None, "sc-nothing0");
        o.ring = 1000;
        let e = XskSocket::open(&o).unwrap_err().to_string();
        assert!(
            e.contains("sc-nothing0") && e.contains("powers of two"),
            "{e}"
        );
        let e = XskSocket::open(&XskOptions::tx(None, "sc-nothing0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("AF_XDP socket on sc-nothing0 queue 0: no such interface"),
            "{e}"
        );
    }
}
