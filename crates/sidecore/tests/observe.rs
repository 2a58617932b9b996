//! End-to-end tests of what operators look at, through a real daemon running a
//! real app: `/metrics` against the family list and `promtool check metrics`,
//! the dashboard in headless Chromium, bad HTTP input and a dashboard that
//! never reads, the configuration file with `--check-config` and SIGHUP, the
//! shell completions, restarts as `ps`, `events` and `/metrics` show them,
//! and progress bars on a terminal only.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Guard, bin, free_port, run, serial, text, wait_for};

/// A foreground daemon with its HTTP listener, stopped when dropped.
struct Daemon {
    _child: Guard,
    socket: PathBuf,
    http: SocketAddr,
    log: PathBuf,
}

fn start(dir: &Path, extra: &[&str]) -> Daemon {
    let socket = dir.join("d.sock");
    let log = dir.join("d.log");
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = bin()
        .args(["daemon", "--socket", socket.to_str().unwrap()])
        .args(["--http", &http.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let d = Daemon {
        _child: Guard(child),
        socket,
        http,
        log,
    };
    assert!(
        wait_for(|| TcpStream::connect(d.http).is_ok(), 10),
        "the daemon's HTTP side did not come up: {}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
    d
}

/// A daemon running examples/checksum.toml.
fn start_checksum(dir: &Path) -> Daemon {
    start_checksum_with(dir, &[])
}

/// A daemon with `extra` flags running examples/checksum.toml.
fn start_checksum_with(dir: &Path, extra: &[&str]) -> Daemon {
    let d = start(dir, extra);
    let up = run(&[
        "up",
        "-d",
        &example("checksum.toml"),
        "--socket",
        d.socket.to_str().unwrap(),
    ]);
    assert!(up.status.success(), "{:?}", text(&up));
    d
}

fn example(name: &str) -> String {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    format!("{root}/../../examples/{name}")
}

/// One raw request; returns the status code and the body.
fn http(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

/// `name value` pairs of the samples whose name and labels contain `pat`.
fn samples(text: &str, pat: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(pat))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// OpenMetrics declares each family's unit, which is the one on the list
/// and the name's suffix; families without one declare none.
fn check_units(addr: SocketAddr) {
    let (code, om) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    let declared: std::collections::BTreeMap<&str, &str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# UNIT "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let families: Vec<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(!families.is_empty(), "{om}");
    for (name, _, unit) in sidecore_observe::metrics::FAMILIES {
        // OpenMetrics names a counter's family without `_total`.
        let family = name.strip_suffix("_total").unwrap_or(name);
        if !families.contains(&family) {
            continue;
        }
        assert_eq!(
            declared.get(family).copied().unwrap_or(""),
            *unit,
            "unit of {family}"
        );
        if !unit.is_empty() {
            assert!(family.ends_with(&format!("_{unit}")), "{family}");
        }
    }
}

#[test]
fn metrics_families_types_units_and_promtool() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = start_checksum(dir.path());
    let sock = d.socket.to_str().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let (code, first) = get(d.http, "/metrics");
    assert_eq!(code, 200);
    // Every family on the list, with its type, and nothing else.
    let mut types: Vec<(String, String)> = first
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    types.sort();
    let mut want: Vec<(String, String)> = sidecore_observe::metrics::FAMILIES
        .iter()
        .map(|(n, t, _)| ((*n).to_string(), (*t).to_string()))
        .collect();
    want.sort();
    // Families with no series are not written: the firewall's verdicts and
    // the Wasm violations appear only with such offcodes deployed.
    // The services' families are relayed only when services are scraped.
    let optional = [
        "sidecore_firewall_verdicts_total",
        "sidecore_wasm_violations_total",
        "sidecore_service_up",
    ];
    let relayed = |n: &str| {
        sidecore_observe::capability::RELAYED
            .iter()
            .any(|f| f.0 == n)
    };
    for t in &types {
        assert!(want.contains(t), "{t:?} is not on the list");
    }
    for w in want
        .iter()
        .filter(|(n, _)| !optional.contains(&n.as_str()) && !relayed(n))
    {
        assert!(types.contains(w), "{w:?} is missing");
    }
    for (name, kind) in &types {
        assert!(name.starts_with("sidecore_"), "{name}");
        assert_eq!(
            kind == "counter",
            name.ends_with("_total"),
            "{name} is a {kind}"
        );
    }
    check_units(d.http);
    // The real parser and linter.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/setup.sh installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(first.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Counters of the running app move; its channel is measured.
    let rec0 = samples(
        &first,
        "sidecore_offcode_records_total{app=\"checksum-demo\",offcode=\"checksum\"}",
    );
    std::thread::sleep(Duration::from_millis(1500));
    let (_, second) = get(d.http, "/metrics");
    let rec1 = samples(
        &second,
        "sidecore_offcode_records_total{app=\"checksum-demo\",offcode=\"checksum\"}",
    );
    assert!(
        rec0.len() == 1 && rec1.len() == 1 && rec1[0] > rec0[0],
        "{rec0:?} → {rec1:?}"
    );
    let ch = samples(
        &second,
        "sidecore_channel_messages_total{app=\"checksum-demo\",channel=\"records\"",
    );
    assert!(ch.len() == 1 && ch[0] > 0.0, "{ch:?}");
    let cap = samples(
        &second,
        "sidecore_channel_capacity_messages{app=\"checksum-demo\"",
    );
    assert!(cap.len() == 1 && cap[0] >= 2.0, "{cap:?}");
    // OpenMetrics on request.
    let (code, om) = http(
        d.http,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    assert!(
        om.trim_end().ends_with("# EOF") && om.contains("# TYPE sidecore_offcode_turns counter")
    );
    let _ = run(&["down", "--daemon", "--socket", sock]);
}

#[test]
fn dashboard_in_headless_chromium() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // A service beside the daemon: Orion watching this machine, scraped.
    let orion = format!("127.0.0.1:{}", free_port());
    let _watch = Guard(
        bin()
            .args(["orion", "watch", "--seconds", "120", "--metrics", &orion])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(|| TcpStream::connect(&orion).is_ok(), 10),
        "orion watch --metrics did not come up"
    );
    let d = start_checksum_with(dir.path(), &["--service", &format!("watch={orion}")]);
    let sock = d.socket.to_str().unwrap();
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let dash = format!("{root}/../../dashboard");
    // The screenshot is the test's artefact, next to the other build outputs.
    let shot = std::env::var("CARGO_TARGET_TMPDIR")
        .map_or_else(|_| dir.path().to_path_buf(), PathBuf::from)
        .join("dashboard.png");
    let out = Command::new("node")
        .current_dir(&dash)
        .arg("test/browser.mjs")
        .arg(format!("http://{}/", d.http))
        .arg(env!("CARGO_BIN_EXE_sidecore"))
        .arg(sock)
        .arg("checksum-demo")
        .arg(&shot)
        .arg("orion=watch")
        .output()
        .unwrap();
    let (o, e) = text(&out);
    assert!(
        out.status.success(),
        "browser check failed:\n{o}\n{e}\nscreenshot: {}",
        shot.display()
    );
    assert!(
        o.contains("dashboard ok") && o.contains("the orion panel of watch live"),
        "{o}"
    );
    // The daemon relays the service's key families with its name.
    let (_, m) = get(d.http, "/metrics");
    let fetches = samples(
        &m,
        "sidecore_orion_fetches_total{service=\"watch\",target=\"host\"}",
    );
    assert!(fetches.len() == 1 && fetches[0] > 0.0, "{m}");
    assert!(
        m.contains(
            "sidecore_orion_target_state{service=\"watch\",target=\"host\",state=\"alive\"}"
        ),
        "{m}"
    );
    common::promtool_ok(&m);
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "no screenshot at {}",
        shot.display()
    );
    eprintln!("screenshot: {}", shot.display());
    let _ = run(&["down", "--daemon", "--socket", sock]);
}

#[test]
fn bad_http_gets_the_right_status_and_a_reader_that_stops_is_cut() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), &[]);
    assert_eq!(get(d.http, "/nope").0, 404);
    assert_eq!(
        http(
            d.http,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .0,
        405
    );
    assert_eq!(http(d.http, "GARBAGE\r\n\r\n").0, 400);
    assert_eq!(http(d.http, "GET / HTTP/1.1\r\nHost x\r\n\r\n").0, 400);
    let (code, page) = get(d.http, "/");
    assert!(code == 200 && page.contains("/app.js"));
    let (code, js) = get(d.http, "/app.js");
    assert!(code == 200 && js.contains("EventSource"));
    // A client that subscribes and never reads: a tiny receive window, so
    // the server's send queue stops shrinking at once.
    let slow = socket_with_small_receive_buffer(d.http);
    let mut s = slow;
    s.write_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // A well-behaved reader beside it keeps receiving pictures all along.
    let mut good = TcpStream::connect(d.http).unwrap();
    good.write_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    good.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t0 = Instant::now();
    let mut good_bytes = 0usize;
    let mut buf = [0u8; 65536];
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(n) = good.read(&mut buf) {
            good_bytes += n;
        }
        if closed_by_server(&s) {
            break;
        }
    }
    assert!(
        closed_by_server(&s),
        "the server kept a client that never reads for {:?}",
        t0.elapsed()
    );
    assert!(
        good_bytes > 1000,
        "the reading client got only {good_bytes} bytes"
    );
    // The daemon still answers.
    assert_eq!(get(d.http, "/api/status").0, 200);
    drop(s);
    let _ = run(&["down", "--daemon", "--socket", d.socket.to_str().unwrap()]);
}

