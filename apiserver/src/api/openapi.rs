//! TEMPORARY stub until the OpenAPI module lands.
use std::sync::Arc;
#[derive(Debug, thiserror::Error)]
#[error("openapi")]
pub struct OpenApiError;
pub struct OpenApi;
impl OpenApi {
    pub fn new() -> Result<Self, OpenApiError> {
        Ok(Self)
    }
}
pub fn router(_openapi: Arc<OpenApi>) -> axum::Router {
    axum::Router::new()
}
