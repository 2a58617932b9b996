//! End to end with the RBAC case study (§4.5): the seed's policy 𝓕
//! (`examples/filewall/rbac.toml`) in the chain `rbac, stats` in front of
//! nfs-ganesha, with a clock the test sets. Through ordinary NFS calls (a codec
//! client as several UIDs, and libnfs's nfs-ls and nfs-cat):
//! - writing a role to `/.filewall/roles/ctrl` changes what a READ returns
//!   (root takes admin and can read `secret.txt`; bob may take admin only in the
//!   delegation window; alice asking for admin becomes a threat, denied
//!   everything until root lifts her through `users/ctrl`);
//! - a denied WRITE or REMOVE never reaches the server (its file, on disk, is
//!   unchanged), an allowed one lands, performed as the file's owner;
//! - a shadow file shows and changes a file's permissions, for its owner only;
//! - shadow permissions, assignment changes and threats survive a FileWall
//!   restart (redb store), and handles issued before it still work.
//!
//! Skips without ganesha or root, unless `SIDECORE_REQUIRE_ROOT` is set.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::client::Client;
use common::ganesha::{Ganesha, libnfs, nfs_url};
use sidecore_filewall::message::{CallArgs, ReplyResults};
use sidecore_filewall::nfs3::{self, DirOpArgs3, Nfs3Call, Nfs3Reply, NfsFh3, NfsStat3};
use sidecore_filewall::policy::load_chain;
use sidecore_filewall::proxy::{Backend, Listen, Proxy, ProxyConfig};
use sidecore_filewall::{mount, vcn};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const ROOT: u32 = 0;
const ALICE: u32 = 1001;
const BOB: u32 = 1002;
const CHARLES: u32 = 1003;

/// 2026-11-23 (a Monday) at h:00 UTC.
fn at(h: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_795_392_000 + h * 3600)
}

struct Setup {
    g: Ganesha,
    conf: tempfile::TempDir,
    clock: Arc<Mutex<SystemTime>>,
}

