//! `sidecore sikker l4`: Sikker's L4 mode on this host, for services that
//! cannot link the client library. Loads the kernel PE's cgroup programs
//! (`sidecore_kernel::SikkerL4`), attaches them to a cgroup v2 directory,
//! feeds their maps from the policy and the placement's L4 addresses
//! (`sidecore_sikker_agent::l4::plan`), and runs until SIGINT or SIGTERM,
//! printing the counters as JSON (at the end, and every `--stats-ms`).
//! Cgroups the policy names that do not exist yet are looked for again every
//! second, and mapped when they appear. The policy and placement files are
//! watched: a change is applied to the maps, a text with errors is reported
//! with its locations and the last good pair keeps enforcing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use sidecore_kernel::sikker_l4::{MAX_BUCKET, MAX_RATE, cgroup_id, cgroup2_root};
use sidecore_kernel::{L4Counters, L4Peer, L4Rate, L4Source, L4Tables, SikkerL4};
use sidecore_sikker_agent::l4::{L4Plan, plan};
use sidecore_sikker_agent::store::{self, PlacementUpdate, PolicyUpdate, Source, Update};
use sidecore_sikker_policy::{Nos, Placement, Policy, parse_placement};
use std::sync::mpsc::Receiver;

/// `sidecore sikker l4`.
#[derive(Args, Debug)]
pub struct L4Args {
    /// The policy (TOML).
    #[arg(long)]
    policy: PathBuf,
    /// The placement (TOML), with each listening process's L4 addresses:
    /// `l4 = { "SERVICE:PROCESS" = "IP:PORT" }` in its `[[host]]`.
    #[arg(long)]
    placement: PathBuf,
    /// This host's name in the placement.
    #[arg(long)]
    host: String,
    /// The cgroup v2 directory to attach to: the programs see every process
    /// in it and below. Default: the cgroup v2 root (every process).
    #[arg(long)]
    cgroup: Option<PathBuf>,
    /// Also print the counters every this many milliseconds (0: only at the end).
    #[arg(long, default_value_t = 0)]
    stats_ms: u64,
}

/// Reads a placement (errors located and drawn, as `load_nos` does).
pub(crate) fn load_placement(path: &Path, policy: &Policy) -> anyhow::Result<Placement> {
    let src = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    parse_placement(&path.display().to_string(), &src, policy).map_err(|e| {
        eprint!("{}", e.rendered());
        anyhow::anyhow!("{}: {} problem(s) found", path.display(), e.0.len())
    })
}

/// What the maps are built from, and names for what they hold.
struct State {
    policy: Policy,
    plan: L4Plan,
    /// The cgroup v2 mount point, where the policy's cgroup paths start.
    root: PathBuf,
}

impl State {
    fn service(&self, id: u32) -> String {
        self.policy
            .services
            .get(&id)
            .map_or_else(|| id.to_string(), |s| s.name.clone())
    }

    /// The tables, with the cgroups that exist now; and the sources whose
    /// cgroup does not (with why).
    fn tables(&self) -> (L4Tables, Vec<(String, String)>) {
        let mut t = L4Tables::default();
        let mut missing = Vec::new();
        for s in &self.plan.sources {
            let dir = self.root.join(s.cgroup.trim_start_matches('/'));
            match cgroup_id(&dir) {
                Ok(id) => {
                    t.cgroups.insert(
                        id,
                        L4Source {
                            service: s.service,
                            process: s.process,
                            uid: s.uid,
                        },
                    );
                }
                Err(e) => missing.push((
                    format!("{}:{} ← {}", self.service(s.service), s.process, s.cgroup),
                    e.to_string(),
                )),
            }
        }
        for (&a, &(service, process)) in &self.plan.destinations {
            t.destinations.insert(a, L4Peer { service, process });
        }
        t.permits.clone_from(&self.plan.permits);
        for (&pair, r) in &self.plan.rates {
            t.rates.insert(
                pair,
                L4Rate {
                    bytes_per_sec: r.bytes_per_sec,
                    bucket_bytes: r.bucket_bytes,
                },
            );
        }
        (t, missing)
    }

