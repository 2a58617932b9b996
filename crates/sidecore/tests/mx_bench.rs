//! Metachory's benchmarks (issue 16), each beside native in the same run:
//! Table 9.1 (cost per system call and per page fault), Table 9.2
//! (CPU-bound programs), Fig. 9.3 (N concurrent jobs on one server) and
//! Table 9.3 (live migration between two daemons on loopback, eager and
//! lazy, beside a plain TCP copy of the same bytes).
//! Run: `cargo test --release -p sidecore --test mx_bench -- --ignored --nocapture`
//! (root; `metachory_migration` alone for Table 9.3). Prints the tables
//! BENCHMARKS.md quotes.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // benchmark code

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{Guard, wait_for};

const PROBE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define REGION (16<<20)
#define STRIDE (16<<10)
int main(int argc, char **argv){
  int n = 20000; double t0, best;
  /* getpid: not trapped by the seccomp filter, trapped by ptrace */
  best = 1e18;
  for (int r = 0; r < 5; r++) { t0 = now(); for (int i = 0; i < n; i++) syscall(SYS_getpid); double d = (now()-t0)/n; if (d < best) best = d; }
  printf("getpid %.1f\n", best);
  /* open+close of a projected file: trapped (emulated, injected) */
  best = 1e18;
  for (int r = 0; r < 3; r++) { t0 = now(); for (int i = 0; i < 2000; i++) { int fd = open(argv[1], O_RDONLY); close(fd); } double d = (now()-t0)/2000; if (d < best) best = d; }
  printf("open %.1f\n", best);
  /* a round trip between two processes over pipes: untrapped, the price of
     the two wake-ups every trapped call also pays (the control) */
  { int a[2], b[2]; char x = 0; int m = 20000; pipe(a); pipe(b);
    if (fork() == 0) { for (int i = 0; i < m; i++) { read(a[0], &x, 1); write(b[1], &x, 1); } _exit(0); }
    t0 = now(); for (int i = 0; i < m; i++) { write(a[1], &x, 1); read(b[0], &x, 1); }
    printf("pingpong %.1f\n", (now()-t0)/m); wait(0); }
  /* page faults on a 16 MB anonymous region, 16 KB stride (seed 9.1) */
  double rf = 0, war = 0, dw = 0;
  for (int r = 0; r < 5; r++) {
    char *m = mmap(0, REGION, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    volatile char s = 0; t0 = now(); for (long o = 0; o < REGION; o += STRIDE) s += m[o]; rf += (now()-t0)/(REGION/STRIDE);
    t0 = now(); for (long o = 0; o < REGION; o += STRIDE) m[o] = 1; war += (now()-t0)/(REGION/STRIDE);
    munmap(m, REGION);
    m = mmap(0, REGION, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    t0 = now(); for (long o = 0; o < REGION; o += STRIDE) m[o] = 1; dw += (now()-t0)/(REGION/STRIDE);
    munmap(m, REGION);
  }
  printf("readfault %.1f\nwriteafterread %.1f\ndirectwrite %.1f\n", rf/5, war/5, dw/5);
  return 0;
}
"#;

const SIEVE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv){
  long n = atol(argv[1]); long count = 0;
  char *c = calloc(n, 1);
  for (int rep = 0; rep < 6; rep++) { count = 0;
    for (long i = 2; i < n; i++) c[i] = 0;
    for (long i = 2; i < n; i++) if (!c[i]) { count++; for (long j = i * 2; j < n; j += i) c[j] = 1; } }
  printf("%ld\n", count);
  return 0;
}
"#;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn daemon(dir: &Path) -> (Guard, String) {
    daemon_named(dir, "bench")
}

fn daemon_named(dir: &Path, name: &str) -> (Guard, String) {
    let addr = format!("127.0.0.1:{}", common::free_port());
    let g = Guard(
        Command::new(env!("CARGO_BIN_EXE_sidecore"))
            .args([
                "daemon", "--name", name, "--listen", &addr, "--http", "off", "--socket",
            ])
            .arg(dir.join(format!("{name}.sock")))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| TcpStream::connect(&addr).is_ok(), 20));
    (g, addr)
}

fn cc(dir: &Path, name: &str, src: &str) {
    std::fs::write(dir.join(format!("{name}.c")), src).unwrap();
    let o = Command::new("cc")
        .args(["-O2", "-o", name, &format!("{name}.c")])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Runs `args` natively or through `exec --on` (with extra flags).
fn run(dir: &Path, node: Option<(&str, &[&str])>, args: &[&str]) -> (String, f64) {
    let mut c = match node {
        None => {
            let mut c = Command::new(args[0]);
            c.args(&args[1..]);
            c
        }
        Some((addr, extra)) => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_sidecore"));
            c.args(["exec", "-q", "--discard", "--on", addr])
                .args(extra)
                .args(args);
            c
        }
    };
    let t0 = Instant::now();
    let o = c.current_dir(dir).stdin(Stdio::null()).output().unwrap();
    let s = t0.elapsed().as_secs_f64();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (String::from_utf8_lossy(&o.stdout).into_owned(), s)
}

