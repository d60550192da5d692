//! Serving a [`Plugin`]: the gRPC server, health, heartbeats and shutdown.
//!
//! Inside, `service` is the gRPC service that calls the author's plugin,
//! `wire` converts between protobuf messages and the author's types,
//! `deadline` works out when a call must give up, `address` settles the
//! address the plugin declares, and `tls` serves TLS from files that may
//! change. `wire`, `deadline` and `address` are pure.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use kplug_proto::v1alpha1::plugin_server::PluginServer;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinError;
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::heartbeat::{self, Heartbeater, Outcome, Status};
use crate::identity::IssuedIdentity;
use crate::{Config, Error, Plugin, PluginInfo};
use address::advertised_address;
use service::{Service, stamp_arrival};
use tls::{FileTls, ServingTls, TlsFiles, issued_identity};

mod address;
mod deadline;
mod service;
pub(crate) mod tls;
mod wire;

/// Announced on the plugin's behalf: the SDK serves both RPCs and passes
/// `dry_run` through.
const CAPABILITIES: [&str; 3] = ["Reconcile", "Finalize", "DryRun"];
/// How long shutdown waits for the heartbeats to deregister. Each bounds its
/// own deregistration; this only guards against a wedged task.
const DEREGISTER_WAIT: Duration = Duration::from_secs(5);
/// The gRPC name under which health reports the Plugin service.
const SERVICE_NAME: &str = "kplug.v1alpha1.Plugin";
/// After the drain timeout, how long cancelled calls get to send their
/// answer before the server is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Serves `plugin` until SIGINT or SIGTERM, then shuts down gracefully; see
/// [`Server::run`].
///
/// ```no_run
/// # struct Hello;
/// # impl kplug_sdk::Plugin for Hello {
/// #     async fn reconcile(&self, _: kplug_sdk::Request) -> kplug_sdk::Outcome { kplug_sdk::Outcome::success() }
/// #     async fn finalize(&self, _: kplug_sdk::Request) -> kplug_sdk::Outcome { kplug_sdk::Outcome::success() }
/// # }
/// use kplug_sdk::{ApiRef, Config, PluginInfo};
///
/// #[tokio::main]
/// async fn main() -> Result<(), kplug_sdk::Error> {
///     let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
///         .version(env!("CARGO_PKG_VERSION"))
///         .implementation("Hello");
///     kplug_sdk::serve(Hello, info, Config::default()).await
/// }
/// ```
///
/// # Errors
///
/// See [`Server::bind`] and [`Server::run`]; also [`Error::Signal`].
pub async fn serve<P: Plugin>(plugin: P, info: PluginInfo, config: Config) -> Result<(), Error> {
    // Installed before binding, so a signal during startup is not lost.
    let shutdown = crate::shutdown_signal()?;
    serve_with_shutdown(plugin, info, config, shutdown).await
}

/// Serves `plugin` until `shutdown` resolves, then shuts down gracefully;
/// see [`Server::run`]. For tests and for plugins with their own notion of
/// when to stop.
///
/// # Errors
///
/// See [`Server::bind`] and [`Server::run`].
pub async fn serve_with_shutdown<P: Plugin>(
    plugin: P,
    info: PluginInfo,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    Server::bind(plugin, info, config)
        .await?
        .run(shutdown)
        .await
}

/// A plugin bound to its address, ready to [`run`](Self::run).
///
/// [`serve`] does both steps; separately they let a caller learn the bound
/// port (listening on port 0) before serving.
pub struct Server<P> {
    plugin: Arc<P>,
    listener: TcpListener,
    local_addr: SocketAddr,
    info: PluginInfo,
    instance: String,
    announce: Announce,
    drain_timeout: Duration,
    tls: Option<Arc<ServingTls>>,
    identity: Option<Arc<IssuedIdentity>>,
}

