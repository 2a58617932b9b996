//! The static side of sidecore's hybrid resource control for untrusted Wasm offcodes
//! (RBClick, Patel 2003, carried over to WebAssembly). Sans-IO: bytes in, a decision out.
//!
//! `verify` admits a module only if its termination is guaranteed — an acyclic call graph,
//! `call_indirect` only into a table it can bound, every loop bounded (proved from the
//! bytecode or declared in the `sidecore.bounds` section and then enforced by
//! instrumentation), imports only from the host ABI, no `memory.grow` — and if every
//! exported entry point's worst-case cost, converted to cycles by a calibrated cost model,
//! is within `acceptable limit × inflation factor` (thesis Fig. 3.1). It returns the
//! module to run (instrumented where needed, with poll points only in loops whose cost
//! exceeds the acceptable limit) and a report naming each handler's bound, worst path
//! and dominating loops.
//!
//! Batch entries (`batch`/`batch_<input>`, see `abi`) are admitted the same way, at
//! `B` × the acceptable limit; their loop over the buffers is proven against `B` (read
//! from `sc_batch_max`) because the host never passes more than `B`.

pub mod abi;
pub mod analysis;
pub mod bounds;
pub mod cost;
pub mod error;
pub mod instrument;
pub mod loops;
pub mod module;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use wasmparser::Operator;

pub use analysis::{LoopCfg, Step};
pub use cost::{Calibration, CostModel, HostCost, LatencyRow, OpClass};
pub use error::{Reason, Rejection};

use analysis::{FuncCost, analyse_function};
use bounds::{FuncSel, LoopSel};
use loops::{LoopProof, Structure};
use module::ModuleInfo;

/// Caps of the four memory regions of thesis §4.2.4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegionCaps {
    /// 'A: per-packet scratch — the input buffer in linear memory (largest input accepted).
    pub scratch_bytes: u64,
    /// 'B: packet cache — number of slots.
    pub cache_slots: u32,
    /// 'B: packet cache — bytes per slot.
    pub cache_slot_bytes: u64,
    /// 'C: per-domain state — linear memory size.
    pub memory_bytes: u64,
    /// 'C: per-domain state — host-side key/value store, total bytes of values.
    pub state_bytes: u64,
    /// 'C: largest single state value.
    pub state_value_bytes: u64,
    /// 'D: read-only shared state — largest single read.
    pub shared_read_bytes: u64,
    /// Largest single output buffer.
    pub output_bytes: u64,
}

impl Default for RegionCaps {
    fn default() -> Self {
        RegionCaps {
            scratch_bytes: 2048,
            cache_slots: 64,
            cache_slot_bytes: 2048,
            memory_bytes: 1 << 20,
            state_bytes: 1 << 20,
            state_value_bytes: 256,
            shared_read_bytes: 4096,
            output_bytes: 2048,
        }
    }
}

/// Admission parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// The acceptable limit: the minimum inter-arrival time of the input served, ns
    /// (thesis §3.4). Default: a 1518-byte frame on 10 GbE, 1230 ns.
    pub acceptable_limit_ns: f64,
    /// Inflation factor N (thesis §3.5); admitted if bound ≤ limit × N.
    pub inflation: f64,
    /// Deployment-time symbols for declared bounds (`MTU`, `PACKET_LEN_MAX`, ...).
    pub symbols: BTreeMap<String, u64>,
    /// Largest declared loop bound accepted at all.
    pub max_declared_bound: u64,
    /// Largest worst-case Wasm stack depth accepted, bytes.
    pub max_stack_bytes: u64,
    pub caps: RegionCaps,
    /// Whether the host-ABI exports (`memory`, `sc_input_ptr`, `sc_input_cap`, a
    /// handler) are required. Only analysis tools and fuzzing turn this off.
    pub require_abi: bool,
}

impl Default for Policy {
    fn default() -> Self {
        let mut symbols = BTreeMap::new();
        symbols.insert("MTU".to_string(), 1500);
        let mut p = Policy {
            acceptable_limit_ns: 1230.0,
            inflation: 64.0,
            symbols,
            max_declared_bound: 1 << 20,
            max_stack_bytes: 256 << 10,
            caps: RegionCaps::default(),
            require_abi: true,
        };
        p.set_caps(RegionCaps::default());
        p
    }
}

impl Policy {
    /// Sets the region caps and the symbols that follow from them (`PACKET_LEN_MAX`,
    /// `STATE_VALUE_MAX`, `CACHE_SLOTS`), so declared bounds written with them stay
    /// in step with the caps.
    pub fn set_caps(&mut self, caps: RegionCaps) {
        for (name, v) in [
            ("PACKET_LEN_MAX", caps.scratch_bytes),
            ("STATE_VALUE_MAX", caps.state_value_bytes),
            ("CACHE_SLOTS", caps.cache_slots as u64),
        ] {
            self.symbols.insert(name.to_string(), v);
        }
        self.caps = caps;
    }
}

/// How a loop's bound was established.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BoundSource {
    Proven(String),
    Declared(String),
}

/// A loop of the module, as reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopReport {
    pub func: u32,
    pub func_name: String,
    pub ordinal: u32,
    pub offset: usize,
    pub iterations: u64,
    pub source: BoundSource,
    pub per_iter_cycles: f64,
    pub total_cycles: f64,
    /// Poll every this many iterations (placed poll point), if any.
    pub poll_every: Option<u64>,
    /// A declared bound enforced by one check at loop entry (counted loop with an
    /// invariant limit) rather than a per-iteration counter.
    pub checked_at_entry: bool,
    /// For a declared-bound loop: the id its instrumentation passes to
    /// `sidecore.bound_exceeded` ([`instrument::Plan::declared_id`]).
    #[serde(default)]
    pub declared_id: Option<u32>,
}

