//! The resolved manifest: what the layout solver and the runtime consume. Every
//! reference is an index, every keyword an enum, every size a number, and every
//! item remembers where it was declared.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use sidecore_types::PropValue;
pub use sidecore_types::ValueType;
use sidecore_types::calls::{CallPortSpec, CallRole, MethodSpec};
use sidecore_types::{
    Bandwidth, ChannelProps, ConstraintKind, Guid, PeKind, Priority, SchedPolicy,
};
pub use sidecore_types::{RestartMode, RestartPolicy};

use crate::diag::{Origin, Sources};
pub use crate::timing::Timing;

/// A whole application: the root manifest plus everything it imports.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Application name (from `[app] name`, else the root file's stem).
    pub app: String,
    pub description: Option<String>,
    /// The root manifest file.
    pub root: PathBuf,
    /// Offcode library directories, resolved against the declaring file.
    pub library: Vec<PathBuf>,
    /// How dedicated cores share their time among this app's offcodes.
    pub scheduler: SchedPolicy,
    pub offcodes: Vec<Offcode>,
    pub constraints: Vec<Constraint>,
    /// Declared channels, then the two channels of each call binding.
    pub channels: Vec<Channel>,
    /// Call bindings (`[[offcode.uses]]`), each carried by two of `channels`.
    pub calls: Vec<CallBinding>,
    /// The source files, for later diagnostics.
    pub sources: Sources,
}

impl Manifest {
    /// The index of the offcode named `name`.
    pub fn offcode_index(&self, name: &str) -> Option<usize> {
        self.offcodes.iter().position(|o| o.name == name)
    }

    /// The call bindings offcode `i` takes part in, as the runtime hands them
    /// to it: its role, the interface, the other end, the methods, and the
    /// indices of the binding's two ports among its inputs and outputs.
    pub fn call_ports(&self, i: usize) -> Vec<CallPortSpec> {
        let port = |list: &[String], name: &str| {
            list.iter()
                .position(|p| p == name)
                .expect("binding added this port")
        };
        let mut out = Vec::new();
        for b in self
            .calls
            .iter()
            .filter(|b| b.caller == i || b.provider == i)
        {
            let itf = &self.offcodes[b.provider].interfaces[b.interface];
            let methods = itf
                .methods
                .iter()
                .filter(|m| b.methods.contains(&m.id))
                .map(|m| MethodSpec {
                    id: m.id,
                    name: m.name.clone(),
                    params: m.params.clone(),
                    returns: m.returns,
                })
                .collect();
            let (me, request, reply) = (
                &self.offcodes[i],
                &self.channels[b.request],
                &self.channels[b.reply],
            );
            let (role, peer, input, output) = if b.caller == i {
                (
                    CallRole::Caller,
                    b.provider,
                    port(&me.inputs, &reply.to[0].port),
                    port(&me.outputs, &request.from.port),
                )
            } else {
                (
                    CallRole::Provider,
                    b.caller,
                    port(&me.inputs, &request.to[0].port),
                    port(&me.outputs, &reply.from.port),
                )
            };
            out.push(CallPortSpec {
                role,
                interface: itf.name.clone(),
                peer: self.offcodes[peer].name.clone(),
                methods,
                input,
                output,
            });
        }
        out
    }
}

/// One offcode (HYDRA §4.1): a unit of offloaded functionality.
#[derive(Debug, Clone)]
pub struct Offcode {
    /// Binding name, unique in the application.
    pub name: String,
    /// 128-bit GUID.
    pub id: Guid,
    /// Implementation name looked up in the offcode library (defaults to `name`).
    pub implementation: String,
    pub description: Option<String>,
    pub priority: Priority,
    /// HYDRA's `WATCHDOG_TIME`: the offcode must make progress at least this often.
    pub watchdog: Option<Duration>,
    /// HYDRA's `OBSOLETE_TIME`: lifetime counted from deployment.
    pub obsolete: Option<Duration>,
    /// What the supervisor does when it fails (`restart = "on-failure"`, ...;
    /// by default nothing: the watchdog disposes of it).
    pub restart: RestartPolicy,
    /// CPU share of one core it needs (0, 1]; a periodic offcode's default is
    /// `wcet / period` (HYDRA Eq. 7.6).
    pub cpu: f64,
    /// Its period and worst-case turn, for the scheduler of a shared core.
    pub timing: Timing,
    /// Memory it needs, in bytes.
    pub memory: u64,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Free-form parameters handed to the implementation.
    pub params: toml::Table,
    pub params_origin: Option<Origin>,
    pub interfaces: Vec<Interface>,
    /// Where it may run, in order of preference.
    pub targets: Vec<Target>,
    /// The file that declared it.
    pub file: PathBuf,
    pub origin: Origin,
}

impl Offcode {
    /// The target entry for a PE kind, if the offcode can run there.
    pub fn target(&self, kind: PeKind) -> Option<&Target> {
        self.targets.iter().find(|t| t.kind == kind)
    }
}

/// A typed interface (HYDRA's IID + WSDL).
#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub id: Guid,
    pub methods: Vec<Method>,
}

/// A method of an interface.
#[derive(Debug, Clone)]
pub struct Method {
    pub name: String,
    /// Method id used in call headers.
    pub id: u16,
    pub params: Vec<ValueType>,
    pub returns: Option<ValueType>,
    /// Where it was declared.
    pub origin: Origin,
}

/// A call binding (HYDRA §4.1.5, §5.5): `caller` invokes methods of one of
/// `provider`'s interfaces. It is carried by two ordinary channels, so the
/// layout, the transports and peer nodes treat it like any other traffic: the
/// requests (caller → provider) and the replies (provider → caller).
#[derive(Debug, Clone)]
pub struct CallBinding {
    pub caller: usize,
    pub provider: usize,
    /// Index into the provider's `interfaces`.
    pub interface: usize,
    /// Ids of the methods the caller invokes.
    pub methods: Vec<u16>,
    /// Index of the request channel in `Manifest::channels`.
    pub request: usize,
    /// Index of the reply channel in `Manifest::channels`.
    pub reply: usize,
    /// The `[[offcode.uses]]` entry that declared it.
    pub origin: Origin,
}

/// A kind of PE an offcode can run on, with what it requires there.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: PeKind,
    pub require: BTreeMap<String, PropValue>,
    /// Demand overrides on this kind of PE.
    pub cpu: Option<f64>,
    pub memory: Option<u64>,
    /// An artifact for this kind (a `.wasm` module, a BPF object), resolved
    /// against the declaring file.
    pub module: Option<PathBuf>,
    pub origin: Origin,
}

/// A placement constraint between two offcodes (HYDRA Figure 4.7).
#[derive(Debug, Clone)]
pub struct Constraint {
    pub kind: ConstraintKind,
    /// The importing offcode.
    pub from: usize,
    /// The imported offcode.
    pub to: usize,
    pub origin: Origin,
}

/// One end of a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub offcode: usize,
    pub port: String,
}

/// A channel between offcodes (HYDRA §4.2.2).
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    pub from: Endpoint,
    pub to: Vec<Endpoint>,
    pub props: ChannelProps,
    /// Estimated traffic, for the layout's bandwidth objective and link caps.
    pub bandwidth: Bandwidth,
    pub origin: Origin,
}
