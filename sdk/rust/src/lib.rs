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
//! [`Heartbeater`] alone keeps a registration alive for programs that serve
//! the gRPC contract ([`proto`]) themselves.

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
