//! End to end against real software: libnfs's command-line clients (nfs-ls,
//! nfs-cat, nfs-cp) → FileWall's pass-through proxy (one for MOUNT, one for NFS)
//! → nfs-ganesha with FSAL_VFS exporting a temporary directory. Proves that the
//! proxy forwards and matches real traffic under fresh XIDs, that the codec
//! decodes and re-encodes every call and reply real clients and a real server
//! exchange (not just its own output), and that malformed input gets RPC error
//! replies or a closed connection while the proxy keeps serving. A small client
//! built on the codec then drives all 22 NFSv3 and all 6 MOUNT procedures
//! through the proxy to ganesha, so every call encoder and reply decoder meets
//! the real server.
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use common::client::Client;
use common::ganesha::{Ganesha, libnfs, nfs_url, null_call, read_record};
use sidecore_filewall::message::{CallArgs, ReplyResults, decode_reply_header};
use sidecore_filewall::mount::{DirPath, MountCall, MountProc, MountReply, MountRes3};
use sidecore_filewall::nfs3::{
    AccessArgs, CommitArgs, CreateArgs, CreateHow3, CreateOk, DirOpArgs3, Ftype3, LinkArgs,
    MkdirArgs, MknodArgs, MknodData3, Nfs3Call, Nfs3Proc, Nfs3Reply, NfsFh3, NfsRes, ReadArgs,
    ReaddirArgs, ReaddirplusArgs, RenameArgs, Sattr3, SetTime, SetattrArgs, StableHow, SymlinkArgs,
    WriteArgs,
};
use sidecore_filewall::proxy::{Proxy, ProxyConfig, ProxyStats};
use sidecore_filewall::record::encode_record;
use sidecore_filewall::rpc::{AcceptStat, ReplyBody};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Proxies for NFS and MOUNT in front of `g`.
fn proxies(g: &Ganesha) -> (Proxy, Proxy) {
    let nfs = Proxy::start(ProxyConfig::new(LOCAL, g.nfs_addr())).expect("starting the NFS proxy");
    let mnt =
        Proxy::start(ProxyConfig::new(LOCAL, g.mount_addr())).expect("starting the MOUNT proxy");
    (nfs, mnt)
}

/// Deterministic bytes that are not all alike.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn ok(out: &std::process::Output, what: &str, g: &Ganesha, stats: &ProxyStats) {
    assert!(
        out.status.success(),
        "{what} failed ({}): stdout {:?} stderr {:?}\nproxy stats: {stats:#?}\nganesha log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        g.log_tail()
    );
}

/// Every call got its reply, and every reply decoded.
fn all_answered_and_decoded(stats: &ProxyStats) {
    for (name, c) in &stats.ops {
        assert_eq!(c.calls, c.replies, "{name}: calls vs replies in {stats:#?}");
        assert_eq!(
            c.reply_decode_errors, 0,
            "{name}: a reply from ganesha did not decode: {stats:#?}"
        );
        assert_eq!(
            c.reencode_mismatches, 0,
            "{name}: a call or reply did not re-encode to the bytes received: {stats:#?}"
        );
    }
    assert_eq!(stats.server_errors, 0, "{stats:#?}");
    assert_eq!(stats.bad_server_records, 0, "{stats:#?}");
}

