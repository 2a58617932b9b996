//! The policy sources against real files and a real etcd (Debian's
//! `etcd-server`, which scripts/setup.sh installs): the first policy, every
//! change, errors located, an outage reported once, and the watch resumed;
//! a placement beside it, handed on as located text; and an etcd that
//! speaks only TLS with client certificates.

use std::sync::mpsc::{Receiver, channel};

use super::*;

const GOOD: &str = "[[service]]\nname = \"kvs\"\ndomains = [\"Get\"]\nprocess_count = 1\n";
const BROKEN: &str =
    "[[service]]\nname = \"kvs\"\ndomains = [\"Get\"]\nprocess_count = 1\nbogus = 3\n";

fn two() -> String {
    format!("{GOOD}[[service]]\nname = \"web\"\nprocess_count = 1\n")
}

#[track_caller]
fn next(rx: &Receiver<PolicyUpdate>) -> PolicyUpdate {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("an update within 10 s")
}

#[track_caller]
fn services(u: PolicyUpdate) -> (String, usize) {
    match u {
        Update::Doc { source, doc } => (source, doc.services.len()),
        other => panic!("expected a policy, got {other:?}"),
    }
}

#[track_caller]
fn invalid(u: PolicyUpdate, want: &str) {
    match u {
        Update::Invalid { errors, .. } => {
            assert!(errors.contains(want), "expected `{want}` in `{errors}`");
        }
        other => panic!("expected an invalid policy, got {other:?}"),
    }
}

#[track_caller]
fn quiet(rx: &Receiver<PolicyUpdate>, ms: u64) {
    if let Ok(u) = rx.recv_timeout(Duration::from_millis(ms)) {
        panic!("expected nothing more, got {u:?}");
    }
}

#[test]
fn a_file_is_watched_and_its_errors_located() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, GOOD).unwrap();
    let (tx, rx) = channel();
    let _w = watch(PolicySource::File(path.clone()), tx);
    assert_eq!(services(next(&rx)), (path.display().to_string(), 1));
    quiet(&rx, 3 * FILE_POLL.as_millis() as u64);
    std::fs::write(&path, two()).unwrap();
    assert_eq!(services(next(&rx)).1, 2);
    std::fs::write(&path, BROKEN).unwrap();
    invalid(
        next(&rx),
        &format!("{}:5:1: unknown field `bogus`", path.display()),
    );
    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    invalid(next(&rx), "not UTF-8 text");
    // Gone: said once.
    std::fs::remove_file(&path).unwrap();
    match next(&rx) {
        Update::Unavailable { source, why } => {
            assert_eq!(source, path.display().to_string());
            assert!(why.contains("No such file"), "{why}");
        }
        other => panic!("expected the file to be unavailable, got {other:?}"),
    }
    quiet(&rx, 3 * FILE_POLL.as_millis() as u64);
    std::fs::write(&path, GOOD).unwrap();
    assert_eq!(
        next(&rx),
        Update::Restored {
            source: path.display().to_string()
        }
    );
    assert_eq!(services(next(&rx)).1, 1);
}

