//! Control structure of a function body and loop-bound proofs.
//!
//! Wasm control flow is structured: every back edge is a `br`, `br_if` or `br_table`
//! whose target is a `loop` label. A loop's bound is *proved* when every back edge is
//! guarded by a comparison of an induction local against a constant: a local written
//! exactly once in the loop body, at its top level (so the write dominates everything
//! after it), as `local ± step`. Otherwise the bound must be *declared* (see `bounds.rs`)
//! and the loop is instrumented so the declaration is enforced.

use std::collections::BTreeMap;

use wasmparser::Operator;

use crate::module::Body;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Func,
    Block,
    Loop,
    If,
}

/// One structured frame (function, block, loop or if).
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: FrameKind,
    /// Index of the opening operator (0 for the function frame).
    pub open: usize,
    /// Index of the matching `end`.
    pub close: usize,
    pub parent: Option<usize>,
    /// Loop ordinal, for loops.
    pub ordinal: Option<u32>,
}

/// Structure of one body: its frames, the innermost frame of every operator, and the
/// target frame of every branch.
#[derive(Debug, Clone)]
pub struct Structure {
    pub frames: Vec<Frame>,
    /// Innermost frame containing operator i (openers belong to their parent).
    pub op_frame: Vec<usize>,
    /// For the frame opened at operator i: its index in `frames`.
    pub opened: Vec<Option<usize>>,
    /// Loop frames in ordinal order.
    pub loops: Vec<usize>,
}

impl Structure {
    pub fn new(body: &Body<'_>) -> Structure {
        let n = body.ops.len();
        let mut frames = vec![Frame {
            kind: FrameKind::Func,
            open: 0,
            close: n.saturating_sub(1),
            parent: None,
            ordinal: None,
        }];
        let mut op_frame = vec![0usize; n];
        let mut opened = vec![None; n];
        let mut loops = Vec::new();
        let mut stack = vec![0usize];
        for (i, (_, op)) in body.ops.iter().enumerate() {
            let cur = *stack.last().unwrap_or(&0);
            op_frame[i] = cur;
            let kind = match op {
                Operator::Block { .. } => Some(FrameKind::Block),
                Operator::Loop { .. } => Some(FrameKind::Loop),
                Operator::If { .. } => Some(FrameKind::If),
                _ => None,
            };
            if let Some(kind) = kind {
                let ordinal = if kind == FrameKind::Loop {
                    loops.push(frames.len());
                    Some(loops.len() as u32 - 1)
                } else {
                    None
                };
                frames.push(Frame {
                    kind,
                    open: i,
                    close: i,
                    parent: Some(cur),
                    ordinal,
                });
                opened[i] = Some(frames.len() - 1);
                stack.push(frames.len() - 1);
            } else if let Operator::End = op
                && let Some(f) = stack.pop()
            {
                frames[f].close = i;
            }
        }
        Structure {
            frames,
            op_frame,
            opened,
            loops,
        }
    }

    /// The frame a branch with relative depth `depth` at operator `i` targets.
    pub fn target(&self, i: usize, depth: u32) -> Option<usize> {
        let mut f = self.op_frame[i];
        for _ in 0..depth {
            f = self.frames[f].parent?;
        }
        Some(f)
    }

    /// Whether frame `inner` is `outer` or nested inside it.
    pub fn within(&self, inner: usize, outer: usize) -> bool {
        let mut f = Some(inner);
        while let Some(x) = f {
            if x == outer {
                return true;
            }
            f = self.frames[x].parent;
        }
        false
    }

    /// Targets of the branch operator at `i` (several for `br_table`).
    pub fn branch_targets(&self, body: &Body<'_>, i: usize) -> Vec<usize> {
        match &body.ops[i].1 {
            Operator::Br { relative_depth } | Operator::BrIf { relative_depth } => {
                self.target(i, *relative_depth).into_iter().collect()
            }
            Operator::BrTable { targets } => {
                let mut v: Vec<usize> = targets
                    .targets()
                    .flatten()
                    .filter_map(|d| self.target(i, d))
                    .collect();
                if let Some(t) = self.target(i, targets.default()) {
                    v.push(t);
                }
                v
            }
            Operator::Return => vec![0],
            _ => vec![],
        }
    }
}

