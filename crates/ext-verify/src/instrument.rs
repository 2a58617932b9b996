//! Rewrites an admitted module (with `wasm-encoder`'s re-encoder) so that
//!
//! * every loop whose bound was *declared* cannot run past it: a hidden counter local is
//!   set to the bound when the loop is entered and decremented at the loop header; when a
//!   `MAX+1`-th iteration would start, the module calls the injected import
//!   `sidecore.bound_exceeded(id)`, which traps with "declared loop bound exceeded".
//!   Exiting the loop silently instead would run the code after it with its precondition
//!   broken, so a broken promise ends the invocation deterministically and disqualifies
//!   the module (the runtime unloads it; RBCyclone's `for (CONST)` had the same contract);
//! * every loop selected for a *poll point* (its whole execution exceeds the acceptable
//!   limit) calls the injected import `sidecore.poll()` every `P` iterations, where `P`
//!   iterations fit in the acceptable limit (thesis §3.6, Fig. 3.4).
//!
//! The two imports are appended after the module's own imports, so every defined
//! function's index moves up by two; the re-encoder's `function_index` hook renumbers
//! calls, exports, element segments and the start function. The `name` section (which
//! would be stale) and the `sidecore.bounds` section (already applied) are dropped.

use std::collections::BTreeMap;
use std::convert::Infallible;

use wasm_encoder::reencode::{Error as ReError, Reencode, utils};
use wasm_encoder::{BlockType, EntityType, Function, Instruction, ValType};

use crate::abi;

/// What to instrument, keyed by (function index in the original module, loop ordinal).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub declared: BTreeMap<(u32, u32), u64>,
    /// Declared loops enforced by one check at entry instead of a per-iteration counter.
    pub entry_checks: BTreeMap<(u32, u32), crate::loops::Counted>,
    pub polls: BTreeMap<(u32, u32), u64>,
    pub n_imported: u32,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.declared.is_empty() && self.polls.is_empty()
    }
    /// The id passed to `sidecore.bound_exceeded` for a declared loop.
    pub fn declared_id(&self, key: (u32, u32)) -> Option<u32> {
        self.declared
            .keys()
            .position(|k| *k == key)
            .map(|p| p as u32)
    }
}

struct Rewriter<'p> {
    plan: &'p Plan,
    n_types: u32,
    had_imports: bool,
    imports_done: bool,
    next_defined: u32,
    /// Parameter count of each defined function (parameters come first among locals).
    param_count: BTreeMap<u32, u32>,
}

/// Loop ordinal → the locals of its (declared-bound, poll) counters.
type LoopCounters = BTreeMap<u32, (Option<u32>, Option<u32>)>;

impl Rewriter<'_> {
    fn poll_idx(&self) -> u32 {
        self.plan.n_imported
    }
    fn bound_idx(&self) -> u32 {
        self.plan.n_imported + 1
    }
    fn add_imports(&self, imports: &mut wasm_encoder::ImportSection) {
        imports.import(
            abi::INJECT_MODULE,
            abi::INJECT_POLL,
            EntityType::Function(self.n_types),
        );
        imports.import(
            abi::INJECT_MODULE,
            abi::INJECT_BOUND,
            EntityType::Function(self.n_types + 1),
        );
    }
}

impl Rewriter<'_> {
    /// Per loop ordinal of function `fidx`, the locals its declared-bound and
    /// poll counters get (allocated from `next_local`), for the loops that have
    /// either or an entry check.
    fn loop_counters(
        &self,
        fidx: u32,
        func: &wasmparser::FunctionBody<'_>,
        next_local: &mut u32,
    ) -> Result<LoopCounters, ReError<Infallible>> {
        let mut counters = BTreeMap::new();
        let mut rd = func.get_operators_reader()?;
        let mut ord = 0u32;
        while !rd.eof() {
            if let wasmparser::Operator::Loop { .. } = rd.read()? {
                let key = (fidx, ord);
                let d = if self.plan.declared.contains_key(&key)
                    && !self.plan.entry_checks.contains_key(&key)
                {
                    *next_local += 1;
                    Some(*next_local - 1)
                } else {
                    None
                };
                let p = if self.plan.polls.contains_key(&key) {
                    *next_local += 1;
                    Some(*next_local - 1)
                } else {
                    None
                };
                if d.is_some() || p.is_some() || self.plan.entry_checks.contains_key(&key) {
                    counters.insert(ord, (d, p));
                }
                ord += 1;
            }
        }
        Ok(counters)
    }
}

