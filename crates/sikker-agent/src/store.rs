//! Where a running agent's policy and placement come from, and how their
//! changes reach it (issue 15, "NOS state"): files on this node (the embedded
//! one-node store, the default) or keys in etcd shared by every node's agent
//! (`/sidecore/sikker/policy` and `/sidecore/sikker/placement` by default).
//!
//! [`watch_doc`] runs a thread that sends the document it finds first and then
//! every change, each text read by the document's [`DocKind`]: the policy is
//! parsed there ([`POLICY`]); a placement is handed on as located text
//! ([`PLACEMENT`]) because it is checked against the policy in force, which
//! only the agent knows. A text that does not parse is sent as
//! [`Update::Invalid`] with every error located (`policy.toml:12:5: …`, or
//! `etcd:/sidecore/sikker/policy:12:5: …`), and the agent keeps the last good
//! document. A source that cannot be read (a missing file, an etcd that went
//! away) is reported once ([`Update::Unavailable`]); the thread retries, with
//! backoff for etcd, reports [`Update::Restored`] when the source is back,
//! reads it again and watches on. An etcd key that holds nothing is
//! [`Update::Missing`]. The thread ends at the first update after its
//! receiver has gone.
//!
//! - **File**: polled every [`FILE_POLL`]; a changed text is read again until
//!   two reads agree, so a file caught half-written is not reported as broken.
//! - **etcd** (v3, as Debian's `etcd-server` 3.4 ships it): through its
//!   JSON gateway over HTTP — `/v3/kv/range` to read, `/v3/kv/put` to write,
//!   and a streaming `/v3/watch` from the revision after the one read, keys
//!   and values in base64. The client is `ureq` (small, blocking, no async
//!   runtime); not the `etcd-client` crate, which speaks gRPC through
//!   tonic/prost and needs `protoc` at build time. `https://` endpoints are
//!   reached over TLS with the authority and client certificate of an
//!   [`EtcdTls`] (rustls), and etcd's own user/password authentication is
//!   spoken when an [`EtcdAuth`] is given (a token per client, traded again
//!   when etcd forgets it).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sidecore_sikker_policy::{Policy, parse_policy};

mod auth;
mod tls;
pub use auth::{EtcdAuth, PasswordFileError};
pub use tls::{EtcdTls, TlsFileError};

/// How to reach an etcd: TLS for `https://` endpoints, and a user when it
/// has authentication on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    pub tls: Option<EtcdTls>,
    pub auth: Option<EtcdAuth>,
}

/// How often a watched file is looked at.
pub const FILE_POLL: Duration = Duration::from_millis(200);
/// The etcd key agents read their policy from unless told otherwise.
pub const DEFAULT_ETCD_KEY: &str = "/sidecore/sikker/policy";
/// The etcd key agents read their placement from unless told otherwise.
pub const DEFAULT_ETCD_PLACEMENT_KEY: &str = "/sidecore/sikker/placement";
/// First and longest wait between attempts to reach etcd again.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Connecting to etcd, and a whole read or write, may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a document (the policy, the placement) is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A TOML file on this node.
    File(PathBuf),
    /// A key in etcd; endpoints as `http://HOST:PORT` (or `HOST:PORT`),
    /// or `https://HOST:PORT` with `tls`.
    Etcd {
        /// Client URLs, tried in turn.
        endpoints: Vec<String>,
        /// The key holding the document's TOML text.
        key: String,
        /// TLS and the user, if any.
        access: EtcdAccess,
    },
}

/// The policy's source (the name it had before placements were watched too).
pub type PolicySource = Source;

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Etcd { endpoints, key, .. } => {
                write!(f, "etcd key {key} at {}", endpoints.join(","))
            }
        }
    }
}

/// What a watched source says.
#[derive(Clone, Debug, PartialEq)]
pub enum Update<T> {
    /// A document that was read, from `source` (a path, or an etcd key).
    Doc { source: String, doc: T },
    /// A text that did not parse: every error, one per line, located.
    Invalid { source: String, errors: String },
    /// The etcd key holds nothing (there is no such key, or it was deleted).
    Missing { source: String },
    /// The source cannot be read (said once per outage).
    Unavailable { source: String, why: String },
    /// The source can be read again; its text follows if it changed.
    Restored { source: String },
}

/// What the policy's source says.
pub type PolicyUpdate = Update<Policy>;
/// What the placement's source says.
pub type PlacementUpdate = Update<Text>;

/// A document's text and the name its errors are located by (a path, or
/// `etcd:KEY`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text {
    pub name: String,
    pub text: String,
}

