//! The portmapper, version 2 (RFC 1833 §3): NULL, SET, UNSET, GETPORT and DUMP, enough
//! for unmodified clients to find FileWall's MOUNT and NFS ports. CALLIT is not served.

use crate::xdr::{List, rpc_procedures, xdr_struct};

/// The portmapper program number.
pub const PROGRAM: u32 = 100_000;
/// The protocol version this module speaks.
pub const VERSION: u32 = 2;
/// The well-known portmapper port.
pub const PORT: u16 = 111;
/// `IPPROTO_TCP` in a mapping.
pub const IPPROTO_TCP: u32 = 6;
/// `IPPROTO_UDP` in a mapping.
pub const IPPROTO_UDP: u32 = 17;

xdr_struct! {
    /// `mapping`: program, version and protocol to a port.
    pub struct Mapping { pub prog: u32, pub vers: u32, pub prot: u32, pub port: u32 }
}

rpc_procedures! {
    /// Portmapper v2 procedure numbers (CALLIT, 5, is left out).
    PmapProc, PmapCall, PmapReply, "PMAPv2" {
        Null = 0: () => (),
        Set = 1: Mapping => bool,
        Unset = 2: Mapping => bool,
        Getport = 3: Mapping => u32,
        Dump = 4: () => List<Mapping>,
    }
}
