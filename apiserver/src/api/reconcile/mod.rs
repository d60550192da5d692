//! Delegation: `plugins/{name}/reconcile` and `reconciles`, which forward a
//! Reconcile to a plugin over gRPC and answer with its outcome.
//!
//! The body is read once ([`decode`], over [`scan`]): the object and its
//! extensions travel to the plugin and back into the answer ([`answer`]) as
//! slices of the request's buffer.

mod access;
mod answer;
mod by_reference;
mod canary;
mod decode;
#[cfg(any(test, feature = "fuzzing"))]
pub mod differential;
mod scan;
mod shadow;
mod trail;
mod validate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1 as proto;
use serde::Deserialize;
use tracing::Instrument;

use super::AppState;
use super::status::ApiError;
use super::timing::{Authenticated, Stages};
use crate::auth::User;
use crate::proxy::ProxyError;
use crate::registry::{Implementation, SelectError};
use crate::v1alpha1::{Operation, Plugin};
pub use access::ObjectAccess;
use decode::{Object, Request};
pub use kplug_api::answer::{MAX_STATUS_BYTES, MAX_STATUS_DEPTH};
pub use shadow::ShadowRunner;
use trail::Trail;
use validate::{Asked, validate};

/// What the request's path names besides the resource: the plugin of
/// `plugins/{name}/reconcile`, the namespace of
/// `namespaces/{namespace}/reconciles`.
#[derive(Clone, Copy, Debug, Default)]
struct Addressed<'a> {
    plugin: Option<&'a str>,
    namespace: Option<&'a str>,
}

/// Query parameters of a create.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateQuery {
    dry_run: Option<String>,
    field_validation: Option<String>,
}

/// What to do with fields this server does not know (`?fieldValidation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Limits of reconcile requests.
#[derive(Clone, Debug)]
pub struct ReconcileSettings {
    /// Used when a request sets no `spec.timeoutSeconds`.
    pub default_timeout: Duration,
    /// The largest `spec.timeoutSeconds` accepted.
    pub max_timeout: Duration,
    /// Larger bodies get `413`.
    pub max_body_bytes: usize,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(300),
            max_body_bytes: 3 << 20,
        }
    }
}

/// W3C Server Timing ([`super::timing`]); not among `http`'s names.
const SERVER_TIMING: header::HeaderName = header::HeaderName::from_static("server-timing");

/// Retry-After for a plugin that is not Ready or unreachable: about one
/// heartbeat interval, when a new registration may have arrived.
const RETRY_AFTER_SECONDS: u32 = 1;

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    let message = message.into();
    ApiError::Invalid {
        name: String::new(),
        message: format!("Reconcile.plugins.kplug.io is invalid: {field}: {message}"),
        causes: vec![(field.to_owned(), message)],
    }
}

/// A request body accepted for decoding, and what the query asks of it.
struct Received {
    body: Bytes,
    validation: FieldValidation,
    dry_run: Option<String>,
}

/// Checks what comes before the body's contents: the query, the body's
/// size and its media type.
fn receive(
    headers: &HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<Received, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::RequestEntityTooLarge(max_body_bytes),
        _ => ApiError::BadRequest(e.body_text()),
    })?;
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        let essence = content_type
            .to_str()
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        if essence != "application/json" {
            return Err(ApiError::UnsupportedMediaType(
                "application/json".to_owned(),
            ));
        }
    }
    let validation = match query.field_validation.as_deref() {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Warn\", \"Strict\""
            )));
        }
    };
    Ok(Received {
        body,
        validation,
        dry_run: query.dry_run,
    })
}

