//! `sidecore policy`: Sikker policies from the command line. `check` validates a
//! policy (and a placement) and shows the SACL it expands to and the NMU tables
//! each host would hold; `trace` answers "may this process send to that one, in
//! this domain?" from the SACL and, with a placement, from the sender's real NMU
//! tables — the way `cilium policy trace` explains a verdict.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sidecore_sikker_nmu::{DomainId, ProcessId, Triple};
use sidecore_sikker_policy::{Nos, Policy, Service, parse_placement, parse_policy};

/// `sidecore policy …`.
#[derive(Args, Debug)]
pub struct PolicyCommand {
    #[command(subcommand)]
    which: PolicyWhich,
}

#[derive(Subcommand, Debug)]
enum PolicyWhich {
    /// Validate a policy (and a placement) and summarise what it permits.
    Check {
        policy: PathBuf,
        /// Placement TOML (`[[host]] name, processes = ["svc:proc", …]`): also
        /// compile every host's NMU tables.
        #[arg(long)]
        placement: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Explain whether a source may reach a destination process in a domain.
    Trace {
        policy: PathBuf,
        /// Source: `SERVICE` or `SERVICE:PROCESS` (the process is needed to
        /// consult its host's NMU tables).
        #[arg(long)]
        from: String,
        /// Destination: `SERVICE:PROCESS:DOMAIN` (domain by name).
        #[arg(long)]
        to: String,
        /// Placement TOML: also run the check through the sender's NMU tables.
        #[arg(long)]
        placement: Option<PathBuf>,
    },
}

/// Runs a `policy` subcommand. Exit code 2: bad input (the policy, the placement
/// or an argument); 1: `trace` found the access denied.
pub fn run(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    let r = match cmd.which {
        PolicyWhich::Check {
            policy,
            placement,
            json,
        } => check(&policy, placement.as_deref(), json),
        PolicyWhich::Trace {
            policy,
            from,
            to,
            placement,
        } => trace(&policy, placement.as_deref(), &from, &to),
    };
    r.or_else(|e| {
        eprintln!("error: {e:#}");
        Ok(ExitCode::from(2))
    })
}

fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// Reads and validates a policy, or prints its errors (`Err(code)`).
fn load_policy(path: &Path) -> anyhow::Result<Result<Policy, ExitCode>> {
    let src = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Ok(
        parse_policy(&path.display().to_string(), &src).map_err(|e| {
            eprint!("{}", e.rendered());
            eprintln!("{}: {} problem(s) found", path.display(), e.0.len());
            ExitCode::from(2)
        }),
    )
}

/// Reads a placement and compiles the NOS, or prints why not (`Err(code)`).
fn load_nos(path: &Path, policy: &Policy) -> anyhow::Result<Result<Nos, ExitCode>> {
    let src = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let placement = match parse_placement(&path.display().to_string(), &src, policy) {
        Ok(p) => p,
        Err(e) => {
            eprint!("{}", e.rendered());
            eprintln!("{}: {} problem(s) found", path.display(), e.0.len());
            return Ok(Err(ExitCode::from(2)));
        }
    };
    match Nos::compile(policy.clone(), &placement) {
        Ok(n) => Ok(Ok(n)),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            Ok(Err(ExitCode::from(2)))
        }
    }
}

fn svc_name(p: &Policy, id: u32) -> String {
    p.services
        .get(&id)
        .map(|s| s.name.clone())
        .unwrap_or_else(|| id.to_string())
}

fn domain_names(s: &Service, ids: &std::collections::BTreeSet<DomainId>) -> Vec<String> {
    s.domains
        .iter()
        .filter(|(_, d)| ids.contains(d))
        .map(|(n, _)| n.clone())
        .collect()
}

