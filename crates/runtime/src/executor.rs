//! Executors: the thread of control behind a PE. A `core` executor is a thread
//! pinned to its CPU running a run-to-completion loop over the offcodes placed
//! there (HYDRA's NIC dispatcher loop, "onloaded" to a dedicated core); a
//! `host` executor is an ordinary thread per offcode; the wasm engine runs its
//! sandboxes on an executor of its own.
//!
//! Each turn of the loop, for each running offcode: deliver its out-of-band
//! messages, drain a burst from each input (never more than its reliable
//! outputs can take, so back-pressure propagates), call `poll`, publish its
//! outputs, and stamp its heartbeat. An offcode whose turn overruns its
//! watchdog period is stopped when the turn returns; one that never returns is
//! caught by the supervisor (`crate::supervisor`), which watches what each
//! executor is running right now.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use sidecore_channel::oob::OobEndpoint;
use sidecore_offcode::{
    InitCx, Inlet, InputId, Metrics, Offcode, OffcodeError, OffcodeInfo, Outlet, Progress, RunCx,
};

use crate::events::{EventKind, EventLog};

/// Messages drained from one input per turn.
pub const BURST: usize = 256;

/// How an executor waits when nothing is happening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Busy-poll for ever (lowest latency, burns the core).
    Spin,
    /// Busy-poll, then back off to short sleeps once idle for a while.
    Adaptive,
}

/// Life-cycle state of an offcode, shared with the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OffcodeState {
    Landing,
    Initialized,
    Running,
    Done,
    Stopped,
    Failed,
}

impl OffcodeState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => OffcodeState::Landing,
            1 => OffcodeState::Initialized,
            2 => OffcodeState::Running,
            3 => OffcodeState::Done,
            4 => OffcodeState::Stopped,
            _ => OffcodeState::Failed,
        }
    }
    /// No longer running.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OffcodeState::Done | OffcodeState::Stopped | OffcodeState::Failed
        )
    }
}

/// What the control plane sees of an offcode.
pub struct OffcodeHandle {
    pub app: String,
    pub name: String,
    pub pe: String,
    pub implementation: String,
    pub watchdog: Option<Duration>,
    pub obsolete: Option<Duration>,
    pub metrics: Metrics,
    state: AtomicU8,
    /// Set to ask the executor to stop it at its next turn.
    stop_requested: AtomicBool,
    /// Set once its executor has let go of it (stopped, done or failed to land).
    exited: AtomicBool,
    stop_reason: std::sync::Mutex<Option<String>>,
    pub landed_at: Instant,
    pub handled: AtomicU64,
    pub turns: AtomicU64,
    /// Outlet counters: (sent, dropped) summed over outputs.
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
}

impl OffcodeHandle {
    pub fn new(
        app: &str,
        name: &str,
        pe: &str,
        implementation: &str,
        watchdog: Option<Duration>,
        obsolete: Option<Duration>,
    ) -> Self {
        OffcodeHandle {
            app: app.into(),
            name: name.into(),
            pe: pe.into(),
            implementation: implementation.into(),
            watchdog,
            obsolete,
            metrics: Metrics::default(),
            state: AtomicU8::new(0),
            stop_requested: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            stop_reason: std::sync::Mutex::new(None),
            landed_at: Instant::now(),
            handled: AtomicU64::new(0),
            turns: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> OffcodeState {
        OffcodeState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: OffcodeState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// The watchdog expired (a turn ran `elapsed` past period `wd`; `why` says
    /// how): a running offcode fails, once — the executor and the supervisor may
    /// both notice the same overrun, and only the one that moves it from
    /// `Running` reports it and asks it to stop.
    pub(crate) fn expire_watchdog(
        &self,
        events: &EventLog,
        app: &str,
        wd: Duration,
        elapsed: Duration,
        why: impl FnOnce() -> String,
    ) {
        if self
            .state
            .compare_exchange(
                OffcodeState::Running as u8,
                OffcodeState::Failed as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            events.emit(
                app,
                &self.name,
                EventKind::WatchdogExpired {
                    period_ms: wd.as_millis() as u64,
                    elapsed_ms: elapsed.as_millis() as u64,
                },
            );
            self.request_stop(why());
        }
    }

    /// Asks the executor to stop the offcode; the first reason wins.
    pub fn request_stop(&self, reason: impl Into<String>) {
        let mut r = self.stop_reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.into());
        }
        self.stop_requested.store(true, Ordering::Release);
    }

    /// Marks it let go of by whatever ran it (a peer node, for a remote offcode).
    pub(crate) fn set_exited(&self) {
        self.exited.store(true, Ordering::Release);
    }

    /// True once its executor has let go of it: nothing of it runs any more.
    pub fn exited(&self) -> bool {
        self.exited.load(Ordering::Acquire)
    }

    /// Why it was asked to stop, if it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.stop_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// True once a stop was asked for.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested.load(Ordering::Acquire)
    }
}

