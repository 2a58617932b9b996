//! The server's side of a session's connection, shared by its threads: the
//! link to the client, requests awaiting their answers (lookups for the
//! projection), the DisCo engine holding the file regions fetched from the
//! client, and the stdio streams.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sidecore_disco::stream::{Reader, Writer};
use sidecore_disco::{Access, Endpoint, Engine, Msg, ObjectId, VnodeId};
use sidecore_wire::mx_msg::{MxBody, MxFrame};
use sidecore_wire::session::PeerGrammar;
use sidecore_wire::{Link, Message};

/// How long a projection request may wait for the client.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes each stdio stream may have in flight.
pub const STREAM_WINDOW_BYTES: u64 = 256 * 1024;
/// Stdio streams as DisCo stream vnodes.
pub const STDIN: VnodeId = VnodeId(0);
pub const STDOUT: VnodeId = VnodeId(1);
pub const STDERR: VnodeId = VnodeId(2);

/// The connection failed or the client answered with an error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnError {
    #[error("the client went away")]
    Closed,
    #[error("the client did not answer within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
    #[error("{0}")]
    Link(String),
    #[error("DisCo: {0}")]
    Disco(String),
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A stdio stream going to the client.
pub struct OutStream {
    pub writer: Mutex<Writer>,
    pub drained: Condvar,
}

/// The shared state of one session on the server.
pub struct Conn {
    link: Link<PeerGrammar>,
    pub session: u64,
    pub me: u32,
    pub client: u32,
    next_req: AtomicU64,
    answers: Mutex<HashMap<u64, Option<MxBody>>>,
    answered: Condvar,
    pub engine: Mutex<Engine>,
    granted: Condvar,
    pub closed: AtomicBool,
    stdin_closed: AtomicBool,
    pub stdout: OutStream,
    pub stderr: OutStream,
    pub stdin: Mutex<Reader>,
}

impl Conn {
    /// The state for a session between `me` and `client` on `link`.
    #[must_use]
    pub fn new(link: Link<PeerGrammar>, session: u64, me: u32, client: u32) -> Self {
        let out = |v| OutStream {
            writer: Mutex::new(Writer::new(v, Endpoint(client), STREAM_WINDOW_BYTES)),
            drained: Condvar::new(),
        };
        Conn {
            link,
            session,
            me,
            client,
            next_req: AtomicU64::new(1),
            answers: Mutex::new(HashMap::new()),
            answered: Condvar::new(),
            engine: Mutex::new(Engine::new(Endpoint(me))),
            granted: Condvar::new(),
            closed: AtomicBool::new(false),
            stdin_closed: AtomicBool::new(false),
            stdout: out(STDOUT),
            stderr: out(STDERR),
            stdin: Mutex::new(Reader::new(STDIN, Endpoint(client), STREAM_WINDOW_BYTES)),
        }
    }

    /// The link (for the receiving loop).
    pub fn link(&self) -> &Link<PeerGrammar> {
        &self.link
    }

    /// Sends one body to the client.
    pub fn send(&self, body: MxBody) -> Result<(), ConnError> {
        let f = MxFrame {
            session: self.session,
            src: self.me,
            dst: self.client,
            hops: 0,
            body,
        };
        self.link
            .send(&Message::Mx(Box::new(f)))
            .map_err(|e| ConnError::Link(e.to_string()))
    }

    /// Sends DisCo messages the engine or a stream produced.
    pub fn send_disco(&self, out: Vec<(Endpoint, Msg)>) -> Result<(), ConnError> {
        for (_, m) in out {
            self.send(MxBody::Disco(m))?;
        }
        Ok(())
    }

