//! The control socket and node listener over real sockets: requests, bad
//! requests, stale and live socket files, and a peer's hello.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use sidecore_control::node::NodeListener;
use sidecore_control::{ControlServer, Daemon, DaemonOptions, Request, Response, request};
use sidecore_offcode::Registry;
use sidecore_pe::DiscoverOptions;

fn daemon() -> std::sync::Arc<Daemon> {
    let mut reg = Registry::new();
    sidecore_builtins::register(&mut reg);
    Daemon::new(
        reg,
        DaemonOptions {
            discover: DiscoverOptions {
                probe_kernel: false,
                probe_wasm: false,
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

#[test]
fn answers_requests_and_explains_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sock");
    let d = daemon();
    let mut server = ControlServer::start(d.clone(), &path).unwrap();
    match request(&path, &Request::Ping, Duration::from_secs(5)).unwrap() {
        Response::Ok { message, .. } => assert_eq!(message.as_deref(), Some("pong")),
        r => panic!("{r:?}"),
    }
    // A line that is not a request gets an error naming the problem, and the
    // connection keeps working.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"{\"op\":\"launch\"}\n{\"op\":\"ping\"}\n")
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let lines: Vec<String> = BufReader::new(s).lines().map(Result::unwrap).collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].contains("bad control request") && lines[0].contains("unknown variant `launch`"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("pong"));
    // Stopping an app that does not exist.
    match request(
        &path,
        &Request::Down {
            app: Some("ghost".into()),
        },
        Duration::from_secs(5),
    )
    .unwrap()
    {
        Response::Error { error } => assert!(error.contains("no app named `ghost`"), "{error}"),
        r => panic!("{r:?}"),
    }
    // A manifest that does not exist.
    match request(
        &path,
        &Request::Up {
            manifest: "/nonexistent.toml".into(),
        },
        Duration::from_secs(5),
    )
    .unwrap()
    {
        Response::Error { error } => assert!(
            error.contains("cannot read manifest `/nonexistent.toml`"),
            "{error}"
        ),
        r => panic!("{r:?}"),
    }
    server.stop();
    assert!(!path.exists(), "socket file removed");
    d.stop_all();
}

#[test]
fn replaces_a_stale_socket_and_refuses_a_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sock");
    // A socket file whose daemon died.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let d = daemon();
    let _live = ControlServer::start(d.clone(), &path).expect("stale socket replaced");
    let e = ControlServer::start(daemon(), &path)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another sidecore daemon is listening"), "{e}");
    d.stop_all();
}

#[test]
fn the_node_listener_answers_a_peers_hello() {
    let l = NodeListener::start("127.0.0.1:0", "peer-b", None).unwrap();
    let info = sidecore_pe::node::probe(
        &sidecore_pe::NodeConfig {
            name: "b".into(),
            addr: l.addr().to_string(),
            bandwidth: None,
        },
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(info.name, "peer-b");
    assert!(info.cpus >= 1 && info.memory_bytes > 0);
    // And discovery lists it as a node PE.
    let inv = sidecore_pe::discover(&DiscoverOptions {
        nodes: vec![sidecore_pe::NodeConfig {
            name: "b".into(),
            addr: l.addr().to_string(),
            bandwidth: None,
        }],
        probe_kernel: false,
        probe_wasm: false,
        ..Default::default()
    });
    let pe = inv.get("node:b").expect("node PE");
    assert!(pe.detail.contains("peer-b"));
}