/// Symbolic value on the operand stack during the induction analysis.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sym {
    Unknown,
    Const(i64),
    /// Head-of-iteration value of the local plus `delta`.
    Ind {
        local: u32,
        delta: i64,
    },
    Cmp {
        rel: Rel,
        local: u32,
        delta: i64,
        n: i64,
        wide: bool,
    },
    /// A local never written in the loop body (loop-invariant).
    Inv(u32),
    /// `local + delta REL m` with `m` loop-invariant.
    CmpV {
        rel: Rel,
        local: u32,
        delta: i64,
        m: u32,
        wide: bool,
    },
}

/// A counted loop whose limit is a loop-invariant local: `local` (stepping by `step`)
/// continues while `local + delta < m` (`ne`: `!= m`). Its iteration count is known at
/// loop entry, so a declared bound can be enforced by one check there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub local: u32,
    pub delta: i64,
    pub step: i64,
    pub m: u32,
    pub ne: bool,
    pub wide: bool,
}

/// Relation of `local + delta` to the constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rel {
    LtU,
    LeU,
    GtU,
    GeU,
    LtS,
    LeS,
    GtS,
    GeS,
    Eq,
    Ne,
}

impl Rel {
    fn negate(self) -> Rel {
        use Rel::*;
        match self {
            LtU => GeU,
            GeU => LtU,
            LeU => GtU,
            GtU => LeU,
            LtS => GeS,
            GeS => LtS,
            LeS => GtS,
            GtS => LeS,
            Eq => Ne,
            Ne => Eq,
        }
    }
    fn swap(self) -> Rel {
        use Rel::*;
        match self {
            LtU => GtU,
            GtU => LtU,
            LeU => GeU,
            GeU => LeU,
            LtS => GtS,
            GtS => LtS,
            LeS => GeS,
            GeS => LeS,
            Eq => Eq,
            Ne => Ne,
        }
    }
}

/// A proven bound, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum LoopProof {
    /// The loop body starts at most this many times per entry.
    Proven {
        iterations: u64,
        how: String,
    },
    NotProven(String, Option<Counted>),
}

/// A local whose value the caller knows lies in `lo..=hi` (unsigned) throughout the
/// function: the parameter `n` of a batch entry, `1 ≤ n ≤ B`, which the host guarantees.
/// It is used only if the function never writes the local.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownRange {
    pub local: u32,
    pub lo: u64,
    pub hi: u64,
}

/// Tries to prove a bound for loop frame `lf` of `body`.
pub fn prove(body: &Body<'_>, st: &Structure, lf: usize) -> LoopProof {
    prove_in(body, st, lf, None)
}

/// [`prove`], also accepting a loop whose counter is compared against a local of known
/// range (a batch entry's `n`): `i < n` with `n ≤ B` is bounded as `i < B` would be.
pub fn prove_in(
    body: &Body<'_>,
    st: &Structure,
    lf: usize,
    known: Option<KnownRange>,
) -> LoopProof {
    // The range holds only for a local the function never writes.
    let known = known.filter(|k| !writes_local(body, k.local));
    let fr = &st.frames[lf];
    let (start, end) = (fr.open + 1, fr.close);
    let back_edges = back_edges(body, st, lf, start, end);
    if back_edges.is_empty() {
        return LoopProof::Proven {
            iterations: 1,
            how: "no back edge".into(),
        };
    }
    let writes = local_writes(body, start, end);
    let candidates = induction_candidates(st, lf, &writes);
    if candidates.is_empty() {
        return LoopProof::NotProven(
            "no induction variable (no local is written exactly once at the loop's top level)"
                .into(),
            None,
        );
    }
    let mut pass = SymPass::new(&writes, &candidates);
    for i in start..end {
        pass.step(i, &body.ops[i].1);
    }
    let guards = Guards::new(body, st, lf, pass);
    let init = |l: u32| initial_value(body, fr.open, l);
    guards.prove(body, &back_edges, &init, known)
}

/// Whether any operator of `body` writes local `local`.
fn writes_local(body: &Body<'_>, local: u32) -> bool {
    body.ops.iter().any(|(_, op)| {
        matches!(op, Operator::LocalSet { local_index } | Operator::LocalTee { local_index }
            if *local_index == local)
    })
}

/// Operators in `start..end` branching to loop frame `lf`: the loop's back edges.
fn back_edges(body: &Body<'_>, st: &Structure, lf: usize, start: usize, end: usize) -> Vec<usize> {
    let mut back_edges = Vec::new();
    for i in start..end {
        if st.branch_targets(body, i).contains(&lf) {
            back_edges.push(i);
        }
    }
    back_edges
}

