//! The metrics endpoint's certificate: `tls.crt` and `tls.key` from a
//! directory (e.g. a cert-manager Secret mounted there), else a self-signed
//! one made at startup, as controller-runtime does. Clients that scrape a
//! self-signed endpoint skip verification (Prometheus:
//! `tls_config.insecure_skip_verify`) and rely on the bearer token.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the metrics endpoint has no certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: no certificate in it")]
    NoCertificate(PathBuf),
    #[error("{0}: no private key in it")]
    NoKey(PathBuf),
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// `DIR/tls.crt` (the chain) and `DIR/tls.key`.
fn load(dir: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let cert_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");
    let pem = read(&cert_path)?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Read {
            path: cert_path.clone(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_path));
    }
    let pem = read(&key_path)?;
    let key = rustls_pemfile::private_key(&mut BufReader::new(pem.as_slice()))
        .map_err(|source| TlsError::Read {
            path: key_path.clone(),
            source,
        })?
        .ok_or(TlsError::NoKey(key_path))?;
    Ok((chain, key))
}

/// A self-signed certificate for localhost and this host's name.
fn self_signed() -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let mut names = vec!["localhost".to_owned()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && host != "localhost" {
            names.push(host.to_owned());
        }
    }
    let generated = rcgen::generate_simple_self_signed(names)?;
    let key = PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der());
    Ok((vec![generated.cert.der().clone()], key.into()))
}

/// The rustls configuration of the metrics endpoint (HTTP/2 and HTTP/1.1).
pub fn server_config(cert_dir: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = match cert_dir {
        Some(dir) => load(dir)?,
        None => self_signed()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cert_dir_is_loaded_and_its_faults_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = server_config(Some(dir.path())).expect_err("no files");
        assert!(missing.to_string().contains("tls.crt"), "{missing}");
        let generated =
            rcgen::generate_simple_self_signed(vec!["metrics.example".to_owned()]).expect("cert");
        std::fs::write(dir.path().join("tls.crt"), generated.cert.pem()).expect("write");
        std::fs::write(dir.path().join("tls.key"), "not a key").expect("write");
        let no_key = server_config(Some(dir.path())).expect_err("no key");
        assert!(no_key.to_string().contains("no private key"), "{no_key}");
        std::fs::write(
            dir.path().join("tls.key"),
            generated.signing_key.serialize_pem(),
        )
        .expect("write");
        server_config(Some(dir.path())).expect("loads");
        server_config(None).expect("self-signed");
    }
}
