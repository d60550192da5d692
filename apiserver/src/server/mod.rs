//! Wiring: listeners, TLS, background tasks and shutdown.

pub mod certs;
pub mod health;
pub mod pki;
pub mod serving_cert;
pub mod standalone;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::api::metrics::{InstrumentLayer, RequestMetrics};
use crate::api::status::ApiError;
use crate::api::{self, AppState, openapi::OpenApi};
use crate::auth::Auth;
use crate::auth::delegated::Delegated;
use crate::auth::verifier::{optional_client_auth, roots};
use crate::config::{ClusterConfig, StandaloneConfig, Tuning};
use crate::heartbeat::{HeartbeatMetrics, HeartbeatService};
use crate::proxy::{Proxy, ProxyMetrics};
use crate::registry::{Registry, RegistryCollector};
use serving_cert::ServingCert;

/// How often expired registrations are collected. Well under the shortest
/// allowed interval, so expiry is late by at most this much.
const SWEEP_PERIOD: Duration = Duration::from_millis(250);

/// The HTTP application: probes open to all, the API and `/metrics` behind
/// authentication and authorization, every request counted.
pub fn app(state: AppState, openapi: Arc<OpenApi>, auth: Arc<Auth>, metrics: &Metrics) -> Router {
    let api = api::router(state, openapi, metrics.registry.clone())
        .layer(axum::middleware::from_fn_with_state(auth, guard));
    health::router()
        .merge(api)
        .layer(InstrumentLayer::new(metrics.requests.clone()))
}

/// Middleware: answers `401`/`403` Statuses, or passes the request on with
/// its [`crate::auth::User`]. It lives here, at the edge, so that `auth` decides
/// and `api::status` words the answer without either knowing the other.
async fn guard(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    match auth.check(&parts).await {
        Ok(user) => {
            parts.extensions.insert(Arc::new(user));
            next.run(Request::from_parts(parts, body)).await
        }
        Err(error) => ApiError::from(error).into_response(),
    }
}

/// Every metric family, and the request metrics the HTTP layer updates.
pub struct Metrics {
    registry: Arc<prometheus_client::registry::Registry>,
    requests: RequestMetrics,
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
    use tokio::signal::unix::{SignalKind, signal};
    let ctrl_c = tokio::signal::ctrl_c();
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

async fn bind(address: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the {what} address {address}"))
}

/// The parts both modes share.
struct Core {
    registry: Arc<Registry>,
    proxy: Arc<Proxy>,
    state: AppState,
    openapi: Arc<OpenApi>,
    metrics: Metrics,
    heartbeat_metrics: HeartbeatMetrics,
}

impl Core {
    /// `metrics` may hold families of the caller's parts already.
    fn new(
        tuning: &Tuning,
        mut metrics: prometheus_client::registry::Registry,
    ) -> anyhow::Result<Self> {
        let registry = Arc::new(Registry::new((&tuning.registry).into()));
        let requests = RequestMetrics::default();
        requests.register(&mut metrics);
        let heartbeat_metrics = HeartbeatMetrics::default();
        heartbeat_metrics.register(&mut metrics);
        let proxy_metrics = ProxyMetrics::default();
        proxy_metrics.register(&mut metrics);
        metrics.register_collector(Box::new(RegistryCollector(registry.clone())));
        kubert_prometheus_process::register(metrics.sub_registry_with_prefix("process"))
            .context("registering process metrics")?;
        let proxy = Arc::new(Proxy::new((&tuning.proxy).into()).with_metrics(proxy_metrics));
        let state = AppState {
            registry: registry.clone(),
            proxy: proxy.clone(),
            watch: (&tuning.watch).into(),
            reconcile: (&tuning.proxy).into(),
        };
        Ok(Self {
            registry,
            proxy,
            state,
            openapi: Arc::new(OpenApi::new()?),
            metrics: Metrics {
                registry: Arc::new(metrics),
                requests,
            },
            heartbeat_metrics,
        })
    }

