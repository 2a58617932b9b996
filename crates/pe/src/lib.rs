//! Processing-element (PE) discovery: what this machine offers to offload onto.
//!
//! Each kind is probed for real and, where it is absent, says why:
//!
//! | kind | probe | module |
//! |---|---|---|
//! | `core` | sysfs online/isolated/nohz_full lists, the process's CPU affinity (cpuset), topology | [`cores`] |
//! | `kernel` | loads a trivial XDP program with `bpf(2)` and attaches it to `lo` through a BPF link | [`kernel`] |
//! | `wasm` | compiles and runs a tiny module with wasmtime | [`wasm`] |
//! | `node` | connects to each configured peer daemon and exchanges a hello | [`node`] |
//! | `gpu` | DRM cards in sysfs and the NVIDIA driver's proc files | [`gpu`] |
//! | `host` | always present: ordinary threads | here |
//!
//! The result, an [`Inventory`], feeds the layout solver (capacities) and
//! `sidecore devices`.

pub mod cores;
pub mod cpulist;
pub mod gpu;
pub mod kernel;
pub mod node;
pub mod wasm;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_types::{Bandwidth, PeKind, PropValue};

pub use node::NodeConfig;

/// What a PE can hold, for the layout's capacity constraints.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// CPU, in shares of one core.
    pub cpu: f64,
    pub memory_bytes: u64,
    /// Maximum number of offcodes, if limited.
    pub slots: Option<u32>,
}

/// One processing element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pe {
    /// Stable identifier: `core:3`, `kernel`, `wasm`, `node:b`, `gpu:0`, `host`.
    pub id: String,
    pub kind: PeKind,
    /// Properties targets may require (`isolated`, `cpu`, `numa`, `xdp`, ...).
    pub props: BTreeMap<String, PropValue>,
    pub capacity: Capacity,
    /// The declared bandwidth of the link between the host and this PE (a peer
    /// node's from the nodes file), which the layout may not oversubscribe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Bandwidth>,
    /// One line for humans.
    pub detail: String,
}

