//! Types of the API group `plugins.kplug.io`, version `v1alpha1`.
//!
//! Field names follow the Kubernetes API conventions: `spec` is what the
//! plugin declared in its heartbeats, `status` is what kplug observed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::{Deserialize, Serialize};

/// The API group served by kplug.
pub const GROUP: &str = "plugins.kplug.io";
/// The only version of the group.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as written in `apiVersion`.
pub const API_VERSION: &str = "plugins.kplug.io/v1alpha1";

/// A live plugin registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plugin {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PluginSpec,
    pub status: PluginStatus,
}

impl Plugin {
    /// The resource's kind.
    pub const KIND: &'static str = "Plugin";
    /// The resource's plural name, as in URLs.
    pub const PLURAL: &'static str = "plugins";
    /// The kind of a list of plugins.
    pub const LIST_KIND: &'static str = "PluginList";

    /// The object's name (always set on registry objects).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The Ready condition's status is "True".
    pub fn is_ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_READY && c.status == "True")
    }
}

/// What the plugin declared about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    pub api: PluginApi,
    pub implementation: String,
    pub version: String,
    pub address: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<ExtensionKind>,
    pub heartbeat_interval_seconds: u32,
    pub protocol: Protocol,
}

/// The custom resource a plugin reconciles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginApi {
    pub group: String,
    pub resource: String,
    pub version: String,
}

impl PluginApi {
    /// `resource.group`, the form used in kubectl and in labels.
    pub fn qualified_resource(&self) -> String {
        format!("{}.{}", self.resource, self.group)
    }
}

/// An extension kind the plugin understands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionKind {
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    pub kind: String,
}

/// The wire protocol and SDK a plugin speaks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protocol {
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sdk: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// What kplug observed about the plugin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginStatus {
    pub conditions: Vec<Condition>,
    /// Refreshed at most every status refresh interval (see the README), so
    /// that unchanged heartbeats do not wake every watcher.
    pub last_heartbeat_time: Time,
    /// The registration is garbage-collected no earlier than this unless a
    /// heartbeat arrives.
    pub expires_at: Time,
    /// The identity that registered the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<String>,
}

/// The condition type that says whether a plugin can take requests.
pub const CONDITION_READY: &str = "Ready";

/// Labels kplug adds to every Plugin, under its reserved prefix.
pub mod labels {
    /// Prefix reserved for kplug; plugins may not declare labels under it.
    pub const RESERVED_PREFIX: &str = "kplug.io/";
    /// `resource.group` of the plugin's API.
    pub const API: &str = "kplug.io/api";
    /// The implementation, lower-cased.
    pub const IMPLEMENTATION: &str = "kplug.io/implementation";
}

/// Labels declared by a plugin plus kplug's own.
pub fn object_labels(
    declared: &BTreeMap<String, String>,
    spec: &PluginSpec,
) -> BTreeMap<String, String> {
    let mut all = declared.clone();
    all.insert(labels::API.to_owned(), spec.api.qualified_resource());
    all.insert(
        labels::IMPLEMENTATION.to_owned(),
        spec.implementation.to_lowercase(),
    );
    all
}
