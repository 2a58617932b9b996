//! The servers FileWall forwards to: each a [`Backend`] with the address of its NFS
//! and MOUNT programs (or one address for every program) and, for replication, the
//! path it exports. Server index 0 is the primary; the others are replicas.

use std::fmt;
use std::net::SocketAddr;

use crate::{mount, nfs3};

/// One server (or replica).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backend {
    /// Where NFSv3 calls go.
    pub nfs: Option<SocketAddr>,
    /// Where MOUNT v3 calls go.
    pub mount: Option<SocketAddr>,
    /// Where calls of any program without an address of its own go.
    pub other: Option<SocketAddr>,
    /// The path this server exports, when it differs between replicas: a replicated
    /// MNT or UMNT of the primary's export is rewritten to this one.
    pub export: Option<Vec<u8>>,
}

impl Backend {
    /// A server that takes every program at one address.
    pub fn any(addr: SocketAddr) -> Self {
        Self {
            other: Some(addr),
            ..Self::default()
        }
    }

    /// A server with NFS and MOUNT at their own ports.
    pub fn nfs_mount(nfs: SocketAddr, mount: SocketAddr) -> Self {
        Self {
            nfs: Some(nfs),
            mount: Some(mount),
            ..Self::default()
        }
    }

    /// The same, exporting `export`.
    #[must_use]
    pub fn exporting(mut self, export: impl Into<Vec<u8>>) -> Self {
        self.export = Some(export.into());
        self
    }

    /// Where a call of `program` goes, if anywhere.
    pub fn addr_for(&self, program: u32) -> Option<SocketAddr> {
        match program {
            nfs3::PROGRAM => self.nfs.or(self.other),
            mount::PROGRAM => self.mount.or(self.other),
            _ => self.other,
        }
    }

    /// Parses `nfs=ADDR,mount=ADDR[,export=PATH]` or a bare `ADDR` (every program).
    pub fn parse(s: &str) -> Result<Self, BackendError> {
        let bad = |why: String| BackendError {
            spec: s.to_string(),
            why,
        };
        let addr = |v: &str| {
            v.parse::<SocketAddr>()
                .map_err(|e| bad(format!("{v:?} is not an address HOST:PORT ({e})")))
        };
        if !s.contains('=') {
            return Ok(Self::any(addr(s)?));
        }
        let mut b = Self::default();
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not KEY=VALUE")))?;
            match k.trim() {
                "nfs" => b.nfs = Some(addr(v.trim())?),
                "mount" => b.mount = Some(addr(v.trim())?),
                "any" => b.other = Some(addr(v.trim())?),
                "export" => b.export = Some(v.trim().as_bytes().to_vec()),
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} (known: nfs, mount, any, export)"
                    )));
                }
            }
        }
        if b.nfs.is_none() && b.other.is_none() {
            return Err(bad("no NFS address (nfs=ADDR or any=ADDR)".into()));
        }
        Ok(b)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(a) = self.nfs {
            parts.push(format!("nfs={a}"));
        }
        if let Some(a) = self.mount {
            parts.push(format!("mount={a}"));
        }
        if let Some(a) = self.other {
            parts.push(format!("any={a}"));
        }
        if let Some(e) = &self.export {
            parts.push(format!("export={}", String::from_utf8_lossy(e)));
        }
        write!(f, "{}", parts.join(","))
    }
}

/// A server description that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server {spec:?}: {why}")]
pub struct BackendError {
    pub spec: String,
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_route() {
        let b = Backend::parse("nfs=127.0.0.1:2049,mount=127.0.0.1:20048,export=/srv/a").unwrap();
        assert_eq!(
            b.addr_for(nfs3::PROGRAM),
            Some("127.0.0.1:2049".parse().unwrap())
        );
        assert_eq!(
            b.addr_for(mount::PROGRAM),
            Some("127.0.0.1:20048".parse().unwrap())
        );
        assert_eq!(b.addr_for(7), None);
        assert_eq!(b.export.as_deref(), Some(&b"/srv/a"[..]));
        assert_eq!(Backend::parse(&b.to_string()).unwrap(), b);
        let any = Backend::parse("10.0.0.1:2049").unwrap();
        assert_eq!(any.addr_for(mount::PROGRAM), any.other);
        for bad in [
            "nfs=x",
            "mount=1.2.3.4:5",
            "colour=red,nfs=1.2.3.4:5",
            "nfs",
        ] {
            let e = Backend::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("server "), "{e}");
        }
    }
}
