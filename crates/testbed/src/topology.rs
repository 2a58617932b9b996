//! Testbeds: hosts as network namespaces joined by veth pairs, with addresses
//! from a private range, routes along the shortest path, static neighbour
//! entries, and forwarding on every host with more than one link.
//!
//! The default is HYDRA's evaluation setup: `client — middlebox — server`. A
//! TOML file can give any other:
//!
//! ```toml
//! subnet = "10.201.0.0/16"      # each link gets a /24 of it
//! [[host]]
//! name = "client"
//! [[host]]
//! name = "middlebox"
//! [[host]]
//! name = "server"
//! [[link]]
//! hosts = ["client", "middlebox"]
//! [[link]]
//! hosts = ["middlebox", "server"]
//! ```
//!
//! Namespaces are named `PREFIX-HOST` and an interface `to-PEER`. Everything is
//! made with iproute2's `ip` (the tool every Linux has and every reader knows;
//! a netlink crate would add an async runtime for a handful of calls). If any
//! step fails, what was made is removed before the error returns; removing a
//! namespace removes its links, addresses, routes, XDP programs and
//! nftables tables with it.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The default namespace prefix.
pub const DEFAULT_PREFIX: &str = "sidecore";
/// The default address range: each link gets a /24 of it.
pub const DEFAULT_SUBNET: &str = "10.201.0.0/16";
/// Longest host name (interface names are `to-HOST`, at most 15 bytes).
pub const MAX_HOST_NAME: usize = 12;
/// Most links a testbed may have (one /24 each from a /16).
pub const MAX_LINKS: usize = 256;

/// A host of a topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub name: String,
}

/// A link between two hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub hosts: [String; 2],
}

/// A topology: hosts, links, and the address range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    #[serde(default = "default_subnet")]
    pub subnet: String,
    #[serde(rename = "host")]
    pub hosts: Vec<HostSpec>,
    #[serde(rename = "link")]
    pub links: Vec<LinkSpec>,
}

fn default_subnet() -> String {
    DEFAULT_SUBNET.to_string()
}

/// What is wrong with a topology's contents (numbers are 1-based positions in
/// the file's lists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyProblem {
    #[error("subnet `{0}` is not an IPv4 /16 (or larger) range such as {DEFAULT_SUBNET}")]
    Subnet(String),
    #[error(
        "host #{host} has an invalid name `{name}` (1 to {MAX_HOST_NAME} letters, digits or `-`)"
    )]
    HostName { host: usize, name: String },
    #[error("host `{0}` is listed twice")]
    HostTwice(String),
    #[error("{0} links (at most {MAX_LINKS})")]
    TooManyLinks(usize),
    #[error("link #{link} names unknown host `{host}`")]
    UnknownHost { link: usize, host: String },
    #[error("link #{link} joins `{host}` to itself")]
    SelfLink { link: usize, host: String },
    #[error("`{0}` and `{1}` are linked twice")]
    LinkedTwice(String, String),
}

/// What is wrong with a topology or its testbed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error("cannot read topology {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {problem}")]
    Invalid {
        path: String,
        problem: TopologyProblem,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("cannot run `ip` (install iproute2): {0}")]
    NoIp(#[source] std::io::Error),
    #[error("a testbed with prefix `{0}` is already up (`sidecore testbed down` removes it)")]
    AlreadyUp(String),
}

impl Default for Topology {
    fn default() -> Self {
        let host = |n: &str| HostSpec { name: n.into() };
        let link = |a: &str, b: &str| LinkSpec {
            hosts: [a.into(), b.into()],
        };
        Topology {
            subnet: default_subnet(),
            hosts: vec![host("client"), host("middlebox"), host("server")],
            links: vec![link("client", "middlebox"), link("middlebox", "server")],
        }
    }
}