/// Positions of the writes to each local among operators `start..end`.
fn local_writes(body: &Body<'_>, start: usize, end: usize) -> BTreeMap<u32, Vec<usize>> {
    let mut writes: BTreeMap<u32, Vec<usize>> = Default::default();
    for i in start..end {
        if let Operator::LocalSet { local_index } | Operator::LocalTee { local_index } =
            &body.ops[i].1
        {
            writes.entry(*local_index).or_default().push(i);
        }
    }
    writes
}

/// Induction candidates of loop frame `lf`: locals written exactly once in its body,
/// at its top level, with the position of that write.
fn induction_candidates(
    st: &Structure,
    lf: usize,
    writes: &BTreeMap<u32, Vec<usize>>,
) -> BTreeMap<u32, usize> {
    writes
        .iter()
        .filter(|(_, w)| w.len() == 1 && st.op_frame[w[0]] == lf)
        .map(|(l, w)| (*l, w[0]))
        .collect()
}

/// Known initial value of local `l` at the loop opened at operator `open`: a
/// straight-line `const; local.set` right before the loop (skipping `block` openers,
/// which do not touch locals).
fn initial_value(body: &Body<'_>, open: usize, l: u32) -> Option<i64> {
    let mut i = open;
    while i > 0 {
        i -= 1;
        match &body.ops[i].1 {
            Operator::Block { .. } => continue,
            Operator::LocalSet { local_index } | Operator::LocalTee { local_index }
                if *local_index == l =>
            {
                if i > 0 {
                    match &body.ops[i - 1].1 {
                        Operator::I32Const { value } => return Some(*value as i64),
                        Operator::I64Const { value } => return Some(*value),
                        _ => return None,
                    }
                }
                return None;
            }
            Operator::LocalSet { .. }
            | Operator::LocalTee { .. }
            | Operator::LocalGet { .. }
            | Operator::I32Const { .. }
            | Operator::I64Const { .. }
            | Operator::Drop
            | Operator::Nop => continue,
            _ => return None,
        }
    }
    None
}

/// The symbolic pass over a loop body: tracks the operand stack as [`Sym`] values,
/// learns the step of each induction candidate and the condition of each `br_if`.
struct SymPass<'w> {
    writes: &'w BTreeMap<u32, Vec<usize>>,
    candidates: &'w BTreeMap<u32, usize>,
    steps: BTreeMap<u32, i64>,
    stack: Vec<Sym>,
    /// (position, condition-for-branch-taken) of br_ifs
    conds: Vec<(usize, Sym)>,
}

impl<'w> SymPass<'w> {
    /// An empty pass over a body with these local writes and induction candidates.
    fn new(writes: &'w BTreeMap<u32, Vec<usize>>, candidates: &'w BTreeMap<u32, usize>) -> Self {
        SymPass {
            writes,
            candidates,
            steps: Default::default(),
            stack: Vec::new(),
            conds: Vec::new(),
        }
    }

    /// Pops a value, `Unknown` if the tracked stack is empty.
    fn pop(&mut self) -> Sym {
        self.stack.pop().unwrap_or(Sym::Unknown)
    }

    /// Applies operator `op` at position `i` to the symbolic state.
    fn step(&mut self, i: usize, op: &Operator<'_>) {
        match op {
            Operator::LocalGet { local_index } => self.local_get(i, *local_index),
            Operator::LocalSet { local_index } | Operator::LocalTee { local_index } => {
                self.local_set(i, *local_index, matches!(op, Operator::LocalTee { .. }));
            }
            Operator::I32Const { value } => self.stack.push(Sym::Const(*value as i64)),
            Operator::I64Const { value } => self.stack.push(Sym::Const(*value)),
            Operator::I32Add | Operator::I64Add | Operator::I32Sub | Operator::I64Sub => {
                self.add_sub(matches!(op, Operator::I32Sub | Operator::I64Sub));
            }
            Operator::I32Eqz | Operator::I64Eqz => {
                let a = self.pop();
                self.stack.push(negate(a, matches!(op, Operator::I64Eqz)));
            }
            _ => {
                if let Some((rel, wide)) = rel_of(op) {
                    self.compare(rel, wide);
                } else if let Operator::BrIf { .. } = op {
                    let c = self.pop();
                    self.conds.push((i, c));
                } else if let Operator::Drop = op {
                    self.pop();
                } else {
                    // Anything else: forget what we know (sound: only recognised values
                    // are ever used).
                    self.stack.clear();
                }
            }
        }
    }

