//! Plugins as the benches simulate them: a realistic declaration per
//! plugin number, and the few gRPC connections that carry their heartbeats.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    ExtensionKind, HeartbeatRequest, PROTOCOL_VERSION, PluginApi, Protocol,
};
use tonic::transport::{Channel, Endpoint};

use super::REQUEST_TIMEOUT;

/// The name of plugin number `index`.
pub fn plugin_name(index: usize) -> String {
    format!("bench-plugin-{index:05}")
}

/// A realistic declaration for plugin number `index`, asking for
/// `interval` (`None`: the registry's choice, as the SDK asks by default).
pub fn declaration(index: usize, interval: Option<Duration>) -> HeartbeatRequest {
    HeartbeatRequest {
        name: plugin_name(index),
        version: "1.4.2".to_owned(),
        api: Some(PluginApi {
            group: "databases.bench.kplug.io".to_owned(),
            resource: "databasetables".to_owned(),
            version: "v1alpha1".to_owned(),
        }),
        implementation: "PostgreSQL".to_owned(),
        // Never dialled: the registry only records where plugins listen.
        address: format!("plugin-{index:05}.bench.invalid:50051"),
        extensions: vec![ExtensionKind {
            group: "backups.bench.kplug.io".to_owned(),
            kind: "Backup".to_owned(),
            version: String::new(),
        }],
        labels: HashMap::from([
            ("team".to_owned(), format!("team-{}", index % 10)),
            ("tier".to_owned(), "gold".to_owned()),
        ]),
        interval: interval.and_then(|interval| prost_types::Duration::try_from(interval).ok()),
        protocol: Some(Protocol {
            version: PROTOCOL_VERSION.to_owned(),
            sdk: "kplug-bench/0.1.0".to_owned(),
            capabilities: vec!["Reconcile".to_owned(), "Finalize".to_owned()],
        }),
        ..Default::default()
    }
}

/// `channels` gRPC clients of the registry at `address`, each on its own
/// HTTP/2 connection, with requests bounded by [`REQUEST_TIMEOUT`].
pub async fn connect_registry(
    address: SocketAddr,
    channels: usize,
) -> Result<Vec<RegistryClient<Channel>>> {
    let endpoint = registry_endpoint(address)?;
    let mut clients = Vec::with_capacity(channels);
    for _ in 0..channels {
        // One Endpoint::connect is one HTTP/2 connection.
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to grpc://{address}"))?;
        clients.push(RegistryClient::new(channel));
    }
    Ok(clients)
}

/// Like [`connect_registry`], but each connection is opened by its first
/// call, as a plugin opens its connection when it starts and heartbeats at
/// once: a fleet whose first heartbeats are spread over an interval does
/// not hold connections idle before its first request.
pub fn lazy_registry_clients(
    address: SocketAddr,
    channels: usize,
) -> Result<Vec<RegistryClient<Channel>>> {
    let endpoint = registry_endpoint(address)?;
    Ok((0..channels)
        .map(|_| RegistryClient::new(endpoint.connect_lazy()))
        .collect())
}

fn registry_endpoint(address: SocketAddr) -> Result<Endpoint> {
    Ok(Endpoint::from_shared(format!("http://{address}"))
        .context("the gRPC endpoint")?
        .timeout(REQUEST_TIMEOUT))
}
