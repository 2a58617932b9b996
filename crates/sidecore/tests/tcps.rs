//! `sidecore tcps` end to end through the binary: `serve` a directory with a
//! PPE on a dedicated CPU, answer real HTTP/1.1 requests over loopback (200,
//! 404, 400 for a malformed request line), add a second PPE and remove it
//! while a keep-alive connection stays open and keeps being answered, refuse
//! to remove the master by name, and report it all in `stats --json`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// One request on `s`; the response's status line and body (by Content-Length).
fn get(s: &mut TcpStream, request: &str) -> (String, Vec<u8>) {
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-header: {buf:?}");
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head.lines().next().unwrap_or_default().to_string(), body)
}

fn ctl(sock: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let o = bin()
        .args(["tcps"])
        .args(args)
        .arg("--control")
        .arg(sock)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    (o.status.code(), format!("{out}{err}"))
}

#[test]
fn serve_answers_http_and_ppes_come_and_go_under_a_live_connection() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    let page: Vec<u8> = (0..32 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("page.bin"), &page).unwrap();
    let sock = dir.path().join("tcps.sock");
    let port = free_port();
    let child = bin()
        .args(["tcps", "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--root")
        .arg(&root)
        .args([
            "--allowed",
            "0-1",
            "--master",
            "1",
            "--app-cpu",
            "0",
            "--for",
            "60s",
        ])
        .arg("--control")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _g = Guard(child);
    assert!(wait_for(
        || TcpStream::connect(("127.0.0.1", port)).is_ok() && sock.exists(),
        20
    ));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = "GET /page.bin HTTP/1.1\r\nHost: x\r\n\r\n";
    let (status, body) = get(&mut s, req);
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(body, page);
    let (status, _) = get(&mut s, "GET /missing HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(status.contains(" 404"), "{status}");

    // A second PPE joins and leaves while the connection stays open.
    let (code, out) = ctl(&sock, &["ppe", "add", "0"]);
    assert_eq!(code, Some(0), "{out}");
    let (_, stats) = ctl(&sock, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stats.trim()).unwrap();
    assert_eq!(v["active_ppe"], serde_json::json!([0, 1]), "{v}");
    for _ in 0..5 {
        let (status, body) = get(&mut s, req);
        assert!(status.contains(" 200"), "{status}");
        assert_eq!(body.len(), page.len());
    }
    let (code, out) = ctl(&sock, &["ppe", "remove", "1"]);
    assert_eq!(code, Some(1), "removing the master is refused: {out}");
    assert!(out.contains("master"), "{out}");
    let (code, out) = ctl(&sock, &["ppe", "remove", "0"]);
    assert_eq!(code, Some(0), "{out}");
    let (status, body) = get(&mut s, req);
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(body, page);

    // A malformed request line: 400, counted.
    let mut bad = TcpStream::connect(("127.0.0.1", port)).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, _) = get(&mut bad, "BLAH\r\n\r\n");
    assert!(status.contains(" 400"), "{status}");
    let (_, stats) = ctl(&sock, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stats.trim()).unwrap();
    assert_eq!(v["active_ppe"], serde_json::json!([1]), "{v}");
    assert_eq!(v["app"]["http_200"], 7, "{v}");
    assert_eq!(v["app"]["http_404"], 1, "{v}");
    assert!(v["app"]["http_400"].as_u64().unwrap_or(0) >= 1, "{v}");
}
