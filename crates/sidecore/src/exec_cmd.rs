//! `sidecore exec`: run an unmodified program under Metachory's supervisor
//! (issue 16). This slice runs it in a local sandbox only (no `--on NODE`).

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