    /// Refuses limits the programs cannot hold, by name.
    fn check_rates(&self) -> anyhow::Result<()> {
        for (&(src, dst), r) in &self.plan.rates {
            let pair = format!("{} → {}", self.service(src), self.service(dst));
            if r.bytes_per_sec > MAX_RATE {
                bail!(
                    "rate limit {pair}: {} Gbps is above the {} Gbps L4 mode can hold",
                    r.gbps,
                    MAX_RATE * 8 / 1_000_000_000
                );
            }
            if r.bucket_bytes > MAX_BUCKET {
                bail!(
                    "rate limit {pair}: a {}-byte bucket is above the {MAX_BUCKET} bytes L4 mode can hold",
                    r.bucket_bytes
                );
            }
        }
        Ok(())
    }

    /// The summary printed once attached.
    fn summary(&self, host: &str, dir: &Path, t: &L4Tables, missing: &[(String, String)]) {
        eprintln!(
            "sikker l4 for host {host}: attached to {} (connect4, connect6, egress)",
            dir.display()
        );
        for s in &self.plan.sources {
            eprintln!(
                "  source       {}:{} ← cgroup {}{}",
                self.service(s.service),
                s.process,
                s.cgroup,
                s.uid.map(|u| format!(" as uid {u}")).unwrap_or_default()
            );
        }
        for (what, why) in missing {
            eprintln!("  not yet      {what}: {why}; mapped when it appears");
        }
        for &(s, p) in &self.plan.unidentified {
            eprintln!(
                "  unidentified {}:{p} names no cgroup: its connects to L4 addresses are refused",
                self.service(s)
            );
        }
        for (a, &(s, p)) in &self.plan.destinations {
            eprintln!("  destination  {a} → {}:{p}", self.service(s));
        }
        for (s, a) in &self.plan.permits {
            eprintln!("  permit       {} → {a}", self.service(*s));
        }
        for (&(s, d), r) in &self.plan.rates {
            eprintln!(
                "  rate         {} → {}: {} Gbps = {} bytes/s, bucket {} bytes",
                self.service(s),
                self.service(d),
                r.gbps,
                r.bytes_per_sec,
                r.bucket_bytes
            );
        }
        eprintln!(
            "{} cgroup(s), {} destination(s), {} permit(s), {} rate limit(s) installed; Ctrl-C stops it",
            t.cgroups.len(),
            t.destinations.len(),
            t.permits.len(),
            t.rates.len()
        );
    }

    /// The counters as one JSON object, services by name (`null`: a process
    /// in no mapped cgroup).
    fn json(&self, c: &L4Counters, host: &str, elapsed: Duration, last: bool) -> serde_json::Value {
        let pairs: Vec<serde_json::Value> = c
            .pairs
            .iter()
            .map(|p| {
                json!({
                    "from": p.src.map(|s| self.service(s)),
                    "to": self.service(p.dst),
                    "connects_allowed": p.connects_allowed,
                    "connects_denied": p.connects_denied,
                    "packets_passed": p.packets_passed,
                    "bytes_passed": p.bytes_passed,
                    "packets_dropped": p.packets_dropped,
                    "bytes_dropped": p.bytes_dropped,
                    "packets_denied": p.packets_denied,
                    "bytes_denied": p.bytes_denied,
                })
            })
            .collect();
        let t = &c.totals;
        json!({
            "host": host,
            "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            "final": last,
            "pairs": pairs,
            "connects_paced": t.connects_paced,
            "unmanaged": {
                "connects": t.connects_unmanaged,
                "connects_not_tcp": t.connects_not_tcp,
                "packets": t.packets_unmanaged,
                "packets_unparsed": t.packets_unparsed,
            },
        })
    }
}

/// The policy and placement files of a standalone `sikker l4`, watched: each
/// change is applied to the maps; a text with errors is reported with its
/// locations and the last good pair keeps enforcing.
struct Watched {
    policy: Policy,
    /// The placement file's name, and its text in force.
    placement_name: String,
    placement_text: String,
    placement: Placement,
    policies: Receiver<PolicyUpdate>,
    placements: Receiver<PlacementUpdate>,
    /// Changes applied (what [`L4Feed::refresh`] follows).
    applied: u64,
}

