//! The `plugins` resource: list, get, watch and delete.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta};

use super::AppState;
use super::list::ListWriter;
use super::negotiate::{Representation, representation};
use super::options::{ListQuery, check_list_version, encode_continue, query_options};
use super::response::{bytes_response, table_content_type, written_response};
use super::status::ApiError;
use super::table::TableWriter;
use super::watcher;
use crate::registry::{DeleteError, Preconditions};

/// Kept here for the handlers that imported it from this module; the
/// response helpers live in [`super::response`].
pub use super::response::json_response;

fn encoding_error(e: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("encoding the response: {e}"))
}

/// `GET /apis/plugins.kplug.io/v1alpha1/plugins`
pub async fn list(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let options = query_options(query)?;
    let repr = representation(&headers)?;
    if options.watch {
        return watcher::watch(state, options, repr);
    }
    let limit = options.limit.unwrap_or(usize::MAX);
    let page = state
        .registry
        .page(options.start_after.as_deref(), limit, |name, encoded| {
            options.selects_named(name, encoded)
        });
    check_list_version(&state.registry, &options, page.resource_version)?;
    let version = state.registry.version(page.resource_version);
    let mut metadata = ListMeta {
        resource_version: Some(version.clone()),
        ..ListMeta::default()
    };
    if page.remaining > 0
        && let Some(last) = &page.last_name
    {
        metadata.continue_ = Some(encode_continue(version, last));
        metadata.remaining_item_count = i64::try_from(page.remaining).ok();
    }
    let writer = match repr {
        Representation::Json => ListWriter::json(&metadata, page.rows),
        Representation::Table(version) => ListWriter::table(
            TableWriter::new(version, options.include_object, Timestamp::now()),
            &metadata,
            page.rows,
        ),
    }
    .map_err(encoding_error)?;
    Ok(written_response(writer, table_content_type(repr)))
}

/// `GET /apis/plugins.kplug.io/v1alpha1/plugins/{name}`
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let options = query_options(query)?;
    let repr = representation(&headers)?;
    let row = state
        .registry
        .get_row(&name)
        .ok_or_else(|| ApiError::plugin_not_found(&name))?;
    let body = match repr {
        Representation::Json => Bytes::from(row.encoded.to_json()),
        Representation::Table(version) => {
            let metadata = ListMeta {
                resource_version: Some(state.registry.version(row.encoded.resource_version())),
                ..ListMeta::default()
            };
            let mut out = Vec::with_capacity(row.encoded.json_len() + 2048);
            TableWriter::new(version, options.include_object, Timestamp::now())
                .single(&mut out, &metadata, &row.encoded, row.last_seen)
                .map_err(encoding_error)?;
            Bytes::from(out)
        }
    };
    Ok(bytes_response(body, table_content_type(repr)))
}

/// `DELETE /apis/plugins.kplug.io/v1alpha1/plugins/{name}`: evicts the
/// registration. A plugin that is still running re-registers with its next
/// heartbeat, as a new object with a new uid.
pub async fn delete(
    State(state): State<Arc<AppState>>,
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
        let row = state
            .registry
            .get_row(&name)
            .ok_or_else(|| ApiError::plugin_not_found(&name))?;
        return Ok(bytes_response(
            Bytes::from(row.encoded.to_json()),
            "application/json",
        ));
    }
    match state.registry.delete(&name, &preconditions) {
        Ok(deleted) => {
            tracing::info!(plugin = %name, "plugin registration deleted through the API");
            Ok(bytes_response(
                Bytes::from(deleted.to_json()),
                "application/json",
            ))
        }
        Err(DeleteError::NotFound(_)) => Err(ApiError::plugin_not_found(&name)),
        Err(DeleteError::Conflict(message)) => Err(ApiError::Conflict(message)),
    }
}
