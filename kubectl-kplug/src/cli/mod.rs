//! The command line, shaped like kubectl's own commands: an Examples
//! section, then Options, then the Usage line, so that `kubectl kplug
//! --help` reads like `kubectl get --help`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use kplug_operator::{BindingPolicy, ChildScope, FieldPath};

mod create;

pub use create::{CreateCommand, CreateOperatorArgs, CreatePluginArgs};

/// kubectl prints help as: description, Examples, Options, Usage.
const TEMPLATE: &str = "\
{about-with-newline}
{before-help}{all-args}

Usage:
  {usage}{after-help}";

const MORE: &str =
    "Use \"kubectl kplug <command> --help\" for more information about a given command.";

const ROOT_EXAMPLES: &str = "\
Examples:
  # Reconcile the DatabaseTable users through kplug, as the operator would
  kubectl kplug reconcile databasetable/users

  # See what a reconcile would do without changing anything
  kubectl kplug reconcile databasetable/users --dry-run=server

  # Which plugins serve which APIs, and which one would get a DatabaseTable
  kubectl kplug plugins
  kubectl kplug plugins databasetables";

const RECONCILE_ABOUT: &str = "\
Reconcile one object through kplug, by hand, exactly as an operator built
on kplug-operator delegates it.

TYPE is resolved the way kubectl resolves it (plural, singular, kind, short
name, or qualified as plural.group or plural.version.group). The object and
the extension objects it references (spec.extensions by default) are read
with your credentials and sent in one create of reconciles.plugins.kplug.io;
kplug chooses a Ready plugin of the object's API and answers with the
plugin's outcome, which is printed: the plugin chosen and why, each result,
and the object and extension statuses the plugin reported.

The plugin does its work (for a DatabaseTable, the table is created or
altered) unless --dry-run=server is given. This command NEVER writes status
back to the object or its extensions, nor applies the Kubernetes objects
the plugin returns (its children): the operator does that on its next
reconcile. The object's children, as its status.children lists them, are
sent as the operator sends them; with --dry-run=server the children of the
answer are applied as the operator would apply them, as a server-side dry
run, and what each would change is printed.

The object's preferred implementation (spec.preferredImplementation) is
sent as preferredImplementation; --implementation overrides it. An object
the operator has bound to an implementation (status.implementation) only
goes to plugins of that implementation (requiredImplementation), as with the
operator's default Sticky binding; --binding FollowSelection lets kplug
choose freely. --plugin names the plugin and skips selection.

Exits 0 when the plugin succeeded, 1 when it reported a failure (the outcome
is printed) or when the object could not be reconciled (the error says why
and what to do).";

const RECONCILE_EXAMPLES: &str = "\
Examples:
  # Reconcile the DatabaseTable users in the current namespace
  kubectl kplug reconcile databasetable/users

  # The same, fully qualified, in another namespace, without changing anything
  kubectl kplug reconcile databasetables.myorg.org/users -n shop --dry-run=server

  # Prefer the MariaDB implementation, or send it to one plugin by name
  kubectl kplug reconcile databasetable users --implementation MariaDB
  kubectl kplug reconcile databasetable/users --plugin database-table-postgresql-plugin

  # Print the whole Reconcile answer
  kubectl kplug reconcile databasetable/users -o yaml";

const PLUGINS_ABOUT: &str = "\
List the plugins registered with kplug: the API each serves, its
implementation and version, whether it is Ready, its instances when kplug
reports them, and its canary when it has one (its version and share, or
that kplug withdrew it).

With RESOURCE (a TYPE as kubectl takes it), list the plugins of that
resource's API and say which one a reconcile of it would be sent to, and
why, by the same rule kplug applies (highest version, then smallest name,
within the preferred implementation when one is given and Ready). A single
object can still go elsewhere: its own spec.preferredImplementation and its
binding count; `kubectl kplug reconcile TYPE/NAME --dry-run=server` shows
its choice.";

const PLUGINS_EXAMPLES: &str = "\
Examples:
  # All plugins
  kubectl kplug plugins

  # The plugins of DatabaseTables, and which one would get a reconcile
  kubectl kplug plugins databasetables

  # The same, when the object prefers MariaDB
  kubectl kplug plugins databasetables.myorg.org --implementation MariaDB";

const SHADOW_ABOUT: &str = "\
Show how a plugin's shadow instances answered the dry-run copies kplug sent
them of the plugin's reconciles, compared with the answers the callers got:
the counts (same, different, failed, skipped) and, newest first, the last
differences field by field (- the caller's answer, + the shadow's).

