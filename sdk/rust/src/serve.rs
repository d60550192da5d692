//! Serving a [`Plugin`]: the gRPC server, health, heartbeats and shutdown.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1 as proto;
use kplug_proto::v1alpha1::plugin_server::{Plugin as PluginService, PluginServer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinError;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::heartbeat::{self, Heartbeater, Status};
use crate::{Config, Error, Outcome, Plugin, PluginInfo, Request, Severity};

/// Announced on the plugin's behalf: the SDK serves both RPCs and passes
/// `dry_run` through.
const CAPABILITIES: [&str; 3] = ["Reconcile", "Finalize", "DryRun"];
/// How long shutdown waits for the heartbeat loop to deregister. The loop
/// bounds its own deregistration; this only guards against a wedged task.
const DEREGISTER_WAIT: Duration = Duration::from_secs(5);
/// A call is cut off this much before the caller's deadline, so that
/// `DEADLINE_EXCEEDED` reaches the caller while it still listens, and
/// before tonic's own timer (which starts a moment earlier) answers
/// `CANCELLED` instead. A tenth of the timeout, within these bounds.
const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(2);
const MAX_DEADLINE_MARGIN: Duration = Duration::from_millis(20);
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
    heartbeater: Heartbeater,
    drain_timeout: Duration,
}

