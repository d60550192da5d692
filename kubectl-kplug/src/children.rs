//! The children of `kubectl kplug reconcile`: it sends the object's
//! observed children as the operator would (those of its `status.children`
//! inventory that it controls, read with the user's rights), and with
//! `--dry-run=server` applies the desired children of the answer exactly as
//! the operator would (same body, same field manager, forced), as a
//! server-side dry run, to show what applying them would change; nothing
//! is written.

use kplug_api::shadow::{FieldDifference, field_differences};
use kplug_api::v1alpha1::DesiredChild;
use kplug_operator::children::{
    ALLOW_MASS_PRUNE, ChildStatus, child_namespace, controlled_by, field_manager, inventory,
    line_of, owned_child, parent_uid, prune_held,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};
use serde_json::Value;

/// What applying one child would do.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Create,
    Update(Vec<FieldDifference>),
    Unchanged,
    /// In the inventory, no longer desired: the operator would delete it
    /// (or abandon it, when it is marked to be kept).
    Prune,
    /// As [`Change::Prune`], but a mass prune the operator would hold,
    /// and why.
    PruneHeld(String),
    /// kube-apiserver refused the dry run, or the kind is not served.
    Refused(String),
}

/// One child of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildPlan {
    pub key: String,
    pub wave: i32,
    /// `Kind namespace/name`.
    pub child: String,
    pub change: Change,
}

/// Where `line`'s object is served, under `parent`; a cluster-scoped
/// child's line loses the namespace [`line_of`] gave it.
async fn child_api(
    client: &Client,
    parent: &DynamicObject,
    line: &mut ChildStatus,
) -> Result<Api<DynamicObject>, String> {
    let (group, version) = line
        .api_version
        .split_once('/')
        .unwrap_or(("", &line.api_version));
    let gvk = GroupVersionKind::gvk(group, version, &line.kind);
    let (resource, capabilities): (ApiResource, _) =
        pinned_kind(client, &gvk).await.map_err(|e| {
            format!(
                "the cluster serves no {} in {}: {e}",
                line.kind, line.api_version
            )
        })?;
    let namespaced = capabilities.scope == Scope::Namespaced;
    Ok(match child_namespace(parent, line, namespaced) {
        Some(namespace) => Api::namespaced_with(client.clone(), &namespace, &resource),
        None => {
            line.namespace.clear();
            Api::all_with(client.clone(), &resource)
        }
    })
}

/// The children of `parent`'s inventory that it controls, as they are now,
/// by key. One that is gone or that the user may not read is left out, as
/// the operator leaves out one it cannot read.
pub async fn observe(client: &Client, parent: &DynamicObject) -> Vec<(String, DynamicObject)> {
    let status = parent.data.get("status").unwrap_or(&Value::Null);
    let mut observed = Vec::new();
    for mut line in inventory(status) {
        let Ok(api) = child_api(client, parent, &mut line).await else {
            continue;
        };
        if let Ok(Some(child)) = api.get_opt(&line.name).await
            && controlled_by(&child, parent)
        {
            observed.push((line.key.clone(), child));
        }
    }
    observed
}

/// `object` without what every write changes by itself: server-managed
/// metadata and status.
fn comparable(object: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["managedFields", "resourceVersion", "generation"] {
                metadata.remove(field);
            }
        }
    }
    value
}