impl Pe {
    /// Checks `require` against this PE's properties; the error names the first
    /// property that does not match.
    pub fn satisfies(&self, require: &BTreeMap<String, PropValue>) -> Result<(), Unsatisfied> {
        for (k, want) in require {
            match self.props.get(k) {
                Some(have) if have == want => {}
                have => {
                    return Err(Unsatisfied {
                        pe: self.id.clone(),
                        property: k.clone(),
                        have: have.cloned(),
                        want: want.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A PE that lacks a property a target requires.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{pe} {}, required {want}", match have { Some(h) => format!("has {property} = {h}"), None => format!("has no property {property}") })]
pub struct Unsatisfied {
    pub pe: String,
    pub property: String,
    pub have: Option<PropValue>,
    pub want: PropValue,
}

/// A kind of PE this machine does not offer, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Absent {
    pub kind: PeKind,
    pub reason: String,
}

/// Everything discovered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub pes: Vec<Pe>,
    pub absent: Vec<Absent>,
    /// CPUs that exist but cannot be dedicated, with the reason.
    pub not_dedicatable: Vec<(u32, String)>,
}

impl Inventory {
    /// The PE with this id.
    pub fn get(&self, id: &str) -> Option<&Pe> {
        self.pes.iter().find(|p| p.id == id)
    }

    /// PEs of one kind.
    pub fn of_kind(&self, kind: PeKind) -> impl Iterator<Item = &Pe> {
        self.pes.iter().filter(move |p| p.kind == kind)
    }
}

/// What to probe.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// Peer nodes to contact.
    pub nodes: Vec<NodeConfig>,
    /// How long to wait for each node.
    pub node_timeout: Duration,
    /// Load and attach a BPF program to test the kernel engine.
    pub probe_kernel: bool,
    /// Compile and run a module to test the wasm engine.
    pub probe_wasm: bool,
    /// CPUs to keep for the host (never dedicated). `None`: keep CPU 0 when
    /// more than two CPUs are allowed, none otherwise.
    pub housekeeping: Option<Vec<u32>>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            nodes: Vec::new(),
            node_timeout: Duration::from_millis(800),
            probe_kernel: true,
            probe_wasm: true,
            housekeeping: None,
        }
    }
}

/// CPU capacity given to the host PE: large, because its threads time-share.
pub const HOST_CPU_CAPACITY: f64 = 1024.0;

/// Probes every kind of PE.
pub fn discover(opts: &DiscoverOptions) -> Inventory {
    let mut inv = Inventory {
        pes: Vec::new(),
        absent: Vec::new(),
        not_dedicatable: Vec::new(),
    };
    let mem = cores::mem_available();
    let allowed = probe_cores(&mut inv, opts, mem);
    if opts.probe_kernel {
        probe_kernel(&mut inv, allowed, mem);
    }
    if opts.probe_wasm {
        probe_wasm(&mut inv, mem);
    }
    probe_nodes(&mut inv, opts);
    probe_gpus(&mut inv);
    inv.pes.push(Pe {
        id: "host".into(),
        kind: PeKind::Host,
        props: BTreeMap::new(),
        // Ordinary threads time-share the allowed CPUs, so the host is the
        // fallback that always fits: its CPU is not a limit, its memory is.
        capacity: Capacity {
            cpu: HOST_CPU_CAPACITY,
            memory_bytes: mem,
            slots: None,
        },
        link: None,
        detail: format!(
            "ordinary threads on {allowed} allowed CPUs, {} MiB available",
            mem >> 20
        ),
    });
    inv
}

/// The dedicated cores; returns how many CPUs this process may use.
fn probe_cores(inv: &mut Inventory, opts: &DiscoverOptions, mem: u64) -> usize {
    let cpus = cores::probe(opts.housekeeping.as_deref());
    for c in &cpus.cores {
        if let Some(why) = &c.not_dedicatable {
            inv.not_dedicatable.push((c.cpu, why.clone()));
            continue;
        }
        let mut props = BTreeMap::new();
        props.insert("cpu".into(), PropValue::Int(i64::from(c.cpu)));
        props.insert("isolated".into(), PropValue::Bool(c.isolated));
        props.insert("numa".into(), PropValue::Int(i64::from(c.numa)));
        inv.pes.push(Pe {
            id: format!("core:{}", c.cpu),
            kind: PeKind::Core,
            props,
            capacity: Capacity {
                cpu: 1.0,
                memory_bytes: mem,
                slots: None,
            },
            link: None,
            detail: c.describe(),
        });
    }
    if !cpus.cores.iter().any(|c| c.not_dedicatable.is_none()) {
        inv.absent.push(Absent {
            kind: PeKind::Core,
            reason: cpus.summary.clone(),
        });
    }
    cpus.allowed_count
}

fn probe_kernel(inv: &mut Inventory, allowed: usize, mem: u64) {
    match kernel::probe() {
        Ok(k) => {
            let mut props = BTreeMap::new();
            props.insert("xdp".into(), PropValue::Bool(k.xdp_attach.is_ok()));
            props.insert("btf".into(), PropValue::Bool(k.btf));
            #[allow(clippy::cast_precision_loss)] // a CPU count
            inv.pes.push(Pe {
                id: "kernel".into(),
                kind: PeKind::Kernel,
                props,
                capacity: Capacity {
                    cpu: allowed as f64,
                    memory_bytes: k.memlock.unwrap_or(mem).min(mem),
                    slots: None,
                },
                link: None,
                detail: k.describe(),
            });
        }
        Err(e) => inv.absent.push(Absent {
            kind: PeKind::Kernel,
            reason: e.to_string(),
        }),
    }
}

fn probe_wasm(inv: &mut Inventory, mem: u64) {
    match wasm::probe() {
        Ok(detail) => inv.pes.push(Pe {
            id: "wasm".into(),
            kind: PeKind::Wasm,
            props: BTreeMap::new(),
            capacity: Capacity {
                cpu: 1.0,
                memory_bytes: mem,
                slots: None,
            },
            link: None,
            detail,
        }),
        Err(e) => inv.absent.push(Absent {
            kind: PeKind::Wasm,
            reason: e.to_string(),
        }),
    }
}

fn probe_nodes(inv: &mut Inventory, opts: &DiscoverOptions) {
    if opts.nodes.is_empty() {
        inv.absent.push(Absent {
            kind: PeKind::Node,
            reason: "no peer nodes configured (pass --nodes FILE or set SIDECORE_NODES)".into(),
        });
    }
    for n in &opts.nodes {
        match node::probe(n, opts.node_timeout) {
            Ok(info) => {
                let mut props = BTreeMap::new();
                props.insert("name".into(), PropValue::Str(n.name.clone()));
                props.insert("addr".into(), PropValue::Str(n.addr.clone()));
                inv.pes.push(Pe {
                    id: format!("node:{}", n.name),
                    kind: PeKind::Node,
                    props,
                    capacity: Capacity {
                        cpu: f64::from(info.cpus),
                        memory_bytes: info.memory_bytes,
                        slots: None,
                    },
                    link: n.link(),
                    detail: format!(
                        "{} at {} (sidecore {}, {} CPUs{})",
                        info.name,
                        n.addr,
                        info.software,
                        info.cpus,
                        n.link().map(|b| format!(", link {b}")).unwrap_or_default()
                    ),
                });
            }
            // The error names the node and its address.
            Err(e) => inv.absent.push(Absent {
                kind: PeKind::Node,
                reason: e.to_string(),
            }),
        }
    }
}

fn probe_gpus(inv: &mut Inventory) {
    let gpus = gpu::probe();
    if gpus.is_empty() {
        inv.absent.push(Absent {
            kind: PeKind::Gpu,
            reason: gpu::absent_reason(),
        });
    }
    for g in gpus {
        let mut props = BTreeMap::new();
        props.insert("vendor".into(), PropValue::Str(g.vendor.clone()));
        inv.pes.push(Pe {
            id: format!("gpu:{}", g.index),
            kind: PeKind::Gpu,
            props,
            capacity: Capacity {
                cpu: 1.0,
                memory_bytes: g.memory_bytes.unwrap_or(0),
                slots: None,
            },
            link: None,
            detail: g.describe(),
        });
    }
}