    /// `local.get l` at position `i`: an induction value (before or after its write),
    /// a loop-invariant local, or unknown.
    fn local_get(&mut self, i: usize, l: u32) {
        let v = match self.candidates.get(&l) {
            Some(&w) if i < w => Sym::Ind { local: l, delta: 0 },
            Some(_) => match self.steps.get(&l) {
                Some(&s) => Sym::Ind { local: l, delta: s },
                None => Sym::Unknown,
            },
            None if !self.writes.contains_key(&l) => Sym::Inv(l),
            None => Sym::Unknown,
        };
        self.stack.push(v);
    }

    /// `local.set l` / `local.tee l` at position `i`: the candidate's write of
    /// `local ± step` fixes its step.
    fn local_set(&mut self, i: usize, l: u32, tee: bool) {
        let v = self.pop();
        if self.candidates.get(&l) == Some(&i)
            && let Sym::Ind { local, delta } = v
            && local == l
            && delta != 0
        {
            self.steps.insert(local, delta);
        }
        if tee {
            // After the write the value is the new head value + 0 relative to the
            // new iteration, i.e. old head + step: keep the symbolic form.
            self.stack.push(v);
        }
    }

    /// `add` / `sub` (`sub` set): an induction value plus or minus a constant, or
    /// constant folding.
    fn add_sub(&mut self, sub: bool) {
        let b = self.pop();
        let a = self.pop();
        let r = match (a, b) {
            (Sym::Ind { local, delta }, Sym::Const(c)) => Sym::Ind {
                local,
                delta: if sub {
                    delta.wrapping_sub(c)
                } else {
                    delta.wrapping_add(c)
                },
            },
            (Sym::Const(c), Sym::Ind { local, delta }) if !sub => Sym::Ind {
                local,
                delta: delta.wrapping_add(c),
            },
            (Sym::Const(x), Sym::Const(y)) => Sym::Const(if sub {
                x.wrapping_sub(y)
            } else {
                x.wrapping_add(y)
            }),
            _ => Sym::Unknown,
        };
        self.stack.push(r);
    }

    /// A comparison `rel` (64-bit if `wide`): an induction value against a constant
    /// or a loop-invariant local, either way round.
    fn compare(&mut self, rel: Rel, wide: bool) {
        let b = self.pop();
        let a = self.pop();
        let r = match (a, b) {
            (Sym::Ind { local, delta }, Sym::Const(n)) => Sym::Cmp {
                rel,
                local,
                delta,
                n,
                wide,
            },
            (Sym::Const(n), Sym::Ind { local, delta }) => Sym::Cmp {
                rel: rel.swap(),
                local,
                delta,
                n,
                wide,
            },
            (Sym::Ind { local, delta }, Sym::Inv(m)) => Sym::CmpV {
                rel,
                local,
                delta,
                m,
                wide,
            },
            (Sym::Inv(m), Sym::Ind { local, delta }) => Sym::CmpV {
                rel: rel.swap(),
                local,
                delta,
                m,
                wide,
            },
            _ => Sym::Unknown,
        };
        self.stack.push(r);
    }
}

/// What the symbolic pass learned about the conditions under which a loop continues.
struct Guards {
    /// Step per iteration of each induction local.
    steps: BTreeMap<u32, i64>,
    /// (position, condition-for-branch-taken) of br_ifs
    conds: Vec<(usize, Sym)>,
    /// Continue-conditions of the `br_if`s at the loop's top level that leave it.
    exits_at_top: Vec<(usize, Sym)>,
}

impl Guards {
    /// The guards of loop frame `lf` from a finished symbolic pass over its body.
    fn new(body: &Body<'_>, st: &Structure, lf: usize, pass: SymPass<'_>) -> Self {
        // Continue-conditions guarding each back edge.
        let exits_at_top: Vec<(usize, Sym)> = pass
            .conds
            .iter()
            .filter(|(i, _)| {
                st.op_frame[*i] == lf
                    && st
                        .branch_targets(body, *i)
                        .iter()
                        .all(|t| !st.within(*t, lf))
            })
            .map(|(i, c)| (*i, negate(*c, false)))
            .collect();
        Guards {
            steps: pass.steps,
            conds: pass.conds,
            exits_at_top,
        }
    }

