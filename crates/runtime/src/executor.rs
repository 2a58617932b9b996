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
//! caught by the supervisor ([`crate::supervisor`]), which watches what each
//! executor is running right now through its [`ExecutorState`].
//!
//! On a dedicated core, the loop also ticks Orion's liveness sensor of that core
//! (`sidecore_orion::core_sensors`) once per iteration, busy or idle, and marks
//! when it is inside an offcode's turn or a command: the core monitor tells a
//! core that no longer runs its executor from an offcode stuck in one turn.
//!
//! An offcode with a restart policy that fails (an error from its turn, or
//! its watchdog) is *parked*: its instance is stopped, its ports, out-of-band
//! endpoint and call bindings stay here. The supervisor decides; on
//! [`Command::Restart`] the executor builds a fresh instance from the
//! library, initializes it, tells it its channels again and starts it, all
//! on this PE, with the channels still attached.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use sidecore_channel::oob::{OobEndpoint, OobMessage};
use sidecore_offcode::{
    BuildSpec, Calls, Factory, InitCx, Inlet, InputId, Offcode, OffcodeError, OffcodeInfo, Outlet,
    Progress, RunCx,
};
use sidecore_types::{OffcodeState, SchedPolicy};

use crate::dispatch::{AdmitError, Dispatcher, TaskSpec};
use crate::events::{EventKind, EventLog};
use crate::handle::OffcodeHandle;
use crate::serve::serve_burst;

/// Messages drained from one input per turn.
pub const BURST: usize = sidecore_offcode::TURN_BURST;
/// How long an executor with nothing started waits for a command.
const COMMAND_WAIT: Duration = Duration::from_millis(5);
/// Idle turns spent spinning, then yielding, before an adaptive executor on a
/// dedicated core sleeps.
const SPIN_TURNS: u64 = 2_000;
const YIELD_TURNS: u64 = 20_000;
/// The same for an executor on the host: an ordinary thread sharing the
/// application's CPUs, which should wait the way ordinary programs do. With
/// the core's budgets, an offcode fed every few milliseconds never reached
/// its sleep and cost ~40% of an application core in yields (TiVoPC's
/// decoder at 200 chunks/s).
const HOST_SPIN_TURNS: u64 = 64;
const HOST_YIELD_TURNS: u64 = 256;
/// How long an idle adaptive executor sleeps per turn.
const IDLE_SLEEP: Duration = Duration::from_micros(200);

/// How an executor waits when nothing is happening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Busy-poll for ever (lowest latency, burns the core).
    Spin,
    /// Busy-poll, then back off to short sleeps once idle for a while.
    Adaptive,
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
    /// What the core's scheduler knows of it (period, WCET, priority).
    pub task: TaskSpec,
    /// Its call bindings: the caller's table and return ports, the provider's serve ports.
    pub calls: Calls,
    /// How to build it again, for a restart.
    pub rebuild: Option<Rebuild>,
    inputs_closed: Vec<bool>,
    /// (sent, dropped) by outlets since replaced by a rewiring.
    retired_counts: (u64, u64),
    /// The inlets the last rewiring replaced, never read again: kept until the
    /// next rewiring, so that the old sender is not told at once that its
    /// receiver has gone.
    retired_inlets: Vec<Inlet>,
}

