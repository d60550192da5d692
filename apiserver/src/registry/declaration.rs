//! A plugin instance's validated self-description, as carried by its
//! heartbeats.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::v1alpha1::{ExtensionKind, PluginApi, PluginSpec, Protocol};

/// What one instance of a plugin says about itself. Two heartbeats with
/// equal declarations change nothing in the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declaration {
    pub name: String,
    /// The instance's own name, e.g. its pod's; empty for plugins that
    /// predate instances, whose address names the instance.
    pub instance: String,
    /// The instance is shutting down: no new calls.
    pub draining: bool,
    pub version: String,
    pub api: PluginApi,
    pub implementation: String,
    pub address: String,
    /// The TLS name to verify when calling the instance; empty means the
    /// host part of `address`.
    pub server_name: String,
    pub extensions: Vec<ExtensionKind>,
    pub labels: BTreeMap<String, String>,
    /// Already clamped to the range the registry accepts.
    pub interval: Duration,
    pub protocol: Protocol,
    /// The authenticated identity that sent the heartbeat, when known.
    pub registered_by: Option<String>,
}

impl Declaration {
    /// What tells this instance from the plugin's others: its name, or its
    /// address when it has none. The two never collide: instance names are
    /// DNS names, addresses always hold a ':'.
    pub fn identity(&self) -> &str {
        if self.instance.is_empty() {
            &self.address
        } else {
            &self.instance
        }
    }

    /// The Plugin `spec` this declaration renders to.
    pub fn spec(&self) -> PluginSpec {
        PluginSpec {
            api: self.api.clone(),
            implementation: self.implementation.clone(),
            version: self.version.clone(),
            address: self.address.clone(),
            extensions: self.extensions.clone(),
            heartbeat_interval_seconds: u32::try_from(self.interval.as_secs()).unwrap_or(u32::MAX),
            protocol: self.protocol.clone(),
        }
    }
}
