//! The `plugins` resource: list, get, watch and delete.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::negotiate::{Representation, representation};
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::table::{IncludeObject, Table, TableItem};
use super::watcher;
use crate::registry::{DeleteError, Preconditions};
use crate::v1alpha1::{API_VERSION, Plugin};

/// Query parameters of list and watch, as sent on the wire.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    label_selector: Option<String>,
    field_selector: Option<String>,
    limit: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    resource_version: Option<String>,
    resource_version_match: Option<String>,
    watch: Option<String>,
    timeout_seconds: Option<String>,
    allow_watch_bookmarks: Option<String>,
    send_initial_events: Option<String>,
    include_object: Option<String>,
}

/// Validated list and watch options.
#[derive(Debug)]
pub struct ListOptions {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub limit: Option<usize>,
    pub start_after: Option<String>,
    pub resource_version: Option<u64>,
    pub watch: bool,
    pub timeout: Option<Duration>,
    pub allow_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub include_object: IncludeObject,
}

impl ListOptions {
    /// True when `plugin` passes both selectors.
    pub fn selects(&self, plugin: &Plugin) -> bool {
        if self.field_selector.is_empty() && self.label_selector.is_empty() {
            return true;
        }
        self.field_selector.matches_name(plugin.name())
            && self.label_selector.matches(
                plugin
                    .metadata
                    .labels
                    .as_ref()
                    .unwrap_or(&Default::default()),
            )
    }
}

fn parse_bool(name: &str, value: Option<&str>) -> Result<Option<bool>, ApiError> {
    match value {
        None | Some("") => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0") => Ok(Some(false)),
        Some(other) => Err(ApiError::BadRequest(format!(
            "{name}: Invalid value: {other:?}: must be true or false"
        ))),
    }
}

/// Parses a resourceVersion: kplug's are decimal counters; "0" means "any".
pub fn parse_resource_version(value: Option<&str>) -> Result<Option<u64>, ApiError> {
    match value {
        None | Some("") | Some("0") => Ok(None),
        Some(rv) => rv.parse().map(Some).map_err(|_| {
            ApiError::BadRequest(format!(
                "resourceVersion: Invalid value: {rv:?}: must be a decimal resource version"
            ))
        }),
    }
}

/// The opaque `continue` token: where the next page starts.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    /// resourceVersion of the list that issued the token (informational).
    rv: u64,
    /// The last name on the previous page.
    start: String,
}

fn decode_continue(token: &str) -> Result<String, ApiError> {
    let invalid = |why: String| ApiError::BadRequest(format!("continue key is not valid: {why}"));
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(e.to_string()))?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok(token.start)
}

fn encode_continue(rv: u64, start: &str) -> String {
    let token = ContinueToken {
        rv,
        start: start.to_owned(),
    };
    // Serializing a struct of a number and a string cannot fail.
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap_or_default())
}

impl TryFrom<ListQuery> for ListOptions {
    type Error = ApiError;

    fn try_from(query: ListQuery) -> Result<Self, ApiError> {
        let bad = |e: super::selector::SelectorError| ApiError::BadRequest(e.to_string());
        let label_selector =
            LabelSelector::parse(query.label_selector.as_deref().unwrap_or_default())
                .map_err(bad)?;
        let field_selector =
            FieldSelector::parse(query.field_selector.as_deref().unwrap_or_default())
                .map_err(bad)?;
        let limit = match query.limit.as_deref() {
            None | Some("") => None,
            Some(limit) => match limit.parse::<i64>() {
                Ok(n) if n > 0 => usize::try_from(n).ok(),
                Ok(_) => None,
                Err(_) => {
                    return Err(ApiError::BadRequest(format!(
                        "limit: Invalid value: {limit:?}: must be an integer"
                    )));
                }
            },
        };
        let start_after = match query.continue_token.as_deref() {
            None | Some("") => None,
            Some(token) => Some(decode_continue(token)?),
        };
        if let Some(m) = query.resource_version_match.as_deref()
            && !matches!(m, "" | "NotOlderThan" | "Exact")
        {
            return Err(ApiError::BadRequest(format!(
                "resourceVersionMatch: Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
        let timeout = match query.timeout_seconds.as_deref() {
            None | Some("") => None,
            Some(t) => match t.parse::<u64>() {
                Ok(seconds) => Some(Duration::from_secs(seconds)),
                Err(_) => {
                    return Err(ApiError::BadRequest(format!(
                        "timeoutSeconds: Invalid value: {t:?}: must be a non-negative integer"
                    )));
                }
            },
        };
        Ok(Self {
            label_selector,
            field_selector,
            limit,
            start_after,
            resource_version: parse_resource_version(query.resource_version.as_deref())?,
            watch: parse_bool("watch", query.watch.as_deref())?.unwrap_or(false),
            timeout,
            allow_bookmarks: parse_bool(
                "allowWatchBookmarks",
                query.allow_watch_bookmarks.as_deref(),
            )?
            .unwrap_or(false),
            send_initial_events: parse_bool(
                "sendInitialEvents",
                query.send_initial_events.as_deref(),
            )?,
            include_object: IncludeObject::parse(query.include_object.as_deref())?,
        })
    }
}

fn query_options(query: Result<Query<ListQuery>, QueryRejection>) -> Result<ListOptions, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    ListOptions::try_from(query)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PluginList<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ListMeta,
    items: Vec<&'a Plugin>,
}

/// Serializes a response body, with the content type of its representation.
pub fn json_response(body: &impl Serialize, content_type: &'static str) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            Bytes::from(bytes),
        )
            .into_response(),
        Err(e) => ApiError::Internal(format!("encoding the response: {e}")).into_response(),
    }
}

/// Content type of a Table response.
pub fn table_content_type(repr: Representation) -> &'static str {
    match repr {
        Representation::Table(super::negotiate::TableVersion::V1beta1) => {
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
        }
        Representation::Table(_) => "application/json;as=Table;v=v1;g=meta.k8s.io",
        Representation::Json => "application/json",
    }
}

