//! Example applications on the TCPServers API, each an event loop for one
//! application thread: a static HTTP/1.1 file server (files read into memory
//! at start, bodies sent as blobs the PPE sends without copying) and the
//! seed's block streamer (§2.6: 8 KB blocks from an in-memory file, the
//! client acknowledges each block, the next goes out on the acknowledgement).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::conn::{App, AppEvent, BlobId, Conn, RecvStatus};
use crate::http::{self, HttpError};
use crate::server::{Counters, TcpServers};

/// Files served by path ("/name"), each a registered blob.
pub struct Site {
    files: HashMap<String, (BlobId, u64)>,
}

impl Site {
    /// Reads every regular file directly in `root` into memory.
    pub fn load(server: &TcpServers, root: &Path) -> std::io::Result<Site> {
        let mut files = HashMap::new();
        let dir = std::fs::read_dir(root).map_err(|e| {
            std::io::Error::new(e.kind(), format!("reading {}: {e}", root.display()))
        })?;
        for entry in dir {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let bytes: Arc<[u8]> = std::fs::read(entry.path())?.into();
            let len = bytes.len() as u64;
            let name = format!("/{}", entry.file_name().to_string_lossy());
            files.insert(name, (server.register_blob(bytes), len));
        }
        Ok(Site { files })
    }

    /// A site of in-memory pages.
    pub fn from_pages(server: &TcpServers, pages: &[(&str, Vec<u8>)]) -> Site {
        let files = pages
            .iter()
            .map(|(p, b)| {
                let len = b.len() as u64;
                (p.to_string(), (server.register_blob(b.clone().into()), len))
            })
            .collect();
        Site { files }
    }
}

/// Limits of the file server.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Longest request head (431 beyond).
    pub max_head: usize,
    /// Time to send a whole head (408 beyond): slowloris gets this long.
    pub head_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_head: 8192,
            head_timeout: Duration::from_secs(10),
        }
    }
}

/// A response waiting for send-ring space: head bytes, then an optional blob.
type Pending = (Vec<u8>, Option<(BlobId, u64)>);

struct HttpConn {
    conn: Conn,
    buf: Vec<u8>,
    /// When the head being read started arriving.
    since: Instant,
    /// Responses waiting for send-ring space: (head bytes, blob part).
    pending: Vec<Pending>,
    close_after: bool,
}

/// Serves `site` on `app` until `stop` is set. Counts responses by status
/// (`http_200`, `http_400`, …) and closes (`http_closed_*`) in `counters`.
pub fn serve_http(
    app: &App,
    site: &Site,
    limits: HttpLimits,
    counters: &Counters,
    stop: &AtomicBool,
) {
    let mut conns: HashMap<u64, HttpConn> = HashMap::new();
    let mut last_sweep = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match app.next_event(Duration::from_millis(20)) {
            Some(AppEvent::Accepted(conn)) => {
                let id = conn.id();
                let c = HttpConn {
                    conn,
                    buf: Vec::new(),
                    since: Instant::now(),
                    pending: Vec::new(),
                    close_after: false,
                };
                conns.insert(id, c);
                http_step(&mut conns, id, site, limits, counters);
            }
            Some(AppEvent::Ready(id)) => http_step(&mut conns, id, site, limits, counters),
            None => {}
        }
        if last_sweep.elapsed() >= Duration::from_millis(100) {
            last_sweep = Instant::now();
            let ids: Vec<u64> = conns.keys().copied().collect();
            for id in ids {
                http_step(&mut conns, id, site, limits, counters);
            }
        }
    }
}

