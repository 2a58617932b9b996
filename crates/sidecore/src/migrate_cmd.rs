//! `sidecore migrate PID --to NODE`: moves the guest of a running
//! `sidecore exec --on` session to another node, live (issue 16). PID is
//! the `sidecore exec` client's own process ID, as `ps` and `$!` show it on
//! this machine; the client leads the migration (its stdin, stdout, stderr
//! and exit status stay the guest's) and answers when every page is on the
//! target, or why the guest stayed where it was.

use std::process::ExitCode;

use sidecore_metachory::remote::ctl::{self, MigrateRequest};

/// Move a running `sidecore exec --on` guest to another node.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The `sidecore exec` client's process ID (on this machine).
    pub pid: u32,
    /// The node to move the guest to (a name in --nodes, or HOST:PORT of its
    /// daemon's node listener).
    #[arg(long, value_name = "NODE")]
    pub to: String,
    /// Copy anonymous memory after the guest resumes, on demand
    /// (userfaultfd, needs root on the target) instead of before.
    #[arg(long)]
    pub lazy: bool,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub pe: crate::args::PeArgs,
}

pub fn run(args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let req = MigrateRequest {
        to: args.pe.node_resolver("migrate --to")?(&args.to)?,
        node: args.to.clone(),
        lazy: args.lazy,
    };
    let r = ctl::request(args.pid, &req)?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    if let Some(e) = &r.error {
        eprintln!(
            "sidecore migrate: the guest of {} stays where it was: {e}",
            args.pid
        );
        return Ok(ExitCode::from(1));
    }
    if !args.json {
        let mb = |b: u64| b as f64 / f64::from(1 << 20);
        println!(
            "migrated the guest of {} to {}: {} pages before it resumed {:.1} MiB, frozen {:.3} s; resident {:.1} MiB after {:.3} s ({} faults served)",
            args.pid,
            args.to,
            if r.lazy { "lazy," } else { "eager," },
            mb(r.pages_bytes),
            r.freeze_us as f64 / 1e6,
            mb(r.resident_bytes),
            r.total_us as f64 / 1e6,
            r.faults
        );
    }
    Ok(ExitCode::SUCCESS)
}
