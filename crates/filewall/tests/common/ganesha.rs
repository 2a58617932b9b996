//! A real NFSv3 server for FileWall's tests: nfs-ganesha (Debian's `nfs-ganesha`
//! and `nfs-ganesha-vfs`, installed by scripts/setup.sh) exporting a temporary
//! directory through FSAL_VFS, NFSv3 over TCP only, bound to 127.0.0.1 on free
//! non-default ports, in the foreground with its log in the temporary directory.
//! [`Ganesha::start`] waits until both NFS and MOUNT answer a NULL call and the
//! guard kills the server on drop. Ganesha refuses to start unless it can register
//! with rpcbind, so an rpcbind is started (and killed on drop) if none listens on
//! port 111. Servers are serialised within a test binary (one rpcbind, one
//! registration). Without ganesha, or without root (FSAL_VFS opens files by
//! handle, which needs CAP_DAC_READ_SEARCH), `start` returns `None` after saying
//! why, unless `SIDECORE_REQUIRE_ROOT` is set, where it panics instead.
//!
//! Also here: the libnfs URL for a server or proxy, and running `nfs-ls`,
//! `nfs-cat`, `nfs-cp` (Debian's `libnfs-utils`) against it.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sidecore_filewall::message::{Call, CallArgs, decode_reply_header};
use sidecore_filewall::mount::MountCall;
use sidecore_filewall::nfs3::Nfs3Call;
use sidecore_filewall::record::{RecordReader, encode_record};
use sidecore_filewall::rpc::Auth;

const GANESHA: &str = "/usr/bin/ganesha.nfsd";
const FSAL_VFS: &str = "/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so";
const RPCBIND: &str = "/usr/sbin/rpcbind";

/// One ganesha (and rpcbind) at a time per test binary.
static SERIAL: Mutex<()> = Mutex::new(());

