//! Command line and configuration, parsed by clap.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::WatchSettings;
use crate::api::reconcile::ReconcileSettings;
use crate::audit::Sink;
use crate::auth::delegated::DelegatedSettings;
use crate::identity::SigningFiles;
use crate::proxy::{PluginTlsFiles, ProxyConfig};
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

// Parsed once at start and moved into the server: boxing the large
// variant would save nothing that matters.
#[allow(clippy::large_enum_variant)]
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
    /// Make the certificates of mutual TLS between kplug and plugins: a
    /// plugin CA, kplug's client certificate, plugins' serving certificates.
    PluginCerts(PluginCertsConfig),
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
    /// The audience plugins' heartbeat tokens must be issued for (projected
    /// ServiceAccount tokens with this audience); their TokenReviews ask for
    /// it alone. Empty: tokens for kube-apiserver's own audiences, which
    /// kplug could then replay to kube-apiserver.
    #[arg(long, default_value = kplug_proto::v1alpha1::TOKEN_AUDIENCE)]
    pub plugin_token_audience: String,
    /// How long TokenReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_allowed_cache_ttl: Duration,
    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_denied_cache_ttl: Duration,
    /// Authenticated bearer tokens kept in the cache; the least useful go
    /// first when it is full. Rejected tokens have a small cache of their
    /// own, so a flood of bad tokens cannot push real users out.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub authentication_cache_size: u64,
    /// Allowed SubjectAccessReview answers kept in the cache; denied answers
    /// have a cache of the same size of their own.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub authorization_cache_size: u64,
    /// How long after start /readyz still fails. A new replica's registry
    /// is empty until every plugin has found it (the SDKs re-resolve the
    /// registry's headless Service every 30 s) and heartbeated to it; until
    /// then its Service must not send it requests. 0 disables.
    #[arg(long, default_value = "45s", value_parser = parse_duration)]
    pub readiness_warmup: Duration,
    /// After SIGTERM, how long kplug goes on serving everything, new
    /// connections included, while /readyz fails: time for the pod to
    /// leave the Service's endpoints and for kube-proxy to stop sending it
    /// connections. Then it closes its connections gracefully (see
    /// --shutdown-timeout). 0 closes them at once.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    #[command(flatten)]
    pub plugin_tls: PluginTlsFlags,
    /// The CA certificate(s) (PEM) that plugins need to verify kplug's
    /// registry endpoint: the CA of --tls-cert-file. kplug keeps them in a
    /// ConfigMap kplug-trust (key ca.crt) in every namespace labelled
    /// plugins.kplug.io/trust=enabled, for the plugins' registry CA file.
    /// Reloaded when it changes. Unset: no ConfigMaps are kept.
    #[arg(long)]
    pub registry_trust_bundle_file: Option<PathBuf>,
    #[command(flatten)]
    pub tuning: Tuning,
}

