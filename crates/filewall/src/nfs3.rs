//! NFS version 3 (RFC 1813): every procedure's arguments and results as typed XDR.
//! File names and paths stay bytes (NFS does not promise UTF-8); file handles are
//! bounded by `NFS3_FHSIZE` on decode.

use crate::xdr::{
    Decoder, Encoder, Xdr, XdrError, XdrErrorKind, XdrResult, rpc_procedures, xdr_enum, xdr_struct,
};

/// The NFS program number.
pub const PROGRAM: u32 = 100_003;
/// The protocol version this module speaks.
pub const VERSION: u32 = 3;
/// The largest NFSv3 file handle.
pub const NFS3_FHSIZE: usize = 64;

/// `nfs_fh3`: an opaque handle of at most 64 bytes. A longer one is a decode error;
/// nothing of the claimed size is allocated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NfsFh3(pub Vec<u8>);

impl NfsFh3 {
    /// A handle from bytes, refusing more than `NFS3_FHSIZE`.
    pub fn new(bytes: Vec<u8>) -> Result<Self, XdrError> {
        if bytes.len() > NFS3_FHSIZE {
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            return Err(XdrError::new(
                0,
                XdrErrorKind::TooLong {
                    len,
                    max: NFS3_FHSIZE,
                },
            )
            .within("nfs_fh3"));
        }
        Ok(Self(bytes))
    }
}

impl Xdr for NfsFh3 {
    fn encode(&self, enc: &mut Encoder) {
        enc.opaque(&self.0);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.opaque(NFS3_FHSIZE)
            .map(|b| Self(b.to_vec()))
            .map_err(|e| e.within("nfs_fh3"))
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for NfsFh3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::strategy::Strategy;
        proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..=NFS3_FHSIZE)
            .prop_map(NfsFh3)
            .boxed()
    }
}

xdr_enum! {
    /// `nfsstat3`.
    pub enum NfsStat3 {
        Ok = 0, Perm = 1, NoEnt = 2, Io = 5, NxIo = 6, Acces = 13, Exist = 17, XDev = 18,
        NoDev = 19, NotDir = 20, IsDir = 21, Inval = 22, FBig = 27, NoSpc = 28, RoFs = 30,
        MLink = 31, NameTooLong = 63, NotEmpty = 66, DQuot = 69, Stale = 70, Remote = 71,
        BadHandle = 10001, NotSync = 10002, BadCookie = 10003, NotSupp = 10004,
        TooSmall = 10005, ServerFault = 10006, BadType = 10007, Jukebox = 10008,
    }
}

xdr_enum! {
    /// `ftype3`.
    pub enum Ftype3 { Reg = 1, Dir = 2, Blk = 3, Chr = 4, Lnk = 5, Sock = 6, Fifo = 7 }
}

xdr_enum! {
    /// `stable_how`.
    pub enum StableHow { Unstable = 0, DataSync = 1, FileSync = 2 }
}

xdr_struct! {
    /// `specdata3`: major/minor device numbers.
    pub struct SpecData3 { pub specdata1: u32, pub specdata2: u32 }
}

xdr_struct! {
    /// `nfstime3`.
    pub struct NfsTime3 { pub seconds: u32, pub nseconds: u32 }
}

xdr_struct! {
    /// `fattr3`.
    pub struct Fattr3 {
        pub ftype: Ftype3, pub mode: u32, pub nlink: u32, pub uid: u32, pub gid: u32,
        pub size: u64, pub used: u64, pub rdev: SpecData3, pub fsid: u64, pub fileid: u64,
        pub atime: NfsTime3, pub mtime: NfsTime3, pub ctime: NfsTime3,
    }
}

/// `post_op_attr`.
pub type PostOpAttr = Option<Fattr3>;
/// `post_op_fh3`.
pub type PostOpFh3 = Option<NfsFh3>;

xdr_struct! {
    /// `wcc_attr`.
    pub struct WccAttr { pub size: u64, pub mtime: NfsTime3, pub ctime: NfsTime3 }
}

xdr_struct! {
    /// `wcc_data`: `pre_op_attr before; post_op_attr after`.
    pub struct WccData { pub before: Option<WccAttr>, pub after: PostOpAttr }
}

/// `set_atime` / `set_mtime` (`time_how` discriminated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetTime {
    DontChange,
    ServerTime,
    ClientTime(NfsTime3),
}

