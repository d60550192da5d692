//! The smallest kplug plugin: greets the objects it reconciles.
//!
//! It serves kplug's Plugin service and heartbeats into kplug's registry
//! until Ctrl-C or SIGTERM, then deregisters and finishes in-flight calls.

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
    /// Where it listens, what it advertises, the registry, the heartbeat
    /// interval, credentials: the SDK's own flags.
    #[command(flatten)]
    kplug: Config,
    /// The implementation's name.
    #[arg(long, env = "KPLUG_IMPLEMENTATION", default_value = "Hello")]
    implementation: String,
    /// The custom resource served, as resource.group/version.
    #[arg(long, env = "KPLUG_API", default_value = "greetings.example.com/v1")]
    api: ApiRef,
    /// A label for the Plugin object, as key=value; repeatable.
    #[arg(long = "label", env = "KPLUG_LABELS", value_delimiter = ',', value_parser = parse_label)]
    labels: Vec<(String, String)>,
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
    let mut info = PluginInfo::new("hello", args.api)
        .version(env!("CARGO_PKG_VERSION"))
        .implementation(args.implementation);
    info.labels.extend(args.labels);

    let hello = Hello {
        faults: args.faults,
    };
    kplug_sdk::serve(hello, info, args.kplug)
        .await
        .context("serving the hello plugin")
}
