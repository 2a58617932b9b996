//! `sidecore exec`: run an unmodified program under Metachory's supervisor
//! (issue 16): in a local sandbox, or with `--on NODE` on a peer daemon with
//! this machine's files projected (the write-back overlay approved with
//! `--apply`, `--diff` or `--discard`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use sidecore_metachory::{Error, Policy, SUPERVISION, run};

/// Run PROG with its file opens trapped by seccomp user notification.
#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Project this directory over the guest's `/` (read-only): files that
    /// exist under it are opened from it; others come from the host.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Deny opening this path (and everything under it) with EACCES, in
    /// addition to /etc/shadow, /etc/gshadow and /etc/sudoers.
    #[arg(long, value_name = "PATH")]
    pub deny: Vec<PathBuf>,
    /// Do not print the supervision summary on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run on this peer node (a name in --nodes, or HOST:PORT of its daemon's
    /// node listener) with this machine's files projected.
    #[arg(long, value_name = "NODE")]
    pub on: Option<String>,
    /// The session's number [default: random].
    #[arg(long, value_name = "S", requires = "on")]
    pub session: Option<u64>,
    /// Reach --on through these relays (names or HOST:PORT; repeatable, in order).
    #[arg(long, value_name = "RELAY", requires = "on")]
    pub via: Vec<String>,
    /// Directories to project (at the same paths) [default: the working directory].
    #[arg(long, value_name = "DIR", requires = "on")]
    pub project: Vec<PathBuf>,
    /// Apply the guest's changes to the projected directories at its end.
    #[arg(long, requires = "on", conflicts_with_all = ["diff", "discard"])]
    pub apply: bool,
    /// Show the guest's changes as a diff at its end, and apply nothing.
    #[arg(long, requires = "on", conflicts_with = "discard")]
    pub diff: bool,
    /// Drop the guest's changes at its end.
    #[arg(long, requires = "on")]
    pub discard: bool,
    /// Run the guest in a user namespace (the unprivileged server mode).
    #[arg(long, requires = "on")]
    pub userns: bool,
    /// Supervise with PTRACE_SYSEMU instead of seccomp user notification.
    #[arg(long, requires = "on")]
    pub ptrace: bool,
    /// Run the guest and its supervisor on this CPU of the node: a trapped
    /// call is then a hand-off on one CPU, not two wake-ups across CPUs
    /// (seccomp supervision; the guest gets that one CPU).
    #[arg(long, value_name = "CPU", requires = "on")]
    pub cpu: Option<u32>,
    #[command(flatten)]
    pub pe: crate::args::PeArgs,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<OsString>,
}

pub fn run_exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut policy = Policy::new();
    for d in &args.deny {
        policy = policy.deny(d);
    }
    if let Some(root) = &args.root {
        let root = std::fs::canonicalize(root)
            .with_context(|| format!("exec: --root {}", root.display()))?;
        policy = policy.with_root(root);
    }
    let outcome = match run(&args.cmd, policy) {
        Ok(o) => o,
        // Like a shell: a program that cannot be found exits 127.
        Err(e @ Error::Spawn { .. }) if is_not_found(&e) => {
            eprintln!("sidecore exec: {e}");
            return Ok(ExitCode::from(127));
        }
        Err(e) => return Err(e).context("exec"),
    };
    if !args.quiet {
        eprintln!(
            "sidecore exec: supervision={SUPERVISION} exit={} {}",
            outcome.code, outcome.counters
        );
    }
    Ok(ExitCode::from(
        u8::try_from(outcome.code).unwrap_or(u8::MAX),
    ))
}

fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}