impl Topology {
    /// Reads and checks a topology file.
    pub fn load(path: &Path) -> Result<Topology, TestbedError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TestbedError::Read {
            path: p.clone(),
            source,
        })?;
        let t: Topology = toml::from_str(&text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start).min(text.len());
            let before = &text[..at];
            TestbedError::Syntax {
                path: p.clone(),
                line: before.matches('\n').count() + 1,
                column: before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
                message: e.message().trim().to_string(),
            }
        })?;
        t.check()
            .map_err(|problem| TestbedError::Invalid { path: p, problem })?;
        Ok(t)
    }

    /// The base address and length of the subnet.
    fn subnet(&self) -> Result<(u32, u8), TopologyProblem> {
        let bad = || TopologyProblem::Subnet(self.subnet.clone());
        let (a, l) = self.subnet.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
        let len: u8 = l.parse().map_err(|_| bad())?;
        if len > 16 {
            return Err(bad());
        }
        Ok((
            u32::from(addr) & (u32::MAX << (32 - u32::from(len.max(1)))),
            len,
        ))
    }

    /// Checks names, links and the subnet.
    pub fn check(&self) -> Result<(), TopologyProblem> {
        self.subnet()?;
        for (i, h) in self.hosts.iter().enumerate() {
            if h.name.is_empty()
                || h.name.len() > MAX_HOST_NAME
                || !h
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Err(TopologyProblem::HostName {
                    host: i + 1,
                    name: h.name.clone(),
                });
            }
            if self.hosts[..i].iter().any(|o| o.name == h.name) {
                return Err(TopologyProblem::HostTwice(h.name.clone()));
            }
        }
        if self.links.len() > MAX_LINKS {
            return Err(TopologyProblem::TooManyLinks(self.links.len()));
        }
        for (i, l) in self.links.iter().enumerate() {
            for h in &l.hosts {
                if !self.hosts.iter().any(|x| &x.name == h) {
                    return Err(TopologyProblem::UnknownHost {
                        link: i + 1,
                        host: h.clone(),
                    });
                }
            }
            if l.hosts[0] == l.hosts[1] {
                return Err(TopologyProblem::SelfLink {
                    link: i + 1,
                    host: l.hosts[0].clone(),
                });
            }
            if self.links[..i].iter().any(|o| {
                o.hosts == l.hosts || (o.hosts[0] == l.hosts[1] && o.hosts[1] == l.hosts[0])
            }) {
                return Err(TopologyProblem::LinkedTwice(
                    l.hosts[0].clone(),
                    l.hosts[1].clone(),
                ));
            }
        }
        Ok(())
    }
}

/// One interface of a host in a running testbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    /// `to-PEER`.
    pub name: String,
    pub peer: String,
    pub addr: Ipv4Addr,
    pub peer_addr: Ipv4Addr,
    /// The /24 of the link.
    pub subnet: Ipv4Addr,
    pub mac: String,
    pub peer_mac: String,
}

/// One host of a running testbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    pub ifaces: Vec<Iface>,
}

/// A running testbed: what `up` made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Testbed {
    pub prefix: String,
    pub hosts: Vec<Host>,
}

