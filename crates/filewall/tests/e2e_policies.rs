//! End to end with policies: libnfs's nfs-cat and a small codec client → FileWall
//! running the chain `handles, stats` (from a TOML file) → nfs-ganesha. Proves that
//! reads work with virtual handles, that a forged handle (the server's real handle,
//! or a virtual one with a flipped MAC byte) is answered NFS3ERR_BADHANDLE and never
//! reaches the server (the server's file is unchanged, and the statistics policy,
//! which sits after the handle policy, never sees the call), that a handle issued
//! before a FileWall restart with the same key still works, and that the
//! statistics policy counts per flow and operation.
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::client::Client;
use common::ganesha::{Ganesha, libnfs, nfs_url};
use sidecore_filewall::handles::{HandleKey, MAC_LEN};
use sidecore_filewall::message::{CallArgs, ReplyResults};
use sidecore_filewall::nfs3::{
    DirOpArgs3, Nfs3Call, Nfs3Reply, NfsFh3, NfsRes, NfsStat3, ReadArgs, Sattr3, SetTime,
    SetattrArgs, StableHow, WriteArgs,
};
use sidecore_filewall::policy::load_chain;
use sidecore_filewall::proxy::{Proxy, ProxyConfig};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const CONTENT: &[u8] = b"FileWall guards this file.\n";

/// One proxy per program, both with the policy file's chain and the key.
fn proxies(g: &Ganesha, policy: &std::path::Path, key: &HandleKey) -> (Proxy, Proxy) {
    let chain = load_chain(policy).expect("loading the policy file");
    let start = |server| {
        let mut c = ProxyConfig::new(LOCAL, server);
        c.chain = chain.clone();
        c.key = Some(key.clone());
        Proxy::start(c).expect("starting a proxy")
    };
    (start(g.nfs_addr()), start(g.mount_addr()))
}

