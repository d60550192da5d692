//! The children a plugin asks for, as the operator keeps them, computed
//! without IO: the inventory it records in the parent's `status.children`
//! (what teardown and pruning use, even with the plugin down), which
//! children a reconcile applies (waves) and which it removes, whether a
//! child is ready when the plugin gives no verdict, and the names and
//! marks every child carries.
//!
//! The IO (discovery, server-side apply, deletes) is the reconciler's
//! (`reconciler/children.rs`).

use std::collections::BTreeSet;

use kplug_api::v1alpha1::DesiredChild;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod drift;
mod readiness;
mod unchanged;

pub use drift::{Drift, drift};
pub use kplug_api::children::KEY_ANNOTATION;
pub use readiness::ready_by_default;
pub use unchanged::{APPLIED_ANNOTATION, unchanged};

/// The label every child carries: its parent's UID (a name may be longer
/// than a label value; a UID never is).
pub const PARENT_UID_LABEL: &str = "plugins.kplug.io/parent-uid";

/// The annotation naming the parent (`namespace/name`) of a child it
/// cannot own (cluster-scoped, or in another namespace): what maps the
/// child's changes to its parent.
pub const PARENT_ANNOTATION: &str = "plugins.kplug.io/parent";

/// The parent's status field that holds the inventory.
pub const STATUS_FIELD: &str = "children";

/// The condition that says whether every desired child is applied and ready.
pub const CHILDREN_READY: &str = "ChildrenReady";

/// The condition set while a mass prune is held.
pub const PRUNE_PAUSED: &str = "PrunePaused";

/// The parent's annotation that lets a held mass prune go ahead (`"true"`).
pub const ALLOW_MASS_PRUNE: &str = "plugins.kplug.io/allow-mass-prune";

/// A child's annotation that abandons it instead of deleting it
/// (`"disabled"`): its owner reference, label and key annotation are
/// removed and the object stays.
pub const PRUNE: &str = "plugins.kplug.io/prune";

/// The value of [`PRUNE`] that abandons a child.
pub const PRUNE_DISABLED: &str = "disabled";

/// One line of the parent's `status.children`: a child the operator
/// applied, where it is, and how it stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildStatus {
    pub key: String,
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wave: i32,
    /// Why its last apply failed; empty when it succeeded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The last drift undone: fields of the child another manager changed,
    /// which the operator applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drifted: Option<Drift>,
}

fn is_zero(wave: &i32) -> bool {
    *wave == 0
}

impl ChildStatus {
    /// Whether this line and `other` name the same object.
    pub fn same_object(&self, other: &Self) -> bool {
        (&self.api_version, &self.kind, &self.namespace, &self.name)
            == (
                &other.api_version,
                &other.kind,
                &other.namespace,
                &other.name,
            )
    }

    /// `Kind namespace/name`, as messages name a child.
    pub fn describe(&self) -> String {
        match self.namespace.as_str() {
            "" => format!("{} {}", self.kind, self.name),
            namespace => format!("{} {namespace}/{}", self.kind, self.name),
        }
    }
}

/// The inventory recorded in `status` (the parent's current status); a
/// line that does not read is left out.
pub fn inventory(status: &Value) -> Vec<ChildStatus> {
    status
        .get(STATUS_FIELD)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|line| serde_json::from_value(line.clone()).ok())
        .collect()
}

/// The field manager that applies one parent's children: stable, and its
/// own, so that two parents asking for the same object take it from each
/// other visibly (a conflict forced, not a silent co-ownership).
pub fn field_manager(parent_uid: &str) -> String {
    format!("kplug-operator.{parent_uid}")
}

/// The inventory line for `child` of `parent`, before it is applied.
pub fn line_of(parent: &DynamicObject, child: &DesiredChild) -> ChildStatus {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let namespace = match text(&child.object["metadata"]["namespace"]) {
        own if !own.is_empty() => own,
        _ => parent.namespace().unwrap_or_default(),
    };
    ChildStatus {
        key: child.key.clone(),
        api_version: text(&child.object["apiVersion"]),
        kind: text(&child.object["kind"]),
        namespace,
        name: text(&child.object["metadata"]["name"]),
        ready: false,
        wave: child.wave,
        error: String::new(),
        drifted: None,
    }
}

/// The parent's UID, which names its children's field manager and label.
pub fn parent_uid(parent: &DynamicObject) -> String {
    parent.uid().unwrap_or_default()
}

/// The namespace of the child `line` names under `parent`, for a kind
/// that is `namespaced`: its own, else its parent's; `None` for a
/// cluster-scoped kind.
pub fn child_namespace(
    parent: &DynamicObject,
    line: &ChildStatus,
    namespaced: bool,
) -> Option<String> {
    if !namespaced {
        return None;
    }
    Some(match line.namespace.as_str() {
        "" => parent.namespace().unwrap_or_default(),
        namespace => namespace.to_owned(),
    })
}

/// Whether `parent` can own a child in `namespace` (empty: a
/// cluster-scoped child) through an owner reference, as Kubernetes' garbage
/// collector allows: a cluster-scoped parent can own anything, a namespaced
/// one only what is in its own namespace.
pub fn can_own(parent: &DynamicObject, namespace: &str) -> bool {
    match parent.namespace() {
        None => true,
        Some(own) => !namespace.is_empty() && own == namespace,
    }
}