A shadow is an instance started with --shadow (both SDKs): it serves no
caller. The figures are those of the kplug replica that answers, since it
first copied a reconcile of the plugin.";

const SHADOW_EXAMPLES: &str = "\
Examples:
  # How the shadow of the tables plugin compares
  kubectl kplug shadow tables

  # The same as an object, for scripts
  kubectl kplug shadow tables -o json";

const RENDER_ABOUT: &str = "\
Run a plugin on your machine on objects from files, with no cluster and no
kplug, and print its answer: what kplug would answer a reconcile with.

The first document of the -f files is the object, every further one an
extension object it is sent with (as the operator resolves spec.extensions);
YAML or JSON, several documents per file, - for stdin. Each must be a
Kubernetes object: apiVersion, kind and metadata.name.

The plugin is COMMAND, started here with KPLUG_LOCAL_ADDRESS_FILE and
KPLUG_LISTEN=127.0.0.1:0 in its environment: a plugin built with kplug's
SDKs (Rust or Python) then serves plain gRPC on a free port without
heartbeating, and says where. What it logs goes to stderr; it is stopped
(SIGTERM, then SIGKILL after 5s) once it has answered. --plugin-address
calls a plugin that is already running instead, serving plain gRPC.

The plugin does its work unless --dry-run is given, which it must honour by
changing nothing. Prints the outcome as YAML (-o json for JSON): success,
results, conditions, the object's status, the extensions' statuses and when
to reconcile again. Exits 0 when the plugin succeeded and 1 when it reported
a failure (the outcome is printed), or when it could not be asked (a file
that is not an object, a plugin that does not start or does not answer in
time; nothing is printed on stdout).";

const RENDER_EXAMPLES: &str = "\
Examples:
  # Reconcile a Greeting with the Rust hello plugin, built from this repository
  kubectl kplug render -f greeting.yaml -- target/debug/hello-plugin

  # A DatabaseTable and its extension, planned but not applied, by the PostgreSQL plugin
  kubectl kplug render -f table.yaml -f table-postgresql.yaml --dry-run -- \\
    database-table-postgresql-plugin --dsn postgresql://localhost/shop

  # The object is being deleted: call Finalize
  kubectl kplug render -f greeting.yaml --finalize -- target/debug/hello-plugin

  # A plugin you started yourself, e.g. in a debugger
  kubectl kplug render -f greeting.yaml --plugin-address 127.0.0.1:50052";

const COMPLETION_EXAMPLES: &str = "\
Examples:
  # bash: load completions for kubectl-kplug in the current shell
  source <(kubectl kplug completion bash)

  # zsh
  kubectl kplug completion zsh > \"${fpath[1]}/_kubectl-kplug\"

  # fish
  kubectl kplug completion fish > ~/.config/fish/completions/kubectl-kplug.fish";

/// `kubectl kplug`: reconcile objects through kplug's plugins by hand.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-kplug",
    bin_name = "kubectl kplug",
    version,
    about = "Work with kplug plugins: reconcile an object through them by hand, see which plugin serves which API.",
    before_help = ROOT_EXAMPLES,
    after_help = MORE,
    help_template = TEMPLATE,
    subcommand_help_heading = "Available Commands",
    override_usage = "kubectl kplug [command] [options]",
    disable_help_subcommand = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Reconcile one object through kplug, printing the plugin's outcome
    #[command(
        long_about = RECONCILE_ABOUT,
        before_help = RECONCILE_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug reconcile (TYPE[.VERSION][.GROUP] NAME | TYPE[.VERSION][.GROUP]/NAME) [options]"
    )]
    Reconcile(ReconcileArgs),
    /// List plugins, or say which plugin a resource's reconciles go to
    #[command(
        long_about = PLUGINS_ABOUT,
        before_help = PLUGINS_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug plugins [RESOURCE] [options]"
    )]
    Plugins(PluginsArgs),
    /// Show where a plugin's shadow answered otherwise than the plugin
    #[command(
        long_about = SHADOW_ABOUT,
        before_help = SHADOW_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug shadow PLUGIN [options]"
    )]
    Shadow(ShadowArgs),
    /// Run a plugin locally on objects from files and print its answer
    #[command(
        long_about = RENDER_ABOUT,
        before_help = RENDER_EXAMPLES,
        after_help = MORE,
        help_template = TEMPLATE,
        override_usage = "kubectl kplug render -f FILE [-f FILE...] [options] (-- COMMAND [ARGS...] | --plugin-address HOST:PORT)"
    )]
    Render(RenderArgs),
    /// Print the manifests of a plugin or an operator
    #[command(subcommand, help_template = TEMPLATE, after_help = MORE)]
    Create(CreateCommand),
    /// Print a shell completion script (bash, zsh or fish)
    #[command(
        before_help = COMPLETION_EXAMPLES,
        help_template = TEMPLATE,
        after_help = MORE,
        override_usage = "kubectl kplug completion SHELL [options]"
    )]
    Completion {
        #[arg(value_name = "SHELL", value_parser = completion_shell)]
        shell: Shell,
    },
    /// Print the version of kubectl kplug
    #[command(help_template = TEMPLATE, override_usage = "kubectl kplug version [options]")]
    Version,
}