impl From<&ClusterConfig> for DelegatedSettings {
    fn from(config: &ClusterConfig) -> Self {
        Self {
            token_ttl: config.authentication_cache_ttl,
            allowed_ttl: config.authorization_allowed_cache_ttl,
            denied_ttl: config.authorization_denied_cache_ttl,
            token_cache_size: config.authentication_cache_size,
            decision_cache_size: config.authorization_cache_size,
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

/// How kplug dials plugins in cluster mode. (Standalone mode dials them
/// in plaintext: it is for one machine, plugins on loopback.)
///
/// Either kplug holds the plugin CA (--plugin-signing-cert-file and
/// --plugin-signing-key-file, with the trust bundle --plugin-ca-file): it
/// signs the certificate requests plugins send on their heartbeats and
/// issues its own client certificate, so no certificate is made by hand.
/// Or the user's PKI made every certificate (--plugin-client-cert-file,
/// --plugin-client-key-file, --plugin-ca-file and each plugin's own files).
#[derive(Debug, Args)]
pub struct PluginTlsFlags {
    /// required: every call to a plugin goes over mutual TLS, with kplug's
    /// plugin CA or with the user's files, one of which must be given.
    /// disabled: plaintext HTTP/2, which lets anyone who reaches a plugin's
    /// address call it, bypassing RBAC [default: required when the files
    /// are given, else disabled with a warning at start]
    #[arg(long, value_enum)]
    pub plugin_tls: Option<PluginTlsMode>,
    /// kplug's plugin CA (PEM certificate), with which kplug signs plugins'
    /// certificate requests and its own client certificate. Must be in
    /// --plugin-ca-file. Reloaded when it changes.
    #[arg(
        long,
        requires_all = ["plugin_signing_key_file", "plugin_ca_file"],
        conflicts_with_all = ["plugin_client_cert_file", "plugin_client_key_file"]
    )]
    pub plugin_signing_cert_file: Option<PathBuf>,
    /// The plugin CA's private key (PEM). Reloaded when it changes.
    #[arg(long, requires = "plugin_signing_cert_file")]
    pub plugin_signing_key_file: Option<PathBuf>,
    /// Lifetime of the certificates kplug's plugin CA issues (plugins' and
    /// kplug's own); each is renewed at two thirds of it.
    #[arg(long, default_value = "6h", value_parser = parse_duration)]
    pub plugin_cert_lifetime: Duration,
    /// kplug's client certificate (PEM, extended key usage clientAuth),
    /// which plugins check against their client CA (KPLUG_CLIENT_CA_FILE).
    /// Reloaded when it changes.
    #[arg(long, requires_all = ["plugin_client_key_file", "plugin_ca_file"])]
    pub plugin_client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM). Reloaded when it changes.
    #[arg(long, requires_all = ["plugin_client_cert_file", "plugin_ca_file"])]
    pub plugin_client_key_file: Option<PathBuf>,
    /// The CA certificates (PEM) that kplug and plugins trust for each
    /// other: kplug verifies plugins' serving certificates against them
    /// (for the plugin's identity NAME.plugins.kplug.io, else its declared
    /// KPLUG_SERVER_NAME, else the host of its address), and with
    /// --plugin-signing-cert-file plugins receive them to verify kplug's
    /// client certificate. Reloaded when it changes.
    #[arg(long)]
    pub plugin_ca_file: Option<PathBuf>,
}

/// `--plugin-tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PluginTlsMode {
    Required,
    Disabled,
}

/// How calls to plugins are secured, as the flags say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginTlsPlan {
    /// The user's files.
    Files(PluginTlsFiles),
    /// kplug's plugin CA, issuing certificates of `lifetime`.
    Signing {
        files: SigningFiles,
        lifetime: Duration,
    },
}

impl PluginTlsFlags {
    /// How to dial plugins; `None` for plaintext.
    pub fn plan(&self) -> Result<Option<PluginTlsPlan>, String> {
        let plan = match (
            &self.plugin_signing_cert_file,
            &self.plugin_signing_key_file,
            &self.plugin_client_cert_file,
            &self.plugin_client_key_file,
            &self.plugin_ca_file,
        ) {
            (None, None, None, None, None) => None,
            (Some(cert), Some(key), None, None, Some(ca)) => Some(PluginTlsPlan::Signing {
                files: SigningFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    trust_bundle: ca.clone(),
                },
                lifetime: self.plugin_cert_lifetime,
            }),
            (None, None, Some(cert), Some(key), Some(ca)) => {
                Some(PluginTlsPlan::Files(PluginTlsFiles {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                    ca: ca.clone(),
                }))
            }
            _ => {
                return Err("plugin TLS needs --plugin-ca-file with either \
                     --plugin-signing-cert-file and --plugin-signing-key-file (kplug's plugin CA) \
                     or --plugin-client-cert-file and --plugin-client-key-file (your own PKI)"
                    .to_owned());
            }
        };
        if self.plugin_cert_lifetime < MIN_PLUGIN_CERT_LIFETIME {
            return Err(format!(
                "--plugin-cert-lifetime must be at least {}s: plugins renew at two thirds of it",
                MIN_PLUGIN_CERT_LIFETIME.as_secs()
            ));
        }
        match (self.plugin_tls, plan) {
            (Some(PluginTlsMode::Disabled), Some(_)) => Err("--plugin-tls=disabled contradicts \
                 the plugin TLS files given"
                .to_owned()),
            (Some(PluginTlsMode::Required), None) => Err("--plugin-tls=required needs \
                 --plugin-ca-file with --plugin-signing-cert-file and --plugin-signing-key-file \
                 (kplug's plugin CA) or with --plugin-client-cert-file and \
                 --plugin-client-key-file (your own PKI)"
                .to_owned()),
            (_, plan) => Ok(plan),
        }
    }
}

