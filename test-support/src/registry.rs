//! For tests that talk to kplug's registry directly: heartbeats sent by
//! hand, as a plugin's SDK would send them, and the instances a Plugin
//! object lists.

use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    DeregisterRequest, HeartbeatRequest, HeartbeatResponse, PluginApi, Protocol,
};
use serde_json::Value;

/// A heartbeat of `instance` (empty: the address names it) of the plugin
/// `name` at `address`, serving `databasetables.myorg.org/v1alpha1` and
/// asking for `interval`.
pub fn heartbeat_request(
    name: &str,
    instance: &str,
    address: &str,
    interval: Duration,
) -> HeartbeatRequest {
    HeartbeatRequest {
        name: name.to_owned(),
        instance: instance.to_owned(),
        version: "1.0.0".to_owned(),
        api: Some(PluginApi {
            group: "myorg.org".to_owned(),
            resource: "databasetables".to_owned(),
            version: "v1alpha1".to_owned(),
        }),
        implementation: "PostgreSQL".to_owned(),
        address: address.to_owned(),
        interval: Some(interval.try_into().expect("an interval protobuf can carry")),
        protocol: Some(Protocol {
            version: "v1alpha1".to_owned(),
            ..Protocol::default()
        }),
        ..HeartbeatRequest::default()
    }
}

/// The instances in a Plugin object's status (JSON, as kubectl or the API
/// shows it), in its order: name, address and whether it is ready.
pub fn plugin_instances(plugin: &Value) -> Vec<(String, String, bool)> {
    plugin["status"]["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["name"].as_str().unwrap_or_default().to_owned(),
                i["address"].as_str().unwrap_or_default().to_owned(),
                i["ready"].as_bool().unwrap_or_default(),
            )
        })
        .collect()
}

/// A registry client on a runtime of its own, for tests that heartbeat by
/// hand from synchronous code.
pub struct BlockingRegistry {
    runtime: tokio::runtime::Runtime,
    client: RegistryClient<tonic::transport::Channel>,
}

impl BlockingRegistry {
    /// Connects to the registry at `url` (`http://host:port`).
    pub fn connect(url: &str) -> Self {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let client = runtime
            .block_on(RegistryClient::connect(url.to_owned()))
            .expect("connect to the registry");
        Self { runtime, client }
    }

    pub fn heartbeat(&mut self, request: HeartbeatRequest) -> HeartbeatResponse {
        self.runtime
            .block_on(self.client.heartbeat(request))
            .expect("a heartbeat reply")
            .into_inner()
    }

    /// Sends `request`, which must be accepted.
    pub fn accepted(&mut self, request: HeartbeatRequest) {
        let reply = self.heartbeat(request);
        assert!(reply.accepted, "{reply:?}");
    }

    pub fn deregister(&mut self, name: &str, instance: &str, address: &str) -> bool {
        let request = DeregisterRequest {
            name: name.to_owned(),
            instance: instance.to_owned(),
            address: address.to_owned(),
        };
        self.runtime
            .block_on(self.client.deregister(request))
            .expect("a deregistration reply")
            .into_inner()
            .removed
    }
}
