//! `sidecore exec --on NODE`: the client's side of a Metachory session
//! (`sidecore_metachory::remote::session::run`): finds the node (and relays),
//! projects the working directory (or `--project` directories), and exits
//! as the guest did.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use sidecore_metachory::remote::client::{RemoteOptions, Verdict};
use sidecore_metachory::remote::session;

use crate::exec_cmd::ExecArgs;

/// Exit status when the remote run itself failed (not the guest).
const RUN_FAILED: u8 = 125;

fn session_number() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        b = (u64::from(std::process::id()) << 20 ^ 0x9e37_79b9).to_le_bytes();
    }
    u64::from_le_bytes(b).max(1)
}

pub fn run(args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let node = args.on.clone().unwrap_or_default();
    let resolve = args.pe.node_resolver("exec --on")?;
    let mut hops: Vec<String> = args
        .via
        .iter()
        .map(|v| resolve(v))
        .collect::<anyhow::Result<_>>()?;
    hops.push(resolve(&node)?);
    let addr = hops.remove(0);
    let cwd = std::env::current_dir().context("exec: the working directory")?;
    let project: Vec<PathBuf> = if args.project.is_empty() {
        vec![cwd.clone()]
    } else {
        args.project
            .iter()
            .map(|p| {
                std::fs::canonicalize(p).with_context(|| format!("exec: --project {}", p.display()))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let verdict = match (args.apply, args.diff, args.discard) {
        (true, _, _) => Verdict::Apply,
        (_, true, _) => Verdict::Diff,
        (_, _, true) => Verdict::Discard,
        _ => Verdict::Ask,
    };
    let opts = RemoteOptions {
        addr,
        node: node.clone(),
        argv: args
            .cmd
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        env: std::env::vars().collect(),
        cwd,
        project,
        session: args.session.unwrap_or_else(session_number),
        userns: args.userns,
        ptrace: args.ptrace,
        route: hops,
        verdict,
        cpu: args.cpu,
    };
    let o = match session::run(&opts) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sidecore exec: {e}");
            return Ok(ExitCode::from(RUN_FAILED));
        }
    };
    if !args.quiet {
        eprintln!(
            "sidecore exec: node={node} session={} projection={} exit={} {} overlay={}{}",
            opts.session,
            o.projection,
            o.code,
            o.summary,
            o.changes,
            if o.applied { " applied" } else { "" }
        );
    }
    if o.signal > 0 {
        reraise(o.signal);
    }
    Ok(ExitCode::from(u8::try_from(o.code).unwrap_or(u8::MAX)))
}

/// Dies of the guest's signal, as a local run would have (for the shell's
/// `$?` and its own reaction to SIGINT); core dumps are not repeated.
fn reraise(sig: i32) {
    if [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGKILL,
        libc::SIGPIPE,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
    ]
    .contains(&sig)
    {
        // SAFETY: restoring the default action and raising the signal.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// The daemon's handler for Metachory sessions: guests' work directories
/// under `$SIDECORE_MX_DIR` (or the temporary directory), the container
/// started from this very binary; relays for sessions with a route.
pub fn handler(name: &str) -> anyhow::Result<sidecore_control::node::MxHandler> {
    let state_dir = std::env::var_os("SIDECORE_MX_DIR")
        .map_or_else(|| std::env::temp_dir().join("sidecore-mx"), PathBuf::from);
    // The child of a fork execs its parent's binary, even if it was replaced.
    let exe = PathBuf::from("/proc/self/exe");
    let opts = sidecore_metachory::remote::server::ServerOptions { state_dir, exe };
    let me = name.to_string();
    Ok(std::sync::Arc::new(move |link, open, stop| {
        if open.route.is_empty() {
            sidecore_metachory::remote::server::serve(link, open, &opts, stop);
        } else if let Err(e) = sidecore_metachory::remote::relay::relay(link, open, &me) {
            let _ = link.send(&sidecore_wire::Message::Error {
                error: e.to_string(),
            });
        }
    }))
}