/// A kind of document: what it is called in messages, and how its text is
/// read (`name` locates the errors; `Err` holds them, one per line).
pub struct DocKind<T> {
    pub what: &'static str,
    pub parse: fn(name: &str, text: &str) -> Result<T, String>,
}

/// The policy, parsed as it is read.
pub const POLICY: DocKind<Policy> = DocKind {
    what: "policy",
    parse: |name, text| parse_policy(name, text).map_err(|e| e.to_string()),
};

/// The placement, handed on as text: it is parsed against the policy in force.
pub const PLACEMENT: DocKind<Text> = DocKind {
    what: "placement",
    parse: |name, text| {
        Ok(Text {
            name: name.to_string(),
            text: text.to_string(),
        })
    },
};

/// Why etcd did not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("etcd {0}")]
pub struct EtcdError(String);

/// Reads a text as `kind`, naming `name` in every error.
fn parsed<T>(kind: &DocKind<T>, name: &str, source: String, text: &str) -> Update<T> {
    match (kind.parse)(name, text) {
        Ok(doc) => Update::Doc { source, doc },
        Err(errors) => Update::Invalid { source, errors },
    }
}

/// Starts watching `src` for the policy: the one there now and every change
/// go to `tx`.
pub fn watch(src: Source, tx: Sender<PolicyUpdate>) -> JoinHandle<()> {
    watch_doc(src, POLICY, tx)
}

/// Starts watching `src` for a document of `kind`: the one there now and
/// every change go to `tx`.
pub fn watch_doc<T: Send + 'static>(
    src: Source,
    kind: DocKind<T>,
    tx: Sender<Update<T>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || match src {
        Source::File(path) => watch_file(&path, &kind, &tx),
        Source::Etcd {
            endpoints,
            key,
            access,
        } => EtcdWatch::new(&endpoints, &access, key, kind, tx).run(),
    })
}

/// Why a watched file's text could not be had.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// The file is unavailable (for now, perhaps).
    #[error("{0}")]
    Io(std::io::Error),
    /// The file is there but its text is invalid.
    #[error("not UTF-8 text")]
    NotUtf8,
}

/// A file's text, once two reads a moment apart agree (a writer may be
/// half-way through); `Err` says why it cannot be read.
fn read_settled(path: &std::path::Path, last: Option<&str>) -> Result<String, ReadError> {
    let read = || {
        let bytes = std::fs::read(path).map_err(ReadError::Io)?;
        String::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)
    };
    let mut text = read()?;
    if Some(text.as_str()) == last {
        return Ok(text);
    }
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(30));
        let again = read()?;
        if again == text {
            break;
        }
        text = again;
    }
    Ok(text)
}

fn watch_file<T>(path: &std::path::Path, kind: &DocKind<T>, tx: &Sender<Update<T>>) {
    let name = path.display().to_string();
    let mut last: Option<String> = None;
    let mut down = false;
    loop {
        let update = match read_settled(path, last.as_deref()) {
            Ok(text) => {
                if down {
                    down = false;
                    let back = Update::Restored {
                        source: name.clone(),
                    };
                    if tx.send(back).is_err() {
                        return;
                    }
                }
                (last.as_deref() != Some(text.as_str())).then(|| {
                    let u = parsed(kind, &name, name.clone(), &text);
                    last = Some(text);
                    u
                })
            }
            Err(why @ ReadError::NotUtf8) => {
                last = None;
                Some(Update::Invalid {
                    source: name.clone(),
                    errors: format!("{name}: {why}"),
                })
            }
            Err(why @ ReadError::Io(_)) => (!down).then(|| {
                down = true;
                Update::Unavailable {
                    source: name.clone(),
                    why: why.to_string(),
                }
            }),
        };
        if let Some(u) = update
            && tx.send(u).is_err()
        {
            return;
        }
        std::thread::sleep(FILE_POLL);
    }
}

/// A key's value and the store's revision when it was read.
struct Read {
    value: Option<Vec<u8>>,
    revision: i64,
}

/// A small etcd v3 client over its JSON gateway.
pub struct Etcd {
    endpoints: Vec<String>,
    /// Reads and writes: bounded in time.
    short: ureq::Agent,
    /// The watch stream: no bound on the whole exchange.
    long: ureq::Agent,
    /// The endpoint that answered last, tried first.
    good: usize,
    /// The user, when etcd has authentication on, and its token once traded.
    auth: Option<EtcdAuth>,
    token: Option<String>,
}