/// An offcode instance with its ports, owned by the executor running it.
pub struct Slot {
    pub handle: Arc<OffcodeHandle>,
    pub offcode: Box<dyn Offcode>,
    pub info: OffcodeInfo,
    pub params: toml::Table,
    pub inlets: Vec<Inlet>,
    pub outlets: Vec<Outlet>,
    pub oob: Option<OobEndpoint>,
    inputs_closed: Vec<bool>,
}

impl Slot {
    pub fn new(
        handle: Arc<OffcodeHandle>,
        offcode: Box<dyn Offcode>,
        info: OffcodeInfo,
        params: toml::Table,
        inlets: Vec<Inlet>,
        outlets: Vec<Outlet>,
        oob: Option<OobEndpoint>,
    ) -> Self {
        let n = inlets.len();
        Slot {
            handle,
            offcode,
            info,
            params,
            inlets,
            outlets,
            oob,
            inputs_closed: vec![false; n],
        }
    }
}

/// Commands from the deployment to an executor.
pub enum Command {
    /// Take this offcode and initialize it here (phase 1).
    Land(Box<Slot>, Sender<Result<(), String>>),
    /// Start the named offcode (phase 2).
    Start(String, Sender<Result<(), String>>),
    /// Stop the named offcode now.
    Stop(String, String, Sender<()>),
    /// Stop everything and exit.
    Shutdown,
}

/// What the supervisor can see of an executor right now.
pub struct ExecutorState {
    pub name: String,
    /// Index+1 into `handles` of the offcode in its turn now, 0 if none.
    pub current: AtomicUsize,
    /// When the current turn began (ns since `epoch`).
    pub since: AtomicU64,
    pub epoch: Instant,
    pub handles: std::sync::Mutex<Vec<Arc<OffcodeHandle>>>,
}

