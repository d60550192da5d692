//! Extension objects: the references a resource makes to them (parsed by
//! [`kplug_api::reference`], as kplug parses them for a reconcile by
//! reference) and their resolution, read with the operator's own client so
//! that its RBAC decides what it may see.

use std::collections::HashMap;
use std::sync::Arc;

use kplug_api::reference::ReferenceError;
pub use kplug_api::reference::{ExtensionRef, parse_references, type_name};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, ApiCapabilities, Scope};
use kube::{Client, ResourceExt};
use parking_lot::Mutex;

/// The group, version and kind a reference names.
pub fn gvk(reference: &ExtensionRef) -> GroupVersionKind {
    let (group, version) = reference.group_version();
    GroupVersionKind::gvk(group, version, &reference.kind)
}

/// Whether `object` is the extension `reference` names, for an object in
/// `namespace`.
pub fn names(reference: &ExtensionRef, object: &DynamicObject, namespace: Option<&str>) -> bool {
    let types = object.types.as_ref();
    types.is_some_and(|t| t.api_version == reference.api_version && t.kind == reference.kind)
        && object.name_any() == reference.name
        && object.namespace().as_deref() == reference.namespace.as_deref().or(namespace)
}

/// What is wrong with a resource's extension references or their objects.
/// Each is reported on the resource as a condition and an Event.
#[derive(Debug, thiserror::Error)]
pub enum ExtensionError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
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
            Self::Reference(_) => "InvalidExtensionReference",
            Self::KindNotServed { .. } => "ExtensionKindNotServed",
            Self::NotFound { .. } => "ExtensionNotFound",
            Self::Read { .. } => "ExtensionReadFailed",
            Self::InvalidObject(_) => "InvalidObject",
        }
    }
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
        let gvk = gvk(reference);
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