impl Setup {
    fn new() -> Option<Setup> {
        let g = Ganesha::start()?;
        for (name, owner, body) in [
            ("notes.txt", ALICE, "alice's notes\n"),
            ("secret.txt", ROOT, "the root secret\n"),
        ] {
            let p = g.export.join(name);
            std::fs::write(&p, body).expect("writing a served file");
            chown(&p, Some(owner), Some(owner)).expect("chown");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        let conf = tempfile::tempdir().expect("a temporary directory");
        let example = Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
            .join("../../examples/filewall/rbac.toml");
        std::fs::write(
            conf.path().join("chain.toml"),
            format!(
                "[[policy]]\nkind = \"rbac\"\npolicy = {:?}\nstore = \"state.redb\"\n\n[[policy]]\nkind = \"stats\"\n",
                example.display().to_string()
            ),
        )
        .expect("writing the chain");
        Some(Setup {
            g,
            conf,
            clock: Arc::new(Mutex::new(at(12))),
        })
    }

    fn chain(&self) -> PathBuf {
        self.conf.path().join("chain.toml")
    }

    fn start(&self) -> Proxy {
        let mut c = ProxyConfig::with(
            vec![
                Listen::tcp(LOCAL).serving(&[nfs3::PROGRAM]),
                Listen::tcp(LOCAL).serving(&[mount::PROGRAM]),
            ],
            vec![Backend::nfs_mount(self.g.nfs_addr(), self.g.mount_addr())],
        );
        c.chain = load_chain(&self.chain()).expect("the chain loads");
        let clock = self.clock.clone();
        c.clock = Some(Arc::new(move || {
            *clock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }));
        Proxy::start(c).expect("starting the proxy")
    }

    fn set_clock(&self, t: SystemTime) {
        *self.clock.lock().expect("the clock") = t;
    }

    fn on_disk(&self, name: &str) -> String {
        std::fs::read_to_string(self.g.export.join(name)).unwrap_or_default()
    }
}

/// Clients of one proxy: NFS and the root handle from MNT.
fn connect(p: &Proxy, export: &Path) -> (Client, NfsFh3) {
    let mut m = Client::connect(p.local_addrs()[1]);
    let root = m.mnt(export);
    (Client::connect(p.local_addrs()[0]), root)
}

fn text(c: &mut Client, uid: u32, fh: &NfsFh3) -> (NfsStat3, String) {
    let (st, data) = c.read_all(uid, fh);
    (st, String::from_utf8_lossy(&data).into_owned())
}

#[test]
fn writing_a_role_to_ctrl_changes_what_a_read_returns() {
    let Some(s) = Setup::new() else { return };
    let p = s.start();
    let (mut c, root) = connect(&p, &s.g.export);
    assert_eq!(root.0[0], vcn::TAG_REAL, "handles are virtual");
    let secret = c.walk(ROOT, &root, "secret.txt");
    let ctrl = c.walk(ROOT, &root, ".filewall/roles/ctrl");
    assert_eq!(
        text(&mut c, ROOT, &secret).0,
        NfsStat3::Acces,
        "root starts as user+developer"
    );
    assert!(
        text(&mut c, ROOT, &ctrl)
            .1
            .contains("active: user developer")
    );
    assert_eq!(c.write_at(ROOT, &ctrl, 0, b"admin\n"), NfsStat3::Ok);
    assert!(text(&mut c, ROOT, &ctrl).1.contains("active: admin\n"));
    assert_eq!(
        text(&mut c, ROOT, &secret),
        (NfsStat3::Ok, "the root secret\n".into())
    );
    // Separation of duty: admin never with another role; the session is kept.
    assert_eq!(c.write_at(ROOT, &ctrl, 0, b"admin user\n"), NfsStat3::Acces);
    assert_eq!(text(&mut c, ROOT, &secret).0, NfsStat3::Ok);
    assert_eq!(c.write_at(ROOT, &ctrl, 0, b"ad$min\n"), NfsStat3::Inval);

    // Delegation: bob (developer) may take admin from 17:00 to 09:00 only.
    let notes = c.walk(BOB, &root, "notes.txt");
    s.set_clock(at(18));
    assert_eq!(c.write_at(BOB, &ctrl, 0, b"admin"), NfsStat3::Ok);
    assert_eq!(text(&mut c, BOB, &secret).0, NfsStat3::Ok);
    s.set_clock(at(10));
    assert_eq!(
        text(&mut c, BOB, &secret).0,
        NfsStat3::Acces,
        "the window closed"
    );

    // Escalation: alice (user) asking for admin is a threat, denied everything.
    assert_eq!(text(&mut c, ALICE, &notes).0, NfsStat3::Ok);
    assert_eq!(c.write_at(ALICE, &ctrl, 0, b"admin"), NfsStat3::Acces);
    assert_eq!(text(&mut c, ALICE, &notes).0, NfsStat3::Acces);
    assert_eq!(
        c.write_at(ALICE, &ctrl, 0, b"user"),
        NfsStat3::Acces,
        "no way out alone"
    );
    let users_ctrl = c.walk(ROOT, &root, ".filewall/users/ctrl");
    assert_eq!(
        c.write_at(BOB, &users_ctrl, 0, b"lift alice"),
        NfsStat3::Acces,
        "administrators only"
    );
    assert_eq!(
        c.write_at(ROOT, &users_ctrl, 0, b"lift alice\n"),
        NfsStat3::Ok
    );
    assert_eq!(
        text(&mut c, ALICE, &notes),
        (NfsStat3::Ok, "alice's notes\n".into())
    );
    let stats = p.stats().policies.rbac;
    assert!(
        stats.threats >= 1 && stats.alarms >= 1 && stats.logged >= 1,
        "{stats:#?}"
    );

    // The log is for administrators; it holds the events above.
    let log = c.walk(ROOT, &root, ".filewall/log");
    let (st, l) = text(&mut c, ROOT, &log);
    assert_eq!(st, NfsStat3::Ok);
    for what in [
        "ROLES uid=0",
        "THREAT uid=1001",
        "ALARM uid=1001",
        "LOG uid=0",
        "ADMIN uid=0",
    ] {
        assert!(l.contains(what), "{what} in\n{l}");
    }
    assert_eq!(text(&mut c, CHARLES, &log).0, NfsStat3::Acces);

    // An unmodified client sees the VCN: nfs-ls lists it in the root, and
    // nfs-cat reads secret.txt as uid 0 from 127.0.0.1, the session the codec
    // client made admin. (libnfs 4.0 mounts a URL's directory, so it cannot name
    // files below the export root.)
    let (nfs, mnt) = (p.local_addrs()[0].port(), p.local_addrs()[1].port());
    let ls = libnfs("nfs-ls", &[&nfs_url(&s.g.export, "", nfs, mnt)]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains(".filewall"),
        "{ls:?}"
    );
    let cat = libnfs("nfs-cat", &[&nfs_url(&s.g.export, "secret.txt", nfs, mnt)]);
    assert_eq!(
        String::from_utf8_lossy(&cat.stdout),
        "the root secret\n",
        "{cat:?}"
    );
    assert_eq!(c.write_at(ROOT, &ctrl, 0, b"reset"), NfsStat3::Ok);
    let cat = libnfs("nfs-cat", &[&nfs_url(&s.g.export, "secret.txt", nfs, mnt)]);
    assert!(!cat.status.success() && cat.stdout.is_empty(), "{cat:?}");
}

#[test]
fn a_denied_write_never_reaches_the_server() {
    let Some(s) = Setup::new() else { return };
    let p = s.start();
    let (mut c, root) = connect(&p, &s.g.export);
    let notes = c.walk(ALICE, &root, "notes.txt");
    // WRITE needs developer (Table 4.3): alice's own file, yet refused here.
    assert_eq!(
        c.write_at(ALICE, &notes, 0, b"ALICE WAS HERE"),
        NfsStat3::Acces
    );
    assert_eq!(s.on_disk("notes.txt"), "alice's notes\n");
    let before = p.stats();
    assert_eq!(before.op("NFSv3 Write").calls, 1);
    assert_eq!(before.policies.rbac.denied, 1, "{before:#?}");
    // bob is a developer: his write lands, performed as alice (the owner).
    assert_eq!(c.write_at(BOB, &notes, 0, b"BOB"), NfsStat3::Ok);
    assert_eq!(s.on_disk("notes.txt"), "BOBce's notes\n");
    let meta = std::fs::metadata(s.g.export.join("notes.txt")).expect("stat");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), ALICE);
    // REMOVE is for the owner: bob is refused (the LOOKUP FileWall makes to find
    // the object is its own), the file stays; alice removes it.
    let remove = |c: &mut Client, uid| {
        let args = DirOpArgs3 {
            dir: root.clone(),
            name: b"notes.txt".to_vec(),
        };
        match c.call_as(uid, CallArgs::Nfs3(Nfs3Call::Remove(args))) {
            ReplyResults::Nfs3(Nfs3Reply::Remove(r)) => r.status(),
            other => panic!("REMOVE: {other:?}"),
        }
    };
    assert_eq!(remove(&mut c, BOB), NfsStat3::Acces);
    assert!(s.g.export.join("notes.txt").exists());
    assert_eq!(remove(&mut c, ALICE), NfsStat3::Ok);
    assert!(!s.g.export.join("notes.txt").exists());
    // A handle FileWall never issued (ganesha's own) is refused, unanswered by it.
    let real = NfsFh3(root.0[1..].to_vec());
    assert_eq!(
        c.lookup_as(ROOT, &real, "secret.txt").0,
        NfsStat3::BadHandle
    );
    let s2 = p.stats();
    assert_eq!(s2.policies.bad_handles, 1);
    assert!(s2.policies.rbac.injected >= 1, "{s2:#?}");
}

