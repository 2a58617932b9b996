//! Worst-case cost of every function: the longest path through its structured control
//! flow, taking the maximum over the arms of `if`, `br_if` and `br_table` (never the sum,
//! which was CAT's worst flaw, thesis §5.2.2), loops collapsed into `(B-1) × worst
//! back-edge iteration + worst exit`, calls charged their callee's bound (callees first,
//! in reverse topological order of the acyclic call graph) and host calls charged from
//! the per-call table. The analysis also keeps a witness path for the report.

use std::collections::BTreeMap;
use std::rc::Rc;

use wasmparser::Operator;

use crate::cost::{CostModel, OpClass, classify};
use crate::loops::{FrameKind, Structure};
use crate::module::ModuleInfo;

/// One step of a witness path.
#[derive(Debug, Clone)]
pub enum Step {
    Loop {
        func: u32,
        ordinal: u32,
        offset: usize,
        iterations: u64,
        per_iter: f64,
        total: f64,
    },
    If {
        offset: usize,
        then: bool,
    },
    BrIf {
        offset: usize,
    },
    BrTable {
        offset: usize,
        arm: usize,
    },
    Call {
        callee: u32,
        cost: f64,
    },
    Host {
        name: String,
        cost: f64,
    },
    Exit {
        offset: usize,
        trap: bool,
    },
}

#[derive(Debug)]
pub struct Node {
    pub step: Step,
    pub prev: Path,
}
pub type Path = Option<Rc<Node>>;

/// Steps of a path, first to last.
pub fn steps(p: &Path) -> Vec<Step> {
    let mut v = Vec::new();
    let mut cur = p.clone();
    while let Some(n) = cur {
        v.push(n.step.clone());
        cur = n.prev.clone();
    }
    v.reverse();
    v
}

fn push(p: &Path, step: Step) -> Path {
    Some(Rc::new(Node {
        step,
        prev: p.clone(),
    }))
}

fn append(base: &Path, rel: &Path) -> Path {
    let mut out = base.clone();
    for s in steps(rel) {
        out = push(&out, s);
    }
    out
}

/// A path's cost with its witness; `None` = unreachable.
#[derive(Debug, Clone)]
pub struct PV {
    pub cost: f64,
    pub path: Path,
}

