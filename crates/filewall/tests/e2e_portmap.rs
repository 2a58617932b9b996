//! End to end over FileWall's interposition edges: its own portmapper and UDP.
//!
//! - An unmodified client finds the proxy through the portmapper: FileWall's
//!   listeners (portmapper on 111, NFS and MOUNT, TCP and UDP) are bound inside
//!   a network namespace of their own, while its connections to nfs-ganesha
//!   leave from the host's (a socket keeps the namespace it was made in). Inside
//!   the namespace, libnfs's nfs-ls, nfs-cat and nfs-cp are given no ports: they
//!   ask 127.0.0.1:111 (PMAP v2 GETPORT over TCP, as libnfs does for IPv4), get
//!   the proxy's, and work — and there is no other way to ganesha from there.
//! - A client over UDP (built on the codec): GETPORT, MNT and NFS calls in
//!   datagrams, and malformed datagrams, each answered with the right RPC error
//!   (or dropped and counted) while the proxy keeps serving.
//! - A server that disappears: calls to it go unanswered and time out, counted,
//!   and the proxy keeps answering what it can answer itself.
//!
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::time::Duration;

use common::ganesha::Ganesha;
use sidecore_filewall::message::{Call, CallArgs, ReplyResults, decode_reply, decode_reply_header};
use sidecore_filewall::mount::{DirPath, MountCall, MountReply, MountRes3};
use sidecore_filewall::nfs3::{
    self, DirOpArgs3, Nfs3Call, Nfs3Reply, NfsFh3, NfsRes, ReadArgs, StableHow, WriteArgs,
};
use sidecore_filewall::portmap::{self, IPPROTO_TCP, IPPROTO_UDP, Mapping, PmapCall, PmapReply};
use sidecore_filewall::proxy::{Backend, Bound, Listen, Proxy, ProxyConfig};
use sidecore_filewall::rpc::{AcceptStat, Auth, AuthSys, ReplyBody};
use sidecore_filewall::{mount, rpc};
use sidecore_testbed::netns;

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// A network namespace with only `lo` up, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("sidecore-fw-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("ip")
                .args(["-n", &name, "link", "set", "lo", "up"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "creating network namespace {name}");
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// NFS and MOUNT listeners (TCP and UDP, on one port each) and the portmapper's
/// (port `pmap`), bound where the calling thread is.
fn listeners(pmap: u16) -> Vec<Listen> {
    let tcp = |port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("binding TCP");
    let mut out = Vec::new();
    for prog in [nfs3::PROGRAM, mount::PROGRAM] {
        let t = tcp(0);
        let port = t.local_addr().expect("its address").port();
        let u = UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).expect("binding UDP on the same port");
        out.push(Listen::bound(Bound::Tcp(t), &[prog]).expect("a TCP listener"));
        out.push(Listen::bound(Bound::Udp(u), &[prog]).expect("a UDP listener"));
    }
    let u = UdpSocket::bind((Ipv4Addr::LOCALHOST, pmap)).expect("binding the portmapper (UDP)");
    let pmap = u.local_addr().expect("its address").port();
    out.push(Listen::bound(Bound::Tcp(tcp(pmap)), &[portmap::PROGRAM]).expect("portmapper (TCP)"));
    out.push(Listen::bound(Bound::Udp(u), &[portmap::PROGRAM]).expect("portmapper (UDP)"));
    out
}

fn proxy(g: &Ganesha, listen: Vec<Listen>) -> Proxy {
    Proxy::start(ProxyConfig::with(
        listen,
        vec![Backend::nfs_mount(g.nfs_addr(), g.mount_addr())],
    ))
    .expect("starting the proxy")
}

