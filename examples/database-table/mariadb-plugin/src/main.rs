//! `mariadb-plugin`: serves `DatabaseTable` objects as MariaDB tables.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use mariadb_plugin::MariaDbPlugin;
use mariadb_plugin::mariadb::{Server, Servers};
use tracing_subscriber::EnvFilter;

/// A kplug plugin that creates and alters MariaDB tables to match
/// DatabaseTable objects (myorg.org/v1alpha1).
///
/// Prefer the environment for URLs: they carry passwords, and command lines
/// are visible to every user of the host.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    kplug: kplug_sdk::Config,
    /// The MariaDB server and database for tables, e.g.
    /// mysql://user:password@host:3306/database, or over a unix socket
    /// mysql://user:password@localhost/database?socket=/run/mysqld/mysqld.sock.
    /// With --server: only for tables that name no spec.serverName.
    #[arg(long, env = "MARIADB_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// A server that spec.serverName can name, as NAME=URL; repeatable.
    /// With any of these, an unknown spec.serverName fails.
    #[arg(long = "server", value_name = "NAME=URL", env = "MARIADB_SERVERS", value_delimiter = ',', hide_env_values = true, value_parser = parse_server)]
    servers: Vec<(String, String)>,
}

fn parse_server(text: &str) -> Result<(String, String), String> {
    let (name, url) = text
        .split_once('=')
        .ok_or("expected NAME=URL, e.g. main=mysql://user:password@host/database")?;
    Ok((name.to_owned(), url.to_owned()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // A failed write is not reported on stderr, the same broken pipe:
        // that report panics the task that logged (apiserver/tests/lost_logs.rs).
        .log_internal_errors(false)
        // Colours for people at a terminal, plain text for `kubectl logs`.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();

    let mut servers = Servers::default();
    if let Some(url) = &args.database_url {
        servers = servers.with_default(Server::new("default", url)?);
    }
    for (name, url) in &args.servers {
        servers = servers.with_named(Server::new(name, url)?);
    }
    anyhow::ensure!(
        !servers.is_empty(),
        "no database configured: pass --database-url (MARIADB_URL) or --server NAME=URL"
    );

    let plugin = MariaDbPlugin::new(servers.clone());
    let served = kplug_sdk::serve(plugin, mariadb_plugin::plugin_info(), args.kplug).await;
    for server in servers.into_all() {
        server.disconnect().await;
    }
    served.context("serving the MariaDB plugin")
}