/// One entry point's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryReport {
    pub name: String,
    pub func: u32,
    pub handler: bool,
    /// For a batch entry: `B`, the most buffers one call handles. Its budget is the
    /// acceptable limit × `B` (× inflation).
    #[serde(default)]
    pub batch: Option<u32>,
    pub bound_cycles: f64,
    pub bound_ns: f64,
    /// Machine-independent bound in wasmtime fuel units.
    pub bound_fuel: f64,
    pub stack_bytes: u64,
    pub admitted: bool,
    /// Whether its bound exceeds the acceptable limit (so poll points were placed).
    pub over_limit: bool,
    pub path: Vec<String>,
    /// (function, loop ordinal, share of the bound) of the loops dominating the path.
    pub dominant_loops: Vec<String>,
}

/// A module admitted for execution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Admission {
    pub entries: Vec<EntryReport>,
    pub loops: Vec<LoopReport>,
    /// The module to run: the input, rewritten if any loop was instrumented.
    #[serde(skip)]
    pub module: Vec<u8>,
    pub instrumented: bool,
    /// The module's batch size `B` (`sc_batch_max`), if it exports batch entries.
    #[serde(default)]
    pub batch_max: Option<u32>,
    /// The acceptable limit per input buffer, cycles (a batch entry gets `B` times it).
    pub limit_cycles: f64,
    pub inflated_cycles: f64,
    pub calibration: String,
    pub working_set_bytes: u64,
    pub report: String,
}

impl Admission {
    pub fn entry(&self, name: &str) -> Option<&EntryReport> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// The host cost table for a calibration and region caps.
pub fn host_costs(cal: &Calibration, caps: &RegionCaps) -> BTreeMap<String, HostCost> {
    let mut t = BTreeMap::new();
    for h in abi::HOST_ABI {
        let full = format!("{}.{}", abi::MODULE, h.name);
        let max_bytes = match h.name {
            "emit" => caps.output_bytes,
            "state_get" | "state_put" => caps.state_value_bytes,
            "cache_put" | "cache_get" => caps.cache_slot_bytes,
            "shared_read" => caps.shared_read_bytes,
            _ => 256,
        };
        let base = cal.host_base_cycles.get(&full).copied().unwrap_or(100.0);
        t.insert(
            full,
            HostCost {
                base_cycles: base,
                per_byte_cycles: cal.host_per_byte_cycles,
                len_arg: h.len_arg,
                max_bytes,
            },
        );
    }
    let poll = format!("{}.{}", abi::INJECT_MODULE, abi::INJECT_POLL);
    let base = cal.host_base_cycles.get(&poll).copied().unwrap_or(60.0);
    t.insert(
        poll,
        HostCost {
            base_cycles: base,
            per_byte_cycles: 0.0,
            len_arg: None,
            max_bytes: 0,
        },
    );
    t
}

const OPS_DECLARED_ITER: [OpClass; 7] = [
    OpClass::Move,
    OpClass::Alu,
    OpClass::Branch,
    OpClass::Move,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Move,
];
const OPS_ENTRY_CHECK: [OpClass; 20] = [
    OpClass::Move,
    OpClass::Move,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Alu,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Move,
    OpClass::Move,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Alu,
    OpClass::Alu,
    OpClass::Move,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Alu,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Branch,
];
const OPS_POLL_ITER: [OpClass; 6] = [
    OpClass::Move,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Move,
    OpClass::Alu,
    OpClass::Branch,
];

/// Verifies `bytes` under `policy` with costs from `cal`.
pub fn verify(bytes: &[u8], policy: &Policy, cal: &Calibration) -> Result<Admission, Rejection> {
    let reject = |reasons: Vec<Reason>| Rejection {
        reasons,
        report: None,
    };
    let m = module::parse(bytes).map_err(|r| reject(vec![r]))?;
    let mut reasons = m.problems.clone();

    let (v, symbols) = Verifier::new(&m, policy, cal, &mut reasons);
    let (structures, edges) = check_operators(&m, &mut reasons);
    // Acyclic call graph.
    let order = match topo_order(&m, &edges) {
        Ok(o) => o,
        Err(cycle) => {
            reasons.push(Reason::Recursion {
                cycle: cycle.to_string(),
            });
            return Err(reject(reasons));
        }
    };
    let declared = resolve_declared(&m, &symbols, &mut reasons);
    let bounds = v.bound_loops(&structures, &declared, &mut reasons);
    if !reasons.is_empty() {
        return Err(reject(reasons));
    }

    let costs = v.analyse_costs(&structures, &order, &bounds);
    let depth = stack_depths(&m, &order, &edges);
    let entries = v.entry_reports(&costs, &depth, &mut reasons);
    // What to instrument: declared-bound loops and poll points.
    let plan = instrument::Plan {
        declared: bounds.declared_loops,
        entry_checks: bounds.entry_checks,
        polls: costs.polls,
        n_imported: m.n_imported(),
    };
    let mut adm = Admission {
        entries,
        loops: loop_reports(&m, &costs.cycles, &bounds.sources, &plan),
        module: Vec::new(),
        instrumented: false,
        batch_max: v.batch_max,
        limit_cycles: v.limit_cycles(),
        inflated_cycles: v.limit_cycles() * policy.inflation,
        calibration: cal.machine.clone(),
        working_set_bytes: costs.ws,
        report: String::new(),
    };
    adm.report = render_report(&adm, policy, cal);
    if !reasons.is_empty() {
        return Err(Rejection {
            reasons,
            report: Some(adm.report),
        });
    }
    if plan.is_empty() {
        adm.module = bytes.to_vec();
    } else {
        adm.module = instrument::rewrite(bytes, &plan)
            .map_err(|e| reject(vec![Reason::Malformed(e.to_string())]))?;
        adm.instrumented = true;
    }
    Ok(adm)
}

/// What every phase of [`verify`] needs: the module, the policy, the calibration and
/// the module's batch entries.
struct Verifier<'a> {
    m: &'a ModuleInfo<'a>,
    policy: &'a Policy,
    cal: &'a Calibration,
    /// The batch size `B`, if the module has batch entries.
    batch_max: Option<u32>,
    /// Functions exported as batch entries: their parameter `n` is 1..=B.
    batch_funcs: BTreeSet<u32>,
}

