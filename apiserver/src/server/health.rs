//! `/healthz`, `/livez` and `/readyz`: served without authentication, as
//! kubelet probes and the aggregator expect.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// The probe routes. kplug is ready as soon as it serves: its state is
/// in memory and fills from heartbeats.
pub fn router() -> Router {
    let ok = || async { (StatusCode::OK, "ok") };
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok))
}
