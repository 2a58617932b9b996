//! AF_PACKET sockets bound to one interface: whole Ethernet frames in and
//! out, a batch per system call (sendmmsg, recvmmsg).
//!
//! * **Qdisc bypass** (`PACKET_QDISC_BYPASS`): frames go straight to the
//!   driver, skipping the traffic-control layer, as pktgen-style generators do.
//! * **Incoming only** (`PACKET_IGNORE_OUTGOING`): a receiving socket does not
//!   see the frames this host sends.
//! * **Kernel timestamps** (`SO_TIMESTAMPNS`): each received frame carries the
//!   time the kernel saw it, for inter-arrival statistics.
//!
//! A socket is created, bound and queried inside the namespace it is for;
//! it stays there whichever thread uses it afterwards.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use sidecore_testbed::NetnsError;

/// From <linux/if_packet.h>.
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// From <asm-generic/socket.h> (x86-64 and arm64 share it).
const SO_TIMESTAMPNS: libc::c_int = 35;
/// `ETH_P_ALL` in network byte order, as AF_PACKET wants it.
const ETH_P_ALL_BE: u16 = (libc::ETH_P_ALL as u16).to_be();
/// Room for one frame in a receive batch (the MTU's frame, rounded up).
pub const SLOT_BYTES: usize = 2048;
/// Control-message room per received frame (one timespec).
const CMSG_BYTES: usize = 64;

/// How to open a raw socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawOptions {
    /// Network namespace of the interface (`None`: this thread's).
    pub netns: Option<String>,
    pub iface: String,
    /// Receive frames (otherwise the socket only sends).
    pub receive: bool,
    /// Send straight to the driver.
    pub qdisc_bypass: bool,
    /// Stamp received frames in the kernel.
    pub timestamps: bool,
}

/// Why a raw socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("AF_PACKET socket on {iface}: {what}: {source}")]
    Io {
        iface: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// An AF_PACKET socket bound to one interface.
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    iface: String,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The index of interface `name` in this network namespace.
pub(crate) fn ifindex(name: &std::ffi::CStr) -> io::Result<u32> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

fn set_int(fd: impl AsFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: `v` is a live c_int for the duration of the call and its size
    // is passed with it; `fd` is an open socket.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(r).map(drop)
}

impl RawSocket {
    /// Opens and binds a socket on `o.iface` (inside `o.netns`).
    pub fn open(o: &RawOptions) -> Result<RawSocket, RawError> {
        sidecore_testbed::within(o.netns.as_deref(), || Self::open_here(o))?
    }

    fn open_here(o: &RawOptions) -> Result<RawSocket, RawError> {
        let err = |what| {
            let iface = o.iface.clone();
            move |source| RawError::Io {
                iface,
                what,
                source,
            }
        };
        let name = CString::new(o.iface.as_str())
            .map_err(|_| err("interface name")(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let ifindex = ifindex(&name).map_err(err("no such interface"))?;
        let proto = if o.receive { ETH_P_ALL_BE } else { 0 };
        // SAFETY: plain socket(2) call; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::c_int::from(proto),
            )
        };
        let raw = cvt(raw).map_err(err("socket (needs CAP_NET_RAW)"))?;
        // SAFETY: socket(2) returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| err("interface index")(io::Error::from(io::ErrorKind::InvalidData)))?;
        // SAFETY: an all-zero sockaddr_ll is a valid value to fill in.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a live sockaddr_ll and its exact size is passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        cvt(r).map_err(err("bind"))?;
        if o.qdisc_bypass {
            set_int(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1)
                .map_err(err("PACKET_QDISC_BYPASS"))?;
        }
        if o.receive {
            set_int(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                .map_err(err("PACKET_IGNORE_OUTGOING"))?;
        }
        if o.timestamps {
            set_int(&fd, libc::SOL_SOCKET, SO_TIMESTAMPNS, 1).map_err(err("SO_TIMESTAMPNS"))?;
        }
        let mac = hwaddr(&fd, &name).map_err(err("SIOCGIFHWADDR"))?;
        Ok(RawSocket {
            fd,
            ifindex,
            mac,
            iface: o.iface.clone(),
        })
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The interface's index (in its namespace).
    pub fn ifindex(&self) -> i32 {
        self.ifindex
    }

    /// Sends whole frames, one system call for the batch; returns how many the
    /// kernel took (it may take fewer when its queue is full).
    pub fn send(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let mut iov: Vec<libc::iovec> = frames
            .iter()
            .map(|f| libc::iovec {
                iov_base: f.as_ptr().cast_mut().cast(),
                iov_len: f.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: an all-zero msghdr is a valid empty header.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = std::ptr::from_mut(v);
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let n = u32::try_from(hdrs.len()).unwrap_or(u32::MAX);
        // SAFETY: every header points at one iovec, which points at a frame the
        // caller borrows for the duration of the call; the kernel only reads them.
        let r = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), n, 0) };
        usize::try_from(cvt(r)?).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
    }

    /// Receives up to a batch of frames without waiting; returns how many (0
    /// when none is waiting).
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        recv_batch(&self.fd, batch)
    }
}

/// Turns on kernel receive timestamps on any socket.
pub fn enable_timestamps(fd: &impl AsFd) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPNS, 1)
}