impl<P> fmt::Debug for Server<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("info", &self.info)
            .field("instance", &self.instance)
            .field("drain_timeout", &self.drain_timeout)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl<P: Plugin> Server<P> {
    /// Binds `config.listen` and settles what the plugin will declare.
    ///
    /// The declared name is `config.name`, else `info.name`. The declared
    /// address is `config.advertise`, else `info.address`, else the
    /// listening address (with an unspecified IP such as `0.0.0.0` replaced
    /// by loopback, which only kplug on the same host can reach). A missing
    /// port or port 0 in it becomes the port actually bound. The
    /// capabilities `Reconcile`, `DryRun` and (unless
    /// [`PluginInfo::without_finalize`]) `Finalize` are added. The
    /// instance is `config.instance`, else [`heartbeat::default_instance`].
    ///
    /// With `config.tls_cert_file`, the certificate, key and client CA are
    /// read and checked here; see [`Config`] for TLS.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRegistryAddress`], [`Error::ReadRegistryCa`],
    /// [`Error::RegistryTls`] (e.g. an `https://` registry without a CA
    /// file), [`Error::ServeTls`] and [`Error::ReadTlsFile`] (e.g. a
    /// certificate without a client CA), [`Error::Bind`] and
    /// [`Error::InvalidAdvertiseAddress`].
    pub async fn bind(plugin: P, mut info: PluginInfo, config: Config) -> Result<Self, Error> {
        if let Some(path) = config.local_address_file.clone() {
            return Self::bind_local(plugin, info, config, path).await;
        }
        // Checked before binding: a plugin that cannot heartbeat is useless.
        let registry_ca = match &config.registry_ca_file {
            Some(path) => {
                Some(
                    tokio::fs::read(path)
                        .await
                        .map_err(|source| Error::ReadRegistryCa {
                            path: path.clone(),
                            source,
                        })?,
                )
            }
            None => None,
        };
        heartbeat::Target::parse(&config.registry, registry_ca.as_deref())?;
        let identity = if issued_identity(&config)? {
            let name = config.name.as_deref().unwrap_or(&info.name);
            Some(Arc::new(IssuedIdentity::new(name)?))
        } else {
            None
        };
        let files = TlsFiles::from_config(&config)?;
        let tls = match (files, &identity) {
            (Some(files), _) => Some(Arc::new(ServingTls::Files(Box::new(
                FileTls::load(files).await?,
            )))),
            (None, Some(identity)) => Some(Arc::new(ServingTls::Issued(identity.subscribe()))),
            (None, None) => None,
        };
        let (listener, local_addr) = listen(config.listen).await?;
        let advertise = config
            .advertise
            .or_else(|| (!info.address.is_empty()).then(|| info.address.clone()));
        info.address = advertised_address(advertise.as_deref(), local_addr)?;
        declare(&mut info, config.name);
        let instance = config.instance.unwrap_or_else(heartbeat::default_instance);
        let mut heartbeater = Heartbeater::new(config.registry, info.clone())
            .instance(instance.clone())
            .server_name(config.server_name.unwrap_or_default());
        if let Some(interval) = config.heartbeat_interval {
            heartbeater = heartbeater.interval(interval);
        }
        if let Some(percent) = config.canary_weight {
            heartbeater = heartbeater.canary_weight(percent);
        }
        if let Some(percent) = config.shadow {
            heartbeater = heartbeater.shadow_percent(percent);
        }
        if let Some(path) = config.token_file {
            heartbeater = heartbeater.token_file(path);
        }
        if let Some(pem) = registry_ca {
            heartbeater = heartbeater.registry_ca(pem);
        }
        if let Some(identity) = &identity {
            heartbeater = heartbeater.identity(Arc::clone(identity));
        }
        Ok(Self {
            plugin: Arc::new(plugin),
            listener,
            local_addr,
            info,
            instance,
            announce: Announce::Registry(Box::new(heartbeater)),
            drain_timeout: config.drain_timeout,
            tls,
            identity,
        })
    }

    /// [`bind`](Self::bind) for `config.local_address_file`: no registry,
    /// no TLS; [`run`](Self::run) writes the address to `path` before it
    /// serves.
    async fn bind_local(
        plugin: P,
        mut info: PluginInfo,
        config: Config,
        path: PathBuf,
    ) -> Result<Self, Error> {
        let (listener, local_addr) = listen(config.listen).await?;
        info.address = advertised_address(None, local_addr)?;
        declare(&mut info, config.name);
        Ok(Self {
            plugin: Arc::new(plugin),
            listener,
            local_addr,
            info,
            instance: String::new(),
            announce: Announce::LocalFile(path),
            drain_timeout: config.drain_timeout,
            tls: None,
            identity: None,
        })
    }

    /// The address the server listens on, with the real port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The declaration the heartbeats carry, including the advertised
    /// address.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The instance the heartbeats name; empty when the address does.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Observes the heartbeats; see [`Heartbeater::status`]. Serving
    /// locally ([`Config::local_address_file`]) there are none: the status
    /// stays empty.
    pub fn heartbeat_status(&self) -> watch::Receiver<Status> {
        match &self.announce {
            Announce::Registry(heartbeater) => heartbeater.status(),
            Announce::LocalFile(_) => watch::channel(Status::default()).1,
        }
    }

    /// Serves the Plugin service and gRPC health, and heartbeats, until
    /// `shutdown` resolves. Then, in this order, so that no call is lost
    /// when one of several instances stops:
    ///
    /// 1. tells every kplug replica that this instance is draining, so that
    ///    kplug sends it no new calls (within
    ///    [`DRAIN_NOTICE_TIMEOUT`](heartbeat::DRAIN_NOTICE_TIMEOUT), so a
    ///    kplug that is down does not hold shutdown up); a kplug without the
    ///    `Instances` capability is deregistered from instead. Calls that
    ///    arrive meanwhile are served;
    /// 2. reports NOT_SERVING, stops accepting connections (closing the
    ///    port) and lets in-flight calls finish within the drain timeout;
    /// 3. deregisters the instance;
    /// 4. returns.
    ///
    /// # Errors
    ///
    /// [`Error::Serve`] when the gRPC server fails, which also stops the
    /// heartbeats; [`Error::WriteLocalAddress`] when serving locally and the
    /// address file cannot be written. Calls still running when the drain
    /// timeout passes are cancelled, which is not an error.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let span = info_span!(
            "plugin",
            name = %self.info.name,
            address = %self.info.address,
            instance = %self.instance,
        );
        self.run_inner(shutdown).instrument(span).await
    }

    async fn run_inner(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let Self {
            plugin,
            listener,
            local_addr,
            info,
            instance: _,
            announce,
            drain_timeout,
            tls,
            identity,
        } = self;

        // Before serving: once the address is there, calls are answered
        // (the port is bound, and connections wait in its backlog).
        if let Announce::LocalFile(path) = &announce {
            write_address(path, local_addr).await?;
        }
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(SERVICE_NAME, ServingStatus::Serving)
            .await;
        let (cancel_calls, cancelled) = watch::channel(false);
        let service = PluginServer::with_interceptor(Service { plugin, cancelled }, stamp_arrival);
        let (drain, drained) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(service);
        // Tonic drops the incoming connections, closing the port, when
        // `drained` fires.
        let stop_accepting = async {
            let _ = drained.await;
        };
        let mut server = AbortOnDropHandle::new(match &tls {
            None => {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stop_accepting))
            }
            Some(tls) => {
                let incoming = tls::incoming(listener, Arc::clone(tls));
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stop_accepting))
            }
        });
        let (heartbeat_status, mut heartbeats) = match announce {
            Announce::Registry(heartbeater) => (heartbeater.status(), Some(heartbeater.start()?)),
            Announce::LocalFile(path) => {
                info!(file = %path.display(), "serving locally, without kplug: no heartbeats");
                (watch::channel(Status::default()).1, None)
            }
        };
        info!(
            %local_addr,
            address = %info.address,
            tls = tls.is_some(),
            client_certificates = tls.as_ref().is_some_and(|tls| tls.verifies_clients()),
            "serving"
        );

        // Either task ending on its own is a failure; shutdown proceeds
        // without waiting for the one that ended.
        let mut shutdown = pin!(shutdown);
        let mut server_ended = None;
        let mut heartbeats_ended = None;
        let mut refused = None;
        tokio::select! {
            () = &mut shutdown => match heartbeats {
                Some(_) => info!(
                    "shutting down: telling kplug, then draining in-flight calls, then deregistering"
                ),
                None => info!("shutting down: draining in-flight calls"),
            },
            ended = &mut server => server_ended = Some(ended),
            ended = ended(heartbeats.as_mut()) => heartbeats_ended = Some(ended),
            error = identity_refused(identity.as_deref(), heartbeat_status) => {
                warn!(%error, "stopping: the plugin cannot serve without its certificate");
                refused = Some(error);
            }
        }

        // Draining first: kplug stops routing new calls here, while the
        // server still answers those already on their way.
        if let Some(heartbeats) = heartbeats
            .as_mut()
            .filter(|_| server_ended.is_none() && heartbeats_ended.is_none())
        {
            heartbeats.drain().await;
        }
        for name in [SERVICE_NAME, ""] {
            health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }

        let server_result = match server_ended {
            Some(ended) => flatten(ended, Error::Serve),
            None => {
                let _ = drain.send(());
                debug!(timeout = ?drain_timeout, "draining in-flight calls");
                match tokio::time::timeout(drain_timeout, &mut server).await {
                    Ok(ended) => flatten(ended, Error::Serve),
                    Err(_) => {
                        warn!(timeout = ?drain_timeout, "in-flight calls did not finish in time; cancelling them");
                        // Cancelled calls answer UNAVAILABLE, which lets
                        // their connections, and so the server, finish.
                        cancel_calls.send_replace(true);
                        match tokio::time::timeout(CANCEL_GRACE, &mut server).await {
                            Ok(ended) => flatten(ended, Error::Serve),
                            Err(_) => Ok(()),
                        }
                    }
                }
            }
        };

        // Deregistering last: nothing is left for kplug to call.
        let heartbeat_result = match (heartbeats_ended, heartbeats) {
            (Some(ended), _) => ended,
            (None, None) => Ok(()),
            (None, Some(heartbeats)) => {
                match tokio::time::timeout(DEREGISTER_WAIT, heartbeats.stop()).await {
                    Ok(stopped) => stopped,
                    Err(_) => {
                        warn!("the heartbeats did not stop in time; abandoning them");
                        Ok(())
                    }
                }
            }
        };
        info!("stopped");
        match refused {
            Some(error) => Err(error),
            None => server_result.and(heartbeat_result),
        }
    }
}

