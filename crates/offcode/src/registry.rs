//! The offcode library (HYDRA §4.4, Figure 4.10): implementations by name, each
//! declaring the PE kinds it can run on and the ports it provides. The runtime
//! looks an offcode up by (implementation, PE kind) and falls back to a `host`
//! build when the chosen kind has none. Artifacts (a `.wasm` module, a BPF
//! object) are built by a loader implementation registered for their PE kind
//! under [`Registry::loader_name`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use sidecore_types::{PeKind, ValueType};

use crate::{Offcode, OffcodeError};

/// What a factory builds an instance from.
#[derive(Debug, Clone, Copy)]
pub struct BuildSpec<'a> {
    /// The manifest's `params`.
    pub params: &'a toml::Table,
    /// The PE kind it will run on.
    pub kind: PeKind,
    /// The artifact named by the target (`module = ...`), for loaders of
    /// Wasm modules and BPF objects.
    pub module: Option<&'a Path>,
}

/// Builds an instance.
pub type Factory =
    Arc<dyn Fn(&BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> + Send + Sync>;

/// Checks parameters without building an instance.
pub type Validator = Arc<dyn Fn(&toml::Table) -> Result<(), OffcodeError> + Send + Sync>;

/// One implementation in the library.
#[derive(Clone)]
pub struct Implementation {
    pub name: String,
    pub description: String,
    /// PE kinds it runs on.
    pub kinds: Vec<PeKind>,
    /// Ports it provides; `None` means it adapts to whatever the manifest declares.
    pub inputs: Option<Vec<String>>,
    pub outputs: Option<Vec<String>>,
    pub factory: Factory,
    /// Checks parameters without building (for `sidecore check`).
    pub validate: Option<Validator>,
    /// The interfaces it serves and calls, as compiled.
    pub interfaces: Interfaces,
}

/// A method as an implementation was compiled to serve or call it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodSig {
    pub name: &'static str,
    pub params: &'static [ValueType],
    pub returns: Option<ValueType>,
}

/// An interface as an implementation was compiled against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceSig {
    pub name: &'static str,
    pub methods: &'static [MethodSig],
}

/// The interfaces an implementation provides and uses. A manifest that
/// declares one of them must agree with it method by method.
#[derive(Debug, Clone, Default)]
pub struct Interfaces {
    pub provides: Vec<InterfaceSig>,
    pub requires: Vec<InterfaceSig>,
}

/// Whether a port was added by a call binding (its name carries `:`, which a
/// manifest's own port names cannot): an implementation's fixed port list
/// does not name those.
pub fn is_call_port(name: &str) -> bool {
    name.contains(':')
}

/// `(u32, string) -> u64`, as method signatures are printed.
pub fn signature(params: &[ValueType], returns: Option<ValueType>) -> String {
    let p: Vec<String> = params.iter().map(ToString::to_string).collect();
    match returns {
        Some(r) => format!("({}) -> {r}", p.join(", ")),
        None => format!("({})", p.join(", ")),
    }
}

impl std::fmt::Debug for Implementation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Implementation")
            .field("name", &self.name)
            .field("kinds", &self.kinds)
            .finish()
    }
}

impl Implementation {
    /// Whether it runs on `kind`. A peer node runs the same sidecore (its hello
    /// reports the version), so what runs on a core or the host here also runs
    /// on a `node`, where the peer's daemon runs it.
    pub fn runs_on(&self, kind: PeKind) -> bool {
        self.kinds.contains(&kind)
            || (kind == PeKind::Node
                && self
                    .kinds
                    .iter()
                    .any(|k| matches!(k, PeKind::Core | PeKind::Host)))
    }

    /// `Ok` if it runs on `kind`; otherwise why not, naming the kinds it runs on.
    pub fn check_runs_on(&self, kind: PeKind) -> Result<(), ImplError> {
        if self.runs_on(kind) {
            return Ok(());
        }
        Err(ImplError::NotOn {
            implementation: self.name.clone(),
            kind,
            runs_on: list(self.kinds.iter().map(ToString::to_string)),
        })
    }

    /// Checks that the manifest's ports are ones this implementation provides.
    pub fn check_ports(&self, inputs: &[String], outputs: &[String]) -> Result<(), ImplError> {
        let check = |have: &Option<Vec<String>>, want: &[String], direction| {
            if let Some(have) = have
                && let Some(p) = want.iter().find(|p| !have.contains(p) && !is_call_port(p))
            {
                return Err(ImplError::NoPort {
                    implementation: self.name.clone(),
                    direction,
                    port: p.clone(),
                    provides: list(have.iter().cloned()),
                });
            }
            Ok(())
        };
        check(&self.inputs, inputs, "input")?;
        check(&self.outputs, outputs, "output")
    }
}

/// `a, b, c`, or `none`.
fn list(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Why an implementation cannot serve an offcode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImplError {
    #[error("the library has no implementation `{0}`")]
    Unknown(String),
    #[error("this sidecore has no loader for {0} modules")]
    NoLoader(PeKind),
    #[error("implementation `{implementation}` does not run on {kind} (it runs on: {runs_on})")]
    NotOn {
        implementation: String,
        kind: PeKind,
        runs_on: String,
    },
    #[error(
        "implementation `{implementation}` has no {direction} port `{port}` (it provides: {provides})"
    )]
    NoPort {
        implementation: String,
        direction: &'static str,
        port: String,
        provides: String,
    },
}

/// The library of implementations.
#[derive(Clone, Default, Debug)]
pub struct Registry {
    impls: BTreeMap<String, Implementation>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an implementation; a later one with the same name replaces it.
    pub fn register(&mut self, imp: Implementation) {
        self.impls.insert(imp.name.clone(), imp);
    }

    /// The implementation named `name`.
    pub fn get(&self, name: &str) -> Option<&Implementation> {
        self.impls.get(name)
    }

    /// The implementation named `name` if it runs on `kind`.
    pub fn lookup(&self, name: &str, kind: PeKind) -> Option<&Implementation> {
        self.impls.get(name).filter(|i| i.runs_on(kind))
    }

    /// The name under which the loader of artifacts for `kind` is registered
    /// (`loader:wasm`, `loader:kernel`).
    pub fn loader_name(kind: PeKind) -> String {
        format!("loader:{kind}")
    }

    /// All implementations, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Implementation> {
        self.impls.values()
    }
}
