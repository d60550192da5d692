//! Wiring: listeners, TLS, background tasks and shutdown.

pub mod health;
pub mod pki;
pub mod standalone;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use jiff::Timestamp;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tower::ServiceBuilder;

use crate::api::{self, AppState, openapi::OpenApi};
use crate::auth;
use crate::config::StandaloneConfig;
use crate::heartbeat::HeartbeatService;
use crate::proxy::Proxy;
use crate::registry::Registry;

/// How often expired registrations are collected. Well under the shortest
/// allowed interval, so expiry is late by at most this much.
const SWEEP_PERIOD: Duration = Duration::from_millis(250);

/// The HTTP application: probes open to all, the API behind authentication.
pub fn app(state: AppState, openapi: Arc<OpenApi>) -> Router {
    let api = api::router(state, openapi)
        .layer(ServiceBuilder::new().layer(axum::middleware::from_fn(auth::authenticate)));
    health::router().merge(api)
}

/// Collects expired plugins until `shutdown` turns true.
async fn sweep(registry: Arc<Registry>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SWEEP_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => { registry.sweep(Timestamp::now()); }
            _ = shutdown.changed() => return,
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn bind(address: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the {what} address {address}"))
}

/// Runs standalone mode until SIGINT or SIGTERM.
pub async fn run_standalone(config: StandaloneConfig) -> anyhow::Result<()> {
    let https = bind(config.listen, "HTTPS").await?;
    let grpc = bind(config.grpc_listen, "gRPC").await?;
    let https_address = https.local_addr()?;
    let grpc_address = grpc.local_addr()?;

    let dir = config.state_dir();
    let local = standalone::prepare(&dir, https_address)
        .with_context(|| format!("preparing certificates in {}", dir.display()))?;
    let tls = tls::server_config(&local.serving.cert, &local.serving.key, &local.ca_pem)?;

    let registry = Arc::new(Registry::new((&config.registry).into()));
    let proxy = Arc::new(Proxy::new((&config.proxy).into()));
    let state = AppState {
        registry: registry.clone(),
        proxy: proxy.clone(),
        watch: (&config.watch).into(),
        reconcile: (&config.proxy).into(),
    };
    let openapi = Arc::new(OpenApi::new()?);
    let (stop, stopped) = watch::channel(false);

    let https_task = tokio::spawn(tls::serve(https, tls, app(state, openapi), stopped.clone()));
    let mut grpc_stopped = stopped.clone();
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HeartbeatService::new(registry.clone()).into_server())
            .serve_with_incoming_shutdown(
                TcpIncoming::from(grpc).with_nodelay(Some(true)),
                async move {
                    let _ = grpc_stopped.changed().await;
                },
            ),
    );
    let forget_task = tokio::spawn(proxy.forget_departed(registry.clone()));
    let sweep_task = tokio::spawn(sweep(registry, stopped));

    tracing::info!(api = %https_address, heartbeats = %grpc_address, "kplug standalone is serving");
    println!(
        "kplug is serving plugins.kplug.io on {} (heartbeats: grpc://{grpc_address})\n\n  export KUBECONFIG={}\n  kubectl get plugins\n",
        standalone::server_url(https_address),
        local.kubeconfig.display(),
    );

    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop.send(true);
    let _ = https_task.await;
    let _ = sweep_task.await;
    forget_task.abort();
    match grpc_task.await {
        Ok(result) => result.context("gRPC server")?,
        Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
    }
    Ok(())
}
