//! Metachory's live migration end to end (issue 16): `sidecore migrate PID
//! --to NODE` between two real daemons, each in its own network namespace
//! (on one bridge, so that they reach each other as servers do) with a
//! private /tmp that holds none of the client's files. A C program that
//! keeps state — a heap buffer it checksums, a counter it prints every
//! 10 ms, a floating-point sum — moves back and forth five times (ten
//! migrations, eager and lazy in turn) while `sidecore exec` carries its
//! output: no line is missing or repeated, the checksum holds, and the
//! client exits with the guest's own status. Faults: a multi-threaded guest
//! is refused by name and runs on; a target that dies in the middle of a
//! migration leaves the guest running on its source; a malformed image on
//! the page stream gets an error naming its sender.
//!
//! Needs root (namespaces, FUSE, ptrace, userfaultfd); skips without it
//! unless `SIDECORE_REQUIRE_ROOT` is set, where it fails instead.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mx::{daemon, ip, one, root};
use common::{Guard, wait_for};
use sidecore_wire::frame::FrameEncoder;
use sidecore_wire::mx_msg::{MxAttr, MxBody, MxFrame};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sidecore"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn quiet(args: &[&str]) {
    let _ = Command::new("ip").args(args).output();
}

/// A bridge in this namespace with one namespace per node on it.
struct Lan {
    nodes: Vec<(String, String)>,
}

const BRIDGE: &str = "scmxbr0";

impl Lan {
    fn new(nodes: &[(&str, &str)]) -> Lan {
        Self::clean(nodes.iter().map(|(n, _)| (*n).to_string()));
        ip(&["link", "add", BRIDGE, "type", "bridge"]);
        ip(&["addr", "add", "10.231.12.1/24", "dev", BRIDGE]);
        ip(&["link", "set", BRIDGE, "up"]);
        for (i, (ns, addr)) in nodes.iter().enumerate() {
            let (a, b) = (format!("scmxm{i}a"), format!("scmxm{i}b"));
            ip(&["netns", "add", ns]);
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
            ip(&["link", "set", &b, "netns", ns]);
            ip(&["link", "set", &a, "master", BRIDGE]);
            ip(&["link", "set", &a, "up"]);
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", &b]);
            ip(&["-n", ns, "link", "set", &b, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        Lan {
            nodes: nodes
                .iter()
                .map(|(n, a)| ((*n).to_string(), (*a).to_string()))
                .collect(),
        }
    }

    fn clean(names: impl Iterator<Item = String>) {
        for (i, ns) in names.enumerate() {
            quiet(&["link", "del", &format!("scmxm{i}a")]);
            quiet(&["netns", "del", &ns]);
        }
        quiet(&["link", "del", BRIDGE]);
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        Self::clean(self.nodes.iter().map(|(n, _)| n.clone()));
    }
}

/// How many processes run below `pid`.
fn descendants(pid: u32) -> usize {
    descendant_pids(pid).len()
}

/// Processes below `pid` (a daemon's containers and their guests: they
/// have network namespaces of their own, so `ip netns pids` misses them).
fn descendant_pids(pid: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, not ')'.
        let after = stat.rsplit_once(')').map_or("", |x| x.1);
        if let Some(pp) = after
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse::<u32>().ok())
        {
            parent.insert(p, pp);
        }
    }
    parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut q = p;
            while let Some(&pp) = parent.get(&q) {
                if pp == pid {
                    return true;
                }
                q = pp;
            }
            false
        })
        .collect()
}

/// Two nodes, a and b, on one bridge.
struct Pair {
    da: Guard,
    db: Guard,
    a: String,
    b: String,
    logs: [PathBuf; 2],
    _lan: Lan,
}

const NS_A: &str = "sc-mx-ma";
const NS_B: &str = "sc-mx-mb";

fn pair(dir: &Path, b_env: &[(&str, &str)]) -> Pair {
    let lan = Lan::new(&[(NS_A, "10.231.12.2"), (NS_B, "10.231.12.3")]);
    let (a, b) = (
        "10.231.12.2:7430".to_string(),
        "10.231.12.3:7430".to_string(),
    );
    let logs = [dir.join("a.log"), dir.join("b.log")];
    let ga = daemon(NS_A, &a, &logs[0], "", &[]);
    let gb = daemon(NS_B, &b, &logs[1], "", b_env);
    Pair {
        da: ga,
        db: gb,
        a,
        b,
        logs,
        _lan: lan,
    }
}

