//! What a Reconcile must be before anything is selected or called: its
//! objects, its namespace, its operation, timeout and version range. Pure:
//! the request in, a Status error or what it asks for out.

use std::time::Duration;

use super::decode::{self, Object, Request, Spec};
use super::{ReconcileSettings, invalid};
use crate::api::status::ApiError;
use crate::v1alpha1::{API_VERSION, Operation, Reconcile};
use crate::version::VersionConstraint;

/// Checks that `value` is a Kubernetes object with apiVersion, kind and a name.
fn check_object(field: &str, value: Option<&Object<'_>>) -> Result<(), ApiError> {
    let head = value
        .map(|object| object.head)
        .filter(|head| head.readable)
        .ok_or_else(|| invalid(field, "Required value: a Kubernetes object"))?;
    if head.api_version.is_none() {
        return Err(invalid(&format!("{field}.apiVersion"), "Required value"));
    }
    if head.kind.is_none() {
        return Err(invalid(&format!("{field}.kind"), "Required value"));
    }
    if head.name.is_none() {
        return Err(invalid(&format!("{field}.metadata.name"), "Required value"));
    }
    Ok(())
}

/// A namespaced reconcile acts on an object of its namespace only: the
/// extensions, wherever they are, answer to the object checks.
fn check_namespace(object: Option<&Object<'_>>, namespace: &str) -> Result<(), ApiError> {
    let field = "spec.object.metadata.namespace";
    let sent = object
        .and_then(|object| object.head.namespace)
        .map(decode::Text::value)
        .unwrap_or_default();
    if sent == namespace {
        Ok(())
    } else if sent.is_empty() {
        Err(invalid(
            field,
            format!("Required value: must be {namespace:?}, the namespace of the request"),
        ))
    } else {
        Err(invalid(
            field,
            format!("Invalid value: {sent:?}: must be {namespace:?}, the namespace of the request"),
        ))
    }
}

/// The operation asked for; `Err` holds an unsupported name.
fn operation(spec: &Spec<'_>) -> Result<Operation, ApiError> {
    match spec.operation.as_deref() {
        None | Some("Reconcile") => Ok(Operation::Reconcile),
        Some("Finalize") => Ok(Operation::Finalize),
        Some(name) => Err(invalid(
            "spec.operation",
            format!("Unsupported value: {name:?}: supported values: \"Reconcile\", \"Finalize\""),
        )),
    }
}

/// What a valid request asks for beyond its objects.
pub(super) struct Asked {
    pub operation: Operation,
    pub timeout: Duration,
    pub versions: Option<VersionConstraint>,
}

/// Checks the request; returns what it asks for.
pub(super) fn validate(
    request: &Request<'_>,
    settings: &ReconcileSettings,
    namespace: Option<&str>,
) -> Result<Asked, ApiError> {
    if !request.api_version.is_empty() && request.api_version != API_VERSION {
        return Err(ApiError::BadRequest(format!(
            "apiVersion {:?} is not {API_VERSION}",
            request.api_version
        )));
    }
    if !request.kind.is_empty() && request.kind != Reconcile::KIND {
        return Err(ApiError::BadRequest(format!(
            "kind {:?} is not {}",
            request.kind,
            Reconcile::KIND
        )));
    }
    let spec = &request.spec;
    let operation = operation(spec)?;
    check_object("spec.object", spec.object.as_ref())?;
    if let Some(namespace) = namespace {
        check_namespace(spec.object.as_ref(), namespace)?;
    }
    for (i, extension) in spec.extensions.iter().enumerate() {
        check_object(&format!("spec.extensions[{i}]"), Some(extension))?;
    }
    let max = settings.max_timeout.as_secs();
    let timeout = match spec.timeout_seconds {
        None => Ok(settings.default_timeout),
        Some(seconds) => match u64::try_from(seconds) {
            Ok(s) if (1..=max).contains(&s) => Ok(Duration::from_secs(s)),
            _ => Err(invalid(
                "spec.timeoutSeconds",
                format!("Invalid value: {seconds}: must be between 1 and {max}"),
            )),
        },
    }?;
    let versions = spec
        .version_constraint
        .as_deref()
        .filter(|text| !text.is_empty())
        .map(|text| {
            text.parse().map_err(|error| {
                invalid(
                    "spec.versionConstraint",
                    format!("Invalid value: {text:?}: {error}"),
                )
            })
        })
        .transpose()?;
    Ok(Asked {
        operation,
        timeout,
        versions,
    })
}