    /// Sends a request (`make` gets its number) and waits for the answer.
    pub fn request(&self, make: impl FnOnce(u64) -> MxBody) -> Result<MxBody, ConnError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        lock(&self.answers).insert(req, None);
        self.send(make(req))?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut a = lock(&self.answers);
        loop {
            if let Some(Some(_)) = a.get(&req) {
                return a.remove(&req).flatten().ok_or(ConnError::Closed);
            }
            if self.closed.load(Ordering::Acquire) {
                a.remove(&req);
                return Err(ConnError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                a.remove(&req);
                return Err(ConnError::Timeout);
            }
            a = self
                .answered
                .wait_timeout(a, left.min(Duration::from_millis(200)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// An answer to request `req` arrived; false if nobody waits for it.
    pub fn answer(&self, req: u64, body: MxBody) -> bool {
        let mut a = lock(&self.answers);
        match a.get_mut(&req) {
            Some(slot @ None) => {
                *slot = Some(body);
                self.answered.notify_all();
                true
            }
            _ => false,
        }
    }

    /// The guest ended: nothing more goes to its stdin.
    pub fn close_stdin(&self) {
        self.stdin_closed.store(true, Ordering::Release);
    }

    /// Whether [`Conn::close_stdin`] was called.
    pub fn stdin_closed(&self) -> bool {
        self.stdin_closed.load(Ordering::Acquire)
    }

    /// The client went away: wake everyone waiting.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.answered.notify_all();
        self.granted.notify_all();
        self.stdout.drained.notify_all();
        self.stderr.drained.notify_all();
    }

    /// The data of region `obj` (managed by the client), fetched through
    /// DisCo on first use.
    pub fn region(&self, obj: ObjectId) -> Result<Vec<u8>, ConnError> {
        let client = Endpoint(self.client);
        let mut e = lock(&self.engine);
        if !e.knows(obj) {
            e.create(obj, client, &[client, Endpoint(self.me)], Vec::new());
        }
        let ready = e
            .access(obj, Access::Read)
            .map_err(|x| ConnError::Disco(x.to_string()))?;
        if !ready {
            let out = e.take_output();
            drop(e);
            self.send_disco(out)?;
            e = lock(&self.engine);
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(d) = e.read(obj) {
                return Ok(d.to_vec());
            }
            if self.closed.load(Ordering::Acquire) {
                return Err(ConnError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnError::Timeout);
            }
            e = self
                .granted
                .wait_timeout(e, left.min(Duration::from_millis(200)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// A coherence message from the client: into the engine, answers out.
    pub fn on_disco(&self, msg: Msg) -> Result<(), ConnError> {
        let mut e = lock(&self.engine);
        e.handle(Endpoint(self.client), msg)
            .map_err(|x| ConnError::Disco(x.to_string()))?;
        let out = e.take_output();
        e.take_events();
        drop(e);
        self.granted.notify_all();
        self.send_disco(out)
    }

    /// A window update for an outgoing stdio stream.
    pub fn on_stat(&self, vnode: VnodeId, delta: u64) -> Result<(), ConnError> {
        let s = match vnode {
            STDOUT => &self.stdout,
            STDERR => &self.stderr,
            _ => {
                return Err(ConnError::Disco(format!(
                    "STREAMSTAT for unknown stream {vnode:?}"
                )));
            }
        };
        // Sent under the writer's lock: pushes leave in the order the
        // writer numbered their bytes, whichever thread pumps.
        let w = &mut *lock(&s.writer);
        let out = w
            .on_stat(delta)
            .map_err(|x| ConnError::Disco(x.to_string()))?;
        s.drained.notify_all();
        self.send_disco(out)
    }

    /// Pushes `bytes` (or the end, when empty and `eof`) to the client on an
    /// outgoing stream, waiting while the window is full.
    pub fn push(&self, s: &OutStream, bytes: &[u8], eof: bool) -> Result<(), ConnError> {
        let mut w = lock(&s.writer);
        let out = if eof { w.close() } else { w.write(bytes) };
        self.send_disco(out)?;
        while w.backlog() > 0 || (eof && !w.done()) {
            if self.closed.load(Ordering::Acquire) {
                return Err(ConnError::Closed);
            }
            w = s
                .drained
                .wait_timeout(w, Duration::from_millis(200))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}