/// Loop bounds of every function and how they were established.
#[derive(Default)]
struct LoopBounds {
    /// Per function, per loop ordinal: the bound.
    cfgs: BTreeMap<u32, BTreeMap<u32, LoopCfg>>,
    sources: BTreeMap<(u32, u32), BoundSource>,
    /// Loops whose bound is declared, so enforced by instrumentation.
    declared_loops: BTreeMap<(u32, u32), u64>,
    /// Declared loops whose limit is known at entry: checked once there, not per iteration.
    entry_checks: BTreeMap<(u32, u32), loops::Counted>,
}

/// Results of the cost analysis.
struct Costs {
    /// The cycle cost model.
    model: CostModel,
    /// Working set the model's memory latencies are for, bytes.
    ws: u64,
    /// Poll points placed: every how many iterations, per (function, loop ordinal).
    polls: BTreeMap<(u32, u32), u64>,
    /// Cycle bounds with the poll points in place.
    cycles: BTreeMap<u32, FuncCost>,
    /// Fuel bounds with the poll points in place.
    fuel: BTreeMap<u32, FuncCost>,
}

/// Deepest stack per function: bytes and the call chain reaching them.
type Depths = BTreeMap<u32, (u64, Vec<u32>)>;

/// Declared bounds by (function, loop ordinal or `None` for all): (bound, expression).
type Declared = BTreeMap<(u32, Option<u32>), (u64, String)>;

impl<'a> Verifier<'a> {
    /// Checks the module's exports, batch size and memory against the policy (pushing
    /// the problems to `reasons`), and returns the verifier with the symbols declared
    /// bounds may use.
    fn new(
        m: &'a ModuleInfo<'a>,
        policy: &'a Policy,
        cal: &'a Calibration,
        reasons: &mut Vec<Reason>,
    ) -> (Self, BTreeMap<String, u64>) {
        if policy.require_abi {
            check_exports(m, reasons);
        }
        let batch_max = batch_size(m, reasons);
        let mut symbols = policy.symbols.clone();
        if let Some(b) = batch_max {
            symbols.insert(abi::BATCH_SYMBOL.into(), b as u64);
        }
        // Functions exported as batch entries: their parameter `n` is 1..=B.
        let batch_funcs: BTreeSet<u32> = m
            .exports
            .iter()
            .filter(|(n, f)| abi::is_batch(n) && *f >= m.n_imported())
            .map(|(_, f)| *f)
            .collect();
        if let Some((initial, _)) = m.memory
            && initial > policy.caps.memory_bytes
        {
            reasons.push(Reason::MemoryTooLarge {
                bytes: initial,
                cap: policy.caps.memory_bytes,
            });
        }
        let v = Verifier {
            m,
            policy,
            cal,
            batch_max,
            batch_funcs,
        };
        (v, symbols)
    }

    /// The acceptable limit per input buffer, cycles.
    fn limit_cycles(&self) -> f64 {
        self.policy.acceptable_limit_ns * self.cal.tsc_per_ns
    }

    /// The acceptable limit of function `f`, cycles. A batch entry handles up to B
    /// inputs, which arrive in no less than B minimum inter-arrival times: its limit is
    /// B × the per-buffer limit.
    fn limit_of(&self, f: u32) -> f64 {
        let batch_factor = self.batch_max.unwrap_or(1) as f64;
        if self.batch_funcs.contains(&f) {
            self.limit_cycles() * batch_factor
        } else {
            self.limit_cycles()
        }
    }

    /// Loop bounds: proven, else declared, else rejected (pushed to `reasons`).
    fn bound_loops(
        &self,
        structures: &BTreeMap<u32, Structure>,
        declared: &Declared,
        reasons: &mut Vec<Reason>,
    ) -> LoopBounds {
        let mut out = LoopBounds::default();
        for b in &self.m.bodies {
            let st = &structures[&b.index];
            out.cfgs.entry(b.index).or_default();
            for ord in 0..st.loops.len() {
                self.bound_loop(b, st, ord as u32, declared, &mut out, reasons);
            }
        }
        out
    }

