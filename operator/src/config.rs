//! The operator's settings: [`Options`] for the library, and the clap
//! [`OperatorArgs`] that a binary flattens into its command line (the
//! zero-code `kplug-operator` and operators written with the library alike).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

// Go-style durations (`30s`, `5m`), as kubectl and Kubernetes components
// take them; the one parser the server and the SDK use too.
use kplug_proto::duration::parse as duration;

use crate::binding::BindingPolicy;
use crate::direct::{self, DirectToKplug};
use crate::status::ObjectStatusLayout;
use kplug_api::reference::FieldPath;
use kplug_api::version::VersionConstraint;

/// Leader election on a `coordination.k8s.io/v1` Lease: only the holder
/// reconciles, so several replicas never write the same object twice.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica, e.g. the pod's name.
    pub identity: String,
    /// How long a lease lasts without renewal: how long a crashed leader
    /// blocks a takeover.
    pub lease_duration: Duration,
}

/// How the operator serves its Prometheus metrics on `/metrics`.
#[derive(Clone, Debug)]
pub struct MetricsServing {
    pub bind_address: SocketAddr,
    /// HTTPS, and only to callers whose bearer token kube-apiserver
    /// authenticates (TokenReview) and authorizes for `get` on `/metrics`
    /// (SubjectAccessReview); `false`: plain HTTP to anyone, for local use.
    pub secure: bool,
    /// A directory with `tls.crt` and `tls.key`; default: a self-signed
    /// certificate made at startup.
    pub cert_dir: Option<PathBuf>,
}

/// How an operator delegates one resource.
#[derive(Clone, Debug)]
pub struct Options {
    /// The field manager of every status write, and the Events' reporter.
    pub field_manager: String,
    /// Held while the plugin serving an object declares `Finalize`.
    pub finalizer: String,
    /// Held while an object's children need the operator to remove them
    /// (see `finalizers`).
    pub children_finalizer: String,
    pub binding: BindingPolicy,
    /// Where objects list their extension references.
    pub extensions_path: FieldPath,
    /// Where objects name their preferred implementation.
    pub preferred_implementation_path: FieldPath,
    /// The plugin versions that may serve objects that name none.
    pub version_constraint: Option<VersionConstraint>,
    /// Where objects name the plugin versions that may serve them.
    pub version_constraint_path: FieldPath,
    pub object_status: ObjectStatusLayout,
    /// Extension resources (`resource.group`) whose changes re-reconcile
    /// the objects that refer to them.
    pub watched_extensions: Vec<String>,
    /// Kinds of children (`resource.group`, or `resource` in the core
    /// group) watched from the start, before the operator applies one of
    /// them: a child's change reconciles its parent even right after a
    /// restart. Other kinds are watched from their first child applied.
    pub child_resources: Vec<String>,
    /// Where children may be.
    pub child_scope: ChildScope,
    /// Only objects in this namespace; all when `None`.
    pub namespace: Option<String>,
    /// Objects reconciled at once.
    pub concurrency: u16,
    /// A successfully reconciled object is reconciled again after this long
    /// (or sooner, when the plugin asks).
    pub resync: Duration,
    /// The plugin's deadline for one call.
    pub reconcile_timeout: Duration,
    /// Per-object exponential backoff after failures.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    pub leader_election: Option<LeaderElection>,
    /// Where `/metrics` is served; not at all when `None` (the library's
    /// default: an operator that embeds it may serve
    /// [`Operator::metrics`](crate::Operator::metrics) itself).
    pub metrics: Option<MetricsServing>,
    /// Reconciles straight to kplug's Service instead of through
    /// kube-apiserver; `None` (the default): through kube-apiserver.
    pub direct_to_kplug: Option<DirectToKplug>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            field_manager: "kplug-operator".to_owned(),
            finalizer: "kplug.io/finalize".to_owned(),
            children_finalizer: "kplug.io/children".to_owned(),
            binding: BindingPolicy::Sticky,
            extensions_path: FieldPath::default_extensions(),
            preferred_implementation_path: FieldPath::parse_static("spec.preferredImplementation"),
            version_constraint: None,
            version_constraint_path: FieldPath::parse_static("spec.pluginVersion"),
            object_status: ObjectStatusLayout::Merged,
            watched_extensions: Vec::new(),
            child_resources: Vec::new(),
            child_scope: ChildScope::Namespace,
            namespace: None,
            concurrency: 16,
            resync: Duration::from_secs(300),
            reconcile_timeout: Duration::from_secs(30),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            leader_election: None,
            metrics: None,
            direct_to_kplug: None,
        }
    }
}

