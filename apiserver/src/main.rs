use std::io::IsTerminal;

use clap::Parser;
use kplug_apiserver::config::{Cli, Command};
use kplug_apiserver::server;
use tracing_subscriber::EnvFilter;

/// jemalloc rather than glibc's malloc: the registry replaces thousands of
/// small objects a second for as long as kplug runs, and glibc's heap keeps
/// growing under that churn while the live data stays flat (BENCHMARKS.md,
/// "Soak"); jemalloc's size classes and decay keep resident memory flat.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        // A failed write is not reported on stderr, the same broken pipe:
        // that report panics the task that logged (apiserver/tests/lost_logs.rs).
        .log_internal_errors(false)
        // Colours for people at a terminal, plain text for a pod's log.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Standalone(config) => runtime.block_on(server::run_standalone(config)),
        Command::Serve(config) => runtime.block_on(server::run_cluster(config)),
        Command::Certs(config) => server::certs::run(&config),
        Command::PluginCerts(config) => server::pki_plugins::run(&config),
    }
}
