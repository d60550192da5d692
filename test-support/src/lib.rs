//! The one harness kplug's integration tests and benches share: real
//! processes (the workspace's binaries, kubectl, curl, openssl), a real
//! control plane from `hack/control-plane.sh`, kplug in standalone and in
//! cluster mode, plugins, and private PostgreSQL and MariaDB servers.
//!
//! Tests want a failure to stop them with a clear message, so everything
//! here panics, naming what failed and, where it helps, how to fix it (for
//! example which setup script to run). Whatever starts a process returns a
//! value that stops it on drop, so neither a failing test nor a bench that
//! returns an error leaves processes behind.
//!
//! The benches' measurements ([`measure`]: CPU and memory from `/proc`,
//! latency percentiles) and their Markdown ([`report`]) return errors
//! instead, which a bench reports from `main`.

pub mod audit;
pub mod bench_mode;
mod control_plane;
mod credentials;
mod curl;
pub mod database_table;
pub mod hostile;
pub mod in_cluster;
mod kplug;
mod kube_client;
mod kubectl;
pub mod mariadb;
pub mod measure;
pub mod metrics;
pub mod plot;
mod plugin_certs;
mod plugins;
pub mod postgres;
mod process;
mod registry;
pub mod report;
pub mod required;
pub mod server_timing;
mod service;
mod standalone;
mod widgets;
mod workspace;

pub use control_plane::ControlPlane;
pub use credentials::{client_cert, expired_token};
pub use kplug::{AggregatedKplug, FAST_REVIEWS, Installation};
pub use kube_client::{kube_client, kube_client_without_retries, plugins_resource};
pub use kubectl::{KUBECTL, kubectl_of, kubectls};
pub use plugin_certs::{
    GREETING, PluginCerts, PluginTlsFlags, call_plugin_directly, hello_plugin_tls,
    kplug_with_plugin_tls, plugin_address, reconcile, refused_in_tls_handshake, replace_file,
    tls_verdict,
};
pub use plugins::{
    greeting_reconcile, hello_plugin, hello_plugin_command, plugin_identity, plugin_tls,
    wait_plugin_ready,
};
pub use process::{Lines, Process, free_port, output_text, wait_until};
pub use registry::{BlockingRegistry, heartbeat_request, plugin_instances};
pub use service::Service;
pub use standalone::StandaloneKplug;
pub use widgets::widget_crd;
pub use workspace::{repo_root, target_binary, workspace_binary};
