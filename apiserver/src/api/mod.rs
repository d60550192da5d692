//! The HTTP surface: Kubernetes API endpoints for `plugins.kplug.io`.

pub mod discovery;
pub mod list;
pub mod metrics;
pub mod negotiate;
pub mod openapi;
pub mod options;
pub mod plugins;
pub mod reconcile;
pub mod response;
pub mod selector;
pub mod shadow;
pub mod status;
pub mod table;
pub mod timing;
pub mod watcher;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::proxy::Proxy;
use crate::registry::Registry;
use crate::v1alpha1::{GROUP, VERSION};
use status::ApiError;

/// Limits and cadences of watches.
#[derive(Clone, Debug)]
pub struct WatchSettings {
    /// Used when a watch sets no `timeoutSeconds`.
    pub default_timeout: Duration,
    /// Caps `timeoutSeconds`.
    pub max_timeout: Duration,
    /// How often a watch that allows bookmarks gets one.
    pub bookmark_interval: Duration,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(30 * 60),
            max_timeout: Duration::from_secs(60 * 60),
            bookmark_interval: Duration::from_secs(60),
        }
    }
}

/// What every handler can reach.
pub struct AppState {
    pub registry: Arc<Registry>,
    pub proxy: Arc<Proxy>,
    pub watch: WatchSettings,
    pub reconcile: reconcile::ReconcileSettings,
    /// Where dry-run copies to shadow plugins run.
    pub shadow: reconcile::ShadowRunner,
    /// Turns true when the server closes its connections at shutdown:
    /// watches end then, so that clients watch again elsewhere.
    pub closing: tokio::sync::watch::Receiver<bool>,
    /// Checks callers' rights on the objects of their reconciles; `None`
    /// in standalone mode, where every caller may do everything.
    pub object_access: Option<Arc<reconcile::ObjectAccess>>,
    /// Reads the objects of reconciles by reference; cluster mode only.
    pub stored: Option<Arc<crate::stored::StoredObjects>>,
    /// Where each reconcile is recorded.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
}

/// All API routes and `/metrics`; anything else is a `404` Status.
pub fn router(
    state: AppState,
    openapi: Arc<openapi::OpenApi>,
    metrics: Arc<prometheus_client::registry::Registry>,
) -> Router {
    let collection = format!("/apis/{GROUP}/{VERSION}/plugins");
    let method_not_allowed = || async { ApiError::MethodNotAllowed };
    let body_limit = DefaultBodyLimit::max(state.reconcile.max_body_bytes);
    Router::new()
        .route(
            &format!("{collection}/{{name}}/reconcile"),
            post(reconcile::subresource)
                .fallback(method_not_allowed)
                .layer(body_limit),
        )
        .route(
            &format!("/apis/{GROUP}/{VERSION}/reconciles"),
            post(reconcile::create)
                .fallback(method_not_allowed)
                .layer(body_limit),
        )
        .route(
            &format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/reconciles"),
            post(reconcile::create_in_namespace)
                .fallback(method_not_allowed)
                .layer(body_limit),
        )
        .route(
            &format!("{collection}/{{name}}/shadow"),
            get(shadow::get).fallback(method_not_allowed),
        )
        .route(&collection, get(plugins::list).fallback(method_not_allowed))
        .route(
            &format!("{collection}/{{name}}"),
            get(plugins::get)
                .delete(plugins::delete)
                .fallback(method_not_allowed),
        )
        .merge(discovery::router())
        // One reference count per request: axum clones the state for
        // each, and a clone of the struct itself bumped (and dropped) one
        // for each of its shared parts, on counters every worker touches.
        .with_state(Arc::new(state))
        .merge(openapi::router(openapi))
        .route(
            "/metrics",
            get(metrics::serve)
                .fallback(method_not_allowed)
                .with_state(metrics),
        )
        .fallback(|| async { ApiError::NoSuchRoute })
}