fn pmax(a: Option<PV>, b: Option<PV>) -> Option<PV> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.cost > x.cost { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Per-loop input to the analysis: its bound and extra costs the instrumentation adds.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopCfg {
    pub bound: u64,
    /// Added once per body start (declared-bound counter, poll-point counter).
    pub extra_iter: f64,
    /// Added once per entry into the loop (counter initialisation).
    pub extra_entry: f64,
}

/// Per-loop result.
#[derive(Debug, Clone)]
pub struct LoopCost {
    pub func: u32,
    pub ordinal: u32,
    pub offset: usize,
    pub iterations: u64,
    /// Worst cost of one iteration ending in a back edge (or an exit).
    pub per_iter: f64,
    /// Worst cost of one complete execution of the loop.
    pub total: f64,
}

/// Result for one function.
#[derive(Debug, Clone)]
pub struct FuncCost {
    pub bound: f64,
    pub path: Path,
    pub loops: Vec<LoopCost>,
}

struct CFrame {
    frame: usize,
    exit: Option<PV>,
    // if-frames
    if_start: Option<PV>,
    then_end: Option<PV>,
    seen_else: bool,
    // loop frames
    entry: Option<PV>,
    back: Option<PV>,
    pending: Vec<(usize, PV)>,
    lcfg: LoopCfg,
}

/// Analyses one function. `callee` gives the bound of any function already analysed;
/// `indirect` the candidate targets of a `call_indirect` type index.
#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one pass over shared analysis state, left whole this session
pub fn analyse_function(
    m: &ModuleInfo<'_>,
    fidx: u32,
    st: &Structure,
    model: &CostModel,
    loops: &BTreeMap<u32, LoopCfg>,
    callee: &dyn Fn(u32) -> f64,
    indirect: &dyn Fn(u32) -> f64,
) -> FuncCost {
    let body = m.body(fidx).expect("analysed function has a body");
    let mut stack: Vec<CFrame> = vec![CFrame::new(0)];
    // wasmtime charges one fuel unit per function activation beyond its operators
    // (measured on wasmtime 48); cycles for the call itself are in the caller's `call`.
    let entry = if model.fuel { 1.0 } else { 0.0 };
    let mut cur: Option<PV> = Some(PV {
        cost: entry,
        path: None,
    });
    let mut result: Option<PV> = None;
    let mut loop_costs = Vec::new();
    let ops = &body.ops;

    // Routes a branch value to stack frame `t` (index into `stack`).
    fn route(stack: &mut [CFrame], st: &Structure, t: usize, v: PV) {
        let innermost_loop = stack
            .iter()
            .rposition(|f| st.frames[f.frame].kind == FrameKind::Loop);
        match innermost_loop {
            Some(l) if l > t => stack[l].pending.push((t, v)),
            Some(l) if l == t => stack[t].back = pmax(stack[t].back.take(), Some(v)),
            _ => stack[t].exit = pmax(stack[t].exit.take(), Some(v)),
        }
    }

    for (i, (off, op)) in ops.iter().enumerate() {
        let class = classify(op).unwrap_or(OpClass::Alu);
        let mut c = model.op(op, class);
        // Calls add their callee's bound.
        let mut call_step = None;
        match op {
            Operator::Call { function_index } => {
                let f = *function_index;
                if f < m.n_imported() {
                    let imp = &m.imports[f as usize];
                    let full = format!("{}.{}", imp.module, imp.name);
                    let const_len = if i > 0 {
                        match &ops[i - 1].1 {
                            Operator::I32Const { value } => Some((*value).max(0) as u64),
                            _ => None,
                        }
                    } else {
                        None
                    };
                    let h = if model.fuel {
                        0.0
                    } else {
                        model.host_call(&full, const_len)
                    };
                    c += h;
                    call_step = Some(Step::Host {
                        name: full,
                        cost: h,
                    });
                } else {
                    let k = callee(f);
                    c += k;
                    call_step = Some(Step::Call { callee: f, cost: k });
                }
            }
            Operator::CallIndirect { type_index, .. } => {
                c += indirect(*type_index);
            }
            Operator::MemoryFill { .. } | Operator::MemoryCopy { .. } if !model.fuel => {
                let len = if i > 0 {
                    match &ops[i - 1].1 {
                        Operator::I32Const { value } => (*value).max(0) as u64,
                        _ => m.memory.map(|x| x.0).unwrap_or(0),
                    }
                } else {
                    0
                };
                c = model.op(op, OpClass::BulkByte) * len as f64 + model.op(op, OpClass::Call);
            }
            _ => {}
        }
        if let Some(p) = cur.as_mut() {
            p.cost += c;
            if let Some(s) = call_step
                && let Step::Call { cost, .. } | Step::Host { cost, .. } = &s
                && *cost > 0.0
            {
                p.path = push(&p.path, s);
            }
        }
        match op {
            Operator::Block { .. } => {
                stack.push(CFrame::new(st.opened[i].unwrap_or(0)));
            }
            Operator::Loop { .. } => {
                let fr = st.opened[i].unwrap_or(0);
                let ord = st.frames[fr].ordinal.unwrap_or(0);
                let lcfg = loops.get(&ord).copied().unwrap_or(LoopCfg {
                    bound: 1,
                    ..Default::default()
                });
                let mut f = CFrame::new(fr);
                f.entry = cur.clone().map(|mut p| {
                    p.cost += lcfg.extra_entry;
                    p
                });
                f.lcfg = lcfg;
                let reachable = f.entry.is_some();
                stack.push(f);
                cur = reachable.then_some(PV {
                    cost: 0.0,
                    path: None,
                });
            }
            Operator::If { .. } => {
                let mut f = CFrame::new(st.opened[i].unwrap_or(0));
                f.if_start = cur.clone().map(|p| PV {
                    cost: p.cost,
                    path: push(
                        &p.path,
                        Step::If {
                            offset: *off,
                            then: false,
                        },
                    ),
                });
                cur = cur.map(|p| PV {
                    cost: p.cost,
                    path: push(
                        &p.path,
                        Step::If {
                            offset: *off,
                            then: true,
                        },
                    ),
                });
                stack.push(f);
            }
            Operator::Else => {
                if let Some(top) = stack.last_mut() {
                    top.then_end = cur.take();
                    top.seen_else = true;
                    cur = top.if_start.take();
                }
            }
            Operator::End => {
                let Some(top) = stack.pop() else { break };
                let kind = st.frames[top.frame].kind;
                match kind {
                    FrameKind::Func => {
                        result = pmax(result, pmax(cur.take(), top.exit));
                        stack.push(CFrame::new(0)); // keep stack non-empty; body ends here
                    }
                    FrameKind::Block => cur = pmax(cur.take(), top.exit),
                    FrameKind::If => {
                        let other = if top.seen_else {
                            top.then_end
                        } else {
                            top.if_start
                        };
                        cur = pmax(pmax(cur.take(), other), top.exit);
                    }
                    FrameKind::Loop => {
                        let fr = &st.frames[top.frame];
                        let b = top.lcfg.bound.max(1);
                        let back_cost = top.back.as_ref().map(|p| p.cost + top.lcfg.extra_iter);
                        let iters_before = (b - 1) as f64;
                        let repeat = back_cost.map(|c| c * iters_before).unwrap_or(0.0);
                        let mut worst_exit: Option<f64> = cur.as_ref().map(|p| p.cost);
                        for (_, v) in &top.pending {
                            worst_exit = Some(worst_exit.unwrap_or(0.0).max(v.cost));
                        }
                        let last = worst_exit.unwrap_or(0.0) + top.lcfg.extra_iter;
                        let total = repeat + last;
                        let per_iter = back_cost.unwrap_or(0.0).max(last);
                        loop_costs.push(LoopCost {
                            func: fidx,
                            ordinal: fr.ordinal.unwrap_or(0),
                            offset: ops[fr.open].0,
                            iterations: if top.back.is_some() { b } else { 1 },
                            per_iter,
                            total,
                        });
                        let step = Step::Loop {
                            func: fidx,
                            ordinal: fr.ordinal.unwrap_or(0),
                            offset: ops[fr.open].0,
                            iterations: if top.back.is_some() { b } else { 1 },
                            per_iter,
                            total,
                        };
                        let abs = |rel: PV| -> Option<PV> {
                            let e = top.entry.as_ref()?;
                            let base = push(&e.path, step.clone());
                            Some(PV {
                                cost: e.cost + repeat + rel.cost + top.lcfg.extra_iter,
                                path: append(&base, &rel.path),
                            })
                        };
                        cur = cur.take().and_then(abs);
                        for (t, v) in top.pending {
                            if let Some(a) = abs(v) {
                                route(&mut stack, st, t, a);
                            }
                        }
                    }
                }
            }
            Operator::Br { .. }
            | Operator::BrIf { .. }
            | Operator::BrTable { .. }
            | Operator::Return => {
                let conditional = matches!(op, Operator::BrIf { .. });
                let targets: Vec<usize> = st.branch_targets(body, i);
                if let Some(v) = cur.clone() {
                    for (arm, t) in targets.iter().enumerate() {
                        let Some(si) = stack.iter().rposition(|f| f.frame == *t) else {
                            continue;
                        };
                        let step = match op {
                            Operator::BrIf { .. } => Some(Step::BrIf { offset: *off }),
                            Operator::BrTable { .. } => Some(Step::BrTable { offset: *off, arm }),
                            Operator::Return => Some(Step::Exit {
                                offset: *off,
                                trap: false,
                            }),
                            _ => None,
                        };
                        let pv = PV {
                            cost: v.cost,
                            path: match step {
                                Some(s) => push(&v.path, s),
                                None => v.path.clone(),
                            },
                        };
                        route(&mut stack, st, si, pv);
                    }
                }
                if !conditional {
                    cur = None;
                }
            }
            Operator::Unreachable => {
                // A trap ends the invocation: the path so far is a complete path.
                if let Some(v) = cur.take() {
                    let pv = PV {
                        cost: v.cost,
                        path: push(
                            &v.path,
                            Step::Exit {
                                offset: *off,
                                trap: true,
                            },
                        ),
                    };
                    route(&mut stack, st, 0, pv);
                }
            }
            _ => {}
        }
    }
    let r = result.unwrap_or(PV {
        cost: 0.0,
        path: None,
    });
    FuncCost {
        bound: r.cost,
        path: r.path,
        loops: loop_costs,
    }
}

impl CFrame {
    fn new(frame: usize) -> CFrame {
        CFrame {
            frame,
            exit: None,
            if_start: None,
            then_end: None,
            seen_else: false,
            entry: None,
            back: None,
            pending: Vec::new(),
            lcfg: LoopCfg::default(),
        }
    }
}
