//! Loading: reads the root manifest, follows `file` imports recursively (with
//! cycle detection), checks every field, resolves names to indices and collects
//! every problem as a diagnostic pointing at its file, line and column.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sidecore_types::{
    Cast, ChannelProps, ConstraintKind, Delivery, Guid, Order, PeKind, Priority, SchedPolicy,
};

use crate::calls::{self, UsesOf};
use crate::diag::{FileId, ManifestError, Report, Sources, also, note};
use crate::model::*;
use crate::props;
use crate::raw::*;
use crate::restart;
use crate::timing;

/// Default CPU share of an offcode: a whole core.
pub const DEFAULT_CPU: f64 = 1.0;
/// Default memory of an offcode.
pub const DEFAULT_MEMORY: u64 = 1 << 20;
/// Deepest chain of file imports followed.
pub const MAX_IMPORT_DEPTH: usize = 32;

/// Loads and validates the manifest at `path` and everything it imports.
pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
    let mut l = Loader::new(true);
    l.load_root(path, None);
    l.finish(path)
}

/// Validates manifest text that is not on disk (`name` is used in messages).
/// File imports are refused: there is no directory to resolve them against.
pub fn parse_str(name: &str, text: &str) -> Result<Manifest, ManifestError> {
    let mut l = Loader::new(false);
    l.load_root(Path::new(name), Some(text.to_string()));
    l.finish(Path::new(name))
}

/// An offcode checked field by field, its imports not yet resolved.
struct Pending {
    offcode: Offcode,
    file: FileId,
    name_span: Range<usize>,
    id_span: Range<usize>,
    imports: Vec<S<RawImport>>,
    uses: Vec<S<RawUse>>,
}

struct Loader {
    allow_files: bool,
    sources: Sources,
    report: Report,
    pending: Vec<Pending>,
    /// Files being loaded, innermost last: (canonical path, file id).
    stack: Vec<(PathBuf, FileId)>,
    channels: Vec<(FileId, S<RawChannel>)>,
    app: Option<(String, Option<String>)>,
    library: Vec<PathBuf>,
    scheduler: SchedPolicy,
}

fn is_name(s: &str, allow_dot: bool) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && s.len() <= 64
        && chars
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || (allow_dot && c == '.'))
}

fn keyword<T: std::str::FromStr<Err = sidecore_types::UnknownKeyword>>(
    report: &mut Report,
    file: FileId,
    v: &S<String>,
    field: &str,
) -> Option<T> {
    match v.get_ref().parse::<T>() {
        Ok(k) => Some(k),
        Err(e) => {
            report.error(
                file,
                v.span(),
                format!("`{field}`: {e}"),
                format!("not a valid {}", e.what),
            );
            None
        }
    }
}

fn guid(report: &mut Report, file: FileId, v: &S<String>, field: &str) -> Option<Guid> {
    match Guid::parse_str(v.get_ref()) {
        Ok(g) => Some(g),
        Err(_) => {
            let d = report.error(
                file,
                v.span(),
                format!("`{field}` must be a 128-bit GUID, got `{}`", v.get_ref()),
                "not a GUID",
            );
            note(
                d,
                "write it like \"5b0c1e7a-2d43-4f4e-9b0a-6c1f0e6f2a01\" (`uuidgen` prints one)",
            );
            None
        }
    }
}

fn memory(report: &mut Report, file: FileId, v: &S<toml::Value>, field: &str) -> Option<u64> {
    let bytes = match v.get_ref() {
        toml::Value::Integer(i) if *i > 0 => Some(*i as u64),
        toml::Value::String(s) => s.parse::<bytesize::ByteSize>().ok().map(|b| b.as_u64()),
        _ => None,
    };
    match bytes {
        Some(b) if b > 0 => Some(b),
        _ => {
            let d = report.error(
                file,
                v.span(),
                format!("`{field}` must be a positive size, got {}", v.get_ref()),
                "not a size",
            );
            note(
                d,
                "write a byte count (65536) or a size with a unit (\"64KiB\", \"16MiB\", \"1GiB\")",
            );
            None
        }
    }
}

fn cpu_share(report: &mut Report, file: FileId, v: &S<f64>, field: &str) -> Option<f64> {
    let c = *v.get_ref();
    if c.is_finite() && c > 0.0 && c <= 1.0 {
        Some(c)
    } else {
        report.error(
            file,
            v.span(),
            format!("`{field}` is a share of one core and must be in (0, 1], got {c}"),
            "out of range",
        );
        None
    }
}

fn millis(report: &mut Report, file: FileId, v: &S<i64>, field: &str) -> Option<Duration> {
    let ms = *v.get_ref();
    if ms > 0 {
        Some(Duration::from_millis(ms as u64))
    } else {
        report.error(
            file,
            v.span(),
            format!("`{field}` must be a positive number of milliseconds, got {ms}"),
            "must be > 0",
        );
        None
    }
}