/// The shortest certificate lifetime kplug accepts: a renewal every 20
/// seconds is already far more than any real rotation needs.
const MIN_PLUGIN_CERT_LIFETIME: Duration = Duration::from_secs(30);

/// What `kplug-apiserver plugin-certs` makes.
#[derive(Debug, Args)]
pub struct PluginCertsConfig {
    /// The plugin CA's directory: ca.crt and ca.key are made there when
    /// missing, and the certificates go there too.
    #[arg(long)]
    pub out_dir: PathBuf,
    #[command(subcommand)]
    pub make: PluginCert,
}

/// One certificate of `kplug-apiserver plugin-certs`.
#[derive(Debug, Subcommand)]
pub enum PluginCert {
    /// Only the plugin CA, ca.crt and ca.key: kplug's plugin CA when kplug
    /// signs plugins' certificates itself (--plugin-signing-cert-file,
    /// --plugin-signing-key-file, --plugin-ca-file).
    Ca,
    /// kplug's client certificate, kplug-client.crt and kplug-client.key
    /// (extended key usage clientAuth only; valid 365 days), for
    /// --plugin-client-cert-file and --plugin-client-key-file.
    Client {
        /// The certificate's common name.
        #[arg(long, default_value = "kplug")]
        common_name: String,
    },
    /// A plugin's serving certificate, plugins/NAME/tls.crt and tls.key,
    /// NAME being the first DNS name (extended key usage serverAuth only:
    /// it cannot be used as a client certificate to call another plugin).
    Serving {
        /// The names kplug checks: the plugin's KPLUG_SERVER_NAME, else the
        /// host of its KPLUG_ADVERTISE address, e.g. hello.plugins.svc.
        #[arg(required = true, value_name = "DNS_NAME")]
        dns_names: Vec<String>,
        /// An IP address to include, for a plugin advertised by IP; repeatable.
        #[arg(long = "ip", value_name = "IP")]
        ips: Vec<IpAddr>,
        /// Validity, in days.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
}

/// Tunables both modes share.
#[derive(Debug, Args)]
pub struct Tuning {
    /// Where the audit log goes, one JSON line per reconcile (who, what,
    /// which plugin, the outcome): - for stdout, else a file appended to.
    #[arg(long, env = "KPLUG_AUDIT_LOG_PATH", default_value = "-")]
    pub audit_log_path: Sink,
    #[command(flatten)]
    pub registry: RegistryFlags,
    #[command(flatten)]
    pub watch: WatchFlags,
    #[command(flatten)]
    pub proxy: ProxyFlags,
    #[command(flatten)]
    pub serving: ServingFlags,
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
    /// Heartbeats of new plugins are refused (reason TooManyPlugins) while
    /// this many plugins are registered: a bound on the registry's memory.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_plugins: u32,
    /// Heartbeats of new instances of a plugin (e.g. the pods of its
    /// Deployment) are refused (reason TooManyInstances) while it has this
    /// many.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_instances_per_plugin: u32,
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
            max_plugins: flags.max_plugins as usize,
            max_instances: flags.max_instances_per_plugin as usize,
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
    /// Calls in flight to one plugin instance beyond which it takes no
    /// more: requests get 429 when every Ready instance of the plugin has
    /// this many.
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

/// Limits of both listeners (the API and the heartbeats), against clients
/// that connect and then stall, or connect too much.
#[derive(Debug, Args)]
pub struct ServingFlags {
    /// How long a new connection may take to finish its TLS handshake and
    /// send the headers of its first request. On HTTP/1.1 it also bounds
    /// each later request's headers, and so how long a keep-alive
    /// connection may wait between requests.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub request_header_timeout: Duration,
    /// A connection with no request in progress for this long is closed
    /// (HTTP/2: with GOAWAY). An open watch or heartbeat stream is a request
    /// in progress.
    #[arg(long, default_value = "90s", value_parser = parse_positive_duration)]
    pub idle_connection_timeout: Duration,
    /// Connections each listener holds at once; more are closed as soon as
    /// they are accepted (counted in kplug_connections_refused_total). Every
    /// plugin instance keeps a connection to the heartbeat listener, so this
    /// must exceed the fleet: the default fits 50,000 instances.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Concurrent HTTP/2 streams (requests, watches) per connection.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_connection: u32,
    /// At shutdown, how long requests in progress may take to finish once
    /// every connection has been told to close (HTTP/2 GOAWAY, so clients
    /// send new requests elsewhere). Watches end at once: clients watch
    /// again, from another replica. In a pod, keep the shutdown delay plus
    /// this under terminationGracePeriodSeconds.
    #[arg(long, default_value = "20s", value_parser = parse_positive_duration)]
    pub shutdown_timeout: Duration,
}

/// A duration that is not zero: a zero timeout would close every connection.
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be more than zero".to_owned()),
        parsed => parsed.map_err(|e| e.to_string()),
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

