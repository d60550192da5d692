//! TLS for serving: rustls (HTTP/2 and HTTP/1.1 by ALPN), client
//! certificates requested but not required. Connections are served by
//! [`super::front_door`].

use std::sync::Arc;

use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;

/// Why TLS could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM: {0}")]
    Pem(#[from] std::io::Error),
    #[error("no certificate in the certificate PEM")]
    NoCertificate,
    #[error("no private key in the key PEM")]
    NoKey,
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// A rustls server config presenting `cert` that asks clients for
/// certificates as `client_verifier` says (never requiring one: probes and
/// bearer-token clients come without).
pub fn server_config(
    cert: Arc<dyn ResolvesServerCert>,
    client_verifier: Arc<dyn ClientCertVerifier>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(client_verifier)
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