/// An offcode's CPU share: `cpu` as written (at least what its timing needs),
/// else a periodic offcode's `wcet/period` (HYDRA Eq. 7.6), else a whole core.
fn offcode_cpu(
    r: &mut Report,
    file: FileId,
    cpu: Option<&S<f64>>,
    timing: Option<timing::Timing>,
) -> Option<f64> {
    match (cpu, timing.and_then(|t| t.utilisation())) {
        (Some(v), u) => cpu_share(r, file, v, "cpu").filter(|&c| {
            let fits = u.is_none_or(|u| c + 1e-9 >= u);
            if !fits {
                r.error(
                    file,
                    v.span(),
                    format!(
                        "`cpu` = {c} is below the share its timing needs (wcet/period = {:.4})",
                        u.unwrap_or_default()
                    ),
                    "too small for wcet_us/period_ms",
                );
            }
            fits
        }),
        (None, Some(u)) => Some(u.max(f64::MIN_POSITIVE)),
        (None, None) => Some(DEFAULT_CPU),
    }
}

/// Properties each PE kind understands in `require`, with their types.
fn known_props(kind: PeKind) -> &'static [(&'static str, &'static str)] {
    match kind {
        PeKind::Core => &[("isolated", "bool"), ("cpu", "int"), ("numa", "int")],
        PeKind::Kernel => &[("xdp", "bool"), ("btf", "bool")],
        PeKind::Wasm => &[],
        PeKind::Node => &[("name", "string")],
        PeKind::Gpu => &[("vendor", "string")],
        PeKind::Host => &[],
    }
}

impl Loader {
    fn new(allow_files: bool) -> Self {
        Loader {
            allow_files,
            sources: Sources::default(),
            report: Report::default(),
            pending: Vec::new(),
            stack: Vec::new(),
            channels: Vec::new(),
            app: None,
            library: Vec::new(),
            scheduler: SchedPolicy::default(),
        }
    }

    fn load_root(&mut self, path: &Path, text: Option<String>) {
        self.load_file(path, text, None);
    }

    /// Loads one file; `via` is the import that asked for it.
    fn load_file(
        &mut self,
        path: &Path,
        text: Option<String>,
        via: Option<(FileId, Range<usize>)>,
    ) {
        let canonical = if text.is_some() {
            path.to_path_buf()
        } else {
            match std::fs::canonicalize(path) {
                Ok(p) => p,
                Err(e) => {
                    self.missing_file(path, &e.to_string(), via);
                    return;
                }
            }
        };
        if let Some(pos) = self.stack.iter().position(|(p, _)| *p == canonical) {
            let chain: Vec<String> = self.stack[pos..]
                .iter()
                .map(|(_, f)| self.sources.name(*f))
                .chain(std::iter::once(self.sources.name(self.stack[pos].1)))
                .collect();
            if let Some((file, span)) = via {
                let d = self.report.error(
                    file,
                    span,
                    format!("import cycle: {}", chain.join(" → ")),
                    "this import leads back to a file that is still being loaded",
                );
                note(
                    d,
                    "files may share offcodes through a third file, but must not import each other in a cycle",
                );
            }
            return;
        }
        if self.sources.find(&canonical).is_some() {
            return;
        }
        if self.stack.len() >= MAX_IMPORT_DEPTH {
            if let Some((file, span)) = via {
                self.report.error(
                    file,
                    span,
                    format!("imports nest deeper than {MAX_IMPORT_DEPTH} files"),
                    "too deep",
                );
            }
            return;
        }
        let text = match text {
            Some(t) => t,
            None => match std::fs::read_to_string(&canonical) {
                Ok(t) => t,
                Err(e) => {
                    self.missing_file(path, &e.to_string(), via);
                    return;
                }
            },
        };
        let file = self.sources.add(&canonical, display_name(path), text);
        let raw: RawFile = match toml::from_str(self.sources.text(file)) {
            Ok(r) => r,
            Err(e) => {
                let span = e.span().unwrap_or(0..0);
                let msg = e.message().trim().to_string();
                self.report
                    .error(file, span, format!("invalid manifest: {msg}"), msg.clone());
                return;
            }
        };
        self.stack.push((canonical, file));
        self.file_contents(file, raw, via.is_none());
        self.stack.pop();
    }

    fn missing_file(&mut self, path: &Path, why: &str, via: Option<(FileId, Range<usize>)>) {
        match via {
            Some((file, span)) => {
                self.report.error(
                    file,
                    span,
                    format!("cannot read imported manifest `{}`: {why}", path.display()),
                    "imported here",
                );
            }
            None => self.report.diagnostics.push(
                codespan_reporting::diagnostic::Diagnostic::error()
                    .with_message(format!("cannot read manifest `{}`: {why}", path.display())),
            ),
        }
    }