    /// The bound of loop `ord` of body `b` (structure `st`), recorded in `out`; or why
    /// it has none acceptable, pushed to `reasons`.
    fn bound_loop(
        &self,
        b: &module::Body<'_>,
        st: &Structure,
        ord: u32,
        declared: &Declared,
        out: &mut LoopBounds,
        reasons: &mut Vec<Reason>,
    ) {
        let lf = st.loops[ord as usize];
        let off = b.ops[st.frames[lf].open].0;
        let decl = declared.get(&(b.index, Some(ord)));
        let known = self
            .batch_max
            .filter(|_| self.batch_funcs.contains(&b.index))
            .map(|bm| loops::KnownRange {
                local: 0,
                lo: 1,
                hi: bm as u64,
            });
        let proof = loops::prove_in(b, st, lf, known);
        let (bound, src) = match (proof, decl) {
            (LoopProof::Proven { iterations, how }, d) => {
                // A declaration tighter than the proof is still enforced.
                match d {
                    Some((v, e)) if *v < iterations => {
                        out.declared_loops.insert((b.index, ord), *v);
                        (*v, BoundSource::Declared(e.clone()))
                    }
                    _ => (iterations, BoundSource::Proven(how)),
                }
            }
            (LoopProof::NotProven(why, counted), _) => {
                match decl.or_else(|| declared.get(&(b.index, None))) {
                    Some((v, e)) => {
                        out.declared_loops.insert((b.index, ord), *v);
                        if let Some(c) = counted
                            && entry_check_fits(*v, &c)
                        {
                            out.entry_checks.insert((b.index, ord), c);
                        }
                        (*v, BoundSource::Declared(e.clone()))
                    }
                    None => {
                        reasons.push(Reason::UnboundedLoop {
                            func: self.m.func_name(b.index),
                            ordinal: ord,
                            offset: off,
                            why,
                        });
                        return;
                    }
                }
            }
        };
        if bound > self.policy.max_declared_bound {
            reasons.push(Reason::HugeDeclaredBound {
                func: self.m.func_name(b.index),
                ordinal: ord,
                offset: off,
                bound,
                max: self.policy.max_declared_bound,
            });
            return;
        }
        out.cfgs.entry(b.index).or_default().insert(
            ord,
            LoopCfg {
                bound,
                extra_iter: 0.0,
                extra_entry: 0.0,
            },
        );
        out.sources.insert((b.index, ord), src);
    }

    /// Cost analysis: bounds without poll points, poll points where an entry exceeds
    /// the acceptable limit, then cycle and fuel bounds with them in place.
    fn analyse_costs(
        &self,
        structures: &BTreeMap<u32, Structure>,
        order: &[u32],
        bounds: &LoopBounds,
    ) -> Costs {
        let m = self.m;
        let ws = m
            .memory
            .map(|x| x.0)
            .unwrap_or(0)
            .max(self.policy.caps.scratch_bytes);
        let model = CostModel::cycles(self.cal, ws, host_costs(self.cal, &self.policy.caps));
        let fuel = CostModel::fuel();
        let run = |model: &CostModel, cfgs: &BTreeMap<u32, BTreeMap<u32, LoopCfg>>| {
            analyse_all(m, order, structures, model, cfgs)
        };
        let no_polls = BTreeMap::new();
        let first = run(&model, &bounds.with_extras(&no_polls, &model));
        let polls = self.place_polls(&first, structures, &model);
        let cycles = run(&model, &bounds.with_extras(&polls, &model));
        let fuel_costs = run(&fuel, &bounds.with_extras(&polls, &fuel));
        Costs {
            model,
            ws,
            polls,
            cycles,
            fuel: fuel_costs,
        }
    }

    /// Poll points: only if some entry exceeds the acceptable limit, and only in the
    /// innermost loops whose whole execution exceeds it.
    fn place_polls(
        &self,
        first: &BTreeMap<u32, FuncCost>,
        structures: &BTreeMap<u32, Structure>,
        model: &CostModel,
    ) -> BTreeMap<(u32, u32), u64> {
        let mut polls: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        let any_over = entry_points(self.m).iter().any(|(_, f)| {
            first
                .get(f)
                .is_some_and(|c| model.invoke + c.bound > self.limit_of(*f))
        });
        if !any_over {
            return polls;
        }
        for (f, fc) in first {
            let st = &structures[f];
            // A batch entry's own loops run within the batch's limit (B × the limit).
            let lim = self.limit_of(*f);
            for l in &fc.loops {
                if l.total <= lim || l.iterations <= 1 {
                    continue;
                }
                let lf = st.loops[l.ordinal as usize];
                let inner_over = fc.loops.iter().any(|o| {
                    o.ordinal != l.ordinal
                        && o.total > lim
                        && o.iterations > 1
                        && st.within(st.loops[o.ordinal as usize], lf)
                });
                if !inner_over {
                    let every = ((lim / l.per_iter.max(1.0)).floor() as u64).max(1);
                    polls.insert((*f, l.ordinal), every);
                }
            }
        }
        polls
    }

    /// The report of every entry point; an entry too deep or over its budget is
    /// pushed to `reasons`.
    fn entry_reports(
        &self,
        costs: &Costs,
        depth: &Depths,
        reasons: &mut Vec<Reason>,
    ) -> Vec<EntryReport> {
        let mut entries = Vec::new();
        for (name, f) in &entry_points(self.m) {
            let Some(c) = costs.cycles.get(f) else {
                continue;
            };
            entries.push(self.entry_report(name, *f, c, costs, depth, reasons));
        }
        entries
    }

    /// The report of entry point `name` (function `f`, cycle result `c`), checking its
    /// stack depth and its bound against its budget.
    fn entry_report(
        &self,
        name: &str,
        f: u32,
        c: &FuncCost,
        costs: &Costs,
        depth: &Depths,
        reasons: &mut Vec<Reason>,
    ) -> EntryReport {
        const HOST_MARGIN: u64 = 16 << 10;
        let (m, policy) = (self.m, self.policy);
        let bound = costs.model.invoke + c.bound;
        let (stack_bytes, chain) = depth.get(&f).cloned().unwrap_or_default();
        let stack_bytes = stack_bytes + HOST_MARGIN;
        if stack_bytes > policy.max_stack_bytes {
            reasons.push(Reason::StackTooDeep {
                bytes: stack_bytes,
                cap: policy.max_stack_bytes,
                chain: chain
                    .iter()
                    .map(|g| m.func_name(*g))
                    .collect::<Vec<_>>()
                    .join(" → "),
            });
        }
        let batch = (abi::is_batch(name) && self.batch_funcs.contains(&f))
            .then_some(self.batch_max)
            .flatten();
        let lim = self.limit_of(f);
        let admitted = bound <= lim * policy.inflation;
        let handler = abi::is_handler(name);
        if !admitted {
            reasons.push(Reason::OverBudget {
                handler: name.to_string(),
                batch,
                bound_cycles: bound,
                inflated_cycles: lim * policy.inflation,
                limit_cycles: lim,
                inflation: policy.inflation,
            });
        }
        let path_steps = analysis::steps(&c.path);
        let path = path_steps.iter().map(|s| describe_step(m, s)).collect();
        EntryReport {
            name: name.to_string(),
            func: f,
            handler,
            batch,
            bound_cycles: bound,
            bound_ns: bound / self.cal.tsc_per_ns,
            bound_fuel: costs.fuel.get(&f).map(|c| c.bound).unwrap_or(0.0),
            stack_bytes,
            admitted,
            over_limit: bound > lim,
            path,
            dominant_loops: dominant_loops(m, &costs.cycles, f, bound),
        }
    }
}

