//! Interfaces checked against the library before anything runs: a manifest's
//! interface must agree, method by method, with what the built-in
//! implementation providing it was compiled to serve, and a call binding must
//! offer every method the calling implementation was compiled to call, with
//! the same parameter and return types. `sidecore check` prints every problem
//! and the resolve stage refuses the first; each names the file and line.

use sidecore_manifest::{CallBinding, Interface, Manifest};
use sidecore_offcode::{InterfaceSig, MethodSig, Registry, signature};

/// One disagreement, located in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceProblem {
    /// `file:line:col` of the method or `uses` entry at fault.
    pub origin: String,
    pub offcode: String,
    pub problem: String,
}

impl std::fmt::Display for InterfaceProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: offcode `{}`: {}",
            self.origin, self.offcode, self.problem
        )
    }
}

/// Every disagreement between `manifest`'s interfaces and bindings and the
/// implementations in `registry` (offcodes whose implementation the library
/// lacks are reported elsewhere, and skipped here).
pub fn check(manifest: &Manifest, registry: &Registry) -> Vec<InterfaceProblem> {
    let mut out = Vec::new();
    for oc in &manifest.offcodes {
        let Some(imp) = registry.get(&oc.implementation) else {
            continue;
        };
        for sig in &imp.interfaces.provides {
            if let Some(itf) = oc.interfaces.iter().find(|i| i.name == sig.name) {
                provided(&mut out, &oc.name, &imp.name, itf, sig);
            }
        }
    }
    for b in &manifest.calls {
        binding(&mut out, manifest, registry, b);
    }
    out
}

/// The manifest's declaration of an interface against the implementation's.
fn provided(
    out: &mut Vec<InterfaceProblem>,
    offcode: &str,
    implementation: &str,
    itf: &Interface,
    sig: &InterfaceSig,
) {
    for m in &itf.methods {
        let problem = match sig.methods.iter().find(|s| s.name == m.name) {
            None => format!(
                "interface `{}` declares method `{}`, which implementation `{implementation}` does not serve (it serves: {})",
                itf.name,
                m.name,
                names(sig.methods)
            ),
            Some(s) if s.params != m.params.as_slice() || s.returns != m.returns => format!(
                "method `{}` of `{}` is declared {}, but implementation `{implementation}` serves it as {}",
                m.name,
                itf.name,
                signature(&m.params, m.returns),
                signature(s.params, s.returns)
            ),
            Some(_) => continue,
        };
        out.push(InterfaceProblem {
            origin: m.origin.to_string(),
            offcode: offcode.to_string(),
            problem,
        });
    }
}

/// A binding against both ends' implementations.
fn binding(
    out: &mut Vec<InterfaceProblem>,
    manifest: &Manifest,
    registry: &Registry,
    b: &CallBinding,
) {
    let (caller, provider) = (&manifest.offcodes[b.caller], &manifest.offcodes[b.provider]);
    let itf = &provider.interfaces[b.interface];
    let mut push = |problem: String| {
        out.push(InterfaceProblem {
            origin: b.origin.to_string(),
            offcode: caller.name.clone(),
            problem,
        });
    };
    if let Some(p) = registry.get(&provider.implementation)
        && !p.interfaces.provides.iter().any(|s| s.name == itf.name)
    {
        push(format!(
            "uses `{}` of `{}`, whose implementation `{}` serves no interface `{}`{}",
            itf.name,
            provider.name,
            p.name,
            itf.name,
            served(&p.interfaces.provides)
        ));
    }
    let Some(c) = registry.get(&caller.implementation) else {
        return;
    };
    let Some(sig) = c.interfaces.requires.iter().find(|s| s.name == itf.name) else {
        push(format!(
            "implementation `{}` calls no interface `{}`, so it cannot use it",
            c.name, itf.name
        ));
        return;
    };
    for want in sig.methods {
        let declared = itf.methods.iter().find(|m| m.name == want.name);
        let problem = match declared {
            None => format!(
                "implementation `{}` calls `{}{}`, which interface `{}` of `{}` does not declare",
                c.name,
                want.name,
                signature(want.params, want.returns),
                itf.name,
                provider.name
            ),
            Some(m) if want.params != m.params.as_slice() || want.returns != m.returns => format!(
                "implementation `{}` calls `{}{}`, but `{}` declares it {} (at {})",
                c.name,
                want.name,
                signature(want.params, want.returns),
                provider.name,
                signature(&m.params, m.returns),
                m.origin
            ),
            Some(m) if !b.methods.contains(&m.id) => format!(
                "implementation `{}` calls `{}`, which this `uses` entry leaves out of its `methods`",
                c.name, want.name
            ),
            Some(_) => continue,
        };
        push(problem);
    }
}

fn names(methods: &[MethodSig]) -> String {
    let v: Vec<&str> = methods.iter().map(|m| m.name).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn served(sigs: &[InterfaceSig]) -> String {
    if sigs.is_empty() {
        " (it serves none)".into()
    } else {
        let v: Vec<&str> = sigs.iter().map(|s| s.name).collect();
        format!(" (it serves: {})", v.join(", "))
    }
}
