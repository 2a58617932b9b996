//! `loader:kernel`: an offcode from a user's own BPF object. A manifest
//! offcode with a `kernel` target and `module = "x.bpf.o"` is built by this
//! loader: the object is loaded through aya when the offcode initializes,
//! its programs attached as `params.attach` says, and its maps become the
//! offcode's channels and settings:
//!
//! * a **ring buffer** map becomes an output channel: every record the
//!   programs submit is sent, as it is, on the output port of the same name
//!   (or the port `rings` maps it to);
//! * **array and hash maps** are configuration: `params.maps` writes entries
//!   when the offcode initializes, and a control message
//!   `{"maps": {"config": {"0": 5001}}}` writes them while it runs;
//! * **arrays of u64** named in `counters` are read back as metrics
//!   `MAP_INDEX` (per-CPU arrays summed).
//!
//! ```toml
//! params = { netns = "sidecore-middlebox",
//!            attach = [ { program = "udp_count", xdp = "to-client" },
//!                       { program = "egress_count", tc = "to-server", direction = "egress" } ],
//!            maps = { config = { "0" = 5001 } }, counters = ["counts"] }
//! ```
//!
//! A key is an integer (decimal or `0x` hex, as TOML keys are strings); a
//! value an integer or an array of bytes. Integers are written in the
//! machine's byte order into the map's key or value size (1 to 8 bytes);
//! larger keys and values take byte arrays of exactly their size.
//! `down` detaches every program (the links are the process's: a crash
//! detaches them too).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_channel::oob::OobMessage;
use sidecore_kernel::{Hook, RingReader, UserObject, XdpMode};
use sidecore_offcode::{
    BuildSpec, Implementation, InitCx, Interfaces, Metric, Offcode, OffcodeError, OutputId,
    Progress, Registry, RunCx, parse_params,
};
use sidecore_types::PeKind;

use crate::util::bad;

/// Ring buffer records sent per turn at most (the rest wait for the next).
const MAX_RECORDS_PER_TURN: usize = 1024;
/// How often counters are read from their maps.
const COUNTERS_EVERY: Duration = Duration::from_millis(100);

/// Where one program goes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachSpec {
    /// The program's name in the object.
    pub program: String,
    /// XDP on this interface...
    #[serde(default)]
    pub xdp: Option<String>,
    /// ... or tc on this one,
    #[serde(default)]
    pub tc: Option<String>,
    /// `ingress` (the default) or `egress` (tc only).
    #[serde(default)]
    pub direction: Option<String>,
    /// XDP mode: `auto`, `generic` or `native`.
    #[serde(default)]
    pub mode: Option<String>,
}

impl AttachSpec {
    fn hook(&self, at: usize) -> Result<Hook, OffcodeError> {
        let field = format!("attach[{at}]");
        match (&self.xdp, &self.tc) {
            (Some(iface), None) => {
                if self.direction.is_some() {
                    return Err(bad(&field, "`direction` is for tc; XDP sees ingress only"));
                }
                let mode = self
                    .mode
                    .as_deref()
                    .map_or(Ok(XdpMode::Auto), str::parse)
                    .map_err(|e| bad(&field, e))?;
                Ok(Hook::Xdp {
                    iface: iface.clone(),
                    mode,
                })
            }
            (None, Some(iface)) => {
                if self.mode.is_some() {
                    return Err(bad(&field, "`mode` is for XDP"));
                }
                let egress = match self.direction.as_deref() {
                    None | Some("ingress") => false,
                    Some("egress") => true,
                    Some(d) => {
                        return Err(bad(
                            &field,
                            format!("direction `{d}` is neither `ingress` nor `egress`"),
                        ));
                    }
                };
                Ok(Hook::Tc {
                    iface: iface.clone(),
                    egress,
                })
            }
            _ => Err(bad(
                &field,
                format!(
                    "program `{}`: give exactly one of `xdp = \"IFACE\"` or `tc = \"IFACE\"`",
                    self.program
                ),
            )),
        }
    }
}

/// The loader's parameters.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The network namespace of the interfaces.
    #[serde(default)]
    pub netns: Option<String>,
    #[serde(default)]
    pub attach: Vec<AttachSpec>,
    /// Entries to write: map → key → value.
    #[serde(default)]
    pub maps: BTreeMap<String, toml::Table>,
    /// Arrays of u64 published as metrics.
    #[serde(default)]
    pub counters: Vec<String>,
    /// Output port → ring buffer map (default: the map named like the port).
    #[serde(default)]
    pub rings: BTreeMap<String, String>,
}

