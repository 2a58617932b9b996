//! The testbed of a total-order run: nodes `n0..n{N-1}` as namespaces, a
//! veth pair between every two of them (all-to-all, as in the seed's switch),
//! and loss injected on every interface's egress. The kernel's netem is tried
//! first; a kernel built without it (`sch_netem`) gets an nftables rule
//! dropping the same share at random (`numgen random mod 1000 < ‰`), which
//! drops whole IP packets on egress just as netem's `loss` does.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;

use sidecore_testbed::topology::{HostSpec, LinkSpec, Topology};
use sidecore_testbed::{Testbed, TestbedError};

/// The UDP port every node listens on.
pub const PORT: u16 = 7400;

/// How loss was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossMethod {
    None,
    Netem,
    Nftables,
}

impl std::fmt::Display for LossMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossMethod::None => "none",
            LossMethod::Netem => "tc netem",
            LossMethod::Nftables => "nftables numgen (no netem in this kernel)",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BedError {
    #[error(transparent)]
    Testbed(#[from] TestbedError),
    #[error("cannot inject {percent}% loss on {iface} in {netns}: {why}")]
    Loss {
        percent: f64,
        netns: String,
        iface: String,
        why: CommandError,
    },
    #[error("a mesh of {0} nodes (between 2 and 8)")]
    Size(usize),
    #[error("loss {0}% (between 0 and 50)")]
    LossRange(f64),
}

/// A running mesh.
#[derive(Debug)]
pub struct Bed {
    pub testbed: Testbed,
    pub loss_percent: f64,
    pub loss: LossMethod,
}

/// Why a command of the loss setup failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// It could not be started, fed or waited for.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// It ran and failed: its stderr.
    #[error("{0}")]
    Failed(String),
}

/// Runs a command; its stderr on failure.
fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<(), CommandError> {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(CommandError::Io)?;
    if let (Some(text), Some(mut i)) = (stdin, child.stdin.take()) {
        i.write_all(text.as_bytes()).map_err(CommandError::Io)?;
    }
    let out = child.wait_with_output().map_err(CommandError::Io)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CommandError::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

impl Bed {
    /// Builds a mesh of `n` nodes with prefix `prefix` and `loss_percent` loss.
    pub fn up(n: usize, prefix: &str, loss_percent: f64) -> Result<Bed, BedError> {
        if !(2..=8).contains(&n) {
            return Err(BedError::Size(n));
        }
        if !(0.0..=50.0).contains(&loss_percent) {
            return Err(BedError::LossRange(loss_percent));
        }
        let hosts: Vec<HostSpec> = (0..n)
            .map(|i| HostSpec {
                name: format!("n{i}"),
            })
            .collect();
        let mut links = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                links.push(LinkSpec {
                    hosts: [format!("n{i}"), format!("n{j}")],
                });
            }
        }
        let topo = Topology {
            subnet: "10.202.0.0/16".into(),
            hosts,
            links,
        };
        let testbed = Testbed::up(&topo, prefix)?;
        let mut bed = Bed {
            testbed,
            loss_percent,
            loss: LossMethod::None,
        };
        if loss_percent > 0.0
            && let Err(e) = bed.inject_loss()
        {
            let _ = sidecore_testbed::topology::down(prefix);
            return Err(e);
        }
        Ok(bed)
    }

    fn inject_loss(&mut self) -> Result<(), BedError> {
        let pct = format!("{}%", self.loss_percent);
        let mut method = LossMethod::Netem;
        for h in &self.testbed.hosts {
            for i in &h.ifaces {
                let netem = method == LossMethod::Netem
                    && run(
                        Command::new("ip").args([
                            "netns", "exec", &h.netns, "tc", "qdisc", "add", "dev", &i.name,
                            "root", "netem", "loss", &pct,
                        ]),
                        None,
                    )
                    .is_ok();
                if !netem {
                    method = LossMethod::Nftables;
                }
            }
            if method == LossMethod::Nftables {
                let permille = (self.loss_percent * 10.0).round() as u32;
                let rules = format!(
                    "table inet sidecore_loss {{\n chain out {{\n  type filter hook postrouting priority 0; policy accept;\n  oifname != \"lo\" numgen random mod 1000 < {permille} drop\n }}\n}}\n"
                );
                run(
                    Command::new("ip").args(["netns", "exec", &h.netns, "nft", "-f", "-"]),
                    Some(&rules),
                )
                .map_err(|why| BedError::Loss {
                    percent: self.loss_percent,
                    netns: h.netns.clone(),
                    iface: "every interface".into(),
                    why,
                })?;
            }
        }
        // A host that got netem before another refused it keeps netem; the
        // drop share is the same either way.
        self.loss = method;
        Ok(())
    }

    pub fn nodes(&self) -> usize {
        self.testbed.hosts.len()
    }

    /// Node `i`'s namespace.
    pub fn netns(&self, i: usize) -> &str {
        &self.testbed.hosts[i].netns
    }

    /// The address node `i` sends to node `j` at (`j`'s end of their link).
    pub fn addr(&self, i: usize, j: usize) -> SocketAddr {
        let peer = format!("n{j}");
        let ip = self.testbed.hosts[i]
            .ifaces
            .iter()
            .find(|f| f.peer == peer)
            .map_or(Ipv4Addr::LOCALHOST, |f| f.peer_addr);
        SocketAddr::V4(SocketAddrV4::new(ip, PORT))
    }

    /// Every node's address as node `i` sees it (its own: loopback).
    pub fn peers_of(&self, i: usize) -> Vec<SocketAddr> {
        (0..self.nodes()).map(|j| self.addr(i, j)).collect()
    }

    /// Removes the namespaces.
    pub fn down(self) -> Result<(), BedError> {
        sidecore_testbed::topology::down(&self.testbed.prefix)?;
        Ok(())
    }
}