#[test]
fn unmodified_libnfs_finds_the_proxy_through_its_portmapper() {
    let Some(g) = Ganesha::start() else { return };
    std::fs::write(g.export.join("found.txt"), "found through the portmapper\n").expect("writing");
    let ns = Netns::new();
    let listen =
        netns::within(Some(&ns.0), || listeners(portmap::PORT)).expect("entering the namespace");
    let p = proxy(&g, listen);
    let in_ns = |tool: &str, url: &str, extra: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.0, "timeout", "60", tool])
            .args(extra)
            .arg(url);
        c.output().expect("running a libnfs tool in the namespace")
    };
    let export = g.export.display().to_string();
    let ls = in_ns("nfs-ls", &format!("nfs://127.0.0.1{export}?version=3"), &[]);
    assert!(
        ls.status.success() && String::from_utf8_lossy(&ls.stdout).contains("found.txt"),
        "{ls:?}\n{:#?}",
        p.stats()
    );
    let cat = in_ns(
        "nfs-cat",
        &format!("nfs://127.0.0.1{export}/found.txt?version=3"),
        &[],
    );
    assert_eq!(
        String::from_utf8_lossy(&cat.stdout),
        "found through the portmapper\n",
        "{cat:?}"
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let local = dir.path().join("up.bin");
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&local, &body).expect("writing the upload");
    let cp = in_ns(
        "nfs-cp",
        &format!("nfs://127.0.0.1{export}/up.bin?version=3"),
        &[local.to_str().expect("utf-8")],
    );
    assert!(cp.status.success(), "{cp:?}");
    assert_eq!(
        std::fs::read(g.export.join("up.bin")).expect("uploaded"),
        body
    );
    let s = p.stats();
    assert!(s.op("PMAPv2 Getport").calls >= 4, "{s:#?}");
    assert_eq!(s.op("PMAPv2 Getport").calls, s.op("PMAPv2 Getport").replies);
    // Nothing in the namespace reaches ganesha but through FileWall.
    let direct = in_ns(
        "nfs-ls",
        &format!(
            "nfs://127.0.0.1{export}?version=3&nfsport={}&mountport={}",
            g.nfs_port, g.mount_port
        ),
        &[],
    );
    assert!(!direct.status.success(), "{direct:?}");
    // The same answers over UDP.
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, portmap::PORT));
    let udp = netns::within(Some(&ns.0), || {
        UdpSocket::bind(LOCAL).expect("a UDP socket")
    })
    .expect("namespace");
    let mut c = UdpClient::new(udp);
    let want = p
        .port_mappings()
        .iter()
        .find(|m| m.prog == mount::PROGRAM && m.prot == IPPROTO_UDP)
        .expect("MOUNT/UDP");
    assert_eq!(c.getport(addr, mount::PROGRAM, 3, IPPROTO_UDP), want.port);
    assert_eq!(
        c.getport(addr, 100_021, 4, IPPROTO_TCP),
        0,
        "NLM is not served"
    );
}

/// A codec client over UDP, one call at a time.
struct UdpClient {
    sock: UdpSocket,
    xid: u32,
}

impl UdpClient {
    fn new(sock: UdpSocket) -> Self {
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        UdpClient { sock, xid: 0x7700 }
    }

    fn raw(&mut self, to: SocketAddr, datagram: &[u8]) -> Vec<u8> {
        self.sock.send_to(datagram, to).expect("sending a datagram");
        let mut buf = vec![0u8; 70_000];
        let (n, from) = self.sock.recv_from(&mut buf).expect("a reply datagram");
        assert_eq!(from, to);
        buf.truncate(n);
        buf
    }

    fn call(&mut self, to: SocketAddr, args: CallArgs) -> ReplyResults {
        self.xid += 1;
        let procedure = args.procedure();
        let call = Call {
            xid: self.xid,
            cred: Auth::Sys(AuthSys {
                stamp: 1,
                machine_name: b"udp".to_vec(),
                uid: 0,
                gid: 0,
                gids: vec![0],
            }),
            verf: Auth::None,
            args,
        };
        let bytes = self.raw(to, &call.to_bytes());
        let reply =
            decode_reply(&bytes, procedure).unwrap_or_else(|e| panic!("{procedure:?}: {e}"));
        assert_eq!(reply.header.xid, self.xid);
        reply
            .results
            .unwrap_or_else(|| panic!("{procedure:?} refused: {:?}", reply.header))
    }

    fn getport(&mut self, to: SocketAddr, prog: u32, vers: u32, prot: u32) -> u32 {
        match self.call(
            to,
            CallArgs::Portmap2(PmapCall::Getport(Mapping {
                prog,
                vers,
                prot,
                port: 0,
            })),
        ) {
            ReplyResults::Portmap2(PmapReply::Getport(p)) => p,
            other => panic!("GETPORT: {other:?}"),
        }
    }

