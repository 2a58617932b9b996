//! The hub between the daemon and its observers. One thread takes a
//! [`Snapshot`] a second; runtime events are counted as they happen. Both are
//! published on one bounded broadcast channel as ready-made server-sent-event
//! payloads, serialised once however many dashboards listen. A listener that
//! falls behind loses its place (the channel is bounded) and is dropped; the
//! data path never waits for anyone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sidecore_control::Daemon;
use sidecore_runtime::events::{Event, EventKind};
use tokio::sync::broadcast;

use crate::services::{self, ServiceSpec, ServiceView};
use crate::snapshot::{self, CpuSampler, EventCounts, Snapshot};

/// How often the picture is taken.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Messages a listener may fall behind before it is dropped.
const BACKLOG: usize = 256;

/// One message to every dashboard: an SSE event name and its JSON data.
#[derive(Debug, Clone)]
pub struct Published {
    pub event: &'static str,
    pub data: Arc<str>,
}

/// The hub.
pub struct Hub {
    daemon: Arc<Daemon>,
    latest: Mutex<Arc<Snapshot>>,
    counts: Mutex<EventCounts>,
    tx: broadcast::Sender<Published>,
    started: Instant,
    stop: AtomicBool,
    ticker: Mutex<Option<JoinHandle<()>>>,
    /// The services to scrape, and what their last scrape found.
    services: Vec<ServiceSpec>,
    scraped: Mutex<Vec<ServiceView>>,
    scraper: Mutex<Option<JoinHandle<()>>>,
}

impl Hub {
    /// A hub on `daemon`, subscribed to its events and ticking, scraping
    /// `services` once a period.
    pub fn start(daemon: Arc<Daemon>, services: Vec<ServiceSpec>) -> Arc<Hub> {
        let (tx, _) = broadcast::channel(BACKLOG);
        let started = Instant::now();
        let first = snapshot::take(&daemon, &CpuSampler::default(), EventCounts::default(), 0);
        let hub = Arc::new(Hub {
            daemon,
            latest: Mutex::new(Arc::new(first)),
            counts: Mutex::new(EventCounts::default()),
            tx,
            started,
            stop: AtomicBool::new(false),
            ticker: Mutex::new(None),
            services,
            scraped: Mutex::new(Vec::new()),
            scraper: Mutex::new(None),
        });
        let weak = Arc::downgrade(&hub);
        hub.daemon.runtime().events().subscribe(move |e| {
            if let Some(h) = weak.upgrade() {
                h.on_event(e);
            }
        });
        let h = Arc::clone(&hub);
        let ticker = std::thread::Builder::new()
            .name("observe-hub".into())
            .spawn(move || h.tick_loop())
            .ok();
        *lock(&hub.ticker) = ticker;
        if !hub.services.is_empty() {
            let h = Arc::clone(&hub);
            *lock(&hub.scraper) = std::thread::Builder::new()
                .name("observe-scrape".into())
                .spawn(move || h.scrape_loop())
                .ok();
        }
        hub
    }

    /// Scrapes every service each period, apart from the ticker so that a
    /// slow service never delays the picture.
    fn scrape_loop(&self) {
        let mut last = vec![services::Scraped::default(); self.services.len()];
        while !self.stop.load(Ordering::Acquire) {
            let views: Vec<ServiceView> = self
                .services
                .iter()
                .zip(last.iter_mut())
                .map(|(s, l)| services::scrape(s, l))
                .collect();
            *lock(&self.scraped) = views;
            std::thread::sleep(PERIOD);
        }
    }

    /// Stops the ticker.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for t in [lock(&self.ticker).take(), lock(&self.scraper).take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }

    /// The latest picture.
    pub fn latest(&self) -> Arc<Snapshot> {
        Arc::clone(&lock(&self.latest))
    }

    /// A new listener for the live stream.
    pub fn subscribe(&self) -> broadcast::Receiver<Published> {
        self.tx.subscribe()
    }

    /// Listeners now.
    pub fn listeners(&self) -> usize {
        self.tx.receiver_count()
    }

    /// The daemon observed.
    pub fn daemon(&self) -> &Arc<Daemon> {
        &self.daemon
    }

    /// Takes a picture now and publishes it.
    pub fn refresh(&self) -> Arc<Snapshot> {
        self.refresh_with(&CpuSampler::default())
    }

    fn refresh_with(&self, cpus: &CpuSampler) -> Arc<Snapshot> {
        let counts = lock(&self.counts).clone();
        let at = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut snap = snapshot::take(&self.daemon, cpus, counts, at);
        snap.services = lock(&self.scraped).clone();
        let snap = Arc::new(snap);
        *lock(&self.latest) = Arc::clone(&snap);
        if self.tx.receiver_count() > 0 {
            match serde_json::to_string(&*snap) {
                Ok(data) => {
                    // No listener is not an error: the picture is kept anyway.
                    let _ = self.tx.send(Published {
                        event: "status",
                        data: data.into(),
                    });
                }
                Err(e) => tracing::error!("cannot serialise the status picture: {e}"),
            }
        }
        snap
    }

    fn tick_loop(&self) {
        let mut cpus = CpuSampler::default();
        cpus.sample();
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(PERIOD);
            cpus.sample();
            self.refresh_with(&cpus);
        }
    }

    fn on_event(&self, e: &Event) {
        {
            let mut c = lock(&self.counts);
            *c.by_kind.entry(kind_name(&e.kind).into()).or_insert(0) += 1;
            if matches!(e.kind, EventKind::WatchdogExpired { .. }) {
                *c.overruns
                    .entry((e.app.clone(), e.offcode.clone()))
                    .or_insert(0) += 1;
            }
            // Every offcode is placed before it initializes, so its `Placed`
            // event says whether it runs on the Wasm PE; nothing is looked up
            // in the runtime from inside its own event callback.
            let key = (e.app.clone(), e.offcode.clone());
            match &e.kind {
                EventKind::Placed { pe, .. } if pe == "wasm" => {
                    c.wasm_offcodes.insert(key);
                }
                EventKind::Initialized if c.wasm_offcodes.contains(&key) => c.wasm_admitted += 1,
                EventKind::Failed { .. } | EventKind::WatchdogExpired { .. }
                    if c.wasm_offcodes.contains(&key) =>
                {
                    c.wasm_unloaded += 1;
                }
                _ => {}
            }
        }
        if self.tx.receiver_count() > 0
            && let Ok(data) = serde_json::to_string(e)
        {
            let _ = self.tx.send(Published {
                event: "event",
                data: data.into(),
            });
        }
    }
}

/// The kebab-case name of an event kind, as the JSON of the event log says it.
pub fn kind_name(k: &EventKind) -> &'static str {
    match k {
        EventKind::Placed { .. } => "placed",
        EventKind::Fallback { .. } => "fallback",
        EventKind::Initialized => "initialized",
        EventKind::Started => "started",
        EventKind::Done => "done",
        EventKind::WatchdogExpired { .. } => "watchdog-expired",
        EventKind::DeadlineMissed { .. } => "deadline-missed",
        EventKind::Obsolete { .. } => "obsolete",
        EventKind::Stopped { .. } => "stopped",
        EventKind::Failed { .. } => "failed",
        EventKind::Restarting { .. } => "restarting",
        EventKind::Restarted { .. } => "restarted",
        EventKind::RestartLimit { .. } => "restart-limit",
        EventKind::App { .. } => "app",
        EventKind::Replaced { .. } => "replaced",
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