impl Pair {
    fn logs(&self) -> String {
        self.logs
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--\n")
    }
}

/// The test programs, compiled into the client's directory (the guest
/// runs them from the projection).
fn programs(dir: &Path) -> PathBuf {
    let cwd = dir.join("mig");
    std::fs::create_dir_all(&cwd).unwrap();
    let data =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../metachory/tests/data");
    for (name, extra) in [("mx_counter", ""), ("mx_threads", "-pthread")] {
        let mut c = Command::new("cc");
        c.args(["-O1", "-o"])
            .arg(cwd.join(name))
            .arg(data.join(format!("{name}.c")));
        if !extra.is_empty() {
            c.arg(extra);
        }
        let o = c.output().expect("run cc");
        assert!(o.status.success(), "cc {name}: {}", text(&o.stderr));
    }
    cwd
}

/// `sidecore exec --on node` in `cwd`, its stdout collected line by line.
fn start(node: &str, cwd: &Path, args: &[&str]) -> (Guard, Arc<Mutex<Vec<String>>>) {
    let mut c = Command::new(bin())
        .current_dir(cwd)
        .args(["exec", "--on", node, "-q", "--discard"])
        .args(args)
        .env_remove("SIDECORE_NODES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = Arc::clone(&lines);
    let out = c.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            l.lock().unwrap().push(line);
        }
    });
    (Guard(c), lines)
}

fn count(lines: &Mutex<Vec<String>>) -> usize {
    lines.lock().unwrap().len()
}

fn wait_lines(lines: &Mutex<Vec<String>>, n: usize, what: &str) {
    let t = Instant::now();
    while count(lines) < n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what}: {} lines of {n}: {:?}",
            count(lines),
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn migrate(pid: u32, to: &str, lazy: bool) -> Output {
    let mut c = Command::new(bin());
    c.args(["migrate", &pid.to_string(), "--to", to]);
    if lazy {
        c.arg("--lazy");
    }
    c.env_remove("SIDECORE_NODES").output().unwrap()
}

/// The counter's output: checksum, 0..n, checksum, sum.
fn check_counter(got: &[String], n: usize) {
    assert_eq!(got.len(), n + 3, "{got:?}");
    assert!(got[0].starts_with("checksum "), "{got:?}");
    for (i, l) in got[1..=n].iter().enumerate() {
        assert_eq!(
            l,
            &i.to_string(),
            "a gap or a repeat at {i}: {:?}",
            &got[i.saturating_sub(3)..(i + 4).min(got.len())]
        );
    }
    assert_eq!(got[n + 1], got[0], "the heap's checksum changed");
    assert_eq!(got[n + 2], format!("sum {:.1}", n as f64 / 2.0));
}

/// What a client wrote to stderr (it is stopped first).
fn client_err(c: &mut Guard) -> String {
    let _ = c.0.kill();
    let _ = c.0.wait();
    let mut err = String::new();
    let _ = c.0.stderr.take().unwrap().read_to_string(&mut err);
    err
}

fn exit_code(c: &mut Guard, secs: u64) -> Option<i32> {
    common::wait_exit(&mut c.0, secs)
        .expect("the client ended")
        .code()
}