    /// The accept status of the reply to raw bytes `datagram` (`None`: no reply).
    fn refusal(&mut self, to: SocketAddr, datagram: &[u8]) -> Option<ReplyBody> {
        self.sock
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("a read timeout");
        self.sock.send_to(datagram, to).expect("sending");
        let mut buf = vec![0u8; 70_000];
        let got = self.sock.recv_from(&mut buf).ok();
        self.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        got.map(|(n, _)| {
            decode_reply_header(&buf[..n])
                .expect("a reply header")
                .0
                .body
        })
    }
}

fn call_bytes(xid: u32, prog: u32, vers: u32, proc_num: u32, args: &[u8]) -> Vec<u8> {
    let mut enc = sidecore_filewall::xdr::Encoder::new();
    rpc::RpcHeader::Call(rpc::CallHeader {
        xid,
        rpcvers: 2,
        prog,
        vers,
        proc_num,
        cred: Auth::None,
        verf: Auth::None,
    })
    .encode(&mut enc);
    let mut b = enc.into_bytes();
    b.extend_from_slice(args);
    b
}

use sidecore_filewall::xdr::Xdr as _;

#[test]
fn a_client_over_udp_and_malformed_datagrams() {
    let Some(g) = Ganesha::start() else { return };
    std::fs::write(g.export.join("u.txt"), "over udp\n").expect("writing");
    let p = proxy(&g, listeners(0));
    let find = |prog, prot| {
        p.port_mappings()
            .iter()
            .find(|m| m.prog == prog && m.prot == prot)
            .map(|m| SocketAddr::from((Ipv4Addr::LOCALHOST, m.port as u16)))
            .expect("a mapping")
    };
    let pmap = find(portmap::PROGRAM, IPPROTO_UDP);
    let mut c = UdpClient::new(UdpSocket::bind(LOCAL).expect("a UDP socket"));
    let mnt_port = c.getport(pmap, mount::PROGRAM, 3, IPPROTO_UDP);
    let nfs_port = c.getport(pmap, nfs3::PROGRAM, 3, IPPROTO_UDP);
    assert_eq!(
        c.getport(pmap, nfs3::PROGRAM, 3, IPPROTO_TCP) as u16,
        find(nfs3::PROGRAM, IPPROTO_TCP).port()
    );
    let mnt = SocketAddr::from((Ipv4Addr::LOCALHOST, mnt_port as u16));
    let nfs = SocketAddr::from((Ipv4Addr::LOCALHOST, nfs_port as u16));
    let root = match c.call(
        mnt,
        CallArgs::Mount3(MountCall::Mnt(DirPath(
            g.export.display().to_string().into_bytes(),
        ))),
    ) {
        ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })) => fhandle,
        other => panic!("MNT: {other:?}"),
    };
    let file = match c.call(
        nfs,
        CallArgs::Nfs3(Nfs3Call::Lookup(DirOpArgs3 {
            dir: root,
            name: b"u.txt".to_vec(),
        })),
    ) {
        ReplyResults::Nfs3(Nfs3Reply::Lookup(NfsRes::Ok(ok))) => ok.object,
        other => panic!("LOOKUP: {other:?}"),
    };
    let write = WriteArgs {
        file: file.clone(),
        offset: 0,
        count: 4,
        stable: StableHow::FileSync,
        data: b"OVER".to_vec(),
    };
    assert!(matches!(
        c.call(nfs, CallArgs::Nfs3(Nfs3Call::Write(write))),
        ReplyResults::Nfs3(Nfs3Reply::Write(NfsRes::Ok(_)))
    ));
    match c.call(
        nfs,
        CallArgs::Nfs3(Nfs3Call::Read(ReadArgs {
            file,
            offset: 0,
            count: 8192,
        })),
    ) {
        ReplyResults::Nfs3(Nfs3Reply::Read(NfsRes::Ok(ok))) => assert_eq!(ok.data, b"OVER udp\n"),
        other => panic!("READ: {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(g.export.join("u.txt")).expect("on disk"),
        "OVER udp\n"
    );

    malformed(&mut c, nfs, pmap);
    let s = p.stats();
    assert_eq!((s.refused_calls, s.dropped_records), (6, 1), "{s:#?}");
    assert!(s.udp_datagrams >= 13, "{s:#?}");
    // Still serving.
    assert_eq!(
        c.getport(pmap, mount::PROGRAM, 3, IPPROTO_TCP) as u16,
        find(mount::PROGRAM, IPPROTO_TCP).port()
    );
}