/// A client socket whose receive buffer is as small as the kernel allows.
fn socket_with_small_receive_buffer(addr: SocketAddr) -> TcpStream {
    // SAFETY: plain socket(2)/setsockopt(2)/connect(2) on a descriptor this
    // function owns; every pointer passed points at a live local.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 1024;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const size).cast(),
            4,
        );
        let SocketAddr::V4(v4) = addr else {
            panic!("v4 only")
        };
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
        <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
    }
}

/// True when the server has closed (or reset) the connection: the socket is
/// readable and reading it to the end gives EOF or an error. Drains only what
/// is queued, without blocking.
fn closed_by_server(s: &TcpStream) -> bool {
    // SAFETY: tcp_info is plain integers, for which all-zero bytes are valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt(TCP_INFO) writes at most `len` bytes into `info`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    // Any state but ESTABLISHED (1) means the server has closed its side.
    r == 0 && info.tcpi_state != 1
}

#[test]
fn config_file_check_and_sighup_reload() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sidecore.toml");
    let checksum = example("checksum.toml");
    std::fs::write(&cfg, format!("apps = [{checksum:?}]\n")).unwrap();
    let ok = run(&[
        "daemon",
        "--config",
        cfg.to_str().unwrap(),
        "--check-config",
    ]);
    assert!(ok.status.success(), "{:?}", text(&ok));
    assert!(text(&ok).0.contains("ok — 1 app(s)"));
    // The example the service unit uses is valid as shipped.
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let dist = format!("{root}/../../dist/sidecore.toml");
    let o = run(&["daemon", "--config", &dist, "--check-config"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let unit = std::fs::read_to_string(format!("{root}/../../dist/sidecore.service")).unwrap();
    assert!(unit.contains("--check-config") && unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "apps = [\"x.toml\"]\nhttp = 3\n").unwrap();
    let r = run(&[
        "daemon",
        "--config",
        bad.to_str().unwrap(),
        "--check-config",
    ]);
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r).1.contains("bad.toml:2:8"), "{:?}", text(&r));
    // The daemon deploys what the file lists.
    let d = start(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let sock = d.socket.to_str().unwrap();
    let ps = || text(&run(&["ps", "--socket", sock])).0;
    assert!(wait_for(|| ps().contains("checksum-demo"), 10), "{}", ps());
    let pid = d._child.0.id() as libc::pid_t;
    let hup = || {
        // SAFETY: kill(2) with a pid this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    // A bad file is reported and changes nothing.
    std::fs::write(&cfg, "apps = [\n").unwrap();
    hup();
    let log = || std::fs::read_to_string(&d.log).unwrap_or_default();
    assert!(
        wait_for(|| log().contains("kept the running configuration"), 5),
        "{}",
        log()
    );
    assert!(ps().contains("checksum-demo"));
    // The app no longer listed is stopped.
    std::fs::write(&cfg, "apps = []\n").unwrap();
    hup();
    assert!(
        wait_for(|| !ps().contains("checksum-demo"), 10),
        "{}\n{}",
        ps(),
        log()
    );
    assert!(log().contains("no longer listed"));
    let _ = run(&["down", "--daemon", "--socket", sock]);
}

#[test]
fn completions_generate_for_each_shell_and_load_in_bash() {
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell]);
        assert!(
            o.status.success() && o.stdout.len() > 1000,
            "{shell}: {:?}",
            text(&o)
        );
    }
    let script = run(&["completions", "bash"]).stdout;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("sidecore.bash");
    std::fs::write(&f, script).unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; source {}; complete -p sidecore",
            f.display()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("sidecore"));
    let bad = run(&["completions", "tcsh"]);
    assert!(!bad.status.success());
}

