//! `kv-store` and `kv-client`: a pair that shows calls between offcodes
//! (HYDRA §4.1.5, §5.5). The store provides interface `IKeyValue`; the client
//! uses it, putting `keys` numbered entries, reading each back and checking
//! it, asking for a key that is not there (which must fault with
//! [`NOT_FOUND`]) and finally for the count. It calls synchronously (each call
//! waits for its result) or asynchronously (up to `window` calls in flight,
//! watched through PENDING → ACKED → FINISHED), and publishes what it saw.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::Deserialize;
use sidecore_offcode::{
    CallError, CallFault, CallStatus, IncomingCall, InitCx, InterfaceSig, Invocation, MethodSig,
    Metric, Offcode, OffcodeError, PendingCall, Progress, RunCx, encode_result, parse_params,
};
use sidecore_types::ValueType;

/// The interface name both sides are compiled against.
pub const INTERFACE: &str = "IKeyValue";

/// `IKeyValue` as the store serves it and the client calls it.
pub const KV_METHODS: &[MethodSig] = &[
    MethodSig {
        name: "put",
        params: &[ValueType::String, ValueType::String],
        returns: None,
    },
    MethodSig {
        name: "get",
        params: &[ValueType::String],
        returns: Some(ValueType::String),
    },
    MethodSig {
        name: "len",
        params: &[],
        returns: Some(ValueType::U64),
    },
];

/// `IKeyValue`, for the registry.
pub fn kv_interface() -> InterfaceSig {
    InterfaceSig {
        name: INTERFACE,
        methods: KV_METHODS,
    }
}

/// The fault `get` returns for a key that is not stored.
pub const NOT_FOUND: CallFault = CallFault(1);
/// The fault `put` returns when the store holds `capacity` keys already.
pub const STORE_FULL: CallFault = CallFault(2);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreParams {
    /// Most keys held.
    #[serde(default = "default_capacity")]
    capacity: usize,
}

fn default_capacity() -> usize {
    1 << 20
}

/// The store: a hash map behind `IKeyValue`.
pub struct KvStore {
    capacity: usize,
    map: HashMap<String, String>,
    served: Metric,
    keys: Metric,
}

impl KvStore {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: StoreParams = parse_params(params)?;
        if p.capacity == 0 {
            return Err(OffcodeError::Params("`capacity` must be at least 1".into()));
        }
        Ok(KvStore {
            capacity: p.capacity,
            map: HashMap::new(),
            served: Metric::default(),
            keys: Metric::default(),
        })
    }
}

impl Offcode for KvStore {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.served = cx.metric("served");
        self.keys = cx.metric("keys");
        Ok(())
    }

    fn serve(
        &mut self,
        _cx: &mut RunCx<'_>,
        call: &IncomingCall<'_>,
    ) -> Result<Vec<u8>, CallFault> {
        self.served.add(1);
        let out = match call.method {
            "put" => {
                let (k, v): (String, String) = call.decode()?;
                if self.map.len() >= self.capacity && !self.map.contains_key(&k) {
                    return Err(STORE_FULL);
                }
                self.map.insert(k, v);
                self.keys.set(self.map.len() as u64);
                Vec::new()
            }
            "get" => {
                let k: String = call.decode()?;
                encode_result(self.map.get(&k).ok_or(NOT_FOUND)?)?
            }
            "len" => encode_result(&(self.map.len() as u64))?,
            _ => return Err(CallFault::NOT_SERVED),
        };
        Ok(out)
    }
}

/// How the client calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Sync,
    Async,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientParams {
    #[serde(default = "default_keys")]
    keys: u64,
    #[serde(default = "default_mode")]
    mode: Mode,
    /// Calls in flight at once (async).
    #[serde(default = "default_window")]
    window: usize,
    /// How long a synchronous call may wait.
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
}

fn default_keys() -> u64 {
    1000
}
fn default_mode() -> Mode {
    Mode::Async
}
fn default_window() -> usize {
    32
}
fn default_timeout_ms() -> u64 {
    10_000
}

/// One call of the client's script, with what its answer must be.
#[derive(Debug, Clone)]
enum Step {
    Put(u64),
    Get(u64),
    Missing,
    Len(u64),
}

