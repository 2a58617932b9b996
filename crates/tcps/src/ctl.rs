//! The control socket of a running server (`sidecore tcps ppe add|remove`,
//! `sidecore tcps stats`): a Unix stream socket, one request line, one
//! answer — `ok`, `error: …`, or the stats as JSON.
//!
//! Requests: `stats`, `ppe add CPU`, `ppe remove CPU`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::server::TcpServers;

/// Answers one request line.
pub fn answer(server: &TcpServers, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["stats"] => serde_json::to_string(&server.stats())
            .unwrap_or_else(|e| format!("error: encoding stats: {e}")),
        ["ppe", op @ ("add" | "remove"), cpu] => {
            let Ok(cpu) = cpu.parse::<usize>() else {
                return format!("error: `{cpu}` is not a CPU number");
            };
            let r = if *op == "add" {
                server.add_ppe(cpu)
            } else {
                server.remove_ppe(cpu)
            };
            match r {
                Ok(()) => format!("ok: ActivePPE is now {}", server.active()),
                Err(e) => format!("error: {e}"),
            }
        }
        _ => format!(
            "error: unknown request `{line}`; expected `stats`, `ppe add CPU` or `ppe remove CPU`"
        ),
    }
}

/// Serves the control socket at `path` until `stop` is set.
pub fn serve(
    server: Arc<TcpServers>,
    path: &Path,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
    listener.set_nonblocking(true)?;
    let path: PathBuf = path.to_path_buf();
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut line = String::new();
                    let mut r = BufReader::new(&s);
                    if r.read_line(&mut line).is_ok() {
                        let a = answer(&server, line.trim());
                        let _ = (&s).write_all(format!("{a}\n").as_bytes());
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = std::fs::remove_file(&path);
    }))
}

/// Why a request to a running server's control socket failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("connecting to {}: {source} (is `sidecore tcps serve` running?)", .path.display())]
    Connect {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Sends one request to the server at `path` and returns its answer.
pub fn request(path: &Path, line: &str) -> Result<String, CtlError> {
    let io = |what| {
        move |source| CtlError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut s = UnixStream::connect(path).map_err(|source| CtlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.write_all(format!("{line}\n").as_bytes())
        .map_err(io("writing to"))?;
    let mut out = String::new();
    BufReader::new(&s)
        .read_line(&mut out)
        .map_err(io("reading from"))?;
    Ok(out.trim_end().to_string())
}
