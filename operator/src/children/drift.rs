//! Drift: a field the plugin asks for that someone else changed on the
//! child. Read from the live child's `managedFields`: a field of the
//! desired object whose live value differs and that another field manager
//! owns. The operator applies the child again all the same (forced, as the
//! server-side apply documentation asks of controllers); this says what was
//! undone, and by whose change.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What another manager changed of what the plugin asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Drift {
    /// The fields, as dotted paths (`data.index.html`,
    /// `spec.template.spec.containers[name=httpd].image`).
    pub fields: Vec<String>,
    /// The field managers that own them now.
    pub managers: Vec<String>,
}

impl Drift {
    pub fn describe(&self) -> String {
        format!(
            "{} changed by {}",
            self.fields.join(", "),
            self.managers.join(", ")
        )
    }
}

/// The drift of `live` from `desired`, for the field manager `ours`;
/// `None` when no field the plugin asks for was changed by another.
pub fn drift(
    desired: &Value,
    live: &Value,
    managed: &[ManagedFieldsEntry],
    ours: &str,
) -> Option<Drift> {
    let mut fields = BTreeSet::new();
    let mut managers = BTreeSet::new();
    for entry in managed
        .iter()
        .filter(|e| e.manager.as_deref() != Some(ours))
    {
        let Some(Value::Object(owned)) = entry.fields_v1.as_ref().map(|f| &f.0) else {
            continue;
        };
        let mut found = Vec::new();
        walk(desired, live, owned, String::new(), &mut found);
        if !found.is_empty() {
            managers.insert(entry.manager.clone().unwrap_or_default());
            fields.extend(found);
        }
    }
    (!fields.is_empty()).then(|| Drift {
        fields: fields.into_iter().collect(),
        managers: managers.into_iter().collect(),
    })
}

/// Appends to `found` the leaves of `desired` under `path` that `owned`
/// (a `fieldsV1` set) holds and whose `live` value differs.
fn walk(
    desired: &Value,
    live: &Value,
    owned: &Map<String, Value>,
    path: String,
    found: &mut Vec<String>,
) {
    for (key, below) in owned {
        let below = below.as_object();
        let leaf = below.is_none_or(|b| b.keys().all(|k| k == "."));
        if let Some(name) = key.strip_prefix("f:") {
            let Some(want) = desired.get(name) else {
                continue;
            };
            let have = live.get(name).unwrap_or(&Value::Null);
            let at = join(&path, name);
            match below {
                Some(below) if !leaf && (want.is_object() || want.is_array()) => {
                    walk(want, have, below, at, found);
                }
                _ if want != have => found.push(at),
                _ => {}
            }
        } else if let Some(item_key) = key.strip_prefix("k:") {
            let Ok(Value::Object(item_key)) = serde_json::from_str::<Value>(item_key) else {
                continue;
            };
            let matches = |item: &&Value| item_key.iter().all(|(k, v)| item.get(k) == Some(v));
            let (Some(want), Some(items)) = (
                desired.as_array().and_then(|a| a.iter().find(matches)),
                live.as_array(),
            ) else {
                continue;
            };
            let have = items.iter().find(matches).unwrap_or(&Value::Null);
            let named: Vec<String> = item_key
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                    )
                })
                .collect();
            let at = format!("{path}[{}]", named.join(","));
            match below {
                Some(below) if !leaf => walk(want, have, below, at, found),
                _ if want != have => found.push(at),
                _ => {}
            }
        }
    }
}

fn join(path: &str, name: &str) -> String {
    match path {
        "" => name.to_owned(),
        _ => format!("{path}.{name}"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    const OURS: &str = "kplug-operator.uid";

    #[test]
    fn a_desired_field_another_manager_changed_is_drift() {
        let desired = json!({"data": {"index.html": "<h1>hi</h1>", "about.html": "a"}});
        let live = json!({"data": {"index.html": "hacked", "about.html": "a"}, "metadata": {"labels": {"team": "web"}}});
        let managed = [
            entry(OURS, json!({"f:data": {".": {}, "f:about.html": {}}})),
            entry("kubectl-patch", json!({"f:data": {"f:index.html": {}}})),
            // A label nobody asked for is theirs, not drift.
            entry(
                "kubectl-label",
                json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
            ),
        ];
        assert_eq!(
            drift(&desired, &live, &managed, OURS),
            Some(Drift {
                fields: vec!["data.index.html".to_owned()],
                managers: vec!["kubectl-patch".to_owned()],
            })
        );
        // The same value, co-owned: no drift.
        let same = json!({"data": {"index.html": "<h1>hi</h1>", "about.html": "a"}});
        assert_eq!(drift(&desired, &same, &managed, OURS), None);
    }

    #[test]
    fn list_items_are_matched_by_their_key() {
        let desired = json!({"spec": {"containers": [{"name": "httpd", "image": "busybox:1.37"}]}});
        let live = json!({"spec": {"containers": [
            {"name": "sidecar", "image": "envoy"},
            {"name": "httpd", "image": "busybox:1.36"},
        ]}});
        let managed = [entry(
            "kubectl-edit",
            json!({"f:spec": {"f:containers": {
                "k:{\"name\":\"httpd\"}": {"f:image": {}},
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:image": {}, "f:name": {}},
            }}}),
        )];
        assert_eq!(
            drift(&desired, &live, &managed, OURS).map(|d| d.fields),
            Some(vec!["spec.containers[name=httpd].image".to_owned()])
        );
    }
}