impl Xdr for SetTime {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            SetTime::DontChange => enc.u32(0),
            SetTime::ServerTime => enc.u32(1),
            SetTime::ClientTime(t) => {
                enc.u32(2);
                t.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let at = dec.offset();
        match dec.u32()? {
            0 => Ok(SetTime::DontChange),
            1 => Ok(SetTime::ServerTime),
            2 => Ok(SetTime::ClientTime(dec.field("set_time.time")?)),
            value => Err(XdrError::new(
                at,
                XdrErrorKind::BadDiscriminant {
                    ty: "time_how",
                    value,
                },
            )),
        }
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for SetTime {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            Just(SetTime::DontChange),
            Just(SetTime::ServerTime),
            any::<NfsTime3>().prop_map(SetTime::ClientTime)
        ]
        .boxed()
    }
}

xdr_struct! {
    /// `sattr3`: each attribute is set only when present.
    pub struct Sattr3 {
        pub mode: Option<u32>, pub uid: Option<u32>, pub gid: Option<u32>, pub size: Option<u64>,
        pub atime: SetTime, pub mtime: SetTime,
    }
}

xdr_struct! {
    /// `diropargs3`.
    pub struct DirOpArgs3 { pub dir: NfsFh3, pub name: Vec<u8> }
}

// ---- arguments ----

xdr_struct! {
    /// `SETATTR3args`; `guard` is `sattrguard3` (check the ctime when present).
    pub struct SetattrArgs { pub object: NfsFh3, pub new_attributes: Sattr3, pub guard: Option<NfsTime3> }
}
xdr_struct! {
    /// `ACCESS3args`.
    pub struct AccessArgs { pub object: NfsFh3, pub access: u32 }
}
xdr_struct! {
    /// `READ3args`.
    pub struct ReadArgs { pub file: NfsFh3, pub offset: u64, pub count: u32 }
}
xdr_struct! {
    /// `WRITE3args`.
    pub struct WriteArgs { pub file: NfsFh3, pub offset: u64, pub count: u32, pub stable: StableHow, pub data: Vec<u8> }
}

/// `createhow3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow3 {
    Unchecked(Sattr3),
    Guarded(Sattr3),
    Exclusive([u8; 8]),
}

impl Xdr for CreateHow3 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            CreateHow3::Unchecked(a) => {
                enc.u32(0);
                a.encode(enc);
            }
            CreateHow3::Guarded(a) => {
                enc.u32(1);
                a.encode(enc);
            }
            CreateHow3::Exclusive(v) => {
                enc.u32(2);
                v.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let at = dec.offset();
        match dec.u32()? {
            0 => Ok(CreateHow3::Unchecked(
                dec.field("createhow3.obj_attributes")?,
            )),
            1 => Ok(CreateHow3::Guarded(dec.field("createhow3.obj_attributes")?)),
            2 => Ok(CreateHow3::Exclusive(dec.field("createhow3.verf")?)),
            value => Err(XdrError::new(
                at,
                XdrErrorKind::BadDiscriminant {
                    ty: "createmode3",
                    value,
                },
            )),
        }
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for CreateHow3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            any::<Sattr3>().prop_map(CreateHow3::Unchecked),
            any::<Sattr3>().prop_map(CreateHow3::Guarded),
            any::<[u8; 8]>().prop_map(CreateHow3::Exclusive)
        ]
        .boxed()
    }
}

xdr_struct! {
    /// `CREATE3args`.
    pub struct CreateArgs { pub place: DirOpArgs3, pub how: CreateHow3 }
}
xdr_struct! {
    /// `MKDIR3args`.
    pub struct MkdirArgs { pub place: DirOpArgs3, pub attributes: Sattr3 }
}
xdr_struct! {
    /// `SYMLINK3args` (with `symlinkdata3` flattened).
    pub struct SymlinkArgs { pub place: DirOpArgs3, pub symlink_attributes: Sattr3, pub symlink_data: Vec<u8> }
}

/// `mknoddata3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MknodData3 {
    /// CHR or BLK: `devicedata3`.
    Device {
        ftype: Ftype3,
        attributes: Sattr3,
        spec: SpecData3,
    },
    /// SOCK or FIFO: `pipe_attributes`.
    Pipe { ftype: Ftype3, attributes: Sattr3 },
    /// REG, DIR or LNK: no data (the server answers BADTYPE).
    Other(Ftype3),
}