/// Where the children plugins return may be (a Reconcile's
/// `spec.childScope`), as the operator allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ChildScope {
    /// Only in the reconciled object's namespace, where an owner reference
    /// ties each child to it.
    #[default]
    Namespace,
    /// In any namespace, or cluster-scoped: a child the object cannot own is
    /// tracked by its labels and the object's inventory, and removed in
    /// teardown.
    Cluster,
}

impl From<ChildScope> for kplug_api::v1alpha1::ChildScope {
    fn from(scope: ChildScope) -> Self {
        match scope {
            ChildScope::Namespace => Self::Namespace,
            ChildScope::Cluster => Self::Cluster,
        }
    }
}

impl Options {
    /// Where the watches on children look: the operator's namespace, or
    /// everywhere when children may be anywhere.
    pub(crate) fn child_watch_namespace(&self) -> Option<&str> {
        match self.child_scope {
            ChildScope::Namespace => self.namespace.as_deref(),
            ChildScope::Cluster => None,
        }
    }

    /// The operator's finalizers.
    pub(crate) fn finalizer_names(&self) -> crate::finalizers::Names<'_> {
        crate::finalizers::Names {
            finalize: &self.finalizer,
            children: &self.children_finalizer,
        }
    }
}

/// `--metrics-bind-address`: `HOST:PORT`, `:PORT` (every interface) or
/// `0` (not served), as controller-runtime takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

impl std::str::FromStr for BindAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text == "0" {
            return Ok(Self(None));
        }
        let invalid = || {
            format!(
                "invalid address {text:?}: expected HOST:PORT with an IP address, :PORT, or 0 to disable"
            )
        };
        if let Some(port) = text.strip_prefix(':') {
            let port = port.parse::<u16>().map_err(|_| invalid())?;
            return Ok(Self(Some(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))));
        }
        text.parse().map(|a| Self(Some(a))).map_err(|_| invalid())
    }
}

