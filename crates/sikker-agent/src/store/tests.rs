//! The policy sources against real files and a real etcd (Debian's
//! `etcd-server`, which scripts/setup.sh installs): the first policy, every
//! change, errors located, an outage reported once, and the watch resumed.

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
        PolicyUpdate::Policy { source, policy } => (source, policy.services.len()),
        other => panic!("expected a policy, got {other:?}"),
    }
}

#[track_caller]
fn invalid(u: PolicyUpdate, want: &str) {
    match u {
        PolicyUpdate::Invalid { errors, .. } => {
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
        PolicyUpdate::Unavailable { source, why } => {
            assert_eq!(source, path.display().to_string());
            assert!(why.contains("No such file"), "{why}");
        }
        other => panic!("expected the file to be unavailable, got {other:?}"),
    }
    quiet(&rx, 3 * FILE_POLL.as_millis() as u64);
    std::fs::write(&path, GOOD).unwrap();
    assert_eq!(
        next(&rx),
        PolicyUpdate::Restored {
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
        },
        tx,
    );
    invalid(next(&rx), "holds no policy (no such key");
    let r1 = put(&ep, key, GOOD).unwrap();
    let (source, n) = services(next(&rx));
    assert_eq!(n, 1);
    assert!(
        source.contains("etcd key /test/sikker/policy at http://127.0.0.1:"),
        "{source}"
    );
    assert!(put(&ep, key, BROKEN).unwrap() > r1);
    invalid(
        next(&rx),
        "etcd:/test/sikker/policy:5:1: unknown field `bogus`",
    );
    put(&ep, key, &two()).unwrap();
    assert_eq!(services(next(&rx)).1, 2);
    // The same text again is no change.
    put(&ep, key, &two()).unwrap();
    quiet(&rx, 500);

    // etcd goes away: said once, however long it stays away.
    etcd.stop();
    match next(&rx) {
        PolicyUpdate::Unavailable { why, .. } => {
            assert!(
                why.contains("the last good policy keeps enforcing"),
                "{why}"
            );
        }
        other => panic!("expected etcd to be unavailable, got {other:?}"),
    }
    assert!(put(&ep, key, GOOD).is_err(), "a put with etcd down fails");
    quiet(&rx, 2500);
    // Back: the key is read again (unchanged: nothing to apply), and the
    // watch goes on.
    etcd.restart().unwrap();
    assert!(matches!(next(&rx), PolicyUpdate::Restored { .. }));
    quiet(&rx, 500);
    put(&ep, key, GOOD).unwrap();
    assert_eq!(services(next(&rx)).1, 1);
    assert_eq!(
        Etcd::new(&ep).get_value(key).unwrap().as_deref(),
        Some(GOOD.as_bytes())
    );
}

#[test]
fn an_etcd_that_never_answers_is_reported_with_every_endpoint() {
    let e = put(&["127.0.0.1:1".into()], "/k", "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("etcd unreachable: http://127.0.0.1:1/v3/kv/put: "),
        "{e}"
    );
    let e = Etcd::new(&[]).get_value("/k").unwrap_err().to_string();
    assert_eq!(e, "etcd has no endpoint");
}
