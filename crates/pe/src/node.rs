//! Peer nodes as PEs: the configured peers (a TOML file of `[[node]]` tables)
//! and the probe that tells whether a peer daemon is reachable and what it
//! offers: a hello and a welcome over the node protocol (`sidecore-wire`).

use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_wire::{Hello, Link, LinkError, NodeInfo};

/// A configured peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    /// `host:port` of the peer's node listener.
    pub addr: String,
    /// The bandwidth of the link to it (`"1 Gbit/s"`), a cap the layout keeps.
    #[serde(default)]
    pub bandwidth: Option<String>,
}

impl NodeConfig {
    /// The declared link bandwidth (checked when the file was read).
    pub fn link(&self) -> Option<sidecore_types::Bandwidth> {
        self.bandwidth.as_deref().and_then(|b| b.parse().ok())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodesFile {
    #[serde(default)]
    node: Vec<NodeConfig>,
}

/// What is wrong with a nodes file; each error names the file.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("cannot read nodes file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Syntax {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: node #{number} has an invalid name `{name}` (letters, digits, `-` and `_`)")]
    Name {
        file: String,
        number: usize,
        name: String,
    },
    #[error("{file}: node `{name}`: `bandwidth`: {error}")]
    Bandwidth {
        file: String,
        name: String,
        error: sidecore_types::BadBandwidth,
    },
    #[error("{file}: node `{name}` is listed twice")]
    Duplicate { file: String, name: String },
    #[error("{file}: node `{name}` has an unresolvable address `{addr}`")]
    Address {
        file: String,
        name: String,
        addr: String,
    },
}

/// Reads a nodes file; errors name the file, line and column.
pub fn load_nodes(path: &Path) -> Result<Vec<NodeConfig>, NodesError> {
    let text = std::fs::read_to_string(path).map_err(|source| NodesError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_nodes(&path.display().to_string(), &text)
}

/// Line and column (1-based) of byte `at` in `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    (
        before.matches('\n').count() + 1,
        before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
    )
}

/// Parses nodes-file text (`file` is used in messages).
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<NodeConfig>, NodesError> {
    let f: NodesFile = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        NodesError::Syntax {
            file: file.to_string(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })?;
    for (i, n) in f.node.iter().enumerate() {
        if n.name.is_empty()
            || !n
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(NodesError::Name {
                file: file.to_string(),
                number: i + 1,
                name: n.name.clone(),
            });
        }
        if let Some(b) = &n.bandwidth
            && let Err(error) = b.parse::<sidecore_types::Bandwidth>()
        {
            return Err(NodesError::Bandwidth {
                file: file.to_string(),
                name: n.name.clone(),
                error,
            });
        }
        if f.node[..i].iter().any(|m| m.name == n.name) {
            return Err(NodesError::Duplicate {
                file: file.to_string(),
                name: n.name.clone(),
            });
        }
        if n.addr
            .to_socket_addrs()
            .map_or(true, |mut a| a.next().is_none())
        {
            return Err(NodesError::Address {
                file: file.to_string(),
                name: n.name.clone(),
                addr: n.addr.clone(),
            });
        }
    }
    Ok(f.node)
}

/// This process as an origin names itself: host name and process id.
pub fn origin_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!(
        "{}.{}",
        if host.is_empty() { "origin" } else { &host },
        std::process::id()
    )
}

/// The hello this process opens node connections with.
pub fn hello() -> Hello {
    Hello {
        origin: origin_name(),
        software: sidecore_wire::SOFTWARE_VERSION.to_string(),
    }
}

/// How a peer is named in errors: `node b at 10.0.0.2:7400`.
pub fn label(node: &NodeConfig) -> String {
    format!("node {} at {}", node.name, node.addr)
}

/// Contacts a peer and exchanges hello and welcome.
pub fn probe(node: &NodeConfig, timeout: Duration) -> Result<NodeInfo, LinkError> {
    Link::probe(&node.addr, &label(node), hello(), timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn nodes_file_errors_name_the_spot() {
        let e = parse_nodes("nodes.toml", "[[node]]\nname = \"b\"\nadress = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("nodes.toml:3:1:") && e.contains("unknown field `adress`"),
            "{e}"
        );
        let e = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b c\"\naddr = \"127.0.0.1:1\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("invalid name `b c`"), "{e}");
        let e = parse_nodes("n.toml", "[[node]]\nname = \"b\"\naddr = \"nowhere\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unresolvable address `nowhere`"), "{e}");
        let e = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\n[[node]]\nname = \"b\"\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node `b` is listed twice"), "{e}");
        let ok = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:7400\"\n",
        )
        .unwrap();
        assert_eq!(ok[0].name, "b");
        assert_eq!(ok[0].link(), None);
        let e = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\nbandwidth = \"fast\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("n.toml: node `b`: `bandwidth`: `fast` is not a bandwidth"),
            "{e}"
        );
        let ok = parse_nodes(
            "n.toml",
            "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\nbandwidth = \"2.5 Gbit/s\"\n",
        )
        .unwrap();
        assert_eq!(
            ok[0].link().map(sidecore_types::Bandwidth::bps),
            Some(2_500_000_000)
        );
        let e = load_nodes(Path::new("/nonexistent/nodes.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read nodes file /nonexistent/nodes.toml"),
            "{e}"
        );
    }

    #[test]
    fn probe_reports_unreachable_and_impostors() {
        // A port nobody listens on.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let gone = NodeConfig {
            name: "gone".into(),
            addr: addr.clone(),
            bandwidth: None,
        };
        let e = probe(&gone, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("node gone at {addr}: unreachable")),
            "{e}"
        );

        // Something that is not sidecore.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let web = NodeConfig {
            name: "web".into(),
            addr,
            bandwidth: None,
        };
        let e = probe(&web, Duration::from_secs(2)).unwrap_err().to_string();
        assert!(e.contains("not a sidecore node"), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn origin_names_are_plain() {
        let n = origin_name();
        assert!(sidecore_wire::part::valid_name(&n), "{n}");
        assert!(n.ends_with(&format!(".{}", std::process::id())));
    }
}
