//! The smallest kplug plugin: greets the objects it reconciles.
//!
//! It serves kplug's Plugin service and heartbeats into kplug's registry
//! until Ctrl-C or SIGTERM, then tells kplug it is draining, finishes
//! in-flight calls and deregisters.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kplug_sdk::{ApiRef, Child, Config, Outcome, Plugin, PluginInfo, Request, Severity};
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
    /// Reports the trace id of each call in the object status
    /// (`traceID`), to show a trace crossing the hops. Off by default: a
    /// status that changes on every reconcile costs the operator a write.
    #[arg(long, env = "KPLUG_REPORT_TRACE_ID")]
    report_trace_id: bool,
    /// The release it declares, instead of its own (to try upgrades and
    /// version constraints with one binary).
    #[arg(long, env = "KPLUG_PLUGIN_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    plugin_version: String,
    /// Declares no Finalize capability (its goodbye is only a greeting):
    /// the operator then puts no finalizer on the objects.
    #[arg(long, env = "KPLUG_WITHOUT_FINALIZE")]
    without_finalize: bool,
    /// Also asks for N ConfigMaps holding the greeting, NAME-greeting-0 to
    /// NAME-greeting-(N-1), as children the operator applies.
    #[arg(long, value_name = "N", default_value_t = 0)]
    greeting_config_maps: usize,
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
    /// Answers every Nth call (with 2: the 2nd, 4th, ...) with a failure
    /// outcome (reason FailedOnPurpose), e.g. a canary that fails half its
    /// calls.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    fail_every: Option<u64>,
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
    report_trace_id: bool,
    greeting_config_maps: usize,
    faults: Faults,
    /// Calls answered so far, for `--fail-every`.
    calls: AtomicU64,
}

impl Hello {
    /// Applies the fault knobs; `Some` is the answer to give instead.
    async fn misbehave(&self) -> Option<Outcome> {
        // Even a zero sleep waits for the next timer tick (about 1 ms).
        if self.faults.delay_ms > 0 {
            tracing::info!(delay_ms = self.faults.delay_ms, "delaying the answer");
            tokio::time::sleep(Duration::from_millis(self.faults.delay_ms)).await;
        }
        assert!(!self.faults.panic, "--panic was given");
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(every) = self.faults.fail_every
            && call.is_multiple_of(every)
        {
            return Some(Outcome::failure(
                "FailedOnPurpose",
                format!("--fail-every {every} was given: call {call}"),
            ));
        }
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
        // Logged inside the SDK's span for the call, so the line carries
        // operation_id and, when kplug sent a trace context, trace_id.
        // And who asked kplug for it (kplug checked their rights on the object).
        let caller = request.caller.as_ref().map_or("", |c| c.username.as_str());
        tracing::info!(%greeting, dry_run = request.dry_run, %caller, "greeting");
        let mut status = json!({ "greeting": greeting });
        if self.report_trace_id
            && let Some(trace_id) = request.trace_id()
        {
            status["traceID"] = trace_id.into();
        }
        let config_maps = (0..self.greeting_config_maps).map(|i| {
            let config_map = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": format!("{name}-greeting-{i}")},
                "data": {"greeting": greeting},
            });
            Child::new(format!("greeting-{i}"), config_map)
        });
        config_maps.fold(
            Outcome::success()
                .result(Severity::Normal, "Greeted", &greeting)
                .object_status(status),
            Outcome::child,
        )
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
    // The default format prints the fields of the SDK's span for each call
    // (operation, operation_id, trace_id, object) before every line.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // A failed write is not reported on stderr, the same broken pipe:
        // that report panics the task that logged (apiserver/tests/lost_logs.rs).
        .log_internal_errors(false)
        // Colours for people at a terminal, plain text for log collectors.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let mut info = PluginInfo::new("hello", args.api)
        .version(args.plugin_version)
        .implementation(args.implementation);
    info.labels.extend(args.labels);
    if args.without_finalize {
        info = info.without_finalize();
    }

    let hello = Hello {
        report_trace_id: args.report_trace_id,
        greeting_config_maps: args.greeting_config_maps,
        faults: args.faults,
        calls: AtomicU64::new(0),
    };
    kplug_sdk::serve(hello, info, args.kplug)
        .await
        .context("serving the hello plugin")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kplug_sdk::TraceParent;

    fn hello(report_trace_id: bool) -> Hello {
        Hello {
            report_trace_id,
            greeting_config_maps: 0,
            faults: Faults {
                delay_ms: 0,
                fail_with: None,
                fail_every: None,
                panic: false,
            },
            calls: AtomicU64::new(0),
        }
    }

    #[tokio::test]
    async fn reports_the_trace_id_when_asked_and_there_is_one() {
        let request = Request::new(json!({"metadata": {"name": "ada"}}));
        let outcome = hello(true).reconcile(request.clone()).await;
        assert_eq!(
            outcome.object_status,
            Some(json!({"greeting": "hello, ada"}))
        );

        let trace_parent: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .expect("valid");
        let traced = request.with_trace_parent(trace_parent);
        let outcome = hello(false).reconcile(traced.clone()).await;
        assert_eq!(
            outcome.object_status,
            Some(json!({"greeting": "hello, ada"})),
            "not asked to"
        );
        let outcome = hello(true).reconcile(traced).await;
        assert_eq!(
            outcome.object_status,
            Some(json!({
                "greeting": "hello, ada",
                "traceID": "4bf92f3577b34da6a3ce929d0e0e4736",
            }))
        );
    }

    #[tokio::test]
    async fn asks_for_the_greeting_config_maps_it_was_told_to() {
        let request = Request::new(json!({"metadata": {"name": "ada"}}));
        assert!(
            hello(false)
                .reconcile(request.clone())
                .await
                .children
                .is_empty()
        );
        let with_two = Hello {
            greeting_config_maps: 2,
            ..hello(false)
        };
        let outcome = with_two.reconcile(request).await;
        let keys: Vec<&str> = outcome.children.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, ["greeting-0", "greeting-1"]);
        let second = &outcome.children[1].object;
        assert_eq!(second["metadata"]["name"], "ada-greeting-1");
        assert_eq!(second["data"]["greeting"], "hello, ada");
    }
}