impl LoopBounds {
    /// The loop configurations with the costs instrumentation adds under `model`:
    /// entry checks, per-iteration counters of declared bounds, and the poll points
    /// `polls`.
    fn with_extras(
        &self,
        polls: &BTreeMap<(u32, u32), u64>,
        model: &CostModel,
    ) -> BTreeMap<u32, BTreeMap<u32, LoopCfg>> {
        let mut out = self.cfgs.clone();
        let c = |k: OpClass| {
            if model.fuel {
                1.0
            } else {
                model.class.get(&k).copied().unwrap_or(1.0)
            }
        };
        for (f, ls) in out.iter_mut() {
            for (o, cfg) in ls.iter_mut() {
                if self.entry_checks.contains_key(&(*f, *o)) {
                    cfg.extra_entry += OPS_ENTRY_CHECK.iter().map(|k| c(*k)).sum::<f64>();
                } else if self.declared_loops.contains_key(&(*f, *o)) {
                    cfg.extra_iter += OPS_DECLARED_ITER.iter().map(|k| c(*k)).sum::<f64>();
                    cfg.extra_entry += 2.0 * c(OpClass::Move);
                }
                if let Some(p) = polls.get(&(*f, *o)) {
                    let poll_host = if model.fuel {
                        0.0
                    } else {
                        model.host_call(
                            &format!("{}.{}", abi::INJECT_MODULE, abi::INJECT_POLL),
                            None,
                        )
                    };
                    let every = c(OpClass::Call) + poll_host + 2.0 * c(OpClass::Move);
                    cfg.extra_iter +=
                        OPS_POLL_ITER.iter().map(|k| c(*k)).sum::<f64>() + every / *p as f64;
                    cfg.extra_entry += 2.0 * c(OpClass::Move);
                }
            }
        }
        out
    }
}

/// Whether a declared bound `v` of counted loop `c` can be checked once at loop entry:
/// the counter's last value, `(v-1) × step`, must fit its width.
fn entry_check_fits(v: u64, c: &loops::Counted) -> bool {
    let limit = (v.saturating_sub(1) as i128) * c.step as i128;
    let max = if c.wide {
        i64::MAX as i128
    } else {
        i32::MAX as i128
    };
    limit <= max
}

/// Checks every operator of every body — admitted classes only, no `memory.grow`,
/// bounded `call_indirect` — pushing problems to `reasons`. Returns each body's control
/// structure and the call graph (edges from caller to defined callees).
fn check_operators(
    m: &ModuleInfo<'_>,
    reasons: &mut Vec<Reason>,
) -> (BTreeMap<u32, Structure>, BTreeMap<u32, BTreeSet<u32>>) {
    let mut structures: BTreeMap<u32, Structure> = BTreeMap::new();
    let mut edges: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for b in &m.bodies {
        let fname = m.func_name(b.index);
        let e = edges.entry(b.index).or_default();
        for (off, op) in &b.ops {
            match op {
                Operator::MemoryGrow { .. } => reasons.push(Reason::MemoryGrow {
                    func: fname.clone(),
                    offset: *off,
                }),
                Operator::Call { function_index } => {
                    if *function_index >= m.n_imported() {
                        e.insert(*function_index);
                    }
                }
                Operator::CallIndirect {
                    type_index,
                    table_index,
                } => check_indirect_call(m, &fname, *off, (*type_index, *table_index), e, reasons),
                _ => {
                    if let Some(r) = bad_operator(&fname, *off, op) {
                        reasons.push(r);
                    }
                }
            }
        }
        structures.insert(b.index, Structure::new(b));
    }
    (structures, edges)
}

/// A `call_indirect` of `(type index, table index)` at offset `off` in function
/// `fname`: its possible targets become call-graph edges `e`, provided the table is
/// safe to reason about and holds no host import of that type.
fn check_indirect_call(
    m: &ModuleInfo<'_>,
    fname: &str,
    off: usize,
    (type_index, table_index): (u32, u32),
    e: &mut BTreeSet<u32>,
    reasons: &mut Vec<Reason>,
) {
    if let Some(why) = &m.table_unsafe {
        reasons.push(Reason::IndirectCall {
            func: fname.to_string(),
            offset: off,
            why: why.clone(),
        });
    } else if table_index != 0 || !m.has_table {
        reasons.push(Reason::IndirectCall {
            func: fname.to_string(),
            offset: off,
            why: "no such table".into(),
        });
    } else {
        let want = m.types.get(type_index as usize);
        for f in m.table.values() {
            if m.func_type(*f) == want {
                if *f < m.n_imported() {
                    reasons.push(Reason::IndirectCall {
                        func: fname.to_string(),
                        offset: off,
                        why: format!("the table holds host import {}", m.func_name(*f)),
                    });
                } else {
                    e.insert(*f);
                }
            }
        }
    }
}