/// Calls the handle-policy test makes beyond the shared client's.
impl Client {
    /// READ's status, and the data on success.
    fn read(&mut self, file: &NfsFh3) -> (NfsStat3, Vec<u8>) {
        let args = ReadArgs {
            file: file.clone(),
            offset: 0,
            count: 4096,
        };
        match self.call(CallArgs::Nfs3(Nfs3Call::Read(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Read(NfsRes::Ok(ok))) => (NfsStat3::Ok, ok.data),
            ReplyResults::Nfs3(Nfs3Reply::Read(r)) => (r.status(), Vec::new()),
            other => panic!("READ: {other:?}"),
        }
    }

    /// Truncates `file` to 0 bytes; returns the status.
    fn truncate(&mut self, file: &NfsFh3) -> NfsStat3 {
        let args = SetattrArgs {
            object: file.clone(),
            new_attributes: Sattr3 {
                mode: None,
                uid: None,
                gid: None,
                size: Some(0),
                atime: SetTime::DontChange,
                mtime: SetTime::DontChange,
            },
            guard: None,
        };
        match self.call(CallArgs::Nfs3(Nfs3Call::Setattr(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Setattr(r)) => r.status(),
            other => panic!("SETATTR: {other:?}"),
        }
    }

    /// Overwrites the start of `file`; returns the status.
    fn write(&mut self, file: &NfsFh3, data: &[u8]) -> NfsStat3 {
        let args = WriteArgs {
            file: file.clone(),
            offset: 0,
            count: data.len() as u32,
            stable: StableHow::FileSync,
            data: data.to_vec(),
        };
        match self.call(CallArgs::Nfs3(Nfs3Call::Write(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Write(r)) => r.status(),
            other => panic!("WRITE: {other:?}"),
        }
    }

    fn lookup_status(&mut self, dir: &NfsFh3) -> NfsStat3 {
        let args = DirOpArgs3 {
            dir: dir.clone(),
            name: b"guarded.txt".to_vec(),
        };
        match self.call(CallArgs::Nfs3(Nfs3Call::Lookup(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Lookup(r)) => r.status(),
            other => panic!("LOOKUP: {other:?}"),
        }
    }
}

#[test]
fn virtual_handles_refuse_forgeries_and_survive_a_restart() {
    let Some(g) = Ganesha::start() else { return };
    let served = g.export.join("guarded.txt");
    std::fs::write(&served, CONTENT).expect("writing guarded.txt");
    let conf = tempfile::tempdir().expect("creating a temporary directory");
    let policy = conf.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[[policy]]\nkind = \"handles\"\n\n[[policy]]\nkind = \"stats\"\n",
    )
    .expect("writing the policy file");
    let key_file = conf.path().join("key");
    std::fs::write(&key_file, b"0123456789abcdef-filewall-e2e-key").expect("writing the key");
    let key = HandleKey::load(&key_file).expect("loading the key");

    let (nfs, mnt) = proxies(&g, &policy, &key);
    let url = nfs_url(
        &g.export,
        "guarded.txt",
        nfs.local_addr().port(),
        mnt.local_addr().port(),
    );
    let out = libnfs("nfs-cat", &[&url]);
    assert!(
        out.status.success() && out.stdout == CONTENT,
        "nfs-cat through the handle policy: {out:?}\n{:#?}\n{}",
        nfs.stats(),
        g.log_tail()
    );

    // The real root handle, straight from ganesha, and the virtual one via FileWall.
    let real_root = Client::connect(g.mount_addr()).mnt(&g.export);
    let virt_root = Client::connect(mnt.local_addr()).mnt(&g.export);
    eprintln!(
        "ganesha's root handle: {} bytes; virtual: {} bytes",
        real_root.0.len(),
        virt_root.0.len()
    );
    assert_eq!(virt_root.0.len(), real_root.0.len() + MAC_LEN);
    assert_eq!(virt_root.0[..real_root.0.len()], real_root.0[..]);

    let mut c = Client::connect(nfs.local_addr());
    let file = c.lookup(&virt_root, "guarded.txt");
    assert_eq!(c.read(&file), (NfsStat3::Ok, CONTENT.to_vec()));
    let real_file = Client::connect(g.nfs_addr()).lookup(&real_root, "guarded.txt");
    assert_eq!(file.0[..real_file.0.len()], real_file.0[..]);

    // Forgeries: the server's real handle, and a flipped MAC byte.
    let before = nfs.stats();
    assert_eq!(c.truncate(&real_file), NfsStat3::BadHandle);
    let mut flipped = file.clone();
    let last = flipped.0.len() - 1;
    flipped.0[last] ^= 0x01;
    assert_eq!(c.write(&flipped, b"OWNED"), NfsStat3::BadHandle);
    assert_eq!(c.lookup_status(&flipped), NfsStat3::BadHandle);
    let after = nfs.stats();
    assert_eq!(
        after.policies.bad_handles - before.policies.bad_handles,
        3,
        "{after:#?}"
    );
    // The statistics policy sits after the handle policy: it saw none of them.
    let seen = |s: &sidecore_filewall::proxy::ProxyStats, op: &str| -> u64 {
        s.policies
            .flows
            .iter()
            .filter(|((_, name), _)| name == op)
            .map(|(_, f)| f.calls)
            .sum()
    };
    assert_eq!(seen(&after, "NFSv3 Setattr"), 0, "{after:#?}");
    assert_eq!(seen(&after, "NFSv3 Write"), 0, "{after:#?}");
    assert_eq!(
        std::fs::read(&served).expect("reading guarded.txt"),
        CONTENT,
        "a forged call reached the server"
    );
    // Statistics: every forwarded call on every flow was answered and measured.
    assert!(seen(&after, "NFSv3 Read") >= 2, "{after:#?}");
    for ((flow, op), f) in &after.policies.flows {
        assert_eq!(f.calls, f.replies, "flow {flow} {op}: {after:#?}");
        assert!(f.call_bytes > 0 && f.reply_bytes > 0, "flow {flow} {op}");
        assert!(f.latency_max_us >= f.mean_latency_us(), "flow {flow} {op}");
    }
    assert!(
        after
            .policies
            .flows
            .keys()
            .map(|(f, _)| f)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            >= 2
    );

    // Restart FileWall with the same key: the handle issued before still works.
    drop(c);
    drop((nfs, mnt));
    let (nfs, _mnt) = proxies(&g, &policy, &key);
    let mut c = Client::connect(nfs.local_addr());
    assert_eq!(c.read(&file), (NfsStat3::Ok, CONTENT.to_vec()));
    assert_eq!(nfs.stats().policies.bad_handles, 0);
    // With another key it is a handle this FileWall never issued.
    drop(c);
    drop(nfs);
    let other = HandleKey::new(b"another key, sixteen bytes or more".to_vec()).expect("key");
    let (nfs, _mnt) = proxies(&g, &policy, &other);
    let mut c = Client::connect(nfs.local_addr());
    assert_eq!(c.read(&file).0, NfsStat3::BadHandle);
    assert_eq!(nfs.stats().policies.bad_handles, 1);
    assert_eq!(std::fs::read(&served).expect("reading"), CONTENT);
}
