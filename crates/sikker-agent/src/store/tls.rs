//! TLS to etcd: the authority that signs etcd's server certificate, and the
//! certificate and key this client presents when etcd demands one
//! (`--client-cert-auth`). `sidecore sikker certs` makes them: a certificate
//! for etcd's address (`--host 10.0.0.1`: an IP address becomes an IP
//! subject name) and one for each agent, all signed by the cluster's
//! authority. The files are read once, up front, so a missing or broken one
//! is reported by name before anything connects.

use std::path::{Path, PathBuf};

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// How to reach etcd over `https://`.
#[derive(Clone)]
pub struct EtcdTls {
    ca: PathBuf,
    client: Option<(PathBuf, PathBuf)>,
    config: TlsConfig,
}

/// A TLS file that could not be used, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct TlsFileError {
    pub path: PathBuf,
    pub why: String,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Every certificate in the PEM file at `path` (at least one).
fn certificates(path: &Path) -> Result<Vec<Certificate<'static>>, TlsFileError> {
    let bytes = read(path)?;
    let bad = |why: String| TlsFileError {
        path: path.to_path_buf(),
        why,
    };
    let mut out = Vec::new();
    for item in ureq::tls::parse_pem(&bytes) {
        if let PemItem::Certificate(c) = item.map_err(|e| bad(e.to_string()))? {
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(out)
}

impl EtcdTls {
    /// Reads the authority `ca` and, for etcd's client authentication, this
    /// client's certificate and key.
    pub fn load(ca: &Path, client: Option<(&Path, &Path)>) -> Result<EtcdTls, TlsFileError> {
        let roots = certificates(ca)?;
        let client_cert = match client {
            Some((cert, key)) => {
                let chain = certificates(cert)?;
                let key_bytes = read(key)?;
                let key = PrivateKey::from_pem(&key_bytes).map_err(|e| TlsFileError {
                    path: key.to_path_buf(),
                    why: format!("not a PEM private key: {e}"),
                })?;
                Some(ClientCert::new_with_certs(&chain, key))
            }
            None => None,
        };
        let config = base()
            .root_certs(RootCerts::new_with_certs(&roots))
            .client_cert(client_cert)
            .build();
        Ok(EtcdTls {
            ca: ca.to_path_buf(),
            client: client.map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
            config,
        })
    }

    /// The configuration for ureq's agents.
    pub(super) fn config(&self) -> TlsConfig {
        self.config.clone()
    }
}

/// The TLS configuration of a client given no [`EtcdTls`]: it trusts no
/// authority, so an `https://` endpoint fails its handshake with a clear
/// error (ureq would otherwise look for a process-wide crypto provider, and
/// panic without one).
pub(super) fn trust_nothing() -> TlsConfig {
    base().root_certs(RootCerts::new_with_certs(&[])).build()
}

fn base() -> ureq::tls::TlsConfigBuilder {
    TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(crate::tls::provider())
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// Two configurations are the same when they were read from the same files.
impl PartialEq for EtcdTls {
    fn eq(&self, other: &Self) -> bool {
        self.ca == other.ca && self.client == other.client
    }
}

impl Eq for EtcdTls {}