#[test]
fn libnfs_clients_list_read_and_write_through_the_proxy() {
    let Some(g) = Ganesha::start() else { return };
    // Several READs and WRITEs each (libnfs moves at most 1 MiB per call, and
    // usually less).
    let served = pattern(3 * 1024 * 1024 + 17, 1);
    std::fs::write(g.export.join("served.bin"), &served).expect("writing served.bin");
    let (nfs, mnt) = proxies(&g);
    let url = |rel: &str| {
        nfs_url(
            &g.export,
            rel,
            nfs.local_addr().port(),
            mnt.local_addr().port(),
        )
    };

    let out = libnfs("nfs-ls", &[&url("")]);
    ok(&out, "nfs-ls", &g, &nfs.stats());
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("served.bin"), "nfs-ls listed {listing:?}");

    let out = libnfs("nfs-cat", &[&url("served.bin")]);
    ok(&out, "nfs-cat", &g, &nfs.stats());
    assert_eq!(out.stdout.len(), served.len(), "nfs-cat length");
    assert!(out.stdout == served, "nfs-cat returned different bytes");

    let local = tempfile::tempdir().expect("creating a local temporary directory");
    let written = pattern(2 * 1024 * 1024 + 5, 2);
    let src = local.path().join("upload.bin");
    std::fs::write(&src, &written).expect("writing upload.bin");
    let out = libnfs("nfs-cp", &[&src.display().to_string(), &url("upload.bin")]);
    ok(&out, "nfs-cp", &g, &nfs.stats());
    let on_server = std::fs::read(g.export.join("upload.bin")).expect("reading upload.bin");
    assert_eq!(on_server.len(), written.len(), "uploaded length");
    assert!(on_server == written, "the server holds different bytes");

    let s = nfs.stats();
    eprintln!("NFS proxy: {s:#?}\nMOUNT proxy: {:#?}", mnt.stats());
    all_answered_and_decoded(&s);
    all_answered_and_decoded(&mnt.stats());
    for op in ["Lookup", "Read", "Write", "Create", "Fsinfo", "Getattr"] {
        assert!(
            s.op(&format!("NFSv3 {op}")).calls > 0,
            "no {op} seen: {s:#?}"
        );
    }
    assert!(
        s.op("NFSv3 Readdirplus").calls + s.op("NFSv3 Readdir").calls > 0,
        "no READDIR(PLUS) seen: {s:#?}"
    );
    assert!(s.op("NFSv3 Read").calls >= 3, "{s:#?}");
    // Every answered call has its call-to-reply time.
    let reads = s.latency.get("NFSv3 Read").map_or(0, |h| h.count);
    assert_eq!(reads, s.op("NFSv3 Read").replies, "{s:#?}");
    assert!(s.op("NFSv3 Write").calls >= 2, "{s:#?}");
    assert!(
        mnt.stats().op("MOUNTv3 Mnt").calls >= 3,
        "{:#?}",
        mnt.stats()
    );
    assert_eq!(
        s.refused_calls + s.dropped_records + s.closed_connections,
        0
    );
}

/// A call record with an AUTH_NONE header and the given body.
fn raw_call(xid: u32, prog: u32, vers: u32, proc_num: u32, body: &[u32]) -> Vec<u8> {
    let mut words = vec![xid, 0, 2, prog, vers, proc_num, 0, 0, 0, 0];
    words.extend_from_slice(body);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    encode_record(&bytes, 1 << 20)
}

fn expect_stat(s: &mut TcpStream, xid: u32, want: &AcceptStat) {
    let reply = read_record(s).expect("reading the proxy's answer");
    let (h, _) = decode_reply_header(&reply).expect("the answer is a reply");
    assert_eq!(h.xid, xid);
    match h.body {
        ReplyBody::Accepted { ref stat, .. } => assert_eq!(stat, want, "{h:?}"),
        other => panic!("xid {xid:#x}: expected {want:?}, got {other:?}"),
    }
}