/// Runs `ip` with `args`; the error carries the command and what it said.
pub fn ip(args: &[&str]) -> Result<String, TestbedError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(TestbedError::NoIp)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(TestbedError::Command {
            command: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Writes a sysctl inside a namespace (`/proc/sys` follows the namespace of
/// the process that opens it, so this runs `sh` in it).
fn sysctl(netns: &str, key: &str, value: &str) -> Result<(), TestbedError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    ip(&[
        "netns",
        "exec",
        netns,
        "sh",
        "-c",
        &format!("echo {value} > {path}"),
    ])
    .map(drop)
}

/// The namespaces of testbeds with `prefix` that exist now.
pub fn namespaces(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(crate::netns::NETNS_DIR)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    v.sort();
    v
}

/// Removes every namespace of testbeds with `prefix` (and with them all their
/// links, programs and rules). Returns the names removed.
pub fn down(prefix: &str) -> Result<Vec<String>, TestbedError> {
    let names = namespaces(prefix);
    for n in &names {
        ip(&["netns", "del", n])?;
    }
    Ok(names)
}

impl Testbed {
    /// Builds `topo` with namespace prefix `prefix`. On any error, what was made
    /// is removed and the error returned.
    pub fn up(topo: &Topology, prefix: &str) -> Result<Testbed, TestbedError> {
        topo.check().map_err(|problem| TestbedError::Invalid {
            path: "topology".into(),
            problem,
        })?;
        if !namespaces(prefix).is_empty() {
            return Err(TestbedError::AlreadyUp(prefix.to_string()));
        }
        let built = Self::build(topo, prefix, None);
        if built.is_err() {
            let _ = down(prefix);
        }
        built
    }

    /// [`Testbed::up`] with a fault injected after `links` links are made, to
    /// test that a failure part-way leaves nothing behind.
    #[doc(hidden)]
    pub fn up_failing_after(
        topo: &Topology,
        prefix: &str,
        links: usize,
    ) -> Result<Testbed, TestbedError> {
        let built = Self::build(topo, prefix, Some(links));
        if built.is_err() {
            let _ = down(prefix);
        }
        built
    }

    fn build(
        topo: &Topology,
        prefix: &str,
        fail_after: Option<usize>,
    ) -> Result<Testbed, TestbedError> {
        let (base, _) = topo.subnet().map_err(|problem| TestbedError::Invalid {
            path: "topology".into(),
            problem,
        })?;
        let mut tb = Testbed {
            prefix: prefix.to_string(),
            hosts: topo
                .hosts
                .iter()
                .map(|h| Host {
                    name: h.name.clone(),
                    netns: format!("{prefix}-{}", h.name),
                    ifaces: Vec::new(),
                })
                .collect(),
        };
        for h in &tb.hosts {
            ip(&["netns", "add", &h.netns])?;
            ip(&["-n", &h.netns, "link", "set", "lo", "up"])?;
        }
        for (i, l) in topo.links.iter().enumerate() {
            if fail_after == Some(i) {
                return Err(TestbedError::Command {
                    command: "(injected fault)".into(),
                    stderr: format!("failing after {i} links"),
                });
            }
            let link = u32::try_from(i).expect("MAX_LINKS fits in 32 bits");
            tb.link(&l.hosts[0], &l.hosts[1], base + (link << 8))?;
        }
        tb.neighbours()?;
        tb.routes()?;
        for h in tb.hosts.iter().filter(|h| h.ifaces.len() > 1) {
            sysctl(&h.netns, "net.ipv4.ip_forward", "1")?;
        }
        for h in &tb.hosts {
            // Test traffic may carry any source address of the testbed.
            sysctl(&h.netns, "net.ipv4.conf.all.rp_filter", "0")?;
            sysctl(&h.netns, "net.ipv4.conf.default.rp_filter", "0")?;
        }
        Ok(tb)
    }

    fn host_mut(&mut self, name: &str) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.name == name)
            .expect("checked topology names only its own hosts")
    }

    /// A veth pair between `a` and `b`, addresses `.1` and `.2` of `net`/24.
    fn link(&mut self, a: &str, b: &str, net: u32) -> Result<(), TestbedError> {
        let (na, nb) = (
            format!("{}-{a}", self.prefix),
            format!("{}-{b}", self.prefix),
        );
        let (ia, ib) = (format!("to-{b}"), format!("to-{a}"));
        ip(&[
            "link", "add", &ia, "netns", &na, "type", "veth", "peer", "name", &ib, "netns", &nb,
        ])?;
        let (aa, ab) = (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2));
        for (ns, dev, addr) in [(&na, &ia, aa), (&nb, &ib, ab)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        let (ma, mb) = (mac(&na, &ia)?, mac(&nb, &ib)?);
        let subnet = Ipv4Addr::from(net);
        self.host_mut(a).ifaces.push(Iface {
            name: ia,
            peer: b.to_string(),
            addr: aa,
            peer_addr: ab,
            subnet,
            mac: ma.clone(),
            peer_mac: mb.clone(),
        });
        self.host_mut(b).ifaces.push(Iface {
            name: ib,
            peer: a.to_string(),
            addr: ab,
            peer_addr: aa,
            subnet,
            mac: mb,
            peer_mac: ma,
        });
        Ok(())
    }

    /// Static neighbour entries for every link: no ARP during measurements.
    fn neighbours(&self) -> Result<(), TestbedError> {
        for h in &self.hosts {
            for i in &h.ifaces {
                let peer = i.peer_addr.to_string();
                ip(&[
                    "-n",
                    &h.netns,
                    "neigh",
                    "replace",
                    &peer,
                    "lladdr",
                    &i.peer_mac,
                    "dev",
                    &i.name,
                    "nud",
                    "permanent",
                ])?;
            }
        }
        Ok(())
    }

    /// A route to every link's subnet along the shortest path.
    fn routes(&self) -> Result<(), TestbedError> {
        for h in &self.hosts {
            for (subnet, (via, dev)) in self.next_hops(&h.name) {
                ip(&[
                    "-n",
                    &h.netns,
                    "route",
                    "replace",
                    &format!("{subnet}/24"),
                    "via",
                    &via.to_string(),
                    "dev",
                    &dev,
                ])?;
            }
        }
        Ok(())
    }

    /// From host `from`: each subnet not directly attached → (next hop, device).
    fn next_hops(&self, from: &str) -> BTreeMap<Ipv4Addr, (Ipv4Addr, String)> {
        let host = |n: &str| self.hosts.iter().find(|h| h.name == n);
        let mut first: BTreeMap<String, (Ipv4Addr, String)> = BTreeMap::new();
        let mut queue = VecDeque::new();
        if let Some(h) = host(from) {
            for i in &h.ifaces {
                first.insert(i.peer.clone(), (i.peer_addr, i.name.clone()));
                queue.push_back(i.peer.clone());
            }
        }
        // Breadth first: each host reached inherits the first hop that reached it.
        while let Some(n) = queue.pop_front() {
            let hop = first[&n].clone();
            for i in host(&n).map(|h| h.ifaces.as_slice()).unwrap_or(&[]) {
                if i.peer != from && !first.contains_key(&i.peer) {
                    first.insert(i.peer.clone(), hop.clone());
                    queue.push_back(i.peer.clone());
                }
            }
        }
        let direct: Vec<Ipv4Addr> = host(from)
            .map(|h| h.ifaces.iter().map(|i| i.subnet).collect())
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        for (n, hop) in &first {
            for i in host(n).map(|h| h.ifaces.as_slice()).unwrap_or(&[]) {
                if !direct.contains(&i.subnet) {
                    out.entry(i.subnet).or_insert_with(|| hop.clone());
                }
            }
        }
        out
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// `name`'s interface towards `peer`.
    pub fn iface(&self, name: &str, peer: &str) -> Option<&Iface> {
        self.host(name)?.ifaces.iter().find(|i| i.peer == peer)
    }

    /// Removes the testbed.
    pub fn down(&self) -> Result<Vec<String>, TestbedError> {
        down(&self.prefix)
    }
}

/// The MAC address of `dev` in namespace `netns`.
fn mac(netns: &str, dev: &str) -> Result<String, TestbedError> {
    let out = ip(&["-n", netns, "-o", "link", "show", "dev", dev])?;
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| TestbedError::Command {
            command: format!("ip -n {netns} -o link show dev {dev}"),
            stderr: format!("no link/ether address in: {out}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topologies_are_checked_with_reasons() {
        Topology::default().check().unwrap();
        let mut t = Topology::default();
        t.hosts.push(HostSpec {
            name: "a-very-long-host".into(),
        });
        assert!(
            t.check()
                .unwrap_err()
                .to_string()
                .contains("invalid name `a-very-long-host`")
        );
        let mut t = Topology::default();
        t.links[1].hosts[1] = "nowhere".into();
        assert!(
            t.check()
                .unwrap_err()
                .to_string()
                .contains("unknown host `nowhere`")
        );
        let mut t = Topology::default();
        t.links.push(LinkSpec {
            hosts: ["server".into(), "middlebox".into()],
        });
        assert!(t.check().unwrap_err().to_string().contains("linked twice"));
        let t = Topology {
            subnet: "10.1.2.0/24".into(),
            ..Topology::default()
        };
        assert!(
            t.check()
                .unwrap_err()
                .to_string()
                .contains("is not an IPv4 /16")
        );
        assert_eq!(
            t.check().unwrap_err().to_string(),
            "subnet `10.1.2.0/24` is not an IPv4 /16 (or larger) range such as 10.201.0.0/16"
        );
    }

    #[test]
    fn files_are_read_with_located_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.toml");
        std::fs::write(&p, "[[host]]\nname = \"a\"\nrole = \"x\"\n").unwrap();
        let e = Topology::load(&p).unwrap_err().to_string();
        assert!(e.contains("t.toml:3:1: unknown field `role`"), "{e}");
        std::fs::write(
            &p,
            "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\nhosts = [\"a\", \"c\"]\n",
        )
        .unwrap();
        let e = Topology::load(&p).unwrap_err().to_string();
        assert!(e.ends_with("t.toml: link #1 names unknown host `c`"), "{e}");
    }
}