fn agent(whole: Option<Duration>, tls: Option<&EtcdTls>) -> ureq::Agent {
    let cfg = ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(whole)
        .http_status_as_error(false);
    let cfg = cfg.tls_config(tls.map_or_else(tls::trust_nothing, EtcdTls::config));
    ureq::Agent::new_with_config(cfg.build())
}

/// An `int64` as etcd's JSON gateway writes it (a string), or 0.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_i64().unwrap_or(0),
    }
}

impl Etcd {
    /// A client for these endpoints (`HOST:PORT` gets `http://`).
    pub fn new(endpoints: &[String]) -> Etcd {
        Self::with_tls(endpoints, None)
    }

    /// A client for these endpoints, `https://` ones reached with `tls`.
    pub fn with_tls(endpoints: &[String], tls: Option<&EtcdTls>) -> Etcd {
        let endpoints = endpoints
            .iter()
            .map(|e| {
                let e = e.trim().trim_end_matches('/');
                if e.contains("://") {
                    e.to_string()
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        Etcd {
            endpoints,
            short: agent(Some(REQUEST_TIMEOUT), tls),
            long: agent(None, tls),
            good: 0,
            auth: None,
            token: None,
        }
    }

    /// A client for these endpoints, reached as `access` says.
    pub fn with_access(endpoints: &[String], access: &EtcdAccess) -> Etcd {
        let mut e = Self::with_tls(endpoints, access.tls.as_ref());
        e.set_auth(access.auth.clone());
        e
    }

    /// Acts as `auth`'s user from the next request on (`None`: as nobody).
    pub fn set_auth(&mut self, auth: Option<EtcdAuth>) {
        self.auth = auth;
        self.token = None;
    }

    /// POSTs `body` to `path` on the first endpoint that answers; the
    /// response, or every endpoint's failure.
    fn post(
        &mut self,
        path: &str,
        body: &Value,
        stream: bool,
    ) -> Result<ureq::http::Response<ureq::Body>, EtcdError> {
        if self.endpoints.is_empty() {
            return Err(EtcdError("has no endpoint".into()));
        }
        let mut why = Vec::new();
        let n = self.endpoints.len();
        for i in 0..n {
            let at = (self.good + i) % n;
            let base = self.endpoints[at].clone();
            match self.attempt(&base, path, body, stream) {
                Ok(r) => {
                    self.good = at;
                    return Ok(r);
                }
                Err(w) => why.push(w),
            }
        }
        Err(EtcdError(format!("unreachable: {}", why.join("; "))))
    }

    /// One endpoint's answer to `body` at `path`, as this client's user
    /// (its token traded first, and once more if etcd has forgotten it).
    fn attempt(
        &mut self,
        base: &str,
        path: &str,
        body: &Value,
        stream: bool,
    ) -> Result<ureq::http::Response<ureq::Body>, String> {
        let url = format!("{base}{path}");
        for retry in [false, true] {
            if let Some(a) = &self.auth
                && self.token.is_none()
            {
                let token = self.authenticate(base, a)?;
                self.token = Some(token);
            }
            let agent = if stream { &self.long } else { &self.short };
            let mut req = agent.post(&url);
            if let Some(t) = &self.token {
                req = req.header("Authorization", t);
            }
            let mut r = req
                .send(body.to_string().as_bytes())
                .map_err(|e| format!("{url}: {e}"))?;
            if r.status().is_success() {
                return Ok(r);
            }
            let text = r.body_mut().read_to_string().unwrap_or_default();
            if !retry && self.auth.is_some() && auth::token_refused(r.status().as_u16(), &text) {
                self.token = None;
                continue;
            }
            return Err(format!(
                "{url}: HTTP {}: {}{}",
                r.status(),
                text.trim(),
                auth::hint(&text, self.auth.as_ref())
            ));
        }
        Err(format!("{url}: etcd refused the token it had just issued"))
    }

    fn call(&mut self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let mut r = self.post(path, body, false)?;
        let text = r
            .body_mut()
            .read_to_string()
            .map_err(|e| EtcdError(format!("{path}: reading the answer: {e}")))?;
        serde_json::from_str(&text)
            .map_err(|e| EtcdError(format!("{path}: the answer is not JSON ({e}): {text}")))
    }

    /// Stores `value` at `key`; the store's new revision.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<i64, EtcdError> {
        let v = self.call(
            "/v3/kv/put",
            &json!({"key": B64.encode(key), "value": B64.encode(value)}),
        )?;
        Ok(int(&v["header"]["revision"]))
    }

    fn get(&mut self, key: &str) -> Result<Read, EtcdError> {
        let v = self.call("/v3/kv/range", &json!({"key": B64.encode(key)}))?;
        let value = match v["kvs"].get(0) {
            None => None,
            Some(kv) => Some(decode(&kv["value"], key)?),
        };
        Ok(Read {
            value,
            revision: int(&v["header"]["revision"]),
        })
    }

    /// The value at `key` (`None`: no such key).
    pub fn get_value(&mut self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        self.get(key).map(|r| r.value)
    }

    /// Watches `key` from revision `from`, calling `event` with each new
    /// value (`None`: deleted) until it says stop (`Ok(true)`), the stream
    /// is cancelled by etcd (`Ok(false)`: read the key again and watch
    /// anew), or it fails.
    fn watch(
        &mut self,
        key: &str,
        from: i64,
        mut event: impl FnMut(Option<Vec<u8>>) -> bool,
    ) -> Result<bool, EtcdError> {
        let body = json!({"create_request": {"key": B64.encode(key), "start_revision": from}});
        let r = self.post("/v3/watch", &body, true)?;
        let lines = BufReader::new(r.into_body().into_reader()).lines();
        for line in lines {
            let line = line.map_err(|e| EtcdError(format!("watch stream broke: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| EtcdError(format!("watch: not JSON ({e}): {line}")))?;
            if !v["error"].is_null() {
                return Err(EtcdError(format!("watch failed: {}", v["error"])));
            }
            let res = &v["result"];
            if res["canceled"].as_bool() == Some(true) {
                return Ok(false);
            }
            for ev in res["events"].as_array().into_iter().flatten() {
                let value = if ev["type"].as_str() == Some("DELETE") {
                    None
                } else {
                    Some(decode(&ev["kv"]["value"], key)?)
                };
                if event(value) {
                    return Ok(true);
                }
            }
        }
        Err(EtcdError("closed the watch stream".into()))
    }
}

impl Etcd {
    /// Trades the user and password for a token at `base` (an endpoint URL).
    pub(super) fn authenticate(&self, base: &str, auth: &EtcdAuth) -> Result<String, String> {
        let url = format!("{base}/v3/auth/authenticate");
        let body = json!({"name": auth.user, "password": auth.password}).to_string();
        let mut r = self
            .short
            .post(&url)
            .send(body.as_bytes())
            .map_err(|e| format!("{url}: {e}"))?;
        let text = r.body_mut().read_to_string().unwrap_or_default();
        if !r.status().is_success() {
            return Err(format!(
                "{url}: authentication as user `{}` failed: HTTP {}: {}",
                auth.user,
                r.status(),
                text.trim()
            ));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))?;
        v["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("{url}: authenticated, but no token came back: {text}"))
    }

    /// Creates user `root` with `password`, gives it the root role and turns
    /// authentication on (what `etcdctl user add root`, `user grant-role root
    /// root` and `auth enable` do). This client then acts as root.
    pub fn enable_auth(&mut self, password: &str) -> Result<(), EtcdError> {
        self.call(
            "/v3/auth/user/add",
            &json!({"name": "root", "password": password}),
        )?;
        self.call(
            "/v3/auth/user/grant",
            &json!({"user": "root", "role": "root"}),
        )?;
        self.call("/v3/auth/enable", &json!({}))?;
        self.set_auth(Some(EtcdAuth::new("root", password)));
        Ok(())
    }

    /// Adds `user` with `password` and a role of its own that may read
    /// (or, with `write`, also write) the keys under `prefix`.
    pub fn add_user(
        &mut self,
        user: &str,
        password: &str,
        prefix: &str,
        write: bool,
    ) -> Result<(), EtcdError> {
        let role = format!("{user}-role");
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        self.call("/v3/auth/role/add", &json!({"name": role}))?;
        self.call(
            "/v3/auth/role/grant",
            &json!({"name": role, "perm": {
                "permType": if write { "READWRITE" } else { "READ" },
                "key": B64.encode(prefix),
                "range_end": B64.encode(end),
            }}),
        )?;
        self.call(
            "/v3/auth/user/add",
            &json!({"name": user, "password": password}),
        )?;
        self.call("/v3/auth/user/grant", &json!({"user": user, "role": role}))?;
        Ok(())
    }
}

fn decode(v: &Value, key: &str) -> Result<Vec<u8>, EtcdError> {
    // An empty value is left out of the JSON.
    B64.decode(v.as_str().unwrap_or(""))
        .map_err(|e| EtcdError(format!("key {key}: the value is not base64: {e}")))
}

/// Stores a text (a policy, a placement) at `key` in the etcd at
/// `endpoints`, reached as `access` says; the revision.
pub fn put(
    endpoints: &[String],
    access: &EtcdAccess,
    key: &str,
    text: &str,
) -> Result<i64, EtcdError> {
    Etcd::with_access(endpoints, access).put(key, text.as_bytes())
}

/// What the watching thread tells its receiver about an etcd key.
struct Sink<T> {
    key: String,
    source: String,
    kind: DocKind<T>,
    tx: Sender<Update<T>>,
    /// The value last sent (`Some(None)`: that there is none).
    last: Option<Option<Vec<u8>>>,
    down: bool,
}

impl<T> Sink<T> {
    /// Sends what `value` comes to, unless it was sent last; false when the
    /// receiver has gone.
    fn offer(&mut self, value: Option<Vec<u8>>) -> bool {
        if self.last.as_ref() == Some(&value) {
            return true;
        }
        let source = self.source.clone();
        let u = match &value {
            None => Update::Missing { source },
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => parsed(&self.kind, &format!("etcd:{}", self.key), source, text),
                Err(_) => Update::Invalid {
                    errors: format!("{source}: the value is not UTF-8 text"),
                    source,
                },
            },
        };
        self.last = Some(value);
        self.tx.send(u).is_ok()
    }

    /// Reports an outage, once; false when the receiver has gone.
    fn down(&mut self, e: &EtcdError) -> bool {
        if self.down {
            return true;
        }
        self.down = true;
        self.tx
            .send(Update::Unavailable {
                source: self.source.clone(),
                why: format!(
                    "{e}; retrying, the last good {} stays in force",
                    self.kind.what
                ),
            })
            .is_ok()
    }

    /// Reports the end of an outage; false when the receiver has gone.
    fn up(&mut self) -> bool {
        if !self.down {
            return true;
        }
        self.down = false;
        self.tx
            .send(Update::Restored {
                source: self.source.clone(),
            })
            .is_ok()
    }
}

/// The watching thread for an etcd key.
struct EtcdWatch<T> {
    etcd: Etcd,
    sink: Sink<T>,
}

impl<T> EtcdWatch<T> {
    fn new(
        endpoints: &[String],
        access: &EtcdAccess,
        key: String,
        kind: DocKind<T>,
        tx: Sender<Update<T>>,
    ) -> EtcdWatch<T> {
        let etcd = Etcd::with_access(endpoints, access);
        let source = format!("etcd key {key} at {}", etcd.endpoints.join(","));
        EtcdWatch {
            etcd,
            sink: Sink {
                key,
                source,
                kind,
                tx,
                last: None,
                down: false,
            },
        }
    }

    fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.round() {
                Ok(false) => return,
                Ok(true) => backoff = BACKOFF_MIN,
                Err(e) => {
                    if !self.sink.down(&e) {
                        return;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Reads the key, sends it if it changed, and watches it from the next
    /// revision. `Ok(false)`: the receiver has gone; `Ok(true)`: etcd
    /// cancelled the watch (read again); `Err`: etcd cannot be reached or the
    /// stream broke.
    fn round(&mut self) -> Result<bool, EtcdError> {
        let read = self.etcd.get(&self.sink.key)?;
        if !self.sink.up() || !self.sink.offer(read.value) {
            return Ok(false);
        }
        let key = self.sink.key.clone();
        let mut gone = false;
        let sink = &mut self.sink;
        self.etcd.watch(&key, read.revision + 1, |value| {
            gone = !sink.offer(value);
            gone
        })?;
        Ok(!gone)
    }
}

/// A one-member etcd on loopback or a given address (Debian's `/usr/bin/etcd`, or `$ETCD`), for
/// tests and demonstrations: its own data directory and free ports; killed
/// when dropped. It can be stopped and started again on the same ports and
/// data, as an etcd that goes away and comes back.
pub struct LocalEtcd {
    dir: PathBuf,
    /// The address it listens on (loopback unless started with [`LocalEtcd::start_on`]).
    ip: std::net::IpAddr,
    client: u16,
    peer: u16,
    child: Option<std::process::Child>,
    /// Serving clients over TLS ([`LocalEtcd::start_tls`]).
    tls: Option<LocalTls>,
}

/// The TLS side of a [`LocalEtcd`]: its server certificate and key, the
/// authority its clients' certificates must chain to, and the client
/// configuration it probes itself with.
struct LocalTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    probe: EtcdTls,
}

/// Why a [`LocalEtcd`] could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    #[error("no free loopback port: {0}")]
    NoPort(#[source] std::io::Error),
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Log(#[source] std::io::Error),
    #[error(
        "cannot start {} ({source}); scripts/setup.sh installs Debian's etcd-server",
        bin.display()
    )]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("etcd exited ({status}) before answering; see {}", log.display())]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("etcd did not answer at {endpoint} within 15 s; see {}", log.display())]
    Silent { endpoint: String, log: PathBuf },
}

/// A port free on `ip` right now.
fn free_port(ip: std::net::IpAddr) -> Result<u16, LocalEtcdError> {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(LocalEtcdError::NoPort)
}

impl LocalEtcd {
    /// Starts one on loopback with its data in `dir` (created), and waits
    /// until it answers.
    pub fn start(dir: &std::path::Path) -> Result<LocalEtcd, LocalEtcdError> {
        Self::start_on(dir, std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// Starts one listening on `ip` (an address of this network namespace,
    /// for agents in other namespaces to reach), and waits until it answers.
    pub fn start_on(
        dir: &std::path::Path,
        ip: std::net::IpAddr,
    ) -> Result<LocalEtcd, LocalEtcdError> {
        Self::start_with(dir, ip, None)
    }

    /// Starts one on `ip` that serves clients only over TLS with `cert` and
    /// `key`, demands a client certificate chaining to `ca`
    /// (`--client-cert-auth`), and answers `probe` (a client configuration
    /// it accepts) within 15 s.
    pub fn start_tls(
        dir: &std::path::Path,
        ip: std::net::IpAddr,
        (cert, key): (&std::path::Path, &std::path::Path),
        ca: &std::path::Path,
        probe: EtcdTls,
    ) -> Result<LocalEtcd, LocalEtcdError> {
        let tls = LocalTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            ca: ca.to_path_buf(),
            probe,
        };
        Self::start_with(dir, ip, Some(tls))
    }

    fn start_with(
        dir: &std::path::Path,
        ip: std::net::IpAddr,
        tls: Option<LocalTls>,
    ) -> Result<LocalEtcd, LocalEtcdError> {
        std::fs::create_dir_all(dir).map_err(|source| LocalEtcdError::File {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut e = LocalEtcd {
            dir: dir.to_path_buf(),
            ip,
            client: free_port(ip)?,
            peer: free_port(ip)?,
            child: None,
            tls,
        };
        e.restart()?;
        Ok(e)
    }

    /// Its client URL (`https://` when it serves TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!(
            "{scheme}://{}",
            std::net::SocketAddr::new(self.ip, self.client)
        )
    }

    /// Kills it (its data stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same ports and data, and waits until it answers.
    pub fn restart(&mut self) -> Result<(), LocalEtcdError> {
        self.stop();
        let bin = std::env::var_os("ETCD").unwrap_or_else(|| "etcd".into());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .map_err(|source| LocalEtcdError::File {
                path: self.dir.join("etcd.log"),
                source,
            })?;
        let log2 = log.try_clone().map_err(LocalEtcdError::Log)?;
        let peer = format!("http://{}", std::net::SocketAddr::new(self.ip, self.peer));
        let mut cmd = std::process::Command::new(&bin);
        if let Some(t) = &self.tls {
            cmd.arg(format!("--cert-file={}", t.cert.display()))
                .arg(format!("--key-file={}", t.key.display()))
                .arg(format!("--trusted-ca-file={}", t.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name=default")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={}", self.endpoint()))
            .arg(format!("--advertise-client-urls={}", self.endpoint()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|source| LocalEtcdError::Spawn {
                bin: PathBuf::from(&bin),
                source,
            })?;
        self.child = Some(child);
        let mut probe = Etcd::with_tls(&[self.endpoint()], self.tls.as_ref().map(|t| &t.probe));
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            match probe.get_value("/sidecore/probe") {
                // Answered; with authentication on, a refusal is an answer too.
                Ok(_) => return Ok(()),
                Err(e) if auth::wants_user(&e.0) => return Ok(()),
                Err(_) => {}
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(std::process::Child::try_wait) {
                self.child = None;
                return Err(LocalEtcdError::Exited {
                    status: st,
                    log: self.dir.join("etcd.log"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Err(LocalEtcdError::Silent {
            endpoint: self.endpoint(),
            log: self.dir.join("etcd.log"),
        })
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
