//! `sidecore filewall run --manifest`: FileWall as a native offcode, deployed by
//! the layout from `examples/filewall.toml` (addresses and files rewritten for
//! this run) in front of a real nfs-ganesha: on a dedicated core of this machine,
//! and on a peer `sidecore daemon` (a node of its own, Fig. 4.10's third
//! placement). libnfs's nfs-cat reads through it, the VCN answers, and `filewall
//! stats` reads the offcode's counters over its control socket.
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

#[path = "../../filewall/tests/common/mod.rs"]
mod fw;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{Guard, bin, free_port, run, serial, text, wait_for};

fn repo() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..")
}

/// The example manifest with this run's ports, server, chain and control socket;
/// `targets` replaces its list of PE kinds.
fn manifest(dir: &Path, g: &fw::ganesha::Ganesha, ports: (u16, u16), targets: &[&str]) -> PathBuf {
    let example = std::fs::read_to_string(repo().join("examples/filewall.toml")).unwrap();
    let rbac = repo().join("examples/filewall/rbac.toml");
    let chain = dir.join("chain.toml");
    std::fs::write(
        &chain,
        format!(
            "[[policy]]\nkind = \"rbac\"\npolicy = {:?}\nstore = \"state.redb\"\n\n[[policy]]\nkind = \"stats\"\n",
            rbac.display().to_string()
        ),
    )
    .unwrap();
    let mut m = example
        .replace("127.0.0.1:3049", &format!("127.0.0.1:{}", ports.0))
        .replace("127.0.0.1:3050", &format!("127.0.0.1:{}", ports.1))
        .replace("127.0.0.1:2049", &g.nfs_addr().to_string())
        .replace("127.0.0.1:20048", &g.mount_addr().to_string())
        .replace("examples/filewall/chain-rbac.toml", chain.to_str().unwrap())
        .replace(
            "/run/sidecore/filewall.sock",
            dir.join("fw.sock").to_str().unwrap(),
        );
    let first = m.find("  [[offcode.target]]").unwrap();
    m.truncate(first);
    for t in targets {
        m.push_str(&format!("  [[offcode.target]]\n  kind = \"{t}\"\n\n"));
    }
    let path = dir.join("filewall.toml");
    std::fs::write(&path, m).unwrap();
    path
}

/// Starts `filewall run --manifest` and returns it with the line that says
/// where the layout put FileWall.
fn deploy(path: &Path, extra: &[&str]) -> (Guard, String) {
    let mut child = bin()
        .current_dir(repo())
        .args(["filewall", "run", "--manifest"])
        .arg(path)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let placed = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("filewall fw -> "))
        .unwrap_or_default();
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (Guard(child), placed)
}

/// nfs-cat of `name` through the proxy, and the counters it served.
fn through(
    g: &fw::ganesha::Ganesha,
    dir: &Path,
    ports: (u16, u16),
    name: &str,
) -> (String, serde_json::Value) {
    assert!(
        wait_for(|| TcpStream::connect(("127.0.0.1", ports.0)).is_ok(), 20),
        "FileWall never listened on {}",
        ports.0
    );
    let url = fw::ganesha::nfs_url(&g.export, name, ports.0, ports.1);
    let out = fw::ganesha::libnfs("nfs-cat", &[&url]);
    let o = run(&[
        "filewall",
        "stats",
        "--json",
        "--control",
        dir.join("fw.sock").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        serde_json::from_slice(&o.stdout).unwrap(),
    )
}

#[test]
fn filewall_runs_from_the_example_manifest_on_a_dedicated_core() {
    let _s = serial();
    let Some(g) = fw::ganesha::Ganesha::start() else {
        return;
    };
    std::fs::write(g.export.join("notes.txt"), "through the offcode\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports = (free_port(), free_port());
    let m = manifest(dir.path(), &g, ports, &["core", "host"]);
    let (_run, placed) = deploy(&m, &["--for", "60s"]);
    assert!(placed.starts_with("filewall fw -> core:"), "{placed:?}");
    let (body, v) = through(&g, dir.path(), ports, "notes.txt");
    assert_eq!(body, "through the offcode\n");
    assert_eq!(v[0]["proxy"], "filewall");
    assert!(
        v[0]["ops"]["NFSv3 Read"]["replies"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(
        v[0]["rbac"]["allowed"].as_u64().unwrap() >= 1,
        "the chain from the manifest ran: {v}"
    );
    let ls = fw::ganesha::libnfs(
        "nfs-ls",
        &[&fw::ganesha::nfs_url(&g.export, "", ports.0, ports.1)],
    );
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains(".filewall"),
        "{ls:?}"
    );
}

#[test]
fn filewall_runs_on_a_peer_node() {
    let _s = serial();
    let Some(g) = fw::ganesha::Ganesha::start() else {
        return;
    };
    std::fs::write(g.export.join("far.txt"), "from a node of its own\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = format!("127.0.0.1:{}", free_port());
    let sock = dir.path().join("peer.sock");
    let _peer = Guard(
        bin()
            .current_dir(repo())
            .args(["daemon", "--name", "peer", "--listen", &node, "--socket"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(|| TcpStream::connect(&node).is_ok(), 20),
        "the peer never listened"
    );
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(
        &nodes,
        format!("[[node]]\nname = \"peer\"\naddr = \"{node}\"\n"),
    )
    .unwrap();
    let ports = (free_port(), free_port());
    let m = manifest(dir.path(), &g, ports, &["node"]);
    let (_run, placed) = deploy(&m, &["--for", "60s", "--nodes", nodes.to_str().unwrap()]);
    assert!(placed.starts_with("filewall fw -> node:"), "{placed:?}");
    let (body, v) = through(&g, dir.path(), ports, "far.txt");
    assert_eq!(body, "from a node of its own\n");
    assert!(
        v[0]["ops"]["NFSv3 Read"]["replies"].as_u64().unwrap() >= 1,
        "{v}"
    );
}