    /// Serves until SIGINT or SIGTERM. `grpc` serves heartbeats; the
    /// registry's background tasks run alongside.
    async fn run(
        self,
        https: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        auth: Arc<Auth>,
        grpc: impl FnOnce(watch::Receiver<bool>) -> tokio::task::JoinHandle<anyhow::Result<()>>,
        stop: watch::Sender<bool>,
    ) -> anyhow::Result<()> {
        let stopped = stop.subscribe();
        let app = app(self.state, self.openapi, auth.clone(), &self.metrics);
        let https_task = tokio::spawn(tls::serve(https, tls, app, auth, stopped.clone()));
        let grpc_task = grpc(stopped.clone());
        let forget_task = tokio::spawn(self.proxy.forget_departed(self.registry.clone()));
        let sweep_task = tokio::spawn(sweep(self.registry, stopped));

        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop.send(true);
        let _ = https_task.await;
        let _ = sweep_task.await;
        forget_task.abort();
        match grpc_task.await {
            Ok(result) => result.context("gRPC server"),
            Err(e) => Err(anyhow::anyhow!("gRPC server task failed: {e}")),
        }
    }
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
    let cert = Arc::new(ServingCert::fixed(&local.serving.cert, &local.serving.key)?);
    let tls = tls::server_config(cert, optional_client_auth(roots(&local.ca_pem)?))?;
    let core = Core::new(&config.tuning, Default::default())?;
    // Heartbeats are plain gRPC, trusted: standalone mode is for one machine.
    let heartbeats = HeartbeatService::new(core.registry.clone(), None)
        .with_metrics(core.heartbeat_metrics.clone())
        .into_server();
    let grpc_server = move |mut stopped: watch::Receiver<bool>| {
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(heartbeats)
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(grpc).with_nodelay(Some(true)),
                    async move {
                        let _ = stopped.changed().await;
                    },
                )
                .await
                .map_err(anyhow::Error::from)
        })
    };

    tracing::info!(api = %https_address, heartbeats = %grpc_address, "kplug standalone is serving");
    println!(
        "kplug is serving plugins.kplug.io on {} (heartbeats: grpc://{grpc_address})\n\n  export KUBECONFIG={}\n  kubectl get plugins\n",
        standalone::server_url(https_address),
        local.kubeconfig.display(),
    );
    let (stop, _) = watch::channel(false);
    core.run(https, tls, Arc::new(Auth::Standalone), grpc_server, stop)
        .await
}

async fn kube_client(config: &ClusterConfig) -> anyhow::Result<kube::Client> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig and no in-cluster or $KUBECONFIG configuration")?,
    };
    Ok(kube::Client::try_from(kube_config)?)
}

/// Runs cluster mode until SIGINT or SIGTERM.
pub async fn run_cluster(config: ClusterConfig) -> anyhow::Result<()> {
    let cert = Arc::new(
        ServingCert::from_files(
            config.tls_cert_file.clone(),
            config.tls_private_key_file.clone(),
        )
        .context("loading the serving certificate")?,
    );
    let client = kube_client(&config).await?;
    let delegated = Arc::new(Delegated::new(client, (&config).into()));
    delegated.load().await;
    let https = bind(config.listen, "HTTPS").await?;
    let grpc = bind(config.grpc_listen, "gRPC").await?;
    let (https_address, grpc_address) = (https.local_addr()?, grpc.local_addr()?);

    let tls = tls::server_config(cert.clone(), delegated.tls_verifier())?;
    // Plugins authenticate with bearer tokens, not certificates.
    let grpc_tls = tls::server_config(cert.clone(), WebPkiClientVerifier::no_client_auth())?;
    let mut metrics = prometheus_client::registry::Registry::default();
    delegated.metrics().register(&mut metrics);
    let core = Core::new(&config.tuning, metrics)?;
    let auth = Arc::new(Auth::Delegated(delegated.clone()));
    let heartbeats = tonic::service::Routes::new(
        HeartbeatService::new(core.registry.clone(), Some(delegated.clone()))
            .with_metrics(core.heartbeat_metrics.clone())
            .into_server(),
    )
    .into_axum_router();
    let grpc_auth = auth.clone();
    let grpc_server = move |stopped: watch::Receiver<bool>| {
        tokio::spawn(async move {
            tls::serve(grpc, grpc_tls, heartbeats, grpc_auth, stopped).await;
            Ok(())
        })
    };
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(delegated.follow());
    tokio::spawn(cert.follow(config.cert_reload_interval, stopped));

    tracing::info!(api = %https_address, heartbeats = %grpc_address, "kplug is serving");
    core.run(https, tls, auth, grpc_server, stop).await
}
