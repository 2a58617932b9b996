//! Node identity for agent links: mutual TLS (rustls) with one certificate
//! authority per cluster. Each agent holds a certificate for its host name
//! (the name in the placement) signed by that authority; it presents it both
//! when it connects and when it accepts, and checks that the other side's
//! certificate chains to the authority and names the host it says it is. An
//! agent that cannot prove its node's name is refused.
//!
//! [`generate`] makes an authority and host certificates (rcgen), for
//! `sidecore sikker certs`; [`load`] reads one host's files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The files of one host: `DIR/ca.pem`, `DIR/HOST.pem` and `DIR/HOST.key`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files of `host` in `dir`, as [`generate`] writes them.
    pub fn in_dir(dir: &Path, host: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{host}.pem")),
            key: dir.join(format!("{host}.key")),
        }
    }
}

/// The rustls configurations of one agent.
#[derive(Clone)]
pub struct Tls {
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
}

/// Why certificates could not be made or loaded, with the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: String, what: String },
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("`{0}` is not a host name a certificate can carry")]
    BadName(String),
    /// The peer's certificate could not be parsed (webpki's words).
    #[error("{0:?}")]
    BadCertificate(#[source] webpki::Error),
    #[error("its certificate does not name host `{host}` ({reason:?})")]
    NotNamed {
        host: String,
        #[source]
        reason: webpki::Error,
    },
}

fn file_err(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

/// The crypto provider of every TLS configuration here (ring).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads `files` into server and client configurations that both demand
/// and check the other side's certificate.
pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
    let ca: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.ca)
        .map_err(|e| file_err(&files.ca, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(&files.ca, e))?;
    if ca.is_empty() {
        return Err(file_err(&files.ca, "holds no certificate"));
    }
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots
            .add(c)
            .map_err(|e| file_err(&files.ca, format!("not a CA certificate: {e}")))?;
    }
    let roots = Arc::new(roots);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_err(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(&files.cert, e))?;
    if chain.is_empty() {
        return Err(file_err(&files.cert, "holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_err(&files.key, e))?;
    let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(cfg)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(cfg)?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(cfg)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(cfg)?;
    Ok(Tls {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

/// `host` as a TLS server name.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::BadName(host.to_string()))
}

/// Whether the (already chain-verified) certificate `der` names `host`.
pub fn names(der: &CertificateDer<'_>, host: &str) -> Result<(), TlsError> {
    let name = server_name(host)?;
    let cert = webpki::EndEntityCert::try_from(der).map_err(TlsError::BadCertificate)?;
    cert.verify_is_valid_for_subject_name(&name)
        .map_err(|reason| TlsError::NotNamed {
            host: host.to_string(),
            reason,
        })
}

/// Writes a new authority (`ca.pem`, `ca.key`) and a certificate and key for
/// each host (`HOST.pem`, `HOST.key`) into `dir`; returns the files written.
pub fn generate(dir: &Path, hosts: &[String]) -> Result<Vec<PathBuf>, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let gen_err = |e: rcgen::Error| TlsError::Config(e.to_string());
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let ca_key = KeyPair::generate().map_err(gen_err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sidecore sikker cluster CA");
    let ca = ca_params.self_signed(&ca_key).map_err(gen_err)?;
    let mut written = Vec::new();
    let mut write = |name: String, text: String| -> Result<(), TlsError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| file_err(&p, e))?;
        written.push(p);
        Ok(())
    };
    write("ca.pem".into(), ca.pem())?;
    write("ca.key".into(), ca_key.serialize_pem())?;
    for h in hosts {
        server_name(h)?;
        let key = KeyPair::generate().map_err(gen_err)?;
        let mut p =
            CertificateParams::new(vec![h.clone()]).map_err(|_| TlsError::BadName(h.clone()))?;
        p.distinguished_name.push(DnType::CommonName, h.as_str());
        let cert = p.signed_by(&key, &ca, &ca_key).map_err(gen_err)?;
        write(format!("{h}.pem"), cert.pem())?;
        write(format!("{h}.key"), key.serialize_pem())?;
    }
    Ok(written)
}