/// Removes every NFS and MOUNT registration from rpcbind (`rpcinfo -d`).
fn unregister() {
    for (prog, versions) in [("100003", &["3", "4"][..]), ("100005", &["1", "3"][..])] {
        for v in versions {
            let _ = Command::new("rpcinfo")
                .args(["-d", prog, v])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A running ganesha; killed when dropped.
pub struct Ganesha {
    /// The exported directory (the server's own view of the files).
    pub export: PathBuf,
    pub nfs_port: u16,
    pub mount_port: u16,
    log: PathBuf,
    child: Child,
    rpcbind: Option<Child>,
    _dir: tempfile::TempDir,
    /// Held by one server of a group (the last, which is dropped last).
    _serial: Option<MutexGuard<'static, ()>>,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Skips (false) with a message, or panics when `SIDECORE_REQUIRE_ROOT` is set.
fn may_run() -> bool {
    let why = if !Path::new(GANESHA).exists() || !Path::new(FSAL_VFS).exists() {
        Some(format!(
            "nfs-ganesha with FSAL_VFS is not installed ({GANESHA}, {FSAL_VFS}); run scripts/setup.sh"
        ))
    } else if !Path::new("/usr/bin/nfs-ls").exists() {
        Some(
            "libnfs-utils (nfs-ls, nfs-cat, nfs-cp) is not installed; run scripts/setup.sh"
                .to_string(),
        )
    } else if !Path::new(RPCBIND).exists() {
        Some(format!(
            "rpcbind is not installed ({RPCBIND}); run scripts/setup.sh"
        ))
    } else if !is_root() {
        Some("ganesha's FSAL_VFS needs root (CAP_DAC_READ_SEARCH)".to_string())
    } else {
        None
    };
    match why {
        None => true,
        Some(why) => {
            assert!(
                std::env::var_os("SIDECORE_REQUIRE_ROOT").is_none(),
                "SIDECORE_REQUIRE_ROOT is set but the ganesha tests cannot run: {why}"
            );
            eprintln!("skipping: {why}");
            false
        }
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding 127.0.0.1:0 to find a free port")
}

fn wait_listening(addr: SocketAddr, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Sends one call over a fresh TCP connection and waits for a reply with its XID.
pub fn rpc_roundtrip(addr: SocketAddr, call: &Call) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&encode_record(&call.to_bytes(), 1 << 20))?;
    read_record(&mut s)
}

/// Reads the next record from a stream (EOF and timeouts are errors).
pub fn read_record(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut reader = RecordReader::new(1 << 21);
    let mut buf = [0u8; 4096];
    loop {
        if let Some(r) = reader
            .next_record()
            .map_err(|e| std::io::Error::other(e.to_string()))?
        {
            return Ok(r);
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        reader.push(&buf[..n]);
    }
}

/// A NULL call to NFSv3 or MOUNT v3.
pub fn null_call(xid: u32, mount: bool) -> Call {
    Call {
        xid,
        cred: Auth::None,
        verf: Auth::None,
        args: if mount {
            CallArgs::Mount3(MountCall::Null(()))
        } else {
            CallArgs::Nfs3(Nfs3Call::Null(()))
        },
    }
}

fn answers_null(addr: SocketAddr, mount: bool) -> bool {
    rpc_roundtrip(addr, &null_call(7, mount))
        .ok()
        .and_then(|r| decode_reply_header(&r).ok())
        .is_some_and(|(h, _)| h.xid == 7)
}

impl Ganesha {
    /// Starts ganesha exporting a fresh temporary directory, or `None` if it cannot
    /// run here (see the module comment).
    ///
    /// # Panics
    /// When it should run but does not come up within 30 s (the message holds the
    /// end of its log).
    pub fn start() -> Option<Ganesha> {
        Self::start_many(1).map(|mut v| v.remove(0))
    }

    /// Starts `n` servers at once, each exporting its own temporary directory on
    /// its own ports (replicas for the replication tests). The last one holds the
    /// lock and rpcbind, and a `Vec` drops it last.
    pub fn start_many(n: usize) -> Option<Vec<Ganesha>> {
        if !may_run() {
            return None;
        }
        let mut serial = Some(
            SERIAL
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let rpcbind_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 111));
        let mut rpcbind =
            if TcpStream::connect_timeout(&rpcbind_addr, Duration::from_millis(500)).is_ok() {
                None
            } else {
                let child = Command::new(RPCBIND)
                    .arg("-f")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("starting rpcbind -f");
                assert!(
                    wait_listening(rpcbind_addr, Instant::now() + Duration::from_secs(10)),
                    "rpcbind did not listen on {rpcbind_addr} within 10 s"
                );
                Some(child)
            };
        let mut out: Vec<Ganesha> = Vec::new();
        for i in 0..n {
            let mut g = Self::spawn();
            if i + 1 == n {
                g.rpcbind = rpcbind.take();
                g._serial = serial.take();
            }
            g.wait_ready(Duration::from_secs(30));
            if n > 1 {
                // Ganesha refuses to start if its programs are registered by
                // another server: the registration is needed only at start, so
                // it is removed before the next replica starts.
                unregister();
            }
            out.push(g);
        }
        Some(out)
    }

    fn spawn() -> Ganesha {
        let dir = tempfile::tempdir().expect("creating the ganesha temporary directory");
        let export = dir.path().join("export");
        std::fs::create_dir(&export).expect("creating the export directory");
        let (nfs_port, mount_port) = (free_port(), free_port());
        let conf = dir.path().join("ganesha.conf");
        let log = dir.path().join("ganesha.log");
        std::fs::write(&conf, config(&export, nfs_port, mount_port)).expect("writing ganesha.conf");
        let child = Command::new(GANESHA)
            .arg("-F")
            .arg("-f")
            .arg(&conf)
            .arg("-L")
            .arg(&log)
            .arg("-p")
            .arg(dir.path().join("ganesha.pid"))
            .args(["-N", "NIV_EVENT"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting ganesha.nfsd");
        Ganesha {
            export,
            nfs_port,
            mount_port,
            log,
            child,
            rpcbind: None,
            _dir: dir,
            _serial: None,
        }
    }

    /// Kills the server now (a server that disappears).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let nfs = SocketAddr::from((Ipv4Addr::LOCALHOST, self.nfs_port));
        let mount = SocketAddr::from((Ipv4Addr::LOCALHOST, self.mount_port));
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "ganesha exited with {status} while starting; its log ends:\n{}",
                    self.log_tail()
                );
            }
            if answers_null(nfs, false) && answers_null(mount, true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "ganesha did not answer NULL on NFS {nfs} and MOUNT {mount} within {limit:?}; its log ends:\n{}",
            self.log_tail()
        );
    }

    /// The last lines of ganesha's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let mut out = String::new();
        for l in &lines[lines.len().saturating_sub(20)..] {
            let _ = writeln!(out, "{l}");
        }
        out
    }

    pub fn nfs_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.nfs_port))
    }

    pub fn mount_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.mount_port))
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.rpcbind.as_mut() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

fn config(export: &Path, nfs_port: u16, mount_port: u16) -> String {
    // NLM and RQUOTA are disabled but still get ports so no default port is bound.
    let (nlm, rquota) = (free_port(), free_port());
    format!(
        r#"NFS_CORE_PARAM {{
  NFS_Port = {nfs_port};
  MNT_Port = {mount_port};
  NLM_Port = {nlm};
  Rquota_Port = {rquota};
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  Protocols = 3;
  Bind_addr = 127.0.0.1;
}}
NFSV4 {{ Graceless = true; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{
  Export_Id = 1;
  Path = {path};
  Pseudo = /export;
  Access_Type = RW;
  Squash = No_Root_Squash;
  Protocols = 3;
  Transports = TCP;
  SecType = sys;
  FSAL {{ Name = VFS; }}
}}
"#,
        path = export.display()
    )
}

/// The libnfs URL of `rel` (empty for the export itself) under the export, with
/// NFS and MOUNT at the given ports on 127.0.0.1. NFSv3 mounts by the export's
/// real path, not its pseudo path.
pub fn nfs_url(export: &Path, rel: &str, nfs_port: u16, mount_port: u16) -> String {
    let path = if rel.is_empty() {
        export.display().to_string()
    } else {
        format!("{}/{rel}", export.display())
    };
    format!("nfs://127.0.0.1{path}?version=3&nfsport={nfs_port}&mountport={mount_port}")
}

/// Runs a libnfs tool (`nfs-ls`, `nfs-cat`, `nfs-cp`) with a 60 s limit.
///
/// # Panics
/// When the tool cannot be started (libnfs-utils missing).
pub fn libnfs(tool: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {tool} (is libnfs-utils installed?): {e}"))
}
