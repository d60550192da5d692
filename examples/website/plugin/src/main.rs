//! A kplug plugin that manages Kubernetes objects: each Website (the
//! `websites.sites.example.com` custom resource) becomes a ConfigMap of its
//! pages, a Deployment of busybox httpd serving them and a Service in front,
//! which the plugin returns as desired children ([`site`]) and kplug's
//! operator applies, in waves, owns, watches and prunes. The plugin itself
//! holds no Kubernetes client and no rights in the cluster.

mod site;

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use kplug_sdk::{ApiRef, Config, Outcome, Plugin, PluginInfo, Request, Severity};
use tracing_subscriber::EnvFilter;

use site::Site;

/// Runs the website plugin.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Where it listens, what it advertises, the registry, the heartbeat
    /// interval, credentials: the SDK's own flags.
    #[command(flatten)]
    kplug: Config,
    /// The image that serves the pages: any with busybox's httpd.
    #[arg(long, env = "WEBSITE_IMAGE", default_value = "busybox:1.37")]
    image: String,
}

struct Websites {
    image: String,
}

impl Plugin for Websites {
    async fn reconcile(&self, request: Request) -> Outcome {
        let site = match Site::of(&request) {
            Ok(site) => site,
            Err(error) => return Outcome::failure("InvalidWebsite", error.to_string()),
        };
        let children = match site.children(&self.image) {
            Ok(children) => children,
            Err(error) => return Outcome::failure("InvalidWebsite", error.to_string()),
        };
        let status = site.status(&request);
        let pages = site.spec.pages.len();
        children.into_iter().fold(
            Outcome::success()
                .result(
                    Severity::Normal,
                    "SiteDesired",
                    format!("{pages} page(s), {} replica(s)", site.spec.replicas),
                )
                .object_status(status),
            Outcome::child,
        )
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // A failed write is not reported on stderr, the same broken pipe:
        // that report panics the task that logged (apiserver/tests/lost_logs.rs).
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let api: ApiRef = "websites.sites.example.com/v1alpha1"
        .parse()
        .context("the Website API")?;
    // A Website is only its children, which the operator removes itself,
    // in reverse waves: nothing outside the cluster to clean up.
    let info = PluginInfo::new("website", api)
        .version(env!("CARGO_PKG_VERSION"))
        .implementation("BusyboxHttpd")
        .without_finalize();
    kplug_sdk::serve(Websites { image: args.image }, info, args.kplug)
        .await
        .context("serving the website plugin")
}
