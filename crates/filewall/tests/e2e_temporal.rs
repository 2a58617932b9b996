//! End to end with the temporal policy: libnfs's nfs-cat, nfs-cp and a small codec
//! client → FileWall running the chain `temporal, stats` (from a TOML file) →
//! nfs-ganesha. The rule denies the "write" class to UID 0 all day
//! (`during = "00:00-24:00"`, so the test does not depend on the hour). Proves that
//! reads still pass; that nfs-cp's upload and a codec WRITE as UID 0 get
//! NFS3ERR_ACCES and never reach the server (its directory and file are unchanged,
//! and the statistics policy after the temporal one never sees the WRITE); and that
//! the same WRITE as UID 4242, whom the rule does not name, lands on the server.
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::client::Client;
use common::ganesha::{Ganesha, libnfs, nfs_url};
use sidecore_filewall::message::{CallArgs, ReplyResults};
use sidecore_filewall::nfs3::{Nfs3Call, Nfs3Reply, NfsFh3, NfsStat3, StableHow, WriteArgs};
use sidecore_filewall::policy::load_chain;
use sidecore_filewall::proxy::{Proxy, ProxyConfig};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const CONTENT: &[u8] = b"Written before hours.\n";

fn write_as(nfs: SocketAddr, uid: u32, file: &NfsFh3, data: &[u8]) -> NfsStat3 {
    let args = WriteArgs {
        file: file.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: StableHow::FileSync,
        data: data.to_vec(),
    };
    match Client::connect(nfs).call_as(uid, CallArgs::Nfs3(Nfs3Call::Write(args))) {
        ReplyResults::Nfs3(Nfs3Reply::Write(r)) => r.status(),
        other => panic!("WRITE: {other:?}"),
    }
}

/// MNT of `export`, then LOOKUP of `name` in it, as UID 0.
fn lookup(mnt: SocketAddr, nfs: SocketAddr, export: &std::path::Path, name: &str) -> NfsFh3 {
    let root = Client::connect(mnt).mnt(export);
    Client::connect(nfs).lookup(&root, name)
}

#[test]
fn writes_denied_by_the_clock_never_reach_the_server() {
    let Some(g) = Ganesha::start() else { return };
    let served = g.export.join("hours.txt");
    std::fs::write(&served, CONTENT).expect("writing hours.txt");
    // World-writable, so that ganesha itself lets UID 4242 write.
    std::fs::set_permissions(&served, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .expect("chmod 666 hours.txt");
    let conf = tempfile::tempdir().expect("creating a temporary directory");
    let policy = conf.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[[policy]]\nkind = \"temporal\"\n[[policy.rule]]\ndeny = [\"write\"]\n\
         during = \"00:00-24:00\"\nuids = [0]\n\n[[policy]]\nkind = \"stats\"\n",
    )
    .expect("writing the policy file");
    let chain = load_chain(&policy).expect("loading the policy file");
    let start = |server| {
        let mut c = ProxyConfig::new(LOCAL, server);
        c.chain = chain.clone();
        Proxy::start(c).expect("starting a proxy")
    };
    let (nfs, mnt) = (start(g.nfs_addr()), start(g.mount_addr()));
    let url = |rel| {
        nfs_url(
            &g.export,
            rel,
            nfs.local_addr().port(),
            mnt.local_addr().port(),
        )
    };

    let out = libnfs("nfs-cat", &[&url("hours.txt")]);
    assert!(
        out.status.success() && out.stdout == CONTENT,
        "nfs-cat through the temporal policy: {out:?}\n{}",
        g.log_tail()
    );

    let upload = conf.path().join("upload.bin");
    std::fs::write(&upload, vec![7u8; 64 * 1024]).expect("writing the upload");
    let out = libnfs(
        "nfs-cp",
        &[&upload.display().to_string(), &url("upload.bin")],
    );
    let denied_by_cp = nfs.stats().policies.temporal_denied;
    assert!(
        !out.status.success() && denied_by_cp >= 1,
        "nfs-cp should be refused: {out:?}\n{:#?}",
        nfs.stats()
    );
    let landed = std::fs::read(g.export.join("upload.bin")).unwrap_or_default();
    assert!(
        landed.is_empty(),
        "{} bytes of the upload reached the server",
        landed.len()
    );

    let file = lookup(mnt.local_addr(), nfs.local_addr(), &g.export, "hours.txt");

    assert_eq!(
        write_as(nfs.local_addr(), 0, &file, b"OVERWRITTEN"),
        NfsStat3::Acces
    );
    let after = nfs.stats();
    assert_eq!(after.policies.temporal_denied, denied_by_cp + 1);
    assert_eq!(std::fs::read(&served).expect("reading hours.txt"), CONTENT);
    let stats_saw_write = |s: &sidecore_filewall::proxy::ProxyStats| {
        s.policies
            .flows
            .iter()
            .filter(|((_, op), _)| op == "NFSv3 Write")
            .map(|(_, c)| c.calls)
            .sum::<u64>()
    };
    assert_eq!(
        stats_saw_write(&after),
        0,
        "a denied WRITE reached the stats policy"
    );

    assert_eq!(
        write_as(nfs.local_addr(), 4242, &file, b"LATER"),
        NfsStat3::Ok
    );
    let now = std::fs::read(&served).expect("reading hours.txt");
    assert!(
        now.starts_with(b"LATER"),
        "{:?}",
        String::from_utf8_lossy(&now)
    );
    assert_eq!(nfs.stats().policies.temporal_denied, denied_by_cp + 1);
    assert_eq!(stats_saw_write(&nfs.stats()), 1);
}
