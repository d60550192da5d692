//! Command line and configuration, parsed by clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::WatchSettings;
use crate::api::reconcile::ReconcileSettings;
use crate::auth::delegated::DelegatedSettings;
use crate::proxy::ProxyConfig;
use crate::registry::RegistryConfig;

/// kplug's aggregated API server: a live registry of plugins served as
/// `plugins.kplug.io/v1alpha1`.
#[derive(Debug, Parser)]
#[command(name = "kplug-apiserver", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log filter, as in RUST_LOG (e.g. "info,kplug_apiserver=debug").
    #[arg(long, global = true, env = "KPLUG_LOG", default_value = "info")]
    pub log: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run on this machine without a cluster: makes its own CA, serving and
    /// admin certificates and a kubeconfig for kubectl.
    Standalone(StandaloneConfig),
    /// Run as an aggregated API server of a cluster: delegated
    /// authentication and authorization, authenticated heartbeats.
    Serve(ClusterConfig),
    /// Make a CA and a serving certificate for the APIService and print the caBundle.
    Certs(CertsConfig),
}

/// Configuration of standalone mode.
#[derive(Debug, Args)]
pub struct StandaloneConfig {
    /// Where certificates and the kubeconfig live. Default:
    /// $XDG_STATE_HOME/kplug, else ~/.local/state/kplug.
    #[arg(long, env = "KPLUG_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// HTTPS address of the Kubernetes API (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// gRPC address plugins heartbeat to (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub grpc_listen: SocketAddr,
    #[command(flatten)]
    pub tuning: Tuning,
}

/// Configuration of cluster mode.
#[derive(Debug, Args)]
pub struct ClusterConfig {
    /// HTTPS address of the Kubernetes API (the APIService's Service points here).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// gRPC (TLS) address plugins heartbeat to.
    #[arg(long, default_value = "0.0.0.0:8444")]
    pub grpc_listen: SocketAddr,
    /// Serving certificate (PEM); reloaded when it changes.
    #[arg(long)]
    pub tls_cert_file: PathBuf,
    /// Serving key (PEM); reloaded when it changes.
    #[arg(long)]
    pub tls_private_key_file: PathBuf,
    /// How often the certificate files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cert_reload_interval: Duration,
    /// kubeconfig for talking to kube-apiserver; default: in-cluster, or $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How long TokenReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_allowed_cache_ttl: Duration,
    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_denied_cache_ttl: Duration,
    #[command(flatten)]
    pub tuning: Tuning,
}

impl From<&ClusterConfig> for DelegatedSettings {
    fn from(config: &ClusterConfig) -> Self {
        Self {
            token_ttl: config.authentication_cache_ttl,
            allowed_ttl: config.authorization_allowed_cache_ttl,
            denied_ttl: config.authorization_denied_cache_ttl,
            ..Self::default()
        }
    }
}

/// What `kplug-apiserver certs` makes.
#[derive(Debug, Args)]
pub struct CertsConfig {
    /// The Service in front of kplug (the APIService's spec.service.name).
    #[arg(long, default_value = "kplug")]
    pub service: String,
    /// Its namespace.
    #[arg(long, default_value = "kplug-system")]
    pub namespace: String,
    /// Where ca.crt, ca.key, tls.crt and tls.key are written.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// An existing CA certificate to sign with (rotating the serving certificate only).
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The existing CA's key.
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Validity of the serving certificate, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

/// Tunables both modes share.
#[derive(Debug, Args)]
pub struct Tuning {
    #[command(flatten)]
    pub registry: RegistryFlags,
    #[command(flatten)]
    pub watch: WatchFlags,
    #[command(flatten)]
    pub proxy: ProxyFlags,
}

impl StandaloneConfig {
    /// The state directory, with its default resolved.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state"))
            })
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("kplug")
    }
}

