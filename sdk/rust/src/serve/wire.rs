//! Between the wire and the author: protobuf requests into [`Request`]s
//! (rejecting what is not a JSON object), [`Outcome`]s into responses. Pure.

use kplug_proto::v1alpha1 as proto;
use serde_json::Value;
use tokio::time::Instant;

use crate::{Caller, Outcome, Request, Severity};

/// The wire request as the author sees it; bad JSON is the caller's error,
/// so the plugin is never called with it.
pub(super) fn decode(
    message: proto::ReconcileRequest,
    deadline: Option<Instant>,
) -> Result<Request, tonic::Status> {
    let object = json_object("object", &message.object)?;
    let extensions = message
        .extensions
        .iter()
        .enumerate()
        .map(|(i, bytes)| json_object(&format!("extensions[{i}]"), bytes))
        .collect::<Result<_, _>>()?;
    let observed_children = message
        .observed_children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let object = json_object(&format!("observedChildren[{i}].object"), &child.object)?;
            Ok((child.key, object))
        })
        .collect::<Result<_, tonic::Status>>()?;
    Ok(Request {
        operation_id: message.operation_id,
        trace_parent: None,
        dry_run: message.dry_run,
        object,
        extensions,
        deadline,
        caller: message.caller.map(|user| Caller {
            username: user.username,
            groups: user.groups,
            extra: user
                .extra
                .into_iter()
                .map(|(key, value)| (key, value.values))
                .collect(),
        }),
        observed_children,
    })
}

fn json_object(what: &str, bytes: &[u8]) -> Result<Value, tonic::Status> {
    if bytes.is_empty() {
        return Err(tonic::Status::invalid_argument(format!(
            "{what} is empty; expected a Kubernetes object as JSON"
        )));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        tonic::Status::invalid_argument(format!("{what} is not valid JSON: {error}"))
    })?;
    if !value.is_object() {
        return Err(tonic::Status::invalid_argument(format!(
            "{what} must be a JSON object, not {}",
            json_kind(&value)
        )));
    }
    Ok(value)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The author's outcome on the wire.