/// The operator's flags; each also reads a `KPLUG_OPERATOR_*` variable.
#[derive(Clone, Debug, clap::Args)]
pub struct OperatorArgs {
    /// The kubeconfig to use (default: in-cluster, else ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Log filter, e.g. info or info,kplug_operator=debug.
    #[arg(long, env = "KPLUG_LOG", default_value = "info")]
    pub log: String,
    /// Field manager for status writes and reporter of Events.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_FIELD_MANAGER",
        default_value = "kplug-operator"
    )]
    pub field_manager: String,
    /// The finalizer that lets a plugin finalize an object before it goes;
    /// only on objects served by a plugin that declares Finalize.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_FINALIZER",
        default_value = "kplug.io/finalize"
    )]
    pub finalizer: String,
    /// The finalizer that keeps an object until the operator has removed
    /// its children; only on objects whose children their owner references
    /// alone would not remove right (several waves, children the object
    /// cannot own, children to abandon).
    #[arg(
        long,
        env = "KPLUG_OPERATOR_CHILDREN_FINALIZER",
        default_value = "kplug.io/children"
    )]
    pub children_finalizer: String,
    /// Sticky: once served by an implementation, an object stays with it
    /// (clear status.implementation to rebind). FollowSelection: every
    /// reconcile goes where kplug's selection says.
    #[arg(long, env = "KPLUG_OPERATOR_BINDING", default_value = "Sticky")]
    pub binding: BindingPolicy,
    /// Where objects list their extension references.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_EXTENSIONS_PATH",
        default_value = "spec.extensions"
    )]
    pub extensions_path: FieldPath,
    /// Where objects name their preferred implementation.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_PREFERRED_IMPLEMENTATION_PATH",
        default_value = "spec.preferredImplementation"
    )]
    pub preferred_implementation_path: FieldPath,
    /// The plugin versions that may serve objects that name none, as a
    /// semver range (e.g. ">=1.4, <2").
    #[arg(long, env = "KPLUG_OPERATOR_VERSION_CONSTRAINT")]
    pub version_constraint: Option<VersionConstraint>,
    /// Where objects name the plugin versions that may serve them (a semver
    /// range); it wins over --version-constraint.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_VERSION_CONSTRAINT_PATH",
        default_value = "spec.pluginVersion"
    )]
    pub version_constraint_path: FieldPath,
    /// Write the plugin's objectStatus under status.FIELD instead of
    /// merging its fields into status.
    #[arg(long, env = "KPLUG_OPERATOR_OBJECT_STATUS_FIELD")]
    pub object_status_field: Option<String>,
    /// An extension resource (resource.group) whose changes re-reconcile
    /// the objects that refer to them; repeat or separate with commas.
    #[arg(
        long = "watch-extension",
        env = "KPLUG_OPERATOR_WATCH_EXTENSIONS",
        value_delimiter = ','
    )]
    pub watched_extensions: Vec<String>,
    /// A kind of child (resource.group, or resource for the core group,
    /// e.g. deployments.apps, services) to watch from the start; repeat or
    /// separate with commas. Other kinds are watched from the first child
    /// of them applied.
    #[arg(
        long = "child-resource",
        env = "KPLUG_OPERATOR_CHILD_RESOURCES",
        value_delimiter = ','
    )]
    pub child_resources: Vec<String>,
    /// Where the children plugins return may be: namespace (the object's
    /// own, owned through an owner reference) or cluster (also other
    /// namespaces and cluster-scoped kinds, tracked by label and the
    /// object's status.children, removed before the object goes).
    #[arg(
        long,
        env = "KPLUG_OPERATOR_CHILD_SCOPE",
        value_enum,
        default_value = "namespace"
    )]
    pub child_scope: ChildScope,
    /// Only reconcile objects in this namespace (default: all).
    #[arg(long, short = 'n', env = "KPLUG_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Objects reconciled at once.
    #[arg(long, env = "KPLUG_OPERATOR_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Reconcile every object again after this long.
    #[arg(long, env = "KPLUG_OPERATOR_RESYNC", default_value = "5m", value_parser = duration)]
    pub resync: Duration,
    /// The plugin's deadline for one reconcile.
    #[arg(long, env = "KPLUG_OPERATOR_RECONCILE_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub reconcile_timeout: Duration,
    /// First retry delay after a failure; doubles per failure.
    #[arg(long, env = "KPLUG_OPERATOR_MIN_BACKOFF", default_value = "1s", value_parser = duration)]
    pub min_backoff: Duration,
    /// Longest retry delay after failures.
    #[arg(long, env = "KPLUG_OPERATOR_MAX_BACKOFF", default_value = "5m", value_parser = duration)]
    pub max_backoff: Duration,
    /// Elect a leader among replicas with a Lease; only the leader reconciles.
    #[arg(long, env = "KPLUG_OPERATOR_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the pod's, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// Name of the Lease (default: kplug-operator-RESOURCE.GROUP).
    #[arg(long, env = "KPLUG_OPERATOR_LEASE_NAME")]
    pub leader_election_lease: Option<String>,
    /// This replica's identity in the Lease (default: the pod's name, from
    /// POD_NAME, else the host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// How long a Lease holds without renewal.
    #[arg(long, env = "KPLUG_OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// Where to serve /metrics: HOST:PORT, :PORT, or 0 to disable.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_METRICS_BIND_ADDRESS",
        default_value = ":8443"
    )]
    pub metrics_bind_address: BindAddress,
    /// Serve /metrics over HTTPS to callers allowed `get` on /metrics
    /// (TokenReview and SubjectAccessReview); false: plain HTTP, no
    /// authentication, for local use.
    #[arg(long, env = "KPLUG_OPERATOR_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,
    /// A directory with tls.crt and tls.key for /metrics (default: a
    /// self-signed certificate made at startup).
    #[arg(long, env = "KPLUG_OPERATOR_METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Send reconciles straight to kplug at this URL (its Service, e.g.
    /// https://kplug.kplug-system.svc) with --kplug-token-file's identity,
    /// instead of through kube-apiserver: one hop fewer, the same RBAC, but
    /// kube-apiserver's audit log and API Priority and Fairness do not see
    /// these calls (kplug's log, audit and metrics do). Default: off.
    #[arg(long, env = "KPLUG_OPERATOR_KPLUG_URL", value_parser = direct::parse_url, requires = "kplug_ca_file")]
    pub kplug_url: Option<http::Uri>,
    /// With --kplug-url: the CA of kplug's serving certificate (ca.crt of
    /// the kplug-trust ConfigMap); reread when it changes.
    #[arg(long, env = "KPLUG_OPERATOR_KPLUG_CA_FILE", requires = "kplug_url")]
    pub kplug_ca_file: Option<PathBuf>,
    /// With --kplug-url: the bearer token kplug reviews; reread when it
    /// changes.
    #[arg(
        long,
        env = "KPLUG_OPERATOR_KPLUG_TOKEN_FILE",
        default_value = direct::SERVICE_ACCOUNT_TOKEN
    )]
    pub kplug_token_file: PathBuf,
}