    fn base_dir(&self, file: FileId) -> PathBuf {
        self.sources
            .path(file)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    fn file_contents(&mut self, file: FileId, raw: RawFile, is_root: bool) {
        if let Some(app) = raw.app {
            let app = app.into_inner();
            if !is_name(app.name.get_ref(), true) {
                self.report.error(
                    file,
                    app.name.span(),
                    format!("app name `{}` is not a valid name", app.name.get_ref()),
                    "letters, digits, `_`, `-` and `.`, starting with a letter, at most 64",
                );
            }
            for lib in &app.library {
                self.library.push(self.base_dir(file).join(lib.get_ref()));
            }
            if is_root {
                if let Some(s) = &app.scheduler
                    && let Some(p) = keyword::<SchedPolicy>(&mut self.report, file, s, "scheduler")
                {
                    self.scheduler = p;
                }
                self.app = Some((app.name.into_inner(), app.description));
            }
        }
        if is_root && raw.offcode.is_empty() {
            self.report.diagnostics.push(
                codespan_reporting::diagnostic::Diagnostic::error()
                    .with_message(format!(
                        "manifest `{}` declares no offcodes",
                        self.sources.name(file)
                    ))
                    .with_labels(vec![codespan_reporting::diagnostic::Label::primary(
                        file,
                        0..0,
                    )])
                    .with_notes(vec!["add at least one [[offcode]] table".into()]),
            );
        }
        for oc in raw.offcode {
            self.offcode(file, oc);
        }
        for ch in raw.channel {
            self.channels.push((file, ch));
        }
    }

    /// Checks an offcode's name (valid, not declared before) and id (a GUID no
    /// other offcode has). Returns whether the name is a duplicate, and the id.
    fn identity(&mut self, file: FileId, raw: &RawOffcode, name: &str) -> (bool, Option<Guid>) {
        let r = &mut self.report;
        if !is_name(name, true) {
            r.error(
                file,
                raw.name.span(),
                format!("offcode name `{name}` is not a valid binding name"),
                "letters, digits, `_`, `-` and `.`, starting with a letter, at most 64",
            );
        }
        let duplicate = self.pending.iter().any(|p| p.offcode.name == *name);
        if let Some(prev) = self.pending.iter().find(|p| p.offcode.name == *name) {
            let (pf, ps) = (prev.file, prev.name_span.clone());
            let d = r.error(
                file,
                raw.name.span(),
                format!("offcode `{name}` is declared twice"),
                "second declaration",
            );
            also(d, pf, ps, "first declared here");
        }
        let id = guid(r, file, &raw.id, "id");
        if let Some(id) = id
            && let Some(prev) = self.pending.iter().find(|p| p.offcode.id == id)
        {
            let (pf, ps, pn) = (prev.file, prev.id_span.clone(), prev.offcode.name.clone());
            let d = r.error(
                file,
                raw.id.span(),
                format!("offcode `{name}` reuses the id of offcode `{pn}`"),
                "duplicate GUID",
            );
            also(d, pf, ps, format!("`{pn}` has this id"));
        }
        (duplicate, id)
    }

    /// Loads the files an offcode's imports name (each once; cycles are caught
    /// by `load_file`).
    fn file_imports(&mut self, file: FileId, imports: &[S<RawImport>]) {
        for imp in imports {
            if let Some(f) = &imp.get_ref().file {
                if !self.allow_files {
                    self.report.error(
                        file,
                        f.span(),
                        "file imports need a manifest on disk".to_string(),
                        "cannot resolve this path",
                    );
                    continue;
                }
                let path = self.base_dir(file).join(f.get_ref());
                self.load_file(&path, None, Some((file, f.span())));
            }
        }
    }

    fn offcode(&mut self, file: FileId, raw: S<RawOffcode>) {
        let table_span = raw.span();
        let raw = raw.into_inner();
        let name = raw.name.get_ref().clone();
        let (duplicate, id) = self.identity(file, &raw, &name);
        let r = &mut self.report;
        let priority = raw
            .priority
            .as_ref()
            .map(|p| keyword::<Priority>(r, file, p, "priority"))
            .unwrap_or(Some(Priority::Normal));
        let watchdog = raw
            .watchdog_ms
            .as_ref()
            .map(|v| millis(r, file, v, "watchdog_ms"));
        let obsolete = raw
            .obsolete_ms
            .as_ref()
            .map(|v| millis(r, file, v, "obsolete_ms"));
        let timing = timing::timing(r, file, raw.period_ms.as_ref(), raw.wcet_us.as_ref());
        let restart = restart::restart(r, file, &raw).unwrap_or_default();
        let cpu = offcode_cpu(r, file, raw.cpu.as_ref(), timing);
        let mem = raw
            .memory
            .as_ref()
            .map(|v| memory(r, file, v, "memory"))
            .unwrap_or(Some(DEFAULT_MEMORY));
        if let Some(imp) = &raw.implementation
            && !is_name(imp.get_ref(), true)
        {
            r.error(
                file,
                imp.span(),
                format!(
                    "`impl` `{}` is not a valid implementation name",
                    imp.get_ref()
                ),
                "not a name",
            );
        }
        check_ports(r, file, &raw);
        let interfaces = self.interfaces(file, &raw.interface);
        let targets = self.targets(file, &name, table_span.clone(), &raw.target);
        let params_origin = raw
            .params
            .as_ref()
            .map(|p| self.sources.origin(file, &p.span()));
        // Problems are already reported; keep the offcode (with stand-in values)
        // so that imports and channels naming it do not cascade into more errors.
        if duplicate {
            return;
        }
        let id = id.unwrap_or_default();
        let priority = priority.unwrap_or_default();
        let cpu = cpu.unwrap_or(DEFAULT_CPU);
        let mem = mem.unwrap_or(DEFAULT_MEMORY);
        let interfaces = interfaces.unwrap_or_default();
        let targets = targets.unwrap_or_default();
        let watchdog = watchdog.flatten();
        let timing = timing.unwrap_or_default();
        let obsolete = obsolete.flatten();
        self.file_imports(file, &raw.import);
        let origin = self.sources.origin(file, &raw.name.span());
        self.pending.push(Pending {
            offcode: Offcode {
                implementation: raw
                    .implementation
                    .map(toml::Spanned::into_inner)
                    .unwrap_or_else(|| name.clone()),
                name,
                id,
                description: raw.description,
                priority,
                watchdog,
                obsolete,
                restart,
                cpu,
                timing,
                memory: mem,
                inputs: raw.inputs.iter().map(|p| p.get_ref().clone()).collect(),
                outputs: raw.outputs.iter().map(|p| p.get_ref().clone()).collect(),
                params: raw
                    .params
                    .map(toml::Spanned::into_inner)
                    .unwrap_or_default(),
                params_origin,
                interfaces,
                targets,
                file: self.sources.path(file).to_path_buf(),
                origin,
            },
            file,
            name_span: raw.name.span(),
            id_span: raw.id.span(),
            imports: raw.import,
            uses: raw.uses,
        });
    }

    fn interfaces(&mut self, file: FileId, raw: &[S<RawInterface>]) -> Option<Vec<Interface>> {
        let r = &mut self.report;
        let mut out = Vec::new();
        let mut ok = true;
        for (i, itf) in raw.iter().enumerate() {
            let itf = itf.get_ref();
            if raw[..i]
                .iter()
                .any(|o| o.get_ref().name.get_ref() == itf.name.get_ref())
            {
                r.error(
                    file,
                    itf.name.span(),
                    format!("interface `{}` is declared twice", itf.name.get_ref()),
                    "duplicate",
                );
                ok = false;
            }
            let id = guid(r, file, &itf.id, "interface id");
            let mut methods = Vec::new();
            for (mi, m) in itf.methods.iter().enumerate() {
                let m = m.get_ref();
                let mid = match &m.id {
                    Some(v) if (1..=u16::MAX as i64).contains(v.get_ref()) => {
                        Some(*v.get_ref() as u16)
                    }
                    Some(v) => {
                        r.error(
                            file,
                            v.span(),
                            format!("method id must be in 1..=65535, got {}", v.get_ref()),
                            "out of range",
                        );
                        None
                    }
                    None => Some(mi as u16 + 1),
                };
                if itf.methods[..mi]
                    .iter()
                    .any(|o| o.get_ref().name.get_ref() == m.name.get_ref())
                {
                    r.error(
                        file,
                        m.name.span(),
                        format!(
                            "method `{}` is declared twice in interface `{}`",
                            m.name.get_ref(),
                            itf.name.get_ref()
                        ),
                        "duplicate",
                    );
                    ok = false;
                }
                let ty = |r: &mut Report, t: &S<String>| keyword::<ValueType>(r, file, t, "type");
                let params: Vec<_> = m.params.iter().map(|p| ty(r, p)).collect();
                let returns = m.returns.as_ref().map(|t| ty(r, t));
                let origin = self.sources.origin(file, &itf.methods[mi].span());
                match (mid, params.iter().all(Option::is_some), returns) {
                    (Some(id), true, Some(Some(ret))) => methods.push(Method {
                        name: m.name.get_ref().clone(),
                        id,
                        params: params.into_iter().flatten().collect(),
                        returns: Some(ret),
                        origin,
                    }),
                    (Some(id), true, None) => methods.push(Method {
                        name: m.name.get_ref().clone(),
                        id,
                        params: params.into_iter().flatten().collect(),
                        returns: None,
                        origin,
                    }),
                    _ => ok = false,
                }
            }
            for (mi, m) in methods.iter().enumerate() {
                if let Some(o) = methods[..mi].iter().find(|o| o.id == m.id) {
                    r.error(
                        file,
                        itf.methods[mi].span(),
                        format!(
                            "methods `{}` and `{}` share method id {}",
                            o.name, m.name, m.id
                        ),
                        "duplicate method id",
                    );
                    ok = false;
                }
            }
            match id {
                Some(id) => out.push(Interface {
                    name: itf.name.get_ref().clone(),
                    id,
                    methods,
                }),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A target's `require` table checked against the properties its kind
    /// has; `None` (with the problems reported) when any is unknown or mistyped.
    fn require(
        &mut self,
        file: FileId,
        kind: PeKind,
        req: Option<&S<toml::Table>>,
    ) -> Option<BTreeMap<String, PropValue>> {
        let mut ok = true;
        let mut require = BTreeMap::new();
        if let Some(req) = req {
            let known = known_props(kind);
            for (k, v) in req.get_ref() {
                let Some((_, ty)) = known.iter().find(|(n, _)| n == k) else {
                    let names: Vec<_> = known.iter().map(|(n, _)| format!("`{n}`")).collect();
                    self.report.error(
                        file,
                        req.span(),
                        format!(
                            "target kind `{kind}` has no property `{k}`; it understands: {}",
                            if names.is_empty() {
                                "none".to_string()
                            } else {
                                names.join(", ")
                            }
                        ),
                        "unknown property",
                    );
                    ok = false;
                    continue;
                };
                let pv = match (*ty, v) {
                    ("bool", toml::Value::Boolean(b)) => PropValue::Bool(*b),
                    ("int", toml::Value::Integer(i)) if *i >= 0 => PropValue::Int(*i),
                    ("string", toml::Value::String(s)) => PropValue::Str(s.clone()),
                    _ => {
                        self.report.error(
                            file,
                            req.span(),
                            format!("property `{k}` of target `{kind}` must be a {ty}, got {v}"),
                            "wrong type",
                        );
                        ok = false;
                        continue;
                    }
                };
                require.insert(k.clone(), pv);
            }
        }
        ok.then_some(require)
    }

    fn targets(
        &mut self,
        file: FileId,
        offcode: &str,
        table_span: Range<usize>,
        raw: &[S<RawTarget>],
    ) -> Option<Vec<Target>> {
        if raw.is_empty() {
            let d = self.report.error(
                file,
                table_span.start..table_span.start,
                format!("offcode `{offcode}` declares no target"),
                "in this offcode",
            );
            note(
                d,
                "add at least one [[offcode.target]]; kind = \"host\" runs it on an ordinary thread",
            );
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        for (i, t) in raw.iter().enumerate() {
            let t = t.get_ref();
            let Some(kind) = keyword::<PeKind>(&mut self.report, file, &t.kind, "kind") else {
                ok = false;
                continue;
            };
            if raw[..i]
                .iter()
                .any(|o| o.get_ref().kind.get_ref() == t.kind.get_ref())
            {
                self.report.error(
                    file,
                    t.kind.span(),
                    format!("offcode `{offcode}` lists target kind `{kind}` twice"),
                    "duplicate target",
                );
                ok = false;
            }
            let Some(require) = self.require(file, kind, t.require.as_ref()) else {
                ok = false;
                continue;
            };
            let cpu = t
                .cpu
                .as_ref()
                .map(|v| cpu_share(&mut self.report, file, v, "target cpu"));
            let mem = t
                .memory
                .as_ref()
                .map(|v| memory(&mut self.report, file, v, "target memory"));
            let module = t
                .module
                .as_ref()
                .map(|m| self.base_dir(file).join(m.get_ref()));
            if let (Some(m), Some(path)) = (&t.module, &module)
                && self.allow_files
                && !path.is_file()
            {
                self.report.error(
                    file,
                    m.span(),
                    format!(
                        "module `{}` does not exist (looked for {})",
                        m.get_ref(),
                        path.display()
                    ),
                    "missing file",
                );
                ok = false;
            }
            // A kernel target may have no module: implementations built into
            // sidecore (the firewall's XDP program) carry their BPF object, and
            // planning refuses an implementation that does not run there.
            if kind == PeKind::Wasm && t.module.is_none() {
                self.report.error(
                    file,
                    t.kind.span(),
                    "a `wasm` target needs a `module` (the compiled .wasm module to load)",
                    "no module given",
                );
                ok = false;
            }
            if cpu == Some(None) || mem == Some(None) {
                ok = false;
                continue;
            }
            out.push(Target {
                kind,
                require,
                cpu: cpu.flatten(),
                memory: mem.flatten(),
                module,
                origin: self.sources.origin(file, &t.kind.span()),
            });
        }
        ok.then_some(out)
    }

    fn finish(mut self, root: &Path) -> Result<Manifest, ManifestError> {
        let constraints = self.resolve_imports();
        let mut channels = self.resolve_channels();
        let name_spans: Vec<_> = self
            .pending
            .iter()
            .map(|p| (p.file, p.name_span.clone()))
            .collect();
        let uses: Vec<UsesOf> = self
            .pending
            .iter_mut()
            .enumerate()
            .map(|(offcode, p)| UsesOf {
                offcode,
                file: p.file,
                uses: std::mem::take(&mut p.uses),
            })
            .collect();
        let mut offcodes: Vec<Offcode> = self.pending.into_iter().map(|p| p.offcode).collect();
        let calls = calls::bind(
            &mut self.report,
            &self.sources,
            &mut offcodes,
            &name_spans,
            uses,
            &mut channels,
        );
        if self.report.has_errors() {
            return Err(ManifestError {
                sources: self.sources,
                diagnostics: self.report.diagnostics,
            });
        }
        let (app, description) = self.app.take().unwrap_or_else(|| {
            (
                root.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "app".into()),
                None,
            )
        });
        Ok(Manifest {
            app,
            description,
            root: root.to_path_buf(),
            library: self.library,
            scheduler: self.scheduler,
            offcodes,
            constraints,
            channels,
            calls,
            sources: self.sources,
        })
    }

    fn resolve_imports(&mut self) -> Vec<Constraint> {
        let mut out = Vec::new();
        for from in 0..self.pending.len() {
            let file = self.pending[from].file;
            let imports = std::mem::take(&mut self.pending[from].imports);
            for imp in &imports {
                let imp_span = imp.span();
                let imp = imp.get_ref();
                let target = imp.offcode.get_ref();
                let kind = match &imp.constraint {
                    Some(c) => {
                        match keyword::<ConstraintKind>(&mut self.report, file, c, "constraint") {
                            Some(k) => k,
                            None => continue,
                        }
                    }
                    None => ConstraintKind::Link,
                };
                let Some(to) = self.pending.iter().position(|p| p.offcode.name == *target) else {
                    let known: Vec<_> = self
                        .pending
                        .iter()
                        .map(|p| format!("`{}`", p.offcode.name))
                        .collect();
                    let d = self.report.error(
                        file,
                        imp.offcode.span(),
                        format!("import of unknown offcode `{target}`"),
                        "no offcode has this name",
                    );
                    note(
                        d,
                        format!("offcodes in this application: {}", known.join(", ")),
                    );
                    continue;
                };
                if to == from {
                    self.report.error(
                        file,
                        imp.offcode.span(),
                        format!("offcode `{target}` imports itself"),
                        "self-import",
                    );
                    continue;
                }
                if let Some(f) = &imp.file {
                    let want = self.base_dir(file).join(f.get_ref());
                    let decl = self.pending[to].file;
                    let same = std::fs::canonicalize(&want).ok().as_deref()
                        == Some(self.sources.path(decl));
                    if !same && self.allow_files {
                        let d = self.report.error(
                            file,
                            imp.offcode.span(),
                            format!("`{}` does not declare offcode `{target}`", f.get_ref()),
                            "not in that file",
                        );
                        also(
                            d,
                            decl,
                            self.pending[to].name_span.clone(),
                            "it is declared here",
                        );
                        continue;
                    }
                }
                if let Some(idv) = &imp.id
                    && let Some(g) = guid(&mut self.report, file, idv, "import id")
                    && g != self.pending[to].offcode.id
                {
                    let d = self.report.error(
                        file,
                        idv.span(),
                        format!(
                            "import of `{target}` expects id {g}, but `{target}` has id {}",
                            self.pending[to].offcode.id
                        ),
                        "id mismatch",
                    );
                    also(
                        d,
                        self.pending[to].file,
                        self.pending[to].id_span.clone(),
                        "actual id",
                    );
                    continue;
                }
                out.push(Constraint {
                    kind,
                    from,
                    to,
                    origin: self.sources.origin(file, &imp_span),
                });
            }
        }
        out
    }

    /// A channel's cast, order, delivery and zero-copy flag, checked against its
    /// number of receivers. Returns the properties and whether all were valid.
    fn channel_props(
        &mut self,
        file: FileId,
        raw: &S<RawChannel>,
        receivers: usize,
    ) -> (ChannelProps, bool) {
        let ch = raw.get_ref();
        let name = ch.name.get_ref();
        let mut ok = true;
        let mut props = ChannelProps::default();
        let r = &mut self.report;
        let cast = ch
            .cast
            .as_ref()
            .map(|c| keyword::<Cast>(r, file, c, "cast"));
        let order = ch
            .order
            .as_ref()
            .map(|c| keyword::<Order>(r, file, c, "order"));
        let delivery = ch
            .delivery
            .as_ref()
            .map(|c| keyword::<Delivery>(r, file, c, "delivery"));
        match cast {
            Some(Some(c)) => props.cast = c,
            Some(None) => ok = false,
            None => {}
        }
        match order {
            Some(Some(o)) => props.order = o,
            Some(None) => ok = false,
            None => {}
        }
        if cast.is_none() {
            // Several receivers: every message to each (multicast), unless
            // the channel is parallel, which shares messages among them.
            props.cast = if receivers > 1 && props.order == Order::Sequential {
                Cast::Multicast
            } else {
                Cast::Unicast
            };
        }
        match delivery {
            Some(Some(d)) => props.delivery = d,
            Some(None) => ok = false,
            None => {}
        }
        if let Some(z) = ch.zero_copy {
            props.zero_copy = z;
        }
        if props.cast == Cast::Unicast && props.order == Order::Sequential && receivers > 1 {
            let d = self.report.error(
                file,
                ch.to.span(),
                format!("unicast channel `{name}` has {receivers} receivers; a sequential unicast channel joins exactly two offcodes"),
                "more than one receiver",
            );
            note(
                d,
                "use cast = \"multicast\" to give every message to each receiver, or order = \"parallel\" to share the messages among them",
            );
            ok = false;
        }
        if props.cast == Cast::Multicast && receivers < 2 {
            self.report.error(
                file,
                ch.to.span(),
                format!("multicast channel `{name}` needs at least two receivers"),
                "one receiver",
            );
            ok = false;
        }
        if props.cast == Cast::Multicast && props.order == Order::Parallel {
            self.report.error(
                file,
                ch.order.as_ref().map_or(raw.span(), toml::Spanned::span),
                format!("channel `{name}` cannot be both multicast and parallel: multicast gives every message to every receiver, parallel gives each message to one"),
                "conflicting properties",
            );
            ok = false;
        }
        (props, ok)
    }

    /// A channel's name: valid, and not taken by one of the `earlier` channels.
    fn channel_name(
        &mut self,
        earlier: &[(FileId, S<RawChannel>)],
        file: FileId,
        ch: &RawChannel,
    ) -> bool {
        let name = ch.name.get_ref();
        let mut ok = true;
        if !is_name(name, true) {
            self.report.error(
                file,
                ch.name.span(),
                format!("channel name `{name}` is not a valid name"),
                "not a name",
            );
            ok = false;
        }
        if let Some((pf, prev)) = earlier
            .iter()
            .find(|(_, c)| c.get_ref().name.get_ref() == name)
        {
            let d = self.report.error(
                file,
                ch.name.span(),
                format!("channel `{name}` is declared twice"),
                "second declaration",
            );
            also(d, *pf, prev.get_ref().name.span(), "first declared here");
            ok = false;
        }
        ok
    }

    fn resolve_channels(&mut self) -> Vec<Channel> {
        let mut out = Vec::new();
        let channels = std::mem::take(&mut self.channels);
        // (offcode, port) → (channel index in `channels`, span) for fan-in/fan-out checks.
        let mut used_out: HashMap<(usize, String), (FileId, Range<usize>)> = HashMap::new();
        let mut used_in: HashMap<(usize, String), (FileId, Range<usize>)> = HashMap::new();
        for (ci, (file, raw)) in channels.iter().enumerate() {
            let file = *file;
            let ch = raw.get_ref();
            let name = ch.name.get_ref();
            let mut ok = self.channel_name(&channels[..ci], file, ch);
            let from = self.endpoint(file, &ch.from, true);
            let to_raw: Vec<S<String>> = match ch.to.get_ref() {
                OneOrMany::One(s) => vec![S::new(ch.to.span(), s.clone())],
                OneOrMany::Many(v) => v.clone(),
            };
            if to_raw.is_empty() {
                self.report.error(
                    file,
                    ch.to.span(),
                    format!("channel `{name}` has no receiver"),
                    "empty `to`",
                );
                ok = false;
            }
            let to: Vec<Option<Endpoint>> = to_raw
                .iter()
                .map(|t| self.endpoint(file, t, false))
                .collect();
            let (mut props, props_ok) = self.channel_props(file, raw, to_raw.len());
            let r = &mut self.report;
            let size_ok = props::ring_size(
                r,
                file,
                ch.slots.as_ref(),
                ch.slot_size.as_ref(),
                &mut props,
            );
            let (bandwidth, bandwidth_ok) =
                props::bandwidth(r, file, ch.bandwidth.as_ref(), ch.bandwidth_mbps.as_ref());
            ok &= props_ok && size_ok && bandwidth_ok;
            // One producer per port, one channel per input port.
            if let Some(e) = &from {
                let key = (e.offcode, e.port.clone());
                if let Some((pf, ps)) = used_out.get(&key) {
                    let d = self.report.error(
                        file,
                        ch.from.span(),
                        format!("output `{}` already feeds another channel; use one multicast channel to reach several receivers", ch.from.get_ref()),
                        "second channel from this port",
                    );
                    also(d, *pf, ps.clone(), "first channel from it");
                    ok = false;
                } else {
                    used_out.insert(key, (file, ch.from.span()));
                }
            }
            for (t, raw_t) in to.iter().zip(&to_raw) {
                if let Some(e) = t {
                    let key = (e.offcode, e.port.clone());
                    if let Some((pf, ps)) = used_in.get(&key) {
                        let d = self.report.error(
                            file,
                            raw_t.span(),
                            format!("input `{}` is already fed by another channel; an input has one producer", raw_t.get_ref()),
                            "second channel into this port",
                        );
                        also(d, *pf, ps.clone(), "first channel into it");
                        ok = false;
                    } else {
                        used_in.insert(key, (file, raw_t.span()));
                    }
                }
            }
            if let (true, Some(from), true) = (ok, from, to.iter().all(Option::is_some)) {
                out.push(Channel {
                    name: name.clone(),
                    from,
                    to: to.into_iter().flatten().collect(),
                    props,
                    bandwidth,
                    origin: self.sources.origin(file, &ch.name.span()),
                });
            }
        }
        out
    }

    /// Resolves `offcode.port`; the port must be declared in the right direction.
    fn endpoint(&mut self, file: FileId, raw: &S<String>, output: bool) -> Option<Endpoint> {
        let text = raw.get_ref();
        let Some((oc, port)) = text.rsplit_once('.') else {
            self.report.error(
                file,
                raw.span(),
                format!("channel endpoint `{text}` must be written `offcode.port`"),
                "no port",
            );
            return None;
        };
        let Some(idx) = self.pending.iter().position(|p| p.offcode.name == oc) else {
            let known: Vec<_> = self
                .pending
                .iter()
                .map(|p| format!("`{}`", p.offcode.name))
                .collect();
            let d = self.report.error(
                file,
                raw.span(),
                format!("channel endpoint names unknown offcode `{oc}`"),
                "unknown offcode",
            );
            note(
                d,
                format!("offcodes in this application: {}", known.join(", ")),
            );
            return None;
        };
        let p = &self.pending[idx];
        let (ports, dir, other) = if output {
            (&p.offcode.outputs, "output", &p.offcode.inputs)
        } else {
            (&p.offcode.inputs, "input", &p.offcode.outputs)
        };
        if !ports.iter().any(|q| q == port) {
            let hint = if other.iter().any(|q| q == port) {
                format!(
                    "`{port}` is declared, but as an {}",
                    if output { "input" } else { "output" }
                )
            } else if ports.is_empty() {
                format!("`{oc}` declares no {dir} ports (add `{dir}s = [\"{port}\"]` to it)")
            } else {
                format!("`{oc}` declares {dir} ports: {}", ports.join(", "))
            };
            let (pf, ps) = (p.file, p.name_span.clone());
            let d = self.report.error(
                file,
                raw.span(),
                format!("offcode `{oc}` has no {dir} port `{port}`"),
                if output {
                    "channel source"
                } else {
                    "channel receiver"
                },
            );
            also(d, pf, ps, "offcode declared here");
            note(d, hint);
            return None;
        }
        Some(Endpoint {
            offcode: idx,
            port: port.to_string(),
        })
    }
}

fn display_name(path: &Path) -> String {
    // Paths relative to the working directory read best in messages.
    let cwd = std::env::current_dir().ok();
    match cwd.and_then(|c| path.strip_prefix(&c).ok().map(Path::to_path_buf)) {
        Some(rel) => rel.display().to_string(),
        None => path.display().to_string(),
    }
}

/// Port names valid and listed once, and no port both an input and an output.
fn check_ports(r: &mut Report, file: FileId, raw: &RawOffcode) {
    let ports = |r: &mut Report, list: &[S<String>], what: &str| {
        for (i, p) in list.iter().enumerate() {
            if !is_name(p.get_ref(), false) {
                r.error(
                    file,
                    p.span(),
                    format!("{what} port `{}` is not a valid port name", p.get_ref()),
                    "letters, digits, `_` and `-`, starting with a letter",
                );
            } else if list[..i].iter().any(|q| q.get_ref() == p.get_ref()) {
                r.error(
                    file,
                    p.span(),
                    format!("{what} port `{}` is listed twice", p.get_ref()),
                    "duplicate",
                );
            }
        }
    };
    ports(r, &raw.inputs, "input");
    ports(r, &raw.outputs, "output");
    if let Some(dup) = raw
        .outputs
        .iter()
        .find(|o| raw.inputs.iter().any(|i| i.get_ref() == o.get_ref()))
    {
        r.error(
            file,
            dup.span(),
            format!("port `{}` is both an input and an output", dup.get_ref()),
            "rename one of them",
        );
    }
}