/// Asks for a receive buffer of `bytes` on any socket: SO_RCVBUFFORCE (root,
/// past `net.core.rmem_max`), else SO_RCVBUF (capped by it).
pub fn set_receive_buffer(fd: &impl AsFd, bytes: libc::c_int) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
        .or_else(|_| set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))
}

/// Receives up to a batch of messages from any socket without waiting (one
/// recvmmsg); returns how many. Each message's bytes, length and kernel
/// timestamp land in `batch`.
pub fn recv_batch(fd: &impl AsFd, batch: &mut RecvBatch) -> io::Result<usize> {
    let count = batch.slots.len();
    let mut iov: Vec<libc::iovec> = batch
        .slots
        .iter_mut()
        .map(|s| libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: SLOT_BYTES,
        })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .zip(batch.ctrl.iter_mut())
        .map(|(v, c)| {
            // SAFETY: an all-zero msghdr is a valid empty header.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = std::ptr::from_mut(v);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = c.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CMSG_BYTES;
            h
        })
        .collect();
    let n = u32::try_from(count).unwrap_or(u32::MAX);
    // SAFETY: each header points at its own slot (SLOT_BYTES) and control
    // buffer (CMSG_BYTES), both owned by `batch` and alive for the call.
    let r = unsafe {
        libc::recvmmsg(
            fd.as_fd().as_raw_fd(),
            hdrs.as_mut_ptr(),
            n,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let got = match cvt(r) {
        Ok(n) => usize::try_from(n).unwrap_or(0),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    for (i, h) in hdrs.iter().take(got).enumerate() {
        batch.lens[i] = (h.msg_len as usize).min(SLOT_BYTES);
        batch.stamps_ns[i] = timestamp(&h.msg_hdr).unwrap_or(0);
    }
    Ok(got)
}

/// The kernel's receive time in a message's control data, in ns.
fn timestamp(m: &libc::msghdr) -> Option<u64> {
    // SAFETY: `m` was filled by recvmmsg; CMSG_FIRSTHDR/NXTHDR walk within
    // msg_control/msg_controllen, which the kernel set.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: `c` points at a control message header inside the buffer.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == SO_TIMESTAMPNS {
            // SAFETY: an SCM_TIMESTAMPNS message carries one timespec; read it
            // unaligned as the control buffer gives no alignment guarantee.
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
            let secs = u64::try_from(ts.tv_sec).ok()?;
            let nanos = u64::try_from(ts.tv_nsec).ok()?;
            return Some(secs * 1_000_000_000 + nanos);
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
    None
}

/// The MAC address of interface `name` in this thread's namespace, through a
/// throwaway datagram socket (for sockets, like AF_XDP's, that take no
/// interface ioctls).
pub(crate) fn hwaddr_of(name: &CString) -> io::Result<[u8; 6]> {
    // SAFETY: plain socket(2); the result is checked.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket(2) returned a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    hwaddr(&fd, name)
}

/// The MAC address of `name`, through the socket.
fn hwaddr(fd: &OwnedFd, name: &CString) -> io::Result<[u8; 6]> {
    // SAFETY: an all-zero ifreq is a valid request to fill in.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR reads ifr_name and writes ifr_hwaddr inside `req`,
    // which lives for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
    cvt(r)?;
    // SAFETY: after SIOCGIFHWADDR the union holds ifr_hwaddr.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

/// Buffers for receiving a batch of frames.
pub struct RecvBatch {
    slots: Vec<[u8; SLOT_BYTES]>,
    ctrl: Vec<[u8; CMSG_BYTES]>,
    /// Length of each received frame.
    pub lens: Vec<usize>,
    /// Kernel receive time of each frame (ns since the epoch), 0 if none.
    pub stamps_ns: Vec<u64>,
}

impl RecvBatch {
    /// Room for `n` frames.
    pub fn new(n: usize) -> RecvBatch {
        RecvBatch {
            slots: vec![[0; SLOT_BYTES]; n],
            ctrl: vec![[0; CMSG_BYTES]; n],
            lens: vec![0; n],
            stamps_ns: vec![0; n],
        }
    }

    /// Frame `i` of the last receive.
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.slots[i][..self.lens[i]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_is_named() {
        let e = RawSocket::open(&RawOptions {
            iface: "sc-nothing0".into(),
            ..RawOptions::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("AF_PACKET socket on sc-nothing0: no such interface"),
            "{e}"
        );
    }
}
