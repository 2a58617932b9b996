//! AF_XDP receive: loads `bpf/xsk_redirect.bpf.c`, attaches it at XDP on an
//! interface (in a namespace if asked) and puts AF_XDP sockets into its
//! XSKMAP by queue, so that IPv4 frames arriving on that queue go to the
//! socket instead of the kernel's stack (ARP and the rest still pass).
//!
//! The attachment is a BPF link owned by this process, like the firewall's:
//! a crash detaches it.

use std::os::fd::AsRawFd;

use aya::Ebpf;
use aya::maps::XskMap;
use aya::programs::Xdp;
use aya::programs::xdp::XdpLinkId;

use crate::error::{KernelError, XdpMode, chain, refused};
use crate::objects;

/// The XDP program's name in the object.
pub const PROGRAM: &str = "sidecore_xsk";
/// The XSKMAP's name.
const MAP: &str = "xsk_sockets";
/// Queues the map can hold (`XSK_MAX_QUEUES`).
pub const MAX_QUEUES: u32 = 64;

/// The redirect program: loaded, attached where asked, with its sockets.
pub struct XskRedirect {
    ebpf: Ebpf,
    sockets: XskMap<aya::maps::MapData>,
    link: Option<(XdpLinkId, Option<String>, String)>,
}

fn missing(what: &'static str, name: &str) -> KernelError {
    KernelError::Missing {
        object: "xsk_redirect".into(),
        what,
        name: name.to_string(),
    }
}

impl XskRedirect {
    /// Loads the object and its program (the verifier runs here).
    pub fn load() -> Result<XskRedirect, KernelError> {
        let mut ebpf = Ebpf::load(objects::xsk_redirect()).map_err(|e| KernelError::Load {
            object: "xsk_redirect".into(),
            detail: chain(&e),
        })?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| missing("program", PROGRAM))?
            .try_into()
            .map_err(|e| refused(PROGRAM, &e))?;
        prog.load().map_err(|e| refused(PROGRAM, &e))?;
        let sockets = XskMap::try_from(ebpf.take_map(MAP).ok_or_else(|| missing("map", MAP))?)
            .map_err(|e| KernelError::Map {
                map: MAP.into(),
                detail: chain(&e),
            })?;
        Ok(XskRedirect {
            ebpf,
            sockets,
            link: None,
        })
    }

    /// Sends IPv4 frames arriving on `queue` to the AF_XDP socket `fd`.
    pub fn insert(&mut self, queue: u32, fd: impl AsRawFd) -> Result<(), KernelError> {
        self.sockets
            .set(queue, fd, 0)
            .map_err(|e| KernelError::Map {
                map: MAP.into(),
                detail: format!("queue {queue}: {}", chain(&e)),
            })
    }

    /// Attaches at XDP to `iface` (in namespace `netns`); attaching where it
    /// already is does nothing.
    pub fn attach(
        &mut self,
        netns: Option<&str>,
        iface: &str,
        mode: XdpMode,
    ) -> Result<(), KernelError> {
        if self
            .link
            .as_ref()
            .is_some_and(|(_, n, i)| n.as_deref() == netns && i == iface)
        {
            return Ok(());
        }
        self.detach();
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| missing("program", PROGRAM))?;
        let id =
            sidecore_testbed::within(netns, || prog.attach(iface, mode.aya()))?.map_err(|e| {
                KernelError::Attach {
                    program: PROGRAM.into(),
                    iface: iface.to_string(),
                    netns: netns.map(str::to_string),
                    detail: chain(&e),
                }
            })?;
        self.link = Some((id, netns.map(str::to_string), iface.to_string()));
        Ok(())
    }

    /// Detaches, if attached.
    pub fn detach(&mut self) {
        let Some((id, _, _)) = self.link.take() else {
            return;
        };
        if let Some(prog) = self
            .ebpf
            .program_mut(PROGRAM)
            .and_then(|p| <&mut Xdp>::try_from(p).ok())
        {
            // The link is this process's; closing it cannot leave the program
            // attached, so an error here has nothing to undo.
            let _ = prog.detach(id);
        }
    }
}

impl Drop for XskRedirect {
    fn drop(&mut self) {
        self.detach();
    }
}
