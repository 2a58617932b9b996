//! Benchmark of the agent's datapath against a direct Unix socket, side by
//! side in one run (as root: the two ends are two processes in two cgroups,
//! so the agent attests them as two identities). 64-byte messages.
//!
//! * Round trip: A sends to B through the agent, B answers to A through the
//!   agent; against A and B bouncing the same bytes over a `SOCK_SEQPACKET`
//!   socket pair. The agent's added latency per message is half the
//!   difference of the medians (two traversals per round trip).
//! * Throughput: A sends N messages to B as fast as the client library lets it,
//!   first with `send` (each waits for the agent's verdict), then with `post`
//!   (pipelined: verdicts collected as they come, refused ones sent again),
//!   timed until B has taken the last; against A writing N messages straight
//!   into the socket pair.
//!
//! * Across hosts: the same round trips and throughput with A and B placed on
//!   two hosts whose agents (two threads here) link over mutual TLS on
//!   loopback, so every message is checked at the sender's agent, forwarded,
//!   checked at the receiver's and answered with its verdict; against a bare
//!   TCP connection on loopback carrying the same request/response.
//!
//! * On a core of its own: the same local paths with the agent busy-polling
//!   on another CPU (`AGENT_BENCH_AGENT_CPU`, default 0) while both ends stay
//!   on theirs.
//!
//! Run: `cargo bench -p sidecore-sikker-agent --bench agent` (environment:
//! `AGENT_BENCH_CPU`, default 1, the one CPU everything runs on, `none` to unpin;
//! `AGENT_BENCH_ROUNDS`, default 20,000; `AGENT_BENCH_MSGS`, default 100,000).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, recv, send, socketpair};
use sidecore_sikker_agent::links::Links;
use sidecore_sikker_agent::server::Server;
use sidecore_sikker_agent::tls;
use sidecore_sikker_agent::{AgentCore, Client, ClientError, Denied, Dest};
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};