fn check(path: &Path, placement: Option<&Path>, json: bool) -> anyhow::Result<ExitCode> {
    let policy = match load_policy(path)? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let nos = match placement {
        Some(pl) => match load_nos(pl, &policy)? {
            Ok(n) => Some(n),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    let sacl = policy.sacl();
    let entries: Vec<serde_json::Value> = sacl
        .iter()
        .map(|((from, to), e)| {
            let dst = &policy.services[to];
            serde_json::json!({
                "from": svc_name(&policy, *from),
                "to": dst.name,
                "processes": e.processes,
                "domains": domain_names(dst, &e.domains),
                "rate_gbps": e.rate_slot.map(|i| policy.rate_limits[i as usize].gbps),
            })
        })
        .collect();
    let hosts: Vec<serde_json::Value> = nos
        .iter()
        .flat_map(|n| {
            n.host_names().into_iter().map(move |h| {
                let st = n.tables(&h).map(|t| t.stats()).unwrap_or_default();
                serde_json::json!({
                    "host": h, "processes": st.processes, "services": st.services,
                    "sacl_entries": st.sacl_entries, "process_entries": st.process_entries,
                    "domain_entries": st.domain_entries, "bytes": st.total_bytes,
                })
            })
        })
        .collect();
    if json {
        let services: Vec<serde_json::Value> = policy
            .services
            .values()
            .map(|s| {
                serde_json::json!({
                    "name": s.name, "id": s.id, "processes": s.processes.len(),
                    "domains": s.domains.keys().collect::<Vec<_>>(),
                    "portals": s.portals.keys().collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "services": services, "grants": policy.grants.len(),
                "rate_limits": policy.rate_limits.len(), "sacl": entries, "hosts": hosts,
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: valid — {} service(s), {} grant(s), {} rate limit(s)",
        path.display(),
        policy.services.len(),
        policy.grants.len(),
        policy.rate_limits.len()
    );
    for s in policy.services.values() {
        println!(
            "  service {} (id {}): {} process(es), domains [{}], portals [{}]",
            s.name,
            s.id,
            s.processes.len(),
            s.domains.keys().cloned().collect::<Vec<_>>().join(", "),
            s.portals.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    println!("SACL (who may reach what):");
    for ((from, to), e) in &sacl {
        let dst = &policy.services[to];
        println!(
            "  {} → {}: processes {} × domains {}{}",
            svc_name(&policy, *from),
            dst.name,
            list(&e.processes),
            list(domain_names(dst, &e.domains)),
            e.rate_slot
                .map(|i| format!(", limited to {} Gbps", policy.rate_limits[i as usize].gbps))
                .unwrap_or_default()
        );
    }
    if !hosts.is_empty() {
        println!("NMU tables per host:");
        for h in &hosts {
            println!(
                "  {}: {} resident process(es) of {} service(s), {} SACL entries, {} bytes",
                h["host"].as_str().unwrap_or_default(),
                h["processes"],
                h["services"],
                h["sacl_entries"],
                h["bytes"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses `SERVICE[:PROCESS[:DOMAIN]]` against the policy; `parts` is how many of
/// the three are required.
fn endpoint<'p>(
    policy: &'p Policy,
    what: &str,
    text: &str,
    parts: usize,
) -> anyhow::Result<(&'p Service, Option<ProcessId>, Option<DomainId>)> {
    let mut it = text.splitn(3, ':');
    let name = it.next().unwrap_or_default();
    let svc = policy.service_by_name(name).with_context(|| {
        format!(
            "{what} `{text}`: no service `{name}` in the policy (services: {})",
            policy
                .services
                .values()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let proc = match it.next() {
        Some(p) => {
            let id: ProcessId = p
                .parse()
                .with_context(|| format!("{what} `{text}`: process `{p}` is not a number"))?;
            if !svc.processes.contains_key(&id) {
                bail!("{what} `{text}`: service `{name}` has no process {id}");
            }
            Some(id)
        }
        None => None,
    };
    let dom = match it.next() {
        Some(d) => Some(*svc.domains.get(d).with_context(|| {
            format!(
                "{what} `{text}`: service `{name}` has no domain `{d}` (domains: {})",
                svc.domains.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?),
        None => None,
    };
    let given = 1 + proc.is_some() as usize + dom.is_some() as usize;
    if given < parts {
        bail!(
            "{what} `{text}`: expected {}",
            if parts == 3 {
                "SERVICE:PROCESS:DOMAIN"
            } else {
                "SERVICE:PROCESS"
            }
        );
    }
    Ok((svc, proc, dom))
}

fn trace(path: &Path, placement: Option<&Path>, from: &str, to: &str) -> anyhow::Result<ExitCode> {
    let policy = match load_policy(path)? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let (src, src_proc, src_dom) = endpoint(&policy, "--from", from, 1)?;
    if src_dom.is_some() {
        bail!(
            "--from `{from}`: a source is SERVICE or SERVICE:PROCESS (domains belong to the destination)"
        );
    }
    let (dst, Some(proc), Some(dom)) = endpoint(&policy, "--to", to, 3)? else {
        unreachable!("endpoint() requires all three parts")
    };
    let sacl = policy.sacl();
    let verdict = match sacl.get(&(src.id, dst.id)) {
        None => Err(format!(
            "no SACL entry from `{}` to `{}`: no grant, portal or self access",
            src.name, dst.name
        )),
        Some(e) if !e.processes.contains(&proc) => Err(format!(
            "`{}` may reach processes {} of `{}`, not {proc}",
            src.name,
            list(&e.processes),
            dst.name
        )),
        Some(e) if !e.domains.contains(&dom) => Err(format!(
            "`{}` may use domains {} of `{}`, not this one",
            src.name,
            list(domain_names(dst, &e.domains)),
            dst.name
        )),
        Some(e) => Ok(e
            .rate_slot
            .map(|i| {
                format!(
                    ", rate-limited to {} Gbps",
                    policy.rate_limits[i as usize].gbps
                )
            })
            .unwrap_or_default()),
    };
    match &verdict {
        Ok(rate) => println!("SACL: ALLOWED — {from} → {to}{rate}"),
        Err(why) => println!("SACL: DENIED — {why}"),
    }
    if let Some(pl) = placement {
        let Some(sp) = src_proc else {
            bail!("--from `{from}`: give SERVICE:PROCESS to check through the sender's NMU");
        };
        let nos = match load_nos(pl, &policy)? {
            Ok(n) => n,
            Err(code) => return Ok(code),
        };
        let (host, _, li) = nos.locate(src.id, sp).with_context(|| {
            format!(
                "--from `{from}`: the placement puts process {sp} of `{}` on no host",
                src.name
            )
        })?;
        let tables = nos.tables(&host).context("host without tables")?;
        let nmu = tables.check(
            li,
            Triple {
                svc: dst.id,
                proc,
                dom,
            },
        );
        match &nmu {
            Ok((addr, _)) => println!("NMU on {host}: ALLOWED — destination address {}", addr.0),
            Err(e) => println!("NMU on {host}: DENIED — {e}"),
        }
        // The tables are compiled from the SACL: the two verdicts must agree.
        if nmu.is_ok() != verdict.is_ok() {
            bail!("the NMU tables on {host} disagree with the SACL (a compiler bug)");
        }
    }
    Ok(if verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