/// Why `op` (at offset `off` in function `fname`) is not admitted, if it is not.
fn bad_operator(fname: &str, off: usize, op: &Operator<'_>) -> Option<Reason> {
    if cost::classify(op).is_some() {
        return None;
    }
    let name = format!("{op:?}");
    let name = name
        .split([' ', '{', '('])
        .next()
        .unwrap_or("?")
        .to_string();
    let why = match op {
        Operator::TableSet { .. }
        | Operator::TableGrow { .. }
        | Operator::TableFill { .. }
        | Operator::TableCopy { .. }
        | Operator::TableInit { .. }
        | Operator::ElemDrop { .. }
        | Operator::TableGet { .. }
        | Operator::TableSize { .. } => "tables are immutable for admitted modules",
        Operator::MemoryInit { .. } | Operator::DataDrop { .. } => {
            "passive data segments are not admitted"
        }
        _ => "not in sidecore's admitted instruction set",
    };
    Some(Reason::BadOperator {
        func: fname.to_string(),
        offset: off,
        op: name,
        why: why.into(),
    })
}

/// The function a declared bound names: by index, export name or `name`-section name.
fn declared_func(m: &ModuleInfo<'_>, sel: &FuncSel) -> Option<u32> {
    match sel {
        FuncSel::Index(i) => Some(*i),
        FuncSel::Name(n) => m
            .exports
            .iter()
            .find(|(e, _)| e == n)
            .map(|(_, i)| *i)
            .or_else(|| m.names.iter().find(|(_, v)| *v == n).map(|(k, _)| *k)),
    }
}

/// Resolves the module's declared bounds against `symbols`; a declaration naming no
/// defined function or using an unknown symbol is pushed to `reasons`.
fn resolve_declared(
    m: &ModuleInfo<'_>,
    symbols: &BTreeMap<String, u64>,
    reasons: &mut Vec<Reason>,
) -> Declared {
    let mut declared: Declared = BTreeMap::new();
    for d in &m.declared {
        let f = declared_func(m, &d.func);
        let Some(f) = f.filter(|f| m.body(*f).is_some()) else {
            reasons.push(Reason::BadDeclaredBound(format!(
                "line {}: no defined function {:?}",
                d.line, d.func
            )));
            continue;
        };
        match d.max.resolve(symbols) {
            Ok(v) => {
                let key = (
                    f,
                    match d.lp {
                        LoopSel::Ordinal(o) => Some(o),
                        LoopSel::All => None,
                    },
                );
                declared.insert(key, (v, d.max.to_string()));
            }
            Err(e) => reasons.push(Reason::BadDeclaredBound(format!("line {}: {e}", d.line))),
        }
    }
    declared
}

/// Analyses every function in `order` (callees first) under `model` with loop
/// configurations `cfgs`.
fn analyse_all(
    m: &ModuleInfo<'_>,
    order: &[u32],
    structures: &BTreeMap<u32, Structure>,
    model: &CostModel,
    cfgs: &BTreeMap<u32, BTreeMap<u32, LoopCfg>>,
) -> BTreeMap<u32, FuncCost> {
    let mut done: BTreeMap<u32, FuncCost> = BTreeMap::new();
    for &f in order {
        let st = &structures[&f];
        let empty = BTreeMap::new();
        let lc = cfgs.get(&f).unwrap_or(&empty);
        let callee = |g: u32| done.get(&g).map(|c| c.bound).unwrap_or(0.0);
        let indirect = |t: u32| {
            let want = m.types.get(t as usize);
            m.table
                .values()
                .filter(|g| m.func_type(**g) == want)
                .map(|g| callee(*g))
                .fold(0.0, f64::max)
        };
        let r = analyse_function(m, f, st, model, lc, &callee, &indirect);
        done.insert(f, r);
    }
    done
}

/// Stack depth along the deepest call chain from every function.
fn stack_depths(m: &ModuleInfo<'_>, order: &[u32], edges: &BTreeMap<u32, BTreeSet<u32>>) -> Depths {
    let frame_bytes = |f: u32| -> u64 {
        let b = m.body(f).expect("body");
        let slots = b.ty.params().len() as u64 + b.n_locals as u64 + b.max_height as u64;
        slots * 8 + 64
    };
    let mut depth: Depths = BTreeMap::new();
    for &f in order {
        let mut best = (0u64, Vec::new());
        for g in edges.get(&f).into_iter().flatten() {
            if let Some(d) = depth.get(g)
                && d.0 > best.0
            {
                best = d.clone();
            }
        }
        let mut chain = vec![f];
        chain.extend(best.1);
        depth.insert(f, (frame_bytes(f).saturating_add(best.0), chain));
    }
    depth
}

/// The (at most three) loops dominating function `f`'s bound `bound`, described.
fn dominant_loops(
    m: &ModuleInfo<'_>,
    cycles: &BTreeMap<u32, FuncCost>,
    f: u32,
    bound: f64,
) -> Vec<String> {
    let mut doms: Vec<(f64, String)> = Vec::new();
    collect_loops(m, cycles, f, &mut doms, 1.0, 0);
    doms.sort_by(|a, b| b.0.total_cmp(&a.0));
    doms.into_iter()
        .take(3)
        .map(|(cost, s)| {
            format!(
                "{s}: {cost:.0} cycles ({:.0}% of the bound)",
                100.0 * cost / bound.max(1.0)
            )
        })
        .collect()
}

