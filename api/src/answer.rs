//! What kplug makes of a plugin's answer, before any of it reaches the
//! caller: the plugin's part of a Reconcile's status, checked. A plugin is
//! code kplug does not control, and what it answers is written by the
//! operator into objects that kube-apiserver stores in etcd. kplug's
//! reconciles and `kubectl kplug render` both read answers with [`checked`].
//!
//! A status must be a JSON object (the `status` of a Kubernetes object is
//! one), nested at most [`MAX_STATUS_DEPTH`] levels and at most
//! [`MAX_STATUS_BYTES`] long; an extension status must name an extension
//! the plugin was sent; a desired child must follow [`crate::children`]'s
//! rules. kplug answers the caller one `500 InternalError` naming the
//! plugin, the field (and the child), as kube-apiserver words a webhook's
//! invalid answer, and nothing of the answer.
//!
//! Results and conditions are not counted: a plugin may report one per
//! change it made (the PostgreSQL plugin, one per column), and refusing the
//! answer after the changes were made would lose them; the gRPC message
//! limit bounds their number.

use std::collections::HashSet;
use std::time::Duration;

use kplug_proto::v1alpha1 as proto;
use serde::{Deserialize, Serialize};

use crate::children::{self, ChildError, MAX_CHILD_BYTES, MAX_CHILDREN, Placement};
use crate::v1alpha1::{DesiredChild, ExtensionStatus, ObjectRef, ReconcileResult, ResultCondition};

/// etcd's default `--max-request-bytes` (1.5 MiB): the largest object
/// kube-apiserver can store. A status this long alone can never be
/// written, whatever the object it goes into.
pub const MAX_STATUS_BYTES: usize = 1536 << 10;

/// Deepest nesting of a status, counting the status itself as one level.
/// The answer nests a status two levels down (`status.objectStatus`), the
/// operator one level down in the object it writes; kube-rs clients and the
/// operator read JSON with serde_json, which refuses more than 128 levels.
/// 100 leaves room for those envelopes.
pub const MAX_STATUS_DEPTH: usize = 100;

/// What is wrong with a plugin's answer, worded like Kubernetes field errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAnswer {
    #[error("{field}: Required value")]
    Required { field: String },
    #[error("{field}: Invalid value: {error}: must be valid JSON")]
    NotJson { field: String, error: String },
    #[error("{field}: Invalid value: {found:?}: must be of type object")]
    NotAnObject { field: String, found: &'static str },
    #[error(
        "{field}: Invalid value: \"object\": must be nested at most {max} levels deep, found {depth}"
    )]
    TooDeep {
        field: String,
        depth: usize,
        max: usize,
    },
    #[error("{field}: Too long: must have at most {max} bytes, found {bytes}")]
    TooLong {
        field: String,
        bytes: usize,
        max: usize,
    },
    #[error("{field}: Invalid value: {reference:?}: names no extension the plugin was sent")]
    NotSent { field: String, reference: String },
    #[error("{field}: Too many: {found}: must have at most {max} items")]
    TooMany {
        field: String,
        found: usize,
        max: usize,
    },
    /// What is wrong with one desired child, named by its key.
    #[error("child {key:?}: {error}")]
    Child { key: String, error: Box<BadAnswer> },
    #[error(transparent)]
    ChildRule(#[from] ChildError),
}

/// A plugin's answer as kplug reports it: the fields of
/// [`ReconcileStatus`](crate::v1alpha1::ReconcileStatus) that come from the
/// plugin, in the same names.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginAnswer {
    pub success: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ReconcileResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ResultCondition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_status: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extension_statuses: Vec<ExtensionStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub desired_children: Vec<DesiredChild>,
}

