//! `sidecore sikker`: Sikker's agent on this node and a small client for it.
//! `agent` enforces a policy for the processes placed on one host; `send`,
//! `recv` and `reply` talk through it the way an application linking the
//! client library would (each attested from the kernel, never by name).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use sidecore_sikker_agent::client::Delivery;
use sidecore_sikker_agent::server::Server;
use sidecore_sikker_agent::store::{self, PolicySource, PolicyUpdate};
use sidecore_sikker_agent::{AgentCore, Client, ClientError, Dest, Identity};
use sidecore_sikker_policy::Policy;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

/// `sidecore sikker …`.
#[derive(Args, Debug)]
pub struct SikkerCommand {
    #[command(subcommand)]
    which: Which,
}

#[derive(Subcommand, Debug)]
enum Which {
    /// Run the agent of one host: attest local processes, check every message.
    Agent {
        /// The policy (TOML), watched: a change is applied live, and a policy
        /// with an error is refused (the last good one keeps enforcing). With
        /// --etcd, only the policy to start with, until etcd's is read.
        #[arg(long, required_unless_present = "etcd")]
        policy: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArgs,
        /// The placement (TOML): which processes run on which host.
        #[arg(long)]
        placement: PathBuf,
        /// This host's name in the placement.
        #[arg(long)]
        host: String,
        /// The agent's Unix socket.
        #[arg(long)]
        socket: PathBuf,
        #[command(flatten)]
        net: crate::sikker_net::AgentNetArgs,
    },
    /// Make a cluster authority and a certificate for each host's agent.
    Certs(crate::sikker_net::CertsArgs),
    /// Send messages as fast as the agent admits them, for a while; print the rate.
    Load(crate::sikker_net::LoadArgs),
    /// Receive for a while; print the bytes received per time window.
    Meter(crate::sikker_net::MeterArgs),
    /// L4 mode for plain TCP: eBPF cgroup programs enforce the policy's
    /// permissions and rate limits between services that cannot link the
    /// client library; runs until Ctrl-C, then prints the counters as JSON.
    L4(crate::sikker_l4::L4Args),
    /// Check a policy and store it in etcd, where agents started with
    /// `--etcd` read it and apply it live.
    PutPolicy {
        #[command(flatten)]
        store: StoreArgs,
        /// The policy (TOML).
        file: PathBuf,
    },
    /// Send one message through the agent.
    Send(SendArgs),
    /// Answer with a one-time permission this process received.
    Reply {
        #[arg(long)]
        socket: PathBuf,
        /// The permission's key, as `recv` printed it.
        #[arg(long)]
        otp: u32,
        text: String,
    },
    /// Receive messages for this process and print them, one JSON object per line.
    Recv {
        #[arg(long)]
        socket: PathBuf,
        /// Stop after this many messages (0: until the timeout).
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Give up after this long without a message.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
        /// Answer each message that carries a one-time permission with this text.
        #[arg(long)]
        reply: Option<String>,
    },
}

#[derive(Args, Debug)]
struct SendArgs {
    #[arg(long)]
    socket: PathBuf,
    /// `SERVICE:PROCESS:DOMAIN`.
    #[arg(long)]
    to: Dest,
    /// Give the recipient a one-time permission to answer this `SERVICE:PROCESS:DOMAIN`.
    #[arg(long)]
    otp_for: Option<Dest>,
    /// Claim to be `SERVICE:PROCESS` (refused unless true; for showing that a
    /// source cannot be forged).
    #[arg(long, value_parser = parse_identity)]
    claim: Option<Identity>,
    /// Send on descriptor FD, an attached socket inherited from the parent
    /// (for showing that a passed-along socket lends no identity).
    #[arg(long, hide = true)]
    fd: Option<i32>,
    /// Attach, then hand the socket to a child `sidecore sikker send --fd`
    /// that sends the message (it must be refused).
    #[arg(long, hide = true)]
    hand_to_child: bool,
    /// Attach, then exec PROGRAM (a copy of sidecore) which sends on the
    /// inherited socket (it must be refused: the identity ends with the exec).
    #[arg(long, hide = true)]
    exec_after_attach: Option<PathBuf>,
    /// The message.
    text: String,
}

