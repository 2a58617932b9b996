//! Parsing and validating an untrusted module into the facts the analysis needs:
//! types, imports, function bodies (as operator lists with byte offsets), exports,
//! the table's contents, memory limits, names and the declared-bounds section.

use std::collections::BTreeMap;

use wasmparser::{
    CustomSectionReader, Element, ElementItems, ElementKind, ExportSectionReader, ExternalKind,
    FuncToValidate, FuncType, FuncValidator, FuncValidatorAllocations, FunctionBody,
    ImportSectionReader, MemorySectionReader, Operator, Parser, Payload, TableSectionReader,
    TypeRef, TypeSectionReader, ValType, Validator, ValidatorResources, WasmFeatures,
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
pub fn parse(bytes: &'_ [u8]) -> Result<ModuleInfo<'_>, Reason> {
    let mut validator = Validator::new_with_features(features());
    let mut p = ModuleParser::default();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(malformed)?;
        let valid = validator.payload(&payload).map_err(malformed)?;
        p.section(&payload)?;
        if let wasmparser::ValidPayload::Func(fv, body) = valid {
            p.code_entry(fv, body)?;
        }
    }
    Ok(p.finish())
}

/// A decoding or validation error as the reason a module is malformed.
fn malformed(e: impl std::fmt::Display) -> Reason {
    Reason::Malformed(e.to_string())
}

/// The state of one pass over a module's payloads: what is known so far, and what
/// decides the table's safety once every section has been seen.
#[derive(Default)]
struct ModuleParser<'a> {
    m: ModuleInfo<'a>,
    table_exported: bool,
    table_imported: bool,
    /// How many code entries have been seen.
    code_index: u32,
    allocs: FuncValidatorAllocations,
}

impl<'a> ModuleParser<'a> {
    /// Records what one payload says about the module (code entries are handled by
    /// [`Self::code_entry`]).
    fn section(&mut self, payload: &Payload<'a>) -> Result<(), Reason> {
        match payload {
            Payload::TypeSection(r) => self.types(r)?,
            Payload::ImportSection(r) => self.imports(r)?,
            Payload::FunctionSection(r) => {
                for t in r.clone() {
                    self.m.func_types.push(t.map_err(malformed)?);
                }
            }
            Payload::TableSection(r) => self.tables(r),
            Payload::MemorySection(r) => self.memories(r)?,
            Payload::ExportSection(r) => self.exports(r)?,
            Payload::StartSection { func, .. } => self.m.start = Some(*func),
            Payload::ElementSection(r) => {
                for el in r.clone() {
                    self.element(el.map_err(malformed)?)?;
                }
            }
            Payload::CustomSection(c) => self.custom(c),
            _ => {}
        }
        Ok(())
    }

    /// The type section: function types only.
    fn types(&mut self, r: &TypeSectionReader<'a>) -> Result<(), Reason> {
        for rg in r.clone() {
            let rg = rg.map_err(malformed)?;
            for st in rg.types() {
                match &st.composite_type.inner {
                    wasmparser::CompositeInnerType::Func(f) => self.m.types.push(f.clone()),
                    _ => return Err(Reason::Unsupported("non-function type".into())),
                }
            }
        }
        Ok(())
    }

    /// The import section: host ABI functions are recorded (and checked); any other
    /// import is a problem.
    fn imports(&mut self, r: &ImportSectionReader<'a>) -> Result<(), Reason> {
        for imp in r.clone().into_imports() {
            let imp = imp.map_err(malformed)?;
            self.import(imp.module, imp.name, imp.ty);
        }
        Ok(())
    }