/// Checks `answer` from a plugin that was sent the extensions `sent` (their
/// JSON, read only when the answer has extension statuses), for an object
/// whose children may be where `placement` says.
pub fn checked<'a>(
    answer: proto::ReconcileResponse,
    sent: impl IntoIterator<Item = &'a [u8]>,
    placement: Placement<'_>,
) -> Result<PluginAnswer, BadAnswer> {
    let object_status = status("status.objectStatus", &answer.object_status)?;
    let desired_children = desired_children(answer.desired_children, placement)?;
    // Read only when needed: most answers carry no extension status.
    let sent = match answer.extension_statuses.is_empty() {
        true => SentExtensions(Vec::new()),
        false => SentExtensions::read(sent),
    };
    let extension_statuses = answer
        .extension_statuses
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let reference = e.r#ref.unwrap_or_default();
            let field = format!("status.extensionStatuses[{i}]");
            sent.check(&format!("{field}.ref"), &reference)?;
            let field = format!("{field}.status");
            let status = status(&field, &e.status)?.ok_or(BadAnswer::Required { field })?;
            Ok(ExtensionStatus {
                reference: ObjectRef {
                    api_version: reference.api_version,
                    kind: reference.kind,
                    namespace: reference.namespace,
                    name: reference.name,
                },
                status,
            })
        })
        .collect::<Result<_, BadAnswer>>()?;
    Ok(PluginAnswer {
        success: answer.success,
        results: answer
            .results
            .into_iter()
            .map(|r| ReconcileResult {
                severity: proto::severity_name(r.severity).to_owned(),
                reason: r.reason,
                message: r.message,
            })
            .collect(),
        conditions: answer
            .conditions
            .into_iter()
            .map(|c| ResultCondition {
                type_: c.r#type,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect(),
        object_status,
        extension_statuses,
        requeue_after_seconds: answer
            .requeue_after
            .and_then(|d| Duration::try_from(d).ok())
            .map(|d| d.as_secs_f64()),
        desired_children,
    })
}

/// The desired children, each checked; the first bad one refuses them all.
fn desired_children(
    children: Vec<proto::DesiredChild>,
    placement: Placement<'_>,
) -> Result<Vec<DesiredChild>, BadAnswer> {
    if children.len() > MAX_CHILDREN {
        return Err(BadAnswer::TooMany {
            field: "status.desiredChildren".to_owned(),
            found: children.len(),
            max: MAX_CHILDREN,
        });
    }
    let mut keys = HashSet::with_capacity(children.len());
    children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let field = format!("status.desiredChildren[{i}]");
            let named = |error: BadAnswer| BadAnswer::Child {
                key: child.key.clone(),
                error: Box::new(error),
            };
            children::key(&format!("{field}.key"), &child.key, &mut keys)
                .map_err(|e| named(e.into()))?;
            let field = format!("{field}.object");
            let object = json_object(&field, &child.object, MAX_CHILD_BYTES)
                .and_then(|o| {
                    o.ok_or(BadAnswer::Required {
                        field: field.clone(),
                    })
                })
                .map_err(named)?;
            children::desired(&field, &object, placement).map_err(|e| named(e.into()))?;
            Ok(DesiredChild {
                ready: match proto::Readiness::try_from(child.ready) {
                    Ok(proto::Readiness::Ready) => Some(true),
                    Ok(proto::Readiness::NotReady) => Some(false),
                    _ => None,
                },
                wave: child.wave,
                key: child.key,
                object,
            })
        })
        .collect()
}

/// The status at `field` (protobuf bytes of JSON), checked; `None` when the
/// plugin sent none (no bytes).
fn status(field: &str, bytes: &[u8]) -> Result<Option<serde_json::Value>, BadAnswer> {
    json_object(field, bytes, MAX_STATUS_BYTES)
}

/// The JSON object at `field`, at most `max` bytes long and
/// [`MAX_STATUS_DEPTH`] deep; `None` for no bytes.
fn json_object(
    field: &str,
    bytes: &[u8],
    max: usize,
) -> Result<Option<serde_json::Value>, BadAnswer> {
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() > max {
        return Err(BadAnswer::TooLong {
            field: field.to_owned(),
            bytes: bytes.len(),
            max,
        });
    }
    // Measured before parsing, so that serde_json's own recursion limit is
    // never the message the caller reads.
    let depth = depth(bytes);
    if depth > MAX_STATUS_DEPTH {
        return Err(BadAnswer::TooDeep {
            field: field.to_owned(),
            depth,
            max: MAX_STATUS_DEPTH,
        });
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| BadAnswer::NotJson {
            field: field.to_owned(),
            error: e.to_string(),
        })?;
    if !value.is_object() {
        return Err(BadAnswer::NotAnObject {
            field: field.to_owned(),
            found: type_name(&value),
        });
    }
    Ok(Some(value))
}

