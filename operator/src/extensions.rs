//! Extension objects: the references a resource makes to them (parsed
//! without IO) and their resolution, read with the operator's own client so
//! that its RBAC decides what it may see.

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, ApiCapabilities, Scope};
use kube::{Client, ResourceExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A reference to an extension object, as a resource writes it in e.g.
/// `spec.extensions`: `apiVersion`, `kind`, `name` and an optional
/// `namespace` that defaults to the referring object's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ExtensionRef {
    /// The group, version and kind it names.
    pub fn gvk(&self) -> GroupVersionKind {
        let (group, version) = match self.api_version.rsplit_once('/') {
            Some((group, version)) => (group, version),
            None => ("", self.api_version.as_str()),
        };
        GroupVersionKind::gvk(group, version, &self.kind)
    }

    /// Whether `object` is the extension this reference names, for an
    /// object in `namespace`.
    pub fn names(&self, object: &DynamicObject, namespace: Option<&str>) -> bool {
        let types = object.types.as_ref();
        types.is_some_and(|t| t.api_version == self.api_version && t.kind == self.kind)
            && object.name_any() == self.name
            && object.namespace().as_deref() == self.namespace.as_deref().or(namespace)
    }
}

impl std::fmt::Display for ExtensionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)?;
        match &self.namespace {
            Some(namespace) => write!(f, " {namespace}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// What is wrong with a resource's extension references or their objects.
/// Each is reported on the resource as a condition and an Event.
#[derive(Debug, thiserror::Error)]
pub enum ExtensionError {
    #[error("{field} must be a list of object references, not {found}")]
    NotAList { field: String, found: &'static str },
    #[error("{field}[{index}] is not a valid object reference: {why}")]
    InvalidReference {
        field: String,
        index: usize,
        why: String,
    },
    #[error("{reference}: the kind is not served by the cluster ({why})")]
    KindNotServed {
        reference: ExtensionRef,
        why: String,
    },
    #[error("{reference}: not found")]
    NotFound { reference: ExtensionRef },
    #[error("the object does not have the expected form: {0}")]
    InvalidObject(String),
    #[error("{reference}: reading it failed: {}", crate::words::kube_error(source))]
    Read {
        reference: ExtensionRef,
        #[source]
        source: Box<kube::Error>,
    },
}

impl ExtensionError {
    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAList { .. } | Self::InvalidReference { .. } => "InvalidExtensionReference",
            Self::KindNotServed { .. } => "ExtensionKindNotServed",
            Self::NotFound { .. } => "ExtensionNotFound",
            Self::Read { .. } => "ExtensionReadFailed",
            Self::InvalidObject(_) => "InvalidObject",
        }
    }
}

/// What `value` is, in words for a message: "a list", "an object", ...
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses the references at `field` (`None`: the object has none).
pub fn parse_references(
    field: &str,
    value: Option<&Value>,
) -> Result<Vec<ExtensionRef>, ExtensionError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ExtensionError::NotAList {
                field: field.to_owned(),
                found: type_name(other),
            });
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let invalid = |why: String| ExtensionError::InvalidReference {
                field: field.to_owned(),
                index,
                why,
            };
            let reference = ExtensionRef::deserialize(item).map_err(|e| invalid(e.to_string()))?;
            for (name, value) in [
                ("apiVersion", &reference.api_version),
                ("kind", &reference.kind),
                ("name", &reference.name),
            ] {
                if value.is_empty() {
                    return Err(invalid(format!("{name} must not be empty")));
                }
            }
            if reference.api_version.matches('/').count() > 1 {
                return Err(invalid(format!(
                    "apiVersion {:?} must be GROUP/VERSION or VERSION",
                    reference.api_version
                )));
            }
            Ok(reference)
        })
        .collect()
}

/// Reads extension objects, remembering how each kind maps to a resource.
#[derive(Clone)]
pub struct Resolver {
    client: Client,
    kinds: Arc<Mutex<HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>>>,
}

