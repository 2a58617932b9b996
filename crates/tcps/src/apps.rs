//! Example applications on the TCPServers API, each an event loop for one
//! application thread: a static HTTP/1.1 file server (files read into memory
//! at start, bodies sent as blobs the PPE sends without copying) and the
//! seed's block streamer (§2.6: 8 KB blocks from an in-memory file, the
//! client acknowledges each block, the next goes out on the acknowledgement).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;

use crate::conn::{App, AppEvent, BlobId, Conn, RecvStatus};
use crate::http::{self, HttpError};
use crate::server::{Counters, TcpServers};

/// Files served by path ("/name"), each a registered blob.
pub struct Site {
    /// Looked up by request paths (the peer's bytes): std's keyed hash.
    files: std::collections::HashMap<String, (BlobId, u64)>,
}

/// Files read into memory, by path ("/name"), not yet registered with a server.
pub type Pages = Vec<(String, Arc<[u8]>)>;

/// Reads every regular file directly in `root` into memory; an error names
/// the directory or file.
pub fn read_pages(root: &Path) -> std::io::Result<Pages> {
    let named = |e: std::io::Error, what: &Path| {
        std::io::Error::new(e.kind(), format!("reading {}: {e}", what.display()))
    };
    let mut pages = Vec::new();
    let dir = std::fs::read_dir(root).map_err(|e| named(e, root))?;
    for entry in dir {
        let entry = entry.map_err(|e| named(e, root))?;
        let path = entry.path();
        if !entry.file_type().map_err(|e| named(e, &path))?.is_file() {
            continue;
        }
        let bytes: Arc<[u8]> = std::fs::read(&path).map_err(|e| named(e, &path))?.into();
        pages.push((format!("/{}", entry.file_name().to_string_lossy()), bytes));
    }
    Ok(pages)
}

impl Site {
    /// Reads every regular file directly in `root` into memory.
    pub fn load(server: &TcpServers, root: &Path) -> std::io::Result<Site> {
        Ok(Site::register(server, read_pages(root)?))
    }

    /// Registers pages read before (see [`read_pages`]) as `server`'s blobs.
    pub fn register(server: &TcpServers, pages: Pages) -> Site {
        let files = pages
            .into_iter()
            .map(|(path, bytes)| {
                let len = bytes.len() as u64;
                (path, (server.register_blob(bytes), len))
            })
            .collect();
        Site { files }
    }

