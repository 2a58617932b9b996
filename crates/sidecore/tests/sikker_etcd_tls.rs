//! `sidecore sikker` against an etcd that speaks only TLS and demands client
//! certificates: `sikker certs` makes the authority, etcd's certificate (for
//! its IP address) and an agent's; `put-policy` and `put-placement` store
//! over TLS, and an agent reads both from there. Refused, each with its
//! reason: `https://` without `--etcd-ca`, `--etcd-ca` with plain endpoints,
//! no client certificate, and an authority file that does not exist.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::process::Stdio;

use common::*;
use sidecore_sikker_agent::store::{EtcdTls, LocalEtcd};

/// Certificates from `sikker certs` in `d/certs`, an etcd on loopback that
/// serves only TLS with them, and a policy and a placement to store.
fn start(d: &std::path::Path) -> (LocalEtcd, [std::path::PathBuf; 3]) {
    let certs = d.join("certs");
    let c = certs.to_str().unwrap();
    let o = run(&["sikker", "certs", "--out", c, "127.0.0.1", "h1"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let (ca, cert, key) = (
        certs.join("ca.pem"),
        certs.join("h1.pem"),
        certs.join("h1.key"),
    );
    let probe = EtcdTls::load(&ca, Some((&cert, &key))).unwrap();
    let server = (certs.join("127.0.0.1.pem"), certs.join("127.0.0.1.key"));
    let etcd = LocalEtcd::start_tls(
        &d.join("etcd"),
        std::net::Ipv4Addr::LOCALHOST.into(),
        (&server.0, &server.1),
        &ca,
        probe,
    )
    .unwrap();
    std::fs::write(
        d.join("policy.toml"),
        "[[service]]\nname = \"a\"\ndomains = [\"In\"]\n[[service.process]]\nid = 1\ncgroup = \"/sc-tls-a\"\n",
    )
    .unwrap();
    std::fs::write(
        d.join("placement.toml"),
        "[[host]]\nname = \"h1\"\nprocesses = [\"a:1\"]\n",
    )
    .unwrap();
    (etcd, [ca, cert, key])
}

#[test]
fn put_and_the_agent_reach_an_etcd_over_tls_and_bad_tls_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (etcd, [ca, cert, key]) = start(d);
    let ep = etcd.endpoint();
    let (policy, placement) = (d.join("policy.toml"), d.join("placement.toml"));
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let tls = ["--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key-file", key];
    let with = |cmd: &str, extra: &[&str], file: &std::path::Path| {
        let mut a = vec!["sikker", cmd, "--etcd", ep.as_str()];
        a.extend_from_slice(extra);
        a.push(file.to_str().unwrap());
        run(&a)
    };
    // Stored over TLS; the placement is checked against the policy read
    // back over TLS.
    for (cmd, file) in [("put-policy", &policy), ("put-placement", &placement)] {
        let o = with(cmd, &tls, file);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{cmd}: {out}{err}");
        assert!(out.starts_with("stored "), "{out}");
    }
    // An agent reads both from there.
    let log = d.join("agent.log");
    let sock = d.join("agent.sock");
    let mut args = vec![
        "sikker",
        "agent",
        "--host",
        "h1",
        "--socket",
        sock.to_str().unwrap(),
        "--etcd",
        ep.as_str(),
    ];
    args.extend_from_slice(&tls);
    let _agent = Guard(
        bin()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let from = format!("policy from etcd key /sidecore/sikker/policy at {ep}");
    assert!(wait_for(|| read().contains(&from), 20), "{}", read());
    assert!(wait_for(|| sock.exists(), 10), "{}", read());

    // Refused, each with its reason, and nothing stored.
    let refused = |extra: &[&str], endpoint: &str, why: &str| {
        let mut a = vec!["sikker", "put-policy", "--etcd", endpoint];
        a.extend_from_slice(extra);
        a.push(policy.to_str().unwrap());
        let o = run(&a);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{extra:?}: {out}");
        assert!(err.contains(why), "{extra:?}: expected `{why}` in {err}");
    };
    refused(&[], &ep, "https:// needs --etcd-ca FILE");
    let plain = ep.replacen("https://", "http://", 1);
    refused(
        &["--etcd-ca", ca],
        &plain,
        "--etcd-ca is for https:// endpoints",
    );
    refused(
        &["--etcd-ca", ca],
        &ep,
        "etcd unreachable: https://127.0.0.1:",
    );
    let missing = d.join("missing.pem");
    refused(
        &["--etcd-ca", missing.to_str().unwrap()],
        &ep,
        &format!("{}: No such file", missing.display()),
    );
}
