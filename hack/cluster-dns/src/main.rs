//! kplug-cluster-dns: the test cluster's stand-in for CoreDNS (see
//! README.md beside this crate). It answers for the cluster domain only,
//! from a watch of Services and Endpoints, and forwards nothing.

mod server;
mod sync;
mod zone;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use hickory_proto::rr::Name;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::server::BindError;
use crate::sync::SyncError;
use crate::zone::Zone;

/// The test cluster's DNS: Service and Endpoints names under the cluster
/// domain, from a watch of kube-apiserver. Refuses every other name and
/// forwards nothing. Answers SERVFAIL for names in the domain until the
/// first list of Services and Endpoints is complete.
#[derive(Debug, Parser)]
#[command(name = "kplug-cluster-dns", version)]
struct Args {
    /// The kubeconfig to watch Services and Endpoints with (list and watch
    /// both, in all namespaces: the bootstrap ClusterRole system:kube-dns);
    /// default: $KUBECONFIG, ~/.kube/config, or the pod's service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,

    /// Where to answer, UDP and TCP both (repeat for more addresses; port 0
    /// picks a port free for both, logged at startup).
    #[arg(long, value_name = "ADDR:PORT", required = true)]
    listen: Vec<SocketAddr>,

    /// The cluster domain, the only one answered for.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local")]
    domain: String,

    /// Time-to-live of every record, and of negative answers, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    ttl: u32,

    /// Log filter (tracing's EnvFilter syntax); RUST_LOG overrides it.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    log: String,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("--domain {domain:?} is not a domain name: {source}")]
    Domain {
        domain: String,
        #[source]
        source: hickory_proto::ProtoError,
    },
    #[error("--log {filter:?}: {source}")]
    Log {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("cannot read the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("no Kubernetes client configuration: {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("cannot make a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("the DNS server stopped: {0}")]
    Serve(#[from] hickory_server::net::NetError),
    #[error("cannot handle signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = match std::env::var("RUST_LOG") {
        Ok(filter) if !filter.is_empty() => filter,
        _ => format!("{},hickory_server=warn", args.log),
    };
    match EnvFilter::try_new(&filter) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        Err(source) => {
            eprintln!("kplug-cluster-dns: {}", Error::Log { filter, source });
            return ExitCode::from(2);
        }
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::Runtime)
        .and_then(|runtime| runtime.block_on(run(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    // Before anything another process can observe (the first log line): a
    // SIGTERM that comes earlier would kill the server instead of stopping it.
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let mut domain = Name::from_ascii(&args.domain).map_err(|source| Error::Domain {
        domain: args.domain.clone(),
        source,
    })?;
    domain.set_fqdn(true);
    let domain = domain.to_lowercase();

    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    let apiserver = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)?;

    let mut sockets = Vec::new();
    for addr in &args.listen {
        let (udp, tcp) = server::bind(*addr).await?;
        let bound = udp.local_addr().map_err(|source| BindError {
            protocol: "udp",
            addr: *addr,
            source,
        })?;
        info!("listening on {bound} (udp and tcp)");
        sockets.push((udp, tcp));
    }

    let (publish, latest) = watch::channel::<Option<Arc<Zone>>>(None);
    let mut dns = server::serve(domain.clone(), latest, sockets);
    info!(
        %apiserver,
        ttl = args.ttl,
        "SERVFAIL for {domain} until Services and Endpoints are listed; REFUSED for any other name"
    );
    let mut watch = tokio::spawn(sync::run(client, domain, args.ttl, publish));

    let outcome = tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        _ = interrupt.recv() => Ok("SIGINT"),
        ended = &mut watch => Err(match ended {
            Ok(Err(e)) => Error::Sync(e),
            Ok(Ok(())) | Err(_) => Error::Sync(SyncError::WatchEnded),
        }),
        served = dns.block_until_done() => Err(match served {
            Err(e) => Error::Serve(e),
            Ok(()) => Error::Serve("every socket closed".into()),
        }),
    };
    watch.abort();
    let signal = outcome?;
    info!("{signal}: stopping");
    dns.shutdown_gracefully().await?;
    Ok(())
}
