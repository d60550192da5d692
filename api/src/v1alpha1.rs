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

    /// Every address the plugin is served at: its instances', then the
    /// spec's (the newest instance's, or the only one before instances).
    pub fn addresses(&self) -> impl Iterator<Item = &str> {
        self.status
            .instances
            .iter()
            .map(|i| i.address.as_str())
            .chain(std::iter::once(self.spec.address.as_str()))
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
    /// The processes serving the plugin, in the order they registered
    /// (`spec` follows the last). Empty only in objects from servers that
    /// predate instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<PluginInstance>,
}

impl PluginStatus {
    /// The instances kplug sends calls to: Ready, hence not draining
    /// (shadows included: they take dry-run copies).
    pub fn ready_instances(&self) -> impl Iterator<Item = &PluginInstance> {
        self.instances.iter().filter(|i| i.ready)
    }

    /// The instances that serve callers: Ready, and not shadows.
    pub fn serving_instances(&self) -> impl Iterator<Item = &PluginInstance> {
        self.ready_instances().filter(|i| !i.is_shadow())
    }

    /// `ready/total`, as the INSTANCES column shows it.
    pub fn instances_summary(&self) -> String {
        format!(
            "{}/{}",
            self.ready_instances().count(),
            self.instances.len()
        )
    }
}

/// One process serving a plugin, e.g. one pod of its Deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInstance {
    /// The instance's own name (e.g. its pod's), or its address when it
    /// declares none.
    pub name: String,
    /// host:port where kplug reaches this instance.
    pub address: String,
    /// The name kplug verifies in the instance's serving certificate; empty
    /// means the host part of `address`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_name: String,
    /// The instance's release: instances differ during a rolling update.
    pub version: String,
    /// kplug sends the instance calls: it heartbeats on time and is not
    /// draining (as an EndpointSlice endpoint is not ready while it
    /// terminates).
    pub ready: bool,
    /// The instance is shutting down and takes no new calls.
    pub draining: bool,
    /// Refreshed as rarely as the plugin's `lastHeartbeatTime`.
    pub last_heartbeat_time: Time,
    /// A canary: the percentage (1-99) of the plugin's objects its version
    /// takes; absent for a stable instance. A withdrawn canary is not ready.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub canary_weight: u32,
    /// A shadow: the percentage (1-100) of the plugin's reconciles it
    /// receives a dry-run copy of, after another instance answered; absent
    /// for an instance that serves callers. A shadow serves no caller.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shadow_percent: u32,
}

impl PluginInstance {
    /// Whether the instance is a shadow, which serves no caller.
    pub fn is_shadow(&self) -> bool {
        self.shadow_percent > 0
    }
}

fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The condition type that says whether a plugin can take requests.
pub const CONDITION_READY: &str = "Ready";

/// The condition type of a plugin with canary instances: `True` while the
/// canary takes its share, `False` (reason `Withdrawn`) once kplug withdrew
/// it for failing more often than the stable instances.
pub const CONDITION_CANARY: &str = "Canary";

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
pub fn object_labels<'a>(
    declared: impl IntoIterator<Item = (&'a str, &'a str)>,
    spec: &PluginSpec,
) -> BTreeMap<String, String> {
    let mut all: BTreeMap<String, String> = declared
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    all.insert(labels::API.to_owned(), spec.api.qualified_resource());
    all.insert(
        labels::IMPLEMENTATION.to_owned(),
        spec.implementation.to_lowercase(),
    );
    all
}

/// A Kubernetes object kept as the exact JSON the client sent: kplug only
/// passes it on, so nothing (a large integer, key order) is lost.
pub type RawObject = Box<serde_json::value::RawValue>;

/// A request to reconcile (or finalize) one object through a plugin, and
/// the plugin's answer in `status`. Create-only, like `TokenReview`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reconcile {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: ReconcileSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ReconcileStatus>,
}

impl Reconcile {
    pub const KIND: &'static str = "Reconcile";
    pub const PLURAL: &'static str = "reconciles";
    /// Top-level fields of this version.
    pub const FIELDS: &'static [&'static str] =
        &["apiVersion", "kind", "metadata", "spec", "status"];
}

/// What to reconcile, and (for the `reconciles` resource) how to choose the plugin.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileSpec {
    /// "Reconcile" (the default) or "Finalize"; see [`ReconcileSpec::operation`].
    #[serde(default, rename = "operation", skip_serializing_if = "Option::is_none")]
    pub operation_name: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    /// The custom resource, as a whole object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<RawObject>,
    /// Instead of `object`: the stored custom resource, which kplug reads,
    /// with the extensions it references; see [`StoredObjectRef`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<StoredObjectRef>,
    /// Its linked extension objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<RawObject>,
    /// The API whose plugin should serve this (the `reconciles` resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<ApiSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_implementation: Option<String>,
    /// Only plugins of this implementation may serve: no fallback to
    /// another. Operators set it once an object is bound to an
    /// implementation, so that its data never silently moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_implementation: Option<String>,
    /// Only instances whose version is in this semver range may serve, the
    /// newest first (e.g. `>=1.4, <2`); see [`crate::version`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_constraint: Option<String>,
    /// Pins one plugin by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The children of the object that earlier answers asked for, as the
    /// caller last observed them; see [`ObservedChild`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_children: Vec<ObservedChild>,
    /// Where the plugin's desired children may be; see [`ChildScope`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_scope: Option<ChildScope>,
}

