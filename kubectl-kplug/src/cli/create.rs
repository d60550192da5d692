//! `kubectl kplug create plugin` and `create operator`: their flags and help.

use clap::{Args, Subcommand};
use kplug_operator::ChildScope;

use super::{MORE, TEMPLATE};

const CREATE_PLUGIN_ABOUT: &str = "\
Print the manifests that install a plugin: its ServiceAccount, RBAC that lets
it heartbeat to kplug as NAME and nothing else, a Deployment of --replicas pods
and a PodDisruptionBudget. Nothing is sent to the cluster; apply the output,
or keep it in a kustomization and patch it there (environment, resources).

With --api, also the ClusterRole and ClusterRoleBinding kplug:read:NAME:
they let kplug's own ServiceAccount (--kplug-service-account) get the
objects of that API and of each --extension-resource, which kplug reads
itself for reconciles by reference (spec.objectRef). Only get, only those
kinds: kplug reads what its plugins serve and nothing cluster-wide.

The pods need no certificate: the SDK asks kplug for one on its heartbeats
(KPLUG_ISSUED_IDENTITY), so kplug must run with its plugin CA. They trust
kplug's registry through the ConfigMap kplug-trust, which kplug keeps in
namespaces labelled plugins.kplug.io/trust=enabled.";

const CREATE_PLUGIN_EXAMPLES: &str = "\
Examples:
  # Install the hello plugin into namespace plugins
  kubectl label namespace plugins plugins.kplug.io/trust=enabled
  kubectl kplug create plugin hello --image ghcr.io/kplug/hello-plugin:0.1.0 \\
    --api greetings.example.com/v1 -n plugins | kubectl apply -f -

  # A plugin whose objects reference extension objects, which kplug reads too
  kubectl kplug create plugin tables --image ghcr.io/example/tables:1.0 -n plugins \\
    --api databasetables.myorg.org/v1alpha1 \\
    --extension-resource databasetablemariadbextensions.myorg.org

  # Keep the manifests in a kustomization instead
  kubectl kplug create plugin hello --image ghcr.io/kplug/hello-plugin:0.1.0 -n plugins > hello.yaml";

const CREATE_OPERATOR_ABOUT: &str = "\
Print the manifests that install kplug-operator, the zero-code operator, for
one custom resource: its ServiceAccount, the least-privilege RBAC it needs and
a Deployment of --replicas pods that elect a leader. Nothing is sent to the
cluster; apply the output, or keep it in a kustomization.

The operator may: delegate to plugins (kplug:operator) and watch them
(kplug:reader); read and watch RESOURCE, patch it (the finalizer) and its
status, and update its status and finalizers (what kplug checks before it
reconciles or finalizes an object for anyone); read and watch each
--watch-extension and patch its status; apply,
watch and delete each --child-resource kind (the children plugins return);
record Events; hold its Lease in its namespace; and ask kube-apiserver who
reads its /metrics (system:auth-delegator). Nothing else: a plugin that
returns a child of a kind not given with --child-resource gets that child
refused with the reason in the object's status.children.";

const CREATE_OPERATOR_EXAMPLES: &str = "\
Examples:
  # The operator of the website example: Websites become a ConfigMap, a
  # Deployment and a Service
  kubectl kplug create operator websites.sites.example.com -n plugins \\
    --child-resource configmaps,deployments.apps,services | kubectl apply -f -

  # The DatabaseTable operator, whose objects reference extension objects
  kubectl kplug create operator databasetables.myorg.org -n plugins \\
    --watch-extension databasetablemariadbextensions.myorg.org \\
    --finalizer myorg.org/database-table";

