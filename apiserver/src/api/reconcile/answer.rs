//! The `201` answer: the request with `status` filled in from the plugin's
//! reply, written once into one buffer. The object and extensions are
//! copied from the request body as they were sent; the rest is written by
//! serde_json field by field, in the order and form that serializing
//! `kplug_api::v1alpha1::Reconcile` gives (a test holds the two equal).

use std::time::Duration;

use kplug_api::answer;
use kplug_api::children::Placement;
use serde::Serialize;

use super::decode::{Request, Spec, Text};
use crate::api::status::ApiError;
use crate::proxy::Answered;
use crate::v1alpha1::{API_VERSION, Plugin, PluginRef, Reconcile, ReconcileStatus, Selection};

/// Room for everything but the object and extensions: the envelope and a
/// typical status, so that the buffer is allocated once.
const ANSWER_OVERHEAD: usize = 1024;

/// The status from the plugin's reply to a request for `spec`; an answer
/// [`answer::checked`] refuses is the caller's `500`, naming the plugin.
pub fn status(
    plugin: &Plugin,
    selection: Selection,
    operation_id: String,
    elapsed: Duration,
    answered: Answered,
    spec: &Spec<'_>,
) -> Result<ReconcileStatus, ApiError> {
    let Answered {
        response,
        instance,
        version,
    } = answered;
    let name = plugin.name();
    let namespace = (spec.object.as_ref())
        .and_then(|object| object.head.namespace)
        .map(Text::value)
        .unwrap_or_default();
    let placement = Placement {
        namespace: &namespace,
        scope: spec.child_scope.unwrap_or_default(),
    };
    let sent = spec.extensions.iter().map(|e| e.raw);
    let answer = answer::checked(response, sent, placement).map_err(|error| {
        tracing::warn!(plugin = name, %error, "the plugin's answer is refused");
        ApiError::Internal(format!("plugin {name} returned an invalid answer: {error}"))
    })?;
    Ok(ReconcileStatus {
        plugin: PluginRef {
            name: name.to_owned(),
            version,
            implementation: plugin.spec.implementation.clone(),
            instance,
            capabilities: plugin.spec.protocol.capabilities.clone(),
        },
        selection,
        success: answer.success,
        results: answer.results,
        conditions: answer.conditions,
        object_status: answer.object_status,
        extension_statuses: answer.extension_statuses,
        requeue_after_seconds: answer.requeue_after_seconds,
        desired_children: answer.desired_children,
        operation_id,
        duration_milliseconds: elapsed.as_secs_f64() * 1000.0,
    })
}

/// Writes the fields of one JSON object, with commas between them.
struct Fields<'w> {
    out: &'w mut Vec<u8>,
    first: bool,
}