impl Resolver {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            kinds: Arc::default(),
        }
    }

    async fn resource(
        &self,
        reference: &ExtensionRef,
    ) -> Result<(ApiResource, ApiCapabilities), ExtensionError> {
        let gvk = reference.gvk();
        if let Some(known) = self.kinds.lock().get(&gvk) {
            return Ok(known.clone());
        }
        // Only successes are remembered: a kind served later (a CRD
        // installed after the object) is found on a retry.
        let found = discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| ExtensionError::KindNotServed {
                reference: reference.clone(),
                why: e.to_string(),
            })?;
        self.kinds.lock().insert(gvk, found.clone());
        Ok(found)
    }

    /// The API of the extension a reference names, for an object in
    /// `namespace`.
    pub async fn api(
        &self,
        reference: &ExtensionRef,
        namespace: Option<&str>,
    ) -> Result<Api<DynamicObject>, ExtensionError> {
        let (resource, capabilities) = self.resource(reference).await?;
        Ok(
            match (
                capabilities.scope,
                reference.namespace.as_deref().or(namespace),
            ) {
                (Scope::Namespaced, Some(namespace)) => {
                    Api::namespaced_with(self.client.clone(), namespace, &resource)
                }
                (Scope::Namespaced, None) => {
                    Api::default_namespaced_with(self.client.clone(), &resource)
                }
                (Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
            },
        )
    }

    /// Reads every referenced extension, in order.
    pub async fn resolve(
        &self,
        references: &[ExtensionRef],
        namespace: Option<&str>,
    ) -> Result<Vec<DynamicObject>, ExtensionError> {
        let mut objects = Vec::with_capacity(references.len());
        for reference in references {
            let api = self.api(reference, namespace).await?;
            let object = api
                .get_opt(&reference.name)
                .await
                .map_err(|source| ExtensionError::Read {
                    reference: reference.clone(),
                    source: Box::new(source),
                })?
                .ok_or_else(|| ExtensionError::NotFound {
                    reference: reference.clone(),
                })?;
            objects.push(object);
        }
        Ok(objects)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn references_parse_with_an_optional_namespace() {
        let value = json!([
            {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTableMariaDbExtension", "name": "users"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings", "namespace": "shared"},
        ]);
        let references = parse_references("spec.extensions", Some(&value)).expect("valid");
        assert_eq!(references.len(), 2);
        assert_eq!(
            references[0].gvk(),
            GroupVersionKind::gvk("myorg.org", "v1alpha1", "DatabaseTableMariaDbExtension")
        );
        assert_eq!(
            references[1].gvk(),
            GroupVersionKind::gvk("", "v1", "ConfigMap")
        );
        assert_eq!(references[1].namespace.as_deref(), Some("shared"));
        assert_eq!(references[1].to_string(), "v1 ConfigMap shared/settings");
    }

    #[test]
    fn no_references_is_no_extensions() {
        assert!(
            parse_references("spec.extensions", None)
                .expect("ok")
                .is_empty()
        );
        assert!(
            parse_references("spec.extensions", Some(&Value::Null))
                .expect("ok")
                .is_empty()
        );
    }

    #[test]
    fn bad_references_say_which_and_why() {
        let cases = [
            (
                json!("users"),
                "must be a list of object references, not a string",
            ),
            (
                json!([{"apiVersion": "v1", "kind": "ConfigMap"}]),
                "spec.extensions[0]",
            ),
            (
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": ""}]),
                "name must not be empty",
            ),
            (
                json!([{"apiVersion": "a/b/c", "kind": "K", "name": "n"}]),
                "must be GROUP/VERSION or VERSION",
            ),
            (
                json!([42]),
                "spec.extensions[0] is not a valid object reference",
            ),
        ];
        for (value, expected) in cases {
            let error = parse_references("spec.extensions", Some(&value))
                .expect_err("invalid")
                .to_string();
            assert!(error.contains(expected), "{value}: {error}");
        }
    }
}
