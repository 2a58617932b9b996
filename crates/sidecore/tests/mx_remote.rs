//! Metachory end to end (issue 16): `sidecore exec --on NODE` against a real
//! second daemon in its own network namespace whose file-system view holds
//! none of the client's files (its /tmp is a private tmpfs), with real
//! programs (python3, cc, sqlite3, tar, sha256sum) whose output must equal a
//! local run byte for byte; pipes between two nodes, signals, the terminal
//! size, the write-back overlay, a relay, and the faults: client dies,
//! server dies, the guest tries to escape, a malformed protocol message.
//!
//! Needs root (namespaces, FUSE, overlayfs); skips without it unless
//! `SIDECORE_REQUIRE_ROOT` is set, where it fails instead.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::mx::{daemon, ip, one, root};
use common::{Guard, wait_for};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sidecore")
}

/// A network namespace joined to `peer` (None: this one) by a veth pair.
struct Netns(String, String);

impl Netns {
    fn new(name: &str, peer: Option<&str>, here: &str, there: &str, link: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let a = format!("{link}a");
        let b = format!("{link}b");
        let _ = Command::new("ip").args(["link", "del", &a]).output();
        if let Some(p) = peer {
            let _ = Command::new("ip")
                .args(["-n", p, "link", "del", &a])
                .output();
        }
        ip(&["netns", "add", name]);
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &b, "netns", name]);
        if let Some(p) = peer {
            ip(&["link", "set", &a, "netns", p]);
            ip(&["-n", p, "addr", "add", &format!("{here}/24"), "dev", &a]);
            ip(&["-n", p, "link", "set", &a, "up"]);
        } else {
            ip(&["addr", "add", &format!("{here}/24"), "dev", &a]);
            ip(&["link", "set", &a, "up"]);
        }
        ip(&["-n", name, "addr", "add", &format!("{there}/24"), "dev", &b]);
        ip(&["-n", name, "link", "set", &b, "up"]);
        ip(&["-n", name, "link", "set", "lo", "up"]);
        Netns(name.into(), a)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.1]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A route that makes a network unreachable from this namespace.
struct Unreachable(String);

impl Unreachable {
    fn add(net: &str) -> Unreachable {
        let _ = Command::new("ip")
            .args(["route", "del", "unreachable", net])
            .output();
        ip(&["route", "add", "unreachable", net]);
        Unreachable(net.to_string())
    }
}

impl Drop for Unreachable {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["route", "del", "unreachable", &self.0])
            .output();
    }
}

/// The server node: a namespace, its daemon and its address.
struct Node {
    _daemon: Guard,
    _ns: Netns,
    addr: String,
    log: PathBuf,
}

fn node(dir: &Path) -> Node {
    let ns = Netns::new("sc-mx-srv", None, "10.231.9.1", "10.231.9.2", "scmx0");
    let addr = "10.231.9.2:7420".to_string();
    let log = dir.join("server.log");
    let d = daemon(
        &ns.0,
        &addr,
        &log,
        "echo server-only > /tmp/server-secret.txt && ",
        &[],
    );
    Node {
        _daemon: d,
        _ns: ns,
        addr,
        log,
    }
}

fn exec_cmd(node: &str, cwd: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(cwd)
        .arg("exec")
        .arg("--on")
        .arg(node)
        .args(args);
    c.env_remove("SIDECORE_NODES");
    c
}

fn exec(node: &str, cwd: &Path, args: &[&str]) -> Output {
    exec_cmd(node, cwd, args)
        .stdin(Stdio::null())
        .output()
        .expect("run sidecore exec")
}

