//! The smallest kplug plugin: greets the objects it reconciles.
//!
//! It serves kplug's Plugin service and heartbeats into kplug's registry
//! until Ctrl-C or SIGTERM, then deregisters and finishes in-flight calls.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kplug_sdk::{ApiRef, Config, Outcome, Plugin, PluginInfo, Request, Severity};
use serde_json::json;
use tracing_subscriber::EnvFilter;

/// Runs a "hello" plugin: answers Reconcile with a greeting.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// kplug's registry endpoint.
    #[arg(long, env = kplug_sdk::REGISTRY_ENV, default_value = kplug_sdk::DEFAULT_REGISTRY)]
    registry: String,
    /// The plugin's name in kplug.
    #[arg(long, env = "KPLUG_NAME", default_value = "hello")]
    name: String,
    /// host:port where kplug reaches this plugin (the advertised address).
    #[arg(
        long,
        alias = "advertise",
        env = "KPLUG_ADDRESS",
        default_value = "127.0.0.1:50052"
    )]
    address: String,
    /// Address to listen on [default: --address, resolved].
    #[arg(long, env = "KPLUG_LISTEN")]
    listen: Option<SocketAddr>,
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
    /// ServiceAccount token to heartbeat with (cluster mode).
    #[arg(long, env = "KPLUG_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// CA that signed kplug's certificate, for an https:// registry.
    #[arg(long, env = "KPLUG_REGISTRY_CA_FILE")]
    registry_ca_file: Option<PathBuf>,
    #[command(flatten)]
    faults: Faults,
}

/// Knobs for tests that need a misbehaving plugin; not for real use.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Fault injection (for tests only)")]
struct Faults {
    /// Waits N milliseconds before answering any call, e.g. to exceed a
    /// deadline or to be killed mid-call.
    #[arg(long, value_name = "N", default_value_t = 0)]
    delay_ms: u64,
    /// Answers every call with a failure outcome with this reason.
    #[arg(long, value_name = "REASON")]
    fail_with: Option<String>,
    /// Panics in every call (the SDK answers gRPC INTERNAL).
    #[arg(long)]
    panic: bool,
}

fn parse_label(label: &str) -> Result<(String, String), String> {
    let (key, value) = label
        .split_once('=')
        .ok_or_else(|| format!("{label:?} is not key=value"))?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Greets by name, unless told to misbehave.
struct Hello {
    faults: Faults,
}

impl Hello {
    /// Applies the fault knobs; `Some` is the answer to give instead.
    async fn misbehave(&self) -> Option<Outcome> {
        // Even a zero sleep waits for the next timer tick (about 1 ms).
        if self.faults.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.faults.delay_ms)).await;
        }
        assert!(!self.faults.panic, "--panic was given");
        let reason = self.faults.fail_with.as_ref()?;
        Some(Outcome::failure(reason, "--fail-with was given"))
    }
}

impl Plugin for Hello {
    async fn reconcile(&self, request: Request) -> Outcome {
        if let Some(outcome) = self.misbehave().await {
            return outcome;
        }
        let Some(name) = request.name() else {
            return Outcome::failure("InvalidObject", "metadata.name is missing");
        };
        let greeting = format!("hello, {name}");
        Outcome::success()
            .result(Severity::Normal, "Greeted", &greeting)
            .object_status(json!({ "greeting": greeting }))
    }

    async fn finalize(&self, request: Request) -> Outcome {
        if let Some(outcome) = self.misbehave().await {
            return outcome;
        }
        let name = request.name().unwrap_or("stranger");
        Outcome::success().result(Severity::Normal, "Goodbye", format!("goodbye, {name}"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    // By default the plugin listens where it tells kplug to call it.
    let listen = match args.listen {
        Some(listen) => listen,
        None => args
            .address
            .to_socket_addrs()
            .ok()
            .and_then(|mut addresses| addresses.next())
            .with_context(|| {
                format!("cannot listen on --address {}; pass --listen", args.address)
            })?,
    };
    let mut info = PluginInfo::new(args.name, args.api)
        .version(env!("CARGO_PKG_VERSION"))
        .implementation(args.implementation);
    info.labels.extend(args.labels);
    let mut config = Config::default()
        .registry(args.registry)
        .listen(listen)
        .advertise(args.address)
        .heartbeat_interval(Duration::from_secs(args.interval));
    if let Some(path) = args.token_file {
        config = config.token_file(path);
    }
    if let Some(path) = args.registry_ca_file {
        config = config.registry_ca_file(path);
    }

    let hello = Hello {
        faults: args.faults,
    };
    kplug_sdk::serve(hello, info, config)
        .await
        .context("serving the hello plugin")
}