#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("plugin").required(true).args(["command", "plugin_address"]))]
pub struct RenderArgs {
    /// A file of objects: the first document is the object, the rest its
    /// extensions; - reads stdin. Repeat for more files.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Call Finalize, as for an object being deleted, instead of Reconcile.
    #[arg(long)]
    pub finalize: bool,
    /// The plugin plans and reports, and changes nothing (dryRun).
    #[arg(long)]
    pub dry_run: bool,
    /// Call this running plugin (plain gRPC) instead of starting COMMAND.
    #[arg(long, value_name = "HOST:PORT")]
    pub plugin_address: Option<String>,
    /// The plugin's deadline, sent with the call.
    #[arg(long, default_value = "30s", value_parser = kplug_proto::duration::parse)]
    pub timeout: Duration,
    /// How long COMMAND may take to start serving.
    #[arg(long, default_value = "30s", value_parser = kplug_proto::duration::parse)]
    pub start_timeout: Duration,
    /// The outcome as yaml or json.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// A file of the object's children as the operator observed them (what
    /// `kubectl get deployment NAME -o yaml` prints): each carries the
    /// plugins.kplug.io/child-key annotation the operator sets; a List's
    /// items are read one by one. Repeat for more files.
    #[arg(long, value_name = "FILE")]
    pub observed: Vec<PathBuf>,
    /// Where the plugin's children may be, as the operator allows: only in
    /// the object's namespace, or anywhere in the cluster.
    #[arg(long, value_enum, default_value = "namespace")]
    pub child_scope: ChildScope,
    /// The plugin's command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Only the shells the README documents.
fn completion_shell(text: &str) -> Result<Shell, String> {
    match text {
        "bash" => Ok(Shell::Bash),
        "zsh" => Ok(Shell::Zsh),
        "fish" => Ok(Shell::Fish),
        other => Err(format!(
            "unsupported shell {other:?}: supported values: bash, zsh, fish"
        )),
    }
}

/// How to reach the cluster, as kubectl's global flags (kubectl does not
/// pass its own flags on to plugins, so they are given after `kplug`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global Options")]
pub struct ConnectionArgs {
    /// Path to the kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The name of the kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// If present, the namespace scope for this request (default: the context's, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Username to impersonate for the operation.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Group to impersonate for the operation; repeat for more groups.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_groups: Vec<String>,
}

/// kubectl's `--dry-run` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    /// Reconcile for real.
    None,
    /// The plugin plans but changes nothing (kplug's dryRun); the
    /// children it returns are applied as a server-side dry run.
    Server,
    /// Send nothing: print the Reconcile that would be sent.
    Client,
}

/// kubectl's `-o` formats that apply to a whole answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