    /// One import `module.name` of kind `ty`.
    fn import(&mut self, module: &str, name: &str, ty: TypeRef) {
        let m = &mut self.m;
        match ty {
            TypeRef::Func(t) => {
                let ty = m
                    .types
                    .get(t as usize)
                    .cloned()
                    .unwrap_or_else(|| FuncType::new([], []));
                check_import(m, module, name, &ty);
                m.imports.push(Import {
                    module: module.to_string(),
                    name: name.to_string(),
                    ty,
                });
                m.func_types.push(t);
            }
            TypeRef::Table(_) => {
                self.table_imported = true;
                m.has_table = true;
                m.problems.push(Reason::BadImport {
                    import: format!("{module}.{name}"),
                    why: "tables may not be imported".into(),
                });
            }
            other => m.problems.push(Reason::BadImport {
                import: format!("{module}.{name}"),
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

    /// The table section: at most one table.
    fn tables(&mut self, r: &TableSectionReader<'a>) {
        if r.count() > 0 {
            self.m.has_table = true;
        }
        if r.count() > 1 {
            self.m
                .problems
                .push(Reason::Unsupported("more than one table".into()));
        }
    }

    /// The memory section: its size in bytes; shared or 64-bit memory is a problem.
    fn memories(&mut self, r: &MemorySectionReader<'a>) -> Result<(), Reason> {
        for mem in r.clone() {
            let mem = mem.map_err(malformed)?;
            if mem.shared || mem.memory64 {
                self.m
                    .problems
                    .push(Reason::Unsupported("shared or 64-bit linear memory".into()));
            }
            let page = 1u64 << mem.page_size_log2.unwrap_or(16);
            self.m.memory = Some((
                mem.initial.saturating_mul(page),
                mem.maximum.map(|x| x.saturating_mul(page)),
            ));
        }
        Ok(())
    }

    /// The export section: exported functions, and whether the table is exported.
    fn exports(&mut self, r: &ExportSectionReader<'a>) -> Result<(), Reason> {
        for e in r.clone() {
            let e = e.map_err(malformed)?;
            match e.kind {
                ExternalKind::Func => self.m.exports.push((e.name.to_string(), e.index)),
                ExternalKind::Table => self.table_exported = true,
                _ => {}
            }
        }
        Ok(())
    }

    /// One element segment: an active segment for table 0 at a constant offset fills
    /// in the table's contents; anything else makes them unknowable or is ignored.
    fn element(&mut self, el: Element<'a>) -> Result<(), Reason> {
        let offset = match &el.kind {
            ElementKind::Active {
                table_index,
                offset_expr,
            } => {
                if table_index.unwrap_or(0) != 0 {
                    self.m.table_unsafe = Some("element segment for a table other than 0".into());
                    return Ok(());
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
                self.m.table_unsafe = Some("an element segment's offset is not a constant".into());
            }
            return Ok(());
        };
        match el.items {
            ElementItems::Functions(fs) => {
                for (i, f) in fs.into_iter().enumerate() {
                    let f = f.map_err(malformed)?;
                    self.m.table.insert(offset.wrapping_add(i as u32), f);
                }
            }
            ElementItems::Expressions(..) => {
                self.m.table_unsafe = Some("element segment given as expressions".into());
            }
        }
        Ok(())
    }

    /// A custom section: the declared bounds, or the function names of the `name`
    /// section.
    fn custom(&mut self, c: &CustomSectionReader<'a>) {
        if c.name() == bounds::SECTION {
            match bounds::parse(c.data()) {
                Ok(mut d) => self.m.declared.append(&mut d),
                Err(e) => self.m.problems.push(Reason::BadBoundsSection(e)),
            }
        } else if c.name() == "name" {
            let nr = wasmparser::NameSectionReader::new(wasmparser::BinaryReader::new(
                c.data(),
                c.data_offset(),
            ));
            for n in nr.flatten() {
                if let wasmparser::Name::Function(map) = n {
                    for naming in map.into_iter().flatten() {
                        self.m.names.insert(naming.index, naming.name.to_string());
                    }
                }
            }
        }
    }

    /// One code entry: validates the body operator by operator and records it with its
    /// locals count and highest operand-stack height.
    fn code_entry(
        &mut self,
        fv: FuncToValidate<ValidatorResources>,
        body: FunctionBody<'a>,
    ) -> Result<(), Reason> {
        let mut fv = fv.into_validator(std::mem::take(&mut self.allocs));
        let index = self.m.n_imported() + self.code_index;
        self.code_index += 1;
        let n_locals = read_locals(&mut fv, &body)?;
        let mut ops = Vec::new();
        let mut max_height = 0u32;
        let mut rd = body.get_operators_reader().map_err(malformed)?;
        while !rd.eof() {
            let off = rd.original_position();
            let op = rd.read().map_err(malformed)?;
            fv.op(off, &op).map_err(malformed)?;
            max_height = max_height.max(fv.operand_stack_height());
            ops.push((off as usize, op));
        }
        if fv.control_stack_height() != 0 {
            return Err(Reason::Malformed(format!(
                "function {index}: body does not end where its code entry does"
            )));
        }
        self.allocs = fv.into_allocations();
        let ty = self
            .m
            .func_type(index)
            .cloned()
            .unwrap_or_else(|| FuncType::new([], []));
        self.m.bodies.push(Body {
            index,
            ty,
            n_locals,
            ops,
            max_height,
        });
        Ok(())
    }

    /// The module, once every payload has been seen: an exported or imported table,
    /// or one changed at run time, cannot be reasoned about.
    fn finish(self) -> ModuleInfo<'a> {
        let mut m = self.m;
        if self.table_exported {
            m.table_unsafe = Some("the table is exported, so the host side could change it".into());
        }
        if self.table_imported {
            m.table_unsafe = Some("the table is imported".into());
        }
        // Table mutation anywhere makes its contents unknowable.
        if let Some(why) = table_mutation(&m) {
            m.table_unsafe = Some(why);
        }
        m
    }
}

/// Validates the local declarations of `body`, returning how many locals it declares.
fn read_locals(
    fv: &mut FuncValidator<ValidatorResources>,
    body: &FunctionBody<'_>,
) -> Result<u32, Reason> {
    let mut n_locals = 0u32;
    let mut lr = body.get_locals_reader().map_err(malformed)?;
    for _ in 0..lr.get_count() {
        let off = lr.original_position();
        let (cnt, ty) = lr.read().map_err(malformed)?;
        fv.define_locals(off, cnt, ty).map_err(malformed)?;
        n_locals = n_locals.saturating_add(cnt);
    }
    Ok(n_locals)
}

/// The first operator of any body that changes the table at run time, described.
fn table_mutation(m: &ModuleInfo<'_>) -> Option<String> {
    for b in &m.bodies {
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
            return Some(format!(
                "{what} in {} at offset {off:#x} changes the table at run time",
                m.func_name(b.index)
            ));
        }
    }
    None
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
