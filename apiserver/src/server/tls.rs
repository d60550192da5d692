//! HTTPS serving: rustls (HTTP/2 and HTTP/1.1 by ALPN), client certificates
//! requested but not required, and the verified peer attached to requests.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::auth::{Auth, PeerIdentity};

/// A slow or stuck handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Accepts TLS connections on `listener` and serves `app` on each until
/// `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    auth: Arc<Auth>,
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
        let auth = auth.clone();
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
            let peer = tls
                .get_ref()
                .1
                .peer_certificates()
                .map_or(PeerIdentity::Anonymous, |chain| auth.identify(chain));
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