impl Params {
    /// Reads and checks the parameters (the object is not read here).
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        for (i, a) in p.attach.iter().enumerate() {
            a.hook(i)?;
        }
        for (map, entries) in &p.maps {
            for (k, v) in entries {
                key_number(k).map_err(|e| bad(&format!("maps.{map}"), e))?;
                Value::from_toml(v).map_err(|e| bad(&format!("maps.{map}.{k}"), e))?;
            }
        }
        Ok(p)
    }
}

/// A value to write into a map.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Int(u64),
    Bytes(Vec<u8>),
}

/// Why a map key or value from the parameters or a control message was
/// refused (the caller names the field).
#[derive(Debug, thiserror::Error)]
enum BadValue {
    #[error("{0} is negative")]
    Negative(i64),
    #[error("{0} is not a byte (0..=255)")]
    NotByte(toml::Value),
    #[error("{0} is neither an integer nor an array of bytes")]
    Kind(toml::Value),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("the map's field is {0} bytes: give an array of {0} bytes")]
    WideField(usize),
    #[error("{n} does not fit in {size} bytes")]
    TooBig { n: u64, size: usize },
    #[error("{given} bytes given for a {size}-byte field")]
    Length { given: usize, size: usize },
    #[error("key `{0}` is not an integer (decimal or 0x hex)")]
    Key(String),
}

impl Value {
    fn from_toml(v: &toml::Value) -> Result<Value, BadValue> {
        match v {
            toml::Value::Integer(i) => u64::try_from(*i)
                .map(Value::Int)
                .map_err(|_| BadValue::Negative(*i)),
            toml::Value::Array(a) => a
                .iter()
                .map(|b| {
                    b.as_integer()
                        .and_then(|b| u8::try_from(b).ok())
                        .ok_or_else(|| BadValue::NotByte(b.clone()))
                })
                .collect::<Result<Vec<u8>, _>>()
                .map(Value::Bytes),
            other => Err(BadValue::Kind(other.clone())),
        }
    }

    fn from_json(v: &serde_json::Value) -> Result<Value, BadValue> {
        let t: toml::Value = serde_json::from_value(v.clone())?;
        Value::from_toml(&t)
    }

    /// The value's bytes for a field of `size` bytes.
    fn encode(&self, size: usize) -> Result<Vec<u8>, BadValue> {
        match self {
            Value::Int(n) => {
                if !(1..=8).contains(&size) {
                    return Err(BadValue::WideField(size));
                }
                if size < 8 && *n >> (8 * size) != 0 {
                    return Err(BadValue::TooBig { n: *n, size });
                }
                // The low `size` bytes, in the machine's order.
                let b = n.to_ne_bytes();
                Ok(if cfg!(target_endian = "little") {
                    b[..size].to_vec()
                } else {
                    b[8 - size..].to_vec()
                })
            }
            Value::Bytes(b) if b.len() == size => Ok(b.clone()),
            Value::Bytes(b) => Err(BadValue::Length {
                given: b.len(),
                size,
            }),
        }
    }
}

/// Entries to write into one map: key (as written) and value.
type Entries = Vec<(String, Value)>;

/// A key as TOML and JSON tables write it: a string holding an integer.
fn key_number(k: &str) -> Result<u64, BadValue> {
    let r = match k.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => k.parse(),
    };
    r.map_err(|_| BadValue::Key(k.to_string()))
}

/// One ring buffer drained into one output.
struct Ring {
    out: OutputId,
    ring: RingReader,
}

/// The offcode.
pub struct BpfObjectOffcode {
    module: PathBuf,
    p: Params,
    object: Option<UserObject>,
    rings: Vec<Ring>,
    counters: Vec<(String, Vec<Metric>)>,
    last: Option<Instant>,
    records: Metric,
    record_bytes: Metric,
    records_lost: Metric,
    config_writes: Metric,
}

fn failed(e: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::Failed(e.to_string())
}

/// Builds the offcode for `module`.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    let module = spec.module.ok_or_else(|| {
        OffcodeError::failed("a kernel offcode from a BPF object needs `module = \"x.bpf.o\"`")
    })?;
    Ok(Box::new(BpfObjectOffcode {
        module: module.to_path_buf(),
        p: Params::parse(spec.params)?,
        object: None,
        rings: Vec::new(),
        counters: Vec::new(),
        last: None,
        records: Metric::default(),
        record_bytes: Metric::default(),
        records_lost: Metric::default(),
        config_writes: Metric::default(),
    }))
}