#[test]
fn a_server_that_disappears() {
    let Some(mut g) = Ganesha::start() else {
        return;
    };
    let mut config = ProxyConfig::with(
        listeners(0),
        vec![Backend::nfs_mount(g.nfs_addr(), g.mount_addr())],
    );
    config.timeout = Duration::from_millis(300);
    let p = Proxy::start(config).expect("starting the proxy");
    let udp = |prog| {
        p.port_mappings()
            .iter()
            .find(|m| m.prog == prog && m.prot == IPPROTO_UDP)
            .map(|m| SocketAddr::from((Ipv4Addr::LOCALHOST, m.port as u16)))
            .expect("a mapping")
    };
    let mut c = UdpClient::new(UdpSocket::bind(LOCAL).expect("a UDP socket"));
    let null = call_bytes(9, nfs3::PROGRAM, 3, 0, &[]);
    assert_eq!(
        c.refusal(udp(nfs3::PROGRAM), &null),
        Some(ReplyBody::Accepted {
            verf: Auth::None,
            stat: AcceptStat::Success
        })
    );
    g.kill();
    assert_eq!(
        c.refusal(udp(nfs3::PROGRAM), &null),
        None,
        "no server, no answer"
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(c.refusal(udp(nfs3::PROGRAM), &null), None);
    std::thread::sleep(Duration::from_millis(600));
    let s = p.stats();
    assert!(s.server_errors >= 1, "{s:#?}");
    assert!(s.timeouts >= 1, "{s:#?}");
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("server")),
        "{s:#?}"
    );
    // FileWall itself still answers.
    assert_eq!(
        c.getport(udp(portmap::PROGRAM), nfs3::PROGRAM, 3, IPPROTO_UDP) as u16,
        udp(nfs3::PROGRAM).port()
    );
    assert_eq!(
        c.refusal(udp(nfs3::PROGRAM), &call_bytes(10, 100_099, 1, 0, &[])),
        Some(ReplyBody::Accepted {
            verf: Auth::None,
            stat: AcceptStat::ProgUnavail
        })
    );
}

/// Malformed datagrams: each gets its RPC error, or is dropped.
fn malformed(c: &mut UdpClient, nfs: SocketAddr, pmap: SocketAddr) {
    let accepted = |stat| {
        Some(ReplyBody::Accepted {
            verf: Auth::None,
            stat,
        })
    };
    let getattr = NfsFh3(vec![1; 8]).to_xdr();
    assert_eq!(
        c.refusal(nfs, &call_bytes(1, 100_099, 1, 0, &[])),
        accepted(AcceptStat::ProgUnavail)
    );
    assert_eq!(
        c.refusal(nfs, &call_bytes(2, nfs3::PROGRAM, 4, 1, &getattr)),
        accepted(AcceptStat::ProgMismatch { low: 3, high: 3 })
    );
    assert_eq!(
        c.refusal(pmap, &call_bytes(3, portmap::PROGRAM, 4, 3, &[])),
        accepted(AcceptStat::ProgMismatch { low: 2, high: 2 }),
        "rpcbind v4: clients fall back to v2"
    );
    assert_eq!(
        c.refusal(nfs, &call_bytes(4, nfs3::PROGRAM, 3, 99, &[])),
        accepted(AcceptStat::ProcUnavail)
    );
    let truncated = call_bytes(5, nfs3::PROGRAM, 3, 1, &getattr[..6]);
    assert_eq!(
        c.refusal(nfs, &truncated),
        accepted(AcceptStat::GarbageArgs)
    );
    let oversized = {
        let mut h = 65u32.to_be_bytes().to_vec();
        h.extend_from_slice(&[0u8; 68]);
        call_bytes(6, nfs3::PROGRAM, 3, 1, &h)
    };
    assert_eq!(
        c.refusal(nfs, &oversized),
        accepted(AcceptStat::GarbageArgs),
        "a 65-byte handle"
    );
    assert_eq!(c.refusal(nfs, &[0xde, 0xad]), None, "no header: dropped");
}