/// The report of every loop of the module, with how its bound was established and
/// how `plan` instruments it.
fn loop_reports(
    m: &ModuleInfo<'_>,
    cycles: &BTreeMap<u32, FuncCost>,
    sources: &BTreeMap<(u32, u32), BoundSource>,
    plan: &instrument::Plan,
) -> Vec<LoopReport> {
    let mut loops_out = Vec::new();
    for (f, fc) in cycles {
        for l in &fc.loops {
            loops_out.push(LoopReport {
                func: *f,
                func_name: m.func_name(*f),
                ordinal: l.ordinal,
                offset: l.offset,
                iterations: l.iterations,
                source: sources
                    .get(&(*f, l.ordinal))
                    .cloned()
                    .unwrap_or(BoundSource::Proven(String::new())),
                per_iter_cycles: l.per_iter,
                total_cycles: l.total,
                poll_every: plan.polls.get(&(*f, l.ordinal)).copied(),
                checked_at_entry: plan.entry_checks.contains_key(&(*f, l.ordinal)),
                declared_id: plan.declared_id((*f, l.ordinal)),
            });
        }
    }
    loops_out
}

fn collect_loops(
    m: &ModuleInfo<'_>,
    costs: &BTreeMap<u32, FuncCost>,
    f: u32,
    out: &mut Vec<(f64, String)>,
    mult: f64,
    depth: u32,
) {
    if depth > 8 {
        return;
    }
    let Some(fc) = costs.get(&f) else { return };
    for l in &fc.loops {
        out.push((
            l.total * mult,
            format!(
                "loop #{} in {} at {:#x} (×{}, {:.0} cycles/iteration)",
                l.ordinal,
                m.func_name(f),
                l.offset,
                l.iterations,
                l.per_iter
            ),
        ));
    }
    if let Some(b) = m.body(f) {
        let mut seen = BTreeSet::new();
        for (_, op) in &b.ops {
            if let Operator::Call { function_index } = op
                && *function_index >= m.n_imported()
                && seen.insert(*function_index)
            {
                collect_loops(m, costs, *function_index, out, mult, depth + 1);
            }
        }
    }
}

fn describe_step(m: &ModuleInfo<'_>, s: &Step) -> String {
    match s {
        Step::Loop {
            func,
            ordinal,
            offset,
            iterations,
            per_iter,
            total,
        } => format!(
            "loop #{ordinal} in {} at {offset:#x}: {iterations} iterations × ≤{per_iter:.0} cycles = {total:.0}",
            m.func_name(*func)
        ),
        Step::If { offset, then } => format!(
            "if at {offset:#x}: {} arm",
            if *then { "then" } else { "else" }
        ),
        Step::BrIf { offset } => format!("br_if at {offset:#x} taken"),
        Step::BrTable { offset, arm } => format!("br_table at {offset:#x}: arm {arm}"),
        Step::Call { callee, cost } => format!("call {} ({cost:.0} cycles)", m.func_name(*callee)),
        Step::Host { name, cost } => format!("host call {name} ({cost:.0} cycles)"),
        Step::Exit { offset, trap } => {
            if *trap {
                format!("trap at {offset:#x}")
            } else {
                format!("return at {offset:#x}")
            }
        }
    }
}

fn render_report(a: &Admission, p: &Policy, cal: &Calibration) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "acceptable limit {:.0} ns = {:.0} cycles; inflation {} → inflated limit {:.0} cycles; working set {} bytes; calibration: {}",
        p.acceptable_limit_ns,
        a.limit_cycles,
        p.inflation,
        a.inflated_cycles,
        a.working_set_bytes,
        cal.machine
    );
    for e in &a.entries {
        let _ = writeln!(
            s,
            "{} `{}`{}: bound {:.0} cycles ({:.0} ns, {:.0} fuel units), stack ≤ {} bytes — {}{}",
            if e.handler {
                "handler"
            } else if e.batch.is_some() {
                "batch entry"
            } else {
                "entry"
            },
            e.name,
            e.batch
                .map(|b| format!(
                    " (B = {b}; limit {:.0} × {b} = {:.0} cycles, inflated {:.0})",
                    a.limit_cycles,
                    a.limit_cycles * b as f64,
                    a.inflated_cycles * b as f64
                ))
                .unwrap_or_default(),
            e.bound_cycles,
            e.bound_ns,
            e.bound_fuel,
            e.stack_bytes,
            if e.admitted { "ADMITTED" } else { "REJECTED" },
            if e.over_limit && e.admitted {
                " (over the acceptable limit: poll points placed)"
            } else {
                ""
            }
        );
        if !e.path.is_empty() {
            let _ = writeln!(s, "  worst path:");
            for st in e.path.iter().take(24) {
                let _ = writeln!(s, "    {st}");
            }
            if e.path.len() > 24 {
                let _ = writeln!(s, "    … {} more steps", e.path.len() - 24);
            }
        }
        if !e.dominant_loops.is_empty() {
            let _ = writeln!(s, "  dominating loops:");
            for d in &e.dominant_loops {
                let _ = writeln!(s, "    {d}");
            }
        }
    }
    if !a.loops.is_empty() {
        let _ = writeln!(s, "loops:");
        for l in &a.loops {
            let src = match &l.source {
                BoundSource::Proven(h) => format!("proven: {h}"),
                BoundSource::Declared(e) if l.checked_at_entry => {
                    format!("declared {e}, enforced by one check at loop entry")
                }
                BoundSource::Declared(e) => format!("declared {e}, enforced per iteration"),
            };
            let _ = writeln!(
                s,
                "  {} loop #{} at {:#x}: ≤{} iterations ({src}); ≤{:.0} cycles/iteration, ≤{:.0} total{}",
                l.func_name,
                l.ordinal,
                l.offset,
                l.iterations,
                l.per_iter_cycles,
                l.total_cycles,
                l.poll_every
                    .map(|p| format!("; poll point every {p} iterations"))
                    .unwrap_or_default()
            );
        }
    }
    s
}

fn entry_points(m: &ModuleInfo<'_>) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = m
        .exports
        .iter()
        .filter(|(_, f)| *f >= m.n_imported())
        .cloned()
        .collect();
    if let Some(s) = m.start
        && s >= m.n_imported()
    {
        v.push(("(start)".into(), s));
    }
    v
}

