//! Where a plugin listens, how kplug reaches it, and where it heartbeats.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use crate::DEFAULT_REGISTRY;

/// Where the plugin listens unless told otherwise: loopback, so a plugin
/// started by hand is not exposed to the network. In Kubernetes set
/// `KPLUG_LISTEN=0.0.0.0:50052` and advertise the Service's name.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 50052));

/// How long shutdown waits by default for in-flight calls: below the 30
/// seconds Kubernetes grants a pod between SIGTERM and SIGKILL, leaving time
/// to deregister first.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// How a plugin runs: the deployment-specific settings, as opposed to what
/// the plugin is ([`PluginInfo`](crate::PluginInfo)).
///
/// With the default `clap` feature it is a clap `Args` that a
/// plugin's command line can flatten; every flag has an environment variable
/// fallback:
///
/// | flag | environment | default |
/// |---|---|---|
/// | `--registry` | `KPLUG_REGISTRY` | `http://127.0.0.1:50051` |
/// | `--listen` | `KPLUG_LISTEN` | `127.0.0.1:50052` |
/// | `--advertise` | `KPLUG_ADVERTISE` | the listening address |
/// | `--name` | `KPLUG_NAME` | the plugin's own name |
/// | `--heartbeat-interval` | `KPLUG_HEARTBEAT_INTERVAL` | the registry's choice |
/// | `--drain-timeout` | `KPLUG_DRAIN_TIMEOUT` | `20s` |
/// | `--token-file` | `KPLUG_TOKEN_FILE` | none: heartbeats carry no token |
/// | `--registry-ca-file` | `KPLUG_REGISTRY_CA_FILE` | none; required for `https://` |
/// | `--instance` | `KPLUG_INSTANCE` | `$POD_NAME`, else none (the address names it) |
/// | `--tls-cert-file` | `KPLUG_TLS_CERT_FILE` | none: plain gRPC |
/// | `--tls-key-file` | `KPLUG_TLS_KEY_FILE` | none; required with a certificate |
/// | `--client-ca-file` | `KPLUG_CLIENT_CA_FILE` | none; required with a certificate |
/// | `--allow-unauthenticated-clients` | `KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS` | off |
/// | `--server-name` | `KPLUG_SERVER_NAME` | none: the advertised host |
/// | `--issued-identity` | `KPLUG_ISSUED_IDENTITY` | off |
/// | `--canary-weight` | `KPLUG_CANARY_WEIGHT` | none: a stable instance |
/// | `--shadow` | `KPLUG_SHADOW` | none; alone: 100 (percent of reconciles) |
/// | `--local-address-file` | `KPLUG_LOCAL_ADDRESS_FILE` | none: serve for kplug |
///
/// kplug's standalone registry speaks plain gRPC (`http://`) and needs
/// neither of the last two. In cluster mode (`kplug-apiserver serve`) the
/// registry serves TLS and checks who heartbeats:
///
/// - `--registry https://kplug.kplug-system.svc:8444` dials it over TLS,
///   verifying kplug's serving certificate against `--registry-ca-file`: the
///   PEM of the CA that signed it, e.g. the `kplug-ca` ConfigMap mounted
///   into the pod. The name checked is the URL's host. There is no default
///   trust store, so `https://` without a CA file fails at start.
/// - `--token-file` is a Kubernetes ServiceAccount token, a projected token
///   volume for the audience `plugins.kplug.io` (what kplug reviews
///   heartbeat tokens for), sent as `authorization: Bearer <token>` with every
///   heartbeat and the deregistration. The file is read afresh for each, as
///   the kubelet rotates projected tokens. A missing or unreadable file is
///   logged and the heartbeat goes out without a token, so kplug's refusal
///   says what is wrong. kplug reviews the token and requires the identity
///   to be allowed to `create` `plugins/heartbeat` (group `plugins.kplug.io`)
///   for the plugin's name; its refusals (`UNAUTHENTICATED`,
///   `PERMISSION_DENIED`) are logged and retried at the heartbeat interval,
///   and show in [`Status`](crate::Status) as
///   [`Refused`](crate::heartbeat::Outcome::Refused).
///
/// A registry host name that resolves to several addresses (a headless
/// Service in front of kplug's replicas) gets heartbeats at every address;
/// see [`heartbeat`](crate::heartbeat).
///
/// Several instances (pods) may serve one plugin. Each names itself with
/// `--instance`, by default the pod's name (`POD_NAME` from the downward
/// API; without it the address names the instance), and
/// advertises its own address, e.g. the pod's IP, so that kplug can tell
/// them apart, spread calls over them and stop calling one that shuts
/// down:
///
/// ```yaml
/// env:
///   - name: POD_NAME
///     valueFrom: {fieldRef: {fieldPath: metadata.name}}
///   - name: POD_IP
///     valueFrom: {fieldRef: {fieldPath: status.podIP}}
///   - name: KPLUG_ADVERTISE
///     value: $(POD_IP):50052
///   - name: KPLUG_LISTEN
///     value: 0.0.0.0:50052
/// ```
///
/// By default the plugin serves plain gRPC, for local use. With
/// `--tls-cert-file` and `--tls-key-file` it serves TLS, and with
/// `--client-ca-file` it requires every caller to present a certificate
/// signed by that CA (kplug's client CA): mutual TLS. A certificate without
/// a client CA is refused at start, since anyone who reaches the port could
/// then call the plugin, unless `--allow-unauthenticated-clients` says that
/// is meant. The three files are read again for every new connection and
/// used when they changed (a rotation by cert-manager or the kubelet
/// replaces them), so renewed certificates need no restart; connections
/// already open keep theirs. Material that does not load (e.g. a key that
/// does not match the certificate, midway through a rotation) is logged and
/// the previous one kept. `--server-name` tells kplug which name to verify
/// in the certificate, e.g. the Service's DNS name when the advertised
/// address is the pod's IP.
///
/// ```
/// # #[cfg(feature = "clap")] {
/// use clap::Parser;
///
/// #[derive(Parser)]
/// struct Args {
///     #[command(flatten)]
///     kplug: kplug_sdk::Config,
///     /// The plugin's own flags.
///     #[arg(long)]
///     database_url: String,
/// }
///
/// let args = Args::parse_from(["plugin", "--listen", "0.0.0.0:0", "--database-url", "mysql://db"]);
/// assert_eq!(args.kplug.listen.port(), 0);
/// # }
/// ```
///
/// Without clap, start from [`Config::default`] and use the setters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[non_exhaustive]
pub struct Config {
    /// kplug's registry endpoint: an http:// or https:// URL, or host:port
    /// for plain http, e.g. https://kplug.kplug-system.svc:8444. https://
    /// needs --registry-ca-file.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = crate::REGISTRY_ENV, default_value = DEFAULT_REGISTRY)
    )]
    pub registry: String,

    /// Address the plugin's gRPC server listens on; port 0 picks a free port.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "KPLUG_LISTEN", default_value_t = DEFAULT_LISTEN)
    )]
    pub listen: SocketAddr,

    /// host:port where kplug reaches the plugin, e.g. the Service's DNS name
    /// in Kubernetes [default: the listening address, with 0.0.0.0 or :: as
    /// loopback]. A missing port or port 0 means the port actually bound.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_ADVERTISE"))]
    pub advertise: Option<String>,

    /// Registers under this name instead of the plugin's built-in one, e.g.
    /// to run two instances side by side.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_NAME"))]
    pub name: Option<String>,

    /// Heartbeat interval to ask the registry for, e.g. 5s or 500ms (a bare
    /// number is seconds) [default: the registry's choice].
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "KPLUG_HEARTBEAT_INTERVAL", value_parser = parse_duration)
    )]
    pub heartbeat_interval: Option<Duration>,

    /// On shutdown, how long in-flight calls may take to finish after
    /// deregistration before they are abandoned, e.g. 20s.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "KPLUG_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)
    )]
    pub drain_timeout: Duration,

    /// File holding a Kubernetes ServiceAccount token, sent to kplug as
    /// "authorization: Bearer TOKEN" with every heartbeat; reread each time,
    /// as projected tokens rotate. kplug in cluster mode requires it.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_TOKEN_FILE"))]
    pub token_file: Option<PathBuf>,

    /// PEM file with the CA certificate(s) that signed kplug's serving
    /// certificate, e.g. from the kplug-ca ConfigMap. Required for an
    /// https:// registry.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_REGISTRY_CA_FILE"))]
    pub registry_ca_file: Option<PathBuf>,

    /// Which instance of the plugin this process is, e.g. its pod's name,
    /// sent with every heartbeat and the deregistration; empty: the address
    /// names the instance [default: $POD_NAME, else empty].
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_INSTANCE"))]
    pub instance: Option<String>,

    /// PEM certificate (chain) to serve the Plugin service over TLS with;
    /// needs --tls-key-file and --client-ca-file. Reread when it changes
    /// [default: plain gRPC].
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_TLS_CERT_FILE"))]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file. Reread when it changes.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_TLS_KEY_FILE"))]
    pub tls_key_file: Option<PathBuf>,

    /// PEM CA certificate(s) that callers' client certificates must be
    /// signed by, e.g. kplug's client CA; with TLS only. Reread when it
    /// changes.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_CLIENT_CA_FILE"))]
    pub client_ca_file: Option<PathBuf>,

    /// Serve TLS without --client-ca-file: anyone who reaches the port may
    /// call the plugin.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS")
    )]
    pub allow_unauthenticated_clients: bool,

    /// Serve TLS with the identity kplug issues: a key made in memory, a
    /// certificate for NAME.plugins.kplug.io that kplug signs on the
    /// heartbeats (kplug with --plugin-signing-cert-file) and renews, and
    /// kplug's client CA from the same answers. Needs an `https://`
    /// registry and --token-file; excludes --tls-cert-file.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_ISSUED_IDENTITY"))]
    pub issued_identity: bool,

    /// The name kplug verifies in the serving certificate, e.g. the
    /// Service's DNS name when advertising the pod's IP [default: the host
    /// of the advertised address].
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_SERVER_NAME"))]
    pub server_name: Option<String>,

    /// Run as a canary of the plugin's next version: kplug sends this
    /// percentage (1-99) of the plugin's objects, each always to the same
    /// side, to the canary instances, and withdraws a canary that fails or
    /// misses its deadline more often than the other instances [default:
    /// a stable instance].
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "KPLUG_CANARY_WEIGHT", value_parser = clap::value_parser!(u32).range(1..=99))
    )]
    pub canary_weight: Option<u32>,

    /// Run as a shadow of the plugin's next version: kplug sends this
    /// percentage (1-100, 100 when the flag has no value) of the plugin's
    /// reconciles to the shadow again with dryRun set, after another
    /// instance has answered, and shows where the two answers differ
    /// (`kubectl kplug shadow`); the shadow serves nothing else [default:
    /// not a shadow].
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "KPLUG_SHADOW",
            value_name = "PERCENT",
            num_args = 0..=1,
            default_missing_value = "100",
            value_parser = clap::value_parser!(u32).range(1..=100),
            conflicts_with = "canary_weight"
        )
    )]
    pub shadow: Option<u32>,

    /// Serve without kplug, as `kubectl kplug render` runs a plugin: no
    /// heartbeats and plain gRPC (the registry and TLS settings are not
    /// used); once listening, write the address (`127.0.0.1:PORT`) to this
    /// file.
    #[cfg_attr(feature = "clap", arg(long, env = "KPLUG_LOCAL_ADDRESS_FILE"))]
    pub local_address_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            registry: DEFAULT_REGISTRY.to_owned(),
            listen: DEFAULT_LISTEN,
            advertise: None,
            name: None,
            heartbeat_interval: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            token_file: None,
            registry_ca_file: None,
            instance: None,
            tls_cert_file: None,
            tls_key_file: None,
            client_ca_file: None,
            allow_unauthenticated_clients: false,
            issued_identity: false,
            server_name: None,
            canary_weight: None,
            shadow: None,
            local_address_file: None,
        }
    }
}

