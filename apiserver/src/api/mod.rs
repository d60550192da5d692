//! The HTTP surface: Kubernetes API endpoints for `plugins.kplug.io`.

pub mod discovery;
pub mod negotiate;
pub mod openapi;
pub mod plugins;
pub mod selector;
pub mod status;
pub mod table;
pub mod watcher;
