//! Kubernetes objects a plugin wants to exist for the object it reconciles
//! (its *children*), and the ones the operator observed. The operator
//! applies each child with server-side apply, ties it to the object with an
//! owner reference (or, for a cluster-scoped child or one in another
//! namespace, which only an operator run with `--child-scope=cluster`
//! accepts, with a label and its inventory), waits for it to be ready wave
//! by wave, and removes the children a later answer no longer returns.
//!
//! A child is *apply intent*, not a copy of the live object: return only
//! the fields the plugin cares about, every time. A field the plugin stops
//! returning is removed from the child, as server-side apply removes a
//! field its manager no longer applies; a field someone else set and the
//! plugin never returns stays theirs.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{Outcome, Request};

/// One Kubernetes object the plugin wants to exist.
///
/// ```
/// use kplug_sdk::{Child, Outcome};
/// use serde_json::json;
///
/// let site = json!({
///     "apiVersion": "v1",
///     "kind": "ConfigMap",
///     "metadata": { "name": "site" },
///     "data": { "index.html": "<h1>hello</h1>" },
/// });
/// let outcome = Outcome::success().child(Child::new("site", site).wave(0));
/// assert_eq!(outcome.children[0].key, "site");
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Child {
    /// Names the child from one answer to the next: a DNS-1123 label
    /// (`web`, `site-config`), unique in the answer. The observed child
    /// comes back under it.
    pub key: String,
    /// The object: `apiVersion`, `kind`, `metadata.name` and the fields the
    /// plugin cares about. No `metadata.ownerReferences` or
    /// `metadata.managedFields`; no namespace other than the reconciled
    /// object's unless the operator allows it.
    pub object: Value,
    /// The plugin's verdict on whether the child is ready; `None` leaves it
    /// to the operator's rule (rolled out for workloads, complete for Jobs,
    /// a `Ready` or `Available` condition where there is one, else exists).
    pub ready: Option<bool>,
    /// Applied only once every child of a lower wave is ready; removed, on
    /// deletion, only once every child of a higher wave is gone. 0 unless set.
    pub wave: i32,
}

impl Child {
    /// A child under `key`, with no readiness verdict, in wave 0.
    pub fn new(key: impl Into<String>, object: Value) -> Self {
        Self {
            key: key.into(),
            object,
            ready: None,
            wave: 0,
        }
    }

    /// A child from a typed object, such as a `k8s-openapi` `Deployment`
    /// (whose serialization carries its `apiVersion` and `kind`).
    ///
    /// # Errors
    ///
    /// The object's `Serialize` failed, or did not give a JSON object.
    pub fn typed<T: Serialize>(key: impl Into<String>, object: &T) -> Result<Self, ChildError> {
        let key = key.into();
        match serde_json::to_value(object) {
            Ok(value @ Value::Object(_)) => Ok(Self::new(key, value)),
            Ok(_) => Err(ChildError::NotAnObject { key }),
            Err(error) => Err(ChildError::Serialize { key, error }),
        }
    }

    /// Gives the plugin's verdict on whether the child is ready.
    #[must_use]
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = Some(ready);
        self
    }

    /// Puts the child in `wave`.
    #[must_use]
    pub fn wave(mut self, wave: i32) -> Self {
        self.wave = wave;
        self
    }
}

/// Why a typed object could not become a [`Child`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChildError {
    #[error("child {key:?} does not serialize: {error}")]
    Serialize {
        key: String,
        #[source]
        error: serde_json::Error,
    },
    #[error("child {key:?} must serialize to a JSON object")]
    NotAnObject { key: String },
}

impl Outcome {
    /// Adds a child the object should have. Return every child on every
    /// answer: one left out is removed.
    #[must_use]
    pub fn child(mut self, child: Child) -> Self {
        self.children.push(child);
        self
    }
}

impl Request {
    /// The child the operator observed under `key` (the live object,
    /// status included), if it has one.
    pub fn observed_child(&self, key: &str) -> Option<&Value> {
        self.observed_children
            .iter()
            .find(|(observed, _)| observed == key)
            .map(|(_, object)| object)
    }

    /// [`observed_child`](Self::observed_child) as a typed object, such as
    /// a `k8s-openapi` `Deployment`.
    ///
    /// # Errors
    ///
    /// The observed object does not deserialize into `T`.
    pub fn observed_child_as<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, serde_json::Error> {
        self.observed_child(key)
            .map(|object| T::deserialize(object))
            .transpose()
    }

    /// Adds an observed child, as if the operator had sent it.
    #[must_use]
    pub fn with_observed_child(mut self, key: impl Into<String>, object: Value) -> Self {
        self.observed_children.push((key.into(), object));
        self
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn deployment(replicas: i32) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        }
    }

    #[test]
    fn a_typed_child_carries_its_api_version_and_kind_and_only_its_fields() {
        let child = Child::typed("web", &deployment(2))
            .expect("serializes")
            .ready(false)
            .wave(1);
        assert_eq!(child.object["apiVersion"], "apps/v1");
        assert_eq!(child.object["kind"], "Deployment");
        assert_eq!(child.object["spec"]["replicas"], 2);
        assert_eq!(child.object["metadata"], json!({"name": "web"}));
        assert_eq!((child.ready, child.wave), (Some(false), 1));
        let not_an_object = Child::typed("n", &7).expect_err("a number");
        assert_eq!(
            not_an_object.to_string(),
            "child \"n\" must serialize to a JSON object"
        );
    }

    #[test]
    fn an_observed_child_reads_by_key_as_json_or_typed() {
        let live = serde_json::to_value(deployment(3)).expect("serializes");
        let request = Request::new(json!({})).with_observed_child("web", live.clone());
        assert_eq!(request.observed_child("web"), Some(&live));
        assert_eq!(request.observed_child("site"), None);
        let typed: Option<Deployment> = request.observed_child_as("web").expect("a Deployment");
        assert_eq!(typed.and_then(|d| d.spec).and_then(|s| s.replicas), Some(3));
        let wrong = Request::new(json!({})).with_observed_child("web", json!({"spec": 7}));
        assert!(wrong.observed_child_as::<Deployment>("web").is_err());
    }
}
