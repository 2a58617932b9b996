//! The file-handle security template (§4.4) as a chain policy. Every handle the
//! server returns (MNT, LOOKUP, CREATE/MKDIR/SYMLINK/MKNOD, READDIRPLUS entries) is
//! replaced by a virtual handle `real || MAC`, the MAC being HMAC-SHA256 over the
//! real handle under a secret key, truncated to 16 bytes (128 bits). Every handle in
//! a call is checked and mapped back to the real one; a handle FileWall never issued
//! (wrong length or MAC) is answered NFS3ERR_BADHANDLE by the policy itself and
//! never reaches the server. No state: handles stay valid across a FileWall restart
//! as long as the key (read from a file) is the same.
//!
//! Why a MAC and not a persistent map: no store to keep consistent and no map to
//! grow without bound; the cost is that real handles may be at most
//! 64 - 16 = 48 bytes (NFS3_FHSIZE). A longer server handle cannot be protected and
//! its reply is replaced by NFS3ERR_SERVERFAULT (counted). The real handle is
//! visible to the client, but presenting it alone fails the MAC check.
//!
//! HMAC is computed here over the workspace's `sha2` (RFC 2104): the `hmac` crate
//! is not in the offline registry cache of this machine.

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::chain::{Action, Policy};
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::message::{CallArgs, Msg, Reply, ReplyResults};
use crate::mount::{MountReply, MountRes3, MountStat3};
use crate::nfs3::{
    LinkWcc, NFS3_FHSIZE, Nfs3Call, Nfs3Proc, Nfs3Reply, NfsFh3, NfsRes, NfsStat3, RenameWcc,
    WccData,
};
use crate::rpc::{AcceptStat, Auth, ReplyBody, ReplyHeader};

/// Bytes of MAC appended to each real handle.
pub const MAC_LEN: usize = 16;
/// The longest real handle that can be protected.
pub const MAX_REAL_HANDLE: usize = NFS3_FHSIZE - MAC_LEN;
/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 16;

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

/// The key's HMAC state after its padded blocks: each MAC then costs two SHA-256
/// compressions instead of four.
#[derive(Clone)]
struct Keyed {
    inner: Sha256,
    outer: Sha256,
}

impl Keyed {
    fn new(key: &[u8]) -> Self {
        let mut k = [0u8; 64];
        if key.len() > 64 {
            k[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let mut inner = Sha256::new();
        inner.update(k.map(|b| b ^ 0x36));
        let mut outer = Sha256::new();
        outer.update(k.map(|b| b ^ 0x5c));
        Self { inner, outer }
    }

    fn mac(&self, msg: &[u8]) -> [u8; 32] {
        let mut inner = self.inner.clone();
        inner.update(msg);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }
}

/// The secret that seals and opens virtual handles.
#[derive(Clone)]
pub struct HandleKey(Arc<Vec<u8>>, Arc<Keyed>);

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandleKey({} bytes)", self.0.len())
    }
}

/// Why a handle key was refused.
#[derive(Debug, thiserror::Error)]
pub enum BadKey {
    #[error("a handle key needs at least {MIN_KEY_LEN} bytes, {0} given")]
    Short(usize),
    #[error("reading: {0}")]
    Read(#[from] std::io::Error),
}

impl HandleKey {
    pub fn new(key: Vec<u8>) -> Result<Self, BadKey> {
        if key.len() < MIN_KEY_LEN {
            return Err(BadKey::Short(key.len()));
        }
        let keyed = Arc::new(Keyed::new(&key));
        Ok(Self(Arc::new(key), keyed))
    }

    /// Reads a key file (its bytes, as they are); the caller names the file.
    pub fn load(path: &std::path::Path) -> Result<Self, BadKey> {
        Self::new(std::fs::read(path)?)
    }

    fn mac(&self, real: &[u8]) -> [u8; MAC_LEN] {
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&self.1.mac(real)[..MAC_LEN]);
        m
    }

    /// The virtual handle of `real`, or None if it is too long to carry a MAC.
    pub fn seal(&self, real: &[u8]) -> Option<Vec<u8>> {
        if real.len() > MAX_REAL_HANDLE {
            return None;
        }
        let mut v = real.to_vec();
        v.extend_from_slice(&self.mac(real));
        Some(v)
    }

    /// The real handle behind a virtual one, or None if FileWall did not issue it.
    pub fn open(&self, virt: &[u8]) -> Option<Vec<u8>> {
        let split = virt.len().checked_sub(MAC_LEN)?;
        let (real, mac) = virt.split_at(split);
        let want = self.mac(real);
        // Constant time comparison.
        let diff = want.iter().zip(mac).fold(0u8, |d, (a, b)| d | (a ^ b));
        (diff == 0).then(|| real.to_vec())
    }
}