pub(super) fn encode(outcome: Outcome) -> Result<proto::ReconcileResponse, tonic::Status> {
    // Serializing a `Value` cannot fail (its keys are strings), but the
    // signature says it may, and a plugin must not panic over it.
    let json = |value: &Value| {
        serde_json::to_vec(value)
            .map_err(|error| tonic::Status::internal(format!("cannot encode a status: {error}")))
    };
    let extension_statuses = outcome
        .extension_statuses
        .iter()
        .map(|(reference, status)| {
            Ok(proto::ExtensionStatus {
                r#ref: Some(proto::ObjectReference {
                    api_version: reference.api_version.clone(),
                    kind: reference.kind.clone(),
                    namespace: reference.namespace.clone(),
                    name: reference.name.clone(),
                }),
                status: json(status)?,
            })
        })
        .collect::<Result<_, tonic::Status>>()?;
    let desired_children = outcome
        .children
        .iter()
        .map(|child| {
            Ok(proto::DesiredChild {
                key: child.key.clone(),
                object: json(&child.object)?,
                ready: match child.ready {
                    None => proto::Readiness::Unspecified,
                    Some(true) => proto::Readiness::Ready,
                    Some(false) => proto::Readiness::NotReady,
                }
                .into(),
                wave: child.wave,
            })
        })
        .collect::<Result<_, tonic::Status>>()?;
    Ok(proto::ReconcileResponse {
        success: outcome.success,
        results: outcome
            .results
            .into_iter()
            .map(|result| proto::Result {
                severity: match result.severity {
                    Severity::Normal => proto::Severity::Normal,
                    Severity::Warning => proto::Severity::Warning,
                    Severity::Error => proto::Severity::Error,
                }
                .into(),
                reason: result.reason,
                message: result.message,
            })
            .collect(),
        conditions: outcome
            .conditions
            .into_iter()
            .map(|condition| proto::Condition {
                r#type: condition.condition_type,
                status: condition.status.as_str().to_owned(),
                reason: condition.reason,
                message: condition.message,
            })
            .collect(),
        object_status: outcome
            .object_status
            .as_ref()
            .map(json)
            .transpose()?
            .unwrap_or_default(),
        extension_statuses,
        // Only durations beyond what protobuf can carry fail; asking for a
        // requeue that far away is asking for none.
        requeue_after: outcome
            .requeue_after
            .and_then(|after| prost_types::Duration::try_from(after).ok()),
        desired_children,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_a_json_object() {
        let bad = |object: &[u8]| {
            let message = proto::ReconcileRequest {
                object: object.to_vec().into(),
                ..Default::default()
            };
            let status = decode(message, None).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert!(bad(b"").contains("empty"));
        assert!(bad(b"{").contains("not valid JSON"));
        assert!(bad(b"[1]").contains("not an array"));
        assert!(bad(b"null").contains("not null"));

        let message = proto::ReconcileRequest {
            object: b"{}".to_vec().into(),
            extensions: vec![b"{}".to_vec().into(), b"7".to_vec().into()],
            ..Default::default()
        };
        let status = decode(message, None).unwrap_err();
        assert_eq!(
            status.message(),
            "extensions[1] must be a JSON object, not a number"
        );
    }

    #[test]
    fn children_cross_the_wire_both_ways() {
        let message = proto::ReconcileRequest {
            object: b"{}".to_vec().into(),
            observed_children: vec![proto::ObservedChild {
                key: "web".to_owned(),
                object: br#"{"kind":"Deployment","status":{"replicas":1}}"#.to_vec(),
            }],
            ..Default::default()
        };
        let request = decode(message, None).expect("a valid request");
        assert_eq!(
            request.observed_child("web"),
            Some(&serde_json::json!({"kind": "Deployment", "status": {"replicas": 1}}))
        );
        let bad = proto::ReconcileRequest {
            object: b"{}".to_vec().into(),
            observed_children: vec![proto::ObservedChild {
                key: "web".to_owned(),
                object: b"[]".to_vec(),
            }],
            ..Default::default()
        };
        assert_eq!(
            decode(bad, None).unwrap_err().message(),
            "observedChildren[0].object must be a JSON object, not an array"
        );
        let outcome = Outcome::success()
            .child(crate::Child::new(
                "site",
                serde_json::json!({"kind": "ConfigMap"}),
            ))
            .child(
                crate::Child::new("web", serde_json::json!({}))
                    .ready(true)
                    .wave(2),
            );
        let response = encode(outcome).expect("encodes");
        let sent: Vec<_> = response
            .desired_children
            .iter()
            .map(|c| (c.key.as_str(), c.object.as_slice(), c.ready, c.wave))
            .collect();
        assert_eq!(
            sent,
            [
                ("site", &br#"{"kind":"ConfigMap"}"#[..], 0, 0),
                ("web", &b"{}"[..], proto::Readiness::Ready as i32, 2),
            ]
        );
    }

    #[test]
    fn the_caller_reaches_the_author() {
        let message = |caller| proto::ReconcileRequest {
            object: b"{}".to_vec().into(),
            caller,
            ..Default::default()
        };
        let user = proto::UserInfo {
            username: "system:serviceaccount:team-a:operator".to_owned(),
            groups: vec!["system:authenticated".to_owned()],
            extra: [(
                "authentication.kubernetes.io/pod-name".to_owned(),
                proto::ExtraValue {
                    values: vec!["operator-0".to_owned()],
                },
            )]
            .into(),
        };
        let told = decode(message(Some(user)), None).expect("a valid request");
        let mut expected = Caller::new(
            "system:serviceaccount:team-a:operator",
            vec!["system:authenticated".to_owned()],
        );
        expected.extra.insert(
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec!["operator-0".to_owned()],
        );
        assert_eq!(told.caller, Some(expected));
        // From a kplug that predates the field.
        let untold = decode(message(None), None).expect("a valid request");
        assert_eq!(untold.caller, None);
    }
}
