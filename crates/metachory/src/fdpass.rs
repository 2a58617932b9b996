//! Messages and descriptors over a `SOCK_SEQPACKET` control socket
//! (`SCM_RIGHTS`), and the sender's PID as the receiving side's PID
//! namespace sees it (`SCM_CREDENTIALS`): how the guest's container hands
//! the server its FUSE device and seccomp listener and reports its state.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Largest control message, in bytes.
pub const MAX_CTL_BYTES: usize = 4096;

#[repr(C)]
struct CmsgBuf {
    _align: [u64; 0],
    bytes: [u8; 128],
}

/// Sends `msg` alone.
pub fn send_msg(sock: RawFd, msg: &[u8]) -> io::Result<()> {
    send(sock, msg, None)
}

/// Sends `msg` with descriptor `fd`.
pub fn send_fd(sock: RawFd, msg: &[u8], fd: RawFd) -> io::Result<()> {
    send(sock, msg, Some(fd))
}

fn send(sock: RawFd, msg: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr().cast_mut().cast(),
        iov_len: msg.len(),
    };
    let mut buf = CmsgBuf {
        _align: [],
        bytes: [0; 128],
    };
    // SAFETY: a zeroed msghdr is a valid empty message; fields are set below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &raw mut iov;
    m.msg_iovlen = 1;
    if let Some(fd) = fd {
        m.msg_control = buf.bytes.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a size computation.
        m.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
        // SAFETY: the 8-aligned 128-byte buffer holds CMSG_SPACE(4).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&raw const m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: `m` and what it points at live for the call.
    if unsafe { libc::sendmsg(sock, &raw const m, libc::MSG_NOSIGNAL) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One received control message.
#[derive(Debug)]
pub struct Received {
    pub msg: Vec<u8>,
    pub fd: Option<OwnedFd>,
    /// The sender's PID in this process's namespace (needs `SO_PASSCRED`).
    pub pid: Option<i32>,
}

/// Turns on `SO_PASSCRED` so that [`recv`] learns senders' PIDs.
pub fn pass_credentials(sock: RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with an int option.
    let r = unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const one).cast(),
            std::mem::size_of::<libc::c_int>() as _,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one message (`Ok(None)`: the other side closed).
pub fn recv(sock: RawFd) -> io::Result<Option<Received>> {
    let mut data = vec![0u8; MAX_CTL_BYTES];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut buf = CmsgBuf {
        _align: [],
        bytes: [0; 128],
    };
    // SAFETY: a zeroed msghdr is a valid empty message; fields are set below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &raw mut iov;
    m.msg_iovlen = 1;
    m.msg_control = buf.bytes.as_mut_ptr().cast();
    m.msg_controllen = buf.bytes.len() as _;
    let n = loop {
        // SAFETY: `m` and its buffers live for the call.
        let n = unsafe { libc::recvmsg(sock, &raw mut m, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n == 0 && m.msg_controllen == 0 {
        return Ok(None);
    }
    data.truncate(n);
    let mut out = Received {
        msg: data,
        fd: None,
        pid: None,
    };
    // SAFETY: the kernel filled the control buffer; CMSG_FIRSTHDR/NXTHDR
    // stay within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                out.fd = Some(OwnedFd::from_raw_fd(fd));
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS
            {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>());
                out.pid = Some(cred.pid);
            }
            c = libc::CMSG_NXTHDR(&raw const m, c);
        }
    }
    Ok(Some(out))
}

/// A `SOCK_SEQPACKET` pair, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
