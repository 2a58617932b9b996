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
use crate::module::{Body, ModuleInfo};

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
pub fn analyse_function(
    m: &ModuleInfo<'_>,
    fidx: u32,
    st: &Structure,
    model: &CostModel,
    loops: &BTreeMap<u32, LoopCfg>,
    callee: &dyn Fn(u32) -> f64,
    indirect: &dyn Fn(u32) -> f64,
) -> FuncCost {
    let mut a = FuncAnalysis::new(m, fidx, st, model, loops, callee, indirect);
    a.run();
    a.finish()
}

/// The state of one pass over a function body: the open frames, the worst path
/// reaching the current operator (`None` = unreachable) and what has been found so far.
struct FuncAnalysis<'a> {
    m: &'a ModuleInfo<'a>,
    fidx: u32,
    st: &'a Structure,
    model: &'a CostModel,
    loops: &'a BTreeMap<u32, LoopCfg>,
    callee: &'a dyn Fn(u32) -> f64,
    indirect: &'a dyn Fn(u32) -> f64,
    body: &'a Body<'a>,
    stack: Vec<CFrame>,
    cur: Option<PV>,
    result: Option<PV>,
    loop_costs: Vec<LoopCost>,
}

impl<'a> FuncAnalysis<'a> {
    /// Sets up the pass at the function's entry, with only the function frame open.
    fn new(
        m: &'a ModuleInfo<'a>,
        fidx: u32,
        st: &'a Structure,
        model: &'a CostModel,
        loops: &'a BTreeMap<u32, LoopCfg>,
        callee: &'a dyn Fn(u32) -> f64,
        indirect: &'a dyn Fn(u32) -> f64,
    ) -> Self {
        let body = m.body(fidx).expect("analysed function has a body");
        // wasmtime charges one fuel unit per function activation beyond its operators
        // (measured on wasmtime 48); cycles for the call itself are in the caller's `call`.
        let entry = if model.fuel { 1.0 } else { 0.0 };
        FuncAnalysis {
            m,
            fidx,
            st,
            model,
            loops,
            callee,
            indirect,
            body,
            stack: vec![CFrame::new(0)],
            cur: Some(PV {
                cost: entry,
                path: None,
            }),
            result: None,
            loop_costs: Vec::new(),
        }
    }

    /// Walks every operator in order: charges its cost to the current path, then
    /// applies its effect on control flow. Stops early at an `end` with no open frame.
    fn run(&mut self) {
        let body = self.body;
        for (i, (off, op)) in body.ops.iter().enumerate() {
            let (c, call_step) = self.op_cost(i, op);
            self.charge(c, call_step);
            if !self.control(i, *off, op) {
                break;
            }
        }
    }

    /// Applies the effect of operator `i` (at offset `off`) on control flow. Returns
    /// false if the walk must stop (an `end` with no open frame).
    fn control(&mut self, i: usize, off: usize, op: &Operator<'_>) -> bool {
        match op {
            Operator::Block { .. } => self.open_block(i),
            Operator::Loop { .. } => self.open_loop(i),
            Operator::If { .. } => self.open_if(i, off),
            Operator::Else => self.enter_else(),
            Operator::End => return self.end(),
            Operator::Br { .. }
            | Operator::BrIf { .. }
            | Operator::BrTable { .. }
            | Operator::Return => self.branch(i, off, op),
            Operator::Unreachable => self.trap(off),
            _ => {}
        }
        true
    }

    /// The worst path's cost and witness, and the loops found.
    fn finish(self) -> FuncCost {
        let r = self.result.unwrap_or(PV {
            cost: 0.0,
            path: None,
        });
        FuncCost {
            bound: r.cost,
            path: r.path,
            loops: self.loop_costs,
        }
    }

    /// The cost of operator `i` (calls add their callee's bound, bulk memory operators
    /// their length) and, for a call, the witness step naming it.
    fn op_cost(&self, i: usize, op: &Operator<'_>) -> (f64, Option<Step>) {
        let class = classify(op).unwrap_or(OpClass::Alu);
        let mut c = self.model.op(op, class);
        // Calls add their callee's bound.
        let mut call_step = None;
        match op {
            Operator::Call { function_index } => {
                let f = *function_index;
                if f < self.m.n_imported() {
                    let (h, step) = self.host_call(i, f);
                    c += h;
                    call_step = Some(step);
                } else {
                    let k = (self.callee)(f);
                    c += k;
                    call_step = Some(Step::Call { callee: f, cost: k });
                }
            }
            Operator::CallIndirect { type_index, .. } => {
                c += (self.indirect)(*type_index);
            }
            Operator::MemoryFill { .. } | Operator::MemoryCopy { .. } if !self.model.fuel => {
                c = self.bulk_memory_cost(i, op);
            }
            _ => {}
        }
        (c, call_step)
    }