#[test]
fn progress_shows_on_a_terminal_and_stays_out_of_pipes() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cal.json");
    let out = out.to_str().unwrap();
    // Piped: stdout and stderr carry no spinner.
    let piped = run(&["calibrate", "--quick", "--out", out]);
    assert!(piped.status.success());
    let (o, e) = text(&piped);
    assert!(
        !o.contains("calibrating") && !e.contains("calibrating"),
        "{o}\n{e}"
    );
    // On a terminal (script(1) gives it a pty): the spinner and its message.
    let cmd = format!(
        "{} calibrate --quick --out {out}",
        env!("CARGO_BIN_EXE_sidecore")
    );
    let tty = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .output()
        .expect("script(1) from util-linux");
    assert!(tty.status.success(), "{:?}", text(&tty));
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(
        shown.contains("calibrating: timing operator classes"),
        "{shown}"
    );
    assert!(shown.contains("calibration of"), "{shown}");
}

#[test]
fn restarts_show_in_ps_events_and_metrics() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // examples/restart.toml, faster: an unpaced source, short lives, short
    // delays; the first two lives of `flaky` fail.
    let manifest = std::fs::read_to_string(example("restart.toml"))
        .unwrap()
        .replace("rate = 100000", "records = 0")
        .replace(
            "fail_after = 150000, failing_lives = 3",
            "fail_after = 20000, failing_lives = 2",
        )
        .replace("restart_backoff_ms = 200", "restart_backoff_ms = 20");
    let m = dir.path().join("restart.toml");
    std::fs::write(&m, manifest).unwrap();
    let d = start(dir.path(), &[]);
    let sock = d.socket.to_str().unwrap();
    let up = run(&["up", "-d", m.to_str().unwrap(), "--socket", sock]);
    assert!(up.status.success(), "{:?}", text(&up));
    let flaky = || -> serde_json::Value {
        let ps = run(&["ps", "--json", "--socket", sock]);
        let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap_or_default();
        v.as_array()
            .and_then(|apps| apps.first())
            .and_then(|a| a["offcodes"].as_array())
            .and_then(|o| o.iter().find(|o| o["name"] == "flaky").cloned())
            .unwrap_or_default()
    };
    assert!(
        wait_for(
            || flaky()["restarts"] == 2 && flaky()["state"] == "running",
            20
        ),
        "{}",
        flaky()
    );
    // Its third life runs on: the checksum keeps counting, with no gap.
    let ps = text(&run(&["ps", "--socket", sock])).0;
    assert!(ps.contains("RESTARTS"), "{ps}");
    let events = text(&run(&["events", "restart-demo", "--socket", sock])).0;
    for want in [
        "flaky: failed: injected fault after",
        "flaky: restarting in 20 ms (restart 1 of 5",
        "flaky: restarting in 40 ms (restart 2 of 5",
        "flaky: restarted (restart 2)",
    ] {
        assert!(events.contains(want), "{want:?} not in\n{events}");
    }
    let series = "sidecore_offcode_restarts_total{app=\"restart-demo\",offcode=\"flaky\"}";
    assert!(
        wait_for(
            || common::sample(&get(d.http, "/metrics").1, series) == Some(2.0),
            5
        ),
        "{}",
        get(d.http, "/metrics").1
    );
    let gaps = "sidecore_offcode_reported{app=\"restart-demo\",offcode=\"checksum\",name=\"sequence_gaps\"}";
    assert_eq!(common::sample(&get(d.http, "/metrics").1, gaps), Some(0.0));
    let _ = run(&["down", "--daemon", "--socket", sock]);
}