#[test]
fn malformed_records_get_error_replies_and_the_proxy_keeps_serving() {
    let Some(g) = Ganesha::start() else { return };
    std::fs::write(g.export.join("still-here.txt"), b"yes\n").expect("writing a file");
    let (nfs, mnt) = proxies(&g);
    let mut s = TcpStream::connect(nfs.local_addr()).expect("connecting to the proxy");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();

    // GETATTR with a 200-byte handle (NFSv3 allows 64): GARBAGE_ARGS.
    s.write_all(&raw_call(0x100, 100_003, 3, 1, &[200]))
        .unwrap();
    expect_stat(&mut s, 0x100, &AcceptStat::GarbageArgs);
    // A program FileWall does not serve: PROG_UNAVAIL.
    s.write_all(&raw_call(0x101, 12_345, 1, 0, &[])).unwrap();
    expect_stat(&mut s, 0x101, &AcceptStat::ProgUnavail);
    // NFSv4 on the NFSv3 port: PROG_MISMATCH 3..3.
    s.write_all(&raw_call(0x102, 100_003, 4, 0, &[])).unwrap();
    expect_stat(&mut s, 0x102, &AcceptStat::ProgMismatch { low: 3, high: 3 });
    // READ (6) has no procedure 99: PROC_UNAVAIL.
    s.write_all(&raw_call(0x103, 100_003, 3, 99, &[])).unwrap();
    expect_stat(&mut s, 0x103, &AcceptStat::ProcUnavail);
    // Three bytes are no header: dropped without an answer. The NULL after it on
    // the same connection still goes to ganesha and back.
    s.write_all(&encode_record(&[1, 2, 3], 1 << 20)).unwrap();
    s.write_all(&encode_record(&null_call(0x104, false).to_bytes(), 1 << 20))
        .unwrap();
    expect_stat(&mut s, 0x104, &AcceptStat::Success);

    // A record header announcing 2 GiB: the connection is closed.
    let mut big = TcpStream::connect(nfs.local_addr()).expect("connecting to the proxy");
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    big.write_all(&0xFFFF_FFFFu32.to_be_bytes()).unwrap();
    let closed = read_record(&mut big);
    assert!(closed.is_err(), "expected a close, got {closed:?}");

    // Real clients are still served.
    let url = nfs_url(
        &g.export,
        "still-here.txt",
        nfs.local_addr().port(),
        mnt.local_addr().port(),
    );
    let out = libnfs("nfs-cat", &[&url]);
    ok(
        &out,
        "nfs-cat after the malformed records",
        &g,
        &nfs.stats(),
    );
    assert_eq!(out.stdout, b"yes\n");

    let st = nfs.stats();
    assert_eq!(st.refused_calls, 4, "{st:#?}");
    assert_eq!(st.dropped_records, 1, "{st:#?}");
    assert_eq!(st.closed_connections, 1, "{st:#?}");
    all_answered_and_decoded(&st);
}

/// Calls an NFSv3 procedure and returns its `resok`, failing on any NFS error.
macro_rules! nfs {
    ($client:expr, $proc:ident, $args:expr) => {
        match $client.call(CallArgs::Nfs3(Nfs3Call::$proc($args))) {
            ReplyResults::Nfs3(Nfs3Reply::$proc(NfsRes::Ok(ok))) => ok,
            other => panic!("{}: {other:?}", stringify!($proc)),
        }
    };
}

fn sattr(mode: u32) -> Sattr3 {
    Sattr3 {
        mode: Some(mode),
        uid: None,
        gid: None,
        size: None,
        atime: SetTime::DontChange,
        mtime: SetTime::DontChange,
    }
}

fn place(dir: &NfsFh3, name: &str) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: name.as_bytes().to_vec(),
    }
}

fn created(ok: CreateOk, what: &str) -> NfsFh3 {
    ok.obj
        .unwrap_or_else(|| panic!("{what}: ganesha returned no handle"))
}

#[test]
fn every_nfsv3_and_mount_procedure_passes_through_to_ganesha() {
    let Some(g) = Ganesha::start() else { return };
    let (nfs, mnt) = proxies(&g);
    let export = DirPath(g.export.display().to_string().into_bytes());
    let mut m = Client::connect(mnt.local_addr());
    m.call(CallArgs::Mount3(MountCall::Null(())));
    let root = match m.call(CallArgs::Mount3(MountCall::Mnt(export.clone()))) {
        ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })) => fhandle,
        other => panic!("MNT: {other:?}"),
    };
    let mut c = Client::connect(nfs.local_addr());
    c.call(CallArgs::Nfs3(Nfs3Call::Null(())));
    nfs!(c, Fsinfo, root.clone());
    nfs!(c, Fsstat, root.clone());
    nfs!(c, Pathconf, root.clone());
    nfs!(c, Getattr, root.clone());
    let (d, data) = make_tree(&mut c, &root);
    list_and_remove(&mut c, &g, &root, &d, &data);

    m.call(CallArgs::Mount3(MountCall::Dump(())));
    m.call(CallArgs::Mount3(MountCall::Export(())));
    m.call(CallArgs::Mount3(MountCall::Umnt(export)));
    m.call(CallArgs::Mount3(MountCall::Umntall(())));

    let s = nfs.stats();
    all_answered_and_decoded(&s);
    all_answered_and_decoded(&mnt.stats());
    for p in Nfs3Proc::ALL {
        assert!(
            s.op(&format!("NFSv3 {p:?}")).calls > 0,
            "{p:?} not seen: {s:#?}"
        );
    }
    for p in MountProc::ALL {
        assert!(
            mnt.stats().op(&format!("MOUNTv3 {p:?}")).calls > 0,
            "{p:?} not seen"
        );
    }
}