/// How the plugin makes itself known.
enum Announce {
    /// Heartbeats to kplug's registry.
    Registry(Box<Heartbeater>),
    /// The listening address, written to this file (`kubectl kplug render`).
    LocalFile(PathBuf),
}

/// Binds `address`; returns the listener and the address it got.
async fn listen(address: SocketAddr) -> Result<(TcpListener, SocketAddr), Error> {
    let bind_error = |source| Error::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local_addr))
}

/// Completes the declaration: the configured name, and the capabilities
/// the SDK serves (`Finalize` unless the plugin does without it).
fn declare(info: &mut PluginInfo, name: Option<String>) {
    if let Some(name) = name {
        info.name = name;
    }
    let without_finalize = info.without_finalize;
    let served = CAPABILITIES
        .into_iter()
        .filter(|c| !(without_finalize && *c == "Finalize"));
    for capability in served {
        if !info.capabilities.iter().any(|c| c == capability) {
            info.capabilities.push(capability.to_owned());
        }
    }
}

/// Writes `address` to `path` whole: to a file beside it, then renamed, so
/// that a reader never sees half of it.
async fn write_address(path: &Path, address: SocketAddr) -> Result<(), Error> {
    let error = |source| Error::WriteLocalAddress {
        path: path.to_owned(),
        source,
    };
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    tokio::fs::write(&partial, address.to_string())
        .await
        .map_err(error)?;
    tokio::fs::rename(&partial, path).await.map_err(error)
}