    /// The loop's bound: every back edge must be guarded by a counted condition; the
    /// bound is one more than the most back edges any of them allows.
    fn prove(
        &self,
        body: &Body<'_>,
        back_edges: &[usize],
        init: &dyn Fn(u32) -> Option<i64>,
        known: Option<KnownRange>,
    ) -> LoopProof {
        let mut best_overall: Option<(u64, String)> = None;
        let mut counted: Option<Counted> = None;
        let mut all_counted = true;
        let mut unproven: Option<String> = None;
        for &b in back_edges {
            let (best, this_counted) = self.edge_bound(self.edge_options(body, b), init, known);
            match (&counted, this_counted) {
                (_, None) => all_counted = false,
                (None, Some(c)) => counted = Some(c),
                (Some(a), Some(c)) if *a == c => {}
                _ => all_counted = false,
            }
            let Some(best) = best else {
                unproven.get_or_insert(format!(
                    "back edge at offset {:#x} is not guarded by a comparison of a counter against a constant",
                    body.ops[b].0
                ));
                continue;
            };
            if best_overall.as_ref().is_none_or(|x| best.0 > x.0) {
                best_overall = Some(best);
            }
        }
        if let Some(why) = unproven {
            return LoopProof::NotProven(why, if all_counted { counted } else { None });
        }
        let (back, how) = best_overall.unwrap_or((0, String::new()));
        LoopProof::Proven {
            iterations: back.saturating_add(1),
            how,
        }
    }

    /// The conditions that must hold for back edge `b` to be taken: its own `br_if`
    /// condition, and the continue-conditions of the top-level exits before it.
    fn edge_options(&self, body: &Body<'_>, b: usize) -> Vec<Sym> {
        let mut options: Vec<Sym> = Vec::new();
        if let Operator::BrIf { .. } = body.ops[b].1
            && let Some((_, c)) = self.conds.iter().find(|(i, _)| *i == b)
        {
            options.push(*c);
        }
        for (q, c) in &self.exits_at_top {
            if *q < b {
                options.push(*c);
            }
        }
        options
    }

    /// The tightest count any of a back edge's `options` allows, and the first of them
    /// that makes it a [`Counted`] loop.
    fn edge_bound(
        &self,
        options: Vec<Sym>,
        init: &dyn Fn(u32) -> Option<i64>,
        known: Option<KnownRange>,
    ) -> (Option<(u64, String)>, Option<Counted>) {
        let mut best: Option<(u64, String)> = None;
        let mut this_counted: Option<Counted> = None;
        for c in options {
            let r = count(c, &self.steps, init)
                .or_else(|| known.and_then(|k| count_known(c, k, &self.steps, init)));
            if let Some(r) = r
                && best.as_ref().is_none_or(|x| r.0 < x.0)
            {
                best = Some(r);
            }
            if this_counted.is_none() {
                this_counted = self.counted(c);
            }
        }
        (best, this_counted)
    }

    /// `c` as a counted loop with a loop-invariant limit, if it is one: counting up by
    /// a positive step while `< m` (unsigned), or `!= m` with a power-of-two step.
    fn counted(&self, c: Sym) -> Option<Counted> {
        if let Sym::CmpV {
            rel,
            local,
            delta,
            m,
            wide,
        } = c
            && let Some(&step) = self.steps.get(&local)
        {
            let ok = step > 0
                && (rel == Rel::LtU || (rel == Rel::Ne && (step as u64).is_power_of_two()));
            if ok {
                return Some(Counted {
                    local,
                    delta,
                    step,
                    m,
                    ne: rel == Rel::Ne,
                    wide,
                });
            }
        }
        None
    }
}

/// The condition `s` negated; a bare induction value `v` (true when nonzero)
/// becomes `v == 0`, compared at width `wide`.
fn negate(s: Sym, wide: bool) -> Sym {
    match s {
        Sym::Cmp {
            rel,
            local,
            delta,
            n,
            wide,
        } => Sym::Cmp {
            rel: rel.negate(),
            local,
            delta,
            n,
            wide,
        },
        Sym::CmpV {
            rel,
            local,
            delta,
            m,
            wide,
        } => Sym::CmpV {
            rel: rel.negate(),
            local,
            delta,
            m,
            wide,
        },
        Sym::Ind { local, delta } => Sym::Cmp {
            rel: Rel::Eq,
            local,
            delta,
            n: 0,
            wide,
        },
        _ => Sym::Unknown,
    }
}

