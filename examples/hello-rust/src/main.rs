//! The smallest kplug plugin: declares itself to kplug's registry and
//! heartbeats until Ctrl-C or SIGTERM, then deregisters.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
use tracing_subscriber::EnvFilter;

/// Heartbeats a "hello" plugin into kplug's registry.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// kplug's registry endpoint.
    #[arg(long, env = kplug_sdk::REGISTRY_ENV, default_value = kplug_sdk::DEFAULT_REGISTRY)]
    registry: String,
    /// The plugin's name in kplug.
    #[arg(long, env = "KPLUG_NAME", default_value = "hello")]
    name: String,
    /// host:port where kplug reaches this plugin.
    #[arg(long, env = "KPLUG_ADDRESS", default_value = "127.0.0.1:50052")]
    address: String,
    /// Heartbeat interval to ask for, in seconds.
    #[arg(long, env = "KPLUG_INTERVAL", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    interval: u64,
    /// The implementation's name.
    #[arg(long, env = "KPLUG_IMPLEMENTATION", default_value = "Hello")]
    implementation: String,
    /// The custom resource served, as resource.group/version.
    #[arg(long, env = "KPLUG_API", default_value = "greetings.example.com/v1")]
    api: ApiRef,
    /// A label for the Plugin object, as key=value; repeatable.
    #[arg(long = "label", env = "KPLUG_LABELS", value_delimiter = ',', value_parser = parse_label)]
    labels: Vec<(String, String)>,
}

fn parse_label(label: &str) -> Result<(String, String), String> {
    let (key, value) = label
        .split_once('=')
        .ok_or_else(|| format!("{label:?} is not key=value"))?;
    Ok((key.to_owned(), value.to_owned()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let mut info = PluginInfo::new(args.name, args.api)
        .version(env!("CARGO_PKG_VERSION"))
        .implementation(args.implementation)
        .address(args.address);
    info.labels.extend(args.labels);

    Heartbeater::new(args.registry, info)
        .interval(Duration::from_secs(args.interval))
        .run(kplug_sdk::shutdown_signal()?)
        .await
        .context("heartbeating into kplug")
}