/// Applies each of `desired` as `parent`'s, as a server-side dry run, and
/// says what would change; the inventory's children no longer desired
/// would be pruned. Every child is tried, whatever its wave: the operator
/// would apply a higher wave only once the lower ones are ready.
pub async fn plan(
    client: &Client,
    parent: &DynamicObject,
    desired: &[DesiredChild],
) -> Vec<ChildPlan> {
    let manager = field_manager(&parent_uid(parent));
    let params = PatchParams::apply(&manager).force().dry_run();
    let mut plans = Vec::with_capacity(desired.len());
    for child in desired {
        let mut line = line_of(parent, child);
        let change = match child_api(client, parent, &mut line).await {
            Err(why) => Change::Refused(why),
            Ok(api) => {
                let body = owned_child(parent, child, &line);
                let live = api.get_opt(&line.name).await;
                let applied = api.patch(&line.name, &params, &Patch::Apply(&body)).await;
                match (live, applied) {
                    (_, Err(error)) => Change::Refused(kube_message(&error)),
                    (Err(error), _) => Change::Refused(kube_message(&error)),
                    (Ok(None), Ok(_)) => Change::Create,
                    (Ok(Some(live)), Ok(applied)) => {
                        let fields = field_differences(
                            "",
                            Some(&comparable(&live)),
                            Some(&comparable(&applied)),
                        );
                        if fields.is_empty() {
                            Change::Unchanged
                        } else {
                            Change::Update(fields)
                        }
                    }
                }
            }
        };
        plans.push(ChildPlan {
            key: line.key.clone(),
            wave: line.wave,
            child: line.describe(),
            change,
        });
    }
    let status = parent.data.get("status").unwrap_or(&Value::Null);
    let inventory = inventory(status);
    let stale: Vec<&ChildStatus> = inventory
        .iter()
        .filter(|line| !desired.iter().any(|child| child.key == line.key))
        .collect();
    let allowed = parent
        .annotations()
        .get(ALLOW_MASS_PRUNE)
        .map(String::as_str)
        == Some("true");
    let held = prune_held(inventory.len(), &stale, allowed);
    for line in stale {
        plans.push(ChildPlan {
            key: line.key.clone(),
            wave: line.wave,
            child: line.describe(),
            change: held.clone().map_or(Change::Prune, Change::PruneHeld),
        });
    }
    plans
}

fn kube_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// The plan as `kubectl kplug reconcile --dry-run=server` prints it.
pub fn describe(plans: &[ChildPlan]) -> String {
    if plans.is_empty() {
        return String::new();
    }
    let mut text =
        String::from("Children (server-side dry run, as the operator would apply them):\n");
    for plan in plans {
        let what = match &plan.change {
            Change::Create => "would be created".to_owned(),
            Change::Unchanged => "unchanged".to_owned(),
            Change::Prune => "no longer desired: would be pruned".to_owned(),
            Change::PruneHeld(why) => {
                format!("no longer desired, but the prune would be held: {why}")
            }
            Change::Refused(why) => format!("refused: {why}"),
            Change::Update(fields) => format!("would change {} field(s)", fields.len()),
        };
        text.push_str(&format!(
            "  {} (wave {}, {}): {what}\n",
            plan.key, plan.wave, plan.child
        ));
        if let Change::Update(fields) = &plan.change {
            for field in fields {
                let show = |value: &Option<Value>| {
                    value.as_ref().map_or("(none)".to_owned(), Value::to_string)
                };
                text.push_str(&format!(
                    "    {}: {} -> {}\n",
                    field.path.trim_start_matches('.'),
                    show(&field.primary),
                    show(&field.shadow)
                ));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_plan_names_each_child_its_wave_and_the_fields_that_would_change() {
        let plans = [
            ChildPlan {
                key: "pages".into(),
                wave: 0,
                child: "ConfigMap default/hello-pages".into(),
                change: Change::Update(vec![FieldDifference {
                    path: ".data.index.html".into(),
                    primary: Some(json!("one")),
                    shadow: Some(json!("two")),
                }]),
            },
            ChildPlan {
                key: "web".into(),
                wave: 1,
                child: "Deployment default/hello".into(),
                change: Change::Unchanged,
            },
            ChildPlan {
                key: "service".into(),
                wave: 1,
                child: "Service default/hello".into(),
                change: Change::Prune,
            },
        ];
        assert_eq!(
            describe(&plans),
            "Children (server-side dry run, as the operator would apply them):\n  \
             pages (wave 0, ConfigMap default/hello-pages): would change 1 field(s)\n    \
             data.index.html: \"one\" -> \"two\"\n  \
             web (wave 1, Deployment default/hello): unchanged\n  \
             service (wave 1, Service default/hello): no longer desired: would be pruned\n"
        );
        assert_eq!(describe(&[]), "");
        let held = ChildPlan {
            key: "web".into(),
            wave: 1,
            child: "Deployment default/hello".into(),
            change: Change::PruneHeld("annotate the object".into()),
        };
        assert!(describe(&[held]).ends_with(
            "web (wave 1, Deployment default/hello): no longer desired, but the prune would be \
             held: annotate the object\n"
        ));
    }
}