fn rel_of(op: &Operator<'_>) -> Option<(Rel, bool)> {
    use Operator::*;
    Some(match op {
        I32LtU => (Rel::LtU, false),
        I32LeU => (Rel::LeU, false),
        I32GtU => (Rel::GtU, false),
        I32GeU => (Rel::GeU, false),
        I32LtS => (Rel::LtS, false),
        I32LeS => (Rel::LeS, false),
        I32GtS => (Rel::GtS, false),
        I32GeS => (Rel::GeS, false),
        I32Eq => (Rel::Eq, false),
        I32Ne => (Rel::Ne, false),
        I64LtU => (Rel::LtU, true),
        I64LeU => (Rel::LeU, true),
        I64GtU => (Rel::GtU, true),
        I64GeU => (Rel::GeU, true),
        I64LtS => (Rel::LtS, true),
        I64LeS => (Rel::LeS, true),
        I64GtS => (Rel::GtS, true),
        I64GeS => (Rel::GeS, true),
        I64Eq => (Rel::Eq, true),
        I64Ne => (Rel::Ne, true),
        _ => return None,
    })
}

/// Most back edges a continue-condition comparing the counter against a local of known
/// range allows: the comparison against the range's worst end (`hi` when counting up
/// towards it, `lo` when counting down), which continues whenever the real one does.
/// `!=` needs a unit step and a start on the right side of the whole range.
fn count_known(
    c: Sym,
    k: KnownRange,
    steps: &BTreeMap<u32, i64>,
    init: &dyn Fn(u32) -> Option<i64>,
) -> Option<(u64, String)> {
    let Sym::CmpV {
        rel,
        local,
        delta,
        m,
        wide,
    } = c
    else {
        return None;
    };
    if m != k.local || k.lo > k.hi || k.hi > i32::MAX as u64 {
        return None;
    }
    let step = *steps.get(&local)?;
    let (lo, hi) = (k.lo as i64, k.hi as i64);
    let note = |r: (u64, String)| {
        (
            r.0,
            format!("{} (local {m} is the batch size n, {lo} ≤ n ≤ {hi})", r.1),
        )
    };
    use Rel::*;
    let n = match (rel, step > 0) {
        (LtU | LeU | LtS | LeS, true) => hi,
        (GtU | GeU | GtS | GeS, false) => lo,
        (Ne, _) => {
            let first = init(local)?.wrapping_add(delta);
            let wrap = if wide { u64::MAX } else { u32::MAX as u64 };
            let first = (first as u64 & wrap) as i64;
            let back = match step {
                1 if first <= lo => hi - first,
                -1 if first >= hi => first - lo,
                _ => return None,
            };
            return Some(note((
                back as u64,
                format!(
                    "local {local} steps by {step}, continues while +{delta} != n (from {})",
                    first - delta
                ),
            )));
        }
        _ => return None,
    };
    count(
        Sym::Cmp {
            rel,
            local,
            delta,
            n,
            wide,
        },
        steps,
        init,
    )
    .map(note)
}

/// Most back edges a continue-condition allows, with an explanation.
fn count(
    c: Sym,
    steps: &BTreeMap<u32, i64>,
    init: &dyn Fn(u32) -> Option<i64>,
) -> Option<(u64, String)> {
    let Sym::Cmp {
        rel,
        local,
        delta,
        n,
        wide,
    } = c
    else {
        return None;
    };
    let step = *steps.get(&local)?;
    let k = Count::new(local, delta, step, n, wide, init(local));
    use Rel::*;
    match (rel, k.s > 0) {
        (LtU | LeU, true) => k.up_unsigned(rel == LeU),
        (LtS | LeS, true) => k.up_signed(rel == LeS),
        (Ne, true) => k.up_to(),
        (GtU | GeU, false) => k.down_unsigned(rel == GeU),
        (GtS | GeS, false) => k.down_signed(rel == GeS),
        (Ne, false) => k.down_to(),
        _ => None,
    }
}

/// `ceil(a / b)` for a positive `b`, 0 when `a` is not positive.
fn ceil_div(a: i128, b: i128) -> i128 {
    if a <= 0 { 0 } else { (a + b - 1) / b }
}

/// A counter `local` stepping by `step` compared (at 32 or 64 bits) as `local + delta`
/// against the constant `n`: the arithmetic [`count`] does for each relation.
struct Count {
    local: u32,
    delta: i64,
    step: i64,
    n: i64,
    modulus: i128,
    /// `step` widened.
    s: i128,
    /// `delta` widened.
    d: i128,
    /// The counter's known initial value.
    i0: Option<i128>,
}