impl ExecutorState {
    pub fn new(name: &str) -> Self {
        ExecutorState {
            name: name.into(),
            current: AtomicUsize::new(0),
            since: AtomicU64::new(0),
            epoch: Instant::now(),
            handles: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The offcode in its turn now and for how long.
    pub fn running(&self) -> Option<(Arc<OffcodeHandle>, Duration)> {
        let cur = self.current.load(Ordering::Acquire);
        if cur == 0 {
            return None;
        }
        let since = Duration::from_nanos(self.since.load(Ordering::Acquire));
        let h = self
            .handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(cur - 1)
            .cloned()?;
        Some((h, self.epoch.elapsed().saturating_sub(since)))
    }
}

/// Where an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorSpec {
    pub name: String,
    /// CPU to pin to (for `core` PEs).
    pub pin: Option<u32>,
    pub idle: IdlePolicy,
}

struct Running {
    slot: Box<Slot>,
    started: bool,
    index: usize,
}

/// Spawns an executor thread; returns its command sender, state and join handle.
pub fn spawn(
    spec: ExecutorSpec,
    app: String,
    events: EventLog,
) -> std::io::Result<(
    Sender<Command>,
    Arc<ExecutorState>,
    std::thread::JoinHandle<()>,
)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let state = Arc::new(ExecutorState::new(&spec.name));
    let st = Arc::clone(&state);
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let join = std::thread::Builder::new()
        .name(format!("sc-{}", spec.name))
        .spawn(move || {
            if let Some(cpu) = spec.pin
                && let Err(e) = sidecore_pe::cores::pin_current_thread(cpu)
            {
                let _ = ready_tx.send(Err(format!("cannot pin to CPU {cpu}: {e}")));
                return;
            }
            let _ = ready_tx.send(Ok(()));
            run(spec, app, rx, st, events);
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((tx, state, join)),
        Ok(Err(e)) => {
            let _ = join.join();
            Err(std::io::Error::other(e))
        }
        Err(_) => Err(std::io::Error::other("executor thread died while starting")),
    }
}

fn run(
    spec: ExecutorSpec,
    app: String,
    rx: Receiver<Command>,
    state: Arc<ExecutorState>,
    events: EventLog,
) {
    let mut slots: Vec<Running> = Vec::new();
    let mut idle_turns: u64 = 0;
    loop {
        // Commands: block briefly only when there is nothing to run.
        let cmd = if slots.iter().any(|r| r.started) {
            rx.try_recv().ok()
        } else {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(Command::Shutdown),
            }
        };
        if let Some(cmd) = cmd {
            match cmd {
                Command::Land(mut slot, reply) => {
                    let r = {
                        let mut cx = InitCx::new(&slot.info, &slot.params, &slot.handle.metrics);
                        slot.offcode.initialize(&mut cx)
                    };
                    match r {
                        Ok(()) => {
                            slot.handle.set_state(OffcodeState::Initialized);
                            events.emit(&app, &slot.info.name, EventKind::Initialized);
                            let index = {
                                let mut hs =
                                    state.handles.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                                hs.push(Arc::clone(&slot.handle));
                                hs.len() - 1
                            };
                            slots.push(Running {
                                slot,
                                started: false,
                                index,
                            });
                            let _ = reply.send(Ok(()));
                        }
                        Err(e) => {
                            slot.handle.set_state(OffcodeState::Failed);
                            slot.handle.exited.store(true, Ordering::Release);
                            events.emit(
                                &app,
                                &slot.info.name,
                                EventKind::Failed {
                                    error: format!("initialize: {e}"),
                                },
                            );
                            let _ = reply.send(Err(format!("initialize: {e}")));
                        }
                    }
                }
                Command::Start(name, reply) => {
                    let r = match slots.iter_mut().find(|r| r.slot.info.name == name) {
                        None => Err(format!("offcode `{name}` is not on {}", spec.name)),
                        Some(r) => {
                            let s = &mut *r.slot;
                            let mut cx = RunCx::new(&s.info, &mut s.outlets, Instant::now());
                            match s.offcode.start(&mut cx).and_then(|()| cx.flush()) {
                                Ok(()) => {
                                    r.started = true;
                                    s.handle.set_state(OffcodeState::Running);
                                    events.emit(&app, &name, EventKind::Started);
                                    Ok(())
                                }
                                Err(e) => {
                                    s.handle.set_state(OffcodeState::Failed);
                                    events.emit(
                                        &app,
                                        &name,
                                        EventKind::Failed {
                                            error: format!("start: {e}"),
                                        },
                                    );
                                    Err(format!("start: {e}"))
                                }
                            }
                        }
                    };
                    let _ = reply.send(r);
                }
                Command::Stop(name, reason, reply) => {
                    if let Some(pos) = slots.iter().position(|r| r.slot.info.name == name) {
                        let r = slots.remove(pos);
                        finish(&app, &events, r.slot, Some(reason), OffcodeState::Stopped);
                    }
                    let _ = reply.send(());
                }
                Command::Shutdown => {
                    for r in slots.drain(..).rev() {
                        finish(
                            &app,
                            &events,
                            r.slot,
                            Some("shutdown".into()),
                            OffcodeState::Stopped,
                        );
                    }
                    return;
                }
            }
            continue;
        }

        let mut progress = false;
        let mut i = 0;
        while i < slots.len() {
            let r = &mut slots[i];
            if !r.started {
                i += 1;
                continue;
            }
            let handle = Arc::clone(&r.slot.handle);
            if handle.stop_requested() {
                // `finish` keeps a `Failed` state (e.g. after the watchdog).
                stop_slot(&app, &events, slots.remove(i).slot);
                continue;
            }
            let t0 = state.epoch.elapsed();
            state.since.store(t0.as_nanos() as u64, Ordering::Release);
            state.current.store(r.index + 1, Ordering::Release);
            let outcome = turn(&mut r.slot);
            state.current.store(0, Ordering::Release);
            let took = state.epoch.elapsed().saturating_sub(t0);
            handle.turns.fetch_add(1, Ordering::Relaxed);
            store_counts(&handle, &r.slot.outlets);
            if let Some(wd) = handle.watchdog
                && took > wd
            {
                handle.expire_watchdog(&events, &app, wd, took, || {
                    format!(
                        "watchdog: a turn took {} ms, period {} ms",
                        took.as_millis(),
                        wd.as_millis()
                    )
                });
            }
            match outcome {
                Ok(TurnOutcome::Progress) => progress = true,
                Ok(TurnOutcome::Idle) => {}
                Ok(TurnOutcome::Done) => {
                    let r = slots.remove(i);
                    handle.set_state(OffcodeState::Done);
                    events.emit(&app, &handle.name, EventKind::Done);
                    finish(&app, &events, r.slot, None, OffcodeState::Done);
                    continue;
                }
                Err(_) if handle.stop_requested() => {
                    // Being stopped already (e.g. the app is going down and a
                    // peer went first): an error now is part of stopping.
                    stop_slot(&app, &events, slots.remove(i).slot);
                    continue;
                }
                Err(e) => {
                    handle.set_state(OffcodeState::Failed);
                    events.emit(
                        &app,
                        &handle.name,
                        EventKind::Failed {
                            error: e.to_string(),
                        },
                    );
                    let r = slots.remove(i);
                    finish(
                        &app,
                        &events,
                        r.slot,
                        Some(format!("error: {e}")),
                        OffcodeState::Failed,
                    );
                    continue;
                }
            }
            i += 1;
        }

        if progress {
            idle_turns = 0;
        } else {
            idle_turns += 1;
            match spec.idle {
                IdlePolicy::Spin => std::hint::spin_loop(),
                IdlePolicy::Adaptive => {
                    if idle_turns < 2_000 {
                        std::hint::spin_loop();
                    } else if idle_turns < 20_000 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        }
    }
}

enum TurnOutcome {
    Progress,
    Idle,
    Done,
}

/// One turn of one offcode.
fn turn(slot: &mut Slot) -> Result<TurnOutcome, OffcodeError> {
    let Slot {
        handle,
        offcode,
        info,
        inlets,
        outlets,
        oob,
        inputs_closed,
        ..
    } = slot;
    let now = Instant::now();
    let mut handled = 0usize;
    // Out-of-band messages first: they are rare and may change behaviour.
    if let Some(oob) = oob.as_ref()
        && let Some(msg) = oob.try_recv()
    {
        let mut cx = RunCx::new(info, outlets, now);
        offcode.control(&mut cx, &msg)?;
    }
    // Back-pressure: take no more input than the reliable outputs can absorb.
    let room = outlets
        .iter_mut()
        .map(Outlet::free)
        .min()
        .unwrap_or(u64::MAX);
    let burst = BURST.min(room.min(BURST as u64) as usize);
    if burst > 0 {
        for (i, inlet) in inlets.iter_mut().enumerate() {
            if inputs_closed[i] {
                continue;
            }
            let mut cx = RunCx::new(info, outlets, now);
            let d = offcode.handle_burst(&mut cx, InputId(i), inlet, burst)?;
            handled += d.messages;
            if d.closed {
                inputs_closed[i] = true;
            }
        }
    }
    let mut cx = RunCx::new(info, outlets, now);
    let p = offcode.poll(&mut cx)?;
    cx.flush()?;
    if handled > 0 {
        handle.handled.fetch_add(handled as u64, Ordering::Relaxed);
    }
    let all_inputs_closed = !inputs_closed.is_empty() && inputs_closed.iter().all(|c| *c);
    Ok(match p {
        Progress::Done => TurnOutcome::Done,
        Progress::Idle if all_inputs_closed && handled == 0 => TurnOutcome::Done,
        Progress::Busy => TurnOutcome::Progress,
        Progress::Idle if handled > 0 => TurnOutcome::Progress,
        Progress::Idle => TurnOutcome::Idle,
    })
}

/// Finishes an offcode whose stop was requested, with the request's reason.
fn stop_slot(app: &str, events: &EventLog, slot: Box<Slot>) {
    let reason = slot
        .handle
        .stop_reason()
        .unwrap_or_else(|| "requested".into());
    finish(app, events, slot, Some(reason), OffcodeState::Stopped);
}

/// Copies the outlets' (sent, dropped) counters, summed, into the handle.
fn store_counts(handle: &OffcodeHandle, outlets: &[Outlet]) {
    let (sent, dropped) = outlets
        .iter()
        .map(Outlet::counts)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    handle.sent.store(sent, Ordering::Relaxed);
    handle.dropped.store(dropped, Ordering::Relaxed);
}

/// Calls `stop` and drops the slot (closing its channel ends).
fn finish(
    app: &str,
    events: &EventLog,
    mut slot: Box<Slot>,
    reason: Option<String>,
    state: OffcodeState,
) {
    let mut cx = RunCx::new(&slot.info, &mut slot.outlets, Instant::now());
    if let Err(e) = slot.offcode.stop(&mut cx) {
        events.emit(
            app,
            &slot.info.name,
            EventKind::Failed {
                error: format!("stop: {e}"),
            },
        );
    }
    let _ = cx.flush();
    // What `stop` sent, and what the last turn left staged, is published only now.
    store_counts(&slot.handle, &slot.outlets);
    if !slot.handle.state().is_final() || state != OffcodeState::Done {
        let keep_failed = slot.handle.state() == OffcodeState::Failed;
        slot.handle.set_state(if keep_failed {
            OffcodeState::Failed
        } else {
            state
        });
    }
    if let Some(reason) = reason {
        events.emit(app, &slot.info.name, EventKind::Stopped { reason });
    }
    let handle = Arc::clone(&slot.handle);
    drop(slot);
    handle.exited.store(true, Ordering::Release);
}
