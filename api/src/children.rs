//! The rules for the Kubernetes objects a plugin asks for (its desired
//! children) and a caller reports (the observed ones), apart from the JSON
//! checks every status gets ([`crate::answer`]). An operator applies what a
//! plugin returns, with its own rights, so kplug refuses what no operator
//! should apply, naming the child: an object without an identity, fields
//! only the operator or kube-apiserver set, a child outside the object's
//! namespace unless the operator allows it.
//!
//! A bad child refuses the whole answer, not only that child: an operator
//! prunes the children it applied that an answer leaves out, so dropping a
//! bad child would delete the good one it replaced.

use std::collections::HashSet;

use serde_json::Value;

use crate::v1alpha1::ChildScope;
use crate::validation;

/// The annotation an operator sets on each child it applies: the child's
/// key, which names it to the plugin in later requests.
pub const KEY_ANNOTATION: &str = "plugins.kplug.io/child-key";

/// The most children one answer may ask for: each becomes a line of the
/// parent's `status.children`, which must stay a fraction of an object.
pub const MAX_CHILDREN: usize = 256;

/// The longest child, as JSON: etcd's default `--max-request-bytes`
/// (1.5 MiB), the largest object kube-apiserver can store.
pub const MAX_CHILD_BYTES: usize = 1536 << 10;

/// What is wrong with one child: a Kubernetes field error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ChildError {
    pub field: String,
    pub problem: Problem,
}

/// A field error's type and detail, in apimachinery's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("Required value")]
    Required,
    #[error("Invalid value: {value:?}: {reason}")]
    Invalid { value: String, reason: String },
    #[error("Forbidden: {0}")]
    Forbidden(String),
    #[error("Duplicate value: {0:?}")]
    Duplicate(String),
}

impl ChildError {
    fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }
}

/// Where the reconciled object is, and where its children may be.
#[derive(Clone, Copy, Debug, Default)]
pub struct Placement<'a> {
    /// The object's namespace; empty for a cluster-scoped object.
    pub namespace: &'a str,
    pub scope: ChildScope,
}

/// Checks the key at `field`: a DNS-1123 label, not seen before in the
/// same list (it is added to `seen`).
pub fn key(field: &str, key: &str, seen: &mut HashSet<String>) -> Result<(), ChildError> {
    if key.is_empty() {
        return Err(ChildError::new(field, Problem::Required));
    }
    if let Some(reason) = validation::dns1123_label(key) {
        let value = key.to_owned();
        return Err(ChildError::new(field, Problem::Invalid { value, reason }));
    }
    if !seen.insert(key.to_owned()) {
        return Err(ChildError::new(field, Problem::Duplicate(key.to_owned())));
    }
    Ok(())
}

/// An object's apiVersion, kind, namespace and name, each empty when absent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> Identity<'a> {
    /// The identity of a JSON object; a field that is not a string is absent.
    pub fn of(object: &'a Value) -> Self {
        let text = |value: Option<&'a Value>| value.and_then(Value::as_str).unwrap_or_default();
        let metadata = object.get("metadata");
        Self {
            api_version: text(object.get("apiVersion")),
            kind: text(object.get("kind")),
            namespace: text(metadata.and_then(|m| m.get("namespace"))),
            name: text(metadata.and_then(|m| m.get("name"))),
        }
    }

    /// Checks that the object at `field` names what it is: an apiVersion, a
    /// kind and a name (`generateName` cannot be applied: a child keeps its
    /// name from one answer to the next).
    pub fn check(&self, field: &str) -> Result<(), ChildError> {
        for (value, path) in [
            (self.api_version, "apiVersion"),
            (self.kind, "kind"),
            (self.name, "metadata.name"),
        ] {
            if value.is_empty() {
                return Err(ChildError::new(
                    format!("{field}.{path}"),
                    Problem::Required,
                ));
            }
        }
        Ok(())
    }
}

