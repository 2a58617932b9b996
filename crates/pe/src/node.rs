//! Peer nodes as PEs: the configured peers (a TOML file of `[[node]]` tables)
//! and the hello exchange that tells whether a peer daemon is reachable and
//! what it offers.
//!
//! The exchange is one JSON line each way on the peer's node port:
//! `{"op":"hello","version":1}` answered by a [`NodeInfo`]. A
//! `{"op":"deploy",..}` line instead carries a [`RemotePart`]: the part of an
//! origin's app that the layout put on this peer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_types::{ChannelProps, Priority};

/// Version of the node protocol (the hello).
pub const NODE_PROTOCOL: u32 = 1;

/// A configured peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    /// `host:port` of the peer's node listener.
    pub addr: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodesFile {
    #[serde(default)]
    node: Vec<NodeConfig>,
}

/// Reads a nodes file; errors name the file, line and column.
pub fn load_nodes(path: &Path) -> Result<Vec<NodeConfig>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read nodes file {}: {e}", path.display()))?;
    parse_nodes(&path.display().to_string(), &text)
}

/// Parses nodes-file text (`name` is used in messages).
pub fn parse_nodes(name: &str, text: &str) -> Result<Vec<NodeConfig>, String> {
    let f: NodesFile = toml::from_str(text).map_err(|e| {
        let (line, col) = e
            .span()
            .map(|s| {
                let before = &text[..s.start.min(text.len())];
                (
                    before.matches('\n').count() + 1,
                    before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
                )
            })
            .unwrap_or((0, 0));
        format!("{name}:{line}:{col}: {}", e.message().trim())
    })?;
    for (i, n) in f.node.iter().enumerate() {
        if n.name.is_empty()
            || !n
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "{name}: node #{} has an invalid name `{}`",
                i + 1,
                n.name
            ));
        }
        if f.node[..i].iter().any(|m| m.name == n.name) {
            return Err(format!("{name}: node `{}` is listed twice", n.name));
        }
        if n.addr
            .to_socket_addrs()
            .map(|mut a| a.next().is_none())
            .unwrap_or(true)
        {
            return Err(format!(
                "{name}: node `{}` has an unresolvable address `{}`",
                n.name, n.addr
            ));
        }
    }
    Ok(f.node)
}

/// A hello request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub op: String,
    pub version: u32,
}

/// What a peer says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub version: String,
    pub protocol: u32,
    pub cpus: u32,
    pub memory: u64,
}

/// Contacts a peer and exchanges hellos.
pub fn probe(node: &NodeConfig, timeout: Duration) -> Result<NodeInfo, String> {
    let addr = node
        .addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or("address resolves to nothing")?;
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("unreachable: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let hello = serde_json::to_string(&Hello {
        op: "hello".into(),
        version: NODE_PROTOCOL,
    })
    .map_err(|e| e.to_string())?;
    s.write_all(format!("{hello}\n").as_bytes())
        .map_err(|e| format!("send failed: {e}"))?;
    let mut line = String::new();
    BufReader::new(s.take(64 * 1024))
        .read_line(&mut line)
        .map_err(|e| format!("no answer: {e}"))?;
    if line.is_empty() {
        return Err("closed the connection without answering".into());
    }
    let info: NodeInfo = serde_json::from_str(line.trim())
        .map_err(|e| format!("not a sidecore node (bad hello answer: {e})"))?;
    if info.protocol != NODE_PROTOCOL {
        return Err(format!(
            "speaks node protocol {}, this side {NODE_PROTOCOL}",
            info.protocol
        ));
    }
    Ok(info)
}

// ---------------------------------------------------------------------------
// Deploying a part of an app on a peer (the runtime's `remote` module drives
// the exchange; these are its messages, parsed here without I/O so they can
// be fuzzed).

/// Version of the deployment exchange.
pub const PART_PROTOCOL: u32 = 1;
/// Most offcodes and channels one part may carry (the request is untrusted input).
pub const MAX_PART_ITEMS: usize = 1024;

/// One offcode of a part, as the peer builds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteOffcode {
    pub name: String,
    pub implementation: String,
    pub priority: Priority,
    pub watchdog_ms: Option<u64>,
    pub obsolete_ms: Option<u64>,
    pub params: toml::Table,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// One channel with at least one end in the part. Ends are (offcode index in