#[test]
fn the_total_order_demo_shows_its_progress_on_a_terminal_only() {
    if !sidecore_testbed::testing::root() {
        return;
    }
    let _g = serial();
    let prefix = format!("top{}", std::process::id() % 10_000);
    let _clean = sidecore_testbed::testing::Cleanup(format!("{prefix}3"));
    let args =
        format!("demo total-order --nodes 3 --messages 100 --variants offloaded --prefix {prefix}");
    // On a terminal (script(1) gives it a pty): the bar names the run.
    let tty = Command::new("script")
        .args([
            "-qfec",
            &format!("{} {args}", env!("CARGO_BIN_EXE_sidecore")),
            "/dev/null",
        ])
        .output()
        .expect("script(1) from util-linux");
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{shown}");
    assert!(
        shown.contains("total order: offloaded orderer on 3 nodes") && shown.contains("1/1"),
        "{shown}"
    );
    assert!(shown.contains("Total order, all-to-all"), "{shown}");
    // Piped: the table and the per-run line, no bar.
    let piped = run(&args.split(' ').collect::<Vec<_>>());
    let (o, e) = text(&piped);
    assert!(piped.status.success(), "{o}\n{e}");
    assert!(o.contains("Total order, all-to-all"), "{o}");
    assert!(
        !o.contains("total order:") && !e.contains("total order:"),
        "{o}\n{e}"
    );
}
