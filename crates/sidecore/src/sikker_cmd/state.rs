//! The agent's NOS state (issue 15): where its policy and its placement are
//! kept — files on this node (the one-node store), or two keys in etcd that
//! every node's agent watches — how their first versions are waited for, how
//! each change is applied or refused (the last good one stays in force), and
//! `put-policy` / `put-placement`, which check a document and store it.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sidecore_sikker_agent::AgentCore;
use sidecore_sikker_agent::store::{
    self, PLACEMENT, PlacementUpdate, PolicyUpdate, Source, Text, Update,
};
use sidecore_sikker_policy::{Placement, Policy, parse_placement, parse_policy};

/// Where an agent's policy and placement are kept when not in files of its own: etcd.
#[derive(Args, Debug)]
pub(super) struct StoreArgs {
    /// etcd client URLs, comma-separated (`http://127.0.0.1:2379`): the
    /// policy and the placement are read from etcd and every change applied
    /// live. Without it, the `--policy` and `--placement` files are the
    /// store (one node), watched the same way.
    #[arg(long, value_delimiter = ',', required = false)]
    pub(super) etcd: Vec<String>,
    /// The etcd key holding the policy.
    #[arg(long = "etcd-key", visible_alias = "key", default_value = store::DEFAULT_ETCD_KEY)]
    pub(super) etcd_key: String,
    /// The etcd key holding the placement.
    #[arg(long = "etcd-placement-key", default_value = store::DEFAULT_ETCD_PLACEMENT_KEY)]
    pub(super) etcd_placement_key: String,
    /// For `https://` endpoints: the authority (PEM) that signs etcd's
    /// server certificate (`sidecore sikker certs --host ETCD_IP`).
    #[arg(long, value_name = "FILE")]
    pub(super) etcd_ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for an etcd that demands one
    /// (`--client-cert-auth`).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_key_file"])]
    pub(super) etcd_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--etcd-cert`.
    #[arg(long = "etcd-key-file", value_name = "FILE", requires = "etcd_cert")]
    pub(super) etcd_key_file: Option<std::path::PathBuf>,
    /// The etcd user to act as, for an etcd with authentication on.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    pub(super) etcd_user: Option<String>,
    /// A file whose first line is `--etcd-user`'s password (never given on
    /// the command line, where `ps` shows it).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub(super) etcd_password_file: Option<std::path::PathBuf>,
}

impl StoreArgs {
    /// How to reach the `--etcd` endpoints: TLS when they are `https://`
    /// (which then needs `--etcd-ca`), plain HTTP otherwise.
    pub(super) fn tls(&self) -> anyhow::Result<Option<store::EtcdTls>> {
        let https = self
            .etcd
            .iter()
            .filter(|e| e.trim().starts_with("https://"))
            .count();
        anyhow::ensure!(
            https == 0 || https == self.etcd.len(),
            "--etcd: mixes https:// and plain endpoints ({})",
            self.etcd.join(",")
        );
        match (&self.etcd_ca, https > 0) {
            (None, false) => Ok(None),
            (None, true) => anyhow::bail!(
                "--etcd {}: https:// needs --etcd-ca FILE, the authority that signs etcd's certificate",
                self.etcd.join(",")
            ),
            (Some(_), false) => anyhow::bail!(
                "--etcd-ca is for https:// endpoints; --etcd {} are plain",
                self.etcd.join(",")
            ),
            (Some(ca), true) => {
                let client = self.etcd_cert.as_deref().zip(self.etcd_key_file.as_deref());
                Ok(Some(store::EtcdTls::load(ca, client)?))
            }
        }
    }

    /// How to reach the `--etcd` endpoints: TLS and the user.
    pub(super) fn access(&self) -> anyhow::Result<store::EtcdAccess> {
        let auth = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(u), Some(f)) => Some(store::EtcdAuth::from_file(u, f)?),
            _ => None,
        };
        Ok(store::EtcdAccess {
            tls: self.tls()?,
            auth,
        })
    }

    /// The source of the document at `key`, or `file` without etcd.
    fn source(&self, key: &str, file: Option<&Path>, flag: &str) -> anyhow::Result<Source> {
        Ok(if self.etcd.is_empty() {
            let file =
                file.with_context(|| format!("{flag} FILE or --etcd ENDPOINTS is needed"))?;
            Source::File(file.to_path_buf())
        } else {
            Source::Etcd {
                endpoints: self.etcd.clone(),
                key: key.to_string(),
                access: self.access()?,
            }
        })
    }
}

