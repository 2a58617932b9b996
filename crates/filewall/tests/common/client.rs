//! A minimal NFSv3/MOUNT client for FileWall's tests, built on the crate's own
//! codec: one TCP connection, one call at a time, AUTH_SYS as a chosen uid,
//! each reply decoded and matched to its call's XID.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use sidecore_filewall::message::{Call, CallArgs, ReplyResults, decode_reply};
use sidecore_filewall::mount::{DirPath, MountCall, MountReply, MountRes3};
use sidecore_filewall::nfs3::{
    CreateArgs, CreateHow3, DirOpArgs3, Nfs3Call, Nfs3Reply, NfsFh3, NfsRes, NfsStat3, ReadArgs,
    ReaddirplusArgs, Sattr3, SetTime, StableHow, WriteArgs,
};
use sidecore_filewall::record::encode_record;
use sidecore_filewall::rpc::{Auth, AuthSys};

use super::ganesha::read_record;

/// One connection to a server or a proxy.
pub struct Client {
    stream: TcpStream,
    xid: u32,
}

impl Client {
    /// Connects to `addr`; replies must come within 10 s.
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connecting");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("setting a read timeout");
        Client {
            stream,
            xid: 0x5000,
        }
    }

    /// One call as root (AUTH_SYS 0/0).
    pub fn call(&mut self, args: CallArgs) -> ReplyResults {
        self.call_as(0, args)
    }

    /// One call as `uid` (AUTH_SYS uid/uid), returning its decoded results;
    /// panics unless the reply decodes, answers this call and was accepted.
    pub fn call_as(&mut self, uid: u32, args: CallArgs) -> ReplyResults {
        self.xid += 1;
        let procedure = args.procedure();
        let call = Call {
            xid: self.xid,
            cred: Auth::Sys(AuthSys {
                stamp: 1,
                machine_name: b"filewall-e2e".to_vec(),
                uid,
                gid: uid,
                gids: vec![uid],
            }),
            verf: Auth::None,
            args,
        };
        self.stream
            .write_all(&encode_record(&call.to_bytes(), 1 << 20))
            .expect("sending a call");
        let bytes = read_record(&mut self.stream).expect("reading a reply");
        let reply = decode_reply(&bytes, procedure)
            .unwrap_or_else(|e| panic!("reply to {procedure:?} did not decode: {e}"));
        assert_eq!(reply.header.xid, self.xid, "{reply:?}");
        reply
            .results
            .unwrap_or_else(|| panic!("{procedure:?} was not accepted: {:?}", reply.header))
    }

    /// MNT of `export`: its root handle.
    pub fn mnt(&mut self, export: &std::path::Path) -> NfsFh3 {
        let path = DirPath(export.display().to_string().into_bytes());
        match self.call(CallArgs::Mount3(MountCall::Mnt(path))) {
            ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })) => fhandle,
            other => panic!("MNT: {other:?}"),
        }
    }

    /// LOOKUP of `name` in `dir`, as root.
    pub fn lookup(&mut self, dir: &NfsFh3, name: &str) -> NfsFh3 {
        let args = DirOpArgs3 {
            dir: dir.clone(),
            name: name.as_bytes().to_vec(),
        };
        match self.call(CallArgs::Nfs3(Nfs3Call::Lookup(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Ok(ok))) => ok.object,
            other => panic!("LOOKUP {name}: {other:?}"),
        }
    }

    /// CREATE (UNCHECKED, mode 0644) of `name` in `dir` as `uid`: the status and
    /// the new handle.
    pub fn create_file(
        &mut self,
        uid: u32,
        dir: &NfsFh3,
        name: &str,
    ) -> (NfsStat3, Option<NfsFh3>) {
        let args = CreateArgs {
            place: DirOpArgs3 {
                dir: dir.clone(),
                name: name.as_bytes().to_vec(),
            },
            how: CreateHow3::Unchecked(Sattr3 {
                mode: Some(0o644),
                uid: None,
                gid: None,
                size: None,
                atime: SetTime::DontChange,
                mtime: SetTime::DontChange,
            }),
        };
        match self.call_as(uid, CallArgs::Nfs3(Nfs3Call::Create(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Create(NfsRes::Ok(ok))) => (NfsStat3::Ok, ok.obj),
            ReplyResults::Nfs3(Nfs3Reply::Create(r)) => (r.status(), None),
            other => panic!("CREATE {name}: {other:?}"),
        }
    }

    /// WRITE (FILE_SYNC) of `data` at `offset` as `uid`; the status.
    pub fn write_at(&mut self, uid: u32, file: &NfsFh3, offset: u64, data: &[u8]) -> NfsStat3 {
        let args = WriteArgs {
            file: file.clone(),
            offset,
            count: data.len() as u32,
            stable: StableHow::FileSync,
            data: data.to_vec(),
        };
        match self.call_as(uid, CallArgs::Nfs3(Nfs3Call::Write(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Write(r)) => r.status(),
            other => panic!("WRITE: {other:?}"),
        }
    }

    /// READ of up to 64 KiB from the start as `uid`: the status and the data.
    pub fn read_all(&mut self, uid: u32, file: &NfsFh3) -> (NfsStat3, Vec<u8>) {
        let args = ReadArgs {
            file: file.clone(),
            offset: 0,
            count: 65_536,
        };
        match self.call_as(uid, CallArgs::Nfs3(Nfs3Call::Read(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Read(NfsRes::Ok(ok))) => (NfsStat3::Ok, ok.data),
            ReplyResults::Nfs3(Nfs3Reply::Read(r)) => (r.status(), Vec::new()),
            other => panic!("READ: {other:?}"),
        }
    }

    /// LOOKUP as `uid`: the status and the handle.
    pub fn lookup_as(&mut self, uid: u32, dir: &NfsFh3, name: &str) -> (NfsStat3, Option<NfsFh3>) {
        let args = DirOpArgs3 {
            dir: dir.clone(),
            name: name.as_bytes().to_vec(),
        };
        match self.call_as(uid, CallArgs::Nfs3(Nfs3Call::Lookup(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Ok(ok))) => {
                (NfsStat3::Ok, Some(ok.object))
            }
            ReplyResults::Nfs3(Nfs3Reply::Lookup(r)) => (r.status(), None),
            other => panic!("LOOKUP {name}: {other:?}"),
        }
    }

    /// READDIRPLUS of a whole (small) directory as `uid`: the status and each
    /// entry's name and handle.
    pub fn list(&mut self, uid: u32, dir: &NfsFh3) -> (NfsStat3, Vec<(String, Option<NfsFh3>)>) {
        let (mut cookie, mut verf, mut out) = (0, [0u8; 8], Vec::new());
        loop {
            let args = ReaddirplusArgs {
                dir: dir.clone(),
                cookie,
                cookieverf: verf,
                dircount: 4096,
                maxcount: 32_768,
            };
            match self.call_as(uid, CallArgs::Nfs3(Nfs3Call::Readdirplus(args))) {
                ReplyResults::Nfs3(Nfs3Reply::Readdirplus(NfsRes::Ok(ok))) => {
                    for e in &ok.reply.entries {
                        out.push((
                            String::from_utf8_lossy(&e.name).into_owned(),
                            e.name_handle.clone(),
                        ));
                        cookie = e.cookie;
                    }
                    verf = ok.cookieverf;
                    if ok.reply.eof || ok.reply.entries.is_empty() {
                        return (NfsStat3::Ok, out);
                    }
                }
                ReplyResults::Nfs3(Nfs3Reply::Readdirplus(r)) => return (r.status(), out),
                other => panic!("READDIRPLUS: {other:?}"),
            }
        }
    }

    /// Follows `path` (`a/b/c`) from `dir` as `uid`.
    pub fn walk(&mut self, uid: u32, dir: &NfsFh3, path: &str) -> NfsFh3 {
        let mut at = dir.clone();
        for name in path.split('/').filter(|n| !n.is_empty()) {
            match self.lookup_as(uid, &at, name) {
                (NfsStat3::Ok, Some(h)) => at = h,
                (st, _) => panic!("LOOKUP {name} in {path} as {uid}: {st:?}"),
            }
        }
        at
    }
}
