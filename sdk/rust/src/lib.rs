//! Write [kplug](https://github.com/kplug/kplug) plugins in Rust.
//!
//! A plugin is a small gRPC server that kplug calls to reconcile a custom
//! resource. It announces itself by heartbeating into kplug's registry;
//! [`Heartbeater`] does that, retrying through registry outages and
//! deregistering on shutdown:
//!
//! ```no_run
//! use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), kplug_sdk::Error> {
//!     let api: ApiRef = "greetings.example.com/v1".parse()?;
//!     let info = PluginInfo::new("hello", api)
//!         .version(env!("CARGO_PKG_VERSION"))
//!         .implementation("Hello")
//!         .address("127.0.0.1:50052");
//!     Heartbeater::new(kplug_sdk::DEFAULT_REGISTRY, info)
//!         .run(kplug_sdk::shutdown_signal()?)
//!         .await
//! }
//! ```

mod error;
pub mod heartbeat;
mod info;
mod signal;

pub use error::Error;
pub use heartbeat::{Heartbeater, Outcome, Status};
pub use info::{ApiRef, Extension, PluginInfo};
/// The generated gRPC contract, for plugins that need more than the SDK wraps.
pub use kplug_proto as proto;
pub use signal::shutdown_signal;

/// Where kplug's registry listens when run locally.
pub const DEFAULT_REGISTRY: &str = "http://127.0.0.1:50051";

/// The environment variable conventionally holding the registry address.
pub const REGISTRY_ENV: &str = "KPLUG_REGISTRY";

/// This SDK's name and version, as announced to the registry.
pub const SDK: &str = concat!("kplug-sdk-rust/", env!("CARGO_PKG_VERSION"));
