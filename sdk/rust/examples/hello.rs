//! The plugin of the book's "Write a plugin in Rust" page, which includes
//! this file: the docs' tests run it against kplug, so the page cannot show
//! code that does not build or answer as it says.

// ANCHOR: plugin
use clap::Parser;
use kplug_sdk::{ApiRef, Config, Outcome, Plugin, PluginInfo, Request, Severity};
use serde_json::json;

struct Hello;

impl Plugin for Hello {
    async fn reconcile(&self, request: Request) -> Outcome {
        let greeting = format!("hello, {}", request.name().unwrap_or("world"));
        Outcome::success()
            .result(Severity::Normal, "Greeted", &greeting)
            .object_status(json!({ "greeting": greeting }))
    }

    async fn finalize(&self, _request: Request) -> Outcome {
        Outcome::success().result(Severity::Normal, "Goodbye", "nothing to clean up")
    }
}

/// The SDK's flags (registry, listen address, TLS, ...), each with its
/// `KPLUG_*` environment variable, beside any of the plugin's own.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    kplug: Config,
}

#[tokio::main]
async fn main() -> Result<(), kplug_sdk::Error> {
    let args = Args::parse();
    let info = PluginInfo::new("hello-rust", "greetings.example.com/v1".parse::<ApiRef>()?)
        .version(env!("CARGO_PKG_VERSION"))
        .implementation("Hello");
    kplug_sdk::serve(Hello, info, args.kplug).await
}
// ANCHOR_END: plugin
