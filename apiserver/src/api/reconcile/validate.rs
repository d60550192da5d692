//! What a Reconcile must be before anything is selected or called: its
//! objects (or the reference to one), its namespace, its operation, timeout
//! and version range. Pure: the request in, a Status error or what it asks
//! for out.

use std::collections::HashSet;
use std::time::Duration;

use kplug_api::children::{self, ChildError, MAX_CHILDREN};
use kplug_api::reference::FieldPath;

use super::decode::{self, Object, Request, Spec};
use super::{ReconcileSettings, invalid};
use crate::api::status::ApiError;
use crate::v1alpha1::{API_VERSION, ObservedChild, Operation, Reconcile, StoredObjectRef};
use crate::version::VersionConstraint;

/// Checks that `value` is a Kubernetes object with apiVersion, kind and a name.
fn check_object(field: &str, value: Option<&Object<'_>>) -> Result<(), ApiError> {
    let head = value
        .map(|object| object.head)
        .filter(|head| head.readable)
        .ok_or_else(|| {
            let or = match field {
                "spec.object" => ", or a reference to a stored one in spec.objectRef",
                _ => "",
            };
            invalid(field, format!("Required value: a Kubernetes object{or}"))
        })?;
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

/// Checks the observed children: at most [`MAX_CHILDREN`], each a
/// Kubernetes object under its own valid key.
fn check_observed(observed: &[ObservedChild]) -> Result<(), ApiError> {
    if observed.len() > MAX_CHILDREN {
        return Err(invalid(
            "spec.observedChildren",
            format!(
                "Too many: {}: must have at most {MAX_CHILDREN} items",
                observed.len()
            ),
        ));
    }
    let refused = |e: ChildError| invalid(&e.field, e.problem.to_string());
    let mut keys = HashSet::with_capacity(observed.len());
    for (i, child) in observed.iter().enumerate() {
        let field = format!("spec.observedChildren[{i}]");
        children::key(&format!("{field}.key"), &child.key, &mut keys).map_err(refused)?;
        // Valid JSON already, as serde read it.
        let object = decode::stored_object(child.object.get().as_bytes()).ok();
        check_object(&format!("{field}.object"), object.as_ref())?;
    }
    Ok(())
}

/// A namespaced reconcile acts on an object of its namespace only: the
/// extensions, wherever they are, answer to the object checks. `sent` is
/// the namespace the object (`field`) claims.
fn check_namespace(field: &str, sent: &str, namespace: &str) -> Result<(), ApiError> {
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
    /// The stored object to read, for a reconcile by reference.
    pub reference: Option<Reference>,
}

/// A stored object a reconcile names (`spec.objectRef`), checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reference {
    pub api_version: String,
    pub served_as: ServedAs,
    /// The request's own namespace when the reference names none.
    pub namespace: String,
    pub name: String,
    pub extensions_path: FieldPath,
}

/// How a reference names its object's type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ServedAs {
    Kind(String),
    Resource(String),
}

impl Reference {
    /// The group (empty for the core group) and the version.
    pub fn group_version(&self) -> (&str, &str) {
        self.api_version
            .split_once('/')
            .unwrap_or(("", self.api_version.as_str()))
    }
}

/// Where a name goes into a URL path, as kube-apiserver's
/// `ValidatePathSegmentName` requires it.
fn check_path_segment(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(invalid(field, "Required value"));
    }
    let why = if value == "." || value == ".." {
        Some(format!("may not be '{value}'"))
    } else {
        ['/', '%']
            .into_iter()
            .find(|c| value.contains(*c))
            .map(|c| format!("may not contain '{c}'"))
    };
    match why {
        Some(why) => Err(invalid(field, format!("Invalid value: {value:?}: {why}"))),
        None => Ok(()),
    }
}

