//! A seeded generator of realistic layout problems for the benchmark: one host PE plus
//! dedicated cores, some Wasm sandboxes, eBPF and peer nodes; applications made of
//! pipelines of offcodes with flows between neighbours; pull, gang and asym-gang on
//! about 15% of the offcodes; CPU capacities tight enough that not all can go.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sidecore_layout::{Candidate, ConstraintSpec, Flow, OffcodeSpec, PeSpec, Problem};
use sidecore_types::{ConstraintKind, PeKind};

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Build {
    Native,
    Wasm,
    Ebpf,
    DeviceOnly,
}

/// `offcodes` offcodes on `pes` PEs (including the host), from `seed`.
pub fn problem(offcodes: usize, pes: usize, seed: u64) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pe = pe_specs(offcodes, pes);
    let kinds = Kinds::of(&pe);
    let (ocs, builds) = offcode_specs(&mut rng, offcodes, &kinds);
    let (constraints, flows) = applications(&mut rng, &builds);
    Problem {
        pes: pe,
        offcodes: ocs,
        constraints,
        flows,
        links: Vec::new(),
    }
}

/// The host (with a share of CPU per offcode) and, among `pes`, about 1/32 kernels,
/// 1/32 peer nodes, 1/8 Wasm sandboxes and dedicated cores for the rest.
fn pe_specs(offcodes: usize, pes: usize) -> Vec<PeSpec> {
    let pes = pes.max(3);
    let n_kernel = (pes / 32).max(1);
    let n_node = pes / 32;
    let n_wasm = (pes / 8).max(if pes >= 8 { 1 } else { 0 });
    let n_core = pes - 1 - n_kernel - n_node - n_wasm;
    let mut pe = vec![PeSpec {
        id: "host".into(),
        kind: PeKind::Host,
        cpu: offcodes as f64,
        memory_bytes: 64 << 30,
        slots: None,
    }];
    for i in 0..n_core {
        pe.push(PeSpec {
            id: format!("core:{}", i + 1),
            kind: PeKind::Core,
            cpu: 1.0,
            // A dedicated core's share of host memory: rarely the binding resource.
            memory_bytes: 2048 * MIB,
            slots: None,
        });
    }
    for i in 0..n_wasm {
        pe.push(PeSpec {
            id: format!("wasm:{i}"),
            kind: PeKind::Wasm,
            cpu: 1.0,
            memory_bytes: 256 * MIB,
            slots: Some(8),
        });
    }
    for i in 0..n_kernel {
        pe.push(PeSpec {
            id: format!("kernel:{i}"),
            kind: PeKind::Kernel,
            cpu: 1.0,
            memory_bytes: 64 * MIB,
            slots: Some(16),
        });
    }
    for i in 0..n_node {
        pe.push(PeSpec {
            id: format!("node:{i}"),
            kind: PeKind::Node,
            cpu: 4.0,
            memory_bytes: 4096 * MIB,
            slots: None,
        });
    }
    pe
}

/// The PE indices of each kind.
struct Kinds {
    cores: Vec<usize>,
    wasms: Vec<usize>,
    kernels: Vec<usize>,
    nodes: Vec<usize>,
}

impl Kinds {
    fn of(pe: &[PeSpec]) -> Kinds {
        let of_kind = |k: PeKind| -> Vec<usize> {
            pe.iter()
                .enumerate()
                .filter(|(_, p)| p.kind == k)
                .map(|(i, _)| i)
                .collect()
        };
        Kinds {
            cores: of_kind(PeKind::Core),
            wasms: of_kind(PeKind::Wasm),
            kernels: of_kind(PeKind::Kernel),
            nodes: of_kind(PeKind::Node),
        }
    }
}