/// MKDIR d; CREATE, WRITE, COMMIT, SETATTR, ACCESS, LOOKUP, READ d/f; SYMLINK and
/// READLINK d/l; LINK d/f2 and RENAME it to d/f3; MKNOD the FIFO d/fifo.
fn make_tree(c: &mut Client, root: &NfsFh3) -> (NfsFh3, Vec<u8>) {
    let d = created(
        nfs!(
            c,
            Mkdir,
            MkdirArgs {
                place: place(root, "d"),
                attributes: sattr(0o755)
            }
        ),
        "MKDIR",
    );
    let f = created(
        nfs!(
            c,
            Create,
            CreateArgs {
                place: place(&d, "f"),
                how: CreateHow3::Unchecked(sattr(0o644))
            }
        ),
        "CREATE",
    );
    let data = b"through filewall\n".to_vec();
    let w = nfs!(
        c,
        Write,
        WriteArgs {
            file: f.clone(),
            offset: 0,
            count: data.len() as u32,
            stable: StableHow::Unstable,
            data: data.clone()
        }
    );
    assert_eq!(w.count as usize, data.len());
    nfs!(
        c,
        Commit,
        CommitArgs {
            file: f.clone(),
            offset: 0,
            count: 0
        }
    );
    nfs!(
        c,
        Setattr,
        SetattrArgs {
            object: f.clone(),
            new_attributes: sattr(0o600),
            guard: None
        }
    );
    nfs!(
        c,
        Access,
        AccessArgs {
            object: f.clone(),
            access: 0x3f
        }
    );
    let looked = nfs!(c, Lookup, place(&d, "f"));
    assert_eq!(looked.object, f, "LOOKUP finds the created handle");
    let r = nfs!(
        c,
        Read,
        ReadArgs {
            file: f.clone(),
            offset: 0,
            count: 4096
        }
    );
    assert_eq!(r.data, data);
    link_names(c, &d, &f);
    (d, data)
}

/// SYMLINK d/l and READLINK it; LINK d/f as d/f2 and RENAME that to d/f3; MKNOD the
/// FIFO d/fifo.
fn link_names(c: &mut Client, d: &NfsFh3, f: &NfsFh3) {
    let l = created(
        nfs!(
            c,
            Symlink,
            SymlinkArgs {
                place: place(d, "l"),
                symlink_attributes: sattr(0o777),
                symlink_data: b"f".to_vec()
            }
        ),
        "SYMLINK",
    );
    assert_eq!(nfs!(c, Readlink, l).data, b"f");
    nfs!(
        c,
        Link,
        LinkArgs {
            file: f.clone(),
            link: place(d, "f2")
        }
    );
    nfs!(
        c,
        Rename,
        RenameArgs {
            from: place(d, "f2"),
            to: place(d, "f3")
        }
    );
    nfs!(
        c,
        Mknod,
        MknodArgs {
            place: place(d, "fifo"),
            what: MknodData3::Pipe {
                ftype: Ftype3::Fifo,
                attributes: sattr(0o644)
            }
        }
    );
}