    fn plugin_tls(flags: &[&str]) -> Result<Option<PluginTlsPlan>, String> {
        let serve = [
            "kplug-apiserver",
            "serve",
            "--tls-cert-file=/c",
            "--tls-private-key-file=/k",
        ];
        match Cli::try_parse_from(serve.iter().chain(flags)).map_err(|e| e.to_string())? {
            Cli {
                command: Command::Serve(config),
                ..
            } => config.plugin_tls.plan(),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn plugin_tls_is_the_three_files_or_nothing() {
        let files = [
            "--plugin-client-cert-file=/p/c",
            "--plugin-client-key-file=/p/k",
            "--plugin-ca-file=/p/ca",
        ];
        let expected = PluginTlsFiles {
            client_cert: "/p/c".into(),
            client_key: "/p/k".into(),
            ca: "/p/ca".into(),
        };
        let expected = PluginTlsPlan::Files(expected);
        assert_eq!(plugin_tls(&files), Ok(Some(expected.clone())));
        let required = ["--plugin-tls=required"];
        let all: Vec<&str> = required.iter().chain(&files).copied().collect();
        assert_eq!(plugin_tls(&all), Ok(Some(expected)));
        assert_eq!(plugin_tls(&[]), Ok(None));
        assert_eq!(plugin_tls(&["--plugin-tls=disabled"]), Ok(None));
        // Half a configuration is an error, never plaintext.
        assert!(plugin_tls(&files[..2]).is_err());
        assert!(plugin_tls(&files[2..]).is_err());
        assert!(plugin_tls(&required).is_err());
        let contradiction: Vec<&str> = ["--plugin-tls=disabled"]
            .iter()
            .chain(&files)
            .copied()
            .collect();
        assert!(plugin_tls(&contradiction).is_err());
    }

    #[test]
    fn kplugs_plugin_ca_signs_with_a_bundle_and_excludes_the_users_files() {
        let signing = [
            "--plugin-signing-cert-file=/s/tls.crt",
            "--plugin-signing-key-file=/s/tls.key",
            "--plugin-ca-file=/s/ca.crt",
        ];
        let expected = |lifetime| {
            Ok(Some(PluginTlsPlan::Signing {
                files: SigningFiles {
                    cert: "/s/tls.crt".into(),
                    key: "/s/tls.key".into(),
                    trust_bundle: "/s/ca.crt".into(),
                },
                lifetime,
            }))
        };
        assert_eq!(
            plugin_tls(&signing),
            expected(Duration::from_secs(6 * 3600))
        );
        let short: Vec<&str> = signing
            .iter()
            .chain(&["--plugin-cert-lifetime=1m"])
            .copied()
            .collect();
        assert_eq!(plugin_tls(&short), expected(Duration::from_secs(60)));
        let too_short: Vec<&str> = signing
            .iter()
            .chain(&["--plugin-cert-lifetime=10s"])
            .copied()
            .collect();
        assert!(
            plugin_tls(&too_short)
                .expect_err("10s")
                .contains("at least 30s")
        );
        // Without the bundle, or mixed with the user's files: an error.
        assert!(plugin_tls(&signing[..2]).is_err());
        let mixed: Vec<&str> = signing
            .iter()
            .chain(&["--plugin-client-cert-file=/p/c"])
            .copied()
            .collect();
        assert!(plugin_tls(&mixed).is_err());
    }

    #[test]
    fn serving_limits_default_sanely_and_refuse_zero() {
        let serving = |extra: &[&str]| {
            let args = ["kplug-apiserver", "standalone"].iter().chain(extra);
            match Cli::try_parse_from(args).map(|cli| cli.command) {
                Ok(Command::Standalone(config)) => Ok(config.tuning.serving),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        let defaults = serving(&[]).expect("defaults");
        assert_eq!(defaults.request_header_timeout, Duration::from_secs(10));
        assert_eq!(defaults.idle_connection_timeout, Duration::from_secs(90));
        assert_eq!(defaults.max_connections, 65_536);
        assert_eq!(defaults.max_streams_per_connection, 250);
        let set =
            serving(&["--request-header-timeout", "2s", "--max-connections", "8"]).expect("flags");
        assert_eq!(set.request_header_timeout, Duration::from_secs(2));
        assert_eq!(set.max_connections, 8);
        for zero in [
            ["--request-header-timeout", "0s"],
            ["--idle-connection-timeout", "0s"],
            ["--max-connections", "0"],
            ["--max-streams-per-connection", "0"],
        ] {
            assert!(serving(&zero).is_err(), "{zero:?}");
        }
    }

    #[test]
    fn registry_caps_leave_room_for_the_soak_test_and_refuse_zero() {
        let cli = Cli::try_parse_from(["kplug-apiserver", "standalone"]).expect("parses");
        let Command::Standalone(config) = cli.command else {
            panic!("not standalone: {:?}", cli.command);
        };
        let registry = RegistryConfig::from(&config.tuning.registry);
        assert!(registry.max_plugins >= 10_000, "{registry:?}");
        assert!(registry.max_instances >= 2, "{registry:?}");
        let cli = Cli::try_parse_from([
            "kplug-apiserver",
            "standalone",
            "--max-plugins",
            "3",
            "--max-instances-per-plugin",
            "2",
        ])
        .expect("parses");
        let Command::Standalone(config) = cli.command else {
            panic!("not standalone: {:?}", cli.command);
        };
        let registry = RegistryConfig::from(&config.tuning.registry);
        assert_eq!((registry.max_plugins, registry.max_instances), (3, 2));
        for flag in ["--max-plugins", "--max-instances-per-plugin"] {
            let zero = Cli::try_parse_from(["kplug-apiserver", "standalone", flag, "0"]);
            assert!(zero.is_err(), "{flag} 0 accepted");
        }
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
