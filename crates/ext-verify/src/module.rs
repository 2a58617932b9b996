//! Parsing and validating an untrusted module into the facts the analysis needs:
//! types, imports, function bodies (as operator lists with byte offsets), exports,
//! the table's contents, memory limits, names and the declared-bounds section.

use std::collections::BTreeMap;

use wasmparser::{
    ElementItems, ElementKind, ExternalKind, FuncType, Operator, Parser, Payload, TypeRef, ValType,
    Validator, WasmFeatures,
};

use crate::abi;
use crate::bounds::{self, DeclaredBound};
use crate::error::Reason;

/// One function body, ready for analysis.
#[derive(Debug, Clone)]
pub struct Body<'a> {
    /// Index in the module's function index space.
    pub index: u32,
    pub ty: FuncType,
    /// Declared locals (not counting parameters).
    pub n_locals: u32,
    pub ops: Vec<(usize, Operator<'a>)>,
    /// Highest operand-stack height the validator saw.
    pub max_height: u32,
}

/// An imported function.
#[derive(Debug, Clone)]
pub struct Import {
    pub module: String,
    pub name: String,
    pub ty: FuncType,
}

/// What the analysis knows about a module.
#[derive(Debug, Clone, Default)]
pub struct ModuleInfo<'a> {
    pub types: Vec<FuncType>,
    pub imports: Vec<Import>,
    /// Type index of every function, imports first.
    pub func_types: Vec<u32>,
    pub bodies: Vec<Body<'a>>,
    pub exports: Vec<(String, u32)>,
    pub start: Option<u32>,
    /// Contents of table 0 (index → function) when it is safe to reason about.
    pub table: BTreeMap<u32, u32>,
    /// Why `call_indirect` cannot be bounded, if it cannot.
    pub table_unsafe: Option<String>,
    pub has_table: bool,
    /// Initial and maximum memory size in bytes (None if no memory).
    pub memory: Option<(u64, Option<u64>)>,
    pub names: BTreeMap<u32, String>,
    pub declared: Vec<DeclaredBound>,
    pub problems: Vec<Reason>,
}

impl<'a> ModuleInfo<'a> {
    pub fn n_imported(&self) -> u32 {
        self.imports.len() as u32
    }

    /// A human name for function `f`.
    pub fn func_name(&self, f: u32) -> String {
        if let Some(e) = self.exports.iter().find(|(_, i)| *i == f) {
            return e.0.clone();
        }
        if let Some(n) = self.names.get(&f) {
            return n.clone();
        }
        if let Some(i) = self.imports.get(f as usize) {
            return format!("{}.{}", i.module, i.name);
        }
        format!("func[{f}]")
    }

    pub fn body(&self, f: u32) -> Option<&Body<'a>> {
        f.checked_sub(self.n_imported())
            .and_then(|i| self.bodies.get(i as usize))
    }

    pub fn func_type(&self, f: u32) -> Option<&FuncType> {
        self.func_types
            .get(f as usize)
            .and_then(|t| self.types.get(*t as usize))
    }
}

/// Features sidecore admits: Wasm 2.0 without SIMD, plus the `lime1` extras that current
/// compilers emit. No threads, atomics, exceptions, GC, tail calls, memory64 or
/// multi-memory.
pub fn features() -> WasmFeatures {
    (WasmFeatures::WASM2 | WasmFeatures::LIME1) - WasmFeatures::SIMD - WasmFeatures::RELAXED_SIMD
}