fn field(out: &str, name: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
        .unwrap()
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn metachory_tables() {
    assert!(root(), "the Metachory benchmarks need root");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cc(d, "probe", PROBE);
    cc(d, "sieve", SIEVE);
    std::fs::write(d.join("f.txt"), "x").unwrap();
    let (_g, addr) = daemon(d);
    let seccomp: &[&str] = &[];
    let ptrace: &[&str] = &["--ptrace"];
    // Table 9.1.
    let native = run(d, None, &["./probe", "f.txt"]).0;
    let sec = run(d, Some((&addr, seccomp)), &["./probe", "f.txt"]).0;
    let pt = run(d, Some((&addr, ptrace)), &["./probe", "f.txt"]).0;
    // The guest and its supervisor on one CPU (`exec --cpu`).
    let one_cpu: &[&str] = &["--cpu", "1"];
    let pinned = run(d, Some((&addr, one_cpu)), &["./probe", "f.txt"]).0;
    println!("\nTable 9.1 (ns per operation; ratio to native)");
    println!(
        "| operation | native ns | seccomp ns | × | seccomp, --cpu 1 ns | × | ptrace-sysemu ns | × | seed × |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, label, seed) in [
        (
            "getpid",
            "getpid (min of 5×20,000)",
            "75.6 (min) – 119.9 (avg)",
        ),
        ("open", "open+close, projected file (trapped)", "–"),
        (
            "pingpong",
            "control: a round trip between two processes over pipes (not trapped)",
            "–",
        ),
        ("readfault", "read fault (16 MB, 16 KB stride)", "67.7"),
        ("writeafterread", "write after read", "22.8"),
        ("directwrite", "direct write", "58.4"),
    ] {
        let (a, b, c) = (field(&native, name), field(&sec, name), field(&pt, name));
        let p = field(&pinned, name);
        println!(
            "| {label} | {a:.1} | {b:.1} | {:.2} | {p:.1} | {:.2} | {c:.1} | {:.2} | {seed} |",
            b / a,
            p / a,
            c / a
        );
    }
    // Table 9.2: CPU-bound programs, wall time, median of 3.
    println!("\nTable 9.2 (wall seconds, median of 3; % of native speed)");
    println!("| program | native s | exec --on s | % of native | seed % |");
    println!("|---|---|---|---|---|");
    let py = "s=0\nfor i in range(6000000): s+=i*i%7\nprint(s)\n";
    std::fs::write(d.join("loop.py"), py).unwrap();
    for (label, args, seed) in [
        (
            "C sieve, 6 × 50M",
            &["./sieve", "50000000"][..],
            "99.2–101.5 (MOCA, SimpleScalar, SPICE)",
        ),
        (
            "python3 loop, 6M",
            &["/usr/bin/python3", "loop.py"][..],
            "71.1–73.2 (POV-Ray, BLAST)",
        ),
    ] {
        let mut n: Vec<f64> = (0..3).map(|_| run(d, None, args).1).collect();
        let mut r: Vec<f64> = (0..3)
            .map(|_| run(d, Some((&addr, seccomp)), args).1)
            .collect();
        n.sort_by(f64::total_cmp);
        r.sort_by(f64::total_cmp);
        println!(
            "| {label} | {:.3} | {:.3} | {:.1} | {seed} |",
            n[1],
            r[1],
            100.0 * n[1] / r[1]
        );
    }
    // Fig. 9.3: N concurrent jobs on one server (this machine has 2 CPUs).
    println!("\nFig. 9.3 (N concurrent sieve jobs, 20M each: wall seconds until all N end)");
    println!("| N | native s | exec --on s | ratio |");
    println!("|---|---|---|---|");
    for n in [1usize, 2, 4, 8] {
        let mut means = Vec::new();
        for remote in [false, true] {
            let t0 = Instant::now();
            let kids: Vec<_> = (0..n)
                .map(|_| {
                    let mut c = if remote {
                        let mut c = Command::new(env!("CARGO_BIN_EXE_sidecore"));
                        c.args([
                            "exec",
                            "-q",
                            "--discard",
                            "--on",
                            &addr,
                            "./sieve",
                            "20000000",
                        ]);
                        c
                    } else {
                        let mut c = Command::new("./sieve");
                        c.arg("20000000");
                        c
                    };
                    c.current_dir(d)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for mut k in kids {
                assert!(k.wait().unwrap().success());
            }
            means.push(t0.elapsed().as_secs_f64());
        }
        println!(
            "| {n} | {:.3} | {:.3} | {:.3} |",
            means[0],
            means[1],
            means[1] / means[0]
        );
    }
}

/// A plain copy of `bytes` over loopback TCP, from a buffer that holds them
/// all into fresh memory of the same size (what a migration's page stream
/// does, without the guest): seconds.
fn tcp_copy(bytes: usize) -> f64 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut into = vec![0u8; bytes];
        let mut got = 0;
        while got < bytes {
            let n = s.read(&mut into[got..]).unwrap();
            assert!(n > 0);
            got += n;
        }
        into[bytes / 2]
    });
    let from: Vec<u8> = (0..bytes).map(|i| (i * 7 + 3) as u8).collect();
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    for c in from.chunks(1 << 20) {
        s.write_all(c).unwrap();
    }
    let mid = rx.join().unwrap();
    let t = t0.elapsed().as_secs_f64();
    assert_eq!(mid, from[bytes / 2]);
    t
}