/// Waits for the first document on `rx` that `accept` takes; logs what it
/// does not take. Ends when `stop` is set.
fn first<T, R>(
    rx: &Receiver<Update<T>>,
    stop: &AtomicBool,
    host: &str,
    what: &str,
    mut accept: impl FnMut(&str, T) -> Result<R, String>,
) -> anyhow::Result<R> {
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Update::Doc { source, doc }) => match accept(&source, doc) {
                Ok(r) => {
                    eprintln!("sikker agent for host {host}: {what} from {source}");
                    return Ok(r);
                }
                Err(errors) => {
                    eprintln!("sikker agent for host {host}: still waiting: {errors}");
                }
            },
            Ok(Update::Invalid { errors, .. }) => {
                eprintln!("sikker agent for host {host}: still waiting: {errors}");
            }
            Ok(Update::Missing { source }) => {
                eprintln!("sikker agent for host {host}: still waiting: {source} holds no {what}");
            }
            Ok(Update::Unavailable { source, why }) => {
                eprintln!("sikker agent for host {host}: still waiting: {source}: {why}");
            }
            Ok(Update::Restored { .. }) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the {what} watch ended"),
        }
    }
    anyhow::bail!("stopped before a {what} arrived")
}

/// The policy to start with, and the channel its changes come on. With
/// `--etcd` and no `--policy`, waits for etcd's first policy that parses.
pub(super) fn watch_policy(
    file: Option<&Path>,
    st: &StoreArgs,
    host: &str,
    stop: &AtomicBool,
) -> anyhow::Result<(Policy, Receiver<PolicyUpdate>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let source = st.source(&st.etcd_key, file, "--policy")?;
    if let Some(f) = file {
        // Errors drawn under their lines, before anything starts.
        let p = crate::policy::load_policy(f)?;
        if let Source::Etcd { .. } = source {
            eprintln!(
                "sikker agent for host {host}: starting with the policy from {}; the one at {source} replaces it when read",
                f.display()
            );
        } else {
            eprintln!("sikker agent for host {host}: policy from {source}, watched for changes");
        }
        store::watch(source, tx);
        return Ok((p, rx));
    }
    eprintln!("sikker agent for host {host}: waiting for the policy at {source}");
    store::watch(source, tx);
    let p = first(&rx, stop, host, "policy", |_, p| Ok(p))?;
    Ok((p, rx))
}

/// The placement in force, and what came since that could not be applied yet.
pub(super) struct Placed {
    /// The last good placement, and its text.
    last: Placement,
    last_text: String,
    /// A text refused because it did not parse against the policy in force:
    /// tried again when the policy changes (it may name a service the next
    /// policy defines).
    pending: Option<(String, Text)>,
    /// A policy refused against the placement in force (it drops a service
    /// that placement still places): tried again with the next placement,
    /// alone or together with it.
    pending_policy: Option<(String, Policy)>,
    /// The file the agent started with, when etcd holds the placement.
    file: Option<String>,
    pub(super) rx: Receiver<PlacementUpdate>,
}

impl Placed {
    /// The placement in force.
    pub(super) fn placement(&self) -> &Placement {
        &self.last
    }
}

/// The placement to start with (checked against `policy`) and its watch.
/// With `--etcd` and no `--placement`, waits for etcd's first placement
/// that parses against `policy`.
pub(super) fn watch_placement(
    file: Option<&Path>,
    st: &StoreArgs,
    policy: &Policy,
    host: &str,
    stop: &AtomicBool,
) -> anyhow::Result<Placed> {
    let (tx, rx) = std::sync::mpsc::channel();
    let source = st.source(&st.etcd_placement_key, file, "--placement")?;
    let (last, last_text) = if let Some(f) = file {
        let p = crate::sikker_l4::load_placement(f, policy)?;
        let text = std::fs::read_to_string(f).with_context(|| f.display().to_string())?;
        eprintln!(
            "sikker agent for host {host}: placement from {}, watching {source}",
            f.display()
        );
        store::watch_doc(source, PLACEMENT, tx);
        (p, text)
    } else {
        eprintln!("sikker agent for host {host}: waiting for the placement at {source}");
        store::watch_doc(source, PLACEMENT, tx);
        first(&rx, stop, host, "placement", |source, t: Text| {
            parse_placement(&t.name, &t.text, policy)
                .map(|p| (p, t.text))
                .map_err(|e| format!("the placement at {source} has errors:\n{e}"))
        })?
    };
    Ok(Placed {
        last,
        last_text,
        pending: None,
        pending_policy: None,
        file: file
            .filter(|_| !st.etcd.is_empty())
            .map(|f| f.display().to_string()),
        rx,
    })
}

