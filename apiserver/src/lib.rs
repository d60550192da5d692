//! kplug's aggregated API server.
//!
//! Data flows one way: a request is authenticated ([`auth`]), handled by the
//! HTTP surface ([`api`]), which reads the live [`registry`]; plugins fill
//! the registry through the gRPC [`heartbeat`] ingest. [`server`] wires TLS,
//! listeners and background tasks together.

pub mod api;
pub mod audit;
pub mod auth;
pub mod config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod heartbeat;
pub mod identity;
mod kube_words;
pub mod proxy;
pub mod registry;
pub mod server;
pub mod stored;
pub mod trust;
pub use kplug_api::{v1alpha1, version};