/// The child as applied: the plugin's intent where `line` places it, with
/// the parent-UID label and the key annotation; a controller owner
/// reference to the parent where the parent can own it, else the
/// [`PARENT_ANNOTATION`] that names the parent (the inventory then does
/// what the owner reference cannot: teardown).
pub fn owned_child(parent: &DynamicObject, child: &DesiredChild, line: &ChildStatus) -> Value {
    let mut body = child.object.clone();
    let types = parent.types.clone().unwrap_or_default();
    let owned = can_own(parent, &line.namespace);
    let owner = json!({
        "apiVersion": types.api_version,
        "kind": types.kind,
        "name": parent.name_any(),
        "uid": parent_uid(parent),
        "controller": true,
        "blockOwnerDeletion": true,
    });
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        if line.namespace.is_empty() {
            metadata.remove("namespace");
        } else {
            metadata.insert("namespace".into(), json!(line.namespace));
        }
        if owned {
            metadata.insert("ownerReferences".into(), json!([owner]));
        }
        let labels = metadata.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(PARENT_UID_LABEL.into(), json!(parent_uid(parent)));
        }
        let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(KEY_ANNOTATION.into(), json!(child.key));
            if !owned {
                let name = parent.name_any();
                let named = match parent.namespace() {
                    Some(namespace) => format!("{namespace}/{name}"),
                    None => name,
                };
                annotations.insert(PARENT_ANNOTATION.into(), json!(named));
            }
        }
    }
    let digest = unchanged::applied_digest(&body);
    if let Some(annotations) = body
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.insert(APPLIED_ANNOTATION.into(), json!(digest));
    }
    body
}

/// Whether `parent` controls `child`: its controller owner reference is
/// the parent, or, for a child the parent cannot own, it has no controller
/// and carries the parent's UID label (a child found through the parent's
/// inventory: a label alone never makes an object a child).
pub fn controlled_by(child: &DynamicObject, parent: &DynamicObject) -> bool {
    let uid = parent_uid(parent);
    if uid.is_empty() {
        return false;
    }
    let controller = child
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true));
    match controller {
        Some(owner) => owner.uid == uid,
        None => {
            !can_own(parent, &child.namespace().unwrap_or_default())
                && child.labels().get(PARENT_UID_LABEL) == Some(&uid)
        }
    }
}

/// The waves a reconcile applies: every wave up to and including the
/// first whose children are not all ready, given `ready(key)` for each
/// desired child (false for one not applied yet). `None` when there is
/// nothing to apply.
pub fn last_wave(desired: &[DesiredChild], ready: impl Fn(&str) -> bool) -> Option<i32> {
    let waves: BTreeSet<i32> = desired.iter().map(|c| c.wave).collect();
    let mut last = None;
    for wave in waves {
        last = Some(wave);
        let all_ready = desired
            .iter()
            .filter(|c| c.wave == wave)
            .all(|c| ready(&c.key));
        if !all_ready {
            break;
        }
    }
    last
}

/// The inventory lines a reconcile with `desired` removes: those whose key
/// is no longer desired, and those whose key now names another object.
pub fn to_prune<'a>(inventory: &'a [ChildStatus], desired: &[ChildStatus]) -> Vec<&'a ChildStatus> {
    inventory
        .iter()
        .filter(|line| {
            !desired
                .iter()
                .any(|d| d.key == line.key && d.same_object(line))
        })
        .collect()
}

/// Why removing `stale` from an inventory of `total` children is held,
/// naming them: more than half of the children, and more than one (a
/// plugin answering none by mistake would otherwise delete them all).
/// `None` when it may go ahead, or the parent allows it (`allowed`).
pub fn prune_held(total: usize, stale: &[&ChildStatus], allowed: bool) -> Option<String> {
    let mass = stale.len() > 1 && stale.len() * 2 > total;
    if !mass || allowed {
        return None;
    }
    let named: Vec<String> = stale
        .iter()
        .map(|c| format!("{:?} ({})", c.key, c.describe()))
        .collect();
    Some(format!(
        "the plugin no longer asks for {} of the {total} children ({}): nothing was deleted; \
         annotate the object {ALLOW_MASS_PRUNE}=true to let them go",
        stale.len(),
        named.join(", ")
    ))
}

/// The `ChildrenReady` condition's status, reason and message for the
/// inventory `children`.
pub fn children_ready(children: &[ChildStatus]) -> (bool, &'static str, String) {
    if let Some(failed) = children.iter().find(|c| !c.error.is_empty()) {
        let message = format!(
            "child {:?} ({}) was not applied: {}",
            failed.key,
            failed.describe(),
            failed.error
        );
        return (false, "ApplyFailed", message);
    }
    let waiting: Vec<String> = children
        .iter()
        .filter(|c| !c.ready)
        .map(|c| format!("{:?} ({})", c.key, c.describe()))
        .collect();
    match waiting.as_slice() {
        [] => (
            true,
            "ChildrenReady",
            format!("{} child(ren) ready", children.len()),
        ),
        _ => (
            false,
            "ChildrenNotReady",
            format!("waiting for {}", waiting.join(", ")),
        ),
    }
}

#[cfg(test)]
mod tests;