/// What a restart needs besides the slot's own parameters and info: the
/// implementation's factory, its artifact, and the channels to announce.
#[derive(Clone)]
pub struct Rebuild {
    pub factory: Factory,
    pub module: Option<std::path::PathBuf>,
    /// (channel, port) of every channel it is joined to.
    pub connected: Vec<(String, String)>,
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
        let name = info.name.clone();
        Slot {
            handle,
            offcode,
            info,
            params,
            inlets,
            outlets,
            task: TaskSpec {
                name,
                periodic: None,
                wcet_ns: None,
                priority: 2,
            },
            oob,
            calls: Calls::none(),
            rebuild: None,
            inputs_closed: vec![false; n],
            retired_counts: (0, 0),
            retired_inlets: Vec::new(),
        }
    }

    /// Whether it may have something to do: input waiting on an open data
    /// input, or no data inputs at all (a source, or an offcode polling a
    /// socket), which the dispatcher treats as always ready.
    pub fn may_have_input(&self) -> bool {
        let mut data_inputs = false;
        for (i, inlet) in self.inlets.iter().enumerate() {
            if self.inputs_closed[i] || self.calls.is_return_input(i) {
                continue;
            }
            data_inputs = true;
            if inlet.may_have_input() {
                return true;
            }
        }
        !data_inputs
    }

    /// What the core's scheduler is to know of it.
    #[must_use]
    pub fn with_task(mut self, task: TaskSpec) -> Self {
        self.task = task;
        self
    }

    /// How to build it again when the supervisor restarts it.
    #[must_use]
    pub fn with_rebuild(mut self, rebuild: Rebuild) -> Self {
        self.rebuild = Some(rebuild);
        self
    }

    /// Binds the calls its info lists: return ports leave `inlets` for the
    /// call table. `colocated` says whether a provider shares its executor.
    #[must_use]
    pub fn with_calls(mut self, colocated: impl Fn(&str) -> bool) -> Self {
        self.calls = Calls::new(&self.info.calls, &mut self.inlets, colocated);
        self
    }
}

/// New ends for some ports of an offcode whose peers were re-placed
/// ([`crate::relocate`]): each replaces the end at its port index, and the
/// channels named are announced to it again.
#[derive(Default)]
pub struct Rewiring {
    pub outlets: Vec<(usize, Outlet)>,
    pub inlets: Vec<(usize, Inlet)>,
    /// (channel, port) of each channel rewired.
    pub connected: Vec<(String, String)>,
}

