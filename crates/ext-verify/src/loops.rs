//! Control structure of a function body and loop-bound proofs.
//!
//! Wasm control flow is structured: every back edge is a `br`, `br_if` or `br_table`
//! whose target is a `loop` label. A loop's bound is *proved* when every back edge is
//! guarded by a comparison of an induction local against a constant: a local written
//! exactly once in the loop body, at its top level (so the write dominates everything
//! after it), as `local ± step`. Otherwise the bound must be *declared* (see `bounds.rs`)
//! and the loop is instrumented so the declaration is enforced.

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
#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one pass over shared analysis state, left whole this session
pub fn prove_in(
    body: &Body<'_>,
    st: &Structure,
    lf: usize,
    known: Option<KnownRange>,
) -> LoopProof {
    // The range holds only for a local the function never writes.
    let known = known.filter(|k| {
        !body.ops.iter().any(|(_, op)| {
            matches!(op, Operator::LocalSet { local_index } | Operator::LocalTee { local_index }
                if *local_index == k.local)
        })
    });
    let fr = &st.frames[lf];
    let (start, end) = (fr.open + 1, fr.close);
    // Back edges.
    let mut back_edges = Vec::new();
    for i in start..end {
        if st.branch_targets(body, i).contains(&lf) {
            back_edges.push(i);
        }
    }
    if back_edges.is_empty() {
        return LoopProof::Proven {
            iterations: 1,
            how: "no back edge".into(),
        };
    }
    // Writes per local inside the body; candidate = exactly one write, at top level.
    let mut writes: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for i in start..end {
        if let Operator::LocalSet { local_index } | Operator::LocalTee { local_index } =
            &body.ops[i].1
        {
            writes.entry(*local_index).or_default().push(i);
        }
    }
    let candidates: std::collections::BTreeMap<u32, usize> = writes
        .iter()
        .filter(|(_, w)| w.len() == 1 && st.op_frame[w[0]] == lf)
        .map(|(l, w)| (*l, w[0]))
        .collect();
    if candidates.is_empty() {
        return LoopProof::NotProven(
            "no induction variable (no local is written exactly once at the loop's top level)"
                .into(),
            None,
        );
    }
    // Symbolic pass.
    let mut steps: std::collections::BTreeMap<u32, i64> = Default::default();
    let mut stack: Vec<Sym> = Vec::new();
    // (position, condition-for-branch-taken) of br_ifs
    let mut conds: Vec<(usize, Sym)> = Vec::new();
    let pop = |s: &mut Vec<Sym>| s.pop().unwrap_or(Sym::Unknown);
    for i in start..end {
        let op = &body.ops[i].1;
        match op {
            Operator::LocalGet { local_index } => {
                let l = *local_index;
                let v = match candidates.get(&l) {
                    Some(&w) if i < w => Sym::Ind { local: l, delta: 0 },
                    Some(_) => match steps.get(&l) {
                        Some(&s) => Sym::Ind { local: l, delta: s },
                        None => Sym::Unknown,
                    },
                    None if !writes.contains_key(&l) => Sym::Inv(l),
                    None => Sym::Unknown,
                };
                stack.push(v);
            }
            Operator::LocalSet { local_index } | Operator::LocalTee { local_index } => {
                let v = pop(&mut stack);
                if candidates.get(local_index) == Some(&i)
                    && let Sym::Ind { local, delta } = v
                    && local == *local_index
                    && delta != 0
                {
                    steps.insert(local, delta);
                }
                if matches!(op, Operator::LocalTee { .. }) {
                    // After the write the value is the new head value + 0 relative to the
                    // new iteration, i.e. old head + step: keep the symbolic form.
                    stack.push(v);
                }
            }
            Operator::I32Const { value } => stack.push(Sym::Const(*value as i64)),
            Operator::I64Const { value } => stack.push(Sym::Const(*value)),
            Operator::I32Add | Operator::I64Add | Operator::I32Sub | Operator::I64Sub => {
                let b = pop(&mut stack);
                let a = pop(&mut stack);
                let sub = matches!(op, Operator::I32Sub | Operator::I64Sub);
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
                stack.push(r);
            }
            Operator::I32Eqz | Operator::I64Eqz => {
                let a = pop(&mut stack);
                stack.push(negate(a, matches!(op, Operator::I64Eqz)));
            }
            _ => {
                if let Some((rel, wide)) = rel_of(op) {
                    let b = pop(&mut stack);
                    let a = pop(&mut stack);
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
                    stack.push(r);
                } else if let Operator::BrIf { .. } = op {
                    let c = pop(&mut stack);
                    conds.push((i, c));
                } else if let Operator::Drop = op {
                    pop(&mut stack);
                } else {
                    // Anything else: forget what we know (sound: only recognised values
                    // are ever used).
                    stack.clear();
                }
            }
        }
    }
    // Known initial values: straight-line `const; local.set` right before the loop
    // (skipping `block` openers, which do not touch locals).
    let init = |l: u32| -> Option<i64> {
        let mut i = fr.open;
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
    };
    // Continue-conditions guarding each back edge.
    let exits_at_top: Vec<(usize, Sym)> = conds
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
    let mut best_overall: Option<(u64, String)> = None;
    let mut counted: Option<Counted> = None;
    let mut all_counted = true;
    let mut unproven: Option<String> = None;
    for &b in &back_edges {
        let mut options: Vec<Sym> = Vec::new();
        if let Operator::BrIf { .. } = body.ops[b].1
            && let Some((_, c)) = conds.iter().find(|(i, _)| *i == b)
        {
            options.push(*c);
        }
        for (q, c) in &exits_at_top {
            if *q < b {
                options.push(*c);
            }
        }
        let mut best: Option<(u64, String)> = None;
        let mut this_counted: Option<Counted> = None;
        for c in options {
            let r = count(c, &steps, &init)
                .or_else(|| known.and_then(|k| count_known(c, k, &steps, &init)));
            if let Some(r) = r
                && best.as_ref().is_none_or(|x| r.0 < x.0)
            {
                best = Some(r);
            }
            if let Sym::CmpV {
                rel,
                local,
                delta,
                m,
                wide,
            } = c
                && let Some(&step) = steps.get(&local)
            {
                let ok = step > 0
                    && (rel == Rel::LtU || (rel == Rel::Ne && (step as u64).is_power_of_two()));
                if ok && this_counted.is_none() {
                    this_counted = Some(Counted {
                        local,
                        delta,
                        step,
                        m,
                        ne: rel == Rel::Ne,
                        wide,
                    });
                }
            }
        }
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
    steps: &std::collections::BTreeMap<u32, i64>,
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
#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one pass over shared analysis state, left whole this session
fn count(
    c: Sym,
    steps: &std::collections::BTreeMap<u32, i64>,
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
    let bits: u32 = if wide { 64 } else { 32 };
    let modulus: i128 = 1i128 << bits;
    let umask = |v: i128| -> i128 { v.rem_euclid(modulus) };
    let sext = |v: i128| -> i128 {
        let u = umask(v);
        if u >= modulus / 2 { u - modulus } else { u }
    };
    let s = step as i128;
    let d = delta as i128;
    let i0 = init(local).map(|v| v as i128);
    let ceil_div = |a: i128, b: i128| -> i128 { if a <= 0 { 0 } else { (a + b - 1) / b } };
    let desc = |what: &str, k: i128| -> (u64, String) {
        (
            k.clamp(0, u64::MAX as i128) as u64,
            format!("local {local} steps by {step}, continues while {what}"),
        )
    };
    use Rel::*;
    let r = match (rel, s > 0) {
        (LtU | LeU, true) => {
            let nn = umask(n as i128) + if rel == LeU { 1 } else { 0 };
            if nn + s > modulus {
                return None;
            }
            match i0 {
                Some(c0) => {
                    let first = umask(c0 + d);
                    desc(
                        &format!("+{delta} < {nn} (from {c0})"),
                        ceil_div(nn - first, s),
                    )
                }
                None => desc(&format!("+{delta} < {nn} (unsigned)"), ceil_div(nn, s)),
            }
        }
        (LtS | LeS, true) => {
            let c0 = i0?;
            let nn = sext(n as i128) + if rel == LeS { 1 } else { 0 };
            if nn + s > modulus / 2 {
                return None;
            }
            let first = sext(c0 + d);
            desc(
                &format!("+{delta} < {nn} (signed, from {c0})"),
                ceil_div(nn - first, s),
            )
        }
        (Ne, true) => {
            let c0 = i0?;
            let first = umask(c0 + d);
            let nn = umask(n as i128);
            if first > nn || (nn - first) % s != 0 {
                return None;
            }
            desc(&format!("+{delta} != {nn} (from {c0})"), (nn - first) / s)
        }
        (GtU | GeU, false) => {
            let c0 = i0?;
            let m = umask(n as i128) - if rel == GeU { 1 } else { 0 };
            if m < 0 || -s > m + 1 {
                return None;
            }
            let first = umask(c0 + d);
            desc(
                &format!("+{delta} > {m} (from {c0})"),
                ceil_div(first - m, -s),
            )
        }
        (GtS | GeS, false) => {
            let c0 = i0?;
            let m = sext(n as i128) - if rel == GeS { 1 } else { 0 };
            if m + s < -(modulus / 2) {
                return None;
            }
            let first = sext(c0 + d);
            desc(
                &format!("+{delta} > {m} (signed, from {c0})"),
                ceil_div(first - m, -s),
            )
        }
        (Ne, false) => {
            let c0 = i0?;
            let first = umask(c0 + d);
            let m = umask(n as i128);
            if first < m || (first - m) % (-s) != 0 {
                return None;
            }
            desc(&format!("+{delta} != {m} (from {c0})"), (first - m) / (-s))
        }
        _ => return None,
    };
    Some(r)
}