/// Applies `f` to every handle in NFSv3 call arguments; false if `f` refused one.
pub(crate) fn call_handles(args: &mut Nfs3Call, f: &mut dyn FnMut(&mut NfsFh3) -> bool) -> bool {
    use Nfs3Call as C;
    match args {
        C::Null(()) => true,
        C::Getattr(h) | C::Readlink(h) | C::Fsstat(h) | C::Fsinfo(h) | C::Pathconf(h) => f(h),
        C::Setattr(a) => f(&mut a.object),
        C::Access(a) => f(&mut a.object),
        C::Lookup(a) | C::Remove(a) | C::Rmdir(a) => f(&mut a.dir),
        C::Read(a) => f(&mut a.file),
        C::Write(a) => f(&mut a.file),
        C::Commit(a) => f(&mut a.file),
        C::Create(a) => f(&mut a.place.dir),
        C::Mkdir(a) => f(&mut a.place.dir),
        C::Symlink(a) => f(&mut a.place.dir),
        C::Mknod(a) => f(&mut a.place.dir),
        C::Rename(a) => f(&mut a.from.dir) && f(&mut a.to.dir),
        C::Link(a) => f(&mut a.file) && f(&mut a.link.dir),
        C::Readdir(a) => f(&mut a.dir),
        C::Readdirplus(a) => f(&mut a.dir),
    }
}

/// Applies `f` to every handle in results; false if `f` refused one.
pub(crate) fn reply_handles(
    res: &mut ReplyResults,
    f: &mut dyn FnMut(&mut NfsFh3) -> bool,
) -> bool {
    use Nfs3Reply as R;
    match res {
        ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })) => f(fhandle),
        ReplyResults::Nfs3(R::Lookup(NfsRes::Ok(ok))) => f(&mut ok.object),
        ReplyResults::Nfs3(
            R::Create(NfsRes::Ok(ok))
            | R::Mkdir(NfsRes::Ok(ok))
            | R::Symlink(NfsRes::Ok(ok))
            | R::Mknod(NfsRes::Ok(ok)),
        ) => ok.obj.as_mut().is_none_or(&mut *f),
        ReplyResults::Nfs3(R::Readdirplus(NfsRes::Ok(ok))) => ok
            .reply
            .entries
            .iter_mut()
            .all(|e| e.name_handle.as_mut().is_none_or(&mut *f)),
        _ => true,
    }
}

fn wcc() -> WccData {
    WccData {
        before: None,
        after: None,
    }
}

/// The failure results of `procedure` with status `stat`.
pub fn nfs_failure(procedure: Nfs3Proc, stat: NfsStat3) -> Nfs3Reply {
    use Nfs3Proc as P;
    use Nfs3Reply as R;
    match procedure {
        P::Null => R::Null(()),
        P::Getattr => R::Getattr(NfsRes::Fail(stat, ())),
        P::Setattr => R::Setattr(NfsRes::Fail(stat, wcc())),
        P::Lookup => R::Lookup(NfsRes::Fail(stat, None)),
        P::Access => R::Access(NfsRes::Fail(stat, None)),
        P::Readlink => R::Readlink(NfsRes::Fail(stat, None)),
        P::Read => R::Read(NfsRes::Fail(stat, None)),
        P::Write => R::Write(NfsRes::Fail(stat, wcc())),
        P::Create => R::Create(NfsRes::Fail(stat, wcc())),
        P::Mkdir => R::Mkdir(NfsRes::Fail(stat, wcc())),
        P::Symlink => R::Symlink(NfsRes::Fail(stat, wcc())),
        P::Mknod => R::Mknod(NfsRes::Fail(stat, wcc())),
        P::Remove => R::Remove(NfsRes::Fail(stat, wcc())),
        P::Rmdir => R::Rmdir(NfsRes::Fail(stat, wcc())),
        P::Rename => R::Rename(NfsRes::Fail(
            stat,
            RenameWcc {
                fromdir_wcc: wcc(),
                todir_wcc: wcc(),
            },
        )),
        P::Link => R::Link(NfsRes::Fail(
            stat,
            LinkWcc {
                file_attributes: None,
                linkdir_wcc: wcc(),
            },
        )),
        P::Readdir => R::Readdir(NfsRes::Fail(stat, None)),
        P::Readdirplus => R::Readdirplus(NfsRes::Fail(stat, None)),
        P::Fsstat => R::Fsstat(NfsRes::Fail(stat, None)),
        P::Fsinfo => R::Fsinfo(NfsRes::Fail(stat, None)),
        P::Pathconf => R::Pathconf(NfsRes::Fail(stat, None)),
        P::Commit => R::Commit(NfsRes::Fail(stat, wcc())),
    }
}