#[test]
fn a_counter_moves_back_and_forth_five_times_and_notices_nothing() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let cwd = programs(dir.path());
    let p = pair(dir.path(), &[]);
    const N: usize = 2000;
    let (mut c, lines) = start(&p.a, &cwd, &["./mx_counter", "32", &N.to_string(), "10"]);
    let pid = c.0.id();
    wait_lines(&lines, 20, "before the first migration");
    let t0 = Instant::now();
    let (da, db) = (p.da.0.id(), p.db.0.id());
    let mut left = Vec::new();
    let nodes = [(&p.b, db, da), (&p.a, da, db)];
    for k in 0..10 {
        let (to, d_to, d_from) = nodes[k % 2];
        let lazy = (k / 2) % 2 == 1;
        let before = count(&lines);
        let on_source = descendant_pids(d_from);
        assert!(
            !on_source.is_empty(),
            "no container on the source before migration {k}"
        );
        left.push((k, on_source));
        let o = migrate(pid, to, lazy);
        if !o.status.success() {
            panic!(
                "migration {k} to {to} (lazy {lazy}): {}{}\nclient: {}\n{}",
                text(&o.stdout),
                text(&o.stderr),
                client_err(&mut c),
                p.logs()
            );
        }
        assert!(
            text(&o.stdout).contains("migrated the guest"),
            "{}",
            text(&o.stdout)
        );
        eprintln!("{:?} {}", t0.elapsed(), text(&o.stdout).trim());
        // The target runs it (the source's container ends in its own time:
        // checked below).
        assert!(
            descendants(d_to) > 0,
            "no container on the target after migration {k}"
        );
        wait_lines(&lines, before + 20, "after a migration");
    }
    // Every source's copy and container are gone.
    for (k, on_source) in &left {
        assert!(
            wait_for(
                || on_source
                    .iter()
                    .all(|p| !Path::new(&format!("/proc/{p}")).exists()),
                30
            ),
            "the source kept its container after migration {k}: {on_source:?}"
        );
    }
    let code = exit_code(&mut c, 120);
    let mut err = String::new();
    c.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    check_counter(&lines.lock().unwrap(), N);
    assert_eq!(
        code,
        Some(7),
        "the guest's own status; stderr: {err}\n{}",
        p.logs()
    );
}

#[test]
fn faults_leave_the_guest_where_it_was() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let cwd = programs(dir.path());
    // b dies (SIGKILL, from inside) as soon as an image reaches it.
    let p = pair(dir.path(), &[("SIDECORE_MX_TEST_DIE", "image")]);

    // A multi-threaded guest is refused by name and runs on.
    let (mut c, lines) = start(&p.a, &cwd, &["./mx_threads", "300"]);
    wait_lines(&lines, 5, "the threaded guest");
    let o = migrate(c.0.id(), &p.b, false);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("has 3 threads: only single-threaded guests migrate"),
        "{err}\n{}",
        p.logs()
    );
    assert_eq!(exit_code(&mut c, 60), Some(0));
    let got = lines.lock().unwrap().clone();
    assert_eq!(got.len(), 301, "{got:?}");

    // The target dies in the middle: the guest goes on on its source.
    let (mut c, lines) = start(&p.a, &cwd, &["./mx_counter", "64", "400", "10"]);
    wait_lines(&lines, 10, "the counter");
    let o = migrate(c.0.id(), &p.b, false);
    assert!(!o.status.success(), "{}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(err.contains("stays where it was"), "{err}\n{}", p.logs());
    assert_eq!(exit_code(&mut c, 60), Some(7), "{}", p.logs());
    check_counter(&lines.lock().unwrap(), 400);
}

/// Frames after a hello and a welcome, as a client would send them, and
/// the encoder for the frames that follow.
fn node_frames(msgs: &[Vec<u8>]) -> (Vec<u8>, FrameEncoder) {
    let mut bytes = sidecore_wire::frame::preamble().to_vec();
    let mut enc = FrameEncoder::default();
    let hello = sidecore_wire::Message::Hello(sidecore_wire::Hello {
        origin: "t".into(),
        software: "0".into(),
    });
    enc.encode(&hello.encode(), &mut bytes);
    for m in msgs {
        enc.encode(m, &mut bytes);
    }
    (bytes, enc)
}

/// A client's frame to server endpoint 3 of session 77.
fn reply(enc: &mut FrameEncoder, body: MxBody) -> Vec<u8> {
    let m = sidecore_wire::Message::Mx(Box::new(MxFrame {
        session: 77,
        src: 1,
        dst: 3,
        hops: 0,
        body,
    }));
    let mut bytes = Vec::new();
    enc.encode(&m.encode(), &mut bytes);
    bytes
}