#[test]
fn an_etcd_key_is_watched_across_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = LocalEtcd::start(&dir.path().join("etcd")).unwrap();
    let ep = vec![etcd.endpoint()];
    let key = "/test/sikker/policy";
    let (tx, rx) = channel();
    let _w = watch(
        PolicySource::Etcd {
            endpoints: ep.clone(),
            key: key.into(),
            access: EtcdAccess::default(),
        },
        tx,
    );
    assert!(matches!(next(&rx), Update::Missing { .. }));
    let r1 = put(&ep, &open(), key, GOOD).unwrap();
    let (source, n) = services(next(&rx));
    assert_eq!(n, 1);
    assert!(
        source.contains("etcd key /test/sikker/policy at http://127.0.0.1:"),
        "{source}"
    );
    assert!(put(&ep, &open(), key, BROKEN).unwrap() > r1);
    invalid(
        next(&rx),
        "etcd:/test/sikker/policy:5:1: unknown field `bogus`",
    );
    put(&ep, &open(), key, &two()).unwrap();
    assert_eq!(services(next(&rx)).1, 2);
    // The same text again is no change.
    put(&ep, &open(), key, &two()).unwrap();
    quiet(&rx, 500);

    // etcd goes away: said once, however long it stays away.
    etcd.stop();
    match next(&rx) {
        Update::Unavailable { why, .. } => {
            assert!(why.contains("the last good policy stays in force"), "{why}");
        }
        other => panic!("expected etcd to be unavailable, got {other:?}"),
    }
    assert!(
        put(&ep, &open(), key, GOOD).is_err(),
        "a put with etcd down fails"
    );
    quiet(&rx, 2500);
    // Back: the key is read again (unchanged: nothing to apply), and the
    // watch goes on.
    etcd.restart().unwrap();
    assert!(matches!(next(&rx), Update::Restored { .. }));
    quiet(&rx, 500);
    put(&ep, &open(), key, GOOD).unwrap();
    assert_eq!(services(next(&rx)).1, 1);
    assert_eq!(
        Etcd::new(&ep).get_value(key).unwrap().as_deref(),
        Some(GOOD.as_bytes())
    );
}

#[test]
fn an_etcd_that_never_answers_is_reported_with_every_endpoint() {
    let e = put(&["127.0.0.1:1".into()], &open(), "/k", "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("etcd unreachable: http://127.0.0.1:1/v3/kv/put: "),
        "{e}"
    );
    let e = Etcd::new(&[]).get_value("/k").unwrap_err().to_string();
    assert_eq!(e, "etcd has no endpoint");
}

#[track_caller]
fn placement_text(rx: &Receiver<PlacementUpdate>) -> Text {
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Update::Doc { doc, .. }) => doc,
        other => panic!("expected a placement, got {other:?}"),
    }
}

const PLACED: &str = "[[host]]\nname = \"h1\"\nagent = \"10.0.0.1:7411\"\n";

#[test]
fn a_placement_is_watched_beside_the_policy_in_one_etcd_and_in_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = LocalEtcd::start(&dir.path().join("etcd")).unwrap();
    let ep = vec![etcd.endpoint()];
    put(&ep, &open(), DEFAULT_ETCD_KEY, GOOD).unwrap();
    put(&ep, &open(), DEFAULT_ETCD_PLACEMENT_KEY, PLACED).unwrap();
    let at = |key: &str| Source::Etcd {
        endpoints: ep.clone(),
        key: key.into(),
        access: EtcdAccess::default(),
    };
    let (ptx, prx) = channel();
    let (tx, rx) = channel();
    let _p = watch(at(DEFAULT_ETCD_KEY), ptx);
    let _w = watch_doc(at(DEFAULT_ETCD_PLACEMENT_KEY), PLACEMENT, tx);
    assert_eq!(services(next(&prx)).1, 1);
    let t = placement_text(&rx);
    assert_eq!(t.name, "etcd:/sidecore/sikker/placement");
    assert_eq!(t.text, PLACED);
    // A change to one key reaches only its own watch.
    let moved = PLACED.replace("10.0.0.1", "10.0.0.2");
    put(&ep, &open(), DEFAULT_ETCD_PLACEMENT_KEY, &moved).unwrap();
    assert_eq!(placement_text(&rx).text, moved);
    quiet(&prx, 300);
    // Not UTF-8: invalid, located by its key; deleted: missing.
    Etcd::new(&ep)
        .put(DEFAULT_ETCD_PLACEMENT_KEY, &[0xff, 0xfe])
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Update::Invalid { errors, .. }) => assert!(
            errors.contains("etcd key /sidecore/sikker/placement at http://127.0.0.1:")
                && errors.contains("not UTF-8"),
            "{errors}"
        ),
        other => panic!("expected an invalid placement, got {other:?}"),
    }
    let v = Etcd::new(&ep)
        .call(
            "/v3/kv/deleterange",
            &json!({"key": B64.encode(DEFAULT_ETCD_PLACEMENT_KEY)}),
        )
        .unwrap();
    assert_eq!(int(&v["deleted"]), 1, "{v}");
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(Update::Missing { .. })
    ));
    // The same reader for a file (the one-node store).
    let file = dir.path().join("placement.toml");
    std::fs::write(&file, PLACED).unwrap();
    let (tx, rx) = channel();
    let _f = watch_doc(Source::File(file.clone()), PLACEMENT, tx);
    let t = placement_text(&rx);
    assert_eq!(
        (t.name, t.text),
        (file.display().to_string(), PLACED.into())
    );
}