#[derive(Debug, Subcommand)]
pub enum CreateCommand {
    /// Print the manifests that install a plugin
    #[command(
        long_about = CREATE_PLUGIN_ABOUT,
        before_help = CREATE_PLUGIN_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug create plugin NAME --image IMAGE [--api RESOURCE.GROUP/VERSION [--extension-resource RESOURCE[.GROUP]...]] [options]"
    )]
    Plugin(CreatePluginArgs),
    /// Print the manifests that install the zero-code operator for a resource
    #[command(
        long_about = CREATE_OPERATOR_ABOUT,
        before_help = CREATE_OPERATOR_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug create operator RESOURCE.GROUP [--watch-extension RESOURCE[.GROUP]...] [--child-resource RESOURCE[.GROUP]...] [options]"
    )]
    Operator(CreateOperatorArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CreatePluginArgs {
    /// The plugin's name: the name it heartbeats under (KPLUG_NAME), and of
    /// its ServiceAccount, RBAC, Deployment and PodDisruptionBudget.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The plugin's image.
    #[arg(long)]
    pub image: String,
    /// The API the plugin serves, e.g. databasetables.myorg.org/v1alpha1:
    /// an annotation (the plugin declares it itself), and the ClusterRole
    /// kplug:read:NAME letting kplug get its objects.
    #[arg(long, value_name = "RESOURCE.GROUP/VERSION")]
    pub api: Option<String>,
    /// A kind of extension object the plugin's objects reference (in
    /// spec.extensions), which kplug must get too; e.g.
    /// databasetablemariadbextensions.myorg.org, or configmaps for the core
    /// group. Needs --api. Repeat for more kinds.
    #[arg(long, value_name = "RESOURCE[.GROUP]")]
    pub extension_resource: Vec<String>,
    /// kplug's own ServiceAccount, which kplug:read:NAME is bound to.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = Self::DEFAULT_KPLUG_SERVICE_ACCOUNT)]
    pub kplug_service_account: String,
    /// Pods serving the plugin.
    #[arg(long, default_value_t = Self::DEFAULT_REPLICAS)]
    pub replicas: u32,
    /// The port the plugin listens on.
    #[arg(long, default_value_t = Self::DEFAULT_PORT)]
    pub port: u16,
    /// kplug's registry: its headless Service, so that heartbeats reach
    /// every replica.
    #[arg(long, default_value = Self::DEFAULT_REGISTRY)]
    pub registry: String,
    /// PodDisruptionBudget as policy/v1beta1, for Kubernetes before 1.21.
    #[arg(long)]
    pub pdb_v1beta1: bool,
}

/// The defaults, named so that the printed command can leave them out.
impl CreatePluginArgs {
    pub const DEFAULT_KPLUG_SERVICE_ACCOUNT: &str = "kplug-system/kplug";
    pub const DEFAULT_REPLICAS: u32 = 2;
    pub const DEFAULT_PORT: u16 = 50051;
    pub const DEFAULT_REGISTRY: &str = "https://kplug-registry.kplug-system.svc:8444";
}

#[derive(Debug, Clone, Args)]
pub struct CreateOperatorArgs {
    /// The custom resource the operator delegates, as resource.group
    /// (e.g. websites.sites.example.com).
    #[arg(value_name = "RESOURCE.GROUP")]
    pub resource: String,
    /// The operator's name: of its ServiceAccount, RBAC and Deployment, and
    /// the field manager of its writes (default: RESOURCE-operator, e.g.
    /// websites-operator).
    #[arg(long)]
    pub name: Option<String>,
    /// kplug-operator's image.
    #[arg(long, default_value = Self::DEFAULT_IMAGE)]
    pub image: String,
    /// An extension resource (RESOURCE.GROUP, or RESOURCE for the core
    /// group) whose changes re-reconcile the objects that refer to them;
    /// repeat or separate with commas.
    #[arg(long, value_name = "RESOURCE[.GROUP]", value_delimiter = ',')]
    pub watch_extension: Vec<String>,
    /// A kind of child the plugins return (RESOURCE.GROUP, or RESOURCE for
    /// the core group, e.g. deployments.apps, services), which the operator
    /// may apply, watch and delete; repeat or separate with commas.
    #[arg(long, value_name = "RESOURCE[.GROUP]", value_delimiter = ',')]
    pub child_resource: Vec<String>,
    /// The finalizer that lets a plugin finalize an object before it goes
    /// (default: the operator's, kplug.io/finalize).
    #[arg(long)]
    pub finalizer: Option<String>,
    /// Where the plugins' children may be: namespace (the object's) or
    /// cluster (also other namespaces and cluster-scoped kinds).
    #[arg(long, value_enum, default_value = "namespace")]
    pub child_scope: ChildScope,
    /// Operator pods; one leads, the others wait to take over.
    #[arg(long, default_value_t = Self::DEFAULT_REPLICAS)]
    pub replicas: u32,
}

impl CreateOperatorArgs {
    pub const DEFAULT_IMAGE: &str =
        concat!("ghcr.io/kplug/kplug-operator:", env!("CARGO_PKG_VERSION"));
    pub const DEFAULT_REPLICAS: u32 = 2;
}