impl Config {
    /// Sets the registry endpoint.
    #[must_use]
    pub fn registry(mut self, registry: impl Into<String>) -> Self {
        self.registry = registry.into();
        self
    }

    /// Sets the listening address.
    #[must_use]
    pub fn listen(mut self, listen: SocketAddr) -> Self {
        self.listen = listen;
        self
    }

    /// Sets the advertised `host:port`.
    #[must_use]
    pub fn advertise(mut self, advertise: impl Into<String>) -> Self {
        self.advertise = Some(advertise.into());
        self
    }

    /// Overrides the plugin's name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the heartbeat interval to ask for.
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// Sets how long shutdown waits for in-flight calls.
    #[must_use]
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Sets the ServiceAccount token file sent with heartbeats.
    #[must_use]
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Sets the PEM file of the CA to trust for an `https://` registry.
    #[must_use]
    pub fn registry_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.registry_ca_file = Some(path.into());
        self
    }

    /// Names this instance of the plugin; empty means the address does.
    #[must_use]
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Serves TLS with the PEM certificate (chain) and private key in these
    /// files.
    #[must_use]
    pub fn tls(mut self, cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert_file.into());
        self.tls_key_file = Some(key_file.into());
        self
    }

    /// Requires callers to present a certificate signed by the CA in this
    /// PEM file.
    #[must_use]
    pub fn client_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.client_ca_file = Some(path.into());
        self
    }

    /// Serves TLS with the identity kplug issues; see the field.
    #[must_use]
    pub fn issued_identity(mut self, issued: bool) -> Self {
        self.issued_identity = issued;
        self
    }

    /// Allows serving TLS without a client CA, to any caller.
    #[must_use]
    pub fn allow_unauthenticated_clients(mut self, allow: bool) -> Self {
        self.allow_unauthenticated_clients = allow;
        self
    }

    /// Sets the name kplug verifies in the serving certificate.
    #[must_use]
    pub fn server_name(mut self, server_name: impl Into<String>) -> Self {
        self.server_name = Some(server_name.into());
        self
    }

    /// Runs as a canary taking `percent` (1-99) of the plugin's objects;
    /// see the field.
    #[must_use]
    pub fn canary_weight(mut self, percent: u32) -> Self {
        self.canary_weight = Some(percent);
        self
    }

    /// Runs as a shadow receiving dry-run copies of `percent` (1-100) of
    /// the plugin's reconciles; see the field.
    #[must_use]
    pub fn shadow(mut self, percent: u32) -> Self {
        self.shadow = Some(percent);
        self
    }

    /// Serves without kplug, writing the listening address to this file;
    /// see the field.
    #[must_use]
    pub fn local_address_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.local_address_file = Some(path.into());
        self
    }
}