/// Checks `spec.objectRef`; `namespace` is the request's (its path's).
fn reference(sent: &StoredObjectRef, namespace: Option<&str>) -> Result<Reference, ApiError> {
    let field = |name: &str| format!("spec.objectRef.{name}");
    let api_version = &sent.api_version;
    if api_version.is_empty() {
        return Err(invalid(&field("apiVersion"), "Required value"));
    }
    let parts: Vec<&str> = api_version.split('/').collect();
    if parts.len() > 2
        || parts
            .iter()
            .any(|part| part.is_empty() || part.contains('%'))
    {
        return Err(invalid(
            &field("apiVersion"),
            format!("Invalid value: {api_version:?}: must be GROUP/VERSION or VERSION"),
        ));
    }
    let served_as = match (sent.kind.as_str(), sent.resource.as_str()) {
        ("", "") => {
            return Err(invalid(
                &field("kind"),
                "Required value: name the object's kind, or its resource in spec.objectRef.resource",
            ));
        }
        (_, "") => ServedAs::Kind(sent.kind.clone()),
        ("", resource) => {
            check_path_segment(&field("resource"), resource)?;
            ServedAs::Resource(resource.to_owned())
        }
        (_, _) => {
            return Err(invalid(
                &field("resource"),
                "Forbidden: may not be set with spec.objectRef.kind",
            ));
        }
    };
    check_path_segment(&field("name"), &sent.name)?;
    let namespace = match (sent.namespace.as_str(), namespace) {
        ("", request) => request.unwrap_or_default().to_owned(),
        (sent, Some(request)) => {
            check_namespace(&field("namespace"), sent, request)?;
            sent.to_owned()
        }
        (sent, None) => sent.to_owned(),
    };
    if !namespace.is_empty() {
        check_path_segment(&field("namespace"), &namespace)?;
    }
    let extensions_path = match sent.extensions_path.as_str() {
        "" => FieldPath::default_extensions(),
        path => path.parse().map_err(|error| {
            invalid(
                &field("extensionsPath"),
                format!("Invalid value: {path:?}: {error}"),
            )
        })?,
    };
    Ok(Reference {
        api_version: api_version.clone(),
        served_as,
        namespace,
        name: sent.name.clone(),
        extensions_path,
    })
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
    let reference = match (&spec.object, &spec.object_ref) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "spec.objectRef",
                "Forbidden: may not be set with spec.object",
            ));
        }
        (_, Some(_)) if !spec.extensions.is_empty() => {
            return Err(invalid(
                "spec.extensions",
                "Forbidden: kplug reads the extensions the object in spec.objectRef references",
            ));
        }
        (None, Some(sent)) => Some(reference(sent, namespace)?),
        (object, None) => {
            check_object("spec.object", object.as_ref())?;
            if let Some(namespace) = namespace {
                let sent = object
                    .and_then(|object| object.head.namespace)
                    .map(decode::Text::value)
                    .unwrap_or_default();
                check_namespace("spec.object.metadata.namespace", &sent, namespace)?;
            }
            None
        }
    };
    for (i, extension) in spec.extensions.iter().enumerate() {
        check_object(&format!("spec.extensions[{i}]"), Some(extension))?;
    }
    check_observed(&spec.observed_children)?;
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
        reference,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// What `validate` says of `spec` sent to a namespace's path, or not.
    fn check(spec: Value, namespace: Option<&str>) -> Result<Asked, ApiError> {
        let body = json!({"spec": spec}).to_string();
        let request = decode::request(body.as_bytes()).expect("decodes");
        validate(&request, &ReconcileSettings::default(), namespace)
    }

    fn refusal(spec: Value, namespace: Option<&str>) -> (String, String) {
        match check(spec, namespace) {
            Err(ApiError::Invalid { causes, .. }) => causes.into_iter().next().unwrap_or_default(),
            Err(other) => panic!("not a 422: {other}"),
            Ok(_) => panic!("accepted"),
        }
    }

    fn widget_ref(fields: Value) -> Value {
        let mut reference = json!({"apiVersion": "example.com/v1", "kind": "Widget", "name": "w1"});
        if let (Some(reference), Some(fields)) = (reference.as_object_mut(), fields.as_object()) {
            reference.extend(fields.clone());
        }
        json!({"objectRef": reference})
    }

    #[test]
    fn a_reference_names_its_object_and_takes_the_requests_namespace() {
        let asked = check(widget_ref(json!({})), Some("team-a")).expect("valid");
        let reference = asked.reference.expect("a reference");
        assert_eq!(reference.group_version(), ("example.com", "v1"));
        assert_eq!(reference.served_as, ServedAs::Kind("Widget".to_owned()));
        assert_eq!(reference.namespace, "team-a");
        assert_eq!(reference.extensions_path, FieldPath::default_extensions());
        let by_resource = widget_ref(
            json!({"kind": "", "resource": "widgets", "namespace": "team-b", "extensionsPath": "spec.links"}),
        );
        let reference = check(by_resource, None)
            .expect("valid")
            .reference
            .expect("a reference");
        assert_eq!(
            reference.served_as,
            ServedAs::Resource("widgets".to_owned())
        );
        assert_eq!(
            (
                reference.namespace.as_str(),
                reference.extensions_path.to_string().as_str()
            ),
            ("team-b", "spec.links")
        );
        let core = json!({"objectRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c"}});
        let reference = check(core, None)
            .expect("valid")
            .reference
            .expect("a reference");
        assert_eq!(reference.group_version(), ("", "v1"));
    }

    #[test]
    fn bad_references_are_refused_naming_the_field() {
        let object =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}});
        let cases = [
            (
                json!({}),
                "spec.object",
                "Required value: a Kubernetes object, or a reference to a stored one in spec.objectRef",
            ),
            (
                json!({"object": object, "objectRef": {"apiVersion": "v1", "kind": "K", "name": "n"}}),
                "spec.objectRef",
                "Forbidden: may not be set with spec.object",
            ),
            (
                json!({"objectRef": {"apiVersion": "v1", "kind": "K", "name": "n"}, "extensions": [object]}),
                "spec.extensions",
                "Forbidden: kplug reads the extensions",
            ),
            (
                widget_ref(json!({"apiVersion": ""})),
                "spec.objectRef.apiVersion",
                "Required value",
            ),
            (
                widget_ref(json!({"apiVersion": "a/b/c"})),
                "spec.objectRef.apiVersion",
                "must be GROUP/VERSION or VERSION",
            ),
            (
                widget_ref(json!({"apiVersion": "/v1"})),
                "spec.objectRef.apiVersion",
                "must be GROUP/VERSION or VERSION",
            ),
            (
                widget_ref(json!({"kind": ""})),
                "spec.objectRef.kind",
                "Required value: name the object's kind",
            ),
            (
                widget_ref(json!({"resource": "widgets"})),
                "spec.objectRef.resource",
                "Forbidden: may not be set with spec.objectRef.kind",
            ),
            (
                widget_ref(json!({"kind": "", "resource": "a/b"})),
                "spec.objectRef.resource",
                "may not contain '/'",
            ),
            (
                widget_ref(json!({"name": ""})),
                "spec.objectRef.name",
                "Required value",
            ),
            (
                widget_ref(json!({"name": ".."})),
                "spec.objectRef.name",
                "may not be '..'",
            ),
            (
                widget_ref(json!({"name": "a%2Fb"})),
                "spec.objectRef.name",
                "may not contain '%'",
            ),
            (
                widget_ref(json!({"namespace": "x/y"})),
                "spec.objectRef.namespace",
                "may not contain '/'",
            ),
            (
                widget_ref(json!({"extensionsPath": "spec..x"})),
                "spec.objectRef.extensionsPath",
                "empty step",
            ),
        ];
        for (spec, field, message) in cases {
            let (got_field, got_message) = refusal(spec.clone(), None);
            assert_eq!(got_field, field, "{spec}");
            assert!(got_message.contains(message), "{spec}: {got_message}");
        }
    }

    #[test]
    fn a_namespaced_reconcile_refers_to_its_own_namespace_only() {
        let (field, message) = refusal(widget_ref(json!({"namespace": "team-b"})), Some("team-a"));
        assert_eq!(field, "spec.objectRef.namespace");
        assert_eq!(
            message,
            "Invalid value: \"team-b\": must be \"team-a\", the namespace of the request"
        );
        assert!(check(widget_ref(json!({"namespace": "team-a"})), Some("team-a")).is_ok());
    }

    #[test]
    fn observed_children_are_objects_under_unique_keys() {
        let object =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}});
        let deployment =
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}});
        let observed = |children: Value| json!({"object": object, "observedChildren": children});
        let valid = observed(json!([{"key": "web", "object": deployment}]));
        assert!(check(valid, None).is_ok());
        for (children, field, message) in [
            (
                json!([{"key": "", "object": deployment}]),
                "spec.observedChildren[0].key",
                "Required value".to_owned(),
            ),
            (
                json!([{"key": "Web", "object": deployment}]),
                "spec.observedChildren[0].key",
                "Invalid value: \"Web\": a lowercase RFC 1123 label must consist of lower case \
                 alphanumeric characters or '-', and must start and end with an alphanumeric \
                 character (e.g. 'my-name', or '123-abc')"
                    .to_owned(),
            ),
            (
                json!([{"key": "web", "object": deployment}, {"key": "web", "object": deployment}]),
                "spec.observedChildren[1].key",
                "Duplicate value: \"web\"".to_owned(),
            ),
            (
                json!([{"key": "web", "object": {"apiVersion": "v1", "metadata": {"name": "a"}}}]),
                "spec.observedChildren[0].object.kind",
                "Required value".to_owned(),
            ),
            (
                json!([{"key": "web", "object": [1]}]),
                "spec.observedChildren[0].object",
                "Required value: a Kubernetes object".to_owned(),
            ),
            (
                Value::Array(
                    (0..=MAX_CHILDREN)
                        .map(|i| json!({"key": format!("c{i}"), "object": deployment}))
                        .collect(),
                ),
                "spec.observedChildren",
                format!(
                    "Too many: {}: must have at most {MAX_CHILDREN} items",
                    MAX_CHILDREN + 1
                ),
            ),
        ] {
            assert_eq!(
                refusal(observed(children), None),
                (field.to_owned(), message)
            );
        }
    }
}