fn parse_identity(s: &str) -> Result<Identity, String> {
    let (service, process) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not SERVICE:PROCESS"))?;
    Ok(Identity {
        service: service.to_string(),
        process: process
            .parse()
            .map_err(|_| format!("`{process}` is not a process number"))?,
    })
}

/// Runs a `sikker` subcommand. Exit codes: 0 done, 1 denied or refused, 2 bad input.
pub fn run(cmd: SikkerCommand) -> anyhow::Result<ExitCode> {
    let r = match cmd.which {
        Which::Agent {
            policy,
            placement,
            host,
            socket,
            store,
            net,
        } => agent(policy.as_deref(), &store, &placement, &host, &socket, &net),
        Which::PutPolicy { store, file } => put_policy(&store, &file),
        Which::Certs(a) => crate::sikker_net::certs(&a),
        Which::Load(a) => crate::sikker_net::load(&a),
        Which::Meter(a) => crate::sikker_net::meter(&a),
        Which::L4(a) => crate::sikker_l4::run(&a),
        Which::Send(a) => send(&a),
        Which::Reply { socket, otp, text } => reply(&socket, otp, &text),
        Which::Recv {
            socket,
            count,
            timeout_ms,
            reply,
        } => recv(
            &socket,
            count,
            Duration::from_millis(timeout_ms),
            reply.as_deref(),
        ),
    };
    r.or_else(|e| {
        eprintln!("error: {e:#}");
        Ok(ExitCode::from(2))
    })
}

/// How often the agent's loop copies its counters out for `--metrics`.
const METRICS_EVERY: Duration = Duration::from_millis(250);

fn agent(
    policy: Option<&std::path::Path>,
    store: &StoreArgs,
    placement: &std::path::Path,
    host: &str,
    socket: &std::path::Path,
    net: &crate::sikker_net::AgentNetArgs,
) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let (p, updates) = watch_policy(policy, store, host, &stop)?;
    let nos = crate::policy::load_nos(placement, &p)?;
    let core = AgentCore::new(nos, host)?;
    let links = crate::sikker_net::links(net, &core)?;
    let mut server = Server::bind(core, socket)?;
    if let Some(l) = links {
        eprintln!(
            "sikker agent for host {host}: listening for agents on {}",
            l.local_addr()?
        );
        server = server.with_links(l);
    }
    let mut feed = if net.l4 {
        Some(crate::sikker_l4::L4Feed::start(
            &p,
            placement,
            host,
            net.l4_cgroup.as_deref(),
        )?)
    } else {
        None
    };
    let (host_name, mut last) = (host.to_string(), p);
    // What the metrics endpoint shows: the core's counters and SE-TRE rates,
    // copied out of the agent's loop at most every METRICS_EVERY.
    let published = Arc::new(std::sync::Mutex::new((
        Default::default(),
        Default::default(),
    )));
    let shown = Arc::clone(&published);
    let h = host.to_string();
    let _metrics = net.metrics.start(Arc::new(move || {
        let g = shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sidecore_observe::exporters::sikker(&h, &g.0, &g.1)
    }))?;
    let mut copied = std::time::Instant::now();
    server.set_on_turn(move |core| {
        if copied.elapsed() >= METRICS_EVERY {
            copied = std::time::Instant::now();
            *published
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                (core.counters().clone(), core.local_rates());
        }
        while let Ok(u) = updates.try_recv() {
            policy_update(core, u, &host_name, &mut last);
        }
        if let Some(f) = feed.as_mut() {
            f.refresh(
                core.nos().policy(),
                core.nos(),
                core.counters().policy_updates,
            );
        }
    });
    eprintln!(
        "sikker agent for host {host} on {}; Ctrl-C stops it",
        socket.display()
    );
    server.run(&stop)?;
    println!("{}", serde_json::to_string(server.core().counters())?);
    Ok(ExitCode::SUCCESS)
}

