//! End to end on loopback: real sockets, real PPE threads pinned to real
//! CPUs, real application threads. Correct clients get every byte in order;
//! misbehaving ones (never reading, slowloris, half-open, RST storms) cost
//! only their own queues; PPEs come and go under load without losing a
//! connection; bad HTTP gets the right status and is counted.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use sidecore_tcps::apps::{self, HttpLimits, Site};
use sidecore_tcps::{App, AppEvent, Config, Conn, CoreSet, RecvStatus, TcpServers, usable_cpus};

fn config(allowed: &[usize], master: usize) -> Config {
    let mut c = Config::new(
        "127.0.0.1:0".parse().expect("address"),
        CoreSet::of(allowed).expect("cpus"),
    );
    c.master = master;
    c.spin_polls = 200;
    c
}

/// One PPE on the last CPU (the master); the test's threads share the rest.
fn one_ppe() -> Config {
    let cpus = usable_cpus();
    let last = *cpus.last().expect("a CPU");
    config(&[last], last)
}

/// An echo application: every byte back, in order; never drops a byte when
/// the send ring is full (it stops reading instead).
fn echo(app: App, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut conns: HashMap<u64, (Conn, Vec<u8>)> = HashMap::new();
        let mut sweep = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let id = match app.next_event(Duration::from_millis(10)) {
                Some(AppEvent::Accepted(c)) => {
                    let id = c.id();
                    conns.insert(id, (*c, Vec::new()));
                    Some(id)
                }
                Some(AppEvent::Ready(id)) => Some(id),
                None => None,
            };
            let ids: Vec<u64> = if sweep.elapsed() > Duration::from_millis(50) {
                sweep = Instant::now();
                conns.keys().copied().collect()
            } else {
                id.into_iter().collect()
            };
            for id in ids {
                let Some((c, out)) = conns.get_mut(&id) else {
                    continue;
                };
                let mut done = false;
                loop {
                    if !out.is_empty() {
                        let n = c.send(out);
                        out.drain(..n);
                        if !out.is_empty() {
                            break;
                        }
                    }
                    match c.try_recv(out, 64 * 1024) {
                        RecvStatus::Data(_) => {}
                        RecvStatus::Empty => break,
                        RecvStatus::Eof | RecvStatus::Closed(_) => {
                            done = out.is_empty();
                            break;
                        }
                    }
                }
                if done {
                    conns.remove(&id);
                }
            }
        }
    })
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `len` bytes and reads them back, checking every byte in order.
fn echo_client(addr: SocketAddr, seed: u64, len: usize) -> Result<(), String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let data = pattern(seed, len);
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let d2 = data.clone();
    let writer = thread::spawn(move || {
        for chunk in d2.chunks(7001) {
            w.write_all(chunk).map_err(|e| format!("write: {e}"))?;
        }
        w.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())
    });
    let mut got = Vec::with_capacity(len);
    let mut r = s;
    let mut buf = [0u8; 16384];
    while got.len() < len {
        let n = r
            .read(&mut buf)
            .map_err(|e| format!("read after {} bytes: {e}", got.len()))?;
        if n == 0 {
            return Err(format!("EOF after {} of {len} bytes", got.len()));
        }
        got.extend_from_slice(&buf[..n]);
    }
    writer.join().map_err(|_| "writer panicked".to_string())??;
    if got != data {
        let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("byte {at} differs"));
    }
    Ok(())
}

fn rst(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a live linger of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const l).cast(),
            size_of::<libc::linger>() as u32,
        );
    }
}

#[test]
fn many_correct_clients_get_every_byte_in_order() {
    let server = TcpServers::start(one_ppe()).expect("start");
    let stop = Arc::new(AtomicBool::new(false));
    let app = echo(server.app(), Arc::clone(&stop));
    let addr = server.local_addr();
    let clients: Vec<_> = (0..48)
        .map(|i| thread::spawn(move || echo_client(addr, i, 128 * 1024 + i as usize * 997)))
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        c.join()
            .expect("client thread")
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
    }
    let st = server.stats();
    assert_eq!(st.total(|p| p.accepted), 48);
    assert!(st.total(|p| p.bytes_in) >= 48 * 128 * 1024);
    stop.store(true, Ordering::Release);
    app.join().expect("app");
}