    /// The value of the `i32.const` right before operator `i`, clamped at 0, if the
    /// previous operator is one.
    fn const_before(&self, i: usize) -> Option<u64> {
        if i > 0 {
            match &self.body.ops[i - 1].1 {
                Operator::I32Const { value } => Some((*value).max(0) as u64),
                _ => None,
            }
        } else {
            None
        }
    }

    /// The cost of host import `f` called at operator `i` (its length argument taken
    /// from a constant pushed last), with its witness step.
    fn host_call(&self, i: usize, f: u32) -> (f64, Step) {
        let imp = &self.m.imports[f as usize];
        let full = format!("{}.{}", imp.module, imp.name);
        let const_len = self.const_before(i);
        let h = if self.model.fuel {
            0.0
        } else {
            self.model.host_call(&full, const_len)
        };
        (
            h,
            Step::Host {
                name: full,
                cost: h,
            },
        )
    }

    /// The cycle cost of `memory.fill`/`memory.copy` at operator `i`: per byte of its
    /// length (a constant pushed last, else the whole memory) plus a call.
    fn bulk_memory_cost(&self, i: usize, op: &Operator<'_>) -> f64 {
        let len = if i > 0 {
            self.const_before(i)
                .unwrap_or_else(|| self.m.memory.map(|x| x.0).unwrap_or(0))
        } else {
            0
        };
        self.model.op(op, OpClass::BulkByte) * len as f64 + self.model.op(op, OpClass::Call)
    }

    /// Adds cost `c` to the current path, recording a call step that costs something.
    fn charge(&mut self, c: f64, call_step: Option<Step>) {
        if let Some(p) = self.cur.as_mut() {
            p.cost += c;
            if let Some(s) = call_step
                && let Step::Call { cost, .. } | Step::Host { cost, .. } = &s
                && *cost > 0.0
            {
                p.path = push(&p.path, s);
            }
        }
    }

    /// Routes a branch value to stack frame `t` (index into `stack`): to the innermost
    /// enclosing loop's pending exits if it lies outside that loop, to the loop's back
    /// edges if it is the loop, else to the frame's exit.
    fn route(&mut self, t: usize, v: PV) {
        let st = self.st;
        let stack = &mut self.stack;
        let innermost_loop = stack
            .iter()
            .rposition(|f| st.frames[f.frame].kind == FrameKind::Loop);
        match innermost_loop {
            Some(l) if l > t => stack[l].pending.push((t, v)),
            Some(l) if l == t => stack[t].back = pmax(stack[t].back.take(), Some(v)),
            _ => stack[t].exit = pmax(stack[t].exit.take(), Some(v)),
        }
    }

    /// `block` at operator `i`: opens its frame.
    fn open_block(&mut self, i: usize) {
        self.stack.push(CFrame::new(self.st.opened[i].unwrap_or(0)));
    }

    /// `loop` at operator `i`: opens its frame, remembering the path entering it, and
    /// starts measuring one iteration from zero.
    fn open_loop(&mut self, i: usize) {
        let fr = self.st.opened[i].unwrap_or(0);
        let ord = self.st.frames[fr].ordinal.unwrap_or(0);
        let lcfg = self.loops.get(&ord).copied().unwrap_or(LoopCfg {
            bound: 1,
            ..Default::default()
        });
        let mut f = CFrame::new(fr);
        f.entry = self.cur.clone().map(|mut p| {
            p.cost += lcfg.extra_entry;
            p
        });
        f.lcfg = lcfg;
        let reachable = f.entry.is_some();
        self.stack.push(f);
        self.cur = reachable.then_some(PV {
            cost: 0.0,
            path: None,
        });
    }

    /// `if` at offset `off` (operator `i`): opens its frame, keeping the path into the
    /// else arm and continuing with the then arm.
    fn open_if(&mut self, i: usize, off: usize) {
        let mut f = CFrame::new(self.st.opened[i].unwrap_or(0));
        f.if_start = self.cur.clone().map(|p| PV {
            cost: p.cost,
            path: push(
                &p.path,
                Step::If {
                    offset: off,
                    then: false,
                },
            ),
        });
        self.cur = self.cur.take().map(|p| PV {
            cost: p.cost,
            path: push(
                &p.path,
                Step::If {
                    offset: off,
                    then: true,
                },
            ),
        });
        self.stack.push(f);
    }