/// `-o` for lists: also the wider table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    Wide,
    Yaml,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// TYPE/NAME, or TYPE when NAME follows.
    #[arg(value_name = "TYPE/NAME")]
    pub target: String,
    /// The object's name, when TYPE was given alone.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// Send it to this plugin (spec.plugin), skipping kplug's selection.
    #[arg(long, value_name = "PLUGIN")]
    pub plugin: Option<String>,
    /// Prefer plugins of this implementation (spec.preferredImplementation;
    /// case-insensitive; others serve when it has no Ready plugin).
    /// Default: the object's own preference.
    #[arg(long, value_name = "IMPLEMENTATION")]
    pub implementation: Option<String>,
    /// "server": the plugin plans but changes nothing; "client": print the
    /// request and send nothing; "none": reconcile for real.
    #[arg(long, value_enum, default_value = "none", num_args = 0..=1, default_missing_value = "server", require_equals = true)]
    pub dry_run: DryRun,
    /// Print the whole Reconcile answer as yaml or json.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Format>,
    /// Send a reference (spec.objectRef) instead of the object: kplug reads
    /// the object and its extensions itself, after checking that you may
    /// get them, so the plugin sees exactly what is stored.
    #[arg(long)]
    pub by_reference: bool,
    /// The plugin's deadline.
    #[arg(long, default_value = "30s", value_parser = kplug_proto::duration::parse)]
    pub timeout: Duration,
    /// Where objects list their extension references (as kplug-operator's flag).
    #[arg(long, default_value = "spec.extensions")]
    pub extensions_path: FieldPath,
    /// Where objects name their preferred implementation (as kplug-operator's flag).
    #[arg(long, default_value = "spec.preferredImplementation")]
    pub preferred_implementation_path: FieldPath,
    /// The plugin versions that may serve an object that names none (a
    /// semver range, as kplug-operator's flag).
    #[arg(long)]
    pub version_constraint: Option<String>,
    /// Where objects name the plugin versions that may serve them (as
    /// kplug-operator's flag).
    #[arg(long, default_value = "spec.pluginVersion")]
    pub version_constraint_path: FieldPath,
    /// Sticky: an object bound to an implementation (status.implementation)
    /// only goes to it, as the operator does by default. FollowSelection:
    /// kplug chooses freely.
    #[arg(long, default_value = "Sticky")]
    pub binding: BindingPolicy,
    /// Where the plugin's children may be, as kplug-operator's flag:
    /// namespace (the object's) or cluster.
    #[arg(long, value_enum, default_value = "namespace")]
    pub child_scope: ChildScope,
}

#[derive(Debug, Clone, Args)]
pub struct ShadowArgs {
    /// The plugin's name (kubectl kplug plugins lists them).
    #[arg(value_name = "PLUGIN")]
    pub plugin: String,
    /// yaml or json: the PluginShadow object.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Format>,
}

#[derive(Debug, Clone, Args)]
pub struct PluginsArgs {
    /// Only the plugins of this resource's API (a TYPE as kubectl takes it),
    /// and which of them a reconcile would go to.
    #[arg(value_name = "RESOURCE")]
    pub resource: Option<String>,
    /// With RESOURCE: the preferred implementation to choose with.
    #[arg(long, value_name = "IMPLEMENTATION")]
    pub implementation: Option<String>,
    /// wide: more columns; yaml or json: the Plugin objects.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ListFormat>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn reconcile_flags_parse_like_kubectl() {
        let cli = Cli::try_parse_from([
            "kubectl-kplug",
            "reconcile",
            "databasetable/users",
            "-n",
            "shop",
            "--dry-run=server",
            "-o",
            "yaml",
            "--implementation",
            "MariaDB",
        ])
        .expect("parses");
        let Command::Reconcile(args) = cli.command else {
            panic!("reconcile")
        };
        assert_eq!(cli.connection.namespace.as_deref(), Some("shop"));
        assert_eq!(args.dry_run, DryRun::Server);
        assert_eq!(args.output, Some(Format::Yaml));
        assert_eq!(args.timeout, Duration::from_secs(30));
        assert_eq!(args.extensions_path.to_string(), "spec.extensions");
        assert_eq!(args.binding, BindingPolicy::Sticky);
        let bare = Cli::try_parse_from(["kubectl-kplug", "reconcile", "t/n", "--dry-run"])
            .expect("parses");
        assert!(matches!(
            bare.command,
            Command::Reconcile(ReconcileArgs {
                dry_run: DryRun::Server,
                ..
            })
        ));
    }

    #[test]
    fn help_reads_like_kubectl() {
        let help = Cli::command()
            .find_subcommand_mut("reconcile")
            .expect("reconcile")
            .render_long_help()
            .to_string();
        let examples = help.find("Examples:").expect("examples");
        let options = help.find("Options:").expect("options");
        let usage = help.find("Usage:").expect("usage");
        assert!(examples < options && options < usage, "{help}");
        assert!(help.contains("kubectl kplug reconcile (TYPE"), "{help}");
        assert!(help.contains("NEVER writes status"), "{help}");
    }

    #[test]
    fn unsupported_shells_are_refused() {
        let error = Cli::try_parse_from(["kubectl-kplug", "completion", "powershell"])
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("supported values: bash, zsh, fish"),
            "{error}"
        );
    }
}
