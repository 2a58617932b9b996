//! `sidecore policy`: Sikker policies from the command line. `check` validates a
//! policy (and a placement) and shows the SACL it expands to and the NMU tables
//! each host would hold; `trace` answers "may this process send to that one, in
//! this domain?" from the SACL and, with a placement, from the sender's real NMU
//! tables — the way `cilium policy trace` explains a verdict.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sidecore_sikker_nmu::{DomainId, ProcessId, TableStats, Triple};
use sidecore_sikker_policy::{Nos, Policy, Sacl, Service, parse_placement, parse_policy};

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

/// Reads and validates a policy; its located errors are printed before the error.
pub(crate) fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    let src = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    parse_policy(&path.display().to_string(), &src).map_err(|e| {
        eprint!("{}", e.rendered());
        anyhow::anyhow!("{}: {} problem(s) found", path.display(), e.0.len())
    })
}

/// Reads a placement and compiles the Network OS's tables for it.
pub(crate) fn load_nos(path: &Path, policy: &Policy) -> anyhow::Result<Nos> {
    let src = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let placement = parse_placement(&path.display().to_string(), &src, policy).map_err(|e| {
        eprint!("{}", e.rendered());
        anyhow::anyhow!("{}: {} problem(s) found", path.display(), e.0.len())
    })?;
    Nos::compile(policy.clone(), &placement).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
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

/// `policy check --json`: the services, the SACL and the NMU tables per host.
fn print_check_json(
    policy: &Policy,
    sacl: &Sacl,
    hosts: &[(String, TableStats)],
) -> anyhow::Result<()> {
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
    let entries: Vec<serde_json::Value> = sacl
        .iter()
        .map(|((from, to), e)| {
            let dst = &policy.services[to];
            serde_json::json!({
                "from": svc_name(policy, *from),
                "to": dst.name,
                "processes": e.processes,
                "domains": domain_names(dst, &e.domains),
                "rate_gbps": e.rate_slot.map(|i| policy.rate_limits[i as usize].gbps),
            })
        })
        .collect();
    let hosts: Vec<serde_json::Value> = hosts
        .iter()
        .map(|(h, st)| {
            serde_json::json!({
                "host": h, "processes": st.processes, "services": st.services,
                "sacl_entries": st.sacl_entries, "process_entries": st.process_entries,
                "domain_entries": st.domain_entries, "bytes": st.total_bytes,
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
    Ok(())
}

fn check(path: &Path, placement: Option<&Path>, json: bool) -> anyhow::Result<ExitCode> {
    let policy = load_policy(path)?;
    let nos = placement.map(|pl| load_nos(pl, &policy)).transpose()?;
    // The compiled Network OS already holds the expanded SACL.
    let own_sacl;
    let sacl = match &nos {
        Some(n) => n.sacl(),
        None => {
            own_sacl = policy.sacl();
            &own_sacl
        }
    };
    let hosts: Vec<(String, TableStats)> = nos
        .iter()
        .flat_map(|n| {
            n.host_names().into_iter().map(move |h| {
                let st = n
                    .tables(&h)
                    .map(sidecore_sikker_nmu::NmuTables::stats)
                    .unwrap_or_default();
                (h, st)
            })
        })
        .collect();
    if json {
        print_check_json(&policy, sacl, &hosts)?;
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
    for ((from, to), e) in sacl {
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
        for (h, st) in &hosts {
            println!(
                "  {h}: {} resident process(es) of {} service(s), {} SACL entries, {} bytes",
                st.processes, st.services, st.sacl_entries, st.total_bytes
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Splits `text` (an argument `what`) at `:` into `parts` pieces, or says the
/// form expected (`form`) before anything is looked up.
fn split<'t>(
    what: &str,
    text: &'t str,
    parts: std::ops::RangeInclusive<usize>,
    form: &str,
) -> anyhow::Result<Vec<&'t str>> {
    let v: Vec<&str> = text.split(':').collect();
    if !parts.contains(&v.len()) {
        bail!("{what} `{text}`: {form}");
    }
    Ok(v)
}

fn service<'p>(
    policy: &'p Policy,
    what: &str,
    text: &str,
    name: &str,
) -> anyhow::Result<&'p Service> {
    policy.service_by_name(name).with_context(|| {
        format!(
            "{what} `{text}`: no service `{name}` in the policy (services: {})",
            policy
                .services
                .values()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

fn process(svc: &Service, what: &str, text: &str, p: &str) -> anyhow::Result<ProcessId> {
    let id: ProcessId = p
        .parse()
        .with_context(|| format!("{what} `{text}`: process `{p}` is not a number"))?;
    if !svc.processes.contains_key(&id) {
        bail!(
            "{what} `{text}`: service `{}` has no process {id}",
            svc.name
        );
    }
    Ok(id)
}

fn domain(svc: &Service, what: &str, text: &str, d: &str) -> anyhow::Result<DomainId> {
    svc.domains.get(d).copied().with_context(|| {
        format!(
            "{what} `{text}`: service `{}` has no domain `{d}` (domains: {})",
            svc.name,
            svc.domains.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    })
}

fn trace(path: &Path, placement: Option<&Path>, from: &str, to: &str) -> anyhow::Result<ExitCode> {
    let policy = load_policy(path)?;
    let f = split(
        "--from",
        from,
        1..=2,
        "a source is SERVICE or SERVICE:PROCESS (domains belong to the destination)",
    )?;
    let src = service(&policy, "--from", from, f[0])?;
    let src_proc = f
        .get(1)
        .map(|p| process(src, "--from", from, p))
        .transpose()?;
    let t = split("--to", to, 3..=3, "expected SERVICE:PROCESS:DOMAIN")?;
    let dst = service(&policy, "--to", to, t[0])?;
    let proc = process(dst, "--to", to, t[1])?;
    let dom = domain(dst, "--to", to, t[2])?;
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
        let nos = load_nos(pl, &policy)?;
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