fn local(cwd: &Path, args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run locally")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory tree, and a copy of it for the local run.
fn project(dir: &Path, name: &str, files: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let a = dir.join(name);
    let b = dir.join(format!("{name}-local"));
    for d in [&a, &b] {
        for (f, body) in files {
            let p = d.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
        }
    }
    (a, b)
}

fn same(remote: &Output, local: &Output, what: &str, log: &Path) {
    assert_eq!(
        text(&remote.stdout),
        text(&local.stdout),
        "{what}: stdout differs\nremote stderr: {}\nserver log: {}",
        text(&remote.stderr),
        std::fs::read_to_string(log).unwrap_or_default()
    );
    assert_eq!(
        remote.status.code(),
        local.status.code(),
        "{what}: exit status\n{}",
        text(&remote.stderr)
    );
}

#[test]
fn real_programs_give_the_same_bytes_as_locally_and_the_server_holds_no_client_file() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let pid = n._daemon.0.id();
    // The server's view of the file system holds none of this test's files.
    let seen = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "test", "-e"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(!seen.success(), "the server can see the client's directory");

    // python3 on a script.
    let (p, pl) = project(
        dir.path(),
        "py",
        &[
            (
                "app.py",
                "import helper, sys\nprint(helper.greet(sys.argv[1]))\nprint(sorted(open('data.txt').read().split()))\n",
            ),
            (
                "helper.py",
                "def greet(n):\n    return f'hello {n} ' + '*' * 3\n",
            ),
            ("data.txt", "pear apple fig\n"),
        ],
    );
    let r = exec(&n.addr, &p, &["-q", "python3", "app.py", "mx"]);
    same(
        &r,
        &local(&pl, &["python3", "app.py", "mx"]),
        "python3",
        &n.log,
    );

    // cc on a multi-file C project, then the program.
    let (c, cl) = project(
        dir.path(),
        "cproj",
        &[
            (
                "main.c",
                "#include \"lib.h\"\n#include <stdio.h>\nint main(void){printf(\"%d\\n\", square(7) + cube(2));return 4;}\n",
            ),
            ("lib.h", "int square(int);\nint cube(int);\n"),
            (
                "square.c",
                "#include \"lib.h\"\nint square(int x){return x*x;}\n",
            ),
            (
                "cube.c",
                "#include \"lib.h\"\nint cube(int x){return x*x*x;}\n",
            ),
        ],
    );
    let build = "cc -O1 -o prog main.c square.c cube.c && ./prog";
    let r = exec(&n.addr, &c, &["-q", "--apply", "sh", "-c", build]);
    same(&r, &local(&cl, &["sh", "-c", build]), "cc", &n.log);
    assert!(c.join("prog").exists(), "the approved binary came back");
    let again = local(&c, &["./prog"]);
    assert_eq!(text(&again.stdout), "57\n");

    // tar and sha256sum over a tree.
    let (t, tl) = project(
        dir.path(),
        "tree",
        &[
            ("a/b/c.txt", "deep\n"),
            ("a/d.txt", "mid\n"),
            ("e.bin", "\u{1}\u{2}\u{3}"),
            ("f/g/h/i.txt", "deeper\n"),
        ],
    );
    // Same times and modes on both copies, so the archives may be equal.
    {
        let (a, b) = (&t, &tl);
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "touch -d 2020-01-01 $(find {} {})",
                a.display(),
                b.display()
            ))
            .status()
            .unwrap();
    }
    let script = "tar --numeric-owner -cf - . | sha256sum; find . -type f | sort | xargs sha256sum";
    let r = exec(&n.addr, &t, &["-q", "sh", "-c", script]);
    let l = local(&tl, &["sh", "-c", script]);
    same(&r, &l, "tar and sha256sum", &n.log);
    let r = exec(&n.addr, &t, &["-q", "tar", "-cf", "-", "."]);
    let l = local(&t, &["tar", "-cf", "-", "."]);
    assert!(r.stdout == l.stdout, "the archive's bytes differ");
    assert!(r.stdout.len() > 5000);
}

#[test]
fn sqlite_writes_stay_in_the_overlay_until_approved() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let (p, pl) = project(
        dir.path(),
        "db",
        &[("schema.sql", "create table t(k text, v int);\n")],
    );
    let sql = "create table if not exists t(k text, v int); insert into t values ('a', 1), ('b', 2); select k, v * 10 from t order by k;";
    let r = exec(&n.addr, &p, &["--discard", "sqlite3", "x.db", sql]);
    let l = local(&pl, &["sqlite3", "x.db", sql]);
    same(&r, &l, "sqlite3", &n.log);
    assert!(
        !p.join("x.db").exists(),
        "a discarded database reached the client"
    );
    assert!(text(&r.stderr).contains("overlay=1"), "{}", text(&r.stderr));
    // Without a verdict (no terminal): the change is listed and dropped.
    let r = exec(&n.addr, &p, &["sqlite3", "x.db", sql]);
    assert!(text(&r.stderr).contains("discarded"), "{}", text(&r.stderr));
    assert!(text(&r.stderr).contains("x.db"), "{}", text(&r.stderr));
    assert!(!p.join("x.db").exists());
    // --diff shows it and applies nothing.
    let r = exec(
        &n.addr,
        &p,
        &["-q", "--diff", "sh", "-c", "echo changed >> schema.sql"],
    );
    assert!(text(&r.stdout).contains("+changed"), "{}", text(&r.stdout));
    assert_eq!(
        std::fs::read_to_string(p.join("schema.sql")).unwrap(),
        "create table t(k text, v int);\n"
    );
    // --apply brings the database back, and a local sqlite3 reads it.
    let r = exec(&n.addr, &p, &["-q", "--apply", "sqlite3", "x.db", sql]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let q = local(&p, &["sqlite3", "x.db", "select count(*), sum(v) from t;"]);
    assert_eq!(text(&q.stdout), "2|3\n");
}

