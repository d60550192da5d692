//! Wiring: listeners, TLS, background tasks and shutdown.

mod busy;
pub mod certs;
mod corked;
mod early_answer;
pub mod front_door;
pub mod health;
pub mod pki;
pub mod pki_plugins;
pub mod serving_cert;
pub mod standalone;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::metrics::{InstrumentLayer, RequestMetrics};
use crate::api::reconcile::ObjectAccess;
use crate::api::status::ApiError;
use crate::api::timing::Authenticated;
use crate::api::{self, AppState, openapi::OpenApi};
use crate::audit::AuditLog;
use crate::auth::Auth;
use crate::auth::delegated::Delegated;
use crate::auth::resources::Resources;
use crate::auth::verifier::{optional_client_auth, roots};
use crate::config::{ClusterConfig, PluginTlsPlan, StandaloneConfig, Tuning};
use crate::heartbeat::{HeartbeatMetrics, HeartbeatService};
use crate::identity::Signer;
use crate::proxy::{PluginTls, PluginTlsSource, Proxy, ProxyMetrics};
use crate::registry::{Registry, RegistryCollector};
use crate::stored::StoredObjects;
use crate::trust::{self, TrustBundle};
use early_answer::DrainLimits;
use front_door::{Callers, ConnectionMetrics, Door, Limits};
use serving_cert::ServingCert;

/// How often expired registrations are collected. Well under the shortest
/// allowed interval, so expiry is late by at most this much.
const SWEEP_PERIOD: Duration = Duration::from_millis(250);

/// The HTTP application: probes open to all, the API and `/metrics` behind
/// authentication and authorization, every request counted, and the unread
/// rest of a body refused early drained (see [`early_answer`]).
/// `/readyz` fails until `warmup` has passed and once `stopping` turns true
/// (see [`health::router`]).
pub fn app(
    state: AppState,
    openapi: Arc<OpenApi>,
    auth: Arc<Auth>,
    metrics: &Metrics,
    warmup: Duration,
    stopping: watch::Receiver<bool>,
) -> Router {
    let drain = DrainLimits {
        max_bytes: early_answer::DRAIN_MAX_BYTES,
        timeout: early_answer::DRAIN_TIMEOUT,
    };
    let api = api::router(state, openapi, metrics.registry.clone())
        .layer(axum::middleware::from_fn_with_state(auth, guard));
    health::router(warmup, stopping)
        .merge(api)
        .layer(InstrumentLayer::new(metrics.requests.clone()))
        .layer(axum::middleware::from_fn_with_state(
            drain,
            early_answer::drain_unread,
        ))
}

/// Middleware: answers `401`/`403` Statuses, or passes the request on with
/// its [`crate::auth::User`]. It lives here, at the edge, so that `auth` decides
/// and `api::status` words the answer without either knowing the other.
/// How long the check took goes along too, for the answer's
/// `Server-Timing` ([`api::timing`]).
async fn guard(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let started = Instant::now();
    match auth.check(&parts).await {
        Ok(user) => {
            let at = Instant::now();
            parts.extensions.insert(Arc::new(user));
            parts.extensions.insert(Authenticated {
                took: at.saturating_duration_since(started),
                at,
            });
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

/// Raises the soft limit on open files to the hard one, as Go programs
/// (kube-apiserver among them) do at start: the default soft limit (often
/// 1024) would otherwise fail `accept` well before `--max-connections`.
fn raise_open_files_limit(limits: &Limits) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        limit.current = Some(maximum);
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the open files limit");
        }
    }
    // Two listeners, plus files, plugins and kube-apiserver.
    let wanted = 2 * limits.max_connections as u64 + 256;
    if let Some(current) = getrlimit(Resource::Nofile).current
        && current < wanted
    {
        tracing::warn!(
            open_files_limit = current,
            max_connections = limits.max_connections,
            "the open files limit is below what --max-connections on both listeners needs: accepting fails first"
        );
    }
}

/// The parts both modes share.
struct Core {
    registry: Arc<Registry>,
    proxy: Arc<Proxy>,
    state: AppState,
    openapi: Arc<OpenApi>,
    metrics: Metrics,
    heartbeat_metrics: HeartbeatMetrics,
    connections: ConnectionMetrics,
    limits: Limits,
    /// How long after start `/readyz` still fails (cluster mode).
    readiness_warmup: Duration,
    /// After SIGTERM, how long everything is still served (cluster mode).
    shutdown_delay: Duration,
    /// Turns true when connections are to close: watches end.
    closing: watch::Sender<bool>,
}

