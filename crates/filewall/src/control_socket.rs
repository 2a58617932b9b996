//! The control socket: a Unix socket that answers each connection with the
//! counters of one or more proxies as a JSON array (`stats_json`), then closes.
//! `sidecore filewall stats --control PATH` reads it. Served by a thread of its
//! own, so a proxy on a dedicated core never waits for a reader.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use crate::engine::StatsHandle;
use crate::stats_json::to_json;

/// How long a reader may take to accept the answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A running control socket; dropping it stops the thread and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket) and serves `proxies`' counters.
    pub fn start(
        path: &Path,
        proxies: Vec<(String, StatsHandle)>,
    ) -> std::io::Result<ControlServer> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("binding the control socket {}: {e}", path.display()),
            )
        })?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = thread::Builder::new()
            .name("filewall-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(mut conn) = conn else { continue };
                    let all: Vec<serde_json::Value> = proxies
                        .iter()
                        .map(|(l, p)| to_json(l, &p.stats()))
                        .collect();
                    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
                    let _ = conn.write_all(serde_json::Value::Array(all).to_string().as_bytes());
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stopping,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