const MSG: usize = 64;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cgroup2_root() -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    m.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if !post.starts_with("cgroup2 ") {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The echo side (a child process of the benchmark, in cgroup `b`): attach,
/// listen, and send every message back to `a:1:In` until told to stop.
fn echo(sock: &Path) {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap(); // "go": now in its cgroup
    let mut c = Client::connect(sock).unwrap();
    c.listen().unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let back: Dest = "a:1:In".parse().unwrap();
    while let Some(d) = c.recv(Duration::from_secs(3)).unwrap() {
        if d.payload.is_empty() {
            break;
        }
        match d.payload[0] {
            b'p' => c.send(&back, &d.payload).unwrap(),
            b'r' => drop(c.post(&back, &d.payload).unwrap()),
            _ => {}
        }
    }
}

/// Round trips and throughput from A (this process, attached to `a_sock`)
/// to B (an echo child in cgroup `b`, attached to `b_sock`).
fn through(
    top: &Path,
    a_sock: &Path,
    b_sock: &Path,
    rounds: u64,
    msgs: u64,
) -> (Vec<u64>, Vec<u64>, f64, f64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("AGENT_BENCH_ECHO", b_sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(top.join("b").join("cgroup.procs"), child.id().to_string()).unwrap();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let mut a = Client::connect(a_sock).unwrap();
    a.listen().unwrap();
    let to_b: Dest = "b:1:In".parse().unwrap();
    let ping = [b'p'; MSG];
    // Round trips through the agent.
    let mut agent_rtt = Vec::with_capacity(rounds as usize);
    for i in 0..rounds + 1000 {
        let t = Instant::now();
        a.send(&to_b, &ping).unwrap();
        let d = a.recv(Duration::from_secs(5)).unwrap().unwrap();
        if i >= 1000 {
            agent_rtt.push(t.elapsed().as_nanos() as u64);
        }
        assert_eq!(d.from.to_string(), "b:1");
    }
    // Round trips with posted messages: neither end waits for a verdict.
    let mut posted_rtt = Vec::with_capacity(rounds as usize);
    let rping = [b'r'; MSG];
    for i in 0..rounds + 1000 {
        let t = Instant::now();
        a.post(&to_b, &rping).unwrap();
        let d = a.recv(Duration::from_secs(5)).unwrap().unwrap();
        if i >= 1000 {
            posted_rtt.push(t.elapsed().as_nanos() as u64);
        }
        assert_eq!(d.payload[0], b'r');
    }
    assert!(a.flush(Duration::from_secs(5)).unwrap().is_empty());
    // Throughput through the agent (the echo side ignores these: 'q'), one
    // verdict awaited per message, then pipelined.
    let quiet = [b'q'; MSG];
    let t = Instant::now();
    let mut full = 0u64;
    for _ in 0..msgs {
        // A receiver whose socket is full refuses the message (it is not
        // dropped silently): the sender backs off and sends it again.
        loop {
            match a.send(&to_b, &quiet) {
                Ok(()) => break,
                Err(ClientError::Denied(Denied::Undeliverable(_) | Denied::Remote { .. })) => {
                    full += 1;
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    let agent_tput = msgs as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut left = msgs;
    while left > 0 {
        for _ in 0..left {
            a.post(&to_b, &quiet).unwrap();
        }
        let refused = a.flush(Duration::from_secs(10)).unwrap();
        for (_, why) in &refused {
            assert!(
                matches!(why, Denied::Undeliverable(_) | Denied::Remote { .. }),
                "{why}"
            );
        }
        left = refused.len() as u64;
        full += left;
        if left > 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // B takes messages in order: its echo of one more ping means it has
    // taken every quiet one.
    a.send(&to_b, &ping).unwrap();
    a.recv(Duration::from_secs(5)).unwrap().unwrap();
    let pipelined_tput = msgs as f64 / t.elapsed().as_secs_f64();
    if full > 0 {
        println!("(the receiver was full {full} times: those messages were sent again)");
    }
    a.send(&to_b, &[]).unwrap(); // stop the echo
    let _ = child.wait();

    (agent_rtt, posted_rtt, agent_tput, pipelined_tput)
}

/// A on host h1 and B on host h2, whose agents link over mutual TLS on
/// loopback; then the bare-TCP control.
fn across_hosts(
    top: &Path,
    policy: &sidecore_sikker_policy::Policy,
    dir: &Path,
    stop: &Arc<AtomicBool>,
    rounds: u64,
    msgs: u64,
) -> (Vec<u64>, f64, f64, Vec<u64>, f64) {
    let two = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h1\"\nprocesses = [\"a:1\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"b:1\"]\n",
        policy,
    )
    .unwrap();
    let certs = dir.join("tls");
    tls::generate(&certs, &["h1".into(), "h2".into()]).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h2_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut far = Vec::new();
    for (h, listen, peer) in [
        (
            "h1",
            "127.0.0.1:0".parse().unwrap(),
            ("h2".to_string(), h2_addr),
        ),
        (
            "h2",
            h2_addr,
            ("h1".to_string(), "127.0.0.1:1".parse().unwrap()),
        ),
    ] {
        let core = AgentCore::new(Nos::compile(policy.clone(), &two).unwrap(), h).unwrap();
        let links = Links::bind(
            h,
            core.peer_hosts().into_iter().collect(),
            tls::load(&tls::TlsFiles::in_dir(&certs, h)).unwrap(),
            listen,
            &[peer],
        )
        .unwrap();
        let path = dir.join(format!("{h}.sock"));
        let mut s = Server::bind(core, &path).unwrap().with_links(links);
        let st = Arc::clone(stop);
        far.push((path, std::thread::spawn(move || s.run(&st).unwrap())));
    }
    // Let the two agents link.
    std::thread::sleep(Duration::from_millis(800));
    let (rtt, _, tput, piped) = through(top, &far[0].0, &far[1].0, rounds, msgs);
    let (tcp_rtt, tcp_tput) = tcp_control(rounds, msgs);
    (rtt, tput, piped, tcp_rtt, tcp_tput)
}

/// The same request/response over a bare TCP connection on loopback.
fn tcp_control(rounds: u64, msgs: u64) -> (Vec<u64>, f64) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = [0u8; MSG];
        while s.read_exact(&mut buf).is_ok() {
            if buf[0] == b'x' {
                break;
            }
            // Every message is answered, as the agents answer each send.
            s.write_all(&buf).unwrap();
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let ping = [b'p'; MSG];
    let mut buf = [0u8; MSG];
    let mut rtt = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(&ping).unwrap();
        s.read_exact(&mut buf).unwrap();
        rtt.push(t.elapsed().as_nanos() as u64);
    }
    let t0 = Instant::now();
    for _ in 0..msgs {
        s.write_all(&ping).unwrap();
        s.read_exact(&mut buf).unwrap();
    }
    let tput = msgs as f64 / t0.elapsed().as_secs_f64();
    s.write_all(&[b'x'; MSG]).unwrap();
    t.join().unwrap();
    (rtt, tput)
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// The controls: A and an echo thread B over `SOCK_SEQPACKET` socket pairs,
/// the same round trips and one-way messages as through the agent. With
/// `relay_cpu`, a bare relay thread busy-polling on that CPU forwards both
/// ways between two socket pairs (what an agent on its own core costs with
/// no checks at all); without, A and B share one pair.
fn direct_pair(rounds: u64, msgs: u64, relay_cpu: Option<usize>) -> (Vec<u64>, f64) {
    let pair = || {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::empty(),
        )
        .unwrap()
    };
    let (x, y) = pair();
    // The echo's end: y itself, or the far end of a relay.
    let (y, relay_t) = match relay_cpu {
        None => (y, None),
        Some(cpu) => {
            let (y2, z) = pair();
            let t = std::thread::spawn(move || {
                pin(cpu);
                let mut buf = [0u8; 256];
                let mut done = false;
                while !done {
                    for (from, to) in [(&y, &y2), (&y2, &y)] {
                        if let Ok(n) = recv(from.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                            send(to.as_raw_fd(), &buf[..n], MsgFlags::empty()).unwrap();
                            done |= n == 0 || buf[0] == b'x';
                        }
                    }
                }
            });
            (z, Some(t))
        }
    };
    let echo_t = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        loop {
            let n = recv(y.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
            if n == 0 || buf[0] == b'x' {
                break;
            }
            if buf[0] == b'p' {
                send(y.as_raw_fd(), &buf[..n], MsgFlags::empty()).unwrap();
            }
        }
    });
    let (ping, quiet) = ([b'p'; MSG], [b'q'; MSG]);
    let mut rtt = Vec::with_capacity(rounds as usize);
    let mut buf = [0u8; 256];
    for i in 0..rounds + 1000 {
        let t = Instant::now();
        send(x.as_raw_fd(), &ping, MsgFlags::empty()).unwrap();
        recv(x.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        if i >= 1000 {
            rtt.push(t.elapsed().as_nanos() as u64);
        }
    }
    let t = Instant::now();
    for _ in 0..msgs {
        send(x.as_raw_fd(), &quiet, MsgFlags::empty()).unwrap();
    }
    send(x.as_raw_fd(), b"x", MsgFlags::empty()).unwrap();
    echo_t.join().unwrap();
    let tput = msgs as f64 / t.elapsed().as_secs_f64();
    if let Some(t) = relay_t {
        t.join().unwrap();
    }
    (rtt, tput)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    if let Ok(sock) = std::env::var("AGENT_BENCH_ECHO") {
        echo(Path::new(&sock));
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { nix::libc::geteuid() } != 0 {
        println!("the agent benchmark needs root (two processes in two cgroups)");
        return;
    }
    // Every thread and process of the benchmark on one CPU (inherited by the
    // echo child and the agents' threads): unpinned, a wake-up on this VM
    // takes ~3 µs or ~30 µs depending on where the scheduler puts the two
    // ends, and the figures flip between the two. AGENT_BENCH_CPU=none unpins.
    if let Ok(cpu) = std::env::var("AGENT_BENCH_CPU").or_else(|_| Ok::<_, ()>("1".into()))
        && let Ok(cpu) = cpu.parse::<usize>()
    {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
        println!("all on CPU {cpu}");
    }
    let rounds = env("AGENT_BENCH_ROUNDS", 20_000);
    let msgs = env("AGENT_BENCH_MSGS", 100_000);
    let cg = cgroup2_root().expect("cgroup v2");
    let top = cg.join(format!("sc-agent-bench-{}", std::process::id()));
    for s in ["a", "b"] {
        std::fs::create_dir_all(top.join(s)).unwrap();
    }
    let rel = |s: &str| format!("/{}/{s}", top.file_name().unwrap().to_string_lossy());
    let policy = parse_policy(
        "bench.toml",
        &format!(
            "[[service]]\nname = \"a\"\ndomains = [\"In\"]\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n\
             [[service]]\nname = \"b\"\ndomains = [\"In\"]\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n\
             [[grant]]\nfrom = \"a\"\nto = \"b\"\nall_processes = true\nall_domains = true\n[[grant]]\nfrom = \"b\"\nto = \"a\"\nall_processes = true\nall_domains = true\n",
            rel("a"),
            rel("b")
        ),
    )
    .unwrap();
    let placement = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h\"\nprocesses = [\"a:1\", \"b:1\"]\n",
        &policy,
    )
    .unwrap();
    let nos = Nos::compile(policy.clone(), &placement).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let mut server = Server::bind(AgentCore::new(nos, "h").unwrap(), &sock).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stop);
    let agent = std::thread::spawn(move || server.run(&st).unwrap());
    // This process becomes a:1; the child becomes b:1.
    std::fs::write(
        top.join("a").join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    let (agent_rtt, agent_posted_rtt, agent_tput, agent_piped) =
        through(&top, &sock, &sock, rounds, msgs);
    // The same agent on a core of its own, busy-polling (the two ends stay
    // on their CPU).
    let own_cpu = env("AGENT_BENCH_AGENT_CPU", 0) as u32;
    let spun = {
        let nos = Nos::compile(policy.clone(), &placement).unwrap();
        let sock = dir.path().join("spun.sock");
        let mut server = Server::bind(AgentCore::new(nos, "h").unwrap(), &sock).unwrap();
        server.set_busy_poll(true);
        let st = Arc::new(AtomicBool::new(false));
        let st2 = Arc::clone(&st);
        let t = std::thread::spawn(move || {
            pin(own_cpu as usize);
            server.run(&st2).unwrap();
        });
        let r = through(&top, &sock, &sock, rounds, msgs);
        st.store(true, Ordering::Release);
        t.join().unwrap();
        r
    };
    let (far_rtt, far_tput, far_piped, tcp_rtt, tcp_tput) =
        across_hosts(&top, &policy, dir.path(), &stop, rounds / 4, msgs / 4);

    let (direct_rtt, direct_tput) = direct_pair(rounds, msgs, None);
    let (relay_rtt, relay_tput) = direct_pair(rounds, msgs, Some(own_cpu as usize));

    stop.store(true, Ordering::Release);
    agent.join().unwrap();
    // Back to the parent cgroup, then remove ours.
    std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string()).unwrap();
    for s in ["a", "b"] {
        let _ = std::fs::remove_dir(top.join(s));
    }
    let _ = std::fs::remove_dir(&top);

    let (ar, dr) = (median(agent_rtt), median(direct_rtt));
    let (fr, tr) = (median(far_rtt), median(tcp_rtt));
    println!("{rounds} round trips, {msgs} messages of {MSG} B");
    println!("| path | round trip p50 ns | one-way ≈ p50/2 ns | throughput msg/s |");
    println!("|---|---:|---:|---:|");
    println!(
        "| direct socket pair | {dr} | {} | {direct_tput:.0} |",
        dr / 2
    );
    println!(
        "| through the agent | {ar} | {} | {agent_tput:.0} |",
        ar / 2
    );
    let apr = median(agent_posted_rtt);
    println!(
        "| through the agent, pipelined (`post`) | {apr} | {} | {agent_piped:.0} |",
        apr / 2
    );
    let (sr, spr) = (median(spun.0), median(spun.1));
    println!(
        "| through the agent busy-polling on CPU {own_cpu} | {sr} | {} | {:.0} |",
        sr / 2,
        spun.2
    );
    println!(
        "| through the agent busy-polling on CPU {own_cpu}, pipelined | {spr} | {} | {:.0} |",
        spr / 2,
        spun.3
    );
    let rr = median(relay_rtt);
    println!(
        "| control: a bare relay busy-polling on CPU {own_cpu} (no checks) | {rr} | {} | {relay_tput:.0} |",
        rr / 2
    );
    println!(
        "on its own core, pipelined, the agent adds ≈ {} ns per message over the bare relay (p50) and keeps {:.3}× its throughput",
        spr.saturating_sub(rr) / 2,
        spun.3 / relay_tput
    );
    println!(
        "pipelined, the agent adds ≈ {} ns per message (p50) and keeps {:.3}× the direct throughput; on its own core ≈ {} ns and {:.3}× (one verdict at a time there: {} ns, {:.3}×)",
        apr.saturating_sub(dr) / 2,
        agent_piped / direct_tput,
        spr.saturating_sub(dr) / 2,
        spun.3 / direct_tput,
        sr.saturating_sub(dr) / 2,
        spun.2 / direct_tput
    );
    println!(
        "agent adds ≈ {} ns per message (p50, half the round-trip difference); throughput {:.3}× the direct socket one verdict at a time, {:.3}× pipelined",
        ar.saturating_sub(dr) / 2,
        agent_tput / direct_tput,
        agent_piped / direct_tput
    );
    println!(
        "| bare TCP on loopback (request/response) | {tr} | {} | {tcp_tput:.0} |",
        tr / 2
    );
    println!(
        "| through two agents over mutual TLS (loopback) | {fr} | {} | {far_tput:.0} |",
        fr / 2
    );
    println!("| through two agents, pipelined (`post`) | | | {far_piped:.0} |");
    println!(
        "across hosts the agents add ≈ {} ns per message over bare TCP (p50); throughput {:.3}× bare TCP request/response one verdict at a time, {:.3}× pipelined",
        fr.saturating_sub(tr) / 2,
        far_tput / tcp_tput,
        far_piped / tcp_tput
    );
}