/// Checks a desired child's object at `field` (a JSON object): its
/// identity, what only others may set, and its namespace.
pub fn desired(field: &str, object: &Value, placement: Placement<'_>) -> Result<(), ChildError> {
    let identity = Identity::of(object);
    identity.check(field)?;
    let metadata = object.get("metadata").and_then(Value::as_object);
    for (name, setter) in [
        (
            "ownerReferences",
            "the operator ties the child to its object",
        ),
        ("managedFields", "kube-apiserver records who set each field"),
    ] {
        if metadata.is_some_and(|m| m.contains_key(name)) {
            return Err(ChildError::new(
                format!("{field}.metadata.{name}"),
                Problem::Forbidden(format!("a plugin may not set it: {setter}")),
            ));
        }
    }
    let elsewhere = placement.scope == ChildScope::Namespace
        && !placement.namespace.is_empty()
        && !identity.namespace.is_empty()
        && identity.namespace != placement.namespace;
    if elsewhere {
        return Err(ChildError::new(
            format!("{field}.metadata.namespace"),
            Problem::Forbidden(format!(
                "must be the object's namespace {:?} (or unset): the operator does not allow \
                 children in other namespaces (childScope Cluster)",
                placement.namespace
            )),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_key_is_a_label_unique_in_its_list() {
        let mut seen = HashSet::new();
        assert_eq!(key("k", "web", &mut seen), Ok(()));
        assert_eq!(
            key("k", "web", &mut seen).map_err(|e| e.to_string()),
            Err("k: Duplicate value: \"web\"".to_owned())
        );
        assert_eq!(
            key("k", "", &mut seen).map_err(|e| e.to_string()),
            Err("k: Required value".to_owned())
        );
        let invalid = key("k", "Web_1", &mut seen).expect_err("not a label");
        assert!(
            invalid.to_string().starts_with(
                "k: Invalid value: \"Web_1\": a lowercase RFC 1123 label must consist of"
            ),
            "{invalid}"
        );
        assert!(key("k", &"a".repeat(64), &mut seen).is_err());
    }

    #[test]
    fn a_desired_child_names_itself_and_leaves_ownership_to_others() {
        let here = Placement {
            namespace: "shop",
            scope: ChildScope::Namespace,
        };
        let config_map =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"}});
        assert_eq!(desired("c", &config_map, here), Ok(()));
        for (object, message) in [
            (
                json!({"kind": "ConfigMap", "metadata": {"name": "site"}}),
                "c.apiVersion: Required value",
            ),
            (
                json!({"apiVersion": "v1", "kind": 7, "metadata": {"name": "site"}}),
                "c.kind: Required value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "site-"}}),
                "c.metadata.name: Required value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "site", "ownerReferences": []}}),
                "c.metadata.ownerReferences: Forbidden: a plugin may not set it: the operator \
                 ties the child to its object",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "site", "managedFields": null}}),
                "c.metadata.managedFields: Forbidden: a plugin may not set it: kube-apiserver \
                 records who set each field",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "site", "namespace": "other"}}),
                "c.metadata.namespace: Forbidden: must be the object's namespace \"shop\" (or \
                 unset): the operator does not allow children in other namespaces (childScope \
                 Cluster)",
            ),
        ] {
            assert_eq!(
                desired("c", &object, here).map_err(|e| e.to_string()),
                Err(message.to_owned()),
                "{object}"
            );
        }
    }

    #[test]
    fn other_namespaces_need_the_cluster_scope_or_a_cluster_scoped_object() {
        let child = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "site", "namespace": "other"}});
        let same = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "site", "namespace": "shop"}});
        let placement = |namespace, scope| Placement { namespace, scope };
        assert!(desired("c", &child, placement("shop", ChildScope::Namespace)).is_err());
        assert!(desired("c", &same, placement("shop", ChildScope::Namespace)).is_ok());
        assert!(desired("c", &child, placement("shop", ChildScope::Cluster)).is_ok());
        assert!(desired("c", &child, placement("", ChildScope::Namespace)).is_ok());
    }
}
