//! Checks that a problem is well formed before anything is built from it: indices in
//! range, finite non-negative demands and capacities, no self-constraints, unique
//! names, at most one host PE. Every message names the item at fault.

use std::collections::HashMap;

use sidecore_types::PeKind;

use crate::types::{LayoutError, Problem};

fn invalid(msg: String) -> Result<(), LayoutError> {
    Err(LayoutError::Invalid(msg))
}

/// Validate `p`; the first problem found is reported.
pub fn validate(p: &Problem) -> Result<(), LayoutError> {
    validate_pes(p)?;
    validate_offcodes(p)?;
    validate_constraints(p)?;
    validate_flows(p)?;
    validate_links(p)
}

/// Link ends in range and distinct, caps finite and non-negative.
fn validate_links(p: &Problem) -> Result<(), LayoutError> {
    for (i, l) in p.links.iter().enumerate() {
        let at = if l.origin.is_empty() {
            format!("link cap {i}")
        } else {
            format!("link cap {i} at {}", l.origin)
        };
        for (end, v) in [("a", l.a), ("b", l.b)] {
            if v >= p.pes.len() {
                return invalid(format!(
                    "{at}: PE index {end} = {v} is out of range ({} PEs)",
                    p.pes.len()
                ));
            }
        }
        if l.a == l.b {
            return invalid(format!("{at}: a link from `{}` to itself", p.pes[l.a].id));
        }
        if !l.bandwidth_bps.is_finite() || l.bandwidth_bps < 0.0 {
            return invalid(format!(
                "{at}: bandwidth {} is not a finite non-negative number",
                l.bandwidth_bps
            ));
        }
    }
    Ok(())
}

/// Unique non-empty ids, finite capacities, at most one host.
fn validate_pes(p: &Problem) -> Result<(), LayoutError> {
    let mut host: Option<usize> = None;
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (k, pe) in p.pes.iter().enumerate() {
        if pe.id.is_empty() {
            return invalid(format!("PE {k} has an empty id"));
        }
        if let Some(prev) = ids.insert(pe.id.as_str(), k) {
            return invalid(format!(
                "PE id `{}` is used twice (PEs {prev} and {k})",
                pe.id
            ));
        }
        if !pe.cpu.is_finite() || pe.cpu < 0.0 {
            return invalid(format!(
                "PE `{}`: cpu capacity {} is not a finite non-negative number",
                pe.id, pe.cpu
            ));
        }
        if pe.kind == PeKind::Host {
            if let Some(h) = host {
                return invalid(format!(
                    "more than one host PE: `{}` and `{}`",
                    p.pes[h].id, pe.id
                ));
            }
            host = Some(k);
        }
    }
    Ok(())
}

/// Unique non-empty names; can-run rows naming existing PEs once, finite demands.
fn validate_offcodes(p: &Problem) -> Result<(), LayoutError> {
    if p.pes.is_empty() && !p.offcodes.is_empty() {
        return invalid(format!(
            "{} offcodes but no PE to place them on",
            p.offcodes.len()
        ));
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (n, oc) in p.offcodes.iter().enumerate() {
        if oc.name.is_empty() {
            return invalid(format!("offcode {n} has an empty name"));
        }
        if let Some(prev) = names.insert(oc.name.as_str(), n) {
            return invalid(format!(
                "offcode name `{}` is used twice (offcodes {prev} and {n})",
                oc.name
            ));
        }
        let mut seen = vec![false; p.pes.len()];
        for (i, c) in oc.candidates.iter().enumerate() {
            if c.pe >= p.pes.len() {
                return invalid(format!(
                    "offcode `{}`: candidate {i} names PE index {}, but there are only {} PEs",
                    oc.name,
                    c.pe,
                    p.pes.len()
                ));
            }
            let pe = &p.pes[c.pe].id;
            if seen[c.pe] {
                return invalid(format!(
                    "offcode `{}`: PE `{pe}` is listed twice among its candidates",
                    oc.name
                ));
            }
            seen[c.pe] = true;
            if !c.cpu.is_finite() || c.cpu < 0.0 {
                return invalid(format!(
                    "offcode `{}`: cpu demand {} on PE `{pe}` is not a finite non-negative number",
                    oc.name, c.cpu
                ));
            }
        }
    }
    Ok(())
}

/// Constraint ends in range and distinct.
fn validate_constraints(p: &Problem) -> Result<(), LayoutError> {
    let n = p.offcodes.len();
    let name = |i: usize| p.offcodes[i].name.as_str();
    for (i, c) in p.constraints.iter().enumerate() {
        let at = if c.origin.is_empty() {
            format!("constraint {i}")
        } else {
            format!("constraint {i} at {}", c.origin)
        };
        for (end, v) in [("a", c.a), ("b", c.b)] {
            if v >= n {
                return invalid(format!(
                    "{at} ({}): offcode index {end} = {v} is out of range ({n} offcodes)",
                    c.kind
                ));
            }
        }
        if c.a == c.b {
            return invalid(format!(
                "{at}: {} of offcode `{}` with itself",
                c.kind,
                name(c.a)
            ));
        }
    }
    Ok(())
}

/// Flow ends in range and distinct, bandwidths finite and non-negative.
fn validate_flows(p: &Problem) -> Result<(), LayoutError> {
    let n = p.offcodes.len();
    let name = |i: usize| p.offcodes[i].name.as_str();
    for (i, fl) in p.flows.iter().enumerate() {
        let at = if fl.origin.is_empty() {
            format!("flow {i}")
        } else {
            format!("flow {i} at {}", fl.origin)
        };
        for (end, v) in [("a", fl.a), ("b", fl.b)] {
            if v >= n {
                return invalid(format!(
                    "{at}: offcode index {end} = {v} is out of range ({n} offcodes)"
                ));
            }
        }
        if fl.a == fl.b {
            return invalid(format!("{at}: flow from `{}` to itself", name(fl.a)));
        }
        if !fl.bandwidth_bps.is_finite() || fl.bandwidth_bps < 0.0 {
            return invalid(format!(
                "{at} (`{}` - `{}`): bandwidth {} is not a finite non-negative number",
                name(fl.a),
                name(fl.b),
                fl.bandwidth_bps
            ));
        }
    }
    Ok(())
}