fn type_name(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// The deepest nesting of arrays and objects in `bytes`, outside strings:
/// one linear pass, whatever the depth (no recursion to overflow).
fn depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in bytes {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The identity of an object the plugin was sent: what its extension
/// statuses must name.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sent {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: SentMeta,
}

#[derive(Debug, Default, Deserialize)]
struct SentMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// The extensions a request sent, as the references a status may name.
struct SentExtensions(Vec<Sent>);

impl SentExtensions {
    /// Reads the identities of `extensions` (only called when the answer
    /// has extension statuses). Each was decoded before it was sent, so it
    /// reads; one that does not is matched by nothing.
    fn read<'a>(extensions: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self(
            extensions
                .into_iter()
                .map(|raw| serde_json::from_slice(raw).unwrap_or_default())
                .collect(),
        )
    }

    /// Whether `reference` names one of them. An empty namespace in the
    /// reference names the extension in whatever namespace it was sent
    /// (the operator reads it as the parent object's).
    fn check(&self, field: &str, reference: &proto::ObjectReference) -> Result<(), BadAnswer> {
        let named = self.0.iter().any(|sent| {
            !sent.metadata.name.is_empty()
                && sent.api_version == reference.api_version
                && sent.kind == reference.kind
                && sent.metadata.name == reference.name
                && (reference.namespace.is_empty()
                    || sent.metadata.namespace.as_deref() == Some(reference.namespace.as_str()))
        });
        if named {
            return Ok(());
        }
        let place = match reference.namespace.as_str() {
            "" => reference.name.clone(),
            namespace => format!("{namespace}/{}", reference.name),
        };
        Err(BadAnswer::NotSent {
            field: field.to_owned(),
            reference: format!("{} {} {place}", reference.api_version, reference.kind),
        })
    }
}

#[cfg(test)]
mod tests {
    use kplug_proto::v1alpha1::ObjectReference;

    use super::*;

    fn nested(levels: usize) -> Vec<u8> {
        let mut bytes = "{\"a\":".repeat(levels - 1).into_bytes();
        bytes.extend_from_slice(b"{}");
        bytes.extend(std::iter::repeat_n(b'}', levels - 1));
        bytes
    }

    #[test]
    fn a_status_is_an_object_of_bounded_depth_and_length() {
        assert_eq!(status("objectStatus", b""), Ok(None));
        assert!(status("objectStatus", br#"{"a":[{"b":"}}]]\""}]}"#).is_ok_and(|s| s.is_some()));
        assert!(status("s", &nested(MAX_STATUS_DEPTH)).is_ok());
        assert_eq!(
            status("s", &nested(MAX_STATUS_DEPTH + 1)).map_err(|e| e.to_string()),
            Err(format!(
                "s: Invalid value: \"object\": must be nested at most {MAX_STATUS_DEPTH} levels deep, found {}",
                MAX_STATUS_DEPTH + 1
            ))
        );
        // Far deeper than serde_json reads: still this message, no overflow.
        let deep = status("s", &nested(100_000)).expect_err("too deep");
        assert!(
            matches!(deep, BadAnswer::TooDeep { depth: 100_000, .. }),
            "{deep}"
        );
        for (bytes, found) in [
            (&b"null"[..], "null"),
            (b"\"ok\"", "string"),
            (b"[1]", "array"),
            (b"7", "number"),
            (b"true", "boolean"),
        ] {
            assert_eq!(
                status("extensionStatuses[0].status", bytes).map_err(|e| e.to_string()),
                Err(format!(
                    "extensionStatuses[0].status: Invalid value: {found:?}: must be of type object"
                ))
            );
        }
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_STATUS_BYTES));
        assert_eq!(
            status("objectStatus", long.as_bytes()),
            Err(BadAnswer::TooLong {
                field: "objectStatus".to_owned(),
                bytes: long.len(),
                max: MAX_STATUS_BYTES
            })
        );
        let broken = status("objectStatus", b"{\"a\":").expect_err("not JSON");
        assert!(matches!(broken, BadAnswer::NotJson { .. }), "{broken}");
    }