fn check_exports(m: &ModuleInfo<'_>, reasons: &mut Vec<Reason>) {
    use wasmparser::ValType::I32;
    let sig = |name: &str,
               params: &[wasmparser::ValType],
               results: &[wasmparser::ValType],
               required: bool,
               reasons: &mut Vec<Reason>| {
        match m.exports.iter().find(|(n, _)| n == name) {
            None if required => reasons.push(Reason::MissingExport(name.into())),
            None => {}
            Some((_, f)) => {
                if let Some(t) = m.func_type(*f)
                    && (t.params() != params || t.results() != results)
                {
                    reasons.push(Reason::BadExportType {
                        name: name.into(),
                        got: format!("{:?} -> {:?}", t.params(), t.results()),
                        want: format!("{params:?} -> {results:?}"),
                    });
                }
            }
        }
    };
    if m.memory.is_none() {
        reasons.push(Reason::MissingExport("memory".into()));
    }
    sig("sc_input_ptr", &[], &[I32], true, reasons);
    sig("sc_input_cap", &[], &[I32], true, reasons);
    sig("sc_init", &[], &[], false, reasons);
    let handlers: Vec<String> = m
        .exports
        .iter()
        .filter(|(n, _)| abi::is_handler(n))
        .map(|(n, _)| n.clone())
        .collect();
    if handlers.is_empty() {
        reasons.push(Reason::MissingExport("handle (or handle_<input>)".into()));
    }
    for h in handlers {
        sig(&h, &[I32], &[I32], true, reasons);
    }
    let batches: Vec<String> = m
        .exports
        .iter()
        .filter(|(n, _)| abi::is_batch(n))
        .map(|(n, _)| n.clone())
        .collect();
    if !batches.is_empty() {
        sig(abi::EXPORT_BATCH_MAX, &[], &[I32], true, reasons);
        sig(abi::EXPORT_BATCH_PTR, &[], &[I32], true, reasons);
    }
    for b in batches {
        sig(&b, &[I32], &[I32], true, reasons);
    }
}

/// The module's batch size `B`: the constant `sc_batch_max` returns, read from its
/// bytecode (a body of exactly `i32.const B`). None if the module has no batch entry.
fn batch_size(m: &ModuleInfo<'_>, reasons: &mut Vec<Reason>) -> Option<u32> {
    if !m.exports.iter().any(|(n, _)| abi::is_batch(n)) {
        return None;
    }
    let f = m
        .exports
        .iter()
        .find(|(n, _)| n == abi::EXPORT_BATCH_MAX)
        .map(|(_, f)| *f)?;
    let Some(body) = m.body(f) else {
        reasons.push(Reason::BadBatch(format!(
            "`{}` must be a function of the module returning a constant",
            abi::EXPORT_BATCH_MAX
        )));
        return None;
    };
    let ops: Vec<&Operator<'_>> = body
        .ops
        .iter()
        .map(|(_, op)| op)
        .filter(|op| !matches!(op, Operator::Nop))
        .collect();
    let b = match ops.as_slice() {
        [Operator::I32Const { value }, Operator::End] => *value,
        _ => {
            reasons.push(Reason::BadBatch(format!(
                "`{}` must be exactly `i32.const B` (the verifier bounds batch loops by B), got {} operators",
                abi::EXPORT_BATCH_MAX,
                ops.len()
            )));
            return None;
        }
    };
    if b < 1 || b as u32 > abi::BATCH_LIMIT {
        reasons.push(Reason::BadBatch(format!(
            "batch size B = {b} from `{}` is outside 1..={}",
            abi::EXPORT_BATCH_MAX,
            abi::BATCH_LIMIT
        )));
        return None;
    }
    Some(b as u32)
}

/// A cycle of the call graph, by function names (the first one repeated at the end).
#[derive(Debug)]
struct Cycle(Vec<String>);

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.len() == 2 {
            write!(f, "{} calls itself", self.0[0])
        } else {
            f.write_str(&self.0.join(" → "))
        }
    }
}

/// Callees-first order of the defined functions, or a cycle.
///
/// Hand-written iterative DFS (a few lines) rather than a graph crate: the graph is
/// small and we need the cycle's path for the message.
fn topo_order(m: &ModuleInfo<'_>, edges: &BTreeMap<u32, BTreeSet<u32>>) -> Result<Vec<u32>, Cycle> {
    #[derive(Clone, Copy, PartialEq)]
    enum Color {
        White,
        Grey,
        Black,
    }
    let mut color: BTreeMap<u32, Color> = edges.keys().map(|k| (*k, Color::White)).collect();
    let mut order = Vec::new();
    for &root in edges.keys() {
        if color[&root] != Color::White {
            continue;
        }
        let mut stack: Vec<(u32, Vec<u32>)> = vec![(root, edges[&root].iter().copied().collect())];
        color.insert(root, Color::Grey);
        while let Some((node, rest)) = stack.last_mut() {
            if let Some(next) = rest.pop() {
                match color.get(&next).copied().unwrap_or(Color::Black) {
                    Color::White => {
                        color.insert(next, Color::Grey);
                        let succ = edges
                            .get(&next)
                            .map(|s| s.iter().copied().collect())
                            .unwrap_or_default();
                        stack.push((next, succ));
                    }
                    Color::Grey => {
                        let pos = stack.iter().position(|(n, _)| *n == next).unwrap_or(0);
                        let mut names: Vec<String> =
                            stack[pos..].iter().map(|(n, _)| m.func_name(*n)).collect();
                        names.push(m.func_name(next));
                        return Err(Cycle(names));
                    }
                    Color::Black => {}
                }
            } else {
                let n = *node;
                color.insert(n, Color::Black);
                order.push(n);
                stack.pop();
            }
        }
    }
    Ok(order)
}
