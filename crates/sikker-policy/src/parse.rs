//! TOML policies and placements, validated into the model with precise errors.
//!
//! A policy:
//!
//! ```toml
//! [[service]]
//! name = "kvs"
//! id = 7                      # optional; otherwise assigned from 1 up
//! domains = ["MammalsGet", "MammalsSet", "CompaniesGet", "LocationsDelete"]
//! process_count = 10          # processes 0..9; or [[service.process]] tables
//!
//! [[service.portal]]
//! name = "AccessForBill"
//! processes = [3, 6, 9]       # or: all_processes = true (includes later ones)
//! domains = ["CompaniesGet", "LocationsDelete"]   # or: all_domains = true
//! password_sha256 = "9f86d0…" # optional
//!
//! [[service]]
//! name = "bill"
//! [[service.process]]
//! id = 101
//! program = "/usr/bin/bill"
//!
//! [[grant]]
//! from = "bill"
//! to = "kvs"
//! portal = "AccessForBill"
//! password = "test"
//!
//! [[rate_limit]]
//! from = "bill"
//! to = "kvs"
//! gbps = 100.0
//! ```
//!
//! A placement: `[[host]] name = "h1"  processes = ["kvs:3", "bill:101"]`,
//! and, for Sikker's L4 mode (plain TCP, for services that cannot link the
//! client library), where processes of that host listen:
//!
//! ```toml
//! [[host]]
//! name = "h1"
//! processes = ["kvs:3", "bill:101"]
//! l4 = { "kvs:3" = "10.9.0.2:8080" }   # or a list: ["10.9.0.2:8080", "[fd00::2]:8080"]
//! ```
//!
//! Every error names the file, line and column of the offending value.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::ops::Range;

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label};
use codespan_reporting::files::{Files, SimpleFile};
use codespan_reporting::term;
use serde::Deserialize;
use serde_spanned::Spanned;
use sha2::{Digest, Sha256};
use sidecore_sikker_nmu::{NOS_SERVICE, ProcessId, ServiceId};
use sidecore_sikker_rate::Algorithm;

use crate::model::*;
use crate::nos::Placement;

/// One error, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// File name as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What is wrong.
    pub message: String,
    /// Byte range.
    pub span: Range<usize>,
    /// The error drawn under the source line (codespan-reporting).
    pub rendered: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.col, self.message
        )
    }
}

/// Every error found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<Diagnostic>);

impl std::fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

impl PolicyErrors {
    /// The errors drawn with their source lines.
    pub fn rendered(&self) -> String {
        self.0.iter().map(|d| d.rendered.as_str()).collect()
    }
}

struct Ctx<'a> {
    file: SimpleFile<&'a str, &'a str>,
    errs: Vec<Diagnostic>,
}

impl<'a> Ctx<'a> {
    fn new(name: &'a str, src: &'a str) -> Self {
        Ctx {
            file: SimpleFile::new(name, src),
            errs: Vec::new(),
        }
    }

    fn err(&mut self, span: Range<usize>, msg: impl Into<String>) {
        let message = msg.into();
        let len = self.file.source().len();
        let span = span.start.min(len)..span.end.min(len).max(span.start.min(len));
        let loc = self.file.location((), span.start).ok();
        let diag = CsDiagnostic::error()
            .with_message(message.clone())
            .with_labels(vec![Label::primary((), span.clone())]);
        let rendered =
            term::emit_into_string(&term::Config::default(), &self.file, &diag).unwrap_or_default();
        self.errs.push(Diagnostic {
            file: self.file.name().to_string(),
            line: loc.as_ref().map(|l| l.line_number).unwrap_or(1),
            col: loc.as_ref().map(|l| l.column_number).unwrap_or(1),
            message,
            span,
            rendered,
        });
    }

