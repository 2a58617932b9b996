//! The daemon's HTTP side: `/metrics` for Prometheus, the dashboard's page and
//! script, `/api/status` (the latest picture as JSON), `/api/log` (the event
//! log so far) and `/api/events` (server-sent events: a `status` picture each
//! second and every runtime `event` as it happens).
//!
//! It runs on its own single-threaded tokio runtime, away from the pinned
//! cores of the data path. Connections are served one task each with hyper,
//! so a connection can be cut from outside: a client that sends a request
//! head too slowly (or never) is dropped by hyper's header timeout, and a
//! dashboard that stops reading its event stream is found by the janitor and
//! cut: its socket's send queue has not shrunk for [`STALL`] (the client's
//! receive window is shut), or its stream has not been polled for as long.
//! What a stalled client can hold is bounded meanwhile: hyper's write buffer
//! is small, and the hub's broadcast channel has a fixed length. Malformed
//! requests get hyper's 400, unknown routes a 404, wrong methods a 405.

use std::net::SocketAddr;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Notify, oneshot};
use tokio_stream::wrappers::BroadcastStream;

use crate::dashboard;
use crate::hub::Hub;

/// A live-stream client whose stream was not taken for this long is cut.
pub const STALL: Duration = Duration::from_secs(5);
/// Time a client has to send a whole request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Hyper's buffer per connection (its minimum is 8 KiB): what a client that
/// stops reading can make the server hold, beyond the kernel's socket buffer.
const CONN_BUFFER: usize = 16 * 1024;

/// Why the HTTP side could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "refusing to serve metrics and the dashboard on {0}: it is not a loopback address; pass --http-expose to serve beyond this machine"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the HTTP runtime: {0}")]
    Runtime(std::io::Error),
}

/// One connection, as the janitor watches it.
struct ConnWatch {
    /// Milliseconds (since the server started) when its event stream last
    /// yielded; 0 while it has none.
    progress: AtomicU64,
    streaming: AtomicBool,
    cut: Notify,
    /// A duplicate of the connection's socket, to read its send queue: it
    /// names the same socket for as long as the watch lives (a bare fd number
    /// could be reused by another connection once this one closes).
    socket: Option<OwnedFd>,
    /// Bytes queued at the last look, and since when the queue has not shrunk
    /// (ms; 0: it is moving).
    last_queued: AtomicU64,
    stuck_since: AtomicU64,
}

impl ConnWatch {
    /// Bytes the kernel holds for this socket that the peer has not taken.
    fn queued(&self) -> Option<u64> {
        let fd = self.socket.as_ref()?;
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ on a TCP socket writes one int through the pointer,
        // which points at `n`, alive for the call; `fd` is an open socket owned
        // by this watch.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &raw mut n) };
        (r == 0).then(|| u64::try_from(n).unwrap_or(0))
    }

    /// Makes the close a reset: the bytes queued for a client that does not
    /// read would otherwise hold the FIN back (and the kernel's memory) until
    /// the orphan timeout.
    fn reset_on_close(&self) {
        let Some(fd) = self.socket.as_ref() else {
            return;
        };
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt(SO_LINGER) reads `size_of::<linger>()` bytes from
        // `l`, a live local; `fd` is an open socket owned by this watch.
        let _ = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const l).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }

    /// True when the client has not taken bytes for `stall_ms` while some wait.
    fn stalled(&self, now: u64, stall_ms: u64) -> bool {
        let Some(q) = self.queued() else { return false };
        let last = self.last_queued.swap(q, Ordering::AcqRel);
        if q == 0 || q < last {
            self.stuck_since.store(0, Ordering::Release);
            return false;
        }
        let since = self.stuck_since.load(Ordering::Acquire);
        if since == 0 {
            self.stuck_since.store(now.max(1), Ordering::Release);
            return false;
        }
        now.saturating_sub(since) > stall_ms
    }
}

/// The connections of one server, for the janitor.
#[derive(Clone)]
struct Conns {
    started: Instant,
    watches: Arc<Mutex<Vec<Weak<ConnWatch>>>>,
}

/// The daemon's routes' state.
#[derive(Clone)]
struct Shared {
    hub: Arc<Hub>,
    conns: Conns,
}

/// What an exporter renders at each scrape: OpenMetrics text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

impl Conns {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The running HTTP side; dropping it stops it.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Listens on `addr` (loopback only unless `expose`) and serves `hub`:
    /// the metrics, the dashboard and its API.
    pub fn start(hub: Arc<Hub>, addr: SocketAddr, expose: bool) -> Result<HttpServer, HttpError> {
        Self::start_with(addr, expose, move |conns| router(Shared { hub, conns }))
    }

    /// Listens on `addr` and serves only `/metrics`, rendered by `render` at
    /// each scrape: the exporter of a command that runs outside the daemon
    /// (`sikker agent`, `filewall run`, `orion watch`, `tcps serve`).
    pub fn exporter(
        addr: SocketAddr,
        expose: bool,
        render: Render,
    ) -> Result<HttpServer, HttpError> {
        Self::start_with(addr, expose, move |_| {
            Router::new()
                .route(
                    "/metrics",
                    get(move |headers: axum::http::HeaderMap| {
                        let om = render();
                        async move { metrics_response(om, &headers) }
                    }),
                )
                .fallback(|| async { (StatusCode::NOT_FOUND, "no such page; try /metrics\n") })
        })
    }

