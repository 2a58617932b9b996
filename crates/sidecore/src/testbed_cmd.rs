//! `sidecore testbed up|down|status`: network namespaces joined by veth pairs
//! (client — middlebox — server by default, or a TOML topology), the ground
//! the packet offcodes and their tests run on. Every namespace is named
//! `PREFIX-HOST`, so `down` finds and removes all of them (and with them their
//! links, XDP programs and nftables rules).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use sidecore_testbed::{Testbed, Topology, topology};

/// The namespace prefix when none is given.
pub const DEFAULT_PREFIX: &str = "sidecore";

#[derive(Debug, Subcommand)]
pub enum TestbedCommand {
    /// Build the testbed (fails, removing what it made, if any step fails).
    Up {
        /// A TOML topology (hosts and links); default client—middlebox—server.
        #[arg(long)]
        topology: Option<PathBuf>,
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove every namespace of the testbed.
    Down {
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
    },
    /// List the testbed's namespaces and their addresses.
    Status {
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
        /// One JSON object per namespace, with its interfaces and addresses.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: TestbedCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TestbedCommand::Up {
            topology,
            prefix,
            json,
        } => {
            let topo = match &topology {
                Some(p) => Topology::load(p)?,
                None => Topology::default(),
            };
            let tb = Testbed::up(&topo, &prefix)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tb)?);
            } else {
                print_testbed(&tb);
            }
            Ok(ExitCode::SUCCESS)
        }
        TestbedCommand::Down { prefix } => {
            let removed = topology::down(&prefix)?;
            if removed.is_empty() {
                println!("no testbed `{prefix}` was up");
            } else {
                println!("removed {}", removed.join(", "));
            }
            Ok(ExitCode::SUCCESS)
        }
        TestbedCommand::Status { prefix, json } => {
            let names = topology::namespaces(&prefix);
            if json {
                let mut out = Vec::new();
                for n in &names {
                    let addrs = topology::ip(&["-n", n, "-br", "-4", "addr", "show"])?;
                    let ifaces: Vec<serde_json::Value> = addrs
                        .lines()
                        .filter(|l| !l.starts_with("lo "))
                        .map(|l| {
                            let f: Vec<&str> = l.split_whitespace().collect();
                            serde_json::json!({
                                "iface": f.first(), "state": f.get(1), "addrs": f.get(2..),
                            })
                        })
                        .collect();
                    out.push(serde_json::json!({"namespace": n, "ifaces": ifaces}));
                }
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(if names.is_empty() {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                });
            }
            if names.is_empty() {
                println!("no testbed `{prefix}` is up");
                return Ok(ExitCode::FAILURE);
            }
            for n in &names {
                println!("{n}");
                let addrs = topology::ip(&["-n", n, "-br", "-4", "addr", "show"])?;
                for l in addrs.lines().filter(|l| !l.starts_with("lo ")) {
                    println!("  {l}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_testbed(tb: &Testbed) {
    for h in &tb.hosts {
        println!("{} (namespace {})", h.name, h.netns);
        for i in &h.ifaces {
            println!(
                "  {} {}/24 {} → {} {}",
                i.name, i.addr, i.mac, i.peer, i.peer_addr
            );
        }
    }
}