impl Step {
    fn key(i: u64) -> String {
        format!("key-{i}")
    }
    fn value(i: u64) -> String {
        format!("value-{i}-{}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// The client's counters, published as metrics.
#[derive(Default)]
struct Seen {
    calls: Metric,
    ok: Metric,
    mismatches: Metric,
    faults: Metric,
    acked: Metric,
    done: Metric,
}

/// The client: a fixed script of calls, checked reply by reply.
pub struct KvClient {
    keys: u64,
    mode: Mode,
    window: usize,
    timeout: Duration,
    next: usize,
    in_flight: VecDeque<(PendingCall, Step, bool)>,
    seen: Seen,
}

impl KvClient {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: ClientParams = parse_params(params)?;
        if p.window == 0 || p.window > sidecore_offcode::CALLS_IN_FLIGHT {
            return Err(OffcodeError::Params(format!(
                "`window` must be between 1 and {}",
                sidecore_offcode::CALLS_IN_FLIGHT
            )));
        }
        Ok(KvClient {
            keys: p.keys,
            mode: p.mode,
            window: p.window,
            timeout: Duration::from_millis(p.timeout_ms),
            next: 0,
            in_flight: VecDeque::new(),
            seen: Seen::default(),
        })
    }

    /// Step `n` of the script: every put, every get, the missing key, the count.
    fn step(&self, n: usize) -> Option<Step> {
        let (n, k) = (n as u64, self.keys);
        Some(match n {
            n if n < k => Step::Put(n),
            n if n < 2 * k => Step::Get(n - k),
            n if n == 2 * k => Step::Missing,
            n if n == 2 * k + 1 => Step::Len(k),
            _ => return None,
        })
    }

    /// Issues `step` without waiting.
    fn issue(cx: &mut RunCx<'_>, step: &Step) -> Result<PendingCall, CallError> {
        let inv = Invocation::Extended;
        match step {
            Step::Put(i) => cx.call(INTERFACE, "put", &(Step::key(*i), Step::value(*i)), inv),
            Step::Get(i) => cx.call(INTERFACE, "get", &Step::key(*i), inv),
            Step::Missing => cx.call(INTERFACE, "get", &"no-such-key", inv),
            Step::Len(_) => cx.call(INTERFACE, "len", &(), inv),
        }
    }

    /// Checks an answer against the script.
    fn check(
        &self,
        step: &Step,
        answer: Result<Option<Answer>, CallError>,
    ) -> Result<(), OffcodeError> {
        let good = match (step, answer) {
            (Step::Put(_), Ok(_)) => true,
            (Step::Get(i), Ok(Some(Answer::Text(v)))) => v == Step::value(*i),
            (Step::Len(n), Ok(Some(Answer::Count(c)))) => c == *n,
            (Step::Missing, Err(CallError::Failed(code))) => {
                self.seen.faults.add(1);
                code == NOT_FOUND.0
            }
            (_, Err(CallError::Failed(_))) => {
                self.seen.faults.add(1);
                false
            }
            (_, Err(e)) => return Err(e.into()),
            _ => false,
        };
        if good {
            self.seen.ok.add(1);
        } else {
            self.seen.mismatches.add(1);
        }
        Ok(())
    }

    fn run_sync(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let Some(step) = self.step(self.next) else {
            return Ok(Progress::Done);
        };
        self.next += 1;
        self.seen.calls.add(1);
        let t = self.timeout;
        let answer = match &step {
            Step::Put(i) => cx
                .call_wait::<_, ()>(INTERFACE, "put", &(Step::key(*i), Step::value(*i)), t)
                .map(|()| None),
            Step::Get(i) => cx
                .call_wait::<_, String>(INTERFACE, "get", &Step::key(*i), t)
                .map(|v| Some(Answer::Text(v))),
            Step::Missing => cx
                .call_wait::<_, String>(INTERFACE, "get", &"no-such-key", t)
                .map(|v| Some(Answer::Text(v))),
            Step::Len(_) => cx
                .call_wait::<_, u64>(INTERFACE, "len", &(), t)
                .map(|v| Some(Answer::Count(v))),
        };
        self.check(&step, answer)?;
        Ok(Progress::Busy)
    }

    fn run_async(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        while self.in_flight.len() < self.window {
            let Some(step) = self.step(self.next) else {
                break;
            };
            match Self::issue(cx, &step) {
                Ok(p) => {
                    self.next += 1;
                    self.seen.calls.add(1);
                    self.in_flight.push_back((p, step, false));
                }
                Err(CallError::ChannelFull | CallError::TableFull(_)) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // Answers in the order the calls went out (one channel keeps order).
        while let Some((call, step, acked)) = self.in_flight.front_mut() {
            if !*acked && cx.call_status(call)? == CallStatus::Acked {
                *acked = true;
                self.seen.acked.add(1);
            }
            let answer = match step {
                Step::Put(_) => cx
                    .call_result::<()>(INTERFACE, call)
                    .map(|o| o.map(|()| None)),
                Step::Get(_) | Step::Missing => cx
                    .call_result::<String>(INTERFACE, call)
                    .map(|o| o.map(|v| Some(Answer::Text(v)))),
                Step::Len(_) => cx
                    .call_result::<u64>(INTERFACE, call)
                    .map(|o| o.map(|v| Some(Answer::Count(v)))),
            };
            let answer = match answer {
                Ok(None) => break,
                Ok(Some(a)) => Ok(a),
                Err(e) => Err(e),
            };
            let (_, step, _) = self.in_flight.pop_front().expect("front exists");
            self.check(&step, answer)?;
        }
        if self.in_flight.is_empty() && self.step(self.next).is_none() {
            return Ok(Progress::Done);
        }
        Ok(Progress::Busy)
    }
}

/// A decoded answer.
enum Answer {
    Text(String),
    Count(u64),
}

impl Offcode for KvClient {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.seen = Seen {
            calls: cx.metric("calls"),
            ok: cx.metric("ok"),
            mismatches: cx.metric("mismatches"),
            faults: cx.metric("faults"),
            acked: cx.metric("acked"),
            done: cx.metric("done"),
        };
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let p = match self.mode {
            Mode::Sync => self.run_sync(cx)?,
            Mode::Async => self.run_async(cx)?,
        };
        if p == Progress::Done {
            self.seen.done.set(1);
        }
        Ok(p)
    }
}