impl Xdr for MknodData3 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            MknodData3::Device {
                ftype,
                attributes,
                spec,
            } => {
                ftype.encode(enc);
                attributes.encode(enc);
                spec.encode(enc);
            }
            MknodData3::Pipe { ftype, attributes } => {
                ftype.encode(enc);
                attributes.encode(enc);
            }
            MknodData3::Other(ftype) => ftype.encode(enc),
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let ftype: Ftype3 = dec.field("mknoddata3.type")?;
        Ok(match ftype {
            Ftype3::Chr | Ftype3::Blk => MknodData3::Device {
                ftype,
                attributes: dec.field("devicedata3.dev_attributes")?,
                spec: dec.field("devicedata3.spec")?,
            },
            Ftype3::Sock | Ftype3::Fifo => MknodData3::Pipe {
                ftype,
                attributes: dec.field("mknoddata3.pipe_attributes")?,
            },
            Ftype3::Reg | Ftype3::Dir | Ftype3::Lnk => MknodData3::Other(ftype),
        })
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for MknodData3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            (
                prop::sample::select(vec![Ftype3::Chr, Ftype3::Blk]),
                any::<Sattr3>(),
                any::<SpecData3>()
            )
                .prop_map(|(ftype, attributes, spec)| MknodData3::Device {
                    ftype,
                    attributes,
                    spec
                }),
            (
                prop::sample::select(vec![Ftype3::Sock, Ftype3::Fifo]),
                any::<Sattr3>()
            )
                .prop_map(|(ftype, attributes)| MknodData3::Pipe { ftype, attributes }),
            prop::sample::select(vec![Ftype3::Reg, Ftype3::Dir, Ftype3::Lnk])
                .prop_map(MknodData3::Other)
        ]
        .boxed()
    }
}

xdr_struct! {
    /// `MKNOD3args`.
    pub struct MknodArgs { pub place: DirOpArgs3, pub what: MknodData3 }
}
xdr_struct! {
    /// `RENAME3args`.
    pub struct RenameArgs { pub from: DirOpArgs3, pub to: DirOpArgs3 }
}
xdr_struct! {
    /// `LINK3args`.
    pub struct LinkArgs { pub file: NfsFh3, pub link: DirOpArgs3 }
}
xdr_struct! {
    /// `READDIR3args`.
    pub struct ReaddirArgs { pub dir: NfsFh3, pub cookie: u64, pub cookieverf: [u8; 8], pub count: u32 }
}
xdr_struct! {
    /// `READDIRPLUS3args`.
    pub struct ReaddirplusArgs { pub dir: NfsFh3, pub cookie: u64, pub cookieverf: [u8; 8], pub dircount: u32, pub maxcount: u32 }
}
xdr_struct! {
    /// `COMMIT3args`.
    pub struct CommitArgs { pub file: NfsFh3, pub offset: u64, pub count: u32 }
}

// ---- results ----

/// The `nfsstat3`-discriminated result union every procedure but NULL returns:
/// `resok` on `NFS3_OK`, `resfail` on any other status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NfsRes<T, F> {
    Ok(T),
    /// The status is never `NfsStat3::Ok` when built by decoding.
    Fail(NfsStat3, F),
}

impl<T, F> NfsRes<T, F> {
    pub fn status(&self) -> NfsStat3 {
        match self {
            NfsRes::Ok(_) => NfsStat3::Ok,
            NfsRes::Fail(s, _) => *s,
        }
    }
}

impl<T: Xdr, F: Xdr> Xdr for NfsRes<T, F> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            NfsRes::Ok(ok) => {
                NfsStat3::Ok.encode(enc);
                ok.encode(enc);
            }
            NfsRes::Fail(status, fail) => {
                status.encode(enc);
                fail.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        match dec.field::<NfsStat3>("status")? {
            NfsStat3::Ok => Ok(NfsRes::Ok(dec.field("resok")?)),
            status => Ok(NfsRes::Fail(status, dec.field("resfail")?)),
        }
    }
}

#[cfg(test)]
impl<T, F> proptest::arbitrary::Arbitrary for NfsRes<T, F>
where
    T: proptest::arbitrary::Arbitrary + 'static,
    F: proptest::arbitrary::Arbitrary + 'static,
{
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        let failing: Vec<NfsStat3> = NfsStat3::ALL
            .iter()
            .copied()
            .filter(|s| *s != NfsStat3::Ok)
            .collect();
        prop_oneof![
            any::<T>().prop_map(NfsRes::Ok),
            (prop::sample::select(failing), any::<F>()).prop_map(|(s, f)| NfsRes::Fail(s, f))
        ]
        .boxed()
    }
}

