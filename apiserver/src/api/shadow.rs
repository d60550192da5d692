//! The `plugins/{name}/shadow` subresource: how the plugin's shadow
//! instances answered the dry-run copies of its reconciles, compared with
//! the answers its callers got (`kubectl kplug shadow NAME`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;

use super::AppState;
use super::response::json_response;
use super::status::ApiError;

/// `GET /apis/plugins.kplug.io/v1alpha1/plugins/{name}/shadow`
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let shadow = state
        .registry
        .shadow(&name)
        .ok_or_else(|| ApiError::plugin_not_found(&name))?;
    Ok(json_response(&shadow, "application/json"))
}
