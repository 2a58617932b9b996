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
        /// The policy (TOML).
        #[arg(long)]
        policy: PathBuf,
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
            net,
        } => agent(&policy, &placement, &host, &socket, &net),
        Which::Certs(a) => crate::sikker_net::certs(&a),
        Which::Load(a) => crate::sikker_net::load(&a),
        Which::Meter(a) => crate::sikker_net::meter(&a),
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

fn agent(
    policy: &std::path::Path,
    placement: &std::path::Path,
    host: &str,
    socket: &std::path::Path,
    net: &crate::sikker_net::AgentNetArgs,
) -> anyhow::Result<ExitCode> {
    let p = crate::policy::load_policy(policy)?;
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
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
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