/// A successful RPC reply carrying `results` (the XID is set when it leaves).
pub fn accepted(results: ReplyResults) -> Reply {
    Reply {
        header: ReplyHeader {
            xid: 0,
            body: ReplyBody::Accepted {
                verf: Auth::None,
                stat: AcceptStat::Success,
            },
        },
        results: Some(results),
    }
}

/// The handle policy.
pub struct HandlePolicy {
    key: HandleKey,
    counters: Arc<Mutex<PolicyCounters>>,
}

impl HandlePolicy {
    pub fn new(key: HandleKey, counters: Arc<Mutex<PolicyCounters>>) -> Self {
        Self { key, counters }
    }
}

impl Policy<Msg> for HandlePolicy {
    fn name(&self) -> &str {
        "handles"
    }

    fn on_request(&mut self, _xid: u32, mut request: Msg, out: &mut Vec<Action<Msg>>) {
        if let Msg::Call { call, .. } = &mut request
            && let CallArgs::Nfs3(args) = &mut call.args
        {
            let key = &self.key;
            let ok = call_handles(args, &mut |h| match key.open(&h.0) {
                Some(real) => {
                    h.0 = real;
                    true
                }
                None => false,
            });
            if !ok {
                lock_counters(&self.counters).bad_handles += 1;
                let fail = nfs_failure(args.procedure(), NfsStat3::BadHandle);
                out.push(Action::Respond(Msg::Reply(accepted(ReplyResults::Nfs3(
                    fail,
                )))));
                return;
            }
        }
        out.push(Action::Forward(request));
    }

    fn on_response(
        &mut self,
        _xid: u32,
        _request: &Msg,
        mut response: Msg,
        out: &mut Vec<Action<Msg>>,
    ) {
        if let Msg::RawReply(_) = response {
            // Undecodable results might carry real handles: consume the reply.
            return;
        }
        if let Msg::Reply(reply) = &mut response
            && let Some(results) = &mut reply.results
        {
            let key = &self.key;
            let ok = reply_handles(results, &mut |h| match key.seal(&h.0) {
                Some(v) => {
                    h.0 = v;
                    true
                }
                None => false,
            });
            if !ok {
                lock_counters(&self.counters).oversize_handles += 1;
                *results = match results {
                    ReplyResults::Nfs3(r) => {
                        ReplyResults::Nfs3(nfs_failure(r.procedure(), NfsStat3::ServerFault))
                    }
                    _ => ReplyResults::Mount3(MountReply::Mnt(MountRes3::Fail(
                        MountStat3::ServerFault,
                    ))),
                };
            }
        }
        out.push(Action::Forward(response));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Case 6: a key longer than the block.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn the_precomputed_key_state_gives_the_same_mac() {
        for key in [vec![7u8; 32], vec![0xaa; 131]] {
            let k = Keyed::new(&key);
            for msg in [&b""[..], b"a handle", &[9u8; 100]] {
                assert_eq!(k.mac(msg), hmac_sha256(&key, msg));
            }
        }
    }

    #[test]
    fn seal_open_and_forgeries() {
        let k = HandleKey::new(vec![7; 32]).unwrap();
        let real = vec![1, 2, 3, 4, 5, 6, 7, 8];
        let v = k.seal(&real).unwrap();
        assert_eq!(v.len(), real.len() + MAC_LEN);
        assert_eq!(k.open(&v), Some(real.clone()));
        assert_eq!(k.open(&real), None, "the real handle alone is refused");
        for i in 0..v.len() {
            let mut f = v.clone();
            f[i] ^= 1;
            assert_eq!(k.open(&f), None, "flipped byte {i}");
        }
        assert_eq!(k.open(&[]), None);
        let other = HandleKey::new(vec![8; 32]).unwrap();
        assert_eq!(other.open(&v), None);
        assert!(k.seal(&[0; MAX_REAL_HANDLE]).is_some());
        assert!(k.seal(&[0; MAX_REAL_HANDLE + 1]).is_none());
        assert!(HandleKey::new(vec![0; 15]).is_err());
    }

    #[test]
    fn every_failure_encodes_with_its_status() {
        for n in 1..=21 {
            let p = Nfs3Proc::from_u32(n).unwrap();
            let r = nfs_failure(p, NfsStat3::BadHandle);
            assert_eq!(r.procedure(), p);
            let mut enc = crate::xdr::Encoder::new();
            r.encode(&mut enc);
            assert_eq!(enc.into_bytes()[..4], 10001u32.to_be_bytes());
        }
    }
}
