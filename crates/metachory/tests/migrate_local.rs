//! The native migrator on one machine, without the node protocol: a real C
//! program that keeps state (a heap buffer it checksums, a counter it
//! prints every 10 ms, a floating-point sum) is frozen and captured, its
//! image and pages go over a loopback page stream, and a restorer process
//! (this very test binary, re-run as one) becomes it: eagerly, then lazily
//! (userfaultfd) from the restored copy again. Its output must have no gap
//! or repeat, its checksum must hold and it must exit with its own status.
//!
//! `harness = false`: the restorer must be a single-threaded process, and
//! this file's `main` is one when re-run with `MX_TEST_RESTORER`. Needs root
//! (ptrace of a process that is not a child, `/proc/PID/map_files`,
//! userfaultfd); skips without it unless `SIDECORE_REQUIRE_ROOT` is set.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidecore_metachory::fdpass;
use sidecore_metachory::migrate::checkpoint::{self, CaptureOptions};
use sidecore_metachory::migrate::{source, target};
use sidecore_metachory::remote::guard::Guard;

const CTL: i32 = 3;

fn main() {
    if let Ok(mode) = std::env::var("MX_TEST_RESTORER") {
        let e = sidecore_metachory::migrate::restorer::run(CTL, mode == "lazy");
        eprintln!("restorer: {e}");
        std::process::exit(1);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("SIDECORE_REQUIRE_ROOT").is_none(),
            "SIDECORE_REQUIRE_ROOT is set but the migration test does not run as root"
        );
        println!("skipped: the migration test needs root\n0 passed, 0 failed");
        return;
    }
    let t0 = Instant::now();
    a_guest_moves_eagerly_then_lazily_and_notices_nothing();
    println!(
        "test a_guest_moves_eagerly_then_lazily_and_notices_nothing ... ok ({} ms)",
        t0.elapsed().as_millis()
    );
    a_threaded_guest_is_refused();
    println!("test a_threaded_guest_is_refused ... ok");
    println!("2 passed, 0 failed");
}

fn compile(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("tests/data")
        .join(format!("{name}.c"));
    let out = dir.join(name);
    let o = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(extra)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: room for two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: new descriptors, ours.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Lines the guest printed, collected as they come.
fn collect(r: OwnedFd) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(std::fs::File::from(r)).lines() {
            let Ok(line) = line else { return };
            l.lock().unwrap().push(line);
        }
    });
    lines
}