impl Core {
    /// `metrics` may hold families of the caller's parts already; plugins
    /// are dialed with `plugin_tls`, in plaintext without.
    fn new(
        tuning: &Tuning,
        mut metrics: prometheus_client::registry::Registry,
        plugin_tls: Option<Arc<PluginTls>>,
    ) -> anyhow::Result<Self> {
        let registry = Arc::new(Registry::new((&tuning.registry).into()));
        let audit = AuditLog::start(&tuning.audit_log_path)
            .with_context(|| format!("opening the audit log {:?}", tuning.audit_log_path))?;
        audit.register(&mut metrics);
        let requests = RequestMetrics::default();
        requests.register(&mut metrics);
        let heartbeat_metrics = HeartbeatMetrics::default();
        heartbeat_metrics.register(&mut metrics);
        let proxy_metrics = ProxyMetrics::default();
        proxy_metrics.register(&mut metrics);
        let connections = ConnectionMetrics::default();
        connections.register(&mut metrics);
        metrics.register_collector(Box::new(RegistryCollector(registry.clone())));
        kubert_prometheus_process::register(metrics.sub_registry_with_prefix("process"))
            .context("registering process metrics")?;
        let proxy = Arc::new(
            Proxy::new((&tuning.proxy).into())
                .with_metrics(proxy_metrics)
                .with_tls(plugin_tls),
        );
        let (closing, closed) = watch::channel(false);
        let state = AppState {
            registry: registry.clone(),
            proxy: proxy.clone(),
            watch: (&tuning.watch).into(),
            reconcile: (&tuning.proxy).into(),
            shadow: crate::api::reconcile::ShadowRunner::start()
                .context("starting the thread of shadow copies")?,
            closing: closed,
            object_access: None,
            stored: None,
            audit: Some(Arc::new(audit)),
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
            connections,
            limits: (&tuning.serving).into(),
            readiness_warmup: Duration::ZERO,
            shutdown_delay: Duration::ZERO,
            closing,
        })
    }

    /// Serves the API on `https` and heartbeats through `heartbeats` until
    /// SIGINT or SIGTERM; the registry's background tasks run alongside.
    ///
    /// Shutting down: `/readyz` fails at once, everything is still served
    /// for the shutdown delay (a pod being deleted leaves its Service's
    /// endpoints while kube-proxy and the aggregator's open connections
    /// still send it requests), then the listeners stop accepting, watches
    /// end and every connection closes gracefully, requests in progress
    /// finishing within `--shutdown-timeout`.
    async fn run(
        self,
        https: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        auth: Arc<Auth>,
        heartbeats: Door,
        stop: watch::Sender<bool>,
    ) -> anyhow::Result<()> {
        raise_open_files_limit(&self.limits);
        let stopped = stop.subscribe();
        let (stopping, not_ready) = watch::channel(false);
        let api = Door {
            name: "api",
            listener: https,
            callers: Callers::Clients,
            tls: Some(tls),
            app: app(
                self.state,
                self.openapi,
                auth.clone(),
                &self.metrics,
                self.readiness_warmup,
                not_ready,
            ),
        };
        let serve = |door| {
            tokio::spawn(front_door::serve(
                door,
                auth.clone(),
                self.limits,
                self.connections.clone(),
                stopped.clone(),
            ))
        };
        let api_task = serve(api);
        let heartbeats_task = serve(heartbeats);
        let forget_task = tokio::spawn(self.proxy.forget_departed(self.registry.clone()));
        let sweep_task = tokio::spawn(sweep(self.registry, stopped.clone()));

        shutdown_signal().await;
        let _ = stopping.send(true);
        if !self.shutdown_delay.is_zero() {
            tracing::info!(
                delay = ?self.shutdown_delay,
                "shutting down: not ready, still serving for the shutdown delay"
            );
            tokio::time::sleep(self.shutdown_delay).await;
        }
        tracing::info!(
            timeout = ?self.limits.shutdown_timeout,
            "shutting down: closing connections, requests in progress finish, watches end"
        );
        let _ = self.closing.send(true);
        let _ = stop.send(true);
        let _ = api_task.await;
        let _ = sweep_task.await;
        forget_task.abort();
        heartbeats_task
            .await
            .map_err(|e| anyhow::anyhow!("the heartbeat listener failed: {e}"))
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
    let core = Core::new(&config.tuning, Default::default(), None)?;
    // Heartbeats are plain gRPC (h2c), trusted: standalone mode is for one machine.
    let heartbeats = Door {
        name: "heartbeats",
        listener: grpc,
        callers: Callers::Fleet,
        tls: None,
        app: tonic::service::Routes::new(
            HeartbeatService::new(core.registry.clone(), None)
                .with_closing(core.state.closing.clone())
                .with_metrics(core.heartbeat_metrics.clone())
                .into_server(),
        )
        .into_axum_router(),
    };

    tracing::info!(api = %https_address, heartbeats = %grpc_address, "kplug standalone is serving");
    println!(
        "kplug is serving plugins.kplug.io on {} (heartbeats: grpc://{grpc_address})\n\n  export KUBECONFIG={}\n  kubectl get plugins\n",
        standalone::server_url(https_address),
        local.kubeconfig.display(),
    );
    let (stop, _) = watch::channel(false);
    core.run(https, tls, Arc::new(Auth::Standalone), heartbeats, stop)
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
    let (plugin_tls_source, signer) = match config.plugin_tls.plan().map_err(anyhow::Error::msg)? {
        None => (None, None),
        Some(PluginTlsPlan::Files(files)) => (Some(PluginTlsSource::Files(files)), None),
        Some(PluginTlsPlan::Signing { files, lifetime }) => {
            let signer =
                Arc::new(Signer::load(files, lifetime).context("loading kplug's plugin CA")?);
            (Some(PluginTlsSource::Signer(signer.clone())), Some(signer))
        }
    };
    let plugin_tls = PluginTls::start(plugin_tls_source).context("loading the plugin TLS files")?;
    let trust_bundle = match &config.registry_trust_bundle_file {
        Some(path) => Some(Arc::new(
            TrustBundle::load(path.clone()).context("loading the registry trust bundle")?,
        )),
        None => None,
    };
    let client = kube_client(&config).await?;
    let delegated = Arc::new(Delegated::new(client.clone(), (&config).into()));
    delegated.load().await;
    let https = bind(config.listen, "HTTPS").await?;
    let grpc = bind(config.grpc_listen, "gRPC").await?;
    let (https_address, grpc_address) = (https.local_addr()?, grpc.local_addr()?);

    let tls = tls::server_config(cert.clone(), delegated.tls_verifier())?;
    // Plugins authenticate with bearer tokens, not certificates.
    let grpc_tls = tls::server_config(cert.clone(), WebPkiClientVerifier::no_client_auth())?;
    let mut metrics = prometheus_client::registry::Registry::default();
    delegated.metrics().register(&mut metrics);
    let mut core = Core::new(&config.tuning, metrics, plugin_tls.clone())?;
    core.state.object_access = Some(Arc::new(ObjectAccess::new(
        delegated.clone(),
        Resources::new(client.clone(), config.authorization_denied_cache_ttl),
    )));
    core.state.stored = Some(Arc::new(StoredObjects::new(client.clone())));
    core.readiness_warmup = config.readiness_warmup;
    core.shutdown_delay = config.shutdown_delay;
    let auth = Arc::new(Auth::Delegated(delegated.clone()));
    let heartbeats = Door {
        name: "heartbeats",
        listener: grpc,
        callers: Callers::Fleet,
        tls: Some(grpc_tls),
        app: tonic::service::Routes::new(
            HeartbeatService::new(core.registry.clone(), Some(delegated.clone()))
                .with_closing(core.state.closing.clone())
                .with_token_audience(&config.plugin_token_audience)
                .with_signer(signer)
                .with_metrics(core.heartbeat_metrics.clone())
                .into_server(),
        )
        .into_axum_router(),
    };
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(delegated.follow());
    tokio::spawn(cert.follow(config.cert_reload_interval, stopped.clone()));
    if let Some(plugin_tls) = plugin_tls {
        tokio::spawn(plugin_tls.follow(config.cert_reload_interval, stopped.clone()));
    }
    if let Some(bundle) = trust_bundle {
        let reloaded = bundle.clone();
        tokio::spawn(serving_cert::reload_every(
            config.cert_reload_interval,
            stopped.clone(),
            move || reloaded.reload(),
            || {
                tracing::info!(
                    "registry trust bundle reloaded: applying it to every labelled namespace"
                )
            },
            |e| tracing::error!(error = %e, "registry trust bundle changed but does not load; keeping the current one"),
        ));
        tokio::spawn(trust::run(client, bundle, stopped));
    }

    tracing::info!(api = %https_address, heartbeats = %grpc_address, "kplug is serving");
    core.run(https, tls, auth, heartbeats, stop).await
}