/// Applies (or refuses, keeping the last good policy) what the policy's
/// store says, logging it; `last` is the policy in force. A placement that
/// waited for a policy is tried again after one is applied, or together with
/// it when neither goes alone; a policy refused against the placement in
/// force waits for the next placement.
pub(super) fn policy_update(
    core: &mut AgentCore,
    u: PolicyUpdate,
    host: &str,
    last: &mut Policy,
    placed: &mut Placed,
) {
    match u {
        // The watch's first text is the one the agent started with.
        Update::Doc { doc, .. } if doc == *last => placed.pending_policy = None,
        Update::Doc {
            source,
            doc: policy,
        } => {
            if together(core, (&source, &policy), host, placed) {
                *last = policy;
                return;
            }
            // A refusal is counted and logged with its reason by the core.
            if let Ok(d) = core.update_policy(policy.clone()) {
                *last = policy;
                placed.pending_policy = None;
                eprintln!(
                    "sikker agent {host}: policy from {source} applied: {} NMU entries set, {} removed, {} rate limits changed",
                    d.entries_set, d.entries_removed, d.rate_limits_changed
                );
                // A placement still refused is not reported again.
                if let Some((source, t)) = placed.pending.take() {
                    if parse_placement(&t.name, &t.text, core.nos().policy()).is_ok() {
                        apply_placement(core, &source, t, host, last, placed);
                    } else {
                        placed.pending = Some((source, t));
                    }
                }
            } else {
                placed.pending_policy = Some((source, policy));
            }
        }
        Update::Invalid { source, errors } => {
            placed.pending_policy = None;
            core.policy_refused(&format!("the policy at {source} has errors:\n{errors}"));
        }
        Update::Missing { source } => {
            placed.pending_policy = None;
            core.policy_refused(&format!(
                "{source}: holds no policy (no such key, or it was deleted)"
            ));
        }
        Update::Unavailable { source, why } => {
            eprintln!("sikker agent {host}: the policy at {source} cannot be read: {why}");
        }
        Update::Restored { source } => {
            eprintln!("sikker agent {host}: the policy at {source} can be read again");
        }
    }
}

/// Installs `policy` with the placement waiting for a policy (one that did
/// not parse against the policy in force), if that placement parses against
/// it: the two halves of one change written as two keys. True if installed.
fn together(
    core: &mut AgentCore,
    (source, policy): (&str, &Policy),
    host: &str,
    placed: &mut Placed,
) -> bool {
    let Some((psource, t)) = placed.pending.take() else {
        return false;
    };
    let Ok(p) = parse_placement(&t.name, &t.text, policy) else {
        placed.pending = Some((psource, t));
        return false;
    };
    // A refusal is counted and logged with its reason by the core.
    match core.update_policy_and_placement(policy.clone(), &p) {
        Ok(d) => {
            eprintln!(
                "sikker agent {host}: policy from {source} and placement from {psource} applied together: {} processes moved, {} peers changed",
                d.moved, d.peers_changed
            );
            placed.last = p;
            placed.last_text = t.text;
            placed.pending_policy = None;
            true
        }
        Err(_) => {
            placed.pending = Some((psource, t));
            false
        }
    }
}

/// Applies (or refuses, keeping the last good placement) what the
/// placement's store says, logging it.
pub(super) fn placement_update(
    core: &mut AgentCore,
    u: PlacementUpdate,
    host: &str,
    last: &mut Policy,
    placed: &mut Placed,
) {
    match u {
        Update::Doc { source, doc } => apply_placement(core, &source, doc, host, last, placed),
        Update::Invalid { source, errors } => {
            placed.pending = None;
            core.placement_refused(&format!("the placement at {source} has errors:\n{errors}"));
        }
        Update::Missing { source } => match &placed.file {
            Some(f) => eprintln!(
                "sikker agent {host}: no placement at {source} yet; the one from {f} stays in force"
            ),
            None => core.placement_refused(&format!(
                "{source}: holds no placement (no such key, or it was deleted)"
            )),
        },
        Update::Unavailable { source, why } => {
            eprintln!("sikker agent {host}: the placement at {source} cannot be read: {why}");
        }
        Update::Restored { source } => {
            eprintln!("sikker agent {host}: the placement at {source} can be read again");
        }
    }
}

