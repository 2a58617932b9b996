//! End to end with the replication template: three nfs-ganesha servers, each
//! exporting its own directory, behind one FileWall running the chain
//! `replicate, stats` (reply when all live replicas have answered, a replica
//! silent for 500 ms is dead). Proves that MNT is rewritten to each replica's
//! export, that the client sees the primary's handles while each replica is sent
//! its own (they differ), that a WRITE through the codec client and an `nfs-cp`
//! upload land byte for byte in every replica's directory (checked on disk), and
//! that killing one replica mid-run keeps the client served while that replica is
//! marked dead and gets no more writes.
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::client::Client;
use common::ganesha::{Ganesha, libnfs, nfs_url};
use sidecore_filewall::mount;
use sidecore_filewall::nfs3::{self, NfsStat3};
use sidecore_filewall::policy::parse_chain;
use sidecore_filewall::proxy::{Backend, Listen, Proxy, ProxyConfig, ProxyStats};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

fn replicated(servers: &[Ganesha]) -> Proxy {
    let chain = parse_chain(
        "[[policy]]\nkind = \"replicate\"\nreply = \"all\"\ntimeout_ms = 500\n\n\
         [[policy]]\nkind = \"stats\"\n",
        "replicate.toml",
    )
    .expect("the chain parses");
    let backends = servers
        .iter()
        .map(|g| {
            Backend::nfs_mount(g.nfs_addr(), g.mount_addr())
                .exporting(g.export.display().to_string())
        })
        .collect();
    let listen = vec![
        Listen::tcp(LOCAL).serving(&[nfs3::PROGRAM]),
        Listen::tcp(LOCAL).serving(&[mount::PROGRAM]),
    ];
    let mut config = ProxyConfig::with(listen, backends);
    config.chain = chain;
    Proxy::start(config).expect("starting the proxy")
}

fn on_every_replica(servers: &[Ganesha], name: &str, want: &[u8], stats: &ProxyStats) {
    for (i, g) in servers.iter().enumerate() {
        let got = std::fs::read(g.export.join(name))
            .unwrap_or_else(|e| panic!("replica {i}: {name}: {e}\n{stats:#?}"));
        assert!(
            got == want,
            "replica {i}: {name} differs ({} bytes, {} wanted)",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn replicated_writes_land_everywhere_and_a_dead_replica_is_dropped() {
    let Some(mut servers) = Ganesha::start_many(3) else {
        return;
    };
    let proxy = replicated(&servers);
    let (nfs, mnt) = (proxy.local_addrs()[0], proxy.local_addrs()[1]);
    let mut c = Client::connect(nfs);
    let mut m = Client::connect(mnt);
    let root = m.mnt(&servers[0].export);
    // The client holds the primary's root handle; replica 1 has its own.
    assert_eq!(
        root,
        Client::connect(servers[0].mount_addr()).mnt(&servers[0].export)
    );
    let root1 = Client::connect(servers[1].mount_addr()).mnt(&servers[1].export);
    assert_ne!(
        root, root1,
        "the replicas' handles differ, so the map is exercised"
    );

    let (st, file) = c.create_file(0, &root, "replicated.txt");
    assert_eq!(st, NfsStat3::Ok);
    let file = file.expect("CREATE returned a handle");
    let first = b"written once, stored three times\n";
    assert_eq!(c.write_at(0, &file, 0, first), NfsStat3::Ok);
    on_every_replica(&servers, "replicated.txt", first, &proxy.stats());
    assert_eq!(c.read_all(0, &file), (NfsStat3::Ok, first.to_vec()));

    // An unmodified client: nfs-cp through the proxy.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let local = dir.path().join("upload.bin");
    std::fs::write(&local, &body).expect("writing the upload");
    let url = nfs_url(&servers[0].export, "upload.bin", nfs.port(), mnt.port());
    let out = libnfs("nfs-cp", &[local.to_str().expect("utf-8 path"), &url]);
    assert!(
        out.status.success(),
        "nfs-cp: {}\n{:#?}",
        String::from_utf8_lossy(&out.stderr),
        proxy.stats()
    );
    on_every_replica(&servers, "upload.bin", &body, &proxy.stats());
    let s = proxy.stats();
    assert!(s.policies.replicas.iter().all(|r| r.alive), "{s:#?}");
    assert_eq!(s.policies.replica_divergences, 0, "{s:#?}");

    // Replica 2 disappears mid-run: the client is still served.
    servers[2].kill();
    let second = b"after replica 2 died\n";
    let t0 = Instant::now();
    assert_eq!(c.write_at(0, &file, 0, second), NfsStat3::Ok);
    let waited = t0.elapsed();
    let s = proxy.stats();
    let dead = &s.policies.replicas[2];
    assert!(
        !dead.alive && dead.timed_out >= 1,
        "replica 2 is marked dead: {s:#?}"
    );
    assert!(
        s.policies.replicas[0].alive && s.policies.replicas[1].alive,
        "{s:#?}"
    );
    assert!(
        waited >= Duration::from_millis(400),
        "the reply waited for the replica's timeout ({waited:?})"
    );
    let mut want = second.to_vec();
    want.extend_from_slice(&first[second.len()..]);
    on_every_replica(&servers[..2], "replicated.txt", &want, &s);
    // The dead replica got nothing more, and later calls do not wait for it.
    let (sent_before, timeouts_before) = (dead.sent, dead.timed_out);
    assert_eq!(c.read_all(0, &file), (NfsStat3::Ok, want.clone()));
    assert_eq!(c.write_at(0, &file, 0, first), NfsStat3::Ok);
    let s = proxy.stats();
    assert_eq!(
        (
            s.policies.replicas[2].sent,
            s.policies.replicas[2].timed_out
        ),
        (sent_before, timeouts_before)
    );
    let on_dead =
        std::fs::read(servers[2].export.join("replicated.txt")).expect("replica 2's file");
    assert_eq!(
        on_dead,
        first.to_vec(),
        "replica 2 still holds what it had when it died"
    );
}
