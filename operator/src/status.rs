//! The status the operator writes, computed without IO: from the object's
//! current status, the fields this operator's field manager owns in it,
//! and the outcome of a delegation.
//!
//! Layout of the object's `status` (docs/src/concepts/operator.md, "Write-back"):
//! `implementation` (the binding), `plugin` {name, version,
//! implementation} (the last to serve), `selection` {reason, message} (why
//! the object is bound to its implementation), `observedGeneration`
//! (the generation a plugin last answered for), `conditions` (`Ready`,
//! `Synced` and the plugin's own), and the plugin's `objectStatus` fields,
//! merged in or under one field.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kplug_api::v1alpha1::{PluginRef, ReconcileStatus, ResultCondition, SelectionReason};
use serde_json::{Map, Value, json};

use crate::children::{self, CHILDREN_READY, ChildStatus, PRUNE_PAUSED};

/// Status fields the operator itself sets; a plugin's `objectStatus` cannot
/// replace them.
pub const RESERVED_FIELDS: &[&str] = &[
    "implementation",
    "majorVersion",
    "plugin",
    "selection",
    "observedGeneration",
    "conditions",
    children::STATUS_FIELD,
];

pub const READY: &str = "Ready";

/// What the operator does after a failure it can only wait out, as the end
/// of the message that reports it.
pub const RETRYING: &str = "retrying with backoff";

/// The reason and message of a failed answer, as its `Ready` condition,
/// Event and log line give them: the first non-Normal result's, who
/// reported it, and what the operator does next.
pub fn failure(answer: &ReconcileStatus) -> (&str, String) {
    let why = answer.results.iter().find(|r| r.severity != "Normal");
    let reason = why.map_or("ReconcileFailed", |r| r.reason.as_str());
    let message = why.map_or("the plugin reported a failure", |r| &r.message);
    let message = format!(
        "{message} (reported by {}); {RETRYING}",
        reporter(&answer.plugin)
    );
    (reason, message)
}

/// The plugin that answered, as a message names it. Not the instance: a
/// plugin's own failure is the same on each of its instances, and naming
/// the one that answered would change the message, and so write the status
/// and record an Event, each time another instance answers.
pub fn reporter(plugin: &PluginRef) -> String {
    let PluginRef {
        name,
        version,
        implementation,
        instance: _,
        capabilities: _,
    } = plugin;
    match (implementation.is_empty(), version.is_empty()) {
        (false, false) => format!("plugin {name} ({implementation} {version})"),
        (false, true) => format!("plugin {name} ({implementation})"),
        (true, false) => format!("plugin {name} ({version})"),
        (true, true) => format!("plugin {name}"),
    }
}
pub const SYNCED: &str = "Synced";

/// The status fields, and the condition types, a field manager owns, read
/// from the object's `managedFields`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Owned {
    pub fields: BTreeSet<String>,
    pub condition_types: BTreeSet<String>,
}

impl Owned {
    /// Drops the `managedFields` entries of every manager but
    /// `field_manager`: all of them that [`Owned::read`] needs, so that a
    /// cache of objects need not hold the others.
    pub fn keep_only_ours(meta: &mut ObjectMeta, field_manager: &str) {
        if let Some(entries) = &mut meta.managed_fields {
            entries.retain(|e| e.manager.as_deref() == Some(field_manager));
        }
    }

    pub fn read(meta: &ObjectMeta, field_manager: &str) -> Self {
        let mut owned = Self::default();
        let entries = meta.managed_fields.iter().flatten();
        let ours = entries.filter(|e| e.manager.as_deref() == Some(field_manager));
        for entry in ours {
            let Some(status) = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:status")) else {
                continue;
            };
            let Some(fields) = status.as_object() else {
                continue;
            };
            for (key, value) in fields {
                let Some(field) = key.strip_prefix("f:") else {
                    continue;
                };
                owned.fields.insert(field.to_owned());
                if field == "conditions" {
                    let items = value.as_object().into_iter().flat_map(|m| m.keys());
                    owned.condition_types.extend(items.filter_map(|k| {
                        let key: Value = serde_json::from_str(k.strip_prefix("k:")?).ok()?;
                        Some(key.get("type")?.as_str()?.to_owned())
                    }));
                }
            }
        }
        owned
    }
}

