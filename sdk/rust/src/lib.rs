//! Write [kplug](https://github.com/kplug/kplug) plugins in Rust.
//!
//! A plugin is a small gRPC server that kplug calls to reconcile a custom
//! resource. Implement [`Plugin`] and hand it to [`serve`]: the SDK runs the
//! gRPC server (with gRPC health), announces the plugin to kplug's registry
//! by heartbeating, and on SIGTERM deregisters before draining in-flight
//! calls.
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
//! - `--token-file` (`KPLUG_TOKEN_FILE`): the ServiceAccount token, e.g. a
//!   projected token volume, sent as `authorization: Bearer <token>` with
//!   every heartbeat and the deregistration. It is reread every time, as
//!   the kubelet rotates it; a missing or unreadable file is logged and the
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
//! [`Heartbeater`] alone keeps a registration alive for programs that serve
//! the gRPC contract ([`proto`]) themselves; its
//! [`token_file`](Heartbeater::token_file) and
//! [`registry_ca`](Heartbeater::registry_ca) do the same.

mod config;
mod error;
pub mod heartbeat;
mod info;
mod plugin;
mod serve;
mod signal;

pub use config::{Config, DEFAULT_DRAIN_TIMEOUT, DEFAULT_LISTEN, parse_duration};
pub use error::Error;
pub use heartbeat::{Heartbeater, Status};
pub use info::{ApiRef, Extension, PluginInfo};
/// The generated gRPC contract, for plugins that need more than the SDK wraps.
pub use kplug_proto as proto;
/// The W3C trace context a call came with; see [`Request::trace_parent`].
pub use kplug_proto::trace::{TRACEPARENT, TraceParent, TraceParentError};
pub use plugin::{
    Condition, ConditionStatus, ObjectRef, Outcome, Plugin, Request, ResultEntry, Severity,
};
pub use serve::{Server, serve, serve_with_shutdown};
pub use signal::shutdown_signal;

/// Where kplug's registry listens when run locally.
pub const DEFAULT_REGISTRY: &str = "http://127.0.0.1:50051";

/// The environment variable conventionally holding the registry address.
pub const REGISTRY_ENV: &str = "KPLUG_REGISTRY";

/// This SDK's name and version, as announced to the registry.
pub const SDK: &str = concat!("kplug-sdk-rust/", env!("CARGO_PKG_VERSION"));
