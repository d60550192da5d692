//! Write [kplug](https://github.com/kplug/kplug) plugins in Rust.
//!
//! A plugin is a small gRPC server that kplug calls to reconcile a custom
//! resource. Implement [`Plugin`] and hand it to [`serve`]: the SDK runs the
//! gRPC server (with gRPC health), announces the plugin to kplug's registry
//! (every replica of it) by heartbeating, and on SIGTERM tells kplug to
//! send no new calls, finishes the ones in flight, then deregisters; see
//! [`Server::run`].
//!
//! ```no_run
//! use kplug_sdk::{ApiRef, Config, Outcome, Plugin, PluginInfo, Request, Severity};
//! use serde_json::json;
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     async fn reconcile(&self, request: Request) -> Outcome {
//!         let greeting = format!("hello, {}", request.name().unwrap_or("world"));
//!         Outcome::success()
//!             .result(Severity::Normal, "Greeted", &greeting)
//!             .object_status(json!({ "greeting": greeting }))
//!     }
//!
//!     async fn finalize(&self, _request: Request) -> Outcome {
//!         Outcome::success().result(Severity::Normal, "Goodbye", "nothing to clean up")
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), kplug_sdk::Error> {
//!     let api: ApiRef = "greetings.example.com/v1".parse()?;
//!     let info = PluginInfo::new("hello", api)
//!         .version(env!("CARGO_PKG_VERSION"))
//!         .implementation("Hello");
//!     // Listens on 127.0.0.1:50052 and heartbeats to http://127.0.0.1:50051;
//!     // see `Config` for the flags and environment variables that change it.
//!     kplug_sdk::serve(Hello, info, Config::default()).await
//! }
//! ```
//!
//! # Trace context: the trace id of a call
//!
//! kplug sends every Reconcile and Finalize with the W3C trace context as
//! gRPC metadata (`traceparent`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`), the same
//! trace id that kplug and the operator that asked for the reconcile log.
//! The SDK parses it into [`Request::trace_parent`];
//! [`Request::trace_id`] gives the id as 32 hex digits. Missing or invalid
//! metadata gives `None` and never fails the call.
//!
//! The call runs inside a `tracing` span named `call` with the fields
//! `operation`, `operation_id`, `trace_id` (only when kplug sent one),
//! `object` and `dry_run`, so with a subscriber that prints span fields
//! (`tracing_subscriber::fmt()` does by default) every line the SDK and the
//! plugin log during the call carries the ids:
//!
//! ```text
//! INFO call{operation="Reconcile" operation_id=0f5c… trace_id=4bf92f3577b34da6a3ce929d0e0e4736 object="ada" dry_run=false}: hello_plugin: greeting …
//! ```
//!
//! ```
//! use kplug_sdk::{Outcome, Plugin, Request};
//! use serde_json::json;
//!
//! struct Traced;
//!
//! impl Plugin for Traced {
//!     async fn reconcile(&self, request: Request) -> Outcome {
//!         // Inside the call's span: this line carries trace_id and operation_id.
//!         tracing::info!(name = request.name(), "reconciling");
//!         let mut status = json!({ "operationID": request.operation_id() });
//!         if let Some(trace_id) = request.trace_id() {
//!             status["traceID"] = trace_id.into();
//!         }
//!         Outcome::success().object_status(status)
//!     }
//!
//!     async fn finalize(&self, _request: Request) -> Outcome {
//!         Outcome::success()
//!     }
//! }
//! ```
//!
//! Tasks the plugin spawns leave the span unless they take it along
//! (`tokio::spawn(work.in_current_span())` with [`tracing::Instrument`]). To
//! continue the trace in calls of its own, a plugin sends
//! [`TraceParent::child`] of [`Request::trace_parent`] as their
//! `traceparent`.
//!
//! A subscriber that writes to stderr should not report its own failed
//! writes there (`tracing_subscriber::fmt().log_internal_errors(false)`, as
//! the examples set it): its default reports them with `eprintln!`, which
//! panics the task that was logging, a call among them, once whatever read
//! the plugin's stderr has gone.
//!
//! # Heartbeating into kplug in cluster mode
//!
//! kplug's standalone registry takes plain gRPC (`http://`) from anyone on
//! loopback. In cluster mode (`kplug-apiserver serve`) the registry serves
//! gRPC over TLS with kplug's serving certificate and accepts a heartbeat
//! only with a Kubernetes ServiceAccount token whose identity may `create`
//! `plugins/heartbeat` for the plugin's name. Two [`Config`] options cover
//! it:
//!
//! - `--registry-ca-file` (`KPLUG_REGISTRY_CA_FILE`): the PEM of the CA that
//!   signed kplug's serving certificate, e.g. the `kplug-ca` ConfigMap
//!   mounted into the pod. Required for an `https://` registry, which is
//!   verified against it and nothing else; without it the plugin fails at
//!   start with [`Error::RegistryTls`].
//! - `--token-file` (`KPLUG_TOKEN_FILE`): the ServiceAccount token, a
//!   projected token volume for the audience `plugins.kplug.io` (kplug
//!   refuses tokens for other audiences), sent as `authorization: Bearer <token>` with
//!   every heartbeat and the deregistration. It is reread every time, as
//!   the kubelet rotates it (a new token opens a new heartbeat stream,
//!   see [`heartbeat`]); a missing or unreadable file is logged and the
//!   heartbeat goes out without a token.
//!
//! ```text
//! KPLUG_REGISTRY=https://kplug.kplug-system.svc:8444
//! KPLUG_REGISTRY_CA_FILE=/var/run/kplug/ca/ca.crt
//! KPLUG_TOKEN_FILE=/var/run/secrets/kplug/token
//! ```
//!
//! kplug answers a missing or invalid token with `UNAUTHENTICATED` and an
//! identity without the RBAC permission with `PERMISSION_DENIED`. The SDK
//! logs either at warn ("kplug refused the heartbeat: …", with kplug's
//! explanation), records it in [`Status`] as a refusal and retries at the
//! heartbeat interval, so a plugin recovers by itself once its RoleBinding
//! or token appears.
//!
//! # Several instances of a plugin
//!
//! A plugin may run as several pods. Each heartbeats under the plugin's
//! name with its own instance name and address, and kplug spreads calls
//! over the ready ones. The instance name is `--instance`
//! (`KPLUG_INSTANCE`), by default the `POD_NAME` environment variable, else
//! none: the address names it ([`default_instance`]); the address should be the pod's
//! own, so that kplug reaches this instance rather than any behind a
//! Service. With the downward API:
//!
//! ```yaml
//! env:
//!   - name: POD_NAME
//!     valueFrom: {fieldRef: {fieldPath: metadata.name}}
//!   - name: POD_IP
//!     valueFrom: {fieldRef: {fieldPath: status.podIP}}
//!   - name: KPLUG_LISTEN
//!     value: 0.0.0.0:50052
//!   - name: KPLUG_ADVERTISE
//!     value: $(POD_IP):50052
//! ```
//!
//! When such a pod stops, no call is lost: on SIGTERM the SDK first tells
//! every kplug replica that the instance is draining (a heartbeat with
//! `draining` set, bounded by
//! [`DRAIN_NOTICE_TIMEOUT`](heartbeat::DRAIN_NOTICE_TIMEOUT) so a kplug that
//! is down does not hold shutdown up) and keeps serving the calls that
//! still arrive; then it stops accepting connections and lets the calls in
//! flight finish (`--drain-timeout`); then it deregisters. kplug routes new
//! calls to the other instances meanwhile. A kplug from before instances
//! (without the `Instances` capability) ignores the instance fields; the SDK
//! deregisters from it first instead, as it always did.
//!
//! kplug itself may run as several replicas, each with its own registry:
//! point `--registry` at a name that resolves to all of them (a headless
//! Service) and the SDK heartbeats to each, following the name as replicas
//! come and go; see [`heartbeat`].
//!
//! # Canary releases
//!
//! A plugin's next version can take part of its objects first: run it as a
//! second Deployment under the same plugin name with `--canary-weight 10`
//! (`KPLUG_CANARY_WEIGHT`). kplug sends that percentage of the plugin's
//! objects to it, each object always to the same side, and withdraws it
//! (its instances stop getting calls, the Plugin's `Canary` condition says
//! why) when it fails or misses its deadline clearly more often than the
//! other instances; promoting it is rolling the stable Deployment to its
//! version. See the book's "Upgrade plugins" (docs/src/guides/upgrade-plugins.md).
//!
//! # Shadows
//!
//! A candidate version can instead see live traffic without serving it:
//! with `--shadow` (`KPLUG_SHADOW`, optionally a percentage) under the same
//! plugin name, it receives a copy of the plugin's reconciles with
//! [`Request::dry_run`] set, after another instance answered the caller,
//! and `kubectl kplug shadow NAME` shows where its answers differ. A
//! plugin that honours `dry_run` (changes nothing, reports what it would
//! do) is safe to run as a shadow.
//!
//! # Serving TLS to kplug (mutual TLS)
//!
//! By default a plugin serves plain gRPC. With `--tls-cert-file`,
//! `--tls-key-file` and `--client-ca-file` it serves TLS and accepts only
//! callers presenting a certificate signed by the client CA (kplug's
//! client certificate); the files are read again when they change, so
//! certificates renewed by cert-manager or the kubelet need no restart.
//! `--server-name` tells kplug which name to verify in the certificate when
//! it differs from the advertised host, e.g. a Service name while the pod's
//! IP is advertised. A certificate without a client CA is refused at start
//! unless `--allow-unauthenticated-clients` says so. See [`Config`].
//!
//! ```text
//! KPLUG_TLS_CERT_FILE=/var/run/tls/tls.crt
//! KPLUG_TLS_KEY_FILE=/var/run/tls/tls.key
//! KPLUG_CLIENT_CA_FILE=/var/run/kplug/client-ca/ca.crt
//! KPLUG_SERVER_NAME=hello.plugins.svc
//! ```
//!
//! kubelet gRPC probes cannot present a client certificate: with mutual
//! TLS, probe the port with a TCP probe instead.
//!
//! [`Heartbeater`] alone keeps a registration alive for programs that serve
//! the gRPC contract ([`proto`]) themselves; its
//! [`token_file`](Heartbeater::token_file) and
//! [`registry_ca`](Heartbeater::registry_ca) do the same, and
//! [`Heartbeater::start`] gives them the draining step of the shutdown
//! order.

mod children;
mod config;
mod error;
pub mod heartbeat;
mod identity;
mod info;
mod plugin;
mod serve;
mod signal;

pub use children::{Child, ChildError};
pub use config::{Config, DEFAULT_DRAIN_TIMEOUT, DEFAULT_LISTEN, parse_duration};
pub use error::Error;
pub use heartbeat::{Heartbeater, Status, default_instance};
pub use info::{ApiRef, Extension, PluginInfo};
/// The generated gRPC contract, for plugins that need more than the SDK wraps.
pub use kplug_proto as proto;
/// The W3C trace context a call came with; see [`Request::trace_parent`].
pub use kplug_proto::trace::{TRACEPARENT, TraceParent, TraceParentError};
pub use plugin::{
    Caller, Condition, ConditionStatus, ObjectRef, Outcome, Plugin, Request, ResultEntry, Severity,
};
pub use serve::{Server, serve, serve_with_shutdown};
pub use signal::shutdown_signal;

/// Where kplug's registry listens when run locally.
pub const DEFAULT_REGISTRY: &str = "http://127.0.0.1:50051";

/// The environment variable conventionally holding the registry address.
pub const REGISTRY_ENV: &str = "KPLUG_REGISTRY";

/// This SDK's name and version, as announced to the registry.
pub const SDK: &str = concat!("kplug-sdk-rust/", env!("CARGO_PKG_VERSION"));