/// What came of an attempt to reconcile an object.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// A plugin answered, successfully or not.
    Answered(&'a ReconcileStatus),
    /// No plugin was reached; `reason` says why in CamelCase.
    NotDelegated { reason: &'a str, message: String },
}

/// Where the plugin's `objectStatus` goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ObjectStatusLayout {
    /// Its fields merge into `status`.
    #[default]
    Merged,
    /// It becomes `status.<field>`.
    Under(String),
}

/// The operator's status for one object.
pub struct Desired<'a> {
    pub current: &'a Value,
    pub owned: &'a Owned,
    pub generation: Option<i64>,
    pub binding: Option<&'a str>,
    pub layout: &'a ObjectStatusLayout,
    pub now: Timestamp,
    /// The children's inventory after this reconcile; empty for an object
    /// that has none.
    pub children: &'a [ChildStatus],
    /// Why children no longer desired were kept (a mass prune held).
    pub prune_held: Option<&'a str>,
}

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> ResultCondition {
    ResultCondition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

/// `Ready` and `Synced` as the operator derives them, `ChildrenReady` for
/// an object with `children` (`Ready` requires it), then the plugin's
/// other conditions.
fn conditions_of(
    outcome: &Outcome<'_>,
    children: &[ChildStatus],
    prune_held: Option<&str>,
) -> Vec<ResultCondition> {
    let mut conditions = plugin_conditions(outcome);
    if children.is_empty() || matches!(outcome, Outcome::NotDelegated { .. }) {
        return conditions;
    }
    let (ready, reason, message) = children::children_ready(children);
    if !ready && conditions[0].status == "True" {
        conditions[0] = condition(READY, false, reason, &message);
    }
    conditions.insert(2, condition(CHILDREN_READY, ready, reason, &message));
    if let Some(held) = prune_held {
        conditions.insert(3, condition(PRUNE_PAUSED, true, "MassPruneHeld", held));
    }
    conditions
}

fn plugin_conditions(outcome: &Outcome<'_>) -> Vec<ResultCondition> {
    match outcome {
        Outcome::NotDelegated { reason, message } => vec![
            condition(READY, false, reason, message),
            condition(SYNCED, false, reason, message),
        ],
        Outcome::Answered(answer) => {
            let from_plugin = |type_: &str| answer.conditions.iter().find(|c| c.type_ == type_);
            let ready = match (answer.success, from_plugin(READY)) {
                (true, Some(ready)) => ready.clone(),
                (true, None) => {
                    let message = answer.results.first().map_or("", |r| r.message.as_str());
                    condition(READY, true, "Reconciled", message)
                }
                (false, _) => {
                    let (reason, message) = failure(answer);
                    condition(READY, false, reason, &message)
                }
            };
            let synced = from_plugin(SYNCED)
                .cloned()
                .unwrap_or_else(|| condition(SYNCED, true, "Delegated", "the plugin answered"));
            let others = answer
                .conditions
                .iter()
                .filter(|c| c.type_ != READY && c.type_ != SYNCED)
                .cloned();
            [ready, synced].into_iter().chain(others).collect()
        }
    }
}

fn current_conditions(current: &Value) -> &[Value] {
    current
        .get("conditions")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn find_condition<'v>(conditions: &'v [Value], type_: &str) -> Option<&'v Value> {
    conditions.iter().find(|c| c["type"] == type_)
}