/// The heartbeats' end; never, when there are none.
async fn ended(heartbeats: Option<&mut heartbeat::Heartbeats>) -> Result<(), Error> {
    match heartbeats {
        Some(heartbeats) => heartbeats.ended().await,
        None => std::future::pending().await,
    }
}

/// A task's outcome as the SDK's error: `wrap` for the task's own error,
/// [`Error::Task`] for a panic.
fn flatten<T, E>(
    ended: Result<Result<T, E>, JoinError>,
    wrap: impl FnOnce(E) -> Error,
) -> Result<(), Error> {
    match ended {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(wrap(error)),
        Err(error) => Err(Error::Task(error)),
    }
}
/// kplug's refusal of the issued identity's certificate request, when it
/// comes before the first certificate: INVALID_ARGUMENT (the request) or
/// FAILED_PRECONDITION (a kplug that signs nothing) will not change by
/// retrying, and without a certificate no call can be served, so the plugin
/// stops and says why. Never resolves otherwise.
async fn identity_refused(
    identity: Option<&IssuedIdentity>,
    mut status: watch::Receiver<Status>,
) -> Error {
    let Some(identity) = identity else {
        return std::future::pending().await;
    };
    let mut held = identity.subscribe();
    loop {
        if held.borrow_and_update().is_some() {
            return std::future::pending().await;
        }
        if let Some(Outcome::Failed {
            code: Code::InvalidArgument | Code::FailedPrecondition,
            message,
        }) = &status.borrow_and_update().last
        {
            return Error::ServeTls {
                reason: format!("kplug refused the plugin's certificate request: {message}"),
            };
        }
        tokio::select! {
            changed = status.changed() => if changed.is_err() {
                return std::future::pending().await;
            },
            _ = held.changed() => {}
        }
    }
}