    /// Files served.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when it serves nothing.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
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

/// How long an application's loop waits for an event before it looks at
/// its connections' timers again.
const EVENT_WAIT: Duration = Duration::from_millis(20);
/// How often the file server looks at every connection (head timeouts).
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Events one [`HttpApp::step`] or [`StreamApp::step`] takes at most.
pub const STEP_EVENTS: usize = 256;

/// Serves `site` on `app` until `stop` is set. Counts responses by status
/// (`http_200`, `http_400`, …) and closes (`http_closed_*`) in `counters`.
pub fn serve_http(
    app: &App,
    site: &Site,
    limits: HttpLimits,
    counters: &Counters,
    stop: &AtomicBool,
) {
    let mut h = HttpApp::new(limits, counters.clone());
    while !stop.load(Ordering::Acquire) {
        h.step(app, site, Some(EVENT_WAIT));
    }
}

/// The file server's state, driven one step at a time: by [`serve_http`]'s
/// loop on a thread of its own, or by an offcode's turns.
pub struct HttpApp {
    conns: HashMap<u64, HttpConn>,
    /// Responses queued so far (every status).
    pub responses: u64,
    limits: HttpLimits,
    counters: Counters,
    last_sweep: Instant,
}

impl HttpApp {
    pub fn new(limits: HttpLimits, counters: Counters) -> HttpApp {
        HttpApp {
            conns: HashMap::default(),
            responses: 0,
            limits,
            counters,
            last_sweep: Instant::now(),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns.len()
    }

    /// Handles up to [`STEP_EVENTS`] events (waiting up to `wait` for the
    /// first, not at all with `None`) and the periodic sweep; true when it
    /// did anything.
    pub fn step(&mut self, app: &App, site: &Site, wait: Option<Duration>) -> bool {
        let mut did = false;
        for i in 0..STEP_EVENTS {
            // Taken only when it is handled in this step: an event taken and
            // not handled would be lost (that connection never looked at again).
            let ev = match (i, wait) {
                (0, Some(d)) => app.next_event(d),
                _ => app.try_event(),
            };
            let Some(e) = ev else { break };
            did = true;
            match e {
                AppEvent::Accepted(conn) => {
                    let id = conn.id();
                    let c = HttpConn {
                        conn: *conn,
                        buf: Vec::new(),
                        since: Instant::now(),
                        pending: Vec::new(),
                        close_after: false,
                    };
                    self.conns.insert(id, c);
                    self.one(id, site);
                }
                AppEvent::Ready(id) => self.one(id, site),
            }
        }
        if self.last_sweep.elapsed() >= SWEEP_EVERY {
            self.last_sweep = Instant::now();
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            for id in ids {
                self.one(id, site);
            }
        }
        did
    }

    fn one(&mut self, id: u64, site: &Site) {
        self.responses += http_step(&mut self.conns, id, site, self.limits, &self.counters);
    }
}

/// Reads, answers and flushes one connection; drops it when it is done.
/// Returns the responses it queued.
fn http_step(
    conns: &mut HashMap<u64, HttpConn>,
    id: u64,
    site: &Site,
    limits: HttpLimits,
    counters: &Counters,
) -> u64 {
    let Some(c) = conns.get_mut(&id) else {
        return 0;
    };
    let mut answered = 0;
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
        return 0;
    }
    while !c.close_after || !c.buf.is_empty() {
        let before = c.pending.len();
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
        answered += (c.pending.len() - before) as u64;
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
    answered
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
    let mut s = StreamApp::new(file, file_len, block);
    while !stop.load(Ordering::Acquire) {
        s.step(app, Some(EVENT_WAIT));
    }
}

struct Streamed {
    conn: Conn,
    offset: u64,
    owed: u64,
}

/// The block streamer's state, driven one step at a time.
pub struct StreamApp {
    conns: HashMap<u64, Streamed>,
    /// Blocks queued so far.
    pub blocks: u64,
    file: BlobId,
    file_len: u64,
    block: u64,
    buf: Vec<u8>,
}

impl StreamApp {
    pub fn new(file: BlobId, file_len: u64, block: u64) -> StreamApp {
        StreamApp {
            conns: HashMap::default(),
            blocks: 0,
            file,
            file_len,
            block: block.clamp(1, file_len.max(1)),
            buf: Vec::new(),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns.len()
    }

    /// Handles up to [`STEP_EVENTS`] events (waiting up to `wait` for the
    /// first, not at all with `None`); true when it did anything.
    pub fn step(&mut self, app: &App, wait: Option<Duration>) -> bool {
        let mut did = false;
        for i in 0..STEP_EVENTS {
            // Taken only when it is handled in this step (see `HttpApp::step`).
            let ev = match (i, wait) {
                (0, Some(d)) => app.next_event(d),
                _ => app.try_event(),
            };
            let id = match ev {
                Some(AppEvent::Accepted(conn)) => {
                    let id = conn.id();
                    let s = Streamed {
                        conn: *conn,
                        offset: 0,
                        owed: 1,
                    };
                    self.conns.insert(id, s);
                    id
                }
                Some(AppEvent::Ready(id)) => id,
                None => break,
            };
            did = true;
            self.one(id);
        }
        did
    }

    /// Reads one connection's acknowledgements and sends what it is owed.
    fn one(&mut self, id: u64) {
        let Some(s) = self.conns.get_mut(&id) else {
            return;
        };
        self.buf.clear();
        let mut gone = false;
        loop {
            match s.conn.try_recv(&mut self.buf, 64 * 1024) {
                RecvStatus::Data(_) => {}
                RecvStatus::Empty => break,
                RecvStatus::Eof | RecvStatus::Closed(_) => {
                    gone = true;
                    break;
                }
            }
        }
        s.owed += self.buf.len() as u64;
        while s.owed > 0 {
            if s.offset + self.block > self.file_len {
                s.offset = 0;
            }
            if !s.conn.send_blob(self.file, s.offset, self.block) {
                break;
            }
            s.offset += self.block;
            s.owed -= 1;
            self.blocks += 1;
        }
        if gone {
            self.conns.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step handles at most [`STEP_EVENTS`] events and leaves the rest
    /// queued: none is taken off the queue and then dropped.
    #[test]
    fn a_step_leaves_the_events_it_does_not_handle_queued() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let app = App { rx };
        for id in 0..(STEP_EVENTS as u64 + 44) {
            tx.send(AppEvent::Ready(id)).ok();
        }
        let mut s = StreamApp::new(BlobId(0), 100, 10);
        assert!(s.step(&app, Some(Duration::from_millis(1))));
        assert_eq!(app.rx.len(), 44);
        assert!(s.step(&app, None));
        assert_eq!(app.rx.len(), 0);
        assert!(!s.step(&app, None));
    }
}