impl OperatorArgs {
    /// Logs to stderr with the `--log` filter. Each line shows the spans it
    /// is in with their fields: a reconcile's lines carry its `object`,
    /// `trace_id` and, once kplug answered, `operation_id`.
    ///
    /// kube-client logs every 5xx answer at ERROR, among them kplug's
    /// expected 503 while no plugin is Ready, where the operator's own line
    /// says what the answer meant for the object: those lines are off unless
    /// the filter names `kube_client`.
    pub fn init_logging(&self) -> Result<(), tracing_subscriber::filter::ParseError> {
        let mut filter = tracing_subscriber::EnvFilter::try_new(&self.log)?;
        if !self.log.contains("kube_client") {
            filter = filter.add_directive("kube_client::client::builder=off".parse()?);
        }
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // A failed write is not reported on stderr, the same broken pipe:
            // that report panics the task that logged (apiserver/tests/lost_logs.rs).
            .log_internal_errors(false)
            // Colours for people at a terminal, plain text for a pod's log.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
        Ok(())
    }

    /// The client configuration from `--kubeconfig`, else the default
    /// inference (in-cluster, then `KUBECONFIG` and `~/.kube/config`).
    pub async fn kube_config(&self) -> Result<kube::Config, kube::Error> {
        let Some(path) = &self.kubeconfig else {
            return kube::Config::infer()
                .await
                .map_err(kube::Error::InferConfig);
        };
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)
    }

    /// The library's options for `resource` (`resource.group`, naming the
    /// default Lease).
    pub fn options(&self, resource: &str) -> Options {
        let leader_election = self.leader_elect.then(|| LeaderElection {
            namespace: self.leader_election_namespace.clone(),
            lease_name: self
                .leader_election_lease
                .clone()
                .unwrap_or_else(|| format!("kplug-operator-{resource}")),
            identity: self.leader_election_identity.clone().unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "localhost".to_owned());
                format!("{host}-{}", std::process::id())
            }),
            lease_duration: self.lease_duration,
        });
        Options {
            field_manager: self.field_manager.clone(),
            finalizer: self.finalizer.clone(),
            children_finalizer: self.children_finalizer.clone(),
            binding: self.binding,
            extensions_path: self.extensions_path.clone(),
            preferred_implementation_path: self.preferred_implementation_path.clone(),
            version_constraint: self.version_constraint.clone(),
            version_constraint_path: self.version_constraint_path.clone(),
            object_status: self
                .object_status_field
                .clone()
                .map_or(ObjectStatusLayout::Merged, ObjectStatusLayout::Under),
            watched_extensions: self.watched_extensions.clone(),
            child_resources: self.child_resources.clone(),
            child_scope: self.child_scope,
            namespace: self.namespace.clone(),
            concurrency: self.concurrency,
            resync: self.resync,
            reconcile_timeout: self.reconcile_timeout,
            min_backoff: self.min_backoff,
            max_backoff: self.max_backoff,
            leader_election,
            metrics: self
                .metrics_bind_address
                .0
                .map(|bind_address| MetricsServing {
                    bind_address,
                    secure: self.metrics_secure,
                    cert_dir: self.metrics_cert_dir.clone(),
                }),
            direct_to_kplug: self.kplug_url.clone().zip(self.kplug_ca_file.clone()).map(
                |(url, ca_file)| DirectToKplug {
                    url,
                    ca_file,
                    token_file: self.kplug_token_file.clone(),
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    #[test]
    fn flags_become_options() {
        let cli = Cli::try_parse_from([
            "op",
            "--binding",
            "FollowSelection",
            "--watch-extension",
            "a.example.com,b.example.com",
            "--child-resource",
            "deployments.apps,services",
            "--child-scope",
            "cluster",
            "--resync",
            "1m30s",
            "--leader-elect=false",
            "--object-status-field",
            "output",
        ])
        .expect("parses");
        let options = cli.args.options("things.example.com");
        assert_eq!(options.binding, BindingPolicy::FollowSelection);
        assert_eq!(
            options.watched_extensions,
            ["a.example.com", "b.example.com"]
        );
        assert_eq!(options.child_resources, ["deployments.apps", "services"]);
        assert_eq!(options.child_scope, ChildScope::Cluster);
        assert_eq!(options.resync, Duration::from_secs(90));
        assert!(options.leader_election.is_none());
        assert_eq!(
            options.object_status,
            ObjectStatusLayout::Under("output".into())
        );
        let defaults = Cli::try_parse_from(["op"])
            .expect("parses")
            .args
            .options("things.example.com");
        let election = defaults.leader_election.expect("on by default");
        assert_eq!(election.lease_name, "kplug-operator-things.example.com");
        assert_eq!(defaults.extensions_path.to_string(), "spec.extensions");
        let metrics = defaults.metrics.expect("served by default");
        assert_eq!(
            metrics.bind_address,
            "0.0.0.0:8443".parse().expect("address")
        );
        assert!(metrics.secure && metrics.cert_dir.is_none());
        assert_eq!(defaults.direct_to_kplug, None, "through kube-apiserver");
        let direct = Cli::try_parse_from([
            "op",
            "--kplug-url=https://kplug.kplug-system.svc",
            "--kplug-ca-file=/var/run/kplug/trust/ca.crt",
        ])
        .expect("parses")
        .args
        .options("things.example.com")
        .direct_to_kplug
        .expect("direct");
        assert_eq!(direct.url, "https://kplug.kplug-system.svc/");
        assert_eq!(direct.ca_file, PathBuf::from("/var/run/kplug/trust/ca.crt"));
        assert_eq!(
            direct.token_file,
            PathBuf::from(direct::SERVICE_ACCOUNT_TOKEN)
        );
    }

    #[test]
    fn metrics_flags() {
        let parse = |args: &[&str]| {
            let mut full = vec!["op"];
            full.extend_from_slice(args);
            Cli::try_parse_from(full)
                .expect("parses")
                .args
                .options("things.example.com")
                .metrics
        };
        assert!(parse(&["--metrics-bind-address", "0"]).is_none());
        let local = parse(&[
            "--metrics-bind-address=127.0.0.1:0",
            "--metrics-secure=false",
            "--metrics-cert-dir=/certs",
        ])
        .expect("served");
        assert_eq!(local.bind_address, "127.0.0.1:0".parse().expect("address"));
        assert!(!local.secure);
        assert_eq!(local.cert_dir, Some(PathBuf::from("/certs")));
        let v6 = parse(&["--metrics-bind-address=[::1]:9443"]).expect("served");
        assert_eq!(v6.bind_address, "[::1]:9443".parse().expect("address"));
    }

    #[test]
    fn bad_flags_are_refused_with_the_reason() {
        for (flag, value, says) in [
            ("--binding", "sticky", "unsupported binding policy"),
            ("--resync", "5 minutes", "invalid duration"),
            ("--min-backoff", "1x", "unknown unit"),
            ("--extensions-path", "spec..x", "empty step"),
            (
                "--metrics-bind-address",
                "localhost:8443",
                "invalid address",
            ),
            ("--metrics-bind-address", ":http", "invalid address"),
            (
                "--kplug-url",
                "http://kplug.kplug-system.svc",
                "must not travel in clear",
            ),
        ] {
            let error = Cli::try_parse_from(["op", flag, value])
                .err()
                .expect("refused");
            assert!(error.to_string().contains(says), "{flag} {value}: {error}");
        }
        // The direct path needs kplug's CA, and the CA is for it alone.
        for alone in [
            "--kplug-url=https://kplug.kplug-system.svc",
            "--kplug-ca-file=/ca.crt",
        ] {
            let error = Cli::try_parse_from(["op", alone]).err().expect("refused");
            assert!(
                error
                    .to_string()
                    .contains("the following required arguments were not provided"),
                "{alone}: {error}"
            );
        }
        // The old parser took a negative duration as a positive one.
        let error = Cli::try_parse_from(["op", "--resync=-1s"])
            .err()
            .expect("refused");
        assert!(
            error.to_string().contains("must not be negative"),
            "{error}"
        );
    }
}