xdr_struct! {
    /// `LOOKUP3resok`.
    pub struct LookupOk { pub object: NfsFh3, pub obj_attributes: PostOpAttr, pub dir_attributes: PostOpAttr }
}
xdr_struct! {
    /// `ACCESS3resok`.
    pub struct AccessOk { pub obj_attributes: PostOpAttr, pub access: u32 }
}
xdr_struct! {
    /// `READLINK3resok`.
    pub struct ReadlinkOk { pub symlink_attributes: PostOpAttr, pub data: Vec<u8> }
}
xdr_struct! {
    /// `READ3resok`.
    pub struct ReadOk { pub file_attributes: PostOpAttr, pub count: u32, pub eof: bool, pub data: Vec<u8> }
}
xdr_struct! {
    /// `WRITE3resok`.
    pub struct WriteOk { pub file_wcc: WccData, pub count: u32, pub committed: StableHow, pub verf: [u8; 8] }
}
xdr_struct! {
    /// `CREATE3resok`, also MKDIR, SYMLINK and MKNOD.
    pub struct CreateOk { pub obj: PostOpFh3, pub obj_attributes: PostOpAttr, pub dir_wcc: WccData }
}
xdr_struct! {
    /// `RENAME3resok` and `RENAME3resfail`.
    pub struct RenameWcc { pub fromdir_wcc: WccData, pub todir_wcc: WccData }
}
xdr_struct! {
    /// `LINK3resok` and `LINK3resfail`.
    pub struct LinkWcc { pub file_attributes: PostOpAttr, pub linkdir_wcc: WccData }
}
xdr_struct! {
    /// `entry3`.
    pub struct Entry3 { pub fileid: u64, pub name: Vec<u8>, pub cookie: u64 }
}
xdr_struct! {
    /// `entryplus3`.
    pub struct EntryPlus3 { pub fileid: u64, pub name: Vec<u8>, pub cookie: u64, pub name_attributes: PostOpAttr, pub name_handle: PostOpFh3 }
}

/// A directory listing: the `entry3 *` chain plus `eof` (`dirlist3` / `dirlistplus3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirList<E> {
    pub entries: Vec<E>,
    pub eof: bool,
}

impl<E: Xdr> Xdr for DirList<E> {
    fn encode(&self, enc: &mut Encoder) {
        enc.list(&self.entries);
        enc.bool(self.eof);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        let entries = dec.list().map_err(|e| e.within("dirlist.entries"))?;
        Ok(Self {
            entries,
            eof: dec.field("dirlist.eof")?,
        })
    }
}

#[cfg(test)]
impl<E: proptest::arbitrary::Arbitrary + 'static> proptest::arbitrary::Arbitrary for DirList<E> {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        (prop::collection::vec(any::<E>(), 0..6), any::<bool>())
            .prop_map(|(entries, eof)| DirList { entries, eof })
            .boxed()
    }
}

xdr_struct! {
    /// `READDIR3resok`.
    pub struct ReaddirOk { pub dir_attributes: PostOpAttr, pub cookieverf: [u8; 8], pub reply: DirList<Entry3> }
}
xdr_struct! {
    /// `READDIRPLUS3resok`.
    pub struct ReaddirplusOk { pub dir_attributes: PostOpAttr, pub cookieverf: [u8; 8], pub reply: DirList<EntryPlus3> }
}
xdr_struct! {
    /// `FSSTAT3resok`.
    pub struct FsstatOk {
        pub obj_attributes: PostOpAttr, pub tbytes: u64, pub fbytes: u64, pub abytes: u64,
        pub tfiles: u64, pub ffiles: u64, pub afiles: u64, pub invarsec: u32,
    }
}
xdr_struct! {
    /// `FSINFO3resok`.
    pub struct FsinfoOk {
        pub obj_attributes: PostOpAttr, pub rtmax: u32, pub rtpref: u32, pub rtmult: u32,
        pub wtmax: u32, pub wtpref: u32, pub wtmult: u32, pub dtpref: u32,
        pub maxfilesize: u64, pub time_delta: NfsTime3, pub properties: u32,
    }
}
xdr_struct! {
    /// `PATHCONF3resok`.
    pub struct PathconfOk {
        pub obj_attributes: PostOpAttr, pub linkmax: u32, pub name_max: u32, pub no_trunc: bool,
        pub chown_restricted: bool, pub case_insensitive: bool, pub case_preserving: bool,
    }
}
xdr_struct! {
    /// `COMMIT3resok`.
    pub struct CommitOk { pub file_wcc: WccData, pub verf: [u8; 8] }
}