/// The figures `sidecore migrate --json` prints.
#[derive(serde::Deserialize)]
struct Moved {
    error: Option<String>,
    freeze_us: u64,
    total_us: u64,
    pages_bytes: u64,
    resident_bytes: u64,
    faults: u64,
}

/// Starts the counter with a `mb` MB heap on `from`, moves it to `to`
/// once it counts, and lets it end there: the figures and the command's
/// wall time (the guest's heap checksum and exit status are checked).
fn migrate_once(d: &Path, from: &str, to: &str, mb: u64, lazy: bool) -> (Moved, f64) {
    use std::io::{BufRead, BufReader};
    let mut c = Command::new(env!("CARGO_BIN_EXE_sidecore"));
    c.args(["exec", "-q", "--discard", "--on", from, "./mx_counter"])
        .args([&mb.to_string(), "300", "10"])
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guard(c.spawn().unwrap());
    let mut out = BufReader::new(g.0.stdout.take().unwrap());
    let mut line = String::new();
    // The heap is filled and checksummed, then the counter runs.
    let mut first = String::new();
    while !line.starts_with('5') {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the counter ended");
        if first.is_empty() {
            first.clone_from(&line);
        }
    }
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
        text
    });
    let mut m = Command::new(env!("CARGO_BIN_EXE_sidecore"));
    m.args(["migrate", &g.0.id().to_string(), "--to", to, "--json"]);
    if lazy {
        m.arg("--lazy");
    }
    let t0 = Instant::now();
    let o = m.output().unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&o.stdout);
    let moved: Moved = serde_json::from_str(text.trim()).unwrap();
    assert!(moved.error.is_none(), "{:?}", moved.error);
    let status = common::wait_exit(&mut g.0, 120).expect("the guest ended");
    let text = rest.join().unwrap();
    let last = text.lines().rev().nth(1).unwrap_or_default();
    assert!(first.starts_with("checksum "), "{first}");
    assert_eq!(last, first.trim_end(), "the heap changed in the move");
    assert_eq!(status.code(), Some(7), "the guest's own status");
    (moved, wall)
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn metachory_migration() {
    assert!(root(), "the Metachory benchmarks need root");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../metachory/tests/data/mx_counter.c");
    cc(d, "mx_counter", &std::fs::read_to_string(src).unwrap());
    let (_ga, a) = daemon_named(d, "a");
    let (_gb, b) = daemon_named(d, "b");
    println!(
        "\nTable 9.3 (one guest moved a → b on loopback; best of 2 each; its heap checksum holds)"
    );
    println!(
        "| heap | mode | frozen s | all resident s | `migrate` wall s | MiB before resume | MiB resident | faults | TCP copy s | resident / copy | seed s (1 Gb/s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (mb, seed) in [(64, "0.94"), (256, "3.73"), (1024, "19.19")] {
        let bytes = usize::try_from(mb).unwrap() << 20;
        let copy = (0..2).map(|_| tcp_copy(bytes)).fold(f64::MAX, f64::min);
        for lazy in [false, true] {
            let runs: Vec<_> = (0..2).map(|_| migrate_once(d, &a, &b, mb, lazy)).collect();
            let (m, wall) = runs.into_iter().min_by_key(|(m, _)| m.total_us).unwrap();
            let total = m.total_us as f64 / 1e6;
            println!(
                "| {mb} MB | {} | {:.3} | {total:.3} | {wall:.3} | {:.1} | {:.1} | {} | {copy:.3} | {:.1} | {seed} |",
                if lazy { "lazy" } else { "eager" },
                m.freeze_us as f64 / 1e6,
                m.pages_bytes as f64 / f64::from(1 << 20),
                m.resident_bytes as f64 / f64::from(1 << 20),
                m.faults,
                total / copy,
            );
        }
    }
}
