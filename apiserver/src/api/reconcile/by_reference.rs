//! A reconcile by reference (`spec.objectRef`): kplug reads the stored
//! object and the extensions it references, with its own identity, and
//! sends those to the plugin, so that the plugin sees what is stored (its
//! `resourceVersion` included), never a body the caller made up.
//!
//! Each object is read only after the caller's right to read it is
//! checked ([`kplug_api::access::ON_REFERENCED_OBJECT`], `get` on each
//! extension): kplug's answer returns what it read, and a caller who may
//! not read an object learns nothing from it, not even whether it exists.
//! The operation's own right on the object is checked afterwards, on what
//! was read, like any reconcile's.

use std::ops::Range;

use axum::body::Bytes;
use kplug_api::access::{self, Right};
use kplug_api::reference::{ExtensionRef, parse_references};
use serde_json::Value;

use super::access::{ObjectAccess, Target};
use super::decode::{self, Object};
use super::invalid;
use super::validate::{Reference, ServedAs};
use crate::api::status::ApiError;
use crate::auth::User;
use crate::auth::resources::{ResolveError, ServedResource, split_api_version};
use crate::kube_words::qualified_resource;
use crate::stored::{Location, ReadError, StoredObjects};

/// Retry-After when kube-apiserver could not be read.
const RETRY_AFTER_SECONDS: u32 = 1;

/// The objects read: the object and then its extensions, each whole JSON
/// object at its range of one buffer, so that they travel on as slices.
pub(super) struct Read {
    pub buffer: Bytes,
    object: Range<usize>,
    extensions: Vec<Range<usize>>,
}

impl Read {
    /// The object and its extensions, with their heads.
    pub fn objects(&self) -> Result<(Object<'_>, Vec<Object<'_>>), ApiError> {
        let object = |range: &Range<usize>| {
            decode::stored_object(&self.buffer[range.clone()]).map_err(|error| {
                ApiError::Internal(format!(
                    "kube-apiserver served an object kplug cannot read: {error}"
                ))
            })
        };
        let extensions = self
            .extensions
            .iter()
            .map(object)
            .collect::<Result<_, _>>()?;
        Ok((object(&self.object)?, extensions))
    }
}

/// One object to read: where it is and which field of the request names
/// it in errors.
struct Wanted<'a> {
    field: &'a str,
    group: &'a str,
    version: &'a str,
    served: ServedResource,
    namespace: &'a str,
    name: &'a str,
}

/// Reads the object `reference` names and its extensions, checking before
/// each read that `user` may read it.
pub(super) async fn read(
    access: &ObjectAccess,
    stored: &StoredObjects,
    user: &User,
    reference: &Reference,
) -> Result<Read, ApiError> {
    let (group, version) = reference.group_version();
    let served = match &reference.served_as {
        ServedAs::Kind(kind) => {
            let field = "spec.objectRef.kind";
            served(access, field, &reference.api_version, kind).await?
        }
        // Its scope is whatever the reference says: a cluster-scoped
        // resource read in a namespace is not found.
        ServedAs::Resource(resource) => ServedResource {
            plural: resource.clone(),
            namespaced: !reference.namespace.is_empty(),
        },
    };
    if served.namespaced && reference.namespace.is_empty() {
        return Err(invalid(
            "spec.objectRef.namespace",
            format!(
                "Required value: {} is namespaced",
                qualified_resource(&served.plural, group)
            ),
        ));
    }
    let namespace = if served.namespaced {
        reference.namespace.as_str()
    } else {
        ""
    };
    let parent = Wanted {
        field: "spec.objectRef",
        group,
        version,
        served,
        namespace,
        name: &reference.name,
    };
    let mut buffer = Vec::new();
    let object = read_one(
        access,
        stored,
        user,
        access::ON_REFERENCED_OBJECT,
        &parent,
        &mut buffer,
    )
    .await?;
    let read: Value = serde_json::from_slice(&buffer[object.clone()])
        .map_err(|e| ApiError::Internal(format!("kube-apiserver served invalid JSON: {e}")))?;
    let path = &reference.extensions_path;
    let references = parse_references(&path.to_string(), path.get(&read)).map_err(|error| {
        invalid(
            "spec.objectRef",
            format!("Invalid value: {:?}: {error}", reference.name),
        )
    })?;
    let mut extensions = Vec::with_capacity(references.len());
    for (i, extension) in references.iter().enumerate() {
        let field = format!("spec.extensions[{i}]");
        let wanted = extension_wanted(access, &field, extension, namespace).await?;
        let range = read_one(
            access,
            stored,
            user,
            access::ON_EXTENSION,
            &wanted,
            &mut buffer,
        )
        .await?;
        extensions.push(range);
    }
    Ok(Read {
        buffer: Bytes::from(buffer),
        object,
        extensions,
    })
}

