//! The daemon's configuration file (`sidecore daemon --config FILE`, see
//! `dist/sidecore.toml`): where it listens, which PEs to keep, and which apps
//! it keeps deployed. `--check-config` validates it; SIGHUP re-reads it and
//! brings the declared apps up or down. A file that does not parse is
//! reported with its line and column and changes nothing that runs.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sidecore_observe::services::ServiceSpec;

/// The default address of the metrics and dashboard listener.
pub const DEFAULT_HTTP: &str = "127.0.0.1:9464";
/// Orion's core watch by default: a refresh of 25 ms, and 8 refreshes without
/// progress (200 ms, above what a loaded machine starves an ordinary thread;
/// the seed's k = 3 is `core_k = 3`).
pub const DEFAULT_CORE_REFRESH_MS: u64 = 25;
pub const DEFAULT_CORE_K: u32 = 8;
/// The shortest core-watch refresh (an idle executor may sleep 5 ms between ticks).
pub const MIN_CORE_REFRESH_MS: u64 = 10;

/// The file's contents; every field is optional, flags override them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Control socket.
    pub socket: Option<PathBuf>,
    /// Node listener for peers (`0.0.0.0:7400`).
    pub listen: Option<String>,
    /// This node's name, as peers see it.
    pub name: Option<String>,
    /// Metrics and dashboard listener; `"off"` disables it.
    pub http: Option<String>,
    /// Allow `http` on a non-loopback address.
    #[serde(default)]
    pub http_expose: bool,
    /// Peer nodes file.
    pub nodes: Option<PathBuf>,
    /// CPUs never to dedicate.
    pub housekeeping: Option<Vec<u32>>,
    /// Busy-poll on idle cores.
    #[serde(default)]
    pub spin: bool,
    /// Orion's watch of the dedicated cores: refresh period in ms (0: off).
    pub core_refresh_ms: Option<u64>,
    /// Refreshes without progress before a core is declared dead.
    pub core_k: Option<u32>,
    /// Manifests kept deployed (relative paths are against the file's folder).
    #[serde(default)]
    pub apps: Vec<PathBuf>,
    /// Services whose `/metrics` the daemon scrapes and shows (`NAME=ADDR`).
    #[serde(default, deserialize_with = "services")]
    pub services: Vec<ServiceSpec>,
}

fn services<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ServiceSpec>, D::Error> {
    let raw: Vec<String> = Vec::deserialize(d)?;
    raw.iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
}

/// A configuration that cannot be used, with where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: `{field}`: {message}")]
    Field {
        path: PathBuf,
        field: &'static str,
        message: String,
    },
}

impl DaemonConfig {
    /// Reads and checks `path`: it parses, the addresses are addresses, and
    /// every app's manifest exists and loads.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut c: DaemonConfig = toml::from_str(&text).map_err(|e| {
            let (line, column) = e.span().map_or((0, 0), |s| line_col(&text, s.start));
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        let field = |field: &'static str, message: String| ConfigError::Field {
            path: path.to_path_buf(),
            field,
            message,
        };
        if let Some(h) = c.http.as_deref().filter(|h| *h != "off") {
            let addr: SocketAddr = h
                .parse()
                .map_err(|e| field("http", format!("`{h}` is not an address: {e}")))?;
            if !c.http_expose && !addr.ip().is_loopback() {
                return Err(field(
                    "http",
                    format!(
                        "`{h}` is not a loopback address; set `http_expose = true` to serve beyond this machine"
                    ),
                ));
            }
        }
        if let Some(r) = c
            .core_refresh_ms
            .filter(|r| *r != 0 && *r < MIN_CORE_REFRESH_MS)
        {
            return Err(field(
                "core_refresh_ms",
                format!("{r}: at least {MIN_CORE_REFRESH_MS} ms, or 0 to turn the core watch off"),
            ));
        }
        if c.core_k == Some(0) {
            return Err(field("core_k", "0: at least 1".into()));
        }
        if let Some(l) = &c.listen {
            l.parse::<SocketAddr>()
                .map_err(|e| field("listen", format!("`{l}` is not an address: {e}")))?;
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let mut seen = BTreeSet::new();
        for app in &mut c.apps {
            if app.is_relative() {
                *app = base.join(&*app);
            }
            if !seen.insert(app.clone()) {
                return Err(field("apps", format!("{} is listed twice", app.display())));
            }
            sidecore_manifest::load(app).map_err(|e| field("apps", e.render(false)))?;
        }
        Ok(c)
    }
}

/// 1-based line and column of byte `at` in `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_files_say_what_and_where() {
        let d = tempfile::tempdir().unwrap();
        let unknown = write(
            d.path(),
            "a.toml",
            "http = \"127.0.0.1:1\"\nlisten_on = 3\n",
        );
        let e = DaemonConfig::load(&unknown).unwrap_err().to_string();
        assert!(e.contains("a.toml:2:1") && e.contains("listen_on"), "{e}");
        let exposed = write(d.path(), "b.toml", "http = \"0.0.0.0:9464\"\n");
        let e = DaemonConfig::load(&exposed).unwrap_err().to_string();
        assert!(e.contains("`http`") && e.contains("http_expose"), "{e}");
        let missing = write(d.path(), "c.toml", "apps = [\"nope.toml\"]\n");
        let e = DaemonConfig::load(&missing).unwrap_err().to_string();
        assert!(e.contains("`apps`") && e.contains("nope.toml"), "{e}");
        let e = DaemonConfig::load(&d.path().join("absent.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        let svc = write(d.path(), "e.toml", "services = [\"fw=nowhere\"]\n");
        let e = DaemonConfig::load(&svc).unwrap_err().to_string();
        assert!(
            e.contains("e.toml:1:") && e.contains("not an address"),
            "{e}"
        );
        let fast = write(d.path(), "f.toml", "core_refresh_ms = 2\n");
        let e = DaemonConfig::load(&fast).unwrap_err().to_string();
        assert!(e.contains("`core_refresh_ms`: 2: at least 10 ms"), "{e}");
        let k0 = write(d.path(), "g.toml", "core_k = 0\n");
        let e = DaemonConfig::load(&k0).unwrap_err().to_string();
        assert!(e.contains("`core_k`: 0"), "{e}");
        let ok = write(d.path(), "d.toml", "http = \"off\"\nspin = true\n");
        let c = DaemonConfig::load(&ok).unwrap();
        assert!(c.spin && c.apps.is_empty());
    }
}