impl<'w> Fields<'w> {
    fn open(out: &'w mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// `name` is one of this file's literals, which need no escaping.
    fn name(&mut self, name: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn value(&mut self, name: &str, value: &impl Serialize) -> Result<(), serde_json::Error> {
        self.name(name);
        serde_json::to_writer(&mut *self.out, value)
    }

    fn optional(
        &mut self,
        name: &str,
        value: Option<&impl Serialize>,
    ) -> Result<(), serde_json::Error> {
        match value {
            Some(value) => self.value(name, value),
            None => Ok(()),
        }
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// The answer's body: `request` as received, with `status`.
pub fn body(request: &Request<'_>, status: &ReconcileStatus) -> Result<Vec<u8>, serde_json::Error> {
    let spec = &request.spec;
    let objects = spec.object.iter().chain(&spec.extensions);
    let mut out =
        Vec::with_capacity(ANSWER_OVERHEAD + objects.map(|o| o.raw.len() + 1).sum::<usize>());
    let mut fields = Fields::open(&mut out);
    fields.value("apiVersion", &API_VERSION)?;
    fields.value("kind", &Reconcile::KIND)?;
    fields.value("metadata", &request.metadata)?;
    fields.name("spec");
    {
        let mut inner = Fields::open(&mut *fields.out);
        inner.optional("operation", spec.operation.as_ref())?;
        inner.value("dryRun", &spec.dry_run)?;
        inner.optional("timeoutSeconds", spec.timeout_seconds.as_ref())?;
        if let Some(object) = &spec.object {
            inner.name("object");
            inner.out.extend_from_slice(object.raw);
        }
        inner.optional("objectRef", spec.object_ref.as_ref())?;
        if !spec.extensions.is_empty() {
            inner.name("extensions");
            inner.out.push(b'[');
            for (i, extension) in spec.extensions.iter().enumerate() {
                if i > 0 {
                    inner.out.push(b',');
                }
                inner.out.extend_from_slice(extension.raw);
            }
            inner.out.push(b']');
        }
        inner.optional("api", spec.api.as_ref())?;
        inner.optional(
            "preferredImplementation",
            spec.preferred_implementation.as_ref(),
        )?;
        inner.optional(
            "requiredImplementation",
            spec.required_implementation.as_ref(),
        )?;
        inner.optional("versionConstraint", spec.version_constraint.as_ref())?;
        inner.optional("plugin", spec.plugin.as_ref())?;
        if !spec.observed_children.is_empty() {
            inner.value("observedChildren", &spec.observed_children)?;
        }
        inner.optional("childScope", spec.child_scope.as_ref())?;
        inner.close();
    }
    fields.value("status", status)?;
    fields.close();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::decode;
    use super::*;
    use crate::v1alpha1::{ReconcileResult, SelectionReason};

    fn sample_status() -> ReconcileStatus {
        ReconcileStatus {
            plugin: PluginRef {
                name: "hello".to_owned(),
                version: "1.0.0".to_owned(),
                implementation: "Hello \"quoted\"".to_owned(),
                instance: "hello-7d4b9-x2p4q".to_owned(),
                capabilities: Vec::new(),
            },
            selection: Selection {
                reason: SelectionReason::Fallback,
                message: "no preference".to_owned(),
            },
            success: true,
            results: vec![ReconcileResult {
                severity: "Normal".to_owned(),
                reason: "Greeted".to_owned(),
                message: "hello, w\u{f6}rld\n".to_owned(),
            }],
            object_status: Some(serde_json::json!({"b": 1, "a": [null, 2.5]})),
            requeue_after_seconds: Some(1.5),
            desired_children: vec![kplug_api::v1alpha1::DesiredChild {
                key: "web".to_owned(),
                object: serde_json::json!({"apiVersion": "v1", "kind": "Service"}),
                ready: Some(false),
                wave: 2,
            }],
            operation_id: "0b0e2f3c-1a2b-4c5d-8e9f-a0b1c2d3e4f5".to_owned(),
            duration_milliseconds: 1.25,
            ..ReconcileStatus::default()
        }
    }

    /// What kplug answered before: the request decoded into `Reconcile`,
    /// with the status set, serialized by serde_json.
    fn serde_answer(body: &str, status: &ReconcileStatus) -> String {
        let mut reconcile: Reconcile = serde_json::from_str(body).expect("serde decodes it");
        reconcile.status = Some(status.clone());
        reconcile.api_version = API_VERSION.to_owned();
        reconcile.kind = Reconcile::KIND.to_owned();
        serde_json::to_string(&reconcile).expect("serializes")
    }

    #[test]
    fn the_answer_is_what_serializing_a_reconcile_gave() {
        let bodies = [
            r#"{"spec":{"object":{"apiVersion":"v1","kind":"X","metadata":{"name":"a"}}}}"#,
            r#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Reconcile",
                "metadata":{"name":"r","labels":{"a":"b"},"annotations":{"x":"y\u00e9"}},
                "spec":{"operation":"Finalize","dryRun":true,"timeoutSeconds":7,
                  "object": { "apiVersion" : "v1", "kind":"X","metadata":{"name":"a"},
                    "spec":{"n":123456789012345678901234567890.000000000000000000001,"s":"\u00e9\n"}} ,
                  "extensions":[{"apiVersion":"v1","kind":"E","metadata":{"name":"e"}}, {"b":[1, 2]}],
                  "api":{"group":"g","resource":"r"},"preferredImplementation":"P",
                  "requiredImplementation":"Q\"","plugin":"p",
                  "observedChildren":[{"key":"web","object":{"kind":"Deployment", "n":1.50}}],
                  "childScope":"Cluster"},
                "status":null,"colour":"blue"}"#,
            r#"{"spec":{"object":null,"extensions":[],"api":{"group":"g","resource":"r","version":"v2"}}}"#,
            r#"{"spec":{}}"#,
        ];
        let status = sample_status();
        for body in bodies {
            let request = decode::request(body.as_bytes()).expect("decodes");
            let ours = body_text(&request, &status);
            assert_eq!(ours, serde_answer(body, &status), "{body}");
        }
    }

    fn body_text(request: &Request<'_>, status: &ReconcileStatus) -> String {
        String::from_utf8(super::body(request, status).expect("writes")).expect("UTF-8")
    }
}