/// Prints a refusal or denial and gives its exit code.
fn refused(e: &ClientError) -> ExitCode {
    match e {
        ClientError::Refused(_) | ClientError::Denied(_) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
        _ => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn send(a: &SendArgs) -> anyhow::Result<ExitCode> {
    let mut c = match a.fd {
        // SAFETY: the parent passed this descriptor on purpose (hidden test
        // option); nothing else in this process owns it.
        Some(fd) => unsafe { Client::from_raw_fd(fd) },
        None if a.hand_to_child || a.exec_after_attach.is_some() => {
            match Client::connect_inheritable(&a.socket) {
                Ok(c) => c,
                Err(e) => return Ok(refused(&e)),
            }
        }
        None => match Client::connect(&a.socket) {
            Ok(c) => c,
            Err(e) => return Ok(refused(&e)),
        },
    };
    if a.hand_to_child || a.exec_after_attach.is_some() {
        let program = match &a.exec_after_attach {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("this program's path")?,
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(["sikker", "send", "--socket"])
            .arg(&a.socket)
            .args(["--to", &a.to.to_string(), "--fd", &c.raw_fd().to_string()])
            .arg(&a.text);
        if a.exec_after_attach.is_some() {
            // Replaces this process: same pid, another executable.
            let e = cmd.exec();
            anyhow::bail!("exec: {e}");
        }
        let status = cmd.status().context("start the child")?;
        return Ok(ExitCode::from(
            u8::try_from(status.code().unwrap_or(2)).unwrap_or(2),
        ));
    }
    match c.send_with(
        &a.to,
        a.text.as_bytes(),
        a.otp_for.as_ref(),
        a.claim.as_ref(),
    ) {
        Ok(()) => {
            println!("sent to {}", a.to);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(refused(&e)),
    }
}

fn reply(socket: &std::path::Path, otp: u32, text: &str) -> anyhow::Result<ExitCode> {
    let r = Client::connect(socket).and_then(|mut c| c.reply(otp, text.as_bytes()));
    Ok(match r {
        Ok(()) => {
            println!("answered with one-time permission {otp}");
            ExitCode::SUCCESS
        }
        Err(e) => refused(&e),
    })
}

fn print(d: &Delivery) -> anyhow::Result<()> {
    let v = serde_json::json!({
        "from": d.from.to_string(),
        "domain": d.domain,
        "text": String::from_utf8_lossy(&d.payload),
        "otp": d.otp,
        "requester": d.requester.as_ref().map(ToString::to_string),
    });
    println!("{v}");
    Ok(())
}

fn recv(
    socket: &std::path::Path,
    count: usize,
    timeout: Duration,
    reply: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let mut c = match Client::connect(socket) {
        Ok(c) => c,
        Err(e) => return Ok(refused(&e)),
    };
    if let Err(e) = c.listen() {
        return Ok(refused(&e));
    }
    eprintln!(
        "listening as {}",
        c.identity().map(ToString::to_string).unwrap_or_default()
    );
    let mut got = 0;
    while count == 0 || got < count {
        let Some(d) = c.recv(timeout)? else {
            break;
        };
        print(&d)?;
        got += 1;
        if let (Some(text), Some(otp)) = (reply, d.otp)
            && let Err(e) = c.reply(otp, text.as_bytes())
        {
            eprintln!("reply: {e}");
        }
    }
    Ok(if count == 0 || got >= count {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Where an agent's policy is kept when not in a file of its own: etcd.
#[derive(Args, Debug)]
struct StoreArgs {
    /// etcd client URLs, comma-separated (`http://127.0.0.1:2379`): the
    /// policy is read from etcd and every change applied live. Without it,
    /// the `--policy` file is the store (one node).
    #[arg(long, value_delimiter = ',', required = false)]
    etcd: Vec<String>,
    /// The etcd key holding the policy.
    #[arg(long = "etcd-key", visible_alias = "key", default_value = store::DEFAULT_ETCD_KEY)]
    etcd_key: String,
}

/// The policy to start with, and the channel its changes come on. With
/// `--etcd` and no `--policy`, waits for etcd's first policy that parses.
fn watch_policy(
    file: Option<&std::path::Path>,
    st: &StoreArgs,
    host: &str,
    stop: &AtomicBool,
) -> anyhow::Result<(Policy, Receiver<PolicyUpdate>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let source = if st.etcd.is_empty() {
        let file = file.context("--policy FILE or --etcd ENDPOINTS is needed")?;
        PolicySource::File(file.to_path_buf())
    } else {
        PolicySource::Etcd {
            endpoints: st.etcd.clone(),
            key: st.etcd_key.clone(),
        }
    };
    if let Some(f) = file {
        // Errors drawn under their lines, before anything starts.
        let p = crate::policy::load_policy(f)?;
        if let PolicySource::Etcd { .. } = source {
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
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(PolicyUpdate::Policy { source, policy }) => {
                eprintln!("sikker agent for host {host}: policy from {source}");
                return Ok((policy, rx));
            }
            Ok(PolicyUpdate::Invalid { errors, .. }) => {
                eprintln!("sikker agent for host {host}: still waiting: {errors}");
            }
            Ok(PolicyUpdate::Unavailable { source, why }) => {
                eprintln!("sikker agent for host {host}: still waiting: {source}: {why}");
            }
            Ok(PolicyUpdate::Restored { .. }) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the policy watch ended"),
        }
    }
    anyhow::bail!("stopped before a policy arrived")
}

/// Applies (or refuses, keeping the last good policy) what the policy's
/// store says, logging it; `last` is the policy in force.
fn policy_update(core: &mut AgentCore, u: PolicyUpdate, host: &str, last: &mut Policy) {
    match u {
        // The watch's first text is the one the agent started with.
        PolicyUpdate::Policy { policy, .. } if policy == *last => {}
        PolicyUpdate::Policy { source, policy } => {
            // A refusal is counted and logged with its reason by the core.
            if let Ok(d) = core.update_policy(policy.clone()) {
                *last = policy;
                eprintln!(
                    "sikker agent {host}: policy from {source} applied: {} NMU entries set, {} removed, {} rate limits changed",
                    d.entries_set, d.entries_removed, d.rate_limits_changed
                );
            }
        }
        PolicyUpdate::Invalid { source, errors } => {
            core.policy_refused(&format!("the policy at {source} has errors:\n{errors}"));
        }
        PolicyUpdate::Unavailable { source, why } => {
            eprintln!("sikker agent {host}: the policy at {source} cannot be read: {why}");
        }
        PolicyUpdate::Restored { source } => {
            eprintln!("sikker agent {host}: the policy at {source} can be read again");
        }
    }
}

/// `sikker put-policy`: checks the policy, then stores its text in etcd.
fn put_policy(st: &StoreArgs, file: &std::path::Path) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!st.etcd.is_empty(), "--etcd ENDPOINTS is needed");
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    if let Err(e) = sidecore_sikker_policy::parse_policy(&file.display().to_string(), &text) {
        eprint!("{}", e.rendered());
        anyhow::bail!(
            "{}: {} problem(s) found; not stored",
            file.display(),
            e.0.len()
        );
    }
    let rev = store::put(&st.etcd, &st.etcd_key, &text)?;
    println!(
        "stored {} at etcd key {} (revision {rev})",
        file.display(),
        st.etcd_key
    );
    Ok(ExitCode::SUCCESS)
}