/// Parses `1500ms`, `5s`, `2m`, `1h`, `1h30m` or a bare number of seconds,
/// e.g. for a plugin's own duration flags: the form kplug's server and
/// operator take too, plus the bare seconds the Python SDK takes.
pub use kplug_proto::duration::parse_or_seconds as parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("5"), Ok(ms(5000)));
        assert_eq!(parse_duration("5s"), Ok(ms(5000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration(" 2m "), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration(".5s"), Ok(ms(500)));
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        for bad in ["", "s", "5x", "-1s", "five", "1e3", "1.2.3s", "5 minutes"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[cfg(feature = "clap")]
    #[test]
    fn command_line_and_defaults_agree() {
        use clap::{CommandFactory, FromArgMatches, Parser};

        #[derive(Parser)]
        struct Args {
            #[command(flatten)]
            config: Config,
        }
        // Without the environment fallbacks, so KPLUG_* variables in the
        // developer's shell cannot change the outcome.
        let parse = |args: &[&str]| {
            let command = Args::command().mut_args(|arg| arg.env(None));
            let matches = command.try_get_matches_from(args).unwrap();
            Args::from_arg_matches(&matches).unwrap().config
        };
        assert_eq!(parse(&["plugin"]), Config::default());

        let parsed = parse(&[
            "plugin",
            "--registry",
            "http://kplug:50051",
            "--listen",
            "0.0.0.0:0",
            "--advertise",
            "svc.ns.svc",
            "--name",
            "other",
            "--heartbeat-interval",
            "750ms",
            "--drain-timeout",
            "3",
            "--token-file",
            "/var/run/secrets/kplug/token",
            "--registry-ca-file",
            "/var/run/kplug/ca/ca.crt",
            "--instance",
            "hello-7d9f-x2x",
            "--tls-cert-file",
            "/tls/tls.crt",
            "--tls-key-file",
            "/tls/tls.key",
            "--client-ca-file",
            "/tls/client-ca.crt",
            "--server-name",
            "hello.plugins.svc",
        ]);
        assert_eq!(
            parsed,
            Config::default()
                .registry("http://kplug:50051")
                .listen("0.0.0.0:0".parse().unwrap())
                .advertise("svc.ns.svc")
                .name("other")
                .heartbeat_interval(Duration::from_millis(750))
                .drain_timeout(Duration::from_secs(3))
                .token_file("/var/run/secrets/kplug/token")
                .registry_ca_file("/var/run/kplug/ca/ca.crt")
                .instance("hello-7d9f-x2x")
                .tls("/tls/tls.crt", "/tls/tls.key")
                .client_ca_file("/tls/client-ca.crt")
                .server_name("hello.plugins.svc")
        );
        let parsed = parse(&[
            "plugin",
            "--instance",
            "",
            "--allow-unauthenticated-clients",
        ]);
        assert_eq!(parsed.instance.as_deref(), Some(""));
        assert!(parsed.allow_unauthenticated_clients);
    }
}