#[test]
fn shadow_permissions_and_state_survive_a_restart() {
    let Some(s) = Setup::new() else { return };
    let (notes, shadow, root) = {
        let p = s.start();
        let (mut c, root) = connect(&p, &s.g.export);
        let notes = c.walk(ALICE, &root, "notes.txt");
        let shadow = c.walk(ALICE, &root, ".filewall/shadow/notes.txt");
        let (st, t) = text(&mut c, ALICE, &shadow);
        assert_eq!(st, NfsStat3::Ok);
        assert!(
            t.contains("owner uid 1001") && t.contains("WRITE allow=developer"),
            "{t}"
        );
        // The shadow directory lists the real one.
        let shadow_dir = c.walk(ALICE, &root, ".filewall/shadow");
        let (_, names) = c.list(ALICE, &shadow_dir);
        assert!(names.iter().any(|(n, _)| n == "secret.txt"), "{names:?}");
        // Only the owner may change permissions.
        assert_eq!(
            c.write_at(BOB, &shadow, 0, b"READ allow=nobody\n"),
            NfsStat3::Acces
        );
        assert_eq!(
            c.write_at(ALICE, &shadow, 0, b"WRITE allow=user\n"),
            NfsStat3::Ok
        );
        assert!(text(&mut c, ALICE, &shadow).1.contains("WRITE allow=user"));
        assert_eq!(c.write_at(ALICE, &notes, 0, b"ALICE"), NfsStat3::Ok);
        assert_eq!(
            c.write_at(ALICE, &shadow, 0, b"WRITE allow=boss\n"),
            NfsStat3::Inval
        );
        // An assignment change and a threat.
        let users_ctrl = c.walk(ROOT, &root, ".filewall/users/ctrl");
        let roles_ctrl = c.walk(ROOT, &root, ".filewall/roles/ctrl");
        assert_eq!(c.write_at(ROOT, &roles_ctrl, 0, b"admin"), NfsStat3::Ok);
        assert_eq!(
            c.write_at(ROOT, &users_ctrl, 0, b"assign charles admin\n"),
            NfsStat3::Ok
        );
        assert_eq!(c.write_at(BOB, &roles_ctrl, 0, b"admin"), NfsStat3::Acces);
        assert_eq!(
            text(&mut c, BOB, &notes).0,
            NfsStat3::Acces,
            "bob is a threat"
        );
        (notes, shadow, root)
    };
    assert_eq!(s.on_disk("notes.txt"), "ALICE's notes\n");
    // A new FileWall on the same store: old handles, permissions, threats.
    let p = s.start();
    let (mut c, _) = connect(&p, &s.g.export);
    assert!(text(&mut c, ALICE, &shadow).1.contains("WRITE allow=user"));
    assert_eq!(c.write_at(ALICE, &notes, 0, b"AGAIN"), NfsStat3::Ok);
    assert_eq!(s.on_disk("notes.txt"), "AGAIN's notes\n");
    assert_eq!(
        text(&mut c, BOB, &notes).0,
        NfsStat3::Acces,
        "still a threat"
    );
    let roles_ctrl = c.walk(CHARLES, &root, ".filewall/roles/ctrl");
    assert_eq!(
        c.write_at(CHARLES, &roles_ctrl, 0, b"admin"),
        NfsStat3::Ok,
        "assigned before the restart"
    );
    let secret = c.walk(CHARLES, &root, "secret.txt");
    assert_eq!(text(&mut c, CHARLES, &secret).0, NfsStat3::Ok);
}