/// Why an executor could not carry out a command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The offcode's own `initialize` or `start` failed.
    #[error("{step}: {source}")]
    Offcode {
        step: &'static str,
        #[source]
        source: OffcodeError,
    },
    #[error("offcode `{offcode}` is not on {executor}")]
    NotHere { offcode: String, executor: String },
    /// A restart of an offcode that is not parked, or cannot be rebuilt.
    #[error("offcode `{0}` cannot be restarted: {1}")]
    NoRestart(String, &'static str),
    /// A rewiring names a port the offcode does not have (or a call's return port).
    #[error("offcode `{0}` has no port {1} that can be rewired")]
    NoRewire(String, usize),
    /// The core's scheduler cannot fit it beside the offcodes already there.
    #[error(transparent)]
    Refused(#[from] AdmitError),
    #[error("executor is gone")]
    Gone,
    #[error("no answer from its executor")]
    NoAnswer,
}

/// An executor's answer to a command.
pub type Reply = Sender<Result<(), ExecError>>;

/// Commands from the deployment to an executor.
pub enum Command {
    /// Take this offcode and initialize it here (phase 1).
    Land(Box<Slot>, Reply),
    /// Start the named offcode (phase 2).
    Start(String, Reply),
    /// Stop the named offcode now.
    Stop(String, String, Sender<()>),
    /// Build the named parked offcode afresh, initialize and start it.
    Restart(String, Reply),
    /// Replace some of the named offcode's ports (its peers moved to another
    /// PE), keeping its instance and state.
    Rewire(String, Box<Rewiring>, Reply),
    /// Stop everything and exit.
    Shutdown,
}

/// What the supervisor can see of an executor right now.
pub struct ExecutorState {
    pub name: String,
    /// Index+1 into `handles` of the offcode in its turn now, 0 if none.
    pub current: AtomicUsize,
    /// When the current turn began (ns since `epoch`).
    pub since_ns: AtomicU64,
    pub epoch: Instant,
    pub handles: Mutex<Vec<Arc<OffcodeHandle>>>,
}

impl ExecutorState {
    pub fn new(name: &str) -> Self {
        ExecutorState {
            name: name.into(),
            current: AtomicUsize::new(0),
            since_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            handles: Mutex::new(Vec::new()),
        }
    }

    /// The offcode in its turn now and for how long.
    pub fn running(&self) -> Option<(Arc<OffcodeHandle>, Duration)> {
        let cur = self.current.load(Ordering::Acquire);
        if cur == 0 {
            return None;
        }
        let since = Duration::from_nanos(self.since_ns.load(Ordering::Acquire));
        let h = self
            .handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(cur - 1)
            .cloned()?;
        Some((h, self.epoch.elapsed().saturating_sub(since)))
    }

    /// Registers an offcode that landed here; returns its index.
    fn register(&self, h: Arc<OffcodeHandle>) -> usize {
        let mut hs = self
            .handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hs.push(h);
        hs.len() - 1
    }

    /// Marks the start of `index`'s turn (for the supervisor), returning when.
    fn begin_turn(&self, index: usize) -> Duration {
        let t0 = self.epoch.elapsed();
        self.since_ns.store(
            u64::try_from(t0.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        self.current.store(index + 1, Ordering::Release);
        t0
    }

    /// Marks the end of a turn begun at `t0`; returns how long it took.
    fn end_turn(&self, t0: Duration) -> Duration {
        self.current.store(0, Ordering::Release);
        self.epoch.elapsed().saturating_sub(t0)
    }
}

/// Where an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorSpec {
    pub name: String,
    /// CPU to pin to (for `core` PEs).
    pub pin: Option<u32>,
    pub idle: IdlePolicy,
    /// How the offcodes placed here share it.
    pub policy: SchedPolicy,
}

struct Running {
    slot: Box<Slot>,
    started: bool,
    /// Failed and stopped, its ports kept, waiting for the supervisor.
    parked: bool,
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
            // Orion's liveness sensor of the core: a tick per loop iteration.
            let sensor = spec.pin.map(sidecore_orion::core_sensors::register);
            Executor {
                spec,
                sensor,
                app,
                state: st,
                events,
                slots: Vec::new(),
                dispatcher: None,
                started: Vec::new(),
                dirty: false,
                idle_until: None,
            }
            .run(&rx);
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

/// The executor thread's own state.
struct Executor {
    spec: ExecutorSpec,
    /// On a dedicated core: ticked every iteration, marked inside offcode code.
    sensor: Option<sidecore_orion::core_sensors::SensorGuard>,
    app: String,
    state: Arc<ExecutorState>,
    events: EventLog,
    slots: Vec<Running>,
    /// The scheduler's view of the started offcodes (not under round-robin).
    dispatcher: Option<Dispatcher>,
    /// `slots` index of each of the dispatcher's tasks.
    started: Vec<usize>,
    /// The started set changed: rebuild the dispatcher before the next turn.
    dirty: bool,
    /// Until when the dispatcher said to idle (ns since the state's epoch).
    idle_until: Option<u64>,
}

impl Executor {
    fn run(mut self, rx: &Receiver<Command>) {
        let mut idle_turns: u64 = 0;
        loop {
            if let Some(s) = &self.sensor {
                s.tick();
            }
            // Commands: block briefly only when there is nothing to run.
            let cmd = if self.slots.iter().any(|r| r.started) {
                rx.try_recv().ok()
            } else {
                match rx.recv_timeout(COMMAND_WAIT) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Command::Shutdown),
                }
            };
            if let Some(cmd) = cmd {
                self.inside(true);
                let carry_on = self.command(cmd);
                self.inside(false);
                if !carry_on {
                    return;
                }
                continue;
            }
            if self.turn_all() {
                idle_turns = 0;
            } else {
                idle_turns += 1;
                self.idle(idle_turns);
            }
        }
    }

    /// Marks this executor's core sensor inside (or out of) an offcode's code.
    fn inside(&self, yes: bool) {
        if let Some(s) = &self.sensor {
            s.inside(yes);
        }
    }

    /// Carries out a command; false once the executor must exit.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Land(slot, reply) => {
                let _ = reply.send(self.land(slot));
            }
            Command::Start(name, reply) => {
                let _ = reply.send(self.start(&name));
            }
            Command::Stop(name, reason, reply) => {
                if let Some(pos) = self.slots.iter().position(|r| r.slot.info.name == name) {
                    let r = self.slots.remove(pos);
                    self.dirty = true;
                    let how = Finish::new(Some(reason), OffcodeState::Stopped, !r.parked);
                    finish(&self.app, &self.events, r.slot, how);
                }
                let _ = reply.send(());
            }
            Command::Restart(name, reply) => {
                let _ = reply.send(self.restart(&name));
            }
            Command::Rewire(name, rewiring, reply) => {
                let _ = reply.send(self.rewire(&name, *rewiring));
            }
            Command::Shutdown => {
                for r in self.slots.drain(..).rev() {
                    let reason = Some("shutdown".to_string());
                    let how = Finish::new(reason, OffcodeState::Stopped, !r.parked);
                    finish(&self.app, &self.events, r.slot, how);
                }
                return false;
            }
        }
        true
    }

    /// Phase 1: initialize an offcode here.
    fn land(&mut self, mut slot: Box<Slot>) -> Result<(), ExecError> {
        let mut specs: Vec<TaskSpec> = self.slots.iter().map(|r| r.slot.task.clone()).collect();
        specs.push(slot.task.clone());
        if let Err(e) = Dispatcher::admit(self.spec.policy, &self.spec.name, &specs) {
            slot.handle.set_state(OffcodeState::Failed);
            slot.handle.set_exited();
            let error = e.to_string();
            self.events
                .emit(&self.app, &slot.info.name, EventKind::Failed { error });
            return Err(ExecError::Refused(e));
        }
        let r = {
            let mut cx = InitCx::new(&slot.info, &slot.params, &slot.handle.metrics);
            slot.offcode.initialize(&mut cx)
        };
        match r {
            Ok(()) => {
                slot.handle.set_state(OffcodeState::Initialized);
                self.events
                    .emit(&self.app, &slot.info.name, EventKind::Initialized);
                let index = self.state.register(Arc::clone(&slot.handle));
                self.slots.push(Running {
                    slot,
                    started: false,
                    parked: false,
                    index,
                });
                Ok(())
            }
            Err(source) => {
                slot.handle.set_state(OffcodeState::Failed);
                slot.handle.set_exited();
                let e = ExecError::Offcode {
                    step: "initialize",
                    source,
                };
                let error = e.to_string();
                self.events
                    .emit(&self.app, &slot.info.name, EventKind::Failed { error });
                Err(e)
            }
        }
    }

    /// Phase 2: start an offcode that landed here.
    fn start(&mut self, name: &str) -> Result<(), ExecError> {
        let Some(r) = self.slots.iter_mut().find(|r| r.slot.info.name == name) else {
            return Err(ExecError::NotHere {
                offcode: name.to_string(),
                executor: self.spec.name.clone(),
            });
        };
        let s = &mut *r.slot;
        let mut cx = RunCx::with_calls(&s.info, &mut s.outlets, &mut s.calls, Instant::now());
        match s.offcode.start(&mut cx).and_then(|()| cx.flush()) {
            Ok(()) => {
                r.started = true;
                self.dirty = true;
                s.handle.set_state(OffcodeState::Running);
                self.events.emit(&self.app, name, EventKind::Started);
                Ok(())
            }
            Err(source) => {
                s.handle.set_state(OffcodeState::Failed);
                let e = ExecError::Offcode {
                    step: "start",
                    source,
                };
                let error = e.to_string();
                self.events
                    .emit(&self.app, name, EventKind::Failed { error });
                // A restarted offcode that fails to start is parked again.
                if s.handle.restarts() > 0 && s.handle.restart.restarts() {
                    stop_instance(&self.app, &self.events, s);
                    r.parked = true;
                    s.handle.park();
                }
                Err(e)
            }
        }
    }

    /// One turn of every started offcode (round-robin), or of the one the
    /// core's scheduler picks; true if any made progress.
    fn turn_all(&mut self) -> bool {
        if self.spec.policy != SchedPolicy::RoundRobin {
            return self.turn_scheduled();
        }
        let mut progress = false;
        let mut i = 0;
        while i < self.slots.len() {
            match self.turn_one(i) {
                Turned::NotStarted | Turned::Idle(_) => i += 1,
                Turned::Progress(_) => {
                    progress = true;
                    i += 1;
                }
                Turned::Removed => {}
            }
        }
        progress
    }

    /// The turn the dispatcher picks (HYDRA §6.3's `Yield()`), or nothing
    /// when it says idle.
    fn turn_scheduled(&mut self) -> bool {
        if self.dirty {
            self.rebuild_dispatcher();
        }
        let now = self.now_ns();
        let Some(d) = self.dispatcher.as_mut() else {
            self.idle_until = None;
            return false;
        };
        let (slots, started) = (&self.slots, &self.started);
        let pick = d.next(
            now,
            |k| slots[started[k]].slot.may_have_input(),
            |k| slots[started[k]].slot.offcode.ticket_ns(),
        );
        let k = match pick {
            Ok(k) => k,
            Err(until) => {
                self.idle_until = Some(until);
                return false;
            }
        };
        self.idle_until = None;
        let i = self.started[k];
        let turned = self.turn_one(i);
        let end = self.now_ns();
        let missed = self.dispatcher.as_mut().and_then(|d| match turned {
            Turned::Progress(took) => d.ran(k, end, took, true),
            Turned::Idle(took) => d.ran(k, end, took, false),
            Turned::NotStarted | Turned::Removed => None,
        });
        if let Some(deadline) = missed {
            self.deadline_missed(i, end - deadline);
        }
        matches!(turned, Turned::Progress(_) | Turned::Removed)
    }

    /// Counts a periodic job of slot `i` that ended `late_ns` after its
    /// deadline, and says so in the event log for the 1st, 2nd, 4th, 8th…
    /// miss (never silently, never a flood).
    fn deadline_missed(&self, i: usize, late_ns: u64) {
        let handle = &self.slots[i].slot.handle;
        let misses = handle.deadline_misses.fetch_add(1, Ordering::Relaxed) + 1;
        if misses.is_power_of_two() {
            self.events.emit(
                &self.app,
                &handle.name,
                EventKind::DeadlineMissed {
                    late_us: late_ns / 1_000,
                    misses,
                },
            );
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.state.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The dispatcher over the started offcodes, after one started or left.
    fn rebuild_dispatcher(&mut self) {
        self.dirty = false;
        self.started = (0..self.slots.len())
            .filter(|&i| self.slots[i].started)
            .collect();
        let specs: Vec<TaskSpec> = self
            .started
            .iter()
            .map(|&i| self.slots[i].slot.task.clone())
            .collect();
        let now = self.now_ns();
        self.dispatcher =
            Dispatcher::rebuilt(self.spec.policy, &specs, now, self.dispatcher.as_ref());
    }

    /// One turn of slot `i`, if it has started.
    fn turn_one(&mut self, i: usize) -> Turned {
        let r = &mut self.slots[i];
        if !r.started {
            return Turned::NotStarted;
        }
        let handle = Arc::clone(&r.slot.handle);
        if handle.stop_requested() && handle.held() {
            // On a PE declared dead: stopped, its ports kept open for the
            // re-placement (which drops them once it has rewired its peers).
            self.shelve(i);
            self.dirty = true;
            return Turned::NotStarted;
        }
        if handle.stop_requested() {
            self.dirty = true;
            if handle.watchdog_fired() && handle.parks_on_failure() {
                self.park(i, None);
                return Turned::Removed;
            }
            // `finish` keeps a `Failed` state (e.g. after the watchdog).
            stop_slot(&self.app, &self.events, self.slots.remove(i).slot);
            return Turned::Removed;
        }
        let t0 = self.state.begin_turn(r.index);
        if let Some(s) = &self.sensor {
            s.inside(true);
        }
        let outcome = turn(&mut r.slot);
        if let Some(s) = &self.sensor {
            s.inside(false);
        }
        let took = self.state.end_turn(t0);
        handle.turns.fetch_add(1, Ordering::Relaxed);
        store_counts(&r.slot);
        if let Some(wd) = handle.watchdog
            && took > wd
        {
            handle.expire_watchdog(&self.events, &self.app, wd, took, || {
                format!(
                    "watchdog: a turn took {} ms, period {} ms",
                    took.as_millis(),
                    wd.as_millis()
                )
            });
        }
        let took_ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        match outcome {
            Ok(TurnOutcome::Progress) => Turned::Progress(took_ns),
            Ok(TurnOutcome::Idle) => Turned::Idle(took_ns),
            Err(e) if handle.parks_on_failure() => {
                self.dirty = true;
                self.park(i, Some(e));
                Turned::Removed
            }
            Ok(TurnOutcome::Done) | Err(_) => {
                let r = self.slots.remove(i);
                self.retire(&handle, r.slot, outcome.err());
                self.dirty = true;
                Turned::Removed
            }
        }
    }

    /// Lets go of an offcode that finished (`error` = `None`) or failed.
    fn retire(&self, handle: &OffcodeHandle, slot: Box<Slot>, error: Option<OffcodeError>) {
        let (app, events) = (&self.app, &self.events);
        match error {
            None => {
                handle.set_state(OffcodeState::Done);
                events.emit(app, &handle.name, EventKind::Done);
                finish(
                    app,
                    events,
                    slot,
                    Finish::new(None, OffcodeState::Done, true),
                );
            }
            // Being stopped already (e.g. the app is going down and a peer
            // went first): an error now is part of stopping.
            Some(_) if handle.stop_requested() => stop_slot(app, events, slot),
            Some(e) => {
                handle.set_state(OffcodeState::Failed);
                let error = e.to_string();
                events.emit(app, &handle.name, EventKind::Failed { error });
                let reason = Some(format!("error: {e}"));
                finish(
                    app,
                    events,
                    slot,
                    Finish::new(reason, OffcodeState::Failed, true),
                );
            }
        }
    }

    /// Parks slot `i` after a failure (`error`, or its watchdog): its
    /// instance is stopped, its ports stay, and the supervisor is told.
    fn park(&mut self, i: usize, error: Option<OffcodeError>) {
        if let Some(e) = error {
            let error = e.to_string();
            let name = &self.slots[i].slot.info.name;
            self.events
                .emit(&self.app, name, EventKind::Failed { error });
        }
        self.shelve(i);
        self.slots[i].slot.handle.park();
    }

    /// Stops slot `i`'s instance and keeps the slot, its ports open: a parked
    /// offcode waiting for the supervisor, or one held on a PE declared dead.
    fn shelve(&mut self, i: usize) {
        let r = &mut self.slots[i];
        r.started = false;
        r.parked = true;
        stop_instance(&self.app, &self.events, &mut r.slot);
    }

    /// The supervisor's restart of a parked offcode: a fresh instance from
    /// the library, initialized and started here, its channels announced
    /// again. If any step fails it stays parked, and the supervisor hears
    /// of it as of any other failure.
    fn restart(&mut self, name: &str) -> Result<(), ExecError> {
        let Some(pos) = self.slots.iter().position(|r| r.slot.info.name == name) else {
            return Err(ExecError::NotHere {
                offcode: name.to_string(),
                executor: self.spec.name.clone(),
            });
        };
        if !self.slots[pos].parked {
            return Err(ExecError::NoRestart(name.into(), "it is not parked"));
        }
        let s = &mut *self.slots[pos].slot;
        s.handle.rearm();
        s.handle.set_state(OffcodeState::Landing);
        let r = renew(s);
        if let Err(e) = r {
            let error = format!("restart: {e}");
            self.events
                .emit(&self.app, name, EventKind::Failed { error });
            s.handle.park();
            return Err(e);
        }
        s.handle.set_state(OffcodeState::Initialized);
        self.events.emit(&self.app, name, EventKind::Initialized);
        self.slots[pos].parked = false;
        self.start(name)?;
        let restarts = self.slots[pos].slot.handle.restarts();
        self.events
            .emit(&self.app, name, EventKind::Restarted { restarts });
        Ok(())
    }

    /// Puts new ends on some of an offcode's ports; an input given a new end
    /// is open again. The old outlets are dropped (closing them); the old
    /// inlets are kept unread until the next rewiring. The offcode hears of
    /// each channel named as it did when it started.
    fn rewire(&mut self, name: &str, w: Rewiring) -> Result<(), ExecError> {
        let Some(r) = self.slots.iter_mut().find(|r| r.slot.info.name == name) else {
            return Err(ExecError::NotHere {
                offcode: name.to_string(),
                executor: self.spec.name.clone(),
            });
        };
        let s = &mut *r.slot;
        let ports = (s.outlets.len(), s.inlets.len());
        let bad_out = w.outlets.iter().map(|(p, _)| *p).find(|&p| p >= ports.0);
        let bad_in = w
            .inlets
            .iter()
            .map(|(p, _)| *p)
            .find(|&p| p >= ports.1 || s.calls.is_return_input(p));
        if let Some(bad) = bad_out.or(bad_in) {
            return Err(ExecError::NoRewire(name.into(), bad));
        }
        // What the old outlets sent stays counted.
        for (p, o) in w.outlets {
            let (sent, dropped) = std::mem::replace(&mut s.outlets[p], o).counts();
            s.retired_counts.0 += sent;
            s.retired_counts.1 += dropped;
        }
        // The previous rewiring's old inlets go now.
        s.retired_inlets = w
            .inlets
            .into_iter()
            .map(|(p, i)| {
                s.inputs_closed[p] = false;
                std::mem::replace(&mut s.inlets[p], i)
            })
            .collect();
        if let Some(oob) = &s.oob {
            for (channel, port) in w.connected {
                let msg = OobMessage::ChannelAvailable { channel, port };
                let _ = oob.directory().send(oob.name(), msg);
            }
        }
        self.dirty = true;
        Ok(())
    }

    /// Waits a little after `idle_turns` turns without progress.
    fn idle(&self, idle_turns: u64) {
        match self.spec.idle {
            IdlePolicy::Spin => std::hint::spin_loop(),
            IdlePolicy::Adaptive => {
                let (spin, yields) = if self.spec.pin.is_some() {
                    (SPIN_TURNS, YIELD_TURNS)
                } else {
                    (HOST_SPIN_TURNS, HOST_YIELD_TURNS)
                };
                if idle_turns < spin {
                    std::hint::spin_loop();
                } else if idle_turns < yields {
                    std::thread::yield_now();
                } else {
                    // Never past the next periodic release the dispatcher named.
                    let left = self.idle_until.map_or(IDLE_SLEEP, |until| {
                        Duration::from_nanos(until.saturating_sub(self.now_ns()))
                    });
                    std::thread::sleep(IDLE_SLEEP.min(left));
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

/// What one slot's turn came to, with how long it took (ns).
#[derive(Debug, Clone, Copy)]
enum Turned {
    NotStarted,
    Progress(u64),
    Idle(u64),
    Removed,
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
        calls,
        inputs_closed,
        ..
    } = slot;
    let now = Instant::now();
    let mut handled = 0usize;
    // Replies to this offcode's own calls first: they change what it will see.
    calls.pump()?;
    // Out-of-band messages next: they are rare and may change behaviour.
    if let Some(oob) = oob.as_ref()
        && let Some(msg) = oob.try_recv()
    {
        let mut cx = RunCx::with_calls(info, outlets, calls, now);
        let answer = offcode.control(&mut cx, &msg)?;
        // A control message's answer goes back to whoever sent it (a gone
        // sender, e.g. a `ctl` request that timed out, is not an error).
        if let (Some(body), OobMessage::Control { from, .. }) = (answer, &msg) {
            let _ = oob.directory().send(
                from,
                OobMessage::Control {
                    from: oob.name().to_string(),
                    body,
                },
            );
        }
    }
    // Back-pressure: take no more input than the reliable outputs can absorb.
    let room = outlets
        .iter_mut()
        .map(Outlet::free)
        .min()
        .unwrap_or(u64::MAX);
    let burst = usize::try_from(room).map_or(BURST, |r| r.min(BURST));
    if burst > 0 {
        for (i, inlet) in inlets.iter_mut().enumerate() {
            if inputs_closed[i] || calls.is_return_input(i) {
                continue;
            }
            let served = calls.served_on(i);
            let mut cx = RunCx::with_calls(info, outlets, calls, now);
            let d = match served {
                Some(spec) => serve_burst(offcode.as_mut(), &mut cx, &spec, inlet, burst)?,
                None => offcode.handle_burst(&mut cx, InputId(i), inlet, burst)?,
            };
            assert!(
                d.messages <= burst,
                "offcode `{}` took {} messages from input {i} in a burst of {burst}",
                info.name,
                d.messages
            );
            handled += d.messages;
            if d.closed {
                inputs_closed[i] = true;
            }
        }
    }
    let mut cx = RunCx::with_calls(info, outlets, calls, now);
    let p = offcode.poll(&mut cx)?;
    cx.flush()?;
    if handled > 0 {
        handle.handled.fetch_add(handled as u64, Ordering::Relaxed);
    }
    // Return ports do not count: a caller's inputs are the ones it handles.
    let mut data_inputs = inputs_closed
        .iter()
        .enumerate()
        .filter(|(i, _)| !calls.is_return_input(*i))
        .map(|(_, c)| *c)
        .peekable();
    let all_inputs_closed = data_inputs.peek().is_some() && data_inputs.all(|c| c);
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
    let how = Finish::new(Some(reason), OffcodeState::Stopped, true);
    finish(app, events, slot, how);
}

/// Calls the instance's `stop` and publishes what it and the last turn left
/// staged, keeping the slot (a parked offcode's ports stay for its restart).
fn stop_instance(app: &str, events: &EventLog, s: &mut Slot) {
    let mut cx = RunCx::with_calls(&s.info, &mut s.outlets, &mut s.calls, Instant::now());
    if let Err(e) = s.offcode.stop(&mut cx) {
        events.emit(
            app,
            &s.info.name,
            EventKind::Failed {
                error: format!("stop: {e}"),
            },
        );
    }
    let _ = cx.flush();
    store_counts(s);
}

/// Builds a fresh instance into a parked slot and initializes it, then
/// queues the "channel available" messages it will read when it starts.
fn renew(s: &mut Slot) -> Result<(), ExecError> {
    let Some(rb) = s.rebuild.clone() else {
        return Err(ExecError::NoRestart(
            s.info.name.clone(),
            "it has no factory here",
        ));
    };
    let spec = BuildSpec {
        params: &s.params,
        kind: s.info.pe_kind,
        module: rb.module.as_deref(),
    };
    let step = |step, source| ExecError::Offcode { step, source };
    s.offcode = (rb.factory)(&spec).map_err(|e| step("build", e))?;
    let mut cx = InitCx::new(&s.info, &s.params, &s.handle.metrics);
    s.offcode
        .initialize(&mut cx)
        .map_err(|e| step("initialize", e))?;
    if let Some(oob) = &s.oob {
        for (channel, port) in &rb.connected {
            let msg = OobMessage::ChannelAvailable {
                channel: channel.clone(),
                port: port.clone(),
            };
            let _ = oob.directory().send(oob.name(), msg);
        }
    }
    Ok(())
}

/// How an offcode ends: the reason logged, the state it ends in, and whether
/// its instance's `stop` is still to be called (not for a parked one, which
/// was stopped when it was parked).
struct Finish {
    reason: Option<String>,
    state: OffcodeState,
    call_stop: bool,
}

impl Finish {
    fn new(reason: Option<String>, state: OffcodeState, call_stop: bool) -> Self {
        Finish {
            reason,
            state,
            call_stop,
        }
    }
}

/// Copies the outlets' (sent, dropped) counters, summed with those of outlets
/// a rewiring replaced, into the handle.
fn store_counts(s: &Slot) {
    let (sent, dropped) = s
        .outlets
        .iter()
        .map(Outlet::counts)
        .fold(s.retired_counts, |a, b| (a.0 + b.0, a.1 + b.1));
    s.handle.sent.store(sent, Ordering::Relaxed);
    s.handle.dropped.store(dropped, Ordering::Relaxed);
}

/// Calls `stop` (unless done already) and drops the slot (closing its
/// channel ends).
fn finish(app: &str, events: &EventLog, mut slot: Box<Slot>, how: Finish) {
    let Finish {
        reason,
        state,
        call_stop,
    } = how;
    if call_stop {
        // What `stop` sent, and what the last turn left staged, is published only now.
        stop_instance(app, events, &mut slot);
    }
    if !slot.handle.state().is_final() || state != OffcodeState::Done {
        let keep_failed = slot.handle.state() == OffcodeState::Failed;
        slot.handle.set_state(if keep_failed {
            OffcodeState::Failed
        } else {
            state
        });
    }
    if let Some(reason) = reason {
        slot.handle.note_reason(&reason);
        events.emit(app, &slot.info.name, EventKind::Stopped { reason });
    }
    let handle = Arc::clone(&slot.handle);
    drop(slot);
    handle.set_exited();
}
