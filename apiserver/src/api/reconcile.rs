//! Delegation: `plugins/{name}/reconcile` and `reconciles`, which forward a
//! Reconcile to a plugin over gRPC and answer with its outcome.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1 as proto;
use serde::Deserialize;
use serde::de::IgnoredAny;
use tracing::Instrument;

use super::AppState;
use super::plugins::json_response;
use super::status::ApiError;
use crate::proxy::ProxyError;
use crate::registry::{Implementation, SelectError};
use crate::v1alpha1::{
    API_VERSION, ExtensionStatus, ObjectRef, Operation, Plugin, PluginRef, RawObject, Reconcile,
    ReconcileResult, ReconcileSpec, ReconcileStatus, ResultCondition, Selection,
};

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

/// Decodes and checks the request body.
fn decode(
    headers: &HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<(Reconcile, Vec<String>), ApiError> {
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
    let mut reconcile: Reconcile = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("decoding the Reconcile: {e}")))?;
    let unknown = unknown_fields(&body);
    let warnings = match validation {
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
    match query.dry_run.as_deref() {
        None | Some("") => {}
        Some("All") => reconcile.spec.dry_run = true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    }
    Ok((reconcile, warnings))
}

/// The field names of a Reconcile, read without decoding any value.
#[derive(Deserialize)]
struct FieldNames {
    #[serde(default)]
    spec: BTreeMap<String, IgnoredAny>,
    #[serde(flatten)]
    top: BTreeMap<String, IgnoredAny>,
}

/// Fields of `body` this version does not know, as `spec.colour`.
fn unknown_fields(body: &[u8]) -> Vec<String> {
    let Ok(names) = serde_json::from_slice::<FieldNames>(body) else {
        return Vec::new();
    };
    let top = names
        .top
        .into_keys()
        .filter(|k| !Reconcile::FIELDS.contains(&k.as_str()));
    let spec = names
        .spec
        .into_keys()
        .filter(|k| !ReconcileSpec::FIELDS.contains(&k.as_str()))
        .map(|k| format!("spec.{k}"));
    top.chain(spec).collect()
}

/// What kplug needs to know of an object it otherwise passes on untouched.
#[derive(Deserialize)]
struct ObjectHead {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    metadata: HeadMetadata,
}

#[derive(Default, Deserialize)]
struct HeadMetadata {
    name: Option<String>,
}

/// Checks that `value` is a Kubernetes object with apiVersion, kind and a name.
fn check_object(field: &str, value: Option<&RawObject>) -> Result<(), ApiError> {
    let head = value
        .and_then(|raw| serde_json::from_str::<ObjectHead>(raw.get()).ok())
        .ok_or_else(|| invalid(field, "Required value: a Kubernetes object"))?;
    let missing = |value: &Option<String>| value.as_deref().is_none_or(str::is_empty);
    if missing(&head.api_version) {
        return Err(invalid(&format!("{field}.apiVersion"), "Required value"));
    }
    if missing(&head.kind) {
        return Err(invalid(&format!("{field}.kind"), "Required value"));
    }
    if missing(&head.metadata.name) {
        return Err(invalid(&format!("{field}.metadata.name"), "Required value"));
    }
    Ok(())
}

/// Checks the request; returns its operation and deadline.
fn validate(
    reconcile: &Reconcile,
    settings: &ReconcileSettings,
) -> Result<(Operation, Duration), ApiError> {
    if !reconcile.api_version.is_empty() && reconcile.api_version != API_VERSION {
        return Err(ApiError::BadRequest(format!(
            "apiVersion {:?} is not {API_VERSION}",
            reconcile.api_version
        )));
    }
    if !reconcile.kind.is_empty() && reconcile.kind != Reconcile::KIND {
        return Err(ApiError::BadRequest(format!(
            "kind {:?} is not {}",
            reconcile.kind,
            Reconcile::KIND
        )));
    }
    let spec = &reconcile.spec;
    let operation = spec.operation().map_err(|name| {
        invalid(
            "spec.operation",
            format!("Unsupported value: {name:?}: supported values: \"Reconcile\", \"Finalize\""),
        )
    })?;
    check_object("spec.object", spec.object.as_ref())?;
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
    Ok((operation, timeout))
}