/// Parses and validates `bytes`. Structural problems that make analysis impossible are
/// returned as `Err`; policy problems (bad imports, table writes, ...) go in `problems`.
#[allow(clippy::too_many_lines)] // TODO(issue 10): split; one pass over shared analysis state, left whole this session
pub fn parse(bytes: &'_ [u8]) -> Result<ModuleInfo<'_>, Reason> {
    let mut validator = Validator::new_with_features(features());
    let mut m = ModuleInfo::default();
    let mut table_exported = false;
    let mut table_imported = false;
    let mut code_index = 0u32;
    let mut allocs = wasmparser::FuncValidatorAllocations::default();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| Reason::Malformed(e.to_string()))?;
        let valid = validator
            .payload(&payload)
            .map_err(|e| Reason::Malformed(e.to_string()))?;
        match &payload {
            Payload::TypeSection(r) => {
                for rg in r.clone() {
                    let rg = rg.map_err(|e| Reason::Malformed(e.to_string()))?;
                    for st in rg.types() {
                        match &st.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => m.types.push(f.clone()),
                            _ => return Err(Reason::Unsupported("non-function type".into())),
                        }
                    }
                }
            }
            Payload::ImportSection(r) => {
                for imp in r.clone().into_imports() {
                    let imp = imp.map_err(|e| Reason::Malformed(e.to_string()))?;
                    match imp.ty {
                        TypeRef::Func(t) => {
                            let ty = m
                                .types
                                .get(t as usize)
                                .cloned()
                                .unwrap_or_else(|| FuncType::new([], []));
                            check_import(&mut m, imp.module, imp.name, &ty);
                            m.imports.push(Import {
                                module: imp.module.to_string(),
                                name: imp.name.to_string(),
                                ty,
                            });
                            m.func_types.push(t);
                        }
                        TypeRef::Table(_) => {
                            table_imported = true;
                            m.has_table = true;
                            m.problems.push(Reason::BadImport {
                                import: format!("{}.{}", imp.module, imp.name),
                                why: "tables may not be imported".into(),
                            });
                        }
                        other => m.problems.push(Reason::BadImport {
                            import: format!("{}.{}", imp.module, imp.name),
                            why: format!(
                                "only functions of the host ABI may be imported, not a {}",
                                match other {
                                    TypeRef::Memory(_) => "memory",
                                    TypeRef::Global(_) => "global",
                                    TypeRef::Tag(_) => "tag",
                                    _ => "non-function",
                                }
                            ),
                        }),
                    }
                }
            }
            Payload::FunctionSection(r) => {
                for t in r.clone() {
                    m.func_types
                        .push(t.map_err(|e| Reason::Malformed(e.to_string()))?);
                }
            }
            Payload::TableSection(r) => {
                if r.count() > 0 {
                    m.has_table = true;
                }
                if r.count() > 1 {
                    m.problems
                        .push(Reason::Unsupported("more than one table".into()));
                }
            }
            Payload::MemorySection(r) => {
                for mem in r.clone() {
                    let mem = mem.map_err(|e| Reason::Malformed(e.to_string()))?;
                    if mem.shared || mem.memory64 {
                        m.problems
                            .push(Reason::Unsupported("shared or 64-bit linear memory".into()));
                    }
                    let page = 1u64 << mem.page_size_log2.unwrap_or(16);
                    m.memory = Some((
                        mem.initial.saturating_mul(page),
                        mem.maximum.map(|x| x.saturating_mul(page)),
                    ));
                }
            }
            Payload::ExportSection(r) => {
                for e in r.clone() {
                    let e = e.map_err(|e| Reason::Malformed(e.to_string()))?;
                    match e.kind {
                        ExternalKind::Func => m.exports.push((e.name.to_string(), e.index)),
                        ExternalKind::Table => table_exported = true,
                        _ => {}
                    }
                }
            }
            Payload::StartSection { func, .. } => m.start = Some(*func),
            Payload::ElementSection(r) => {
                for el in r.clone() {
                    let el = el.map_err(|e| Reason::Malformed(e.to_string()))?;
                    let offset = match &el.kind {
                        ElementKind::Active {
                            table_index,
                            offset_expr,
                        } => {
                            if table_index.unwrap_or(0) != 0 {
                                m.table_unsafe =
                                    Some("element segment for a table other than 0".into());
                                continue;
                            }
                            let mut rd = offset_expr.get_operators_reader();
                            match rd.read() {
                                Ok(Operator::I32Const { value }) => Some(value as u32),
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    let Some(offset) = offset else {
                        if matches!(el.kind, ElementKind::Active { .. }) {
                            m.table_unsafe =
                                Some("an element segment's offset is not a constant".into());
                        }
                        continue;
                    };
                    match el.items {
                        ElementItems::Functions(fs) => {
                            for (i, f) in fs.into_iter().enumerate() {
                                let f = f.map_err(|e| Reason::Malformed(e.to_string()))?;
                                m.table.insert(offset.wrapping_add(i as u32), f);
                            }
                        }
                        ElementItems::Expressions(..) => {
                            m.table_unsafe = Some("element segment given as expressions".into());
                        }
                    }
                }
            }
            Payload::CustomSection(c) => {
                if c.name() == bounds::SECTION {
                    match bounds::parse(c.data()) {
                        Ok(mut d) => m.declared.append(&mut d),
                        Err(e) => m.problems.push(Reason::BadBoundsSection(e)),
                    }
                } else if c.name() == "name" {
                    let nr = wasmparser::NameSectionReader::new(wasmparser::BinaryReader::new(
                        c.data(),
                        c.data_offset(),
                    ));
                    for n in nr.flatten() {
                        if let wasmparser::Name::Function(map) = n {
                            for naming in map.into_iter().flatten() {
                                m.names.insert(naming.index, naming.name.to_string());
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        if let wasmparser::ValidPayload::Func(fv, body) = valid {
            let mut fv = fv.into_validator(std::mem::take(&mut allocs));
            let index = m.n_imported() + code_index;
            code_index += 1;
            let mut n_locals = 0u32;
            let mut lr = body
                .get_locals_reader()
                .map_err(|e| Reason::Malformed(e.to_string()))?;
            for _ in 0..lr.get_count() {
                let off = lr.original_position();
                let (cnt, ty) = lr.read().map_err(|e| Reason::Malformed(e.to_string()))?;
                fv.define_locals(off, cnt, ty)
                    .map_err(|e| Reason::Malformed(e.to_string()))?;
                n_locals = n_locals.saturating_add(cnt);
            }
            let mut ops = Vec::new();
            let mut max_height = 0u32;
            let mut rd = body
                .get_operators_reader()
                .map_err(|e| Reason::Malformed(e.to_string()))?;
            while !rd.eof() {
                let off = rd.original_position();
                let op = rd.read().map_err(|e| Reason::Malformed(e.to_string()))?;
                fv.op(off, &op)
                    .map_err(|e| Reason::Malformed(e.to_string()))?;
                max_height = max_height.max(fv.operand_stack_height());
                ops.push((off as usize, op));
            }
            if fv.control_stack_height() != 0 {
                return Err(Reason::Malformed(format!(
                    "function {index}: body does not end where its code entry does"
                )));
            }
            allocs = fv.into_allocations();
            let ty = m
                .func_type(index)
                .cloned()
                .unwrap_or_else(|| FuncType::new([], []));
            m.bodies.push(Body {
                index,
                ty,
                n_locals,
                ops,
                max_height,
            });
        }
    }
    if table_exported {
        m.table_unsafe = Some("the table is exported, so the host side could change it".into());
    }
    if table_imported {
        m.table_unsafe = Some("the table is imported".into());
    }
    // Table mutation anywhere makes its contents unknowable.
    'scan: for b in &m.bodies {
        for (off, op) in &b.ops {
            let what = match op {
                Operator::TableSet { .. } => "table.set",
                Operator::TableGrow { .. } => "table.grow",
                Operator::TableFill { .. } => "table.fill",
                Operator::TableCopy { .. } => "table.copy",
                Operator::TableInit { .. } => "table.init",
                Operator::ElemDrop { .. } => "elem.drop",
                _ => continue,
            };
            m.table_unsafe = Some(format!(
                "{what} in {} at offset {off:#x} changes the table at run time",
                m.func_name(b.index)
            ));
            break 'scan;
        }
    }
    Ok(m)
}

fn check_import(m: &mut ModuleInfo<'_>, module: &str, name: &str, ty: &FuncType) {
    let full = format!("{module}.{name}");
    if module != abi::MODULE {
        m.problems.push(Reason::BadImport {
            import: full,
            why: format!(
                "not part of sidecore's host ABI (allowed: {})",
                abi::allowed_list()
            ),
        });
        return;
    }
    let Some(h) = abi::host_fn(name) else {
        m.problems.push(Reason::BadImport {
            import: full,
            why: format!("no such host function (allowed: {})", abi::allowed_list()),
        });
        return;
    };
    if !abi::same_signature(ty.params(), ty.results(), h) {
        m.problems.push(Reason::BadImport {
            import: full,
            why: format!(
                "wrong signature {:?} -> {:?}; the ABI has {:?} -> {:?}",
                ty.params(),
                ty.results(),
                h.params,
                h.results
            ),
        });
    }
}

/// Helper for tests and the runtime: the value types of a function's parameters.
pub fn param_types(t: &FuncType) -> Vec<ValType> {
    t.params().to_vec()
}