/// The projection's lookups, answered as a client would for its one
/// directory `cwd` (projected as `0`): the directory itself, nothing else.
fn lookup(cwd: &Path, req: u64, path: &str) -> MxBody {
    use std::os::unix::fs::MetadataExt;
    if path != "0" {
        return MxBody::Attr {
            req,
            attr: None,
            errno: libc::ENOENT,
        };
    }
    let m = std::fs::metadata(cwd).unwrap();
    MxBody::Attr {
        req,
        attr: Some(MxAttr {
            mode: m.mode(),
            nlink: u32::try_from(m.nlink()).unwrap(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            atime_ns: m.atime() * 1_000_000_000,
            mtime_ns: m.mtime() * 1_000_000_000,
            ctime_ns: m.ctime() * 1_000_000_000,
            rdev: 0,
            vnode: 0,
            base: 0,
        }),
        errno: 0,
    }
}

#[test]
fn a_malformed_image_gets_an_error_naming_its_sender() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let cwd = programs(dir.path());
    let p = pair(dir.path(), &[]);
    // A client opens a session on b to take a guest in ...
    let open = format!(
        r#"{{"type":"mx-open","session":77,"client":1,"server":3,"argv":["./mx_counter"],"env":[],"cwd":"{0}","project":["{0}"],"tty":null,"userns":false,"ptrace":false,"route":[],"resume":{{"from":2,"lazy":false}}}}"#,
        cwd.display()
    );
    let mut s = TcpStream::connect(&p.b).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (first, mut enc) = node_frames(&[open.into_bytes()]);
    s.write_all(&first).unwrap();
    // ... and answers the projection's questions until b is ready.
    let mut dec = sidecore_wire::frame::FrameDecoder::new();
    let mut buf = [0u8; 65536];
    let mut seen = Vec::new();
    let (pages, ticket) = 'ready: loop {
        let n = s.read(&mut buf);
        let n = n.unwrap_or_else(|e| panic!("{e}; got {seen:?}\n{}", p.logs()));
        assert!(n > 0, "b closed: {}", p.logs());
        dec.feed(&buf[..n]);
        while let Some((_, f)) = dec.next_frame().unwrap() {
            let m = sidecore_wire::Message::decode(f);
            seen.push(format!("{m:?}"));
            let Ok(sidecore_wire::Message::Mx(m)) = m else {
                continue;
            };
            match m.body {
                MxBody::ResumeReady { pages, ticket } => break 'ready (pages, ticket),
                MxBody::Lookup { req, path } => {
                    let a = lookup(&cwd, req, &path);
                    s.write_all(&reply(&mut enc, a)).unwrap();
                }
                _ => {}
            }
        }
    };
    // A "source" with the right ticket sends an image that is not one.
    let mut ps = TcpStream::connect(&pages).unwrap();
    ps.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = sidecore_wire::mx_image::page_preamble().to_vec();
    let mut enc = sidecore_wire::mx_image::RecordEncoder::default();
    enc.encode(
        &sidecore_wire::mx_image::Record::Hello {
            ticket,
            session: 77,
        },
        &mut out,
    );
    let bad = br#"{"session":77,"lazy":false,"regs":[1,2,3]}"#;
    let h = enc.header(sidecore_wire::mx_image::RecordKind::Image, &[bad]);
    out.extend_from_slice(&h);
    out.extend_from_slice(bad);
    ps.write_all(&out).unwrap();
    let mut got = Vec::new();
    let _ = ps.read_to_end(&mut got);
    let got = text(&got);
    let me = ps.local_addr().unwrap().to_string();
    assert!(
        got.contains(&format!(
            "the source {me}: record #1 (image): malformed image"
        )),
        "{got:?}\n{}",
        p.logs()
    );
    // A stranger without the ticket is turned away the same way.
    let mut ps = TcpStream::connect(&pages).unwrap();
    ps.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = sidecore_wire::mx_image::page_preamble().to_vec();
    sidecore_wire::mx_image::RecordEncoder::default().encode(
        &sidecore_wire::mx_image::Record::Hello {
            ticket: ticket ^ 1,
            session: 77,
        },
        &mut out,
    );
    ps.write_all(&out).unwrap();
    let mut got = Vec::new();
    let _ = ps.read_to_end(&mut got);
    assert!(
        text(&got).contains("showed the wrong ticket"),
        "{}",
        text(&got)
    );
    let db = p.db.0.id();
    assert!(descendants(db) > 0, "no container on b");
    drop(s);
    assert!(
        wait_for(|| descendants(db) == 0, 70),
        "the half-built container outlived its client"
    );
}

#[test]
fn bad_requests_name_what_is_wrong() {
    // No session runs under this PID (ours is no `exec --on` client).
    let o = migrate(std::process::id(), "127.0.0.1:9", false);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("no `sidecore exec --on` session runs as PID"),
        "{err}"
    );
    // A node that is neither HOST:PORT nor in --nodes.
    let o = migrate(std::process::id(), "nowhere", false);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("migrate --to nowhere: no such node"), "{err}");
}