/// READDIR and READDIRPLUS d, check the link on the server, then REMOVE
/// everything and RMDIR d.
fn list_and_remove(c: &mut Client, g: &Ganesha, root: &NfsFh3, d: &NfsFh3, data: &[u8]) {
    let listing = nfs!(
        c,
        Readdir,
        ReaddirArgs {
            dir: d.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            count: 4096
        }
    );
    let mut names: Vec<String> = listing
        .reply
        .entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    assert_eq!(names, ["f", "f3", "fifo", "l"]);
    let plus = nfs!(
        c,
        Readdirplus,
        ReaddirplusArgs {
            dir: d.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            dircount: 4096,
            maxcount: 16384
        }
    );
    assert!(plus.reply.entries.len() >= 4, "{plus:?}");
    assert_eq!(
        std::fs::read(g.export.join("d/f3")).expect("reading d/f3 on the server"),
        data,
        "the hard link on the server"
    );
    for name in ["f", "f3", "l", "fifo"] {
        nfs!(c, Remove, place(d, name));
    }
    nfs!(c, Rmdir, place(root, "d"));
    assert!(
        !g.export.join("d").exists(),
        "RMDIR removed the directory on the server"
    );
}

/// The proxy as a dedicated core (`ProxyConfig::core`): its thread is pinned
/// to the CPU named and busy-polls, and libnfs reads through it as through
/// the sleeping proxy; a CPU this process may not use is refused up front.
#[test]
fn a_busy_polling_proxy_on_a_dedicated_core_serves_libnfs() {
    let Some(g) = Ganesha::start() else { return };
    let served = pattern(256 * 1024 + 3, 3);
    std::fs::write(g.export.join("core.bin"), &served).expect("writing core.bin");
    let mut c = ProxyConfig::new(LOCAL, g.nfs_addr());
    c.core = Some(0);
    let nfs = Proxy::start(c).expect("starting the busy-polling proxy");
    let mnt = Proxy::start(ProxyConfig::new(LOCAL, g.mount_addr())).expect("the MOUNT proxy");
    let url = nfs_url(
        &g.export,
        "core.bin",
        nfs.local_addr().port(),
        mnt.local_addr().port(),
    );
    let out = libnfs("nfs-cat", &[&url]);
    ok(&out, "nfs-cat", &g, &nfs.stats());
    assert!(
        out.stdout == served,
        "nfs-cat through the core returned different bytes"
    );
    // The proxy's thread (named after its port) may run on CPU 0 only.
    let name = format!("filewall-{}", nfs.local_addr().port());
    let mut pinned = None;
    for t in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if name.starts_with(comm.trim()) && !comm.trim().is_empty() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            pinned = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string());
        }
    }
    assert_eq!(pinned.as_deref(), Some("0"), "the proxy thread's CPUs");
    let mut bad = ProxyConfig::new(LOCAL, g.nfs_addr());
    bad.core = Some(4096);
    let e = Proxy::start(bad)
        .err()
        .expect("CPU 4096 refused")
        .to_string();
    assert!(
        e.contains("CPU 4096 is not one this process may run on"),
        "{e}"
    );
}

/// Established TCP connections (IPv4) whose remote end is `port`, from
/// /proc/net/tcp: the proxy's side of its connections to a server.
fn connections_to(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let rem_port = f
                .get(2)
                .and_then(|r| r.split(':').nth(1))
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            rem_port == Some(port) && f.get(3) == Some(&"01")
        })
        .count()
}

/// Calls from several client connections reach the server over several of
/// the engine's connections (`SERVER_LANES`), each client's calls on one:
/// nfs-ganesha decodes a connection's requests in turn, so one connection
/// for all would serialise the clients.
#[test]
fn calls_from_several_clients_spread_over_the_servers_lanes() {
    let Some(g) = Ganesha::start() else { return };
    let (nfs, mnt) = proxies(&g);
    let mut m = Client::connect(mnt.local_addr());
    let root = m.mnt(&g.export);
    let before = connections_to(g.nfs_addr().port());
    let mut clients: Vec<Client> = (0..sidecore_filewall::engine::SERVER_LANES)
        .map(|_| Client::connect(nfs.local_addr()))
        .collect();
    for c in &mut clients {
        nfs!(c, Getattr, root.clone());
    }
    let lanes = connections_to(g.nfs_addr().port()) - before;
    assert_eq!(
        lanes,
        sidecore_filewall::engine::SERVER_LANES,
        "the proxy's connections to ganesha"
    );
    all_answered_and_decoded(&nfs.stats());
}
