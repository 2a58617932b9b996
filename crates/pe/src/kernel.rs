//! The kernel's eBPF engine as a PE: can this process load a program, and can
//! it attach one at XDP?
//!
//! The probe loads the smallest XDP program there is (`r0 = XDP_PASS; exit`)
//! with the raw `bpf(2)` system call and attaches it to the loopback device in
//! generic (SKB) mode through a BPF link, then closes both descriptors, which
//! detaches and frees everything. This is what `bpftool feature probe` and
//! libbpf's `libbpf_probe_bpf_prog_type` do; doing it directly avoids needing a
//! compiled object before anything is built. Real eBPF offcodes are C programs
//! compiled with clang and loaded through a BPF loader library.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;

/// What the probe found.
#[derive(Debug, Clone)]
pub struct KernelInfo {
    pub release: String,
    pub jit: Option<bool>,
    pub btf: bool,
    /// Ok if an XDP program could be attached to `lo` (and was detached again).
    pub xdp_attach: Result<(), XdpAttachError>,
    /// RLIMIT_MEMLOCK, if finite and this kernel still charges BPF memory to
    /// it (before 5.11; later kernels use the memory cgroup).
    pub memlock: Option<u64>,
}

/// Why the probe's XDP program could not be attached to `lo` (the kernel stays
/// usable as a PE, without XDP).
#[derive(Debug, Clone, thiserror::Error)]
pub enum XdpAttachError {
    #[error("no loopback device to attach to")]
    NoLoopback,
    /// `BPF_LINK_CREATE` refused (shared so that the probe's result stays `Clone`).
    #[error("{0}")]
    Link(Arc<std::io::Error>),
}

impl KernelInfo {
    pub fn describe(&self) -> String {
        format!(
            "eBPF on Linux {} (JIT {}, BTF {}, XDP attach {})",
            self.release,
            match self.jit {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            },
            if self.btf { "yes" } else { "no" },
            match &self.xdp_attach {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("failed: {e}"),
            }
        )
    }
}

/// An 8-byte eBPF instruction: code, dst/src registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let o = off.to_le_bytes();
    let i = imm.to_le_bytes();
    [
        code,
        (src << 4) | (dst & 0xf),
        o[0],
        o[1],
        i[0],
        i[1],
        i[2],
        i[3],
    ]
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<OwnedFd, std::io::Error> {
    // SAFETY: `attr` is a 128-byte, zero-initialised bpf_attr image whose
    // pointers (set by the caller) point at live buffers for the call's duration.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn load_xdp_pass() -> Result<OwnedFd, std::io::Error> {
    let prog: Vec<u8> = [
        insn(0xb7, 0, 0, 0, 2), // r0 = XDP_PASS
        insn(0x95, 0, 0, 0, 0), // exit
    ]
    .concat();
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_le_bytes());
    attr[4..8].copy_from_slice(&2u32.to_le_bytes());
    attr[8..16].copy_from_slice(&(prog.as_ptr() as u64).to_le_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_le_bytes());
    attr[48..57].copy_from_slice(b"sc_probe\0");
    attr[68..72].copy_from_slice(&BPF_XDP.to_le_bytes());
    bpf(BPF_PROG_LOAD, &mut attr)
}

fn attach_xdp(prog: &OwnedFd, ifindex: u32) -> Result<OwnedFd, std::io::Error> {
    use std::os::fd::AsRawFd;
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_le_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_le_bytes());
    attr[8..12].copy_from_slice(&BPF_XDP.to_le_bytes());
    attr[12..16].copy_from_slice(&XDP_FLAGS_SKB_MODE.to_le_bytes());
    bpf(BPF_LINK_CREATE, &mut attr)
}

fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Why the kernel is not usable as a PE.
#[derive(Debug, thiserror::Error)]
#[error("cannot load a BPF program: {source}{}", hint(source))]
pub struct KernelUnusable {
    #[source]
    pub source: std::io::Error,
}

/// What to do about a refused load.
fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) => {
            " (needs root or CAP_BPF + CAP_NET_ADMIN; check kernel.unprivileged_bpf_disabled and lockdown)"
        }
        Some(libc::ENOSYS) => " (kernel built without CONFIG_BPF_SYSCALL)",
        _ => "",
    }
}