fn select_error(error: SelectError) -> ApiError {
    match error {
        SelectError::NotFound(name) => ApiError::plugin_not_found(&name),
        SelectError::WrongApi { .. } => invalid("spec.api", error.to_string()),
        SelectError::NotReady { .. }
        | SelectError::NoneReady(_)
        | SelectError::NoneReadyOfImplementation { .. } => ApiError::ServiceUnavailable {
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
        ProxyError::Unavailable { .. } => ApiError::ServiceUnavailable {
            message,
            retry_after: RETRY_AFTER_SECONDS,
        },
        ProxyError::DeadlineExceeded { .. } => ApiError::Timeout(message),
        ProxyError::Rejected { .. } => invalid("spec.object", message),
        ProxyError::Unimplemented { .. } => ApiError::BadRequest(message),
        ProxyError::Failed { .. } | ProxyError::InvalidAddress { .. } => {
            ApiError::Internal(message)
        }
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

fn parse_json(
    plugin: &str,
    what: &str,
    bytes: &[u8],
) -> Result<Option<serde_json::Value>, ApiError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(bytes).map(Some).map_err(|e| {
        ApiError::Internal(format!(
            "plugin {plugin} returned invalid JSON for {what}: {e}"
        ))
    })
}

fn severity(value: i32) -> &'static str {
    match proto::Severity::try_from(value) {
        Ok(proto::Severity::Warning) => "Warning",
        Ok(proto::Severity::Error) => "Error",
        _ => "Normal",
    }
}

fn status(
    plugin: &Plugin,
    selection: Selection,
    operation_id: String,
    elapsed: Duration,
    answer: proto::ReconcileResponse,
) -> Result<ReconcileStatus, ApiError> {
    let name = plugin.name();
    let extension_statuses = answer
        .extension_statuses
        .into_iter()
        .map(|e| {
            let reference = e.r#ref.unwrap_or_default();
            Ok(ExtensionStatus {
                reference: ObjectRef {
                    api_version: reference.api_version,
                    kind: reference.kind,
                    namespace: reference.namespace,
                    name: reference.name,
                },
                status: parse_json(name, "an extension status", &e.status)?.unwrap_or_default(),
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(ReconcileStatus {
        plugin: PluginRef {
            name: name.to_owned(),
            version: plugin.spec.version.clone(),
            implementation: plugin.spec.implementation.clone(),
        },
        selection,
        success: answer.success,
        results: answer
            .results
            .into_iter()
            .map(|r| ReconcileResult {
                severity: severity(r.severity).to_owned(),
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
        object_status: parse_json(name, "the object status", &answer.object_status)?,
        extension_statuses,
        requeue_after_seconds: answer
            .requeue_after
            .and_then(|d| Duration::try_from(d).ok())
            .map(|d| d.as_secs_f64()),
        operation_id,
        duration_milliseconds: elapsed.as_secs_f64() * 1000.0,
    })
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

/// Selects the plugin, calls it and renders the `201` answer.
async fn delegate(
    state: AppState,
    mut reconcile: Reconcile,
    warnings: Vec<String>,
    pinned: Option<&str>,
    trace: Option<TraceParent>,
) -> Result<Response, ApiError> {
    let (operation, timeout) = validate(&reconcile, &state.reconcile)?;
    let spec = &reconcile.spec;
    let (plugin, selection) = state
        .registry
        .select(
            spec.api.as_ref(),
            Implementation::from_spec(
                spec.required_implementation.as_deref(),
                spec.preferred_implementation.as_deref(),
            ),
            pinned.or(spec.plugin.as_deref()),
        )
        .map_err(select_error)?;
    check_capability(&plugin, operation, spec.dry_run)?;
    let operation_id = uuid::Uuid::new_v4().to_string();
    // Continue the caller's trace, or start one here; the plugin sees
    // kplug's own span as its parent.
    let trace = trace.unwrap_or_else(TraceParent::new_root).child();
    let bytes = |raw: &RawObject| raw.get().as_bytes().to_vec();
    let request = proto::ReconcileRequest {
        operation_id: operation_id.clone(),
        dry_run: spec.dry_run,
        object: spec.object.as_ref().map(bytes).unwrap_or_default(),
        extensions: spec.extensions.iter().map(bytes).collect(),
        timeout: prost_types::Duration::try_from(timeout).ok(),
    };
    let span = tracing::info_span!(
        "reconcile",
        plugin = %plugin.name(),
        operation = operation.as_str(),
        operation_id = %operation_id,
        trace_id = %trace.trace_id(),
    );
    let started = Instant::now();
    let answer = state
        .proxy
        .call(&plugin, operation, request, timeout, &trace)
        .instrument(span.clone())
        .await;
    let elapsed = started.elapsed();
    let answer = answer.map_err(|error| {
        span.in_scope(|| tracing::warn!(%error, "reconcile failed"));
        proxy_error(error)
    })?;
    span.in_scope(|| tracing::debug!(success = answer.success, ?elapsed, "reconciled"));
    reconcile.status = Some(status(&plugin, selection, operation_id, elapsed, answer)?);
    reconcile.api_version = API_VERSION.to_owned();
    reconcile.kind = Reconcile::KIND.to_owned();
    let mut response = json_response(&reconcile, "application/json");
    *response.status_mut() = StatusCode::CREATED;
    for warning in warnings {
        if let Ok(value) = HeaderValue::from_str(&format!("299 - {warning:?}")) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    Ok(response)
}

/// `POST /apis/plugins.kplug.io/v1alpha1/plugins/{name}/reconcile`
pub async fn subresource(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (reconcile, warnings) = decode(&headers, query, body, state.reconcile.max_body_bytes)?;
    if let Some(pinned) = reconcile.spec.plugin.as_deref()
        && pinned != name
    {
        return Err(invalid(
            "spec.plugin",
            format!("Invalid value: {pinned:?}: must be empty or {name:?}, the plugin in the path"),
        ));
    }
    delegate(
        state,
        reconcile,
        warnings,
        Some(&name),
        trace_parent(&headers),
    )
    .await
}

/// `POST /apis/plugins.kplug.io/v1alpha1/reconciles`: kplug selects the plugin.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<CreateQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (reconcile, warnings) = decode(&headers, query, body, state.reconcile.max_body_bytes)?;
    if reconcile.spec.plugin.is_none() {
        match &reconcile.spec.api {
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
    delegate(state, reconcile, warnings, None, trace_parent(&headers)).await
}