impl Reencode for Rewriter<'_> {
    type Error = Infallible;

    fn function_index(&mut self, func: u32) -> Result<u32, ReError<Infallible>> {
        Ok(if func >= self.plan.n_imported {
            func + 2
        } else {
            func
        })
    }

    fn parse_type_section(
        &mut self,
        types: &mut wasm_encoder::TypeSection,
        section: wasmparser::TypeSectionReader<'_>,
    ) -> Result<(), ReError<Infallible>> {
        utils::parse_type_section(self, types, section)?;
        types.ty().function([], []);
        types.ty().function([ValType::I32], []);
        Ok(())
    }

    fn parse_import_section(
        &mut self,
        imports: &mut wasm_encoder::ImportSection,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), ReError<Infallible>> {
        utils::parse_import_section(self, imports, section)?;
        self.add_imports(imports);
        self.imports_done = true;
        Ok(())
    }

    fn intersperse_section_hook(
        &mut self,
        module: &mut wasm_encoder::Module,
        _after: Option<wasm_encoder::SectionId>,
        before: Option<wasm_encoder::SectionId>,
    ) -> Result<(), ReError<Infallible>> {
        use wasm_encoder::SectionId as S;
        if self.had_imports || self.imports_done {
            return Ok(());
        }
        let past_imports = match before {
            None => true,
            Some(S::Type) | Some(S::Import) | Some(S::Custom) => false,
            Some(_) => true,
        };
        if past_imports {
            let mut imports = wasm_encoder::ImportSection::new();
            self.add_imports(&mut imports);
            module.section(&imports);
            self.imports_done = true;
        }
        Ok(())
    }

    fn parse_custom_section(
        &mut self,
        module: &mut wasm_encoder::Module,
        section: wasmparser::CustomSectionReader<'_>,
    ) -> Result<(), ReError<Infallible>> {
        if section.name() == "name" || section.name() == crate::bounds::SECTION {
            return Ok(());
        }
        utils::parse_custom_section(self, module, section)
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: wasmparser::FunctionBody<'_>,
    ) -> Result<(), ReError<Infallible>> {
        let fidx = self.next_defined;
        self.next_defined += 1;
        let mut locals = Vec::new();
        let mut n_locals = 0u32;
        for pair in func.get_locals_reader()? {
            let (cnt, ty) = pair?;
            n_locals += cnt;
            locals.push((cnt, self.val_type(ty)?));
        }
        // Parameters come first in the local index space.
        let n_params = self.param_count.get(&fidx).copied().unwrap_or(0);
        let mut next_local = n_params + n_locals;
        // Pre-count loops to allocate counters.
        let counters = self.loop_counters(fidx, &func, &mut next_local)?;
        let extra = next_local - n_params - n_locals;
        if extra > 0 {
            locals.push((extra, ValType::I32));
        }
        let mut f = Function::new(locals);
        let mut rd = func.get_operators_reader()?;
        let mut ord = 0u32;
        while !rd.eof() {
            let op = rd.read()?;
            let is_loop = matches!(op, wasmparser::Operator::Loop { .. });
            let inst = self.instruction(op)?;
            if !is_loop {
                f.instruction(&inst);
                continue;
            }
            let key = (fidx, ord);
            ord += 1;
            let Some((d, p)) = counters.get(&(key.1)).copied() else {
                f.instruction(&inst);
                continue;
            };
            if let Some(c) = self.plan.entry_checks.get(&key) {
                let b = self.plan.declared[&key];
                let id = self.plan.declared_id(key).unwrap_or(0);
                entry_check(&mut f, c, b, id, self.bound_idx());
            }
            if let Some(d) = d {
                let b = self.plan.declared[&key];
                f.instruction(&Instruction::I32Const(b as i32));
                f.instruction(&Instruction::LocalSet(d));
            }
            let period = p.map(|_| self.plan.polls[&key]);
            if let (Some(p), Some(period)) = (p, period) {
                f.instruction(&Instruction::I32Const(period as i32));
                f.instruction(&Instruction::LocalSet(p));
            }
            f.instruction(&inst);
            if let Some(d) = d {
                let id = self.plan.declared_id(key).unwrap_or(0);
                count_down_bound(&mut f, d, id, self.bound_idx());
            }
            if let (Some(p), Some(period)) = (p, period) {
                count_down_poll(&mut f, p, period, self.poll_idx());
            }
        }
        code.function(&f);
        Ok(())
    }
}

