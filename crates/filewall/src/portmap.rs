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

/// FileWall's own portmapper: answers from the mappings of its listeners, so an
/// unmodified client that asks port 111 where NFS and MOUNT are is sent to the
/// proxy. Registrations (SET, UNSET) are refused: the table is FileWall's.
pub fn answer(call: &PmapCall, mappings: &[Mapping]) -> PmapReply {
    match call {
        PmapCall::Null(()) => PmapReply::Null(()),
        PmapCall::Set(_) => PmapReply::Set(false),
        PmapCall::Unset(_) => PmapReply::Unset(false),
        PmapCall::Getport(want) => {
            let port = mappings
                .iter()
                .find(|m| m.prog == want.prog && m.vers == want.vers && m.prot == want.prot)
                .map_or(0, |m| m.port);
            PmapReply::Getport(port)
        }
        PmapCall::Dump(()) => PmapReply::Dump(List(mappings.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getport_answers_from_the_table() {
        let table = [
            Mapping {
                prog: 100_003,
                vers: 3,
                prot: IPPROTO_TCP,
                port: 3049,
            },
            Mapping {
                prog: 100_005,
                vers: 3,
                prot: IPPROTO_UDP,
                port: 3050,
            },
        ];
        let ask = |prog, prot| {
            answer(
                &PmapCall::Getport(Mapping {
                    prog,
                    vers: 3,
                    prot,
                    port: 0,
                }),
                &table,
            )
        };
        assert_eq!(ask(100_003, IPPROTO_TCP), PmapReply::Getport(3049));
        assert_eq!(ask(100_003, IPPROTO_UDP), PmapReply::Getport(0));
        assert_eq!(ask(100_005, IPPROTO_UDP), PmapReply::Getport(3050));
        assert_eq!(
            answer(&PmapCall::Set(table[0].clone()), &table),
            PmapReply::Set(false)
        );
        assert_eq!(
            answer(&PmapCall::Dump(()), &table),
            PmapReply::Dump(List(table.to_vec()))
        );
    }
}
