//! How a FileWall is deployed, the same from the command line (`sidecore
//! filewall run`) and from a manifest (the `filewall` offcode's `params`): where
//! it listens, which servers it fronts, its chain file and handle key, and the
//! network namespace its listeners live in. [`Settings::config`] turns them into
//! the proxy's configuration, reading the files they name.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::backend::Backend;
use crate::engine::{Listen, ProxyConfig};
use crate::handles::HandleKey;
use crate::policy::load_chain;
use crate::{mount, nfs3, portmap};

/// A deployment (the offcode's `params`; paths relative to where sidecore runs).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where clients reach NFS.
    pub nfs_listen: SocketAddr,
    /// Where clients reach MOUNT.
    pub mount_listen: SocketAddr,
    /// The portmapper's address (111 for unmodified clients), if any.
    #[serde(default)]
    pub portmap_listen: Option<SocketAddr>,
    /// Also listen for UDP on the same addresses.
    #[serde(default)]
    pub udp: bool,
    /// The servers as `nfs=ADDR,mount=ADDR[,export=PATH]` (the first is the
    /// primary, the others replicas).
    pub servers: Vec<String>,
    /// The chain file (none: pass-through).
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// The handle policy's key file.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// The network namespace the listeners are bound in (none: the caller's).
    #[serde(default)]
    pub netns: Option<String>,
    /// A Unix socket serving the counters (`sidecore filewall stats --control`).
    #[serde(default)]
    pub control: Option<PathBuf>,
}

/// Settings that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Server(#[from] crate::backend::BackendError),
    #[error("no server: name at least one")]
    NoServer,
    #[error("key {path}: {why}")]
    Key { path: String, why: String },
}

impl Settings {
    /// The proxy's configuration: listeners, servers, the chain (read and
    /// checked) and the key.
    pub fn config(&self) -> Result<ProxyConfig, SettingsError> {
        let servers = self
            .servers
            .iter()
            .map(|s| Backend::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err(SettingsError::NoServer);
        }
        let mut listen = vec![
            Listen::tcp(self.nfs_listen).serving(&[nfs3::PROGRAM]),
            Listen::tcp(self.mount_listen).serving(&[mount::PROGRAM]),
        ];
        if let Some(p) = self.portmap_listen {
            listen.push(Listen::tcp(p).serving(&[portmap::PROGRAM]));
        }
        if self.udp {
            listen.push(Listen::udp(self.nfs_listen).serving(&[nfs3::PROGRAM]));
            listen.push(Listen::udp(self.mount_listen).serving(&[mount::PROGRAM]));
            if let Some(p) = self.portmap_listen {
                listen.push(Listen::udp(p).serving(&[portmap::PROGRAM]));
            }
        }
        let mut c = ProxyConfig::with(listen, servers);
        if let Some(p) = &self.policy {
            c.chain = load_chain(p)?;
        }
        if let Some(k) = &self.key {
            c.key = Some(HandleKey::load(k).map_err(|why| SettingsError::Key {
                path: k.display().to_string(),
                why: why.to_string(),
            })?);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_make_listeners_and_refuse_bad_servers() {
        let s: Settings = toml::from_str(
            "nfs_listen = \"127.0.0.1:3049\"\nmount_listen = \"127.0.0.1:3050\"\n\
             portmap_listen = \"127.0.0.1:3111\"\nudp = true\n\
             servers = [\"nfs=127.0.0.1:2049,mount=127.0.0.1:20048\"]\n",
        )
        .unwrap();
        let c = s.config().unwrap();
        assert_eq!(c.listen.len(), 6);
        assert_eq!(c.servers[0].nfs, Some("127.0.0.1:2049".parse().unwrap()));
        let bad = Settings {
            servers: vec!["nfs=nowhere".into()],
            ..s.clone()
        };
        assert!(
            bad.config()
                .unwrap_err()
                .to_string()
                .starts_with("server \"nfs=nowhere\"")
        );
        let none = Settings {
            servers: vec![],
            ..s.clone()
        };
        assert_eq!(none.config().unwrap_err(), SettingsError::NoServer);
        let chain = Settings {
            policy: Some("/nonexistent/chain.toml".into()),
            ..s
        };
        assert!(
            chain
                .config()
                .unwrap_err()
                .to_string()
                .starts_with("/nonexistent/chain.toml: reading")
        );
    }
}