#[test]
fn stdio_pipes_between_two_nodes_signals_and_the_terminal_size() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    // A second node on loopback.
    let port = common::free_port();
    let lo = format!("127.0.0.1:{port}");
    let log2 = dir.path().join("second.log");
    let _second = Guard(
        Command::new(bin())
            .args([
                "daemon", "--name", "second", "--listen", &lo, "--http", "off", "--socket",
            ])
            .arg(dir.path().join("second.sock"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log2).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| TcpStream::connect(&lo).is_ok(), 20));
    let cwd = dir.path().join("pipes");
    std::fs::create_dir_all(&cwd).unwrap();
    let pipeline = format!(
        "{b} exec -q --on {a} sh -c 'for i in 5 3 9 1; do echo line$i; done' | {b} exec -q --on {lo} sort -r",
        b = bin(),
        a = n.addr
    );
    let o = Command::new("sh")
        .arg("-c")
        .arg(&pipeline)
        .current_dir(&cwd)
        .output()
        .unwrap();
    assert_eq!(
        text(&o.stdout),
        "line9\nline5\nline3\nline1\n",
        "{}",
        text(&o.stderr)
    );

    // A large stdin through the guest and back (flow control both ways).
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut c = exec_cmd(&n.addr, &cwd, &["-q", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = c.stdin.take().unwrap();
    let data = big.clone();
    let t = std::thread::spawn(move || w.write_all(&data).unwrap());
    let mut got = Vec::new();
    c.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    t.join().unwrap();
    assert!(c.wait().unwrap().success());
    assert!(
        got == big,
        "cat returned {} bytes of {}",
        got.len(),
        big.len()
    );

    // SIGTERM to the client reaches the guest's trap; its status comes back.
    let mut c = exec_cmd(
        &n.addr,
        &cwd,
        &[
            "-q",
            "sh",
            "-c",
            "trap 'echo got TERM; exit 3' TERM; echo ready; sleep 60 & wait",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(c.wait().unwrap().code(), Some(3));

    // SIGINT (Ctrl-C without a terminal) kills a guest that does not catch
    // it, and the client dies of it too, as a local run would.
    let mut c = exec_cmd(
        &n.addr,
        &cwd,
        &["-q", "sh", "-c", "echo ready; exec sleep 60"],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let s = common::wait_exit(&mut c, 20).expect("the client ended");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(s.signal(), Some(libc::SIGINT), "{s:?}");

    // The terminal: the guest gets a pseudo-terminal of the client's size.
    let inner = format!(
        "stty rows 33 cols 77; {} exec -q --on {} sh -c 'stty size; test -t 0 && echo tty'",
        bin(),
        n.addr
    );
    let o = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = text(&o.stdout).replace('\r', "");
    assert!(shown.contains("33 77\ntty"), "{shown:?}");
}

#[test]
fn faults_are_clear_errors_and_the_guest_stays_contained() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let mut n = node(dir.path());
    let cwd = dir.path().join("faults");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("kept.txt"), "approved before\n").unwrap();

    // The guest tries to escape: files outside the projection, ptrace of
    // its supervisor, a raw socket.
    let escape = r#"
import ctypes, os, socket
for p in ["/tmp/server-secret.txt", "/etc/shadow"]:
    try:
        print(p, repr(open(p).read()))
    except OSError as e:
        print(p, type(e).__name__)
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, os.getppid(), 0, 0)
print("ptrace", r, os.strerror(ctypes.get_errno()))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw socket opened")
except OSError as e:
    print("raw socket", type(e).__name__)
"#;
    std::fs::write(cwd.join("escape.py"), escape).unwrap();
    let r = exec(&n.addr, &cwd, &["-q", "python3", "escape.py"]);
    let out = text(&r.stdout);
    assert!(
        out.contains("/tmp/server-secret.txt FileNotFoundError"),
        "{out}"
    );
    assert!(
        out.contains("/etc/shadow PermissionError") || out.contains("/etc/shadow ''"),
        "{out}"
    );
    assert!(out.contains("ptrace -1 Operation not permitted"), "{out}");
    assert!(out.contains("raw socket PermissionError"), "{out}");
    let err = text(&r.stderr);
    assert!(err.contains("tried ptrace"), "{err}");
    assert!(err.contains("raw socket"), "{err}");

    // A malformed message on the node port gets the reason back, and the
    // daemon goes on serving.
    let mut s = TcpStream::connect(&n.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut bytes = sidecore_wire::frame::preamble().to_vec();
    let mut enc = sidecore_wire::frame::FrameEncoder::default();
    let hello = sidecore_wire::Message::Hello(sidecore_wire::Hello {
        origin: "t".into(),
        software: "0".into(),
    });
    enc.encode(&hello.encode(), &mut bytes);
    enc.encode(br#"{"type":"mx-open","session":1,"client":1,"server":2,"argv":["true"],"env":[],"cwd":"/","project":["/x/../etc"],"tty":null,"userns":false,"ptrace":false,"route":[]}"#, &mut bytes);
    s.write_all(&bytes).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let got = text(&got);
    assert!(got.contains("bad mx-open: `project`"), "{got}");
    let mut s = TcpStream::connect(&n.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut bytes = sidecore_wire::frame::preamble().to_vec();
    let mut enc = sidecore_wire::frame::FrameEncoder::default();
    enc.encode(&hello.encode(), &mut bytes);
    enc.encode(b"{\"type\":\"mx\",\"session\":", &mut bytes);
    s.write_all(&bytes).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        text(&got).contains("frame #1 holds a malformed message"),
        "{}",
        text(&got)
    );
    let r = exec(&n.addr, &cwd, &["-q", "cat", "kept.txt"]);
    assert_eq!(text(&r.stdout), "approved before\n");

    // The client dies: the guest is killed and nothing it wrote arrives.
    let mut c = exec_cmd(
        &n.addr,
        &cwd,
        &[
            "-q",
            "--apply",
            "sh",
            "-c",
            "echo x > unapproved.txt; echo ready; exec sleep 60",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    c.kill().unwrap();
    c.wait().unwrap();
    let gone = wait_for(
        || {
            let o = Command::new("ip")
                .args(["netns", "pids", "sc-mx-srv"])
                .output()
                .unwrap();
            text(&o.stdout).lines().count() == 1
        },
        10,
    );
    assert!(gone, "the guest outlived its client");
    assert!(!cwd.join("unapproved.txt").exists());

    // The server dies: the client says so and applies nothing.
    let c = exec_cmd(
        &n.addr,
        &cwd,
        &[
            "-q",
            "--apply",
            "sh",
            "-c",
            "echo y > kept.txt; echo ready; exec sleep 60",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut c = Guard(c);
    let mut line = String::new();
    BufReader::new(c.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    n._daemon.0.kill().unwrap();
    n._daemon.0.wait().unwrap();
    let s = common::wait_exit(&mut c.0, 20).expect("the client ended");
    assert_eq!(s.code(), Some(125));
    let mut err = String::new();
    c.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        err.contains("lost the session before the guest's end"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.join("kept.txt")).unwrap(),
        "approved before\n"
    );
    let gone = wait_for(
        || {
            let o = Command::new("ip")
                .args(["netns", "pids", "sc-mx-srv"])
                .output()
                .unwrap();
            text(&o.stdout).trim().is_empty()
        },
        10,
    );
    assert!(gone, "the guest outlived its server");
}

#[test]
fn unprivileged_mode_ptrace_fallback_and_a_relay() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("modes");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("n.txt"), "3\n1\n2\n").unwrap();
    // root — relay namespace — server namespace: the client cannot reach
    // the server directly.
    let relay_ns = Netns::new("sc-mx-rly", None, "10.231.10.1", "10.231.10.2", "scmx1");
    let srv_ns = Netns::new(
        "sc-mx-far",
        Some("sc-mx-rly"),
        "10.231.11.1",
        "10.231.11.2",
        "scmx2",
    );
    let relay_addr = "10.231.10.2:7421";
    let far = "10.231.11.2:7422";
    let _relay = daemon(
        &relay_ns.0,
        relay_addr,
        &dir.path().join("relay.log"),
        "echo server-only > /tmp/server-secret.txt && ",
        &[],
    );
    let far_log = dir.path().join("far.log");
    let _srv = daemon(
        &srv_ns.0,
        far,
        &far_log,
        "echo server-only > /tmp/server-secret.txt && ",
        &[],
    );
    // No route from here to the server's network.
    let _route = Unreachable::add("10.231.11.0/24");
    let r = exec(far, &cwd, &["-q", "--via", relay_addr, "sort", "n.txt"]);
    assert_eq!(
        text(&r.stdout),
        "1\n2\n3\n",
        "{}\n{}",
        text(&r.stderr),
        std::fs::read_to_string(&far_log).unwrap_or_default()
    );
    let direct = exec(far, &cwd, &["-q", "true"]);
    assert_eq!(direct.status.code(), Some(125));
    assert!(
        text(&direct.stderr).contains("unreachable"),
        "{}",
        text(&direct.stderr)
    );

    // The unprivileged mode: a user namespace, root inside, nobody outside.
    let r = exec(
        far,
        &cwd,
        &[
            "--via",
            relay_addr,
            "--userns",
            "sh",
            "-c",
            "id -u; cat /proc/self/uid_map | tr -s ' '; sort n.txt",
        ],
    );
    assert_eq!(
        text(&r.stdout),
        "0\n 0 65534 1\n1\n2\n3\n",
        "{}",
        text(&r.stderr)
    );

    // PTRACE_SYSEMU, forced: the same output, and it says so.
    let r = exec(
        far,
        &cwd,
        &[
            "--via",
            relay_addr,
            "--ptrace",
            "sh",
            "-c",
            "sort n.txt | head -2; python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' 2>&1 | tail -1",
        ],
    );
    let out = text(&r.stdout);
    assert!(out.starts_with("1\n2\n"), "{out}\n{}", text(&r.stderr));
    assert!(out.contains("PermissionError"), "{out}");
    assert!(
        text(&r.stderr).contains("supervision=ptrace-sysemu"),
        "{}",
        text(&r.stderr)
    );
}

/// `exec --cpu N`: the guest runs on that one CPU of the node (its
/// supervisor beside it); a CPU the node's daemon may not use is refused with
/// the CPUs it may, and nothing runs.
#[test]
fn a_session_pinned_to_one_cpu_runs_there_and_a_cpu_the_node_lacks_is_refused() {
    if !root() {
        return;
    }
    let _one = one();
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let cwd = dir.path().join("pinned");
    std::fs::create_dir_all(&cwd).unwrap();
    // The last CPU this machine has (the node is a namespace on it).
    let last = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) - 1;
    let cpu = last.to_string();
    let script = "grep Cpus_allowed_list /proc/self/status; cat /proc/self/status > /dev/null";
    let r = exec(&n.addr, &cwd, &["-q", "--cpu", &cpu, "sh", "-c", script]);
    let out = text(&r.stdout);
    assert!(r.status.success(), "{out}{}", text(&r.stderr));
    assert_eq!(out.trim(), format!("Cpus_allowed_list:\t{cpu}"), "{out}");
    // Unpinned, the guest may use every CPU.
    if last > 0 {
        let r = exec(&n.addr, &cwd, &["-q", "sh", "-c", script]);
        assert_ne!(text(&r.stdout).trim(), format!("Cpus_allowed_list:\t{cpu}"));
    }
    // A CPU the node does not have.
    let r = exec(&n.addr, &cwd, &["-q", "--cpu", "4096", "echo", "ran"]);
    let (out, err) = (text(&r.stdout), text(&r.stderr));
    assert!(!r.status.success(), "{out}{err}");
    assert!(!out.contains("ran"), "{out}");
    assert!(
        err.contains("--cpu 4096: this node's daemon may not run on CPU 4096 (it may use CPUs"),
        "{err}"
    );
}