    fn start_with(
        addr: SocketAddr,
        expose: bool,
        routes: impl FnOnce(Conns) -> Router,
    ) -> Result<HttpServer, HttpError> {
        if !expose && !addr.ip().is_loopback() {
            return Err(HttpError::NotLoopback(addr));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HttpError::Runtime)?;
        let std_listener =
            std::net::TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        let bound = std_listener
            .local_addr()
            .map_err(|source| HttpError::Bind { addr, source })?;
        std_listener
            .set_nonblocking(true)
            .map_err(|source| HttpError::Bind { addr, source })?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let conns = Conns {
            started: Instant::now(),
            watches: Arc::new(Mutex::new(Vec::new())),
        };
        let app = routes(conns.clone());
        let thread = std::thread::Builder::new()
            .name("observe-http".into())
            .spawn(move || rt.block_on(serve(std_listener, app, conns, stop_rx)))
            .map_err(HttpError::Runtime)?;
        Ok(HttpServer {
            addr: bound,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The routes.
fn router(shared: Shared) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", dashboard::INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", dashboard::APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", dashboard::STYLE_CSS) }),
        )
        .route("/metrics", get(metrics))
        .route("/api/status", get(status))
        .route("/api/log", get(log))
        .route("/api/events", get(events))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "no such page; try /, /metrics, /api/status, /api/log or /api/events\n",
            )
        })
        .with_state(shared)
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(kind))],
        body,
    )
        .into_response()
}

/// OpenMetrics to scrapers that ask for it, the Prometheus text format to
/// everyone else (curl, promtool).
async fn metrics(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    metrics_response(crate::metrics::render(&s.hub.latest()), &headers)
}

fn metrics_response(om: String, headers: &axum::http::HeaderMap) -> Response {
    let wants_om = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    let (kind, body) = if wants_om {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            om,
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::to_prometheus_text(&om),
        )
    };
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(kind))],
        body,
    )
        .into_response()
}

async fn status(State(s): State<Shared>) -> Response {
    axum::Json(&*s.hub.latest()).into_response()
}

async fn log(State(s): State<Shared>) -> Response {
    axum::Json(s.hub.daemon().runtime().events().snapshot()).into_response()
}

async fn events(State(s): State<Shared>, Extension(watch): Extension<Arc<ConnWatch>>) -> Response {
    let first = serde_json::to_string(&*s.hub.latest()).unwrap_or_default();
    let rx = s.hub.subscribe();
    watch.streaming.store(true, Ordering::Release);
    watch.progress.store(s.conns.now_ms(), Ordering::Release);
    let first = futures_util::stream::once(async move {
        Ok::<_, std::convert::Infallible>(SseEvent::default().event("status").data(first))
    });
    let clock = s.conns.clone();
    let live = BroadcastStream::new(rx)
        // A listener that fell behind has lost messages; it is dropped and its
        // page reconnects, instead of the hub keeping a backlog for it.
        .take_while(|m| std::future::ready(m.is_ok()))
        .filter_map(|m| std::future::ready(m.ok()))
        .map(move |p| {
            watch.progress.store(clock.now_ms(), Ordering::Release);
            Ok(SseEvent::default().event(p.event).data(&*p.data))
        });
    Sse::new(first.chain(live))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn serve(
    listener: std::net::TcpListener,
    app: Router,
    conns: Conns,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("the HTTP listener cannot join the runtime: {e}");
            return;
        }
    };
    tokio::spawn(janitor(conns.clone()));
    loop {
        let (tcp, _peer) = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let watch = Arc::new(ConnWatch {
            progress: AtomicU64::new(0),
            streaming: AtomicBool::new(false),
            cut: Notify::new(),
            socket: tcp.as_fd().try_clone_to_owned().ok(),
            last_queued: AtomicU64::new(0),
            stuck_since: AtomicU64::new(0),
        });
        conns
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::downgrade(&watch));
        let svc = TowerToHyperService::new(app.clone().layer(axum::Extension(Arc::clone(&watch))));
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(CONN_BUFFER)
                .writev(false)
                .serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = conn => {}
                () = watch.cut.notified() => {}
            }
        });
    }
}

/// Once a second: cuts stalled stream clients, forgets finished connections.
async fn janitor(shared: Conns) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = shared.now_ms();
        let stall = u64::try_from(STALL.as_millis()).unwrap_or(u64::MAX);
        let mut w = shared
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.retain(|c| {
            let Some(c) = c.upgrade() else { return false };
            if c.streaming.load(Ordering::Acquire)
                && (c.stalled(now, stall)
                    || now.saturating_sub(c.progress.load(Ordering::Acquire)) > stall)
            {
                tracing::info!("cutting a dashboard that stopped reading its event stream");
                c.reset_on_close();
                c.cut.notify_one();
                return false;
            }
            true
        });
    }
}
