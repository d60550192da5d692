//! The audit log's line for a reconcile: what the request asked, and what
//! happened to it, filled in as the reconcile goes.

use std::borrow::Cow;
use std::time::Duration;

use axum::response::Response;
use kplug_proto::trace::TraceParent;

use super::decode::{Names, Request};
use crate::api::status::ApiError;
use crate::audit::{self, AuditLog};
use crate::auth::User;
use crate::v1alpha1::StoredObjectRef;

/// What the audit log says of a reconcile beyond its request, filled in
/// as the reconcile goes.
#[derive(Default)]
pub(super) struct Trail {
    pub operation_id: String,
    pub plugin: String,
    pub instance: String,
    /// The plugin's verdict, when it answered.
    pub success: Option<bool>,
}

impl Trail {
    /// Writes the reconcile's line to `log`.
    pub(super) fn record(
        &self,
        log: &AuditLog,
        user: &User,
        request: &Request<'_>,
        trace: TraceParent,
        result: &Result<Response, ApiError>,
        elapsed: Duration,
    ) {
        let names = match (&request.spec.object, &request.spec.object_ref) {
            (Some(object), _) => object.head.names(),
            (None, Some(reference)) => referenced(reference, request.metadata.namespace.as_deref()),
            (None, None) => Names::default(),
        };
        let (code, outcome, message) = match result {
            Ok(response) => (
                response.status().as_u16(),
                match self.success {
                    Some(true) => "Success",
                    _ => "Failure",
                },
                String::new(),
            ),
            // The message the caller got, in its Status.
            Err(error) => (
                error.code().as_u16(),
                error.reason(),
                error.to_status().message.unwrap_or_default(),
            ),
        };
        log.record(&audit::Event {
            timestamp: jiff::Timestamp::now().to_string(),
            operation_id: &self.operation_id,
            trace_id: trace.trace_id().to_string(),
            user: audit::UserRef {
                username: &user.name,
                groups: &user.groups,
            },
            operation: request.spec.operation.as_deref().unwrap_or("Reconcile"),
            dry_run: request.spec.dry_run,
            object_ref: audit::ObjectRef {
                api_version: &names.api_version,
                kind: &names.kind,
                namespace: &names.namespace,
                name: &names.name,
            },
            plugin: &self.plugin,
            instance: &self.instance,
            code,
            outcome,
            message: &message,
            duration_seconds: elapsed.as_secs_f64(),
        });
    }
}

/// The names of an object by reference, as far as the request says them:
/// in the request's namespace unless it names one.
fn referenced<'a>(reference: &'a StoredObjectRef, namespace: Option<&'a str>) -> Names<'a> {
    let kind = match reference.kind.as_str() {
        "" => &reference.resource,
        _ => &reference.kind,
    };
    Names {
        api_version: Cow::Borrowed(&reference.api_version),
        kind: Cow::Borrowed(kind),
        namespace: Cow::Borrowed(match reference.namespace.as_str() {
            "" => namespace.unwrap_or_default(),
            own => own,
        }),
        name: Cow::Borrowed(&reference.name),
    }
}