impl BpfObjectOffcode {
    /// Writes `entries` into map `map`; how many.
    fn write(&self, map: &str, entries: &[(String, Value)]) -> Result<usize, OffcodeError> {
        let obj = self
            .object
            .as_ref()
            .ok_or_else(|| OffcodeError::failed("the object is not loaded"))?;
        let (key_size, value_size) = obj.config_map(map).map_err(failed)?;
        for (k, v) in entries {
            let field = format!("maps.{map}.{k}");
            let key = Value::Int(key_number(k).map_err(|e| bad(&field, e))?)
                .encode(key_size)
                .map_err(|e| bad(&field, format!("key: {e}")))?;
            let value = v.encode(value_size).map_err(|e| bad(&field, e))?;
            obj.set(map, &key, &value).map_err(failed)?;
            self.config_writes.add(1);
        }
        Ok(entries.len())
    }

    /// The configuration in `params.maps`, as entries per map.
    fn param_entries(&self) -> Result<Vec<(String, Entries)>, OffcodeError> {
        self.p
            .maps
            .iter()
            .map(|(m, t)| {
                let e = t
                    .iter()
                    .map(|(k, v)| {
                        Value::from_toml(v)
                            .map(|v| (k.clone(), v))
                            .map_err(|e| bad(&format!("maps.{m}.{k}"), e))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((m.clone(), e))
            })
            .collect()
    }

    /// Takes the ring buffer behind every output port.
    fn take_rings(&mut self, cx: &InitCx<'_>) -> Result<(), OffcodeError> {
        let outputs = cx.info().outputs.clone();
        if let Some(port) = self.p.rings.keys().find(|p| !outputs.contains(p)) {
            return Err(bad(
                "rings",
                format!("`{port}` is not an output of this offcode (it has: {outputs:?})"),
            ));
        }
        let obj = self
            .object
            .as_mut()
            .ok_or_else(|| OffcodeError::failed("the object is not loaded"))?;
        for port in outputs
            .iter()
            .filter(|p| !sidecore_offcode::is_call_port(p))
        {
            let map = self.p.rings.get(port).unwrap_or(port).clone();
            let ring = obj.take_ring(&map).map_err(failed)?;
            self.rings.push(Ring {
                out: cx.output(port)?,
                ring,
            });
        }
        Ok(())
    }

    /// Reads the counters into their metrics.
    fn refresh(&self) -> Result<(), OffcodeError> {
        let Some(obj) = self.object.as_ref() else {
            return Ok(());
        };
        for (map, metrics) in &self.counters {
            let values = obj.counters(map).map_err(failed)?;
            for (m, v) in metrics.iter().zip(values) {
                m.set(v);
            }
        }
        Ok(())
    }

    /// Sends waiting ring buffer records on their outputs; how many.
    fn drain(&mut self, cx: &mut RunCx<'_>) -> Result<usize, OffcodeError> {
        let mut n = 0;
        let mut err = None;
        for r in &mut self.rings {
            let out = r.out;
            n += r.ring.drain(MAX_RECORDS_PER_TURN - n, |item| {
                self.records.add(1);
                self.record_bytes.add(item.len() as u64);
                match cx.send_bytes(out, item) {
                    Ok(sidecore_channel::SendOutcome::Sent) => {}
                    Ok(_) => self.records_lost.add(1),
                    Err(e) => {
                        self.records_lost.add(1);
                        err.get_or_insert(e);
                    }
                }
            });
        }
        err.map_or(Ok(n), Err)
    }
}

impl Offcode for BpfObjectOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.records = cx.metric("ring_records");
        self.record_bytes = cx.metric("ring_bytes");
        self.records_lost = cx.metric("ring_records_lost");
        self.config_writes = cx.metric("config_writes");
        self.object = Some(UserObject::load(&self.module).map_err(failed)?);
        self.take_rings(cx)?;
        for (map, entries) in self.param_entries()? {
            self.write(&map, &entries)?;
        }
        let obj = self.object.as_ref().expect("loaded above");
        for map in &self.p.counters {
            let n = obj.counters(map).map_err(failed)?.len();
            let metrics = (0..n).map(|i| cx.metric(&format!("{map}_{i}"))).collect();
            self.counters.push((map.clone(), metrics));
        }
        let obj = self.object.as_mut().expect("loaded above");
        for (i, a) in self.p.attach.iter().enumerate() {
            let hook = a.hook(i)?;
            obj.attach(&a.program, self.p.netns.as_deref(), &hook)
                .map_err(failed)?;
        }
        cx.metric("programs_attached").set(obj.attached() as u64);
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let n = self.drain(cx)?;
        if self
            .last
            .is_none_or(|t| cx.now().duration_since(t) >= COUNTERS_EVERY)
        {
            self.last = Some(cx.now());
            self.refresh()?;
        }
        Ok(if n > 0 {
            Progress::Busy
        } else {
            Progress::Idle
        })
    }

