//! HTTPS serving: rustls (HTTP/2 and HTTP/1.1 by ALPN), client certificates
//! requested but not required, and the verified peer attached to requests.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::auth::{Peer, User};

/// A slow or stuck handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM: {0}")]
    Pem(#[from] std::io::Error),
    #[error("no private key in the key PEM")]
    NoKey,
    #[error("no certificate in the client CA PEM")]
    NoClientCa,
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// A rustls server config serving `cert_pem`/`key_pem` that verifies client
/// certificates against `client_ca_pem` when a client presents one.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key: PrivateKeyDer<'static> =
        rustls_pemfile::private_key(&mut key_pem.as_bytes())?.ok_or(TlsError::NoKey)?;
    let mut roots = RootCertStore::empty();
    for ca in rustls_pemfile::certs(&mut client_ca_pem.as_bytes()) {
        roots.add(ca?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoClientCa);
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        // Probes and (later) bearer-token clients come without a certificate.
        .allow_unauthenticated()
        .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts TLS connections on `listener` and serves `app` on each until
/// `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        // Without it, small responses wait for the peer's delayed ACK (40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "setting TCP_NODELAY failed");
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake timed out");
                    return;
                }
            };
            let peer = Peer {
                certificate_user: tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(User::from_certificate)
                    .map(Arc::new),
            };
            let service = app.map_request(move |mut request: axum::extract::Request<_>| {
                request.extensions_mut().insert(peer.clone());
                request
            });
            let connection = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(
                    TokioIo::new(tls),
                    TowerToHyperService::new(service),
                )
                .await;
            if let Err(e) = connection {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
        });
    }
}