/// Reads, answers and flushes one connection; drops it when it is done.
fn http_step(
    conns: &mut HashMap<u64, HttpConn>,
    id: u64,
    site: &Site,
    limits: HttpLimits,
    counters: &Counters,
) {
    let Some(c) = conns.get_mut(&id) else {
        return;
    };
    let mut gone = false;
    loop {
        match c.conn.try_recv(&mut c.buf, 64 * 1024) {
            RecvStatus::Data(_) => continue,
            RecvStatus::Empty => break,
            RecvStatus::Eof => {
                c.close_after = true;
                break;
            }
            RecvStatus::Closed(why) => {
                counters.add(&format!("http_closed_{why:?}").to_lowercase(), 1);
                gone = true;
                break;
            }
        }
    }
    if gone {
        conns.remove(&id);
        return;
    }
    while !c.close_after || !c.buf.is_empty() {
        match http::parse(&c.buf, limits.max_head) {
            Ok(Some(req)) => {
                c.buf.drain(..req.head_len);
                c.since = Instant::now();
                respond(c, site, &req, counters);
                if !req.keep_alive {
                    c.close_after = true;
                    c.buf.clear();
                }
            }
            Ok(None) => {
                if !c.buf.is_empty() && c.since.elapsed() > limits.head_timeout {
                    refuse(c, 408, "Request Timeout", counters);
                }
                break;
            }
            Err(e) => {
                let (code, reason) = e.status();
                refuse(c, code, reason, counters);
                if matches!(e, HttpError::Malformed(_)) {
                    counters.add("http_malformed", 1);
                }
            }
        }
        if c.close_after {
            break;
        }
    }
    flush(c);
    if c.close_after
        && c.pending.is_empty()
        && let Some(c) = conns.remove(&id)
    {
        c.conn.close();
    }
}

fn refuse(c: &mut HttpConn, code: u16, reason: &str, counters: &Counters) {
    let body = format!("{code} {reason}\n");
    let mut h = http::head(code, reason, body.len(), false, "text/plain").into_bytes();
    h.extend_from_slice(body.as_bytes());
    c.pending.push((h, None));
    c.close_after = true;
    c.buf.clear();
    counters.add(&format!("http_{code}"), 1);
}

fn respond(c: &mut HttpConn, site: &Site, req: &http::Request, counters: &Counters) {
    let path = req.path.split('?').next().unwrap_or("/");
    let path = if path == "/" { "/index.html" } else { path };
    match site.files.get(path) {
        Some(&(blob, len)) => {
            let h = http::head(200, "OK", len as usize, req.keep_alive, content_type(path));
            let body = (req.method == "GET" && len > 0).then_some((blob, len));
            c.pending.push((h.into_bytes(), body));
            counters.add("http_200", 1);
        }
        None => {
            let body = b"404 Not Found\n";
            let mut h =
                http::head(404, "Not Found", body.len(), req.keep_alive, "text/plain").into_bytes();
            h.extend_from_slice(body);
            c.pending.push((h, None));
            counters.add("http_404", 1);
        }
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html",
        Some("txt") => "text/plain",
        Some("css") => "text/css",
        Some("js") => "text/javascript",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

/// Moves pending responses onto the send ring as far as it has room.
fn flush(c: &mut HttpConn) {
    while let Some((head, body)) = c.pending.first_mut() {
        if !head.is_empty() {
            let n = c.conn.send(head);
            head.drain(..n);
            if !head.is_empty() {
                return;
            }
        }
        if let Some((blob, len)) = *body {
            if !c.conn.send_blob(blob, 0, len) {
                return;
            }
            *body = None;
        }
        c.pending.remove(0);
    }
}

/// The block streamer: every connection gets `block`-byte blocks from
/// `file` (a registered blob), round the file; one block on accept and one
/// per acknowledgement byte the client sends.
pub fn serve_stream(app: &App, file: BlobId, file_len: u64, block: u64, stop: &AtomicBool) {
    struct S {
        conn: Conn,
        offset: u64,
        owed: u64,
    }
    let mut conns: HashMap<u64, S> = HashMap::new();
    let mut buf = Vec::new();
    let block = block.clamp(1, file_len.max(1));
    while !stop.load(Ordering::Acquire) {
        let id = match app.next_event(Duration::from_millis(20)) {
            Some(AppEvent::Accepted(conn)) => {
                let id = conn.id();
                conns.insert(
                    id,
                    S {
                        conn,
                        offset: 0,
                        owed: 1,
                    },
                );
                id
            }
            Some(AppEvent::Ready(id)) => id,
            None => continue,
        };
        let Some(s) = conns.get_mut(&id) else {
            continue;
        };
        buf.clear();
        let mut gone = false;
        loop {
            match s.conn.try_recv(&mut buf, 64 * 1024) {
                RecvStatus::Data(_) => {}
                RecvStatus::Empty => break,
                RecvStatus::Eof | RecvStatus::Closed(_) => {
                    gone = true;
                    break;
                }
            }
        }
        s.owed += buf.len() as u64;
        while s.owed > 0 {
            if s.offset + block > file_len {
                s.offset = 0;
            }
            if !s.conn.send_blob(file, s.offset, block) {
                break;
            }
            s.offset += block;
            s.owed -= 1;
        }
        if gone {
            conns.remove(&id);
        }
    }
}