/// Registry tunables.
#[derive(Debug, Args)]
pub struct RegistryFlags {
    /// Garbage-collect a plugin after this many missed heartbeat intervals.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub ttl_intervals: u32,
    /// Shortest heartbeat interval a plugin may ask for.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub min_heartbeat_interval: Duration,
    /// Longest heartbeat interval a plugin may ask for.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub max_heartbeat_interval: Duration,
    /// Interval for plugins that ask for none.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub default_heartbeat_interval: Duration,
    /// An unchanged heartbeat rewrites status.lastHeartbeatTime (one
    /// MODIFIED event) only this often.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub status_refresh_interval: Duration,
    /// How many recent changes a watch can resume from.
    #[arg(long, default_value_t = 10_000)]
    pub watch_history: usize,
}

impl From<&RegistryFlags> for RegistryConfig {
    fn from(flags: &RegistryFlags) -> Self {
        Self {
            ttl_intervals: flags.ttl_intervals,
            min_interval: flags.min_heartbeat_interval,
            max_interval: flags
                .max_heartbeat_interval
                .max(flags.min_heartbeat_interval),
            default_interval: flags.default_heartbeat_interval,
            status_refresh: flags.status_refresh_interval,
            history: flags.watch_history,
        }
    }
}

/// Watch tunables.
#[derive(Debug, Args)]
pub struct WatchFlags {
    /// How often watches that allow bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub watch_bookmark_interval: Duration,
    /// Timeout of watches that set no timeoutSeconds.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub watch_default_timeout: Duration,
}

impl From<&WatchFlags> for WatchSettings {
    fn from(flags: &WatchFlags) -> Self {
        Self {
            default_timeout: flags.watch_default_timeout,
            bookmark_interval: flags.watch_bookmark_interval,
            ..Self::default()
        }
    }
}

/// Reconcile proxy tunables.
#[derive(Debug, Args)]
pub struct ProxyFlags {
    /// Calls in flight to one plugin beyond which requests get 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_inflight_per_plugin: u32,
    /// Deadline of a reconcile that sets no spec.timeoutSeconds.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub reconcile_timeout: Duration,
    /// The largest spec.timeoutSeconds accepted.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub max_reconcile_timeout: Duration,
    /// Largest reconcile request body, in bytes (413 beyond).
    #[arg(long, default_value_t = 3 << 20)]
    pub max_request_bytes: usize,
}

impl From<&ProxyFlags> for ProxyConfig {
    fn from(flags: &ProxyFlags) -> Self {
        Self {
            max_in_flight: flags.max_inflight_per_plugin as usize,
            // Room for the JSON object plus the answer's statuses.
            max_message_bytes: flags.max_request_bytes + (1 << 20),
            ..Self::default()
        }
    }
}

impl From<&ProxyFlags> for ReconcileSettings {
    fn from(flags: &ProxyFlags) -> Self {
        Self {
            default_timeout: flags.reconcile_timeout.min(flags.max_reconcile_timeout),
            max_timeout: flags.max_reconcile_timeout,
            max_body_bytes: flags.max_request_bytes,
        }
    }
}

/// Go-style durations ("250ms", "5s", "2m", "1h30m"), as kube-apiserver's
/// flags take them; shared with the operator and the SDK.
pub use kplug_proto::duration::parse as parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5d").is_err());
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn cli_parses_the_documented_command_line() {
        let cli = Cli::try_parse_from([
            "kplug-apiserver",
            "standalone",
            "--state-dir",
            "/tmp/x",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
        ]);
        assert!(cli.is_ok(), "{cli:?}");
    }

    #[test]
    fn serve_requires_the_serving_certificate() {
        assert!(Cli::try_parse_from(["kplug-apiserver", "serve"]).is_err());
        let cli = Cli::try_parse_from([
            "kplug-apiserver",
            "serve",
            "--tls-cert-file",
            "/c",
            "--tls-private-key-file",
            "/k",
        ]);
        assert!(cli.is_ok(), "{cli:?}");
    }
}