/// the part, port index).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteChannel {
    pub name: String,
    pub props: ChannelProps,
    /// The sending end, if it is in the part (otherwise it is at the origin,
    /// and the peer listens for it).
    pub from: Option<(usize, usize)>,
    /// The receiving ends in the part.
    pub to: Vec<(usize, usize)>,
    /// Where the receiver at the origin listens, if the receiver is there.
    pub connect: Option<String>,
}

/// The deployment request: the part of a plan placed on one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemotePart {
    pub op: String,
    pub version: u32,
    /// The app's name at the origin.
    pub app: String,
    /// Who asked (host name and process), for names and messages.
    pub origin: String,
    pub offcodes: Vec<RemoteOffcode>,
    pub channels: Vec<RemoteChannel>,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':'))
}

impl RemotePart {
    /// Parses and checks a request line. Every index must point into the part,
    /// every channel must have exactly one sender and a receiver, and names must
    /// be plain; the error says which field of which item is wrong.
    pub fn parse(line: &str) -> Result<RemotePart, String> {
        let part: RemotePart =
            serde_json::from_str(line).map_err(|e| format!("malformed deploy request: {e}"))?;
        part.validate()?;
        Ok(part)
    }

    /// The checks of [`parse`](Self::parse), on an already decoded request.
    pub fn validate(&self) -> Result<(), String> {
        if self.op != "deploy" {
            return Err(format!("unknown op `{}` (expected `deploy`)", self.op));
        }
        if self.version != PART_PROTOCOL {
            return Err(format!(
                "deploy protocol version {} (this node speaks {PART_PROTOCOL})",
                self.version
            ));
        }
        if !valid_name(&self.app) {
            return Err(format!("invalid app name {:?}", self.app));
        }
        if !valid_name(&self.origin) {
            return Err(format!("invalid origin name {:?}", self.origin));
        }
        if self.offcodes.is_empty() {
            return Err("the part has no offcodes".into());
        }
        if self.offcodes.len() > MAX_PART_ITEMS || self.channels.len() > MAX_PART_ITEMS {
            return Err(format!(
                "the part has {} offcodes and {} channels (at most {MAX_PART_ITEMS} each)",
                self.offcodes.len(),
                self.channels.len()
            ));
        }
        for (i, o) in self.offcodes.iter().enumerate() {
            if !valid_name(&o.name) {
                return Err(format!("offcodes[{i}].name: invalid name {:?}", o.name));
            }
            if self.offcodes[..i].iter().any(|p| p.name == o.name) {
                return Err(format!("offcodes[{i}].name: `{}` appears twice", o.name));
            }
            for p in o.inputs.iter().chain(&o.outputs) {
                if !valid_name(p) {
                    return Err(format!("offcode `{}`: invalid port name {p:?}", o.name));
                }
            }
        }
        let end = |what: &str, c: &RemoteChannel, (o, p): (usize, usize), out: bool| {
            let Some(oc) = self.offcodes.get(o) else {
                return Err(format!(
                    "channel `{}`: {what} names offcode #{o}, but the part has {}",
                    c.name,
                    self.offcodes.len()
                ));
            };
            let ports = if out { &oc.outputs } else { &oc.inputs };
            if p >= ports.len() {
                return Err(format!(
                    "channel `{}`: {what} names port #{p} of `{}`, which has {} {} ports",
                    c.name,
                    oc.name,
                    ports.len(),
                    if out { "output" } else { "input" }
                ));
            }
            Ok(())
        };
        for (i, c) in self.channels.iter().enumerate() {
            if !valid_name(&c.name) {
                return Err(format!("channels[{i}].name: invalid name {:?}", c.name));
            }
            if self.channels[..i].iter().any(|d| d.name == c.name) {
                return Err(format!("channels[{i}].name: `{}` appears twice", c.name));
            }
            if let Some(f) = c.from {
                end("from", c, f, true)?;
            }
            for &t in &c.to {
                end("to", c, t, false)?;
            }
            match (c.from.is_some(), c.to.len(), c.connect.is_some()) {
                (true, n, false) if n > 0 => {}
                (true, 0, true) | (false, 1, false) => {}
                _ => {
                    return Err(format!(
                        "channel `{}`: needs one sender and its receivers in the part, \
                         or exactly one end here and the other at the origin",
                        c.name
                    ));
                }
            }
            if let Some(a) = &c.connect
                && a.parse::<SocketAddr>().is_err()
            {
                return Err(format!(
                    "channel `{}`: `connect` is not an ip:port address: {a:?}",
                    c.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn nodes_file_errors_name_the_spot() {
        let e = parse_nodes("nodes.toml", "[[node]]\nname = \"b\"\nadress = \"x\"\n").unwrap_err();
        assert!(
            e.starts_with("nodes.toml:3:1:") && e.contains("unknown field `adress`"),
            "{e}"
        );
        let e = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b c\"\naddr = \"127.0.0.1:1\"\n",
        )
        .unwrap_err();
        assert!(e.contains("invalid name `b c`"), "{e}");
        let e = parse_nodes("n.toml", "[[node]]\nname = \"b\"\naddr = \"nowhere\"\n").unwrap_err();
        assert!(e.contains("unresolvable address `nowhere`"), "{e}");
        let ok = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:7400\"\n",
        )
        .unwrap();
        assert_eq!(ok[0].name, "b");
    }

    #[test]
    fn probe_reports_unreachable_and_impostors() {
        // A port nobody listens on.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let e = probe(
            &NodeConfig {
                name: "gone".into(),
                addr: addr.clone(),
            },
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(e.contains("unreachable"), "{e}");

        // Something that is not sidecore.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let e = probe(
            &NodeConfig {
                name: "web".into(),
                addr,
            },
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(e.contains("not a sidecore node"), "{e}");
        t.join().unwrap();
    }

    fn part() -> RemotePart {
        RemotePart {
            op: "deploy".into(),
            version: PART_PROTOCOL,
            app: "demo".into(),
            origin: "vm.1".into(),
            offcodes: vec![RemoteOffcode {
                name: "checksum".into(),
                implementation: "inet-checksum".into(),
                priority: Priority::Normal,
                watchdog_ms: Some(1000),
                obsolete_ms: None,
                params: toml::Table::new(),
                inputs: vec!["in".into()],
                outputs: vec![],
            }],
            channels: vec![RemoteChannel {
                name: "records".into(),
                props: ChannelProps::default(),
                from: None,
                to: vec![(0, 0)],
                connect: None,
            }],
        }
    }

    fn parse_err(p: &RemotePart) -> String {
        RemotePart::parse(&serde_json::to_string(p).unwrap()).unwrap_err()
    }

    #[test]
    fn a_deploy_request_round_trips() {
        let p = part();
        let back = RemotePart::parse(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn bad_deploy_requests_say_what_is_wrong() {
        let e = RemotePart::parse(r#"{"op":"deploy","version":1}"#).unwrap_err();
        assert!(
            e.contains("malformed deploy request") && e.contains("missing field"),
            "{e}"
        );
        let e = RemotePart::parse("not json").unwrap_err();
        assert!(e.contains("malformed deploy request"), "{e}");

        let mut p = part();
        p.version = 9;
        assert!(parse_err(&p).contains("deploy protocol version 9"));

        let mut p = part();
        p.app = "../etc".into();
        assert!(parse_err(&p).contains("invalid app name"));

        let mut p = part();
        p.offcodes.clear();
        assert!(parse_err(&p).contains("no offcodes"));

        let mut p = part();
        p.offcodes.push(p.offcodes[0].clone());
        assert!(parse_err(&p).contains("offcodes[1].name: `checksum` appears twice"));

        let mut p = part();
        p.channels[0].to = vec![(5, 0)];
        let e = parse_err(&p);
        assert!(
            e.contains("channel `records`: to names offcode #5, but the part has 1"),
            "{e}"
        );

        let mut p = part();
        p.channels[0].to = vec![(0, 3)];
        let e = parse_err(&p);
        assert!(
            e.contains("port #3 of `checksum`, which has 1 input ports"),
            "{e}"
        );

        // An input used as a sender.
        let mut p = part();
        p.channels[0].from = Some((0, 0));
        p.channels[0].to = vec![];
        p.channels[0].connect = Some("127.0.0.1:9".into());
        let e = parse_err(&p);
        assert!(e.contains("which has 0 output ports"), "{e}");

        // Neither end here.
        let mut p = part();
        p.channels[0].to = vec![];
        assert!(parse_err(&p).contains("needs one sender"));

        let mut p = part();
        p.offcodes[0].outputs = vec!["out".into()];
        p.channels[0].from = Some((0, 0));
        p.channels[0].to = vec![];
        p.channels[0].connect = Some("somewhere".into());
        assert!(parse_err(&p).contains("`connect` is not an ip:port address"));

        let mut p = part();
        p.op = "hello".into();
        assert!(parse_err(&p).contains("unknown op `hello`"));
    }
}
