//! Shadow reconciles: which reconciles a plugin's shadow instances receive
//! a dry-run copy of, where a shadow's answer differs from the answer the
//! caller got, and the `PluginShadow` object that `plugins/NAME/shadow`
//! serves.
//!
//! A comparison looks at what an operator writes back: `success`, the
//! results' reasons (not their messages, which a dry run words as what it
//! would do), the conditions' type, status and reason, the object's
//! status, each extension's status and each desired child (its object,
//! verdict and wave, by key), field by field: a version that would change
//! a Deployment's image shows as `desiredChildren[web].object.spec...`
//! before it serves anyone. `requeueAfter` is not compared: plugins
//! requeue dry runs differently by design.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::answer::PluginAnswer;
use crate::v1alpha1::ObjectRef;

/// Copies of one plugin's reconciles in flight at once, on one kplug
/// replica. A sampled reconcile beyond it is skipped (and counted), so that
/// a slow or hanging shadow holds a bounded number of requests, costs
/// callers nothing, and leaves other plugins' shadows alone.
pub const MAX_COPIES_IN_FLIGHT: usize = 64;
/// Differences kept per plugin, newest first.
pub const KEPT_DIFFERENCES: usize = 10;
/// Fields kept per difference; the count says how many there were.
pub const KEPT_FIELDS: usize = 20;
/// A differing value longer than this, as JSON, is shown by its size.
pub const MAX_VALUE_BYTES: usize = 512;

/// Whether the reconcile with `operation_id` is copied to a shadow taking
/// `percent` of the plugin's reconciles.
pub fn sampled(plugin: &str, operation_id: &str, percent: u32) -> bool {
    percent >= 100 || crate::canary::bucket(plugin, operation_id) < percent
}

/// The shadows' record of one plugin, as `plugins/NAME/shadow` serves it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginShadow {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub status: PluginShadowStatus,
}

impl PluginShadow {
    pub const KIND: &'static str = "PluginShadow";
}

/// Counts since this kplug replica started comparing the plugin's
/// shadows, and the last differences. Each replica keeps its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginShadowStatus {
    /// The plugin's shadow instances now.
    #[serde(default)]
    pub shadows: Vec<ShadowInstance>,
    /// Copies whose answer was compared.
    pub compared: u64,
    /// Compared and the same.
    pub same: u64,
    /// Compared and different.
    pub different: u64,
    /// Copies the shadow did not answer (an error or its deadline).
    pub failed: u64,
    /// Sampled reconciles not copied: the bound on the plugin's copies in
    /// flight was reached (a slow shadow), no shadow was Ready, or the
    /// plugin does not declare DryRun.
    pub skipped: u64,
    /// When the first copy was sampled; absent before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// The last differences and failures, newest first.
    #[serde(default)]
    pub differences: Vec<ShadowDifference>,
}

/// One shadow instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowInstance {
    pub name: String,
    pub version: String,
    /// The share of the plugin's reconciles it receives a copy of.
    pub percent: u32,
    pub ready: bool,
}

/// A reconcile on which a shadow's answer differed, or that it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowDifference {
    pub time: Time,
    /// The caller's reconcile.
    pub operation_id: String,
    /// `Reconcile` or `Finalize`.
    pub operation: String,
    /// The object reconciled.
    pub object: ObjectRef,
    /// Who answered the caller: `VERSION (INSTANCE)`.
    pub primary: String,
    /// The shadow that answered the copy, or was called.
    pub shadow: String,
    /// Why the shadow gave no answer; absent when it answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The fields that differ (at most [`KEPT_FIELDS`]).
    #[serde(default)]
    pub fields: Vec<FieldDifference>,
    /// How many fields differ, kept or not.
    #[serde(default)]
    pub differing_fields: usize,
}

/// One field of the answer on which the two sides differ; a side without
/// the field has no value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldDifference {
    /// The field, e.g. `objectStatus.columns[1].type`, `results[0].reason`,
    /// or `results` when the two sides have different numbers of results.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Value>,
}