    #[test]
    fn an_extension_status_must_name_an_extension_sent() {
        let raw = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns"},"spec":{}}"#;
        let sent = SentExtensions::read([&raw[..]]);
        let reference = |namespace: &str, name: &str| ObjectReference {
            api_version: "example.com/v1".to_owned(),
            kind: "Widget".to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        assert!(sent.check("f", &reference("ns", "w")).is_ok());
        assert!(sent.check("f", &reference("", "w")).is_ok());
        assert_eq!(
            sent.check("extensionStatuses[1].ref", &reference("other", "w"))
                .map_err(|e| e.to_string()),
            Err("extensionStatuses[1].ref: Invalid value: \"example.com/v1 Widget other/w\": names no extension the plugin was sent".to_owned())
        );
        assert!(sent.check("f", &reference("ns", "x")).is_err());
        let nothing = SentExtensions::read([]);
        assert!(nothing.check("f", &reference("", "w")).is_err());
    }

    #[test]
    fn an_answer_gives_its_statuses_checked_and_an_extension_status_is_required() {
        let raw = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}"#;
        let sent = [&raw[..]];
        let reported = |status: &[u8]| proto::ExtensionStatus {
            r#ref: Some(ObjectReference {
                api_version: "example.com/v1".to_owned(),
                kind: "Widget".to_owned(),
                namespace: String::new(),
                name: "w".to_owned(),
            }),
            status: status.to_vec(),
        };
        let ok = proto::ReconcileResponse {
            object_status: br#"{"a":1}"#.to_vec(),
            extension_statuses: vec![reported(br#"{"b":2}"#)],
            ..proto::ReconcileResponse::default()
        };
        let checked_ok = checked(ok, sent, Placement::default()).expect("a valid answer");
        assert_eq!(checked_ok.object_status, Some(serde_json::json!({"a": 1})));
        assert_eq!(
            checked_ok.extension_statuses[0].status,
            serde_json::json!({"b": 2})
        );
        assert_eq!(checked_ok.extension_statuses[0].reference.name, "w");
        let empty = proto::ReconcileResponse {
            extension_statuses: vec![reported(b"")],
            ..proto::ReconcileResponse::default()
        };
        assert_eq!(
            checked(empty, sent, Placement::default())
                .map(|s| s.object_status)
                .map_err(|e| e.to_string()),
            Err("status.extensionStatuses[0].status: Required value".to_owned())
        );
    }

    #[test]
    fn results_conditions_and_requeue_read_as_kplug_reports_them() {
        let answer = proto::ReconcileResponse {
            success: false,
            results: vec![proto::Result {
                severity: proto::Severity::Error as i32,
                reason: "UnknownColumnType".to_owned(),
                message: "column id: blob9".to_owned(),
            }],
            conditions: vec![proto::Condition {
                r#type: "Synced".to_owned(),
                status: "False".to_owned(),
                reason: "UnknownColumnType".to_owned(),
                message: String::new(),
            }],
            requeue_after: Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            ..proto::ReconcileResponse::default()
        };
        let read = checked(answer, [], Placement::default()).expect("a valid answer");
        assert_eq!(
            serde_json::to_value(&read).expect("serializes"),
            serde_json::json!({
                "success": false,
                "results": [{"severity": "Error", "reason": "UnknownColumnType", "message": "column id: blob9"}],
                "conditions": [{"type": "Synced", "status": "False", "reason": "UnknownColumnType"}],
                "requeueAfterSeconds": 1.5,
            })
        );
    }

    fn child(key: &str, object: &str) -> proto::DesiredChild {
        proto::DesiredChild {
            key: key.to_owned(),
            object: object.as_bytes().to_vec(),
            ..proto::DesiredChild::default()
        }
    }

    fn with_children(children: Vec<proto::DesiredChild>) -> Result<PluginAnswer, String> {
        let answer = proto::ReconcileResponse {
            desired_children: children,
            ..proto::ReconcileResponse::default()
        };
        let placement = Placement {
            namespace: "shop",
            scope: crate::v1alpha1::ChildScope::Namespace,
        };
        checked(answer, [], placement).map_err(|e| e.to_string())
    }

    #[test]
    fn desired_children_read_with_their_verdict_and_wave() {
        let site =
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"site"},"data":{"a":"1"}}"#;
        let web = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"shop"}}"#;
        let children = vec![
            child("site", site),
            proto::DesiredChild {
                ready: proto::Readiness::NotReady as i32,
                wave: 1,
                ..child("web", web)
            },
            proto::DesiredChild {
                ready: proto::Readiness::Ready as i32,
                wave: -1,
                ..child("early", site)
            },
        ];
        let read = with_children(children).expect("valid children");
        assert_eq!(
            serde_json::to_value(&read.desired_children).expect("serializes"),
            serde_json::json!([
                {"key": "site", "object": serde_json::from_str::<serde_json::Value>(site).expect("JSON")},
                {"key": "web", "object": serde_json::from_str::<serde_json::Value>(web).expect("JSON"),
                 "ready": false, "wave": 1},
                {"key": "early", "object": serde_json::from_str::<serde_json::Value>(site).expect("JSON"),
                 "ready": true, "wave": -1},
            ])
        );
        assert!(with_children(Vec::new()).is_ok_and(|a| a.desired_children.is_empty()));
    }

    #[test]
    fn a_bad_child_refuses_the_answer_naming_the_child() {
        let good = child(
            "site",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"site"}}"#,
        );
        let huge = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big"}},"data":{{"a":"{}"}}}}"#,
            "x".repeat(2 << 20)
        );
        for (bad, message) in [
            (
                child(
                    "web",
                    r#"{"apiVersion":"apps/v1","metadata":{"name":"web"}}"#,
                ),
                "child \"web\": status.desiredChildren[1].object.kind: Required value".to_owned(),
            ),
            (
                child("big", &huge),
                format!(
                    "child \"big\": status.desiredChildren[1].object: Too long: must have at \
                     most {MAX_CHILD_BYTES} bytes, found {}",
                    huge.len()
                ),
            ),
            (
                child(
                    "owned",
                    r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","ownerReferences":[{"name":"x"}]}}"#,
                ),
                "child \"owned\": status.desiredChildren[1].object.metadata.ownerReferences: \
                 Forbidden: a plugin may not set it: the operator ties the child to its object"
                    .to_owned(),
            ),
            (
                child(
                    "away",
                    r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"kube-system"}}"#,
                ),
                "child \"away\": status.desiredChildren[1].object.metadata.namespace: Forbidden: \
                 must be the object's namespace \"shop\" (or unset): the operator does not allow \
                 children in other namespaces (childScope Cluster)"
                    .to_owned(),
            ),
            (
                child(
                    "site",
                    r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}"#,
                ),
                "child \"site\": status.desiredChildren[1].key: Duplicate value: \"site\""
                    .to_owned(),
            ),
            (
                child("list", "[1]"),
                "child \"list\": status.desiredChildren[1].object: Invalid value: \"array\": must \
                 be of type object"
                    .to_owned(),
            ),
            (
                child("empty", ""),
                "child \"empty\": status.desiredChildren[1].object: Required value".to_owned(),
            ),
        ] {
            assert_eq!(
                with_children(vec![good.clone(), bad]).map(|_| ()),
                Err(message)
            );
        }
        let many = vec![good; MAX_CHILDREN + 1];
        assert_eq!(
            with_children(many).map(|_| ()),
            Err(format!(
                "status.desiredChildren: Too many: {}: must have at most {MAX_CHILDREN} items",
                MAX_CHILDREN + 1
            ))
        );
    }
}