impl Watched {
    fn start(a: &L4Args, policy: Policy) -> anyhow::Result<Watched> {
        let placement = load_placement(&a.placement, &policy)?;
        let placement_text = std::fs::read_to_string(&a.placement)
            .with_context(|| a.placement.display().to_string())?;
        let (ptx, policies) = std::sync::mpsc::channel();
        let (ltx, placements) = std::sync::mpsc::channel();
        store::watch(Source::File(a.policy.clone()), ptx);
        store::watch_doc(Source::File(a.placement.clone()), store::PLACEMENT, ltx);
        Ok(Watched {
            policy,
            placement_name: a.placement.display().to_string(),
            placement_text,
            placement,
            policies,
            placements,
            applied: 0,
        })
    }

    /// Takes what changed on disk; whether the pair in force changed.
    fn take(&mut self) -> bool {
        let (mut policy, mut text) = (None, None);
        while let Ok(u) = self.policies.try_recv() {
            match u {
                Update::Doc { doc, .. } if doc != self.policy => policy = Some(doc),
                Update::Invalid { source, errors } => eprintln!(
                    "sikker l4: the policy at {source} has errors; the last good one stays:\n{errors}"
                ),
                _ => {}
            }
        }
        while let Ok(u) = self.placements.try_recv() {
            if let Update::Doc { doc, .. } = u {
                text = Some(doc);
            }
        }
        if policy.is_none() && text.as_ref().is_none_or(|t| t.text == self.placement_text) {
            return false;
        }
        let policy = policy.unwrap_or_else(|| self.policy.clone());
        let (name, text) = text.map_or_else(
            || (self.placement_name.clone(), self.placement_text.clone()),
            |t| (t.name, t.text),
        );
        match parse_placement(&name, &text, &policy) {
            Ok(p) => {
                (self.policy, self.placement, self.placement_text) = (policy, p, text);
                self.applied += 1;
                true
            }
            Err(e) => {
                eprintln!(
                    "sikker l4: the placement at {name} does not fit the policy; the last good pair stays:\n{e}"
                );
                false
            }
        }
    }
}

/// Runs L4 mode until SIGINT or SIGTERM.
pub fn run(a: &L4Args) -> anyhow::Result<ExitCode> {
    let policy = crate::policy::load_policy(&a.policy)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let mut feed = L4Feed::start(&policy, &a.placement, &a.host, a.cgroup.as_deref())?;
    let mut watched = Watched::start(a, policy)?;
    let start = Instant::now();
    let mut next_stats = start + Duration::from_millis(a.stats_ms);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if a.stats_ms > 0 && Instant::now() >= next_stats {
            next_stats = Instant::now() + Duration::from_millis(a.stats_ms);
            println!("{}", feed.json(start.elapsed(), false)?);
        }
        if watched.take() {
            match Nos::compile(watched.policy.clone(), &watched.placement) {
                Ok(nos) => feed.refresh(
                    &watched.policy,
                    &nos,
                    watched.applied,
                    &watched.placement.l4,
                ),
                Err(e) => eprintln!("sikker l4: the new policy and placement do not compile: {e}"),
            }
        } else {
            feed.rescan_due()?;
        }
    }
    println!("{}", feed.json(start.elapsed(), true)?);
    Ok(ExitCode::SUCCESS)
}

/// Resolves the policy's cgroups again (one may have appeared, or been made
/// anew with another id) and installs what changed; the sources still
/// missing.
fn rescan(
    state: &State,
    l4: &mut SikkerL4,
    before: &[(String, String)],
) -> anyhow::Result<Vec<(String, String)>> {
    let (tables, missing) = state.tables();
    if tables.cgroups != l4.tables().cgroups {
        let was: BTreeMap<&str, &str> = before
            .iter()
            .map(|(w, e)| (w.as_str(), e.as_str()))
            .collect();
        l4.install(&tables)?;
        for (what, _) in before {
            if !missing.iter().any(|(w, _)| w == what) {
                eprintln!("mapped {what}");
            }
        }
        for (what, why) in &missing {
            if !was.contains_key(what.as_str()) {
                eprintln!("unmapped {what}: {why}");
            }
        }
    }
    Ok(missing)
}