impl Count {
    /// The counter's facts, compared at 64 bits if `wide`, with initial value `init`.
    fn new(local: u32, delta: i64, step: i64, n: i64, wide: bool, init: Option<i64>) -> Self {
        let bits: u32 = if wide { 64 } else { 32 };
        Count {
            local,
            delta,
            step,
            n,
            modulus: 1i128 << bits,
            s: step as i128,
            d: delta as i128,
            i0: init.map(|v| v as i128),
        }
    }

    /// `v` as an unsigned value of the comparison's width.
    fn umask(&self, v: i128) -> i128 {
        v.rem_euclid(self.modulus)
    }

    /// `v` as a signed value of the comparison's width.
    fn sext(&self, v: i128) -> i128 {
        let u = self.umask(v);
        if u >= self.modulus / 2 {
            u - self.modulus
        } else {
            u
        }
    }

    /// The count `k` (clamped to `u64`) with its explanation `what`.
    fn desc(&self, what: &str, k: i128) -> (u64, String) {
        (
            k.clamp(0, u64::MAX as i128) as u64,
            format!(
                "local {} steps by {}, continues while {what}",
                self.local, self.step
            ),
        )
    }

    /// Counting up while `< n` (`<= n` if `inclusive`), unsigned.
    fn up_unsigned(&self, inclusive: bool) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let nn = self.umask(self.n as i128) + if inclusive { 1 } else { 0 };
        if nn + s > self.modulus {
            return None;
        }
        Some(match self.i0 {
            Some(c0) => {
                let first = self.umask(c0 + self.d);
                self.desc(
                    &format!("+{delta} < {nn} (from {c0})"),
                    ceil_div(nn - first, s),
                )
            }
            None => self.desc(&format!("+{delta} < {nn} (unsigned)"), ceil_div(nn, s)),
        })
    }

    /// Counting up while `< n` (`<= n` if `inclusive`), signed.
    fn up_signed(&self, inclusive: bool) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let c0 = self.i0?;
        let nn = self.sext(self.n as i128) + if inclusive { 1 } else { 0 };
        if nn + s > self.modulus / 2 {
            return None;
        }
        let first = self.sext(c0 + self.d);
        Some(self.desc(
            &format!("+{delta} < {nn} (signed, from {c0})"),
            ceil_div(nn - first, s),
        ))
    }

    /// Counting up while `!= n`: needs to reach `n` exactly.
    fn up_to(&self) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let c0 = self.i0?;
        let first = self.umask(c0 + self.d);
        let nn = self.umask(self.n as i128);
        if first > nn || (nn - first) % s != 0 {
            return None;
        }
        Some(self.desc(&format!("+{delta} != {nn} (from {c0})"), (nn - first) / s))
    }

    /// Counting down while `> n` (`>= n` if `inclusive`), unsigned.
    fn down_unsigned(&self, inclusive: bool) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let c0 = self.i0?;
        let m = self.umask(self.n as i128) - if inclusive { 1 } else { 0 };
        if m < 0 || -s > m + 1 {
            return None;
        }
        let first = self.umask(c0 + self.d);
        Some(self.desc(
            &format!("+{delta} > {m} (from {c0})"),
            ceil_div(first - m, -s),
        ))
    }

    /// Counting down while `> n` (`>= n` if `inclusive`), signed.
    fn down_signed(&self, inclusive: bool) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let c0 = self.i0?;
        let m = self.sext(self.n as i128) - if inclusive { 1 } else { 0 };
        if m + s < -(self.modulus / 2) {
            return None;
        }
        let first = self.sext(c0 + self.d);
        Some(self.desc(
            &format!("+{delta} > {m} (signed, from {c0})"),
            ceil_div(first - m, -s),
        ))
    }

    /// Counting down while `!= n`: needs to reach `n` exactly.
    fn down_to(&self) -> Option<(u64, String)> {
        let (s, delta) = (self.s, self.delta);
        let c0 = self.i0?;
        let first = self.umask(c0 + self.d);
        let m = self.umask(self.n as i128);
        if first < m || (first - m) % (-s) != 0 {
            return None;
        }
        Some(self.desc(&format!("+{delta} != {m} (from {c0})"), (first - m) / (-s)))
    }
}
