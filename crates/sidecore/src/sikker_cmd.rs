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
use sidecore_sikker_agent::{AgentCore, Client, ClientError, Dest, Identity};
use sidecore_sikker_policy::Nos;

mod state;
use state::StoreArgs;

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
        /// The placement (TOML): which processes run on which host, and where
        /// each host's agent listens (`agent = "IP:PORT"`). Watched like the
        /// policy; with --etcd, only the placement to start with, until
        /// etcd's is read.
        #[arg(long, required_unless_present = "etcd")]
        placement: Option<PathBuf>,
        /// This host's name in the placement.
        #[arg(long)]
        host: String,
        /// The agent's Unix socket.
        #[arg(long)]
        socket: PathBuf,
        /// Run on this CPU as a core of its own: the agent's loop is pinned
        /// there and busy-polls, so no message waits for the agent to wake up
        /// (the core is then always busy).
        #[arg(long, value_name = "CPU")]
        core: Option<u32>,
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
    /// Check a placement (against the `--policy` file, else the policy in
    /// etcd) and store it in etcd, where agents started with `--etcd` read it
    /// and apply it live.
    PutPlacement {
        #[command(flatten)]
        store: StoreArgs,
        /// Check against this policy instead of the one in etcd.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// The placement (TOML).
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
            core,
            store,
            net,
        } => agent(
            policy.as_deref(),
            &store,
            placement.as_deref(),
            &host,
            (&socket, core),
            &net,
        ),
        Which::PutPolicy { store, file } => state::put_policy(&store, &file),
        Which::PutPlacement {
            store,
            policy,
            file,
        } => state::put_placement(&store, policy.as_deref(), &file),
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

/// Refuses a `--core` this process may not run on, naming those it may.
fn usable_cpu(c: u32) -> anyhow::Result<()> {
    sidecore_pe::cores::usable_cpu(c).map_err(|usable| {
        let usable: Vec<String> = usable.iter().map(u32::to_string).collect();
        anyhow::anyhow!(
            "--core {c}: this process may not run on CPU {c} (it may use CPUs {})",
            usable.join(", ")
        )
    })
}

/// How often the agent's loop copies its counters out for `--metrics`.
const METRICS_EVERY: Duration = Duration::from_millis(250);

fn agent(
    policy: Option<&std::path::Path>,
    store: &StoreArgs,
    placement: Option<&std::path::Path>,
    host: &str,
    (socket, cpu): (&std::path::Path, Option<u32>),
    net: &crate::sikker_net::AgentNetArgs,
) -> anyhow::Result<ExitCode> {
    // Checked before anything starts; pinned only once the helper threads
    // (watches, metrics) are spawned, so they stay off the agent's core.
    if let Some(c) = cpu {
        usable_cpu(c)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let (p, updates) = state::watch_policy(policy, store, host, &stop)?;
    let mut placed = state::watch_placement(placement, store, &p, host, &stop)?;
    let nos = Nos::compile(p.clone(), placed.placement())
        .map_err(|e| anyhow::anyhow!("the placement: {e}"))?;
    let mut core = AgentCore::new(nos, host)?;
    core.set_agents(placed.placement().agents.clone());
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
        let source = placement.map_or_else(|| "etcd".to_string(), |f| f.display().to_string());
        Some(crate::sikker_l4::L4Feed::start_with(
            &p,
            placed.placement(),
            &source,
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
            state::policy_update(core, u, &host_name, &mut last, &mut placed);
        }
        while let Ok(u) = placed.rx.try_recv() {
            state::placement_update(core, u, &host_name, &mut last, &mut placed);
        }
        if let Some(f) = feed.as_mut() {
            let c = core.counters();
            f.refresh(
                core.nos().policy(),
                core.nos(),
                c.policy_updates + c.placement_updates,
                &placed.placement().l4,
            );
        }
    });
    if let Some(c) = cpu {
        sidecore_pe::cores::pin_current_thread(c)
            .with_context(|| format!("--core {c}: pinning the agent to CPU {c}"))?;
        server.set_busy_poll(true);
        eprintln!("sikker agent for host {host}: busy-polling on CPU {c}");
    }
    let on = socket.display();
    eprintln!("sikker agent for host {host} on {on}; Ctrl-C stops it");
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
