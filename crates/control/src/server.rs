//! The Unix control socket: `sidecore ps`, `down` and `up -d` talk to a running
//! daemon through it. One request per connection line, answered in order; the
//! server thread handles connections one at a time with a read timeout, so a
//! silent client cannot wedge it. A stale socket file left by a crashed daemon
//! is detected and replaced; the file is removed on shutdown.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::daemon::Daemon;
use crate::protocol::{Request, Response, parse_request};

/// The default socket: `$SIDECORE_SOCKET`, else `/run/sidecore/sidecore.sock`
/// for root, else `$XDG_RUNTIME_DIR/sidecore.sock`, else `/tmp/sidecore-$UID.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os("SIDECORE_SOCKET") {
        return PathBuf::from(p);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/sidecore/sidecore.sock");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Path::new(&d).join("sidecore.sock");
    }
    PathBuf::from(format!("/tmp/sidecore-{uid}.sock"))
}

/// A running control socket server.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` and serves `daemon` on a background thread.
    pub fn start(daemon: Arc<Daemon>, path: &Path) -> Result<ControlServer, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let listener = match UnixListener::bind(path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if UnixStream::connect(path).is_ok() {
                    return Err(format!(
                        "another sidecore daemon is listening on {} (use it with `sidecore up -d`, or pass --socket)",
                        path.display()
                    ));
                }
                // A stale socket from a daemon that died: replace it.
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
                UnixListener::bind(path)
                    .map_err(|e| format!("cannot bind {}: {e}", path.display()))?
            }
            Err(e) => return Err(format!("cannot bind {}: {e}", path.display())),
        };
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660));
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("sc-control".into())
            .spawn(move || serve(listener, daemon, st))
            .map_err(|e| e.to_string())?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving and removes the socket file.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: UnixListener, daemon: Arc<Daemon>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = connection(stream, &daemon) {
                    tracing::debug!("control connection: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn connection(stream: UnixStream, daemon: &Daemon) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let reader = BufReader::new(stream.take(1 << 20));
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let resp = match parse_request(&line) {
            Ok(req) => daemon.handle(req),
            Err(e) => Response::error(e),
        };
        let mut out = serde_json::to_string(&resp)
            .unwrap_or_else(|e| format!(r#"{{"status":"error","error":"{e}"}}"#));
        out.push('\n');
        writer.write_all(out.as_bytes())?;
    }
    Ok(())
}

use std::io::Read as _;

/// Sends one request to the daemon at `path` and returns its response.
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Response, String> {
    let mut s = UnixStream::connect(path)
        .map_err(|e| format!("no sidecore daemon at {}: {e}", path.display()))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| format!("cannot send to {}: {e}", path.display()))?;
    s.shutdown(std::net::Shutdown::Write).ok();
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| format!("no answer from {}: {e}", path.display()))?;
    serde_json::from_str(answer.trim())
        .map_err(|e| format!("bad answer from {}: {e}", path.display()))
}