fn check_not_too_large(requested: Option<u64>, current: u64) -> Result<(), ApiError> {
    match requested {
        Some(rv) if rv > current => Err(ApiError::Timeout(format!(
            "Too large resource version: {rv}, current: {current}"
        ))),
        _ => Ok(()),
    }
}

/// `GET /apis/plugins.kplug.io/v1alpha1/plugins`
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let options = query_options(query)?;
    let repr = representation(&headers)?;
    if options.watch {
        return watcher::watch(state, options, repr);
    }
    let snapshot = state
        .registry
        .list(options.start_after.as_deref(), |p| options.selects(p));
    check_not_too_large(options.resource_version, snapshot.resource_version)?;
    let mut items = snapshot.items;
    let mut metadata = ListMeta {
        resource_version: Some(snapshot.resource_version.to_string()),
        ..ListMeta::default()
    };
    if let Some(limit) = options.limit
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            metadata.continue_ = Some(encode_continue(
                snapshot.resource_version,
                last.object.name(),
            ));
        }
        metadata.remaining_item_count = i64::try_from(remaining).ok();
    }
    Ok(match repr {
        Representation::Json => json_response(
            &PluginList {
                api_version: API_VERSION,
                kind: Plugin::LIST_KIND,
                metadata,
                items: items.iter().map(|i| &*i.object).collect(),
            },
            "application/json",
        ),
        Representation::Table(version) => json_response(
            &Table::new(
                version,
                metadata,
                items.iter().map(|i| TableItem {
                    plugin: &i.object,
                    last_seen: i.last_seen,
                }),
                options.include_object,
                Timestamp::now(),
            ),
            table_content_type(repr),
        ),
    })
}

/// `GET /apis/plugins.kplug.io/v1alpha1/plugins/{name}`
pub async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let options = query_options(query)?;
    let repr = representation(&headers)?;
    let plugin = state
        .registry
        .get(&name)
        .ok_or_else(|| ApiError::plugin_not_found(&name))?;
    Ok(match repr {
        Representation::Json => json_response(&*plugin, "application/json"),
        Representation::Table(version) => {
            let last_seen = state
                .registry
                .last_seen(&name)
                .unwrap_or(plugin.status.last_heartbeat_time.0);
            json_response(
                &Table::new(
                    version,
                    ListMeta {
                        resource_version: plugin.metadata.resource_version.clone(),
                        ..ListMeta::default()
                    },
                    [TableItem {
                        plugin: &plugin,
                        last_seen,
                    }],
                    options.include_object,
                    Timestamp::now(),
                ),
                table_content_type(repr),
            )
        }
    })
}

/// `DELETE /apis/plugins.kplug.io/v1alpha1/plugins/{name}`: evicts the
/// registration. A plugin that is still running re-registers with its next
/// heartbeat, as a new object with a new uid.
pub async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("invalid DeleteOptions: {e}")))?
    };
    let dry_run = match options.dry_run.as_deref() {
        None | Some([]) => false,
        Some([all]) if all == "All" => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let preconditions = options
        .preconditions
        .map(|p| Preconditions {
            uid: p.uid,
            resource_version: p.resource_version,
        })
        .unwrap_or_default();
    if dry_run {
        let plugin = state
            .registry
            .get(&name)
            .ok_or_else(|| ApiError::plugin_not_found(&name))?;
        return Ok(json_response(&*plugin, "application/json"));
    }
    match state.registry.delete(&name, &preconditions) {
        Ok(plugin) => {
            tracing::info!(plugin = %name, "plugin registration deleted through the API");
            Ok(json_response(&*plugin, "application/json"))
        }
        Err(DeleteError::NotFound(_)) => Err(ApiError::plugin_not_found(&name)),
        Err(DeleteError::Conflict(message)) => Err(ApiError::Conflict(message)),
    }
}