impl Desired<'_> {
    /// A condition as written, keeping its `lastTransitionTime` while its
    /// status holds.
    fn write_condition(&self, c: &ResultCondition) -> Value {
        let previous = find_condition(current_conditions(self.current), &c.type_);
        let since = previous
            .filter(|p| p["status"] == c.status.as_str())
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(self.now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
        let mut written = json!({
            "type": c.type_,
            "status": c.status,
            "lastTransitionTime": since,
        });
        // Empty strings are left out: kube-apiserver 1.20's server-side
        // apply turns them into nulls, which a CRD's `type: string` refuses.
        for (field, value) in [("reason", &c.reason), ("message", &c.message)] {
            if !value.is_empty() {
                written[field] = json!(value);
            }
        }
        if let Some(generation) = self.generation {
            written["observedGeneration"] = json!(generation);
        }
        written
    }

    /// The status fields to apply for `outcome`. When no plugin answered,
    /// what the operator wrote before is kept (server-side apply removes
    /// owned fields that are left out) and only the conditions change.
    pub fn status(&self, outcome: &Outcome<'_>) -> Map<String, Value> {
        let mut status = Map::new();
        let written = conditions_of(outcome, self.children, self.prune_held);
        let mut conditions: Vec<Value> = written.iter().map(|c| self.write_condition(c)).collect();
        match outcome {
            Outcome::NotDelegated { .. } => {
                for field in &self.owned.fields {
                    if let Some(value) = self.current.get(field) {
                        status.insert(field.clone(), value.clone());
                    }
                }
                // The plugin's earlier conditions stay as they were.
                let kept = current_conditions(self.current).iter().filter(|c| {
                    let type_ = c["type"].as_str().unwrap_or_default();
                    self.owned.condition_types.contains(type_)
                        && !written.iter().any(|w| w.type_ == type_)
                });
                conditions.extend(kept.cloned());
            }
            Outcome::Answered(answer) => {
                match (self.layout, &answer.object_status) {
                    (ObjectStatusLayout::Merged, Some(Value::Object(fields))) => {
                        let theirs = fields
                            .iter()
                            .filter(|(k, _)| !RESERVED_FIELDS.contains(&k.as_str()));
                        status.extend(theirs.map(|(k, v)| (k.clone(), v.clone())));
                    }
                    (ObjectStatusLayout::Under(field), Some(value)) => {
                        status.insert(field.clone(), value.clone());
                    }
                    (ObjectStatusLayout::Merged, _) | (ObjectStatusLayout::Under(_), None) => {}
                }
                // Without the instance, for the reason `reporter` gives;
                // the capabilities are the operator's business, not the
                // object's.
                let plugin = PluginRef {
                    instance: String::new(),
                    capabilities: Vec::new(),
                    ..answer.plugin.clone()
                };
                status.insert("plugin".into(), json!(plugin));
                // `selection` says why the object is bound where it is: a
                // call that only followed the binding keeps that reason.
                let followed_binding =
                    answer.selection.reason == SelectionReason::RequiredImplementation;
                let selection = match self.current.get("selection") {
                    Some(kept) if followed_binding => kept.clone(),
                    _ => json!(answer.selection),
                };
                status.insert("selection".into(), selection);
                if let Some(generation) = self.generation {
                    status.insert("observedGeneration".into(), json!(generation));
                }
                if !self.children.is_empty() {
                    status.insert(children::STATUS_FIELD.into(), json!(self.children));
                }
            }
        }
        if let Some(binding) = self.binding {
            status.insert("implementation".into(), json!(binding));
            let major = match outcome {
                Outcome::Answered(answer) => self.major_version(binding, &answer.plugin.version),
                Outcome::NotDelegated { .. } => None,
            };
            if let Some(major) = major {
                status.insert("majorVersion".into(), json!(major));
            }
        }
        status.insert("conditions".into(), Value::Array(conditions));
        status
    }
}

impl Desired<'_> {
    /// The major version the object is bound to with `binding` after an
    /// answer from a release of `version`: the one recorded while the
    /// binding holds (calls are narrowed to it), else the answer's.
    fn major_version(&self, binding: &str, version: &str) -> Option<u64> {
        let bound = self.current.get("implementation").and_then(Value::as_str);
        let recorded = self.current.get("majorVersion").and_then(Value::as_u64);
        match (bound == Some(binding), recorded) {
            (true, Some(major)) => Some(major),
            _ => kplug_api::version::major(version),
        }
    }
}

/// Whether applying `desired` would change `current`: a field differs, or
/// a field (or condition) this manager owns would be removed.
pub fn needs_write(current: &Value, desired: &Map<String, Value>, owned: &Owned) -> bool {
    let same_condition = |want: &Value| {
        find_condition(
            current_conditions(current),
            want["type"].as_str().unwrap_or_default(),
        )
        .is_some_and(|have| {
            [
                "status",
                "reason",
                "message",
                "observedGeneration",
                "lastTransitionTime",
            ]
            .iter()
            .all(|k| have.get(k) == want.get(k))
        })
    };
    let changed = desired.iter().any(|(field, want)| match field.as_str() {
        "conditions" => want
            .as_array()
            .is_none_or(|w| !w.iter().all(same_condition)),
        _ => current.get(field) != Some(want),
    });
    let removed = owned
        .fields
        .iter()
        .any(|f| !desired.contains_key(f) && current.get(f).is_some());
    let desired_types: BTreeSet<&str> = desired
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .collect();
    let removed_condition = owned.condition_types.iter().any(|t| {
        !desired_types.contains(t.as_str())
            && find_condition(current_conditions(current), t).is_some()
    });
    changed || removed || removed_condition
}

#[cfg(test)]
mod tests;