/// L4 mode running on this host: the programs attached and their maps fed.
/// `sidecore sikker l4` runs one on a fixed policy; `sidecore sikker agent
/// --l4` runs one whose maps follow the agent's policy ([`L4Feed::refresh`],
/// every turn on the agent's thread), so a live update (file or etcd) reaches
/// plain TCP too.
pub struct L4Feed {
    state: State,
    l4: SikkerL4,
    l4_addrs: BTreeMap<(u32, u32), Vec<std::net::SocketAddr>>,
    host: String,
    updates_seen: u64,
    missing: Vec<(String, String)>,
    next_scan: Instant,
}

impl L4Feed {
    /// Loads the programs, feeds them from `policy` and the placement's L4
    /// addresses, and attaches them to `cgroup` (default: the v2 root).
    pub fn start(
        policy: &Policy,
        placement: &Path,
        host: &str,
        cgroup: Option<&Path>,
    ) -> anyhow::Result<L4Feed> {
        let p = load_placement(placement, policy)?;
        Self::start_with(policy, &p, &placement.display().to_string(), host, cgroup)
    }

    /// As [`L4Feed::start`], from a placement already read (the agent's, from
    /// a file or etcd); `source` names it in errors.
    pub fn start_with(
        policy: &Policy,
        p: &Placement,
        source: &str,
        host: &str,
        cgroup: Option<&Path>,
    ) -> anyhow::Result<L4Feed> {
        let nos = Nos::compile(policy.clone(), p).map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
        let root = cgroup2_root().context(
            "no cgroup v2 file system is mounted (none in /proc/self/mountinfo); L4 mode needs one",
        )?;
        let state = State {
            policy: policy.clone(),
            plan: plan(&nos, &p.l4, host)?,
            root,
        };
        state.check_rates()?;
        let dir = cgroup.map_or_else(|| state.root.clone(), Path::to_path_buf);
        let mut l4 = SikkerL4::load()?;
        let (tables, missing) = state.tables();
        l4.install(&tables)?;
        l4.attach(&dir)?;
        state.summary(host, &dir, &tables, &missing);
        Ok(L4Feed {
            state,
            l4,
            l4_addrs: p.l4.clone(),
            host: host.to_string(),
            updates_seen: 0,
            missing,
            next_scan: Instant::now() + Duration::from_secs(1),
        })
    }

    /// After a policy or placement update the agent applied (`updates`
    /// counts both), the maps follow it: the policy's permissions and limits
    /// at the placement's L4 addresses (`l4_addrs`). Every second, cgroups
    /// that appeared are mapped. What L4 mode cannot hold is reported and the
    /// maps keep the last good one.
    pub fn refresh(
        &mut self,
        policy: &Policy,
        nos: &Nos,
        updates: u64,
        l4_addrs: &BTreeMap<(u32, u32), Vec<std::net::SocketAddr>>,
    ) {
        if updates != self.updates_seen {
            self.updates_seen = updates;
            let moved = *l4_addrs != self.l4_addrs;
            let next = plan(nos, l4_addrs, &self.host).map(|plan| State {
                policy: policy.clone(),
                plan,
                root: self.state.root.clone(),
            });
            match next.map_err(anyhow::Error::from).and_then(|st| {
                st.check_rates()?;
                let (tables, missing) = st.tables();
                self.l4.install(&tables)?;
                Ok((st, missing))
            }) {
                Ok((st, missing)) => {
                    self.state = st;
                    self.missing = missing;
                    if moved {
                        self.l4_addrs = l4_addrs.clone();
                        eprintln!("sikker l4: maps follow the new placement's L4 addresses");
                    } else {
                        eprintln!("sikker l4: maps follow the new policy");
                    }
                }
                Err(e) => eprintln!("sikker l4: the new policy is not installed: {e:#}"),
            }
        }
        if let Err(e) = self.rescan_due() {
            eprintln!("sikker l4: {e:#}");
        }
    }

    /// Once a second: maps cgroups that appeared since (see [`rescan`]).
    fn rescan_due(&mut self) -> anyhow::Result<()> {
        if Instant::now() >= self.next_scan {
            self.next_scan = Instant::now() + Duration::from_secs(1);
            self.missing = rescan(&self.state, &mut self.l4, &self.missing)?;
        }
        Ok(())
    }

    /// The counters as JSON (`last`: the final report).
    fn json(&self, elapsed: Duration, last: bool) -> anyhow::Result<serde_json::Value> {
        Ok(self
            .state
            .json(&self.l4.counters()?, &self.host, elapsed, last))
    }
}