    fn finish<T>(self, v: T) -> Result<T, PolicyErrors> {
        if self.errs.is_empty() {
            Ok(v)
        } else {
            Err(PolicyErrors(self.errs))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    service: Vec<RawService>,
    #[serde(default)]
    grant: Vec<RawGrant>,
    #[serde(default)]
    rate_limit: Vec<RawRate>,
    nmu: Option<RawNmu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: Spanned<String>,
    id: Option<Spanned<i64>>,
    #[serde(default)]
    domains: Vec<Spanned<String>>,
    #[serde(default)]
    process: Vec<RawProcess>,
    process_count: Option<Spanned<i64>>,
    #[serde(default)]
    portal: Vec<RawPortal>,
    self_access: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    id: Spanned<i64>,
    program: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    cgroup: Option<Spanned<String>>,
    uid: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPortal {
    name: Spanned<String>,
    processes: Option<Vec<Spanned<i64>>>,
    all_processes: Option<Spanned<bool>>,
    domains: Option<Vec<Spanned<String>>>,
    all_domains: Option<Spanned<bool>>,
    password_sha256: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    from: Spanned<String>,
    to: Spanned<String>,
    portal: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    processes: Option<Vec<Spanned<i64>>>,
    all_processes: Option<Spanned<bool>>,
    domains: Option<Vec<Spanned<String>>>,
    all_domains: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    from: Spanned<String>,
    to: Spanned<String>,
    gbps: Spanned<f64>,
    algorithm: Option<Spanned<String>>,
    bucket_bytes: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNmu {
    otp_ttl_ms: Option<Spanned<i64>>,
    otp_cap: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    #[serde(default)]
    host: Vec<RawHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Spanned<String>,
    #[serde(default)]
    processes: Vec<Spanned<String>>,
    /// `"service:process" = "IP:PORT"` or a list of them.
    #[serde(default)]
    l4: BTreeMap<Spanned<String>, Spanned<RawL4>>,
    /// `"IP:PORT"`: where the other hosts' agents reach this host's agent.
    agent: Option<Spanned<String>>,
}

/// A process's L4 addresses: one, or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawL4 {
    One(String),
    Many(Vec<String>),
}

fn syntax<T: for<'de> Deserialize<'de>>(ctx: &mut Ctx, src: &str) -> Option<T> {
    match toml::from_str::<T>(src) {
        Ok(v) => Some(v),
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            ctx.err(span, e.message().trim().to_string());
            None
        }
    }
}

fn u32_id(ctx: &mut Ctx, v: &Spanned<i64>, what: &str) -> Option<u32> {
    let x = *v.get_ref();
    if x < 0 || x >= u32::MAX as i64 {
        ctx.err(
            v.span(),
            format!("{what} {x} is out of range (0 to {})", u32::MAX - 1),
        );
        None
    } else {
        Some(x as u32)
    }
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Parses and validates a policy. `name` is used in error messages.
pub fn parse_policy(name: &str, src: &str) -> Result<Policy, PolicyErrors> {
    let mut ctx = Ctx::new(name, src);
    let Some(raw) = syntax::<RawPolicy>(&mut ctx, src) else {
        return ctx.finish(Policy::default());
    };
    let mut b = PolicyBuilder {
        ctx,
        pol: Policy::default(),
        by_name: BTreeMap::new(),
        broken: BTreeSet::new(),
    };
    // Services first, so grants and rate limits can refer to any of them.
    b.services(&raw.service);
    for g in &raw.grant {
        b.grant(g);
    }
    b.rate_limits(&raw.rate_limit);
    if let Some(n) = &raw.nmu {
        b.nmu(n);
    }
    b.ctx.finish(b.pol)
}

/// A policy under validation: the errors found so far and what is already known.
struct PolicyBuilder<'a> {
    ctx: Ctx<'a>,
    pol: Policy,
    /// Service IDs by name.
    by_name: BTreeMap<String, ServiceId>,
    /// Portals already reported as invalid: grants naming them are not reported again.
    broken: BTreeSet<(ServiceId, String)>,
}

impl PolicyBuilder<'_> {
    /// Validates every service (name, ID, domains, processes, portals) and adds it.
    fn services(&mut self, raw: &[RawService]) {
        let taken: BTreeSet<i64> = raw
            .iter()
            .filter_map(|s| s.id.as_ref().map(|i| *i.get_ref()))
            .collect();
        let mut next_id: ServiceId = 1;
        for rs in raw {
            let name = rs.name.get_ref().clone();
            if name.is_empty() {
                self.ctx.err(rs.name.span(), "service name is empty");
                continue;
            }
            if self.by_name.contains_key(&name) {
                self.ctx
                    .err(rs.name.span(), format!("service `{name}` is defined twice"));
                continue;
            }
            let Some(id) = self.service_id(rs, &taken, &mut next_id) else {
                continue;
            };
            let mut svc = Service {
                name: name.clone(),
                id,
                processes: BTreeMap::new(),
                domains: BTreeMap::new(),
                portals: BTreeMap::new(),
                self_access: rs.self_access.unwrap_or(true),
            };
            self.domains(rs, &mut svc);
            self.processes(rs, &mut svc);
            for rp in &rs.portal {
                self.portal(rp, &mut svc);
            }
            self.by_name.insert(name, id);
            self.pol.services.insert(id, svc);
        }
    }

    /// The service's ID: the one it gives, checked, or else the lowest free one from
    /// `next_id` up that no service claims (`taken`).
    fn service_id(
        &mut self,
        rs: &RawService,
        taken: &BTreeSet<i64>,
        next_id: &mut ServiceId,
    ) -> Option<ServiceId> {
        let Some(i) = &rs.id else {
            while taken.contains(&(*next_id as i64)) || self.pol.services.contains_key(next_id) {
                *next_id += 1;
            }
            return Some(*next_id);
        };
        let id = u32_id(&mut self.ctx, i, "service id")?;
        if id == NOS_SERVICE {
            self.ctx
                .err(i.span(), "service id is reserved for the Network OS");
            return None;
        }
        if self.pol.services.contains_key(&id) {
            self.ctx
                .err(i.span(), format!("service id {id} is used twice"));
            return None;
        }
        Some(id)
    }

    /// Numbers the service's domains in order, reporting empty and repeated names.
    fn domains(&mut self, rs: &RawService, svc: &mut Service) {
        let name = &svc.name;
        for (i, d) in rs.domains.iter().enumerate() {
            if d.get_ref().is_empty() {
                self.ctx
                    .err(d.span(), format!("service `{name}`: domain name is empty"));
            } else if svc.domains.insert(d.get_ref().clone(), i as u32).is_some() {
                self.ctx.err(
                    d.span(),
                    format!("service `{name}` defines domain `{}` twice", d.get_ref()),
                );
            }
        }
    }

    /// Adds the service's processes: `process_count` of them, then each
    /// `[[service.process]]`, reporting out-of-range and repeated IDs.
    fn processes(&mut self, rs: &RawService, svc: &mut Service) {
        if let Some(c) = &rs.process_count {
            match u32_id(&mut self.ctx, c, "process_count") {
                Some(n) if n <= 1 << 24 => {
                    for p in 0..n {
                        svc.processes.insert(p, ProcessDef::default());
                    }
                }
                Some(n) => self
                    .ctx
                    .err(c.span(), format!("process_count {n} exceeds 16777216")),
                None => {}
            }
        }
        for p in &rs.process {
            let Some(pid) = u32_id(&mut self.ctx, &p.id, "process id") else {
                continue;
            };
            if let Some(c) = &p.cgroup
                && !c.get_ref().starts_with('/')
            {
                self.ctx.err(
                    c.span(),
                    format!(
                        "cgroup `{}` must be an absolute cgroup v2 path, like `/sikker/{}/{pid}`",
                        c.get_ref(),
                        svc.name
                    ),
                );
            }
            let uid = p.uid.as_ref().and_then(|u| u32_id(&mut self.ctx, u, "uid"));
            let def = ProcessDef {
                program: p.program.clone(),
                args: p.args.clone(),
                cgroup: p.cgroup.as_ref().map(|c| c.get_ref().clone()),
                uid,
            };
            if svc.processes.insert(pid, def).is_some() {
                self.ctx.err(
                    p.id.span(),
                    format!("service `{}` defines process {pid} twice", svc.name),
                );
            }
        }
    }

    /// Validates one portal of `svc` and adds it; an invalid one goes to `broken`.
    fn portal(&mut self, rp: &RawPortal, svc: &mut Service) {
        let pname = rp.name.get_ref().clone();
        let what = format!("portal `{pname}`");
        let processes = selection_procs(
            &mut self.ctx,
            svc,
            rp.processes.as_deref(),
            rp.all_processes.as_ref(),
            &what,
            rp.name.span(),
        );
        let domains = selection_doms(
            &mut self.ctx,
            svc,
            rp.domains.as_deref(),
            rp.all_domains.as_ref(),
            &what,
            rp.name.span(),
        );
        let password_sha256 = password_digest(&mut self.ctx, rp.password_sha256.as_ref());
        let (Some(processes), Some(domains)) = (processes, domains) else {
            self.broken.insert((svc.id, pname));
            return;
        };
        let portal = Portal {
            name: pname.clone(),
            processes,
            domains,
            password_sha256,
        };
        if svc.portals.insert(pname.clone(), portal).is_some() {
            self.ctx.err(
                rp.name.span(),
                format!("service `{}` defines portal `{pname}` twice", svc.name),
            );
        }
    }

    /// The ID of the service `s` names, or an error saying that `role` names none.
    fn lookup(&mut self, s: &Spanned<String>, role: &str) -> Option<ServiceId> {
        let id = self.by_name.get(s.get_ref()).copied();
        if id.is_none() {
            self.ctx.err(
                s.span(),
                format!("{role}: unknown service `{}`", s.get_ref()),
            );
        }
        id
    }

    /// Validates one grant and adds it.
    fn grant(&mut self, g: &RawGrant) {
        let from = self.lookup(&g.from, "grant `from`");
        let to = self.lookup(&g.to, "grant `to`");
        let (Some(from), Some(to)) = (from, to) else {
            return;
        };
        let target = match &g.portal {
            Some(portal) => self.portal_target(g, to, portal),
            None => self.direct_target(g, to),
        };
        if let Some(target) = target {
            self.pol.grants.push(Grant { from, to, target });
        }
    }

    /// A grant through `portal` of service `to`: the portal must exist, be named
    /// alone, and its password (if it has one) must match.
    fn portal_target(
        &mut self,
        g: &RawGrant,
        to: ServiceId,
        portal: &Spanned<String>,
    ) -> Option<GrantTarget> {
        if g.processes.is_some()
            || g.domains.is_some()
            || g.all_processes.is_some()
            || g.all_domains.is_some()
        {
            self.ctx.err(
                portal.span(),
                "a grant names either a portal or processes and domains, not both",
            );
            return None;
        }
        let dst = &self.pol.services[&to];
        let Some(p) = dst.portals.get(portal.get_ref()) else {
            if !self.broken.contains(&(to, portal.get_ref().clone())) {
                self.ctx.err(
                    portal.span(),
                    format!(
                        "service `{}` has no portal `{}`",
                        dst.name,
                        portal.get_ref()
                    ),
                );
            }
            return None;
        };
        if let Some(want) = p.password_sha256 {
            let Some(pw) = &g.password else {
                self.ctx.err(
                    portal.span(),
                    format!("portal `{}` is password-protected: give `password`", p.name),
                );
                return None;
            };
            let got: [u8; 32] = Sha256::digest(pw.get_ref().as_bytes()).into();
            if got != want {
                self.ctx
                    .err(pw.span(), format!("wrong password for portal `{}`", p.name));
                return None;
            }
        }
        Some(GrantTarget::Portal(portal.get_ref().clone()))
    }

    /// A grant of processes and domains of service `to`, named directly.
    fn direct_target(&mut self, g: &RawGrant, to: ServiceId) -> Option<GrantTarget> {
        let what = format!("grant {} → {}", g.from.get_ref(), g.to.get_ref());
        let dst = &self.pol.services[&to];
        let ps = selection_procs(
            &mut self.ctx,
            dst,
            g.processes.as_deref(),
            g.all_processes.as_ref(),
            &what,
            g.to.span(),
        );
        let ds = selection_doms(
            &mut self.ctx,
            dst,
            g.domains.as_deref(),
            g.all_domains.as_ref(),
            &what,
            g.to.span(),
        );
        let (Some(processes), Some(domains)) = (ps, ds) else {
            return None;
        };
        Some(GrantTarget::Direct { processes, domains })
    }

    /// Validates the rate limits: at most one per ordered pair of services.
    fn rate_limits(&mut self, raw: &[RawRate]) {
        let mut pairs = BTreeSet::new();
        for r in raw {
            if let Some(limit) = self.rate_limit(r, &mut pairs) {
                self.pol.rate_limits.push(limit);
            }
        }
    }

    /// Validates one rate limit; its pair of services goes into `pairs` even when
    /// another field is invalid, so that a repeat is still reported.
    fn rate_limit(
        &mut self,
        r: &RawRate,
        pairs: &mut BTreeSet<(ServiceId, ServiceId)>,
    ) -> Option<RateLimit> {
        let from = self.lookup(&r.from, "rate_limit `from`");
        let to = self.lookup(&r.to, "rate_limit `to`");
        let gbps = *r.gbps.get_ref();
        let gbps_ok = gbps.is_finite() && gbps > 0.0;
        if !gbps_ok {
            self.ctx.err(
                r.gbps.span(),
                format!("rate_limit gbps must be a positive number, got {gbps}"),
            );
        }
        let algorithm = rate_algorithm(&mut self.ctx, r.algorithm.as_ref());
        let bucket_bytes = bucket_bytes(&mut self.ctx, r.bucket_bytes.as_ref());
        let (Some(from), Some(to)) = (from, to) else {
            return None;
        };
        if !pairs.insert((from, to)) {
            self.ctx.err(
                r.from.span(),
                format!(
                    "a rate limit from `{}` to `{}` is already defined",
                    r.from.get_ref(),
                    r.to.get_ref()
                ),
            );
            return None;
        }
        Some(RateLimit {
            from,
            to,
            gbps: gbps_ok.then_some(gbps)?,
            algorithm: algorithm?,
            bucket_bytes: bucket_bytes?,
        })
    }

    /// Applies the `[nmu]` settings, each of which must be positive.
    fn nmu(&mut self, n: &RawNmu) {
        if let Some(t) = &n.otp_ttl_ms {
            if *t.get_ref() <= 0 {
                self.ctx.err(t.span(), "otp_ttl_ms must be positive");
            } else {
                self.pol.nmu.otp_ttl_ms = *t.get_ref() as u64;
            }
        }
        if let Some(c) = &n.otp_cap {
            if *c.get_ref() <= 0 {
                self.ctx.err(c.span(), "otp_cap must be positive");
            } else {
                self.pol.nmu.otp_cap = *c.get_ref() as usize;
            }
        }
    }
}

/// A portal's `password_sha256`, which must be 64 hexadecimal digits.
fn password_digest(ctx: &mut Ctx, h: Option<&Spanned<String>>) -> Option<[u8; 32]> {
    let h = h?;
    let digest = parse_hex32(&h.get_ref().to_ascii_lowercase());
    if digest.is_none() {
        ctx.err(
            h.span(),
            "password_sha256 must be 64 hexadecimal digits (a SHA-256 digest)",
        );
    }
    digest
}

/// A rate limit's algorithm: SE-TRE unless it names another (`None`: unknown name).
fn rate_algorithm(ctx: &mut Ctx, a: Option<&Spanned<String>>) -> Option<Algorithm> {
    let Some(a) = a else {
        return Some(Algorithm::SeTre);
    };
    let alg = Algorithm::parse(a.get_ref());
    if alg.is_none() {
        ctx.err(
            a.span(),
            format!(
                "unknown rate-control algorithm `{}` (one of ne, re, se-fa, se-te, se-re, se-tre)",
                a.get_ref()
            ),
        );
    }
    alg
}

/// A rate limit's bucket size in bytes: 25,000 unless given (`None`: not positive).
fn bucket_bytes(ctx: &mut Ctx, b: Option<&Spanned<i64>>) -> Option<u64> {
    match b {
        None => Some(25_000),
        Some(b) if *b.get_ref() > 0 => Some(*b.get_ref() as u64),
        Some(b) => {
            ctx.err(b.span(), "bucket_bytes must be positive");
            None
        }
    }
}

fn selection_procs(
    ctx: &mut Ctx,
    svc: &Service,
    list: Option<&[Spanned<i64>]>,
    all: Option<&Spanned<bool>>,
    what: &str,
    at: Range<usize>,
) -> Option<Selection<ProcessId>> {
    match (list, all) {
        (Some(_), Some(a)) => {
            ctx.err(
                a.span(),
                format!("{what}: give `processes` or `all_processes`, not both"),
            );
            None
        }
        (None, Some(a)) if *a.get_ref() => Some(Selection::All),
        (None, _) => {
            ctx.err(
                at,
                format!(
                    "{what}: no processes (give `processes = [...]` or `all_processes = true`)"
                ),
            );
            None
        }
        (Some(l), None) => {
            let mut set = BTreeSet::new();
            let mut ok = true;
            for p in l {
                let Some(id) = u32_id(ctx, p, "process id") else {
                    ok = false;
                    continue;
                };
                if !svc.processes.contains_key(&id) {
                    ctx.err(
                        p.span(),
                        format!("{what}: service `{}` has no process {id}", svc.name),
                    );
                    ok = false;
                }
                set.insert(id);
            }
            ok.then_some(Selection::Only(set))
        }
    }
}

fn selection_doms(
    ctx: &mut Ctx,
    svc: &Service,
    list: Option<&[Spanned<String>]>,
    all: Option<&Spanned<bool>>,
    what: &str,
    at: Range<usize>,
) -> Option<Selection<u32>> {
    match (list, all) {
        (Some(_), Some(a)) => {
            ctx.err(
                a.span(),
                format!("{what}: give `domains` or `all_domains`, not both"),
            );
            None
        }
        (None, Some(a)) if *a.get_ref() => Some(Selection::All),
        (None, _) => {
            ctx.err(
                at,
                format!("{what}: no domains (give `domains = [...]` or `all_domains = true`)"),
            );
            None
        }
        (Some(l), None) => {
            let mut set = BTreeSet::new();
            let mut ok = true;
            for d in l {
                match svc.domains.get(d.get_ref()) {
                    Some(&id) => {
                        set.insert(id);
                    }
                    None => {
                        ctx.err(
                            d.span(),
                            format!(
                                "{what}: domain `{}` is not defined by service `{}`",
                                d.get_ref(),
                                svc.name
                            ),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(Selection::Only(set))
        }
    }
}

/// Parses and validates a placement against a policy.
pub fn parse_placement(name: &str, src: &str, pol: &Policy) -> Result<Placement, PolicyErrors> {
    let mut ctx = Ctx::new(name, src);
    let Some(raw) = syntax::<RawPlacement>(&mut ctx, src) else {
        return ctx.finish(Placement::default());
    };
    let mut out = Placement::default();
    let mut seen_hosts = BTreeSet::new();
    let mut placed: BTreeMap<(ServiceId, ProcessId), String> = BTreeMap::new();
    for h in &raw.host {
        let hn = h.name.get_ref().clone();
        if hn.is_empty() {
            ctx.err(h.name.span(), "host name is empty");
            continue;
        }
        if !seen_hosts.insert(hn.clone()) {
            ctx.err(h.name.span(), format!("host `{hn}` is defined twice"));
            continue;
        }
        let mut procs = Vec::new();
        for p in &h.processes {
            let Some((s, id)) = p.get_ref().split_once(':') else {
                ctx.err(
                    p.span(),
                    format!("`{}` is not `service:process`", p.get_ref()),
                );
                continue;
            };
            let Some(svc) = pol.service_by_name(s) else {
                ctx.err(p.span(), format!("unknown service `{s}`"));
                continue;
            };
            let Ok(pid) = id.parse::<u32>() else {
                ctx.err(p.span(), format!("`{id}` is not a process id"));
                continue;
            };
            if !svc.processes.contains_key(&pid) {
                ctx.err(p.span(), format!("service `{s}` has no process {pid}"));
                continue;
            }
            if let Some(other) = placed.insert((svc.id, pid), hn.clone()) {
                ctx.err(
                    p.span(),
                    format!("process {s}:{pid} is already placed on host `{other}`"),
                );
                continue;
            }
            procs.push((svc.id, pid));
        }
        if procs.len() > 1 << 16 {
            ctx.err(
                h.name.span(),
                format!("host `{hn}` has more than 65536 processes"),
            );
            continue;
        }
        l4_addresses(&mut ctx, h, pol, &procs, &mut out.l4);
        agent_address(&mut ctx, h, &mut out.agents);
        out.hosts.push((hn, procs));
    }
    ctx.finish(out)
}

/// Validates a host's `l4` table into `out`: each key a process placed on
/// this host, each address a specific `IP:PORT` that no other process has.
fn l4_addresses(
    ctx: &mut Ctx,
    h: &RawHost,
    pol: &Policy,
    procs: &[(ServiceId, ProcessId)],
    out: &mut BTreeMap<(ServiceId, ProcessId), Vec<SocketAddr>>,
) {
    let hn = h.name.get_ref();
    for (key, value) in &h.l4 {
        let name = key.get_ref();
        let Some((svc, pid)) = name
            .split_once(':')
            .and_then(|(s, p)| Some((pol.service_by_name(s)?, p.parse::<u32>().ok()?)))
        else {
            ctx.err(
                key.span(),
                format!("l4: `{name}` is not a `service:process` of the policy"),
            );
            continue;
        };
        if !procs.contains(&(svc.id, pid)) {
            ctx.err(
                key.span(),
                format!("l4: process {name} is not placed on host `{hn}`"),
            );
            continue;
        }
        let texts: Vec<&str> = match value.get_ref() {
            RawL4::One(a) => vec![a.as_str()],
            RawL4::Many(v) => v.iter().map(String::as_str).collect(),
        };
        if texts.is_empty() {
            ctx.err(value.span(), format!("l4: {name} has no address"));
        }
        for text in texts {
            match l4_address(text) {
                Err(why) => ctx.err(value.span(), format!("l4 address of {name}: {why}")),
                Ok(a) => {
                    let a = normalize(a);
                    if let Some(((s, p), _)) = out.iter().find(|(_, v)| v.contains(&a)) {
                        let owner = pol.services.get(s).map_or("?", |s| s.name.as_str());
                        ctx.err(
                            value.span(),
                            format!("l4: {a} is already the address of {owner}:{p}"),
                        );
                        continue;
                    }
                    out.entry((svc.id, pid)).or_default().push(a);
                }
            }
        }
    }
}

/// Validates a host's `agent` address into `out`: a specific `IP:PORT` that
/// no other host's agent has.
fn agent_address(ctx: &mut Ctx, h: &RawHost, out: &mut BTreeMap<String, SocketAddr>) {
    let Some(value) = &h.agent else { return };
    let hn = h.name.get_ref();
    match l4_address(value.get_ref()) {
        Err(why) => ctx.err(value.span(), format!("agent address of host `{hn}`: {why}")),
        Ok(a) => {
            let a = normalize(a);
            if let Some((other, _)) = out.iter().find(|(_, v)| **v == a) {
                ctx.err(
                    value.span(),
                    format!("agent address {a} is already host `{other}`'s"),
                );
                return;
            }
            out.insert(hn.clone(), a);
        }
    }
}

/// Why a text is not an L4 address (the policy error says whose it is).
#[derive(Debug, thiserror::Error)]
enum BadL4Address {
    #[error("`{0}` is not IP:PORT (for IPv6, `[fd00::2]:8080`)")]
    Syntax(String),
    #[error("`{0}` has no specific address; give the one clients connect to")]
    Unspecified(String),
    #[error("`{0}` has port 0")]
    PortZero(String),
}

/// An L4 address a client connects to: `IP:PORT` (`[IPv6]:PORT`), with a
/// specific IP and a port other than 0.
fn l4_address(text: &str) -> Result<SocketAddr, BadL4Address> {
    let a: SocketAddr = text
        .parse()
        .map_err(|_| BadL4Address::Syntax(text.to_string()))?;
    if a.ip().is_unspecified() {
        return Err(BadL4Address::Unspecified(text.to_string()));
    }
    if a.port() == 0 {
        return Err(BadL4Address::PortZero(text.to_string()));
    }
    Ok(a)
}

/// IPv4-mapped IPv6 addresses as the IPv4 ones, so that each address has one
/// form.
fn normalize(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

#[cfg(test)]
mod tests;