    /// `else`: keeps the then arm's end and continues with the else arm.
    fn enter_else(&mut self) {
        if let Some(top) = self.stack.last_mut() {
            top.then_end = self.cur.take();
            top.seen_else = true;
            self.cur = top.if_start.take();
        }
    }

    /// `end`: closes the innermost frame, joining the paths that leave it. Returns
    /// false if no frame was open (the walk stops).
    fn end(&mut self) -> bool {
        let Some(top) = self.stack.pop() else {
            return false;
        };
        let kind = self.st.frames[top.frame].kind;
        match kind {
            FrameKind::Func => {
                self.result = pmax(self.result.take(), pmax(self.cur.take(), top.exit));
                self.stack.push(CFrame::new(0)); // keep stack non-empty; body ends here
            }
            FrameKind::Block => self.cur = pmax(self.cur.take(), top.exit),
            FrameKind::If => {
                let other = if top.seen_else {
                    top.then_end
                } else {
                    top.if_start
                };
                self.cur = pmax(pmax(self.cur.take(), other), top.exit);
            }
            FrameKind::Loop => self.close_loop(top),
        }
        true
    }

    /// The `end` of a loop: collapses its iterations into `(B-1) × worst back-edge
    /// iteration + worst exit`, records the loop's cost, and continues every path
    /// leaving it (falling through or branching out) from the loop's entry.
    fn close_loop(&mut self, top: CFrame) {
        let fr = &self.st.frames[top.frame];
        let b = top.lcfg.bound.max(1);
        let back_cost = top.back.as_ref().map(|p| p.cost + top.lcfg.extra_iter);
        let iters_before = (b - 1) as f64;
        let repeat = back_cost.map(|c| c * iters_before).unwrap_or(0.0);
        let mut worst_exit: Option<f64> = self.cur.as_ref().map(|p| p.cost);
        for (_, v) in &top.pending {
            worst_exit = Some(worst_exit.unwrap_or(0.0).max(v.cost));
        }
        let last = worst_exit.unwrap_or(0.0) + top.lcfg.extra_iter;
        let total = repeat + last;
        let per_iter = back_cost.unwrap_or(0.0).max(last);
        let ops = &self.body.ops;
        self.loop_costs.push(LoopCost {
            func: self.fidx,
            ordinal: fr.ordinal.unwrap_or(0),
            offset: ops[fr.open].0,
            iterations: if top.back.is_some() { b } else { 1 },
            per_iter,
            total,
        });
        let step = Step::Loop {
            func: self.fidx,
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
        self.cur = self.cur.take().and_then(abs);
        for (t, v) in top.pending {
            if let Some(a) = abs(v) {
                self.route(t, a);
            }
        }
    }

    /// `br`, `br_if`, `br_table` or `return` at offset `off` (operator `i`): routes the
    /// current path to every target; an unconditional branch leaves nothing reachable.
    fn branch(&mut self, i: usize, off: usize, op: &Operator<'_>) {
        let conditional = matches!(op, Operator::BrIf { .. });
        let targets: Vec<usize> = self.st.branch_targets(self.body, i);
        if let Some(v) = self.cur.clone() {
            for (arm, t) in targets.iter().enumerate() {
                let Some(si) = self.stack.iter().rposition(|f| f.frame == *t) else {
                    continue;
                };
                let step = match op {
                    Operator::BrIf { .. } => Some(Step::BrIf { offset: off }),
                    Operator::BrTable { .. } => Some(Step::BrTable { offset: off, arm }),
                    Operator::Return => Some(Step::Exit {
                        offset: off,
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
                self.route(si, pv);
            }
        }
        if !conditional {
            self.cur = None;
        }
    }

    /// `unreachable` at offset `off`: a trap ends the invocation, so the path so far is
    /// a complete path.
    fn trap(&mut self, off: usize) {
        if let Some(v) = self.cur.take() {
            let pv = PV {
                cost: v.cost,
                path: push(
                    &v.path,
                    Step::Exit {
                        offset: off,
                        trap: true,
                    },
                ),
            };
            self.route(0, pv);
        }
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