#[test]
fn an_etcd_over_tls_is_read_and_written_with_a_client_certificate_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, other) = (dir.path().join("certs"), dir.path().join("other"));
    crate::tls::generate(&certs, &["127.0.0.1".into(), "agent".into()]).unwrap();
    crate::tls::generate(&other, &["agent".into()]).unwrap();
    let client_of = |d: &std::path::Path, cert: bool| {
        let (c, k) = (d.join("agent.pem"), d.join("agent.key"));
        EtcdTls::load(
            &d.join("ca.pem"),
            cert.then_some((c.as_path(), k.as_path())),
        )
        .unwrap()
    };
    let client = client_of(&certs, true);
    let server = (certs.join("127.0.0.1.pem"), certs.join("127.0.0.1.key"));
    let _etcd = LocalEtcd::start_tls(
        &dir.path().join("etcd"),
        std::net::Ipv4Addr::LOCALHOST.into(),
        (&server.0, &server.1),
        &certs.join("ca.pem"),
        client.clone(),
    )
    .unwrap();
    let ep = vec![_etcd.endpoint()];
    assert!(ep[0].starts_with("https://127.0.0.1:"), "{ep:?}");
    put(&ep, &over(Some(&client)), "/k", "over tls").unwrap();
    let read = |tls: Option<&EtcdTls>| Etcd::with_tls(&ep, tls).get_value("/k");
    assert_eq!(
        read(Some(&client)).unwrap().as_deref(),
        Some(&b"over tls"[..])
    );
    // Refused: plain HTTP, no client certificate, and a client whose
    // authority did not sign etcd's certificate (nor its own).
    let anon = client_of(&certs, false);
    let stranger = client_of(&other, true);
    for (who, tls) in [
        ("plain", None),
        ("anonymous", Some(&anon)),
        ("stranger", Some(&stranger)),
    ] {
        let e = put(&ep, &over(tls), "/k", "overwritten")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("etcd unreachable: https://127.0.0.1:"),
            "{who}: {e}"
        );
    }
    let e = put(&ep, &over(Some(&stranger)), "/k", "x")
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert_eq!(
        read(Some(&client)).unwrap().as_deref(),
        Some(&b"over tls"[..])
    );
    // Bad files are named.
    let missing = dir.path().join("nope.pem");
    let e = EtcdTls::load(&missing, None).unwrap_err();
    assert_eq!(e.path, missing);
    let e = EtcdTls::load(
        &certs.join("ca.pem"),
        Some((&certs.join("agent.pem"), &certs.join("ca.pem"))),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("ca.pem: not a PEM private key"),
        "{e}"
    );
    let e = EtcdTls::load(&certs.join("agent.key"), None).unwrap_err();
    assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
}

/// Plain HTTP, nobody.
fn open() -> EtcdAccess {
    EtcdAccess::default()
}

/// Over `tls`, nobody.
fn over(tls: Option<&EtcdTls>) -> EtcdAccess {
    EtcdAccess {
        tls: tls.cloned(),
        auth: None,
    }
}

