//! Whether a connection is in use: a request counts from the moment its
//! headers are in until its response body is finished or dropped, so an open
//! watch or a streaming heartbeat keeps its connection busy, however quiet.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use futures::future::BoxFuture;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::auth::PeerIdentity;

/// Requests in progress on one connection.
type InFlight = Arc<watch::Sender<usize>>;

/// One request in progress, until dropped.
struct Busy(InFlight);

impl Busy {
    fn new(in_flight: &InFlight) -> Self {
        in_flight.send_modify(|n| *n += 1);
        Self(in_flight.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The application as one connection's service: each request carries the
/// connection's [`PeerIdentity`] and is counted while in progress.
#[derive(Clone)]
pub struct ConnectionService {
    app: Router,
    peer: PeerIdentity,
    in_flight: InFlight,
}

/// The watching side of a [`ConnectionService`]: when it has been unused
/// for too long.
pub struct Activity {
    in_flight: watch::Receiver<usize>,
}

/// Why a connection was found stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stall {
    /// No complete request by the deadline the connection started with.
    FirstRequest,
    /// No request in progress for the idle timeout.
    Idle,
}

/// `app` serving one connection from `peer`, and its activity.
pub fn track(app: Router, peer: PeerIdentity) -> (ConnectionService, Activity) {
    let (sender, in_flight) = watch::channel(0);
    let service = ConnectionService {
        app,
        peer,
        in_flight: Arc::new(sender),
    };
    (service, Activity { in_flight })
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Tracked>;
    type Error = Infallible;
    // Boxed: the router's future is not nameable once wrapped.
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.peer.clone());
        let busy = Busy::new(&self.in_flight);
        let response = self.app.clone().oneshot(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Tracked { body, _busy: busy }))
        })
    }
}

/// A response body that keeps its request counted until hyper is done
/// with it.
pub struct Tracked {
    body: axum::body::Body,
    _busy: Busy,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Activity {
    /// Resolves when the connection has had no complete request by
    /// `first_by`, or later no request in progress for `idle`; never while
    /// a request is in progress.
    pub async fn stalled(mut self, first_by: Instant, idle: Duration) -> Stall {
        let mut deadline = Some((first_by, Stall::FirstRequest));
        loop {
            let changed = match deadline {
                Some((at, stall)) => tokio::select! {
                    () = tokio::time::sleep_until(at) => return stall,
                    changed = self.in_flight.changed() => changed,
                },
                None => self.in_flight.changed().await,
            };
            if changed.is_err() {
                // The service is gone, so is the connection: its end decides.
                return std::future::pending().await;
            }
            let in_flight = *self.in_flight.borrow_and_update();
            deadline = (in_flight == 0).then(|| (Instant::now() + idle, Stall::Idle));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn no_first_request_by_the_deadline() {
        let (_service, activity) = track(Router::new(), PeerIdentity::Anonymous);
        let start = Instant::now();
        let stall = activity.stalled(start + Duration::from_secs(5), LONG).await;
        assert_eq!(stall, Stall::FirstRequest);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_is_never_idle_and_its_end_starts_the_clock() {
        let (service, activity) = track(Router::new(), PeerIdentity::Anonymous);
        let start = Instant::now();
        let stalled = tokio::spawn(activity.stalled(start + Duration::from_secs(1), LONG / 2));
        let busy = Busy::new(&service.in_flight);
        // Far past both the first-request deadline and the idle timeout.
        tokio::time::sleep(LONG).await;
        assert!(!stalled.is_finished());
        let done = Instant::now();
        drop(busy);
        let stall = stalled.await.expect("the watchdog");
        assert_eq!(stall, Stall::Idle);
        assert_eq!(done.elapsed(), LONG / 2);
    }
}