fn wait_lines(lines: &Mutex<Vec<String>>, n: usize) {
    let t = Instant::now();
    while lines.lock().unwrap().len() < n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the guest printed too little"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A restorer (this binary, re-run), its control socket and its PID.
fn restorer(mode: &str, out: &OwnedFd) -> (Child, OwnedFd) {
    let (ours, theirs) = fdpass::seqpacket_pair().unwrap();
    fdpass::pass_credentials(ours.as_raw_fd()).unwrap();
    let raw = theirs.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("MX_TEST_RESTORER", mode)
        .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::null());
    // SAFETY: dup2 and fcntl only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::dup2(raw, CTL);
            libc::fcntl(CTL, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(theirs);
    (child, ours)
}

/// Moves guest `pid` into a new restorer; returns the restorer (now the guest).
fn hop(pid: i32, lazy: bool, out: &OwnedFd, ino: u64) -> Child {
    let (child, ctl) = restorer(if lazy { "lazy" } else { "eager" }, out);
    let mut uffd = None;
    let rpid = loop {
        let m = fdpass::recv(ctl.as_raw_fd())
            .unwrap()
            .expect("the restorer's report");
        match String::from_utf8_lossy(&m.msg).as_ref() {
            "uffd" => uffd = m.fd,
            "seccomp" => {
                let listener = m.fd.unwrap();
                std::thread::spawn(move || Guard::new(false).serve(&listener, &|_| {}));
                break m.pid.unwrap();
            }
            other => panic!("restorer said {other}"),
        }
    };
    assert_eq!(rpid, child.id() as i32);
    let opts = CaptureOptions {
        session: 1,
        lazy,
        stdio_inodes: [0, ino, 0],
    };
    let t = Instant::now();
    let frozen = checkpoint::freeze(pid, &opts).unwrap();
    assert_eq!(frozen.image.fds.len(), 3, "{:?}", frozen.image.fds);
    let incoming = target::Incoming::listen("127.0.0.1".parse().unwrap(), 1).unwrap();
    let (addr, ticket) = (incoming.addr(), incoming.ticket);
    let src = std::thread::spawn(move || match source::send(frozen, &addr, ticket, t) {
        Ok((_, Some(lazy))) => lazy.run().map(|_| ()).map_err(|e| e.to_string()),
        Ok((_, None)) => Ok(()),
        Err((f, e)) => {
            let _ = f.thaw();
            Err(e.to_string())
        }
    });
    let arrived = incoming.accept(&|| false).unwrap();
    let ctl_raw = ctl.as_raw_fd();
    let installed = move || {
        let m = fdpass::recv(ctl_raw).unwrap().unwrap();
        Ok(String::from_utf8_lossy(&m.msg).into_owned())
    };
    let restored = target::restore(
        arrived,
        target::RestorerLink {
            pid: rpid,
            ctl: ctl.as_raw_fd(),
            installed: &installed,
            uffd,
        },
    )
    .unwrap();
    let heap = 8 << 20;
    if let Some(l) = restored.lazy.clone() {
        assert!(
            restored.bytes < heap,
            "lazily, the heap does not go before the guest resumes"
        );
        let later = target::finish_lazy(&l, restored.arrived, rpid).unwrap();
        assert!(later >= heap, "only {later} bytes came lazily");
        let faults = l.stats.faults.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "lazy: {} bytes before, {later} after, {faults} faults",
            restored.bytes
        );
    } else {
        assert!(
            restored.bytes >= heap,
            "only {} bytes came eagerly",
            restored.bytes
        );
    }
    src.join().unwrap().unwrap();
    child
}

fn a_guest_moves_eagerly_then_lazily_and_notices_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile(dir.path(), "mx_counter", &[]);
    let (r, w) = pipe();
    let ino = std::fs::File::from(w.try_clone().unwrap())
        .metadata()
        .unwrap()
        .ino();
    let lines = collect(r);
    let mut cmd = Command::new(&prog);
    cmd.args(["8", "150"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(w.try_clone().unwrap()))
        .stderr(Stdio::null());
    // SAFETY: close_range between fork and exec: the guest holds only its
    // stdio (whatever this process inherited stays here).
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0);
            Ok(())
        });
    }
    let mut guest = cmd.spawn().unwrap();
    wait_lines(&lines, 10);
    let mut second = hop(guest.id() as i32, false, &w, ino);
    // The source's copy was killed.
    assert_eq!(guest.wait().unwrap().code(), None);
    wait_lines(&lines, 40);
    let mut third = hop(second.id() as i32, true, &w, ino);
    assert_eq!(second.wait().unwrap().code(), None);
    drop(w);
    let status = third.wait().unwrap();
    let got = lines.lock().unwrap().clone();
    assert_eq!(status.code(), Some(7), "{got:?}");
    assert_eq!(got.len(), 153, "{got:?}");
    assert_eq!(got[0], got[151], "the heap's checksum changed");
    for (i, l) in got[1..151].iter().enumerate() {
        assert_eq!(l, &i.to_string(), "a gap or a repeat at line {i}: {got:?}");
    }
    assert_eq!(got[152], "sum 75.0");
}

fn a_threaded_guest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile(dir.path(), "mx_threads", &["-pthread"]);
    let mut guest = Command::new(&prog)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(guest.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let opts = CaptureOptions {
        session: 1,
        lazy: false,
        stdio_inodes: [0; 3],
    };
    let e = checkpoint::freeze(guest.id() as i32, &opts).err().unwrap();
    assert!(
        e.to_string()
            .contains("has 3 threads: only single-threaded guests migrate"),
        "{e}"
    );
    guest.kill().unwrap();
    guest.wait().unwrap();
}