impl<P> fmt::Debug for Server<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("info", &self.info)
            .field("drain_timeout", &self.drain_timeout)
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
    /// capabilities `Reconcile`, `Finalize` and `DryRun` are added.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRegistryAddress`], [`Error::ReadRegistryCa`],
    /// [`Error::RegistryTls`] (e.g. an `https://` registry without a CA
    /// file), [`Error::Bind`] and [`Error::InvalidAdvertiseAddress`].
    pub async fn bind(plugin: P, mut info: PluginInfo, config: Config) -> Result<Self, Error> {
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
        heartbeat::endpoint(&config.registry, registry_ca.as_deref())?;
        let bind_error = |source| Error::Bind {
            address: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;

        let advertise = config
            .advertise
            .or_else(|| (!info.address.is_empty()).then(|| info.address.clone()));
        info.address = advertised_address(advertise.as_deref(), local_addr)?;
        if let Some(name) = config.name {
            info.name = name;
        }
        for capability in CAPABILITIES {
            if !info.capabilities.iter().any(|c| c == capability) {
                info.capabilities.push(capability.to_owned());
            }
        }
        let mut heartbeater = Heartbeater::new(config.registry, info.clone());
        if let Some(interval) = config.heartbeat_interval {
            heartbeater = heartbeater.interval(interval);
        }
        if let Some(path) = config.token_file {
            heartbeater = heartbeater.token_file(path);
        }
        if let Some(pem) = registry_ca {
            heartbeater = heartbeater.registry_ca(pem);
        }
        Ok(Self {
            plugin: Arc::new(plugin),
            listener,
            local_addr,
            info,
            heartbeater,
            drain_timeout: config.drain_timeout,
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

    /// Observes the heartbeats; see [`Heartbeater::status`].
    pub fn heartbeat_status(&self) -> watch::Receiver<Status> {
        self.heartbeater.status()
    }

    /// Serves the Plugin service and gRPC health, and heartbeats, until
    /// `shutdown` resolves. Then, in this order: stops heartbeating and
    /// deregisters, so kplug routes no new calls here; reports NOT_SERVING;
    /// stops accepting connections and lets in-flight calls finish within
    /// the drain timeout; returns.
    ///
    /// # Errors
    ///
    /// [`Error::Serve`] when the gRPC server fails, which also stops the
    /// heartbeats. Calls still running when the drain timeout passes are
    /// cancelled, which is not an error.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let span = info_span!("plugin", name = %self.info.name, address = %self.info.address);
        self.run_inner(shutdown).instrument(span).await
    }

    async fn run_inner(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let Self {
            plugin,
            listener,
            local_addr,
            info,
            heartbeater,
            drain_timeout,
        } = self;

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
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut server = AbortOnDropHandle::new(tokio::spawn(router.serve_with_incoming_shutdown(
            incoming,
            async {
                let _ = drained.await;
            },
        )));
        let (stop_heartbeats, heartbeats_stopped) = oneshot::channel::<()>();
        let mut heartbeats = AbortOnDropHandle::new(tokio::spawn(
            heartbeater
                .run(async {
                    let _ = heartbeats_stopped.await;
                })
                .in_current_span(),
        ));
        info!(%local_addr, address = %info.address, "serving");

        // Either task ending on its own is a failure; shutdown proceeds
        // without waiting for the one that ended.
        let mut shutdown = pin!(shutdown);
        let mut server_ended = None;
        let mut heartbeats_ended = None;
        tokio::select! {
            () = &mut shutdown => info!("deregistering, then draining in-flight calls"),
            ended = &mut server => server_ended = Some(ended),
            ended = &mut heartbeats => heartbeats_ended = Some(ended),
        }

        // Deregister first: kplug stops routing new calls here, while the
        // server still answers the ones already on their way.
        let heartbeat_result = match heartbeats_ended {
            Some(ended) => flatten(ended, |error| error),
            None => {
                let _ = stop_heartbeats.send(());
                match tokio::time::timeout(DEREGISTER_WAIT, &mut heartbeats).await {
                    Ok(ended) => flatten(ended, |error| error),
                    Err(_) => {
                        warn!("the heartbeat loop did not stop in time; abandoning it");
                        Ok(())
                    }
                }
            }
        };
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
        info!("stopped");
        server_result.and(heartbeat_result)
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

/// When a call reached the server, before its body was read: deadlines
/// count from here, as tonic's own timer does.
#[derive(Clone, Copy, Debug)]
struct Arrival(Instant);

/// Runs before the request body is decoded.
#[allow(clippy::result_large_err)] // tonic's interceptor signature
fn stamp_arrival(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    request.extensions_mut().insert(Arrival(Instant::now()));
    Ok(request)
}

#[derive(Clone, Copy, Debug)]
enum Operation {
    Reconcile,
    Finalize,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Reconcile => "Reconcile",
            Self::Finalize => "Finalize",
        }
    }
}

/// The generated gRPC service, calling the author's [`Plugin`].
struct Service<P> {
    plugin: Arc<P>,
    /// Turns true when shutdown gives up on the calls still running.
    cancelled: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl<P: Plugin> PluginService for Service<P> {
    async fn reconcile(
        &self,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<tonic::Response<proto::ReconcileResponse>, tonic::Status> {
        self.call(Operation::Reconcile, request)
            .await
            .map(tonic::Response::new)
    }

    async fn finalize(
        &self,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<tonic::Response<proto::ReconcileResponse>, tonic::Status> {
        self.call(Operation::Finalize, request)
            .await
            .map(tonic::Response::new)
    }
}

impl<P: Plugin> Service<P> {
    async fn call(
        &self,
        operation: Operation,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<proto::ReconcileResponse, tonic::Status> {
        let arrival = request
            .extensions()
            .get::<Arrival>()
            .map_or_else(Instant::now, |arrival| arrival.0);
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout);
        let trace_parent = trace_parent(request.metadata());
        let message = request.into_inner();
        let field = message
            .timeout
            .and_then(|timeout| Duration::try_from(timeout).ok());
        let timeout = shorter(header, field.filter(|t| !t.is_zero()));
        let deadline = timeout.and_then(|timeout| deadline(arrival, timeout));
        let mut request = decode(message, deadline)?;
        let ignored_trace_parent = match trace_parent {
            Ok(trace_parent) => {
                request.trace_parent = trace_parent;
                None
            }
            Err(reason) => Some(reason),
        };

        // Every line logged for the call, the plugin's own included, carries
        // the operation id and, when kplug sent one, the trace id.
        let span = info_span!(
            "call",
            operation = operation.as_str(),
            operation_id = %request.operation_id,
            trace_id = request
                .trace_parent
                .as_ref()
                .map(|trace_parent| tracing::field::display(trace_parent.trace_id())),
            object = request.name().unwrap_or_default(),
            dry_run = request.dry_run,
        );
        if let Some(reason) = ignored_trace_parent {
            debug!(parent: &span, %reason, "ignoring the traceparent metadata");
        }
        let plugin = Arc::clone(&self.plugin);
        // Its own task, so a panic unwinds that task only; dropped (on a
        // timeout or when the caller goes away), it cancels the call.
        let task = AbortOnDropHandle::new(tokio::spawn(
            async move {
                match operation {
                    Operation::Reconcile => plugin.reconcile(request).await,
                    Operation::Finalize => plugin.finalize(request).await,
                }
            }
            .instrument(span.clone()),
        ));
        let answer = async {
            match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, task).await.map_err(|_| {
                    let timeout = timeout.unwrap_or_default();
                    warn!(parent: &span, ?timeout, "deadline exceeded; cancelling the call");
                    tonic::Status::deadline_exceeded(format!(
                        "the plugin did not answer within the caller's timeout of {timeout:?}"
                    ))
                }),
                None => Ok(task.await),
            }
        };
        let mut cancelled = self.cancelled.clone();
        let joined = tokio::select! {
            answer = answer => answer?,
            _ = cancelled.wait_for(|cancelled| *cancelled) => {
                return Err(tonic::Status::unavailable(
                    "the plugin shut down before the call finished",
                ));
            }
        };
        let outcome = joined.map_err(|error| {
            if error.is_panic() {
                let message = panic_message(error.into_panic());
                warn!(parent: &span, panic = %message, "the plugin panicked");
                tonic::Status::internal(format!("plugin panicked: {message}"))
            } else {
                tonic::Status::unavailable("the plugin is shutting down")
            }
        })?;
        debug!(parent: &span, success = outcome.success, results = outcome.results.len(), "answered");
        encode(outcome)
    }
}

/// The call's `traceparent` metadata: `Ok(None)` without one, `Err` with
/// why when it is not a single valid W3C `traceparent`. Either way the call
/// goes ahead; only the trace id is missing from it.
fn trace_parent(metadata: &tonic::metadata::MetadataMap) -> Result<Option<TraceParent>, String> {
    let mut values = metadata.get_all(TRACEPARENT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        // What a combined header would be: invalid.
        return Err("more than one traceparent".to_owned());
    }
    let text = value
        .to_str()
        .map_err(|_| "traceparent is not visible ASCII".to_owned())?;
    text.parse()
        .map(Some)
        .map_err(|error: kplug_proto::trace::TraceParentError| error.to_string())
}

/// The shorter of two optional timeouts.
fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When to give up on a call that arrived at `arrival` with `timeout`;
/// `None` when that lies beyond what `Instant` can represent.
fn deadline(arrival: Instant, timeout: Duration) -> Option<Instant> {
    let margin = (timeout / 10).clamp(MIN_DEADLINE_MARGIN, MAX_DEADLINE_MARGIN);
    arrival.checked_add(timeout.saturating_sub(margin))
}

/// Parses a `grpc-timeout` header: up to 8 digits and a unit, e.g. `100m`.
fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    let (&unit, digits) = text.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Eight digits fit any unit below without overflow.
    let value: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(value * 3600),
        b'M' => Duration::from_secs(value * 60),
        b'S' => Duration::from_secs(value),
        b'm' => Duration::from_millis(value),
        b'u' => Duration::from_micros(value),
        b'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

/// The wire request as the author sees it; bad JSON is the caller's error,
/// so the plugin is never called with it.
fn decode(
    message: proto::ReconcileRequest,
    deadline: Option<Instant>,
) -> Result<Request, tonic::Status> {
    let object = json_object("object", &message.object)?;
    let extensions = message
        .extensions
        .iter()
        .enumerate()
        .map(|(i, bytes)| json_object(&format!("extensions[{i}]"), bytes))
        .collect::<Result<_, _>>()?;
    Ok(Request {
        operation_id: message.operation_id,
        trace_parent: None,
        dry_run: message.dry_run,
        object,
        extensions,
        deadline,
    })
}

fn json_object(what: &str, bytes: &[u8]) -> Result<Value, tonic::Status> {
    if bytes.is_empty() {
        return Err(tonic::Status::invalid_argument(format!(
            "{what} is empty; expected a Kubernetes object as JSON"
        )));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        tonic::Status::invalid_argument(format!("{what} is not valid JSON: {error}"))
    })?;
    if !value.is_object() {
        return Err(tonic::Status::invalid_argument(format!(
            "{what} must be a JSON object, not {}",
            json_kind(&value)
        )));
    }
    Ok(value)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The author's outcome on the wire.
fn encode(outcome: Outcome) -> Result<proto::ReconcileResponse, tonic::Status> {
    // Serializing a `Value` cannot fail (its keys are strings), but the
    // signature says it may, and a plugin must not panic over it.
    let json = |value: &Value| {
        serde_json::to_vec(value)
            .map_err(|error| tonic::Status::internal(format!("cannot encode a status: {error}")))
    };
    let extension_statuses = outcome
        .extension_statuses
        .iter()
        .map(|(reference, status)| {
            Ok(proto::ExtensionStatus {
                r#ref: Some(proto::ObjectReference {
                    api_version: reference.api_version.clone(),
                    kind: reference.kind.clone(),
                    namespace: reference.namespace.clone(),
                    name: reference.name.clone(),
                }),
                status: json(status)?,
            })
        })
        .collect::<Result<_, tonic::Status>>()?;
    Ok(proto::ReconcileResponse {
        success: outcome.success,
        results: outcome
            .results
            .into_iter()
            .map(|result| proto::Result {
                severity: match result.severity {
                    Severity::Normal => proto::Severity::Normal,
                    Severity::Warning => proto::Severity::Warning,
                    Severity::Error => proto::Severity::Error,
                }
                .into(),
                reason: result.reason,
                message: result.message,
            })
            .collect(),
        conditions: outcome
            .conditions
            .into_iter()
            .map(|condition| proto::Condition {
                r#type: condition.condition_type,
                status: condition.status.as_str().to_owned(),
                reason: condition.reason,
                message: condition.message,
            })
            .collect(),
        object_status: outcome
            .object_status
            .as_ref()
            .map(json)
            .transpose()?
            .unwrap_or_default(),
        extension_statuses,
        // Only durations beyond what protobuf can carry fail; asking for a
        // requeue that far away is asking for none.
        requeue_after: outcome
            .requeue_after
            .and_then(|after| prost_types::Duration::try_from(after).ok()),
    })
}

/// The text a panic was raised with, when it is text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_owned(), |&message| message.to_owned()),
    }
}