/// Parses a placement text against the policy in force and applies it; a
/// policy that waited for a new placement is then tried again, or, when the
/// placement only parses against that waiting policy, the two go together.
fn apply_placement(
    core: &mut AgentCore,
    source: &str,
    t: Text,
    host: &str,
    last: &mut Policy,
    placed: &mut Placed,
) {
    placed.pending = None;
    if t.text == placed.last_text {
        return;
    }
    let p = match parse_placement(&t.name, &t.text, core.nos().policy()) {
        Ok(p) => p,
        Err(e) => {
            placed.pending = Some((source.to_string(), t));
            if let Some((psource, policy)) = placed.pending_policy.take() {
                if together(core, (&psource, &policy), host, placed) {
                    *last = policy;
                    return;
                }
                placed.pending_policy = Some((psource, policy));
            }
            core.placement_refused(&format!("the placement at {source} has errors:\n{e}"));
            return;
        }
    };
    if p == placed.last {
        placed.last_text = t.text;
        return;
    }
    // A refusal is counted and logged with its reason by the core.
    if let Ok(d) = core.update_placement(&p) {
        eprintln!(
            "sikker agent {host}: placement from {source} applied: {} processes moved, {} peers changed",
            d.moved, d.peers_changed
        );
        placed.last = p;
        placed.last_text = t.text;
        // A policy refused against the old placement may fit the new one.
        if let Some((psource, policy)) = placed.pending_policy.take() {
            policy_update(
                core,
                Update::Doc {
                    source: psource,
                    doc: policy,
                },
                host,
                last,
                placed,
            );
        }
    }
}

/// Reads a document file and checks it with `check` (errors drawn under
/// their lines); its text.
fn checked(
    file: &Path,
    check: impl FnOnce(&str, &str) -> Result<(), sidecore_sikker_policy::PolicyErrors>,
) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    if let Err(e) = check(&file.display().to_string(), &text) {
        eprint!("{}", e.rendered());
        anyhow::bail!(
            "{}: {} problem(s) found; not stored",
            file.display(),
            e.0.len()
        );
    }
    Ok(text)
}

/// `sikker put-policy`: checks the policy, then stores its text in etcd.
pub(super) fn put_policy(st: &StoreArgs, file: &Path) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!st.etcd.is_empty(), "--etcd ENDPOINTS is needed");
    let text = checked(file, |name, text| parse_policy(name, text).map(|_| ()))?;
    let rev = store::put(&st.etcd, &st.access()?, &st.etcd_key, &text)?;
    println!(
        "stored {} at etcd key {} (revision {rev})",
        file.display(),
        st.etcd_key
    );
    Ok(ExitCode::SUCCESS)
}

/// `sikker put-placement`: checks the placement against the policy (the
/// `--policy` file, else the one stored in etcd), then stores its text.
pub(super) fn put_placement(
    st: &StoreArgs,
    policy: Option<&Path>,
    file: &Path,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!st.etcd.is_empty(), "--etcd ENDPOINTS is needed");
    let pol = match policy {
        Some(f) => crate::policy::load_policy(f)?,
        None => {
            let name = format!("etcd:{}", st.etcd_key);
            let bytes = store::Etcd::with_access(&st.etcd, &st.access()?)
                .get_value(&st.etcd_key)?
                .with_context(|| {
                    format!("{name} holds no policy to check the placement against (--policy FILE)")
                })?;
            let text = String::from_utf8(bytes).with_context(|| format!("{name}: not UTF-8"))?;
            parse_policy(&name, &text).map_err(|e| {
                anyhow::anyhow!("the policy at {name}, to check the placement against: {e}")
            })?
        }
    };
    let text = checked(file, |name, text| {
        parse_placement(name, text, &pol).map(|_| ())
    })?;
    let rev = store::put(&st.etcd, &st.access()?, &st.etcd_placement_key, &text)?;
    println!(
        "stored {} at etcd key {} (revision {rev})",
        file.display(),
        st.etcd_placement_key
    );
    Ok(ExitCode::SUCCESS)
}
