//! The Unix control socket: `sidecore ps`, `down` and `up -d` talk to a running
//! daemon through it. One request per connection line, answered in order; the
//! server thread handles connections one at a time with a read timeout, so a
//! silent client cannot wedge it. A stale socket file left by a crashed daemon
//! is detected and replaced; the file is removed on shutdown.

use std::io::{BufReader, Write};
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

/// How long the server waits for a client's next line.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Back-off after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Permissions of the socket file: the owner and its group may talk to it.
const SOCKET_MODE: u32 = 0o660;

/// Why the control socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("another sidecore daemon is listening on {} (use it with `sidecore up -d`, or pass --socket)", .0.display())]
    InUse(PathBuf),
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a request to a daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no sidecore daemon at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot talk to the daemon at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon at {} closed the connection without answering", path.display())]
    NoAnswer { path: PathBuf },
    #[error("bad answer from {}: {source}", path.display())]
    BadAnswer {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A running control socket server.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` and serves `daemon` on a background thread.
    pub fn start(daemon: Arc<Daemon>, path: &Path) -> Result<ControlServer, ServerError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| ServerError::Io { what, path, source }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        let listener = match UnixListener::bind(path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if UnixStream::connect(path).is_ok() {
                    return Err(ServerError::InUse(path.to_path_buf()));
                }
                // A stale socket from a daemon that died: replace it.
                std::fs::remove_file(path).map_err(io("remove the stale socket", path))?;
                UnixListener::bind(path).map_err(io("bind", path))?
            }
            Err(e) => return Err(io("bind", path)(e)),
        };
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE));
        listener.set_nonblocking(true).map_err(io("set up", path))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("sc-control".into())
            .spawn(move || serve(&listener, &daemon, &st))
            .map_err(io("start a thread for", path))?;
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

fn serve(listener: &UnixListener, daemon: &Daemon, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = connection(stream, daemon) {
                    tracing::debug!("control connection: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

fn connection(stream: UnixStream, daemon: &Daemon) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(line) = sidecore_wire::line::read_line(&mut reader)? {
        if line.trim().is_empty() {
            continue;
        }
        let resp = match parse_request(&line) {
            Ok(req) => daemon.handle(req),
            Err(e) => Response::error(e.to_string()),
        };
        let mut out = serde_json::to_string(&resp)
            .unwrap_or_else(|e| format!(r#"{{"status":"error","error":"{e}"}}"#));
        out.push('\n');
        writer.write_all(out.as_bytes())?;
    }
    Ok(())
}

/// Sends one request to the daemon at `path` and returns its response.
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let io = |source| ClientError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    // A request always serializes: plain data with string keys.
    let mut line = serde_json::to_string(req).expect("control requests serialize");
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    s.shutdown(std::net::Shutdown::Write).ok();
    let answer = sidecore_wire::line::read_line(&mut BufReader::new(s))
        .map_err(io)?
        .ok_or_else(|| ClientError::NoAnswer {
            path: path.to_path_buf(),
        })?;
    serde_json::from_str(answer.trim()).map_err(|source| ClientError::BadAnswer {
        path: path.to_path_buf(),
        source,
    })
}