rpc_procedures! {
    /// NFSv3 procedure numbers.
    Nfs3Proc, Nfs3Call, Nfs3Reply, "NFSv3" {
        Null = 0: () => (),
        Getattr = 1: NfsFh3 => NfsRes<Fattr3, ()>,
        Setattr = 2: SetattrArgs => NfsRes<WccData, WccData>,
        Lookup = 3: DirOpArgs3 => NfsRes<LookupOk, PostOpAttr>,
        Access = 4: AccessArgs => NfsRes<AccessOk, PostOpAttr>,
        Readlink = 5: NfsFh3 => NfsRes<ReadlinkOk, PostOpAttr>,
        Read = 6: ReadArgs => NfsRes<ReadOk, PostOpAttr>,
        Write = 7: WriteArgs => NfsRes<WriteOk, WccData>,
        Create = 8: CreateArgs => NfsRes<CreateOk, WccData>,
        Mkdir = 9: MkdirArgs => NfsRes<CreateOk, WccData>,
        Symlink = 10: SymlinkArgs => NfsRes<CreateOk, WccData>,
        Mknod = 11: MknodArgs => NfsRes<CreateOk, WccData>,
        Remove = 12: DirOpArgs3 => NfsRes<WccData, WccData>,
        Rmdir = 13: DirOpArgs3 => NfsRes<WccData, WccData>,
        Rename = 14: RenameArgs => NfsRes<RenameWcc, RenameWcc>,
        Link = 15: LinkArgs => NfsRes<LinkWcc, LinkWcc>,
        Readdir = 16: ReaddirArgs => NfsRes<ReaddirOk, PostOpAttr>,
        Readdirplus = 17: ReaddirplusArgs => NfsRes<ReaddirplusOk, PostOpAttr>,
        Fsstat = 18: NfsFh3 => NfsRes<FsstatOk, PostOpAttr>,
        Fsinfo = 19: NfsFh3 => NfsRes<FsinfoOk, PostOpAttr>,
        Pathconf = 20: NfsFh3 => NfsRes<PathconfOk, PostOpAttr>,
        Commit = 21: CommitArgs => NfsRes<CommitOk, WccData>,
    }
}

impl Nfs3Reply {
    /// The reply's NFS status (`NFS3_OK` for NULL, which carries none).
    pub fn status(&self) -> NfsStat3 {
        use Nfs3Reply as R;
        match self {
            R::Null(()) => NfsStat3::Ok,
            R::Getattr(x) => x.status(),
            R::Setattr(x) | R::Remove(x) | R::Rmdir(x) => x.status(),
            R::Lookup(x) => x.status(),
            R::Access(x) => x.status(),
            R::Readlink(x) => x.status(),
            R::Read(x) => x.status(),
            R::Write(x) => x.status(),
            R::Create(x) | R::Mkdir(x) | R::Symlink(x) | R::Mknod(x) => x.status(),
            R::Rename(x) => x.status(),
            R::Link(x) => x.status(),
            R::Readdir(x) => x.status(),
            R::Readdirplus(x) => x.status(),
            R::Fsstat(x) => x.status(),
            R::Fsinfo(x) => x.status(),
            R::Pathconf(x) => x.status(),
            R::Commit(x) => x.status(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_handle_is_an_error_naming_the_field() {
        let mut e = Encoder::new();
        e.u32(65);
        e.fixed(&[0u8; 65]);
        let err = Nfs3Call::decode(Nfs3Proc::Getattr, &mut Decoder::new(&e.buf)).unwrap_err();
        assert!(matches!(
            err.kind,
            XdrErrorKind::TooLong { len: 65, max: 64 }
        ));
        assert_eq!(err.offset, 0);
        assert_eq!(err.path(), "NFSv3 Getattr args.nfs_fh3");
    }

    #[test]
    fn huge_handle_claim_allocates_nothing() {
        let bytes = [0xFF, 0xFF, 0xFF, 0xFF];
        let err = NfsFh3::from_xdr(&bytes).unwrap_err();
        assert!(matches!(err.kind, XdrErrorKind::TooLong { .. }));
        assert!(NfsFh3::new(vec![0; 65]).is_err());
    }

    #[test]
    fn truncated_read_args_name_the_offset_and_field() {
        let args = ReadArgs {
            file: NfsFh3(vec![1; 8]),
            offset: 4096,
            count: 512,
        };
        let bytes = args.to_xdr();
        let err = ReadArgs::from_xdr(&bytes[..bytes.len() - 2]).unwrap_err();
        assert_eq!(err.offset, 4 + 8 + 8);
        assert_eq!(err.path(), "ReadArgs.count");
        assert!(matches!(
            err.kind,
            XdrErrorKind::Truncated {
                needed: 4,
                remaining: 2
            }
        ));
    }
}