/// Every field on which `shadow` differs from `primary`, in a fixed order.
pub fn differences(primary: &PluginAnswer, shadow: &PluginAnswer) -> Vec<FieldDifference> {
    let mut out = Vec::new();
    let (primary, shadow) = (Compared::of(primary), Compared::of(shadow));
    diff(
        "success",
        Some(&primary.success),
        Some(&shadow.success),
        &mut out,
    );
    diff(
        "results",
        Some(&primary.reasons),
        Some(&shadow.reasons),
        &mut out,
    );
    diff(
        "conditions",
        Some(&primary.conditions),
        Some(&shadow.conditions),
        &mut out,
    );
    diff(
        "objectStatus",
        primary.object_status,
        shadow.object_status,
        &mut out,
    );
    let references: BTreeSet<&String> = primary
        .extensions
        .iter()
        .chain(&shadow.extensions)
        .map(|(reference, _)| reference)
        .collect();
    for reference in references {
        diff(
            &format!("extensionStatuses[{reference}]"),
            primary.extension(reference),
            shadow.extension(reference),
            &mut out,
        );
    }
    let keys: BTreeSet<&str> = (primary.children.iter())
        .chain(&shadow.children)
        .map(|(key, _)| *key)
        .collect();
    for key in keys {
        diff(
            &format!("desiredChildren[{key}]"),
            primary.child(key),
            shadow.child(key),
            &mut out,
        );
    }
    out
}

/// The compared parts of an answer, as JSON.
struct Compared<'a> {
    success: Value,
    reasons: Value,
    conditions: Value,
    object_status: Option<&'a Value>,
    /// `KIND/NAMESPACE/NAME` and the status.
    extensions: Vec<(String, &'a Value)>,
    /// Each child's key, and its object, verdict and wave.
    children: Vec<(&'a str, Value)>,
}

impl<'a> Compared<'a> {
    fn of(answer: &'a PluginAnswer) -> Self {
        Self {
            success: Value::Bool(answer.success),
            reasons: answer
                .results
                .iter()
                .map(|r| serde_json::json!({"reason": r.reason}))
                .collect(),
            conditions: answer
                .conditions
                .iter()
                .map(|c| {
                    serde_json::json!({"type": c.type_, "status": c.status, "reason": c.reason})
                })
                .collect(),
            object_status: answer.object_status.as_ref(),
            extensions: answer
                .extension_statuses
                .iter()
                .map(|e| (reference(&e.reference), &e.status))
                .collect(),
            children: answer
                .desired_children
                .iter()
                .map(|child| {
                    let mut compared = serde_json::Map::new();
                    compared.insert("object".to_owned(), child.object.clone());
                    if let Some(ready) = child.ready {
                        compared.insert("ready".to_owned(), Value::Bool(ready));
                    }
                    compared.insert("wave".to_owned(), child.wave.into());
                    (child.key.as_str(), Value::Object(compared))
                })
                .collect(),
        }
    }
}

impl<'a> Compared<'a> {
    fn child(&self, key: &str) -> Option<&Value> {
        (self.children.iter())
            .find(|(k, _)| *k == key)
            .map(|(_, child)| child)
    }

    fn extension(&self, reference: &str) -> Option<&'a Value> {
        self.extensions
            .iter()
            .find(|(r, _)| r == reference)
            .map(|(_, status)| *status)
    }
}

fn reference(reference: &ObjectRef) -> String {
    match reference.namespace.as_str() {
        "" => format!("{}/{}", reference.kind, reference.name),
        namespace => format!("{}/{namespace}/{}", reference.kind, reference.name),
    }
}

/// Every field below `path` on which `after` differs from `before` (as
/// `primary` and `shadow`), compared as [`differences`] compares answers:
/// objects key by key, arrays of one length item by item, anything else
/// whole; long values abbreviated.
pub fn field_differences(
    path: &str,
    before: Option<&Value>,
    after: Option<&Value>,
) -> Vec<FieldDifference> {
    let mut out = Vec::new();
    diff(path, before, after, &mut out);
    out
}

/// Appends where `primary` and `shadow` differ below `path`: objects key by
/// key, arrays of one length item by item, anything else whole.
fn diff(
    path: &str,
    primary: Option<&Value>,
    shadow: Option<&Value>,
    out: &mut Vec<FieldDifference>,
) {
    match (primary, shadow) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                diff(&format!("{path}.{key}"), a.get(key), b.get(key), out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if a.len() == b.len() => {
            for (i, (a, b)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), Some(a), Some(b), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(FieldDifference {
            path: path.to_owned(),
            primary: a.map(abbreviated),
            shadow: b.map(abbreviated),
        }),
    }
}

/// `value`, or its size when it is longer than [`MAX_VALUE_BYTES`].
fn abbreviated(value: &Value) -> Value {
    let bytes = serde_json::to_vec(value).map_or(usize::MAX, |json| json.len());
    if bytes <= MAX_VALUE_BYTES {
        return value.clone();
    }
    let what = match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        _ => "a value",
    };
    Value::String(format!("({what} of {bytes} bytes)"))
}

#[cfg(test)]
mod tests;