impl ReconcileSpec {
    /// Fields of this version.
    pub const FIELDS: &'static [&'static str] = &[
        "operation",
        "dryRun",
        "timeoutSeconds",
        "object",
        "objectRef",
        "extensions",
        "api",
        "preferredImplementation",
        "requiredImplementation",
        "versionConstraint",
        "plugin",
        "observedChildren",
        "childScope",
    ];

    /// The operation asked for; `Err` holds an unsupported name.
    pub fn operation(&self) -> Result<Operation, &str> {
        match self.operation_name.as_deref() {
            None | Some("Reconcile") => Ok(Operation::Reconcile),
            Some("Finalize") => Ok(Operation::Finalize),
            Some(other) => Err(other),
        }
    }
}

/// A child object as the caller (an operator) last observed it: the live
/// object, status included, under the key the plugin gave it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedChild {
    pub key: String,
    pub object: RawObject,
}

/// Where a plugin's desired children may be, as the operator that applies
/// them allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChildScope {
    /// Only in the reconciled object's own namespace (anywhere for a
    /// cluster-scoped object): where an owner reference can tie the child
    /// to it.
    #[default]
    Namespace,
    /// In any namespace, or cluster-scoped: an operator started to allow it
    /// tracks such children by label and its inventory.
    Cluster,
}

/// Which plugin call to make.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Operation {
    #[default]
    Reconcile,
    Finalize,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reconcile => "Reconcile",
            Self::Finalize => "Finalize",
        }
    }
}

/// Names a plugin API; `version` is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiSelector {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

impl ApiSelector {
    /// True when `api` is the API this selector names.
    pub fn matches(&self, api: &PluginApi) -> bool {
        self.group == api.group
            && self.resource == api.resource
            && (self.version.is_empty() || self.version == api.version)
    }

    /// `resource.group`, as users write it.
    pub fn qualified_resource(&self) -> String {
        format!("{}.{}", self.resource, self.group)
    }
}

/// The plugin's answer, filled in by kplug.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileStatus {
    pub plugin: PluginRef,
    pub selection: Selection,
    pub success: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ReconcileResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ResultCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_status: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_statuses: Vec<ExtensionStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub desired_children: Vec<DesiredChild>,
    pub operation_id: String,
    pub duration_milliseconds: f64,
}

/// The plugin that served a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginRef {
    pub name: String,
    /// The release of the instance that answered.
    pub version: String,
    pub implementation: String,
    /// The instance that answered (its pod's name, else its address).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// What the plugin declares it handles (`spec.protocol.capabilities`):
    /// an operator adds its finalizer only for a plugin that declares
    /// `Finalize` (or declares nothing, which means everything).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

impl PluginRef {
    /// Whether the plugin handles `operation`: it declares it, or declares
    /// no capabilities at all (a plugin that predates them).
    pub fn declares(&self, operation: Operation) -> bool {
        self.capabilities.is_empty() || self.capabilities.iter().any(|c| c == operation.as_str())
    }
}

/// Why this plugin was chosen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selection {
    pub reason: SelectionReason,
    pub message: String,
}

/// The selection rule that applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectionReason {
    /// The caller named the plugin.
    #[default]
    Requested,
    /// A Ready plugin of the preferred implementation.
    PreferredImplementation,
    /// A Ready plugin of the required implementation.
    RequiredImplementation,
    /// No preference could be met: the stable fallback rule chose.
    Fallback,
}

/// One message from the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileResult {
    pub severity: String,
    pub reason: String,
    pub message: String,
}

/// A condition the plugin reports for the object (no timestamps: the
/// operator sets those when it writes them to the object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The status the plugin reports for one extension object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionStatus {
    #[serde(rename = "ref")]
    pub reference: ObjectRef,
    pub status: serde_json::Value,
}

/// A Kubernetes object the plugin wants to exist for the reconciled
/// object, checked by kplug ([`crate::children`] says how).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DesiredChild {
    /// Names the child across answers: a DNS-1123 label, unique in the answer.
    pub key: String,
    /// Server-side apply intent: only the fields the plugin cares about.
    pub object: serde_json::Value,
    /// The plugin's verdict; absent for the operator's default rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Applied once every lower wave is ready; removed in reverse order.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wave: i32,
}

/// A stored object that kplug reads for a reconcile by reference, so that
/// the plugin sees what is stored, never a body the caller made up. Named
/// by its apiVersion, kind or resource, namespace and name; every field
/// defaults to empty so that a missing one is a `422` naming it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredObjectRef {
    #[serde(default)]
    pub api_version: String,
    /// The kind, e.g. `DatabaseTable`; or else `resource`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The resource, e.g. `databasetables`; or else `kind`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    /// Empty for a cluster-scoped object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// Where the object lists its extension references; `spec.extensions`
    /// when empty, as kplug-operator's `--extensions-path`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extensions_path: String,
}

/// Identifies an object by apiVersion, kind, namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
}
