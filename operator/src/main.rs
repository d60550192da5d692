//! `kplug-operator`: the zero-code operator. It delegates any custom
//! resource to kplug plugins, configured by flags alone.

use clap::Parser;
use kplug_operator::{Operator, OperatorArgs, discover};
use tracing::error;
use tracing_subscriber::EnvFilter;

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
    /// The kubeconfig to use (default: in-cluster, else ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Log filter, e.g. info or info,kplug_operator=debug.
    #[arg(long, env = "KPLUG_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    operator: OperatorArgs,
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing the reconciles under way");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    let client = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            kube::Client::try_from(config)?
        }
        None => kube::Client::try_default().await?,
    };
    let resource = discover(&client, &cli.resource, cli.resource_version.as_deref()).await?;
    let options = cli.operator.options(&cli.resource);
    Operator::new(client, resource, options)
        .run(shutdown_signal())
        .await?;
    Ok(())
}