    fn control(
        &mut self,
        _cx: &mut RunCx<'_>,
        msg: &OobMessage,
    ) -> Result<Option<serde_json::Value>, OffcodeError> {
        let OobMessage::Control { body, .. } = msg else {
            return Ok(None);
        };
        let Some(maps) = body.get("maps").and_then(serde_json::Value::as_object) else {
            return Ok(None);
        };
        let mut written = 0;
        for (map, entries) in maps {
            let Some(entries) = entries.as_object() else {
                return Ok(Some(serde_json::json!({
                    "error": format!("maps.{map}: give a table of key = value")
                })));
            };
            let parsed: Result<Vec<(String, Value)>, String> = entries
                .iter()
                .map(|(k, v)| {
                    Value::from_json(v)
                        .map(|v| (k.clone(), v))
                        .map_err(|e| format!("maps.{map}.{k}: {e}"))
                })
                .collect();
            let r = parsed.and_then(|e| self.write(map, &e).map_err(|e| e.to_string()));
            match r {
                Ok(n) => written += n,
                Err(e) => return Ok(Some(serde_json::json!({ "error": e, "written": written }))),
            }
        }
        Ok(Some(serde_json::json!({ "written": written })))
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        let r = self.refresh();
        self.rings.clear();
        if let Some(mut obj) = self.object.take() {
            obj.detach_all();
        }
        r
    }
}

/// The `loader:kernel` implementation for the registry.
pub fn loader() -> Implementation {
    Implementation {
        name: Registry::loader_name(PeKind::Kernel),
        description: "a user's BPF object: programs at XDP or tc, ring buffers as output channels, array and hash maps as configuration".into(),
        kinds: vec![PeKind::Kernel],
        inputs: Some(vec![]),
        outputs: None,
        factory: Arc::new(build),
        validate: Some(Arc::new(|p| Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> toml::Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn values_are_encoded_in_the_maps_sizes() {
        assert_eq!(Value::Int(5001).encode(4).unwrap(), 5001u32.to_ne_bytes());
        assert_eq!(Value::Int(7).encode(8).unwrap(), 7u64.to_ne_bytes());
        assert_eq!(Value::Int(255).encode(1).unwrap(), vec![255]);
        assert!(
            Value::Int(256)
                .encode(1)
                .unwrap_err()
                .to_string()
                .contains("does not fit in 1 bytes")
        );
        assert!(
            Value::Int(1)
                .encode(16)
                .unwrap_err()
                .to_string()
                .contains("array of 16 bytes")
        );
        assert_eq!(Value::Bytes(vec![1, 2]).encode(2).unwrap(), vec![1, 2]);
        assert!(
            Value::Bytes(vec![1])
                .encode(2)
                .unwrap_err()
                .to_string()
                .contains("1 bytes given for a 2-byte")
        );
        assert_eq!(key_number("0x10").unwrap(), 16);
        assert!(
            key_number("ten")
                .unwrap_err()
                .to_string()
                .contains("key `ten`")
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Params::parse(&t("attach = [{ program = \"p\" }]")).unwrap_err();
        assert!(
            e.to_string()
                .contains("`attach[0]`: program `p`: give exactly one"),
            "{e}"
        );
        let e = Params::parse(&t(
            "attach = [{ program = \"p\", xdp = \"a\", tc = \"b\" }]",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("exactly one"), "{e}");
        let e = Params::parse(&t(
            "attach = [{ program = \"p\", tc = \"a\", direction = \"sideways\" }]",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("direction `sideways`"), "{e}");
        let e = Params::parse(&t(
            "attach = [{ program = \"p\", xdp = \"a\", mode = \"warp\" }]",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("`warp` is not an XDP mode"), "{e}");
        let e = Params::parse(&t("maps = { config = { zero = 1 } }")).unwrap_err();
        assert!(e.to_string().contains("`maps.config`: key `zero`"), "{e}");
        let e = Params::parse(&t("maps = { config = { \"0\" = -1 } }")).unwrap_err();
        assert!(
            e.to_string().contains("`maps.config.0`: -1 is negative"),
            "{e}"
        );
        let e = Params::parse(&t("maps = { config = { \"0\" = [1, 300] } }")).unwrap_err();
        assert!(e.to_string().contains("300 is not a byte"), "{e}");
        let e = Params::parse(&t("attachments = []")).unwrap_err();
        assert!(e.to_string().contains("unknown field `attachments`"), "{e}");
        Params::parse(&t(
            "attach = [{ program = \"p\", tc = \"a\", direction = \"egress\" }]\nmaps = { config = { \"0\" = 5001 } }\ncounters = [\"counts\"]",
        ))
        .unwrap();
    }
}