/// Probes the eBPF engine. `Err` says why the kernel is not usable as a PE.
pub fn probe() -> Result<KernelInfo, KernelUnusable> {
    let prog = load_xdp_pass().map_err(|source| KernelUnusable { source })?;
    // SAFETY: the argument is a NUL-terminated C string literal.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    let xdp_attach = if lo == 0 {
        Err(XdpAttachError::NoLoopback)
    } else {
        attach_xdp(&prog, lo)
            .map(drop)
            .map_err(|e| XdpAttachError::Link(Arc::new(e)))
    };
    drop(prog);
    let jit = std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable")
        .ok()
        .map(|s| s.trim() != "0");
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let rel = release();
    let mut nums = rel
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse::<u32>().ok());
    let charges_memlock = (nums.next().unwrap_or(0), nums.next().unwrap_or(0)) < (5, 11);
    // SAFETY: getrlimit writes into the struct we pass.
    let memlock = if charges_memlock
        && unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0
        && lim.rlim_cur != libc::RLIM_INFINITY
    {
        Some(lim.rlim_cur)
    } else {
        None
    };
    Ok(KernelInfo {
        release: rel,
        jit,
        btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        xdp_attach,
        memlock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_expects() {
        assert_eq!(insn(0xb7, 0, 0, 0, 2), [0xb7, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(insn(0x95, 0, 0, 0, 0), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(insn(0xbf, 1, 6, -1, 0)[1], 0x61);
    }

    /// The probes load programs: one at a time, so counts are not disturbed.
    static PROBE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Counts the kernel's BPF objects of one kind by walking their ids
    /// (`BPF_PROG_GET_NEXT_ID` = 11, `BPF_LINK_GET_NEXT_ID` = 31).
    fn count_ids(cmd: libc::c_long) -> usize {
        let mut n = 0;
        let mut id = 0u32;
        loop {
            let mut attr = [0u8; 128];
            attr[0..4].copy_from_slice(&id.to_le_bytes());
            // SAFETY: a zeroed bpf_attr with start_id set; the kernel writes next_id.
            let rc =
                unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
            if rc != 0 {
                return n;
            }
            id = u32::from_le_bytes(attr[4..8].try_into().unwrap());
            n += 1;
        }
    }

    /// The probe must not leave its program or its XDP link behind.
    #[test]
    fn probe_leaves_no_bpf_object_behind() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // CI runs as root and sets this: there a skip would hide a leak.
            assert!(
                std::env::var_os("SIDECORE_REQUIRE_ROOT").is_none(),
                "SIDECORE_REQUIRE_ROOT is set but the tests do not run as root: \
                 the BPF clean-up check would be skipped"
            );
            return;
        }
        let _g = PROBE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (progs, links) = (count_ids(11), count_ids(31));
        let k = probe().unwrap();
        assert!(k.xdp_attach.is_ok(), "{:?}", k.xdp_attach);
        // The kernel frees programs after an RCU grace period: wait for it.
        let t0 = std::time::Instant::now();
        while (count_ids(11), count_ids(31)) != (progs, links)
            && t0.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(count_ids(11), progs, "program freed");
        assert_eq!(count_ids(31), links, "XDP link detached and freed");
    }

    /// Runs against the real kernel: as root on this machine it must load and
    /// attach; as another user it must fail with a reason, not panic.
    #[test]
    fn probe_reports_load_and_attach() {
        let _g = PROBE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        match probe() {
            Ok(k) => {
                assert!(!k.release.is_empty());
                if root {
                    assert!(
                        k.xdp_attach.is_ok(),
                        "root can attach XDP to lo: {:?}",
                        k.xdp_attach
                    );
                }
                assert!(k.describe().contains("eBPF on Linux"));
            }
            Err(e) => {
                assert!(!root, "root must be able to load a BPF program: {e}");
                assert!(e.to_string().contains("cannot load a BPF program"));
            }
        }
    }

    /// `sidecore devices` prints `describe()`: a failed attach reads as the
    /// system's message after "failed: ".
    #[test]
    fn a_failed_attach_is_described_with_its_reason() {
        let mut k = KernelInfo {
            release: "6.1.0".into(),
            jit: Some(true),
            btf: true,
            xdp_attach: Err(XdpAttachError::NoLoopback),
            memlock: None,
        };
        assert_eq!(
            k.describe(),
            "eBPF on Linux 6.1.0 (JIT on, BTF yes, XDP attach failed: no loopback device to attach to)"
        );
        k.xdp_attach = Err(XdpAttachError::Link(Arc::new(
            std::io::Error::from_raw_os_error(libc::EPERM),
        )));
        assert_eq!(
            k.describe(),
            "eBPF on Linux 6.1.0 (JIT on, BTF yes, XDP attach failed: Operation not permitted (os error 1))"
        );
    }
}