/// Where an extension is, for an object in `namespace`: in its own
/// namespace if it names one, else in the object's.
async fn extension_wanted<'a>(
    access: &ObjectAccess,
    field: &'a str,
    extension: &'a ExtensionRef,
    namespace: &'a str,
) -> Result<Wanted<'a>, ApiError> {
    let (group, version) = split_api_version(&extension.api_version);
    let kind_field = format!("{field}.kind");
    let served = served(access, &kind_field, &extension.api_version, &extension.kind).await?;
    let namespace = match (served.namespaced, extension.namespace.as_deref()) {
        (false, _) => "",
        (true, Some(own)) if !own.is_empty() => own,
        (true, _) if !namespace.is_empty() => namespace,
        (true, _) => {
            return Err(invalid(
                &format!("{field}.namespace"),
                format!(
                    "Required value: {extension} is namespaced and the object that references \
                     it is not"
                ),
            ));
        }
    };
    Ok(Wanted {
        field,
        group,
        version,
        served,
        namespace,
        name: &extension.name,
    })
}

/// Checks that `user` holds `right` on `wanted`, then reads it onto the end
/// of `buffer`; returns its range there.
async fn read_one(
    access: &ObjectAccess,
    stored: &StoredObjects,
    user: &User,
    right: Right,
    wanted: &Wanted<'_>,
    buffer: &mut Vec<u8>,
) -> Result<Range<usize>, ApiError> {
    let resource = wanted.served.plural.as_str();
    let target = Target {
        field: wanted.field,
        group: wanted.group,
        resource,
        namespace: wanted.namespace,
        name: wanted.name,
    };
    access.authorize(user, right, &target).await?;
    let location = Location {
        group: wanted.group,
        version: wanted.version,
        resource,
        namespace: wanted.namespace,
        name: wanted.name,
    };
    let text = stored
        .get(&location)
        .await
        .map_err(|error| read_error(error, &location))?;
    let start = buffer.len();
    buffer.extend_from_slice(text.as_bytes());
    Ok(start..buffer.len())
}

/// The resource serving `kind`; a kind the cluster does not serve is the
/// caller's mistake, named at `field`.
async fn served(
    access: &ObjectAccess,
    field: &str,
    api_version: &str,
    kind: &str,
) -> Result<ServedResource, ApiError> {
    access
        .served(api_version, kind)
        .await
        .map_err(|error| match error {
            ResolveError::NotServed { .. } => {
                invalid(field, format!("Invalid value: {kind:?}: {error}"))
            }
            ResolveError::Discovery { .. } => ApiError::Internal(error.to_string()),
        })
}

fn read_error(error: ReadError, location: &Location<'_>) -> ApiError {
    let resource = qualified_resource(location.resource, location.group);
    let name = location.name;
    let place = match location.namespace {
        "" => String::new(),
        namespace => format!(" in the namespace {namespace:?}"),
    };
    match error {
        ReadError::NotFound => ApiError::ObjectNotFound {
            group: location.group.to_owned(),
            resource: location.resource.to_owned(),
            name: name.to_owned(),
        },
        ReadError::Forbidden(message) => ApiError::Internal(format!(
            "kplug may not read {resource} {name:?}{place} with its own identity ({message}): \
             grant kplug's ServiceAccount get on {resource}, as `kubectl kplug create plugin \
             --api` does with ClusterRole kplug:read:PLUGIN"
        )),
        ReadError::Unavailable(message) => ApiError::ServiceUnavailable {
            message: format!("reading {resource} {name:?}{place}: {message}"),
            retry_after: RETRY_AFTER_SECONDS,
        },
    }
}
