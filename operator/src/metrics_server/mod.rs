//! The operator's `/metrics` endpoint, served as controller-runtime serves
//! it: HTTPS, and only to callers whose bearer token kube-apiserver
//! authenticates and authorizes for `get` on `/metrics` (see [`auth`]);
//! with `--metrics-secure=false`, plain HTTP without authentication, for
//! local use. `/healthz` answers `ok` to anyone: it tells nothing.

mod auth;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::AbortOnDropHandle;

use auth::{Authorizer, Decision};
pub use tls::TlsError;

use crate::config::MetricsServing;

/// The OpenMetrics text format, which `prometheus_client` writes and
/// Prometheus reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A slow or stuck handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the metrics endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listening on {address} for metrics: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("the metrics endpoint's TLS: {0}")]
    Tls(#[from] TlsError),
}

struct Endpoint {
    registry: Registry,
    /// `None`: no authentication (`--metrics-secure=false`).
    authorizer: Option<Authorizer>,
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body + "\n",
    )
        .into_response()
}

async fn metrics(State(endpoint): State<Arc<Endpoint>>, headers: HeaderMap) -> Response {
    if let Some(authorizer) = &endpoint.authorizer {
        match authorizer.decide(&headers).await {
            Ok(Decision::Allowed) => {}
            Ok(Decision::Unauthenticated) => {
                let mut response = text(StatusCode::UNAUTHORIZED, "Unauthorized".to_owned());
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                return response;
            }
            Ok(Decision::Forbidden(user)) => {
                return text(StatusCode::FORBIDDEN, auth::forbidden_message(&user));
            }
            Err(error) => {
                tracing::warn!(%error, "cannot authorize a metrics request");
                return text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
            }
        }
    }
    match crate::metrics::encode(&endpoint.registry) {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed".to_owned(),
        ),
    }
}

fn router(endpoint: Endpoint) -> Router {
    Router::new()
        .route(auth::METRICS_PATH, get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Arc::new(endpoint))
}

/// Serves one connection's requests.
async fn serve_connection<S>(io: S, app: Router, remote: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .await;
    if let Err(error) = connection {
        tracing::debug!(%remote, %error, "a metrics connection ended with an error");
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, app: Router) {
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (tls, app) = (tls.clone(), app.clone());
        tokio::spawn(async move {
            let Some(acceptor) = tls else {
                return serve_connection(stream, app, remote).await;
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, app, remote).await,
                Ok(Err(error)) => tracing::debug!(%remote, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
            }
        });
    }
}

/// Binds the endpoint and serves it until the returned handle drops.
/// `client` makes the TokenReviews and SubjectAccessReviews.
pub async fn start(
    serving: &MetricsServing,
    registry: Registry,
    client: kube::Client,
) -> Result<AbortOnDropHandle<()>, ServeError> {
    let tls = if serving.secure {
        Some(TlsAcceptor::from(tls::server_config(
            serving.cert_dir.as_deref(),
        )?))
    } else {
        None
    };
    let listener = TcpListener::bind(serving.bind_address)
        .await
        .map_err(|source| ServeError::Bind {
            address: serving.bind_address,
            source,
        })?;
    let address = listener.local_addr().map_err(|source| ServeError::Bind {
        address: serving.bind_address,
        source,
    })?;
    let scheme = if serving.secure { "https" } else { "http" };
    let certificate = match (&serving.cert_dir, serving.secure) {
        (_, false) => "none".to_owned(),
        (None, true) => "self-signed".to_owned(),
        (Some(dir), true) => dir.display().to_string(),
    };
    tracing::info!(
        %address,
        url = %format!("{scheme}://{address}{}", auth::METRICS_PATH),
        secure = serving.secure,
        %certificate,
        "serving metrics"
    );
    let app = router(Endpoint {
        registry,
        authorizer: serving.secure.then(|| Authorizer::new(client)),
    });
    Ok(AbortOnDropHandle::new(tokio::spawn(accept_loop(
        listener, tls, app,
    ))))
}