impl Received {
    /// Decodes the body (one pass); returns the request and its warnings.
    fn decode(&self) -> Result<(Request<'_>, Vec<String>), ApiError> {
        let mut request = decode::request(&self.body)
            .map_err(|e| ApiError::BadRequest(format!("decoding the Reconcile: {e}")))?;
        let unknown = std::mem::take(&mut request.unknown);
        let warnings = match self.validation {
            FieldValidation::Strict if !unknown.is_empty() => {
                return Err(ApiError::BadRequest(format!(
                    "strict decoding error: {}",
                    unknown
                        .iter()
                        .map(|f| format!("unknown field {f:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            FieldValidation::Warn => unknown
                .iter()
                .map(|f| format!("unknown field {f:?}"))
                .collect(),
            _ => Vec::new(),
        };
        match self.dry_run.as_deref() {
            None | Some("") => {}
            Some("All") => request.spec.dry_run = true,
            Some(other) => {
                return Err(ApiError::BadRequest(format!(
                    "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                )));
            }
        }
        Ok((request, warnings))
    }
}

fn select_error(error: SelectError) -> ApiError {
    match error {
        SelectError::NotFound(name) => ApiError::plugin_not_found(&name),
        SelectError::WrongApi { .. } => invalid("spec.api", error.to_string()),
        SelectError::NotReady { .. }
        | SelectError::NoneReady(_)
        | SelectError::NoneReadyOfImplementation { .. }
        | SelectError::NoVersionInRange { .. } => ApiError::ServiceUnavailable {
            message: error.to_string(),
            retry_after: RETRY_AFTER_SECONDS,
        },
    }
}

fn proxy_error(error: ProxyError) -> ApiError {
    let message = error.to_string();
    match error {
        ProxyError::Busy { .. } => ApiError::TooManyRequests {
            message,
            retry_after: RETRY_AFTER_SECONDS,
        },
        // A TLS failure is often a rotation in progress on one side: retry.
        ProxyError::Unavailable { .. }
        | ProxyError::NoneReady { .. }
        | ProxyError::NotGrpc { .. }
        | ProxyError::Tls { .. } => ApiError::ServiceUnavailable {
            message,
            retry_after: RETRY_AFTER_SECONDS,
        },
        ProxyError::DeadlineExceeded { .. } => ApiError::Timeout(message),
        ProxyError::Rejected { .. } => invalid("spec.object", message),
        ProxyError::Unimplemented { .. } => ApiError::BadRequest(message),
        ProxyError::Failed { .. }
        | ProxyError::AnswerTooLarge { .. }
        | ProxyError::InvalidAddress { .. } => ApiError::Internal(message),
    }
}

fn check_capability(plugin: &Plugin, operation: Operation, dry_run: bool) -> Result<(), ApiError> {
    let capabilities = &plugin.spec.protocol.capabilities;
    // A plugin that declares no capabilities is assumed to handle everything.
    if capabilities.is_empty() {
        return Ok(());
    }
    let needed = [Some(operation.as_str()), dry_run.then_some("DryRun")];
    for capability in needed.into_iter().flatten() {
        if !capabilities.iter().any(|c| c == capability) {
            return Err(ApiError::BadRequest(format!(
                "plugin {} does not support {capability} (it declares: {})",
                plugin.name(),
                capabilities.join(", ")
            )));
        }
    }
    Ok(())
}

/// The caller as the plugin sees it: admission's `userInfo`.
fn user_info(user: &User) -> proto::UserInfo {
    proto::UserInfo {
        username: user.name.clone(),
        groups: user.groups.clone(),
        extra: user
            .extra
            .iter()
            .map(|(key, values)| {
                let values = values.clone();
                (key.clone(), proto::ExtraValue { values })
            })
            .collect(),
    }
}

/// The caller's trace context; a malformed one is ignored, as the W3C
/// specification asks, and a new trace starts.
fn trace_parent(headers: &HeaderMap) -> Option<TraceParent> {
    let value = headers.get(TRACEPARENT)?.to_str().ok()?;
    value
        .parse()
        .inspect_err(|error| tracing::debug!(%error, value, "ignoring the traceparent header"))
        .ok()
}

/// [`reconcile`], recorded in the audit log whatever its outcome.
#[allow(clippy::too_many_arguments)]
async fn delegate(
    state: &AppState,
    user: &User,
    body: &Bytes,
    request: Request<'_>,
    warnings: Vec<String>,
    addressed: Addressed<'_>,
    trace: Option<TraceParent>,
    stages: &mut Stages,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    // Continue the caller's trace, or start one here; the plugin sees
    // kplug's own span as its parent.
    let trace = trace.unwrap_or_else(TraceParent::new_root).child();
    let mut trail = Trail::default();
    let result = reconcile(
        state, user, body, &request, warnings, addressed, trace, &mut trail, stages,
    )
    .await;
    if let Some(log) = &state.audit {
        trail.record(log, user, &request, trace, &result, started.elapsed());
    }
    result
}

/// Selects the plugin, calls it and renders the `201` answer, with the
/// `Server-Timing` of its `stages`. `body` is the buffer `request` was
/// decoded from: the object and extensions go to the plugin as slices of
/// it, without a copy.
#[allow(clippy::too_many_arguments)]
async fn reconcile(
    state: &AppState,
    user: &User,
    body: &Bytes,
    request: &Request<'_>,
    warnings: Vec<String>,
    addressed: Addressed<'_>,
    trace: TraceParent,
    trail: &mut Trail,
    stages: &mut Stages,
) -> Result<Response, ApiError> {
    let Asked {
        operation,
        timeout,
        versions,
        reference,
    } = validate(request, &state.reconcile, addressed.namespace)?;
    let spec = &request.spec;
    let (plugin, selection) = state
        .registry
        .select(
            spec.api.as_ref(),
            Implementation::from_spec(
                spec.required_implementation.as_deref(),
                spec.preferred_implementation.as_deref(),
            ),
            addressed.plugin.or(spec.plugin.as_deref()),
            versions.as_ref(),
        )
        .map_err(select_error)?;
    stages.end("select");
    trail.plugin = plugin.name().to_owned();
    let read;
    let resolved;
    let (body, request) = match &reference {
        None => (body, request),
        Some(reference) => {
            let (Some(access), Some(stored)) = (&state.object_access, &state.stored) else {
                return Err(invalid(
                    "spec.objectRef",
                    "Forbidden: kplug runs standalone, with no cluster to read the object from: \
                     send it in spec.object",
                ));
            };
            let reading = by_reference::read(access, stored, user, reference);
            read = tokio::time::timeout(timeout, reading).await.map_err(|_| {
                ApiError::Timeout(format!(
                    "reading {:?} and its extensions took longer than the reconcile's \
                         timeout ({timeout:?})",
                    reference.name
                ))
            })??;
            let (object, extensions) = read.objects()?;
            resolved = request.with_objects(object, extensions);
            stages.end("objectRef");
            (&read.buffer, &resolved)
        }
    };
    let spec = &request.spec;
    // Nothing reaches a plugin, shadows included, for a caller who may not
    // act on the objects themselves.
    if let Some(access) = &state.object_access {
        access
            .check(user, &plugin, operation, spec.dry_run, spec)
            .await?;
    }
    check_capability(&plugin, operation, spec.dry_run)?;
    stages.end("checks");
    let operation_id = uuid::Uuid::new_v4().to_string();
    trail.operation_id.clone_from(&operation_id);
    // The decoder's slices lie within `body`, which slice_ref requires.
    let share = |object: &Object<'_>| body.slice_ref(object.raw);
    let grpc_request = proto::ReconcileRequest {
        operation_id: operation_id.clone(),
        dry_run: spec.dry_run,
        object: spec.object.as_ref().map(share).unwrap_or_default(),
        extensions: spec.extensions.iter().map(share).collect(),
        timeout: prost_types::Duration::try_from(timeout).ok(),
        caller: Some(user_info(user)),
        observed_children: spec
            .observed_children
            .iter()
            .map(|child| proto::ObservedChild {
                key: child.key.clone(),
                object: child.object.get().as_bytes().to_vec(),
            })
            .collect(),
    };
    let span = tracing::info_span!(
        "reconcile",
        plugin = %plugin.name(),
        operation = operation.as_str(),
        operation_id = %operation_id,
        trace_id = %trace.trace_id(),
    );
    let (route, split) = canary::route(&plugin, spec.object.as_ref(), versions.as_ref());
    let sampled = shadow::sample(&plugin, &grpc_request);
    let started = Instant::now();
    let answer = state
        .proxy
        .call(&plugin, operation, grpc_request, timeout, &trace, route)
        .instrument(span.clone())
        .await;
    let elapsed = started.elapsed();
    stages.end("plugin");
    if let Some(split) = &split {
        span.in_scope(|| canary::record(&state.registry, plugin.name(), split, &answer));
    }
    let answer = answer.map_err(|error| {
        span.in_scope(|| tracing::warn!(%error, "reconcile failed"));
        proxy_error(error)
    })?;
    trail.instance.clone_from(&answer.instance);
    trail.success = Some(answer.response.success);
    span.in_scope(|| {
        tracing::debug!(
            success = answer.response.success,
            instance = %answer.instance,
            ?elapsed,
            "reconciled"
        )
    });
    let status = answer::status(&plugin, selection, operation_id, elapsed, answer, spec)?;
    let body = answer::body(request, &status)
        .map_err(|e| ApiError::Internal(format!("encoding the response: {e}")))?;
    if let Some(sampled) = sampled {
        let primary = shadow::Primary {
            plugin,
            operation,
            timeout,
            trace,
            status,
            child_scope: spec.child_scope.unwrap_or_default(),
        };
        span.in_scope(|| {
            shadow::send(
                &state.shadow,
                &state.registry,
                &state.proxy,
                sampled,
                primary,
            )
        });
    }
    let mut response = (
        StatusCode::CREATED,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Bytes::from(body),
    )
        .into_response();
    for warning in warnings {
        if let Ok(value) = HeaderValue::from_str(&format!("299 - {warning:?}")) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    stages.end("answer");
    if let Some(timing) = stages.header() {
        response.headers_mut().insert(SERVER_TIMING, timing);
    }
    Ok(response)
}

/// `POST /apis/plugins.kplug.io/v1alpha1/plugins/{name}/reconcile`
pub async fn subresource(
    State(state): State<Arc<AppState>>,
    Extension(user): Extension<Arc<User>>,
    authenticated: Option<Extension<Authenticated>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut stages = Stages::start(authenticated.map(|Extension(a)| a));
    let received = receive(&headers, query, body, state.reconcile.max_body_bytes)?;
    let (request, warnings) = received.decode()?;
    stages.end("decode");
    if let Some(pinned) = request.spec.plugin.as_deref()
        && pinned != name
    {
        return Err(invalid(
            "spec.plugin",
            format!("Invalid value: {pinned:?}: must be empty or {name:?}, the plugin in the path"),
        ));
    }
    let addressed = Addressed {
        plugin: Some(&name),
        namespace: None,
    };
    delegate(
        &state,
        &user,
        &received.body,
        request,
        warnings,
        addressed,
        trace_parent(&headers),
        &mut stages,
    )
    .await
}

/// `POST /apis/plugins.kplug.io/v1alpha1/reconciles`: kplug selects the
/// plugin, for an object in any namespace.
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(user): Extension<Arc<User>>,
    authenticated: Option<Extension<Authenticated>>,
    headers: HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut stages = Stages::start(authenticated.map(|Extension(a)| a));
    let received = receive(&headers, query, body, state.reconcile.max_body_bytes)?;
    let (request, warnings) = received.decode()?;
    stages.end("decode");
    let sent = Sent {
        headers: &headers,
        received: &received,
        warnings,
    };
    select_and_delegate(&state, &user, sent, request, None, &mut stages).await
}

/// `POST /apis/plugins.kplug.io/v1alpha1/namespaces/{namespace}/reconciles`:
/// as [`create`], for an object of that namespace only, so that a
/// RoleBinding in the namespace can grant it.
pub async fn create_in_namespace(
    State(state): State<Arc<AppState>>,
    Extension(user): Extension<Arc<User>>,
    authenticated: Option<Extension<Authenticated>>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut stages = Stages::start(authenticated.map(|Extension(a)| a));
    let received = receive(&headers, query, body, state.reconcile.max_body_bytes)?;
    let (mut request, warnings) = received.decode()?;
    stages.end("decode");
    match request.metadata.namespace.as_deref() {
        // kube-apiserver's words for the same mismatch.
        Some(sent) if !sent.is_empty() && sent != namespace => {
            return Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the \
                 request"
                    .to_owned(),
            ));
        }
        _ => request.metadata.namespace = Some(namespace.clone()),
    }
    let sent = Sent {
        headers: &headers,
        received: &received,
        warnings,
    };
    let namespace = Some(namespace.as_str());
    select_and_delegate(&state, &user, sent, request, namespace, &mut stages).await
}

/// A `reconciles` request as received, beside its decoded body.
struct Sent<'a> {
    headers: &'a HeaderMap,
    received: &'a Received,
    warnings: Vec<String>,
}

/// What `reconciles` checks before delegating: the selection is complete.
async fn select_and_delegate(
    state: &AppState,
    user: &User,
    sent: Sent<'_>,
    request: Request<'_>,
    namespace: Option<&str>,
    stages: &mut Stages,
) -> Result<Response, ApiError> {
    if request.spec.plugin.is_none() {
        match &request.spec.api {
            None => {
                return Err(invalid(
                    "spec.api",
                    "Required value: or name a plugin in spec.plugin",
                ));
            }
            Some(api) if api.group.is_empty() => {
                return Err(invalid("spec.api.group", "Required value"));
            }
            Some(api) if api.resource.is_empty() => {
                return Err(invalid("spec.api.resource", "Required value"));
            }
            Some(_) => {}
        }
    }
    let addressed = Addressed {
        plugin: None,
        namespace,
    };
    delegate(
        state,
        user,
        &sent.received.body,
        request,
        sent.warnings,
        addressed,
        trace_parent(sent.headers),
        stages,
    )
    .await
}
