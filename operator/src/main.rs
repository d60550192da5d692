//! `kplug-operator`: the zero-code operator. It delegates any custom
//! resource to kplug plugins, configured by flags alone.

use clap::Parser;
use kplug_operator::{Operator, OperatorArgs, discover, shutdown_signal};

/// Watches a custom resource and delegates every object to a kplug plugin.
#[derive(Debug, Parser)]
#[command(name = "kplug-operator", version)]
struct Cli {
    /// The resource to operate, as resource.group (e.g. databasetables.myorg.org).
    #[arg(long, env = "KPLUG_OPERATOR_RESOURCE")]
    resource: String,
    /// Its version (default: the group's preferred version).
    #[arg(long = "resource-version", env = "KPLUG_OPERATOR_RESOURCE_VERSION")]
    resource_version: Option<String>,
    #[command(flatten)]
    operator: OperatorArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.operator.init_logging()?;
    let config = cli.operator.kube_config().await?;
    let client = kube::Client::try_from(config.clone())?;
    let resource = discover(&client, &cli.resource, cli.resource_version.as_deref()).await?;
    let options = cli.operator.options(&cli.resource);
    Operator::new(config, resource, options)?
        .run(shutdown_signal())
        .await?;
    Ok(())
}