/// The `host:port` to declare: `given` with a missing or zero port replaced
/// by `bound`'s, or without `given`, `bound` itself with an unspecified IP
/// replaced by loopback.
fn advertised_address(given: Option<&str>, bound: SocketAddr) -> Result<String, Error> {
    let given = given.map(str::trim).filter(|given| !given.is_empty());
    let Some(given) = given else {
        let ip = match bound.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => return Ok(SocketAddr::new(ip, bound.port()).to_string()),
        };
        let address = SocketAddr::new(ip, bound.port()).to_string();
        warn!(
            listen = %bound,
            %address,
            "listening on all interfaces without an advertised address: declaring loopback, \
             which only a kplug on this host can reach; set --advertise (KPLUG_ADVERTISE)"
        );
        return Ok(address);
    };
    let invalid = |reason: &str| Error::InvalidAdvertiseAddress {
        address: given.to_owned(),
        reason: reason.to_owned(),
    };
    // `[v6]:port`, `[v6]`, `host:port`, `host`, or a bare IPv6 address.
    let (host, port) = if let Some(rest) = given.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("missing ] after the IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| invalid("expected :port after ]"))?,
            ),
        };
        (format!("[{ip}]"), port)
    } else if given.matches(':').count() > 1 {
        (format!("[{given}]"), None)
    } else {
        match given.split_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (given.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(invalid("missing host"));
    }
    let port = match port {
        None => 0,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| invalid("the port is not a number from 0 to 65535"))?,
    };
    let port = if port == 0 { bound.port() } else { port };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        for bad in ["", "S", "123456789S", "10x", "-1S", "1.5S", "10é", "é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn deadlines_leave_a_margin() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            Some(now + Duration::from_millis(980))
        );
        assert_eq!(
            deadline(now, Duration::from_millis(100)),
            Some(now + Duration::from_millis(90))
        );
        assert_eq!(deadline(now, Duration::from_millis(1)), Some(now));
        assert_eq!(deadline(now, Duration::MAX), None);
        assert_eq!(
            shorter(Some(Duration::from_secs(2)), Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            shorter(None, Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(shorter(None, None), None);
    }

    #[test]
    fn advertised_addresses() {
        let bound: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:4000".parse().unwrap();
        let any6: SocketAddr = "[::]:4000".parse().unwrap();
        let ok = |given, bound| advertised_address(given, bound).unwrap();
        assert_eq!(ok(None, bound), "127.0.0.1:4000");
        assert_eq!(ok(None, any), "127.0.0.1:4000");
        assert_eq!(ok(None, any6), "[::1]:4000");
        assert_eq!(ok(Some(""), bound), "127.0.0.1:4000");
        assert_eq!(ok(Some("svc.ns.svc:50052"), any), "svc.ns.svc:50052");
        assert_eq!(ok(Some("svc.ns.svc"), any), "svc.ns.svc:4000");
        assert_eq!(ok(Some("svc.ns.svc:0"), any), "svc.ns.svc:4000");
        assert_eq!(ok(Some("127.0.0.1:0"), bound), "127.0.0.1:4000");
        assert_eq!(ok(Some("[::1]:9"), bound), "[::1]:9");
        assert_eq!(ok(Some("[::1]"), bound), "[::1]:4000");
        assert_eq!(ok(Some("fd00::1"), bound), "[fd00::1]:4000");
        for bad in [":80", "host:x", "host:70000", "[::1", "[::1]x", "[]:80"] {
            assert!(
                matches!(
                    advertised_address(Some(bad), bound),
                    Err(Error::InvalidAdvertiseAddress { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn traceparent_metadata() {
        const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(trace_parent(&metadata), Ok(None));
        metadata.insert(TRACEPARENT, EXAMPLE.parse().unwrap());
        let parsed = trace_parent(&metadata).unwrap().unwrap();
        assert_eq!(parsed.to_string(), EXAMPLE);
        metadata.append(TRACEPARENT, EXAMPLE.parse().unwrap());
        assert_eq!(
            trace_parent(&metadata),
            Err("more than one traceparent".to_owned())
        );
        metadata.insert(TRACEPARENT, "00-nope".parse().unwrap());
        assert!(
            trace_parent(&metadata)
                .unwrap_err()
                .contains("lowercase hex")
        );
        metadata.insert(
            TRACEPARENT,
            tonic::metadata::MetadataValue::try_from(&b"00-\xff"[..]).unwrap(),
        );
        assert!(trace_parent(&metadata).is_err());
    }

    #[test]
    fn panic_messages() {
        assert_eq!(panic_message(Box::new("static")), "static");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(42)), "(no message)");
    }

    #[test]
    fn rejects_what_is_not_a_json_object() {
        let bad = |object: &[u8]| {
            let message = proto::ReconcileRequest {
                object: object.to_vec(),
                ..Default::default()
            };
            let status = decode(message, None).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert!(bad(b"").contains("empty"));
        assert!(bad(b"{").contains("not valid JSON"));
        assert!(bad(b"[1]").contains("not an array"));
        assert!(bad(b"null").contains("not null"));

        let message = proto::ReconcileRequest {
            object: b"{}".to_vec(),
            extensions: vec![b"{}".to_vec(), b"7".to_vec()],
            ..Default::default()
        };
        let status = decode(message, None).unwrap_err();
        assert_eq!(
            status.message(),
            "extensions[1] must be a JSON object, not a number"
        );
    }
}