/// The offcodes: 60% native, 25% Wasm, the rest eBPF or (a few) device-only, each
/// with its can-run row and demands.
fn offcode_specs(
    rng: &mut ChaCha8Rng,
    offcodes: usize,
    kinds: &Kinds,
) -> (Vec<OffcodeSpec>, Vec<Build>) {
    let Kinds { cores, nodes, .. } = kinds;
    // Scale CPU demand so native demand is about 1.3x the offload capacity.
    let offload_cpu = cores.len() as f64 + 4.0 * nodes.len() as f64;
    let mean_native = 0.35 * 0.6 * offcodes as f64;
    let scale = (1.3 * offload_cpu / mean_native.max(1e-9)).min(2.5);

    // Offcodes without a host build must be offloaded: at most two per core.
    let mut device_only_left = 2 * cores.len();
    let mut ocs = Vec::with_capacity(offcodes);
    let mut builds = Vec::with_capacity(offcodes);
    for n in 0..offcodes {
        let r: f64 = rng.random();
        let build = if r < 0.6 {
            Build::Native
        } else if r < 0.85 {
            Build::Wasm
        } else if r < 0.95 || device_only_left == 0 {
            Build::Ebpf
        } else {
            device_only_left -= 1;
            Build::DeviceOnly
        };
        let weight = match rng.random_range(0..10) {
            0 | 1 => 4,
            2 | 3 => 1,
            _ => 2,
        };
        let candidates = candidates(rng, build, scale, kinds);
        ocs.push(OffcodeSpec {
            name: format!("oc{n}"),
            weight,
            candidates,
        });
        builds.push(build);
    }
    (ocs, builds)
}

/// The can-run row of one offcode of `build`, its CPU demand scaled by `scale`.
fn candidates(rng: &mut ChaCha8Rng, build: Build, scale: f64, kinds: &Kinds) -> Vec<Candidate> {
    let Kinds {
        cores,
        wasms,
        kernels,
        nodes,
    } = kinds;
    let cpu = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| {
        (rng.random_range(lo..hi) * scale).clamp(0.01, 0.95)
    };
    let mut cands = Vec::new();
    {
        match build {
            Build::Native | Build::DeviceOnly => {
                let c = cpu(rng, 0.1, 0.6);
                let m = rng.random_range(16..128) * MIB;
                if build == Build::Native {
                    cands.push(Candidate {
                        pe: 0,
                        cpu: c,
                        memory_bytes: m,
                    });
                }
                cands.extend(cores.iter().map(|&k| Candidate {
                    pe: k,
                    cpu: c,
                    memory_bytes: m,
                }));
                if rng.random_bool(0.3) {
                    cands.extend(nodes.iter().map(|&k| Candidate {
                        pe: k,
                        cpu: c,
                        memory_bytes: m,
                    }));
                }
            }
            Build::Wasm => {
                let c = cpu(rng, 0.1, 0.4);
                let m = rng.random_range(8..64) * MIB;
                cands.push(Candidate {
                    pe: 0,
                    cpu: c,
                    memory_bytes: m,
                });
                cands.extend(wasms.iter().map(|&k| Candidate {
                    pe: k,
                    cpu: c * 1.5,
                    memory_bytes: m,
                }));
                if wasms.is_empty() {
                    cands.extend(cores.iter().map(|&k| Candidate {
                        pe: k,
                        cpu: c * 1.5,
                        memory_bytes: m,
                    }));
                }
            }
            Build::Ebpf => {
                let c = cpu(rng, 0.05, 0.2);
                let m = rng.random_range(1..16) * MIB;
                cands.push(Candidate {
                    pe: 0,
                    cpu: c * 2.0,
                    memory_bytes: m,
                });
                cands.extend(kernels.iter().map(|&k| Candidate {
                    pe: k,
                    cpu: c,
                    memory_bytes: m,
                }));
            }
        }
    }
    cands
}

/// Applications: pipelines of 3..8 consecutive offcodes with flows between
/// neighbours and a constraint on about 15% of them.
fn applications(rng: &mut ChaCha8Rng, builds: &[Build]) -> (Vec<ConstraintSpec>, Vec<Flow>) {
    let offcodes = builds.len();
    let mut constraints = Vec::new();
    let mut flows = Vec::new();
    let mut start = 0;
    while start < offcodes {
        let len = rng.random_range(3..=8).min(offcodes - start);
        for n in start..start + len - 1 {
            flows.push(Flow {
                a: n,
                b: n + 1,
                bandwidth_bps: rng.random_range(10..1000) as f64,
                origin: format!("gen:{n}"),
            });
            // About 15% of offcodes carry a constraint to their neighbour.
            if rng.random_bool(0.15) {
                let same_native = builds[n] == Build::Native && builds[n + 1] == Build::Native;
                let kind = match rng.random_range(0..3) {
                    0 if same_native => ConstraintKind::Pull,
                    0 | 1 => ConstraintKind::Gang,
                    _ => ConstraintKind::AsymGang,
                };
                constraints.push(ConstraintSpec {
                    kind,
                    a: n,
                    b: n + 1,
                    origin: format!("gen:{n}"),
                });
            }
        }
        start += len;
    }
    (constraints, flows)
}