/// Emits, before a counted loop (`local + delta` stepping by `step` while `< m` or
/// `!= m`), a check that traps through `sidecore.bound_exceeded(id)` unless the loop's
/// own exit test allows at most `bound` body starts:
/// `(m > v0 && m - v0 > (bound-1)·step) || m >u 2^bits - step` (`<`), or
/// `(m - v0) & (step-1) != 0 || m - v0 > (bound-1)·step` (`!=`), with `v0 = local + delta`.
fn entry_check(f: &mut Function, c: &crate::loops::Counted, bound: u64, id: u32, bound_idx: u32) {
    let lim = (bound.saturating_sub(1) as i128 * c.step as i128) as i64;
    let (add, sub, gtu, and, ne) = if c.wide {
        (
            Instruction::I64Add,
            Instruction::I64Sub,
            Instruction::I64GtU,
            Instruction::I64And,
            Instruction::I64Ne,
        )
    } else {
        (
            Instruction::I32Add,
            Instruction::I32Sub,
            Instruction::I32GtU,
            Instruction::I32And,
            Instruction::I32Ne,
        )
    };
    let k = |v: i64| {
        if c.wide {
            Instruction::I64Const(v)
        } else {
            Instruction::I32Const(v as i32)
        }
    };
    let v0 = |f: &mut Function| {
        f.instruction(&Instruction::LocalGet(c.local));
        f.instruction(&k(c.delta));
        f.instruction(&add);
    };
    // diff = m - v0
    let diff = |f: &mut Function| {
        f.instruction(&Instruction::LocalGet(c.m));
        v0(f);
        f.instruction(&sub);
    };
    if c.ne {
        diff(f);
        f.instruction(&k(c.step - 1));
        f.instruction(&and);
        f.instruction(&k(0));
        f.instruction(&ne);
        diff(f);
        f.instruction(&k(lim));
        f.instruction(&gtu);
        f.instruction(&Instruction::I32Or);
    } else {
        diff(f);
        f.instruction(&k(lim));
        f.instruction(&gtu);
        f.instruction(&Instruction::LocalGet(c.m));
        v0(f);
        f.instruction(&gtu);
        f.instruction(&Instruction::I32And);
        // v < m, so v + step wraps only if m >u 2^bits - step (i.e. `-step` unsigned)
        f.instruction(&Instruction::LocalGet(c.m));
        f.instruction(&k(-c.step));
        f.instruction(&gtu);
        f.instruction(&Instruction::I32Or);
    }
    f.instruction(&Instruction::If(BlockType::Empty));
    f.instruction(&Instruction::I32Const(id as i32));
    f.instruction(&Instruction::Call(bound_idx));
    f.instruction(&Instruction::Unreachable);
    f.instruction(&Instruction::End);
}

/// Why a module could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error(transparent)]
    Parse(#[from] wasmparser::BinaryReaderError),
    /// The re-encoder's error, in its debug form (it says which item failed).
    #[error("instrumentation failed: {0:?}")]
    Reencode(ReError<Infallible>),
}

/// Rewrites `bytes` according to `plan`.
pub fn rewrite(bytes: &[u8], plan: &Plan) -> Result<Vec<u8>, RewriteError> {
    // Facts needed up front: number of types, whether there is an import section, and
    // each defined function's parameter count.
    let mut n_types = 0u32;
    let mut had_imports = false;
    let mut type_params: Vec<u32> = Vec::new();
    let mut func_types: Vec<u32> = Vec::new();
    for p in wasmparser::Parser::new(0).parse_all(bytes) {
        match p? {
            wasmparser::Payload::TypeSection(r) => {
                for rg in r {
                    for st in rg?.types() {
                        n_types += 1;
                        let n = match &st.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => f.params().len() as u32,
                            _ => 0,
                        };
                        type_params.push(n);
                    }
                }
            }
            wasmparser::Payload::ImportSection(_) => had_imports = true,
            wasmparser::Payload::FunctionSection(r) => {
                for t in r {
                    func_types.push(t?);
                }
            }
            _ => {}
        }
    }
    let param_count: BTreeMap<u32, u32> = func_types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                plan.n_imported + i as u32,
                type_params.get(*t as usize).copied().unwrap_or(0),
            )
        })
        .collect();
    let mut rw = Rewriter {
        plan,
        n_types,
        had_imports,
        imports_done: false,
        next_defined: plan.n_imported,
        param_count,
    };
    let mut module = wasm_encoder::Module::new();
    rw.parse_core_module(&mut module, wasmparser::Parser::new(0), bytes)
        .map_err(RewriteError::Reencode)?;
    Ok(module.finish())
}

/// At a loop's head: trap through `bound_exceeded(id)` when the declared-bound
/// counter in local `d` has run out, else count it down.
fn count_down_bound(f: &mut Function, d: u32, id: u32, bound_idx: u32) {
    f.instruction(&Instruction::LocalGet(d));
    f.instruction(&Instruction::I32Eqz);
    f.instruction(&Instruction::If(BlockType::Empty));
    f.instruction(&Instruction::I32Const(id as i32));
    f.instruction(&Instruction::Call(bound_idx));
    f.instruction(&Instruction::Unreachable);
    f.instruction(&Instruction::End);
    f.instruction(&Instruction::LocalGet(d));
    f.instruction(&Instruction::I32Const(1));
    f.instruction(&Instruction::I32Sub);
    f.instruction(&Instruction::LocalSet(d));
}

/// At a loop's head: count the poll counter in local `p` down and, every
/// `period` iterations, call the budget poll and start again.
fn count_down_poll(f: &mut Function, p: u32, period: u64, poll_idx: u32) {
    f.instruction(&Instruction::LocalGet(p));
    f.instruction(&Instruction::I32Const(1));
    f.instruction(&Instruction::I32Sub);
    f.instruction(&Instruction::LocalTee(p));
    f.instruction(&Instruction::I32Eqz);
    f.instruction(&Instruction::If(BlockType::Empty));
    f.instruction(&Instruction::Call(poll_idx));
    f.instruction(&Instruction::I32Const(period as i32));
    f.instruction(&Instruction::LocalSet(p));
    f.instruction(&Instruction::End);
}