/// An etcd with authentication on: a reader granted the policy's prefix
/// reads and watches it, the writer stores it, and each refusal — no user,
/// a wrong password, a user without the right to write — is a clear error
/// naming the user and what etcd said; a token etcd has forgotten (it was
/// expired) is traded again without the caller seeing it.
#[test]
fn an_etcd_with_authentication_is_read_by_its_users_and_refuses_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = LocalEtcd::start(&dir.path().join("etcd")).unwrap();
    let ep = vec![etcd.endpoint()];
    let mut admin = Etcd::new(&ep);
    admin.enable_auth("root-pw").unwrap();
    admin
        .add_user("agent", "agent-pw", "/sidecore/sikker/", false)
        .unwrap();
    admin
        .add_user("operator", "op-pw", "/sidecore/sikker/", true)
        .unwrap();
    let as_user = |user: &str, pw: &str| EtcdAccess {
        tls: None,
        auth: Some(EtcdAuth::new(user, pw)),
    };
    put(&ep, &as_user("operator", "op-pw"), DEFAULT_ETCD_KEY, GOOD).unwrap();
    let mut reader = Etcd::with_access(&ep, &as_user("agent", "agent-pw"));
    assert_eq!(
        reader.get_value(DEFAULT_ETCD_KEY).unwrap().as_deref(),
        Some(GOOD.as_bytes())
    );
    // Nobody: etcd says the user name is empty, and the error says what to give.
    let e = put(&ep, &open(), DEFAULT_ETCD_KEY, GOOD)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("user name is empty") && e.contains("--etcd-user"),
        "{e}"
    );
    let e = put(&ep, &as_user("agent", "wrong"), DEFAULT_ETCD_KEY, GOOD)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("authentication as user `agent` failed") && !e.contains("wrong"),
        "{e}"
    );
    let e = put(&ep, &as_user("agent", "agent-pw"), DEFAULT_ETCD_KEY, BROKEN)
        .unwrap_err()
        .to_string();
    assert!(e.contains("permission denied"), "{e}");
    // The agent's watch, as its user, sees the policy and then a change.
    let (tx, rx) = std::sync::mpsc::channel();
    let src = Source::Etcd {
        endpoints: ep.clone(),
        key: DEFAULT_ETCD_KEY.into(),
        access: as_user("agent", "agent-pw"),
    };
    let _w = watch(src, tx);
    let first = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
    assert!(matches!(first, Update::Doc { .. }), "{first:?}");
    put(&ep, &as_user("operator", "op-pw"), DEFAULT_ETCD_KEY, BROKEN).unwrap();
    let next = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
    assert!(matches!(next, Update::Invalid { .. }), "{next:?}");
    // A token etcd does not know (expired after --auth-token-ttl; etcd
    // restores its tokens from its log on a restart, so one cannot be made
    // stale that way here) is refused with 401, a new one traded, and the
    // read goes through.
    let old = Some("expired.1".to_string());
    reader.token.clone_from(&old);
    assert_eq!(
        reader.get_value(DEFAULT_ETCD_KEY).unwrap().as_deref(),
        Some(BROKEN.as_bytes())
    );
    assert!(
        reader.token.is_some() && reader.token != old,
        "a new token was traded"
    );
    // The password is never printed.
    let shown = format!("{:?}", as_user("agent", "agent-pw"));
    assert!(
        shown.contains("agent") && !shown.contains("agent-pw"),
        "{shown}"
    );
}

#[test]
fn a_password_file_is_read_and_its_faults_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pw");
    std::fs::write(&f, "s3cret\n").unwrap();
    assert_eq!(
        EtcdAuth::from_file("agent", &f).unwrap(),
        EtcdAuth::new("agent", "s3cret")
    );
    std::fs::write(&f, "\nlater").unwrap();
    let e = EtcdAuth::from_file("agent", &f).unwrap_err().to_string();
    assert!(
        e.contains("pw: the first line (the password) is empty"),
        "{e}"
    );
    let e = EtcdAuth::from_file("agent", &dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--etcd-password-file ") && e.contains("nope"),
        "{e}"
    );
}
