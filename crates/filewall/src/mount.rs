//! MOUNT version 3 (RFC 1813, appendix I): MNT, DUMP, UMNT, UMNTALL and EXPORT, with
//! paths bounded by `MNTPATHLEN` and names by `MNTNAMLEN`.

use crate::nfs3::NfsFh3;
use crate::xdr::{Decoder, Encoder, List, Xdr, XdrResult, rpc_procedures, xdr_enum};

/// The MOUNT program number.
pub const PROGRAM: u32 = 100_005;
/// The protocol version this module speaks.
pub const VERSION: u32 = 3;
/// Longest path accepted by MNT and UMNT.
pub const MNTPATHLEN: usize = 1024;
/// Longest host or group name.
pub const MNTNAMLEN: usize = 255;

/// A bounded XDR string (`dirpath` or `name`); bytes, since paths need not be UTF-8.
macro_rules! bounded_string {
    ($(#[$m:meta])* $name:ident, $max:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub Vec<u8>);

        impl Xdr for $name {
            fn encode(&self, enc: &mut Encoder) {
                enc.opaque(&self.0);
            }
            fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
                dec.opaque($max).map(|b| Self(b.to_vec())).map_err(|e| e.within(stringify!($name)))
            }
        }

        #[cfg(test)]
        impl proptest::arbitrary::Arbitrary for $name {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..40).prop_map($name).boxed()
            }
        }
    };
}

bounded_string!(
    /// `dirpath`: at most `MNTPATHLEN` bytes.
    DirPath,
    MNTPATHLEN
);
bounded_string!(
    /// `name`: at most `MNTNAMLEN` bytes.
    Name,
    MNTNAMLEN
);

xdr_enum! {
    /// `mountstat3`.
    pub enum MountStat3 {
        Ok = 0, Perm = 1, NoEnt = 2, Io = 5, Acces = 13, NotDir = 20, Inval = 22,
        NameTooLong = 63, NotSupp = 10004, ServerFault = 10006,
    }
}

/// `mountres3`: the root handle and the accepted auth flavors on success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRes3 {
    Ok {
        fhandle: NfsFh3,
        auth_flavors: Vec<u32>,
    },
    /// Never `MountStat3::Ok` when decoded.
    Fail(MountStat3),
}

/// At most this many auth flavors are accepted in a MNT reply (real servers list a few).
pub const MAX_AUTH_FLAVORS: usize = 64;

impl Xdr for MountRes3 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            MountRes3::Ok {
                fhandle,
                auth_flavors,
            } => {
                MountStat3::Ok.encode(enc);
                fhandle.encode(enc);
                enc.array(auth_flavors);
            }
            MountRes3::Fail(s) => s.encode(enc),
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        match dec.field::<MountStat3>("mountres3.fhs_status")? {
            MountStat3::Ok => Ok(MountRes3::Ok {
                fhandle: dec.field("mountres3_ok.fhandle")?,
                auth_flavors: dec
                    .array(MAX_AUTH_FLAVORS)
                    .map_err(|e| e.within("mountres3_ok.auth_flavors"))?,
            }),
            s => Ok(MountRes3::Fail(s)),
        }
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for MountRes3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        let failing: Vec<MountStat3> = MountStat3::ALL
            .iter()
            .copied()
            .filter(|s| *s != MountStat3::Ok)
            .collect();
        prop_oneof![
            (any::<NfsFh3>(), prop::collection::vec(any::<u32>(), 0..4)).prop_map(
                |(fhandle, auth_flavors)| MountRes3::Ok {
                    fhandle,
                    auth_flavors
                }
            ),
            prop::sample::select(failing).prop_map(MountRes3::Fail)
        ]
        .boxed()
    }
}

crate::xdr::xdr_struct! {
    /// One `mountbody` of a DUMP reply.
    pub struct MountBody { pub hostname: Name, pub directory: DirPath }
}

/// One `exportnode` of an EXPORT reply: a path and the groups allowed to mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportNode {
    pub dir: DirPath,
    pub groups: Vec<Name>,
}

impl Xdr for ExportNode {
    fn encode(&self, enc: &mut Encoder) {
        self.dir.encode(enc);
        enc.list(&self.groups);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Self {
            dir: dec.field("exportnode.ex_dir")?,
            groups: dec.list().map_err(|e| e.within("exportnode.ex_groups"))?,
        })
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for ExportNode {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        (any::<DirPath>(), prop::collection::vec(any::<Name>(), 0..4))
            .prop_map(|(dir, groups)| ExportNode { dir, groups })
            .boxed()
    }
}

rpc_procedures! {
    /// MOUNT v3 procedure numbers.
    MountProc, MountCall, MountReply, "MOUNTv3" {
        Null = 0: () => (),
        Mnt = 1: DirPath => MountRes3,
        Dump = 2: () => List<MountBody>,
        Umnt = 3: DirPath => (),
        Umntall = 4: () => (),
        Export = 5: () => List<ExportNode>,
    }
}