#[test]
fn misbehaving_clients_cost_only_their_own_queues() {
    let mut cfg = one_ppe();
    cfg.first_byte_timeout = Duration::from_millis(2000);
    let server = TcpServers::start(cfg).expect("start");
    let stop = Arc::new(AtomicBool::new(false));
    let app = echo(server.app(), Arc::clone(&stop));
    let addr = server.local_addr();
    // Never-reading clients: they send 4 MiB each and read nothing back.
    let hogs: Vec<TcpStream> = (0..4)
        .map(|_| {
            let s = TcpStream::connect(addr).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            s
        })
        .collect();
    let hog_writer = {
        let hogs: Vec<TcpStream> = hogs.iter().map(|s| s.try_clone().expect("clone")).collect();
        thread::spawn(move || {
            let junk = vec![7u8; 64 * 1024];
            let end = Instant::now() + Duration::from_secs(3);
            while Instant::now() < end {
                for mut h in &hogs {
                    let _ = h.write(&junk);
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Half-open: connect, never send.
    let silent: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // Slowloris: one byte every 100 ms.
    let slow = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        for _ in 0..20 {
            if s.write_all(b"x").is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    // RST storm: 200 connections reset right after connecting (some mid-send).
    let storm = thread::spawn(move || {
        for i in 0..200 {
            if let Ok(mut s) = TcpStream::connect(addr) {
                if i % 2 == 0 {
                    let _ = s.write_all(&[1u8; 3000]);
                }
                rst(&s);
            }
        }
    });
    // Meanwhile, correct clients get every byte in order.
    let good: Vec<_> = (0..16)
        .map(|i| thread::spawn(move || echo_client(addr, 100 + i, 256 * 1024)))
        .collect();
    let t0 = Instant::now();
    for (i, c) in good.into_iter().enumerate() {
        c.join()
            .expect("client")
            .unwrap_or_else(|e| panic!("good client {i}: {e}"));
    }
    let good_time = t0.elapsed();
    storm.join().expect("storm");
    slow.join().expect("slowloris");
    hog_writer.join().expect("hogs");
    thread::sleep(Duration::from_millis(1200));
    let st = server.stats();
    assert!(
        good_time < Duration::from_secs(15),
        "correct clients took {good_time:?}"
    );
    assert!(
        st.total(|p| p.rq_full_stalls) >= 4,
        "never-reading clients: {st:?}"
    );
    assert!(st.total(|p| p.closed_half_open) >= 4, "half-open: {st:?}");
    assert!(st.total(|p| p.closed_reset) >= 50, "RST storm: {st:?}");
    // And the server still serves.
    echo_client(addr, 999, 64 * 1024).expect("after the storm");
    drop(silent);
    drop(hogs);
    stop.store(true, Ordering::Release);
    app.join().expect("app");
}

#[test]
fn adding_and_removing_ppes_under_load_loses_no_connection() {
    let cpus = usable_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let (a, b) = (cpus[cpus.len() - 2], cpus[cpus.len() - 1]);
    let server = Arc::new(TcpServers::start(config(&[a, b], b)).expect("start"));
    let stop = Arc::new(AtomicBool::new(false));
    let app = echo(server.app(), Arc::clone(&stop));
    let addr = server.local_addr();
    let clients: Vec<_> = (0..24)
        .map(|i| thread::spawn(move || echo_client(addr, 500 + i, 3 * 1024 * 1024)))
        .collect();
    let churn = {
        let server = Arc::clone(&server);
        thread::spawn(move || {
            for _ in 0..4 {
                thread::sleep(Duration::from_millis(60));
                server.add_ppe(a).expect("add");
                assert!(server.active().contains(a));
                thread::sleep(Duration::from_millis(60));
                server.remove_ppe(a).expect("remove");
                assert!(!server.active().contains(a));
            }
            // The master cannot be removed; an unknown CPU is refused by name.
            let e = server.remove_ppe(b).expect_err("master");
            assert!(e.to_string().contains("master"), "{e}");
            let e = server.add_ppe(63).expect_err("not allowed");
            assert!(e.to_string().contains("AllowedPPE"), "{e}");
        })
    };
    for (i, c) in clients.into_iter().enumerate() {
        c.join()
            .expect("client")
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
    }
    churn.join().expect("churn");
    let st = server.stats();
    assert_eq!(st.total(|p| p.closed_reset), 0, "{st:?}");
    assert!(
        st.total(|p| p.handed_off) > 0,
        "no connection moved: {st:?}"
    );
    assert_eq!(
        st.total(|p| p.handed_off),
        st.total(|p| p.adopted),
        "{st:?}"
    );
    stop.store(true, Ordering::Release);
    app.join().expect("app");
}

fn get(addr: SocketAddr, req: &[u8]) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(req).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.lines().next().unwrap_or("").to_string();
    (status, out)
}

#[test]
fn http_answers_good_and_bad_requests_and_counts_them() {
    let server = TcpServers::start(one_ppe()).expect("start");
    let page: Vec<u8> = pattern(1, 32 * 1024);
    let big: Vec<u8> = pattern(2, 8 * 1024 * 1024);
    let site = Site::from_pages(&server, &[("/index.html", page.clone()), ("/big", big)]);
    let stop = Arc::new(AtomicBool::new(false));
    let app = server.app();
    let counters = server.counters();
    let limits = HttpLimits {
        max_head: 4096,
        head_timeout: Duration::from_millis(500),
    };
    let stop2 = Arc::clone(&stop);
    let h = thread::spawn(move || apps::serve_http(&app, &site, limits, &counters, &stop2));
    let addr = server.local_addr();

    // Two keep-alive requests on one connection, then close.
    let (status, body) = get(
        addr,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /index.html HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        body.windows(page.len()).filter(|w| *w == &page[..]).count(),
        2
    );
    assert!(get(addr, b"GET /nope HTTP/1.0\r\n\r\n").0.contains("404"));
    assert!(
        get(addr, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")
            .0
            .contains("400")
    );
    assert!(get(addr, b"\x00\x01\x02garbage\r\n\r\n").0.contains("400"));
    let long = format!("GET / HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(10_000));
    assert!(get(addr, long.as_bytes()).0.contains("431"));
    assert!(get(addr, b"POST / HTTP/1.1\r\n\r\n").0.contains("405"));
    // Slowloris: a head that never ends gets 408.
    {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        s.write_all(b"GET / HTTP/1.1\r\n").expect("write");
        for _ in 0..8 {
            thread::sleep(Duration::from_millis(100));
            if s.write_all(b"X-a: b\r\n").is_err() {
                break;
            }
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 408"), "slowloris got {out:?}");
    }
    // A peer that resets in the middle of an 8 MiB response.
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /big HTTP/1.1\r\n\r\n").expect("write");
        let mut buf = [0u8; 4096];
        s.read_exact(&mut buf).expect("some of the body");
        rst(&s);
    }
    thread::sleep(Duration::from_millis(300));
    // Still serving.
    assert_eq!(get(addr, b"GET / HTTP/1.0\r\n\r\n").0, "HTTP/1.1 200 OK");
    let st = server.stats();
    let c = |k: &str| st.app.get(k).copied().unwrap_or(0);
    assert_eq!(c("http_400"), 2, "{:?}", st.app);
    assert_eq!(c("http_431"), 1);
    assert_eq!(c("http_405"), 1);
    assert_eq!(c("http_408"), 1);
    assert_eq!(c("http_404"), 1);
    assert!(c("http_200") >= 6, "{:?}", st.app);
    assert!(st.total(|p| p.closed_reset) >= 3, "{st:?}");
    stop.store(true, Ordering::Release);
    h.join().expect("http app");
}

#[test]
fn the_block_streamer_sends_the_file_block_by_block() {
    let server = TcpServers::start(one_ppe()).expect("start");
    let file: Vec<u8> = pattern(3, 1024 * 1024);
    let blob = server.register_blob(file.clone().into());
    let app = server.app();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let len = file.len() as u64;
    let h = thread::spawn(move || apps::serve_stream(&app, blob, len, 8192, &stop2));
    let addr = server.local_addr();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let file = file.clone();
            thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut block = vec![0u8; 8192];
                for i in 0..300usize {
                    s.read_exact(&mut block).expect("block");
                    let off = (i * 8192) % file.len();
                    assert_eq!(&block[..], &file[off..off + 8192], "block {i}");
                    s.write_all(b"a").expect("ack");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("stream client");
    }
    stop.store(true, Ordering::Release);
    h.join().expect("streamer");
}

#[test]
fn the_epoll_backend_serves_too() {
    let mut cfg = one_ppe();
    cfg.backend = sidecore_tcps::Backend::Epoll;
    let server = TcpServers::start(cfg).expect("start");
    let stop = Arc::new(AtomicBool::new(false));
    let app = echo(server.app(), Arc::clone(&stop));
    let addr = server.local_addr();
    let clients: Vec<_> = (0..8)
        .map(|i| thread::spawn(move || echo_client(addr, 700 + i, 256 * 1024)))
        .collect();
    for c in clients {
        c.join().expect("client").expect("echo over epoll");
    }
    assert!(
        server.stats().backend.starts_with("epoll"),
        "{}",
        server.stats().backend
    );
    stop.store(true, Ordering::Release);
    app.join().expect("app");
}

#[test]
fn connections_one_after_another_reuse_pooled_rings_and_stay_byte_exact() {
    let mut cfg = one_ppe();
    cfg.ring_pool = 4;
    let server = TcpServers::start(cfg).expect("start");
    let stop = Arc::new(AtomicBool::new(false));
    let app = echo(server.app(), Arc::clone(&stop));
    let addr = server.local_addr();
    // Each connection echoes a different pattern on rings another one used:
    // a stale message from a former life would show as a wrong byte.
    for i in 0..40u64 {
        echo_client(addr, 1000 + i, 3000 + i as usize * 131)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        // Let the PPE close it (and give its rings back) before the next.
        let t0 = Instant::now();
        while server.stats().total(|p| p.conns) > 0 && t0.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let st = server.stats();
    assert_eq!(st.total(|p| p.accepted), 40);
    assert!(
        st.rings_reused >= 2 * 30,
        "rings reused {} (fresh {}): the pool should serve most connections",
        st.rings_reused,
        st.rings_fresh
    );
    assert!(st.rings_fresh <= 2 * 8, "fresh rings {}", st.rings_fresh);
    stop.store(true, Ordering::Release);
    app.join().expect("app");
}
