//! `/healthz`, `/livez` and `/readyz`: served without authentication, as
//! kubelet probes and the aggregator expect.

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;
use tokio::time::Instant;

/// The probe routes. kplug is live as soon as it serves. Its registry is in
/// memory and fills from heartbeats, so a replica that just started knows no
/// plugin yet: it reports ready only once `warmup` has passed, time for
/// every plugin to find it and heartbeat (a Service sends requests only to
/// ready pods, so clients never see the registry half filled). Once
/// `stopping` turns true (SIGTERM) it is not ready again, for good.
pub fn router(warmup: Duration, stopping: watch::Receiver<bool>) -> Router {
    let ok = || async { (StatusCode::OK, "ok") };
    let ready_at = Instant::now() + warmup;
    let ready = move || async move {
        let left = ready_at.saturating_duration_since(Instant::now());
        if *stopping.borrow() {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "[-]shutdown failed: kplug is shutting down\nreadyz check failed\n".to_owned(),
            )
        } else if left.is_zero() {
            (StatusCode::OK, "ok".to_owned())
        } else {
            // kube-apiserver's /readyz wording for a failed check.
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "[-]registry-warmup failed: plugins re-register within one heartbeat \
                     round; ready in {}s\nreadyz check failed\n",
                    left.as_secs().max(1)
                ),
            )
        }
    };
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ready))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn probe(router: &Router, path: &str) -> StatusCode {
        let request = Request::get(path).body(Body::empty()).expect("a request");
        router
            .clone()
            .oneshot(request)
            .await
            .map_or(StatusCode::INTERNAL_SERVER_ERROR, |r| r.status())
    }

    #[tokio::test(start_paused = true)]
    async fn ready_only_after_the_warmup_but_live_at_once() {
        let (_stopping, running) = watch::channel(false);
        let router = router(Duration::from_secs(40), running.clone());
        assert_eq!(probe(&router, "/livez").await, StatusCode::OK);
        assert_eq!(probe(&router, "/healthz").await, StatusCode::OK);
        assert_eq!(
            probe(&router, "/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        tokio::time::advance(Duration::from_secs(40)).await;
        assert_eq!(probe(&router, "/readyz").await, StatusCode::OK);
        assert_eq!(
            probe(&super::router(Duration::ZERO, running), "/readyz").await,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn not_ready_once_stopping_but_still_live() {
        let (stopping, receiver) = watch::channel(false);
        let router = router(Duration::ZERO, receiver);
        assert_eq!(probe(&router, "/readyz").await, StatusCode::OK);
        stopping.send(true).expect("the router listens");
        assert_eq!(
            probe(&router, "/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(probe(&router, "/livez").await, StatusCode::OK);
    }
}
