//! Whether a connection is in use: a request counts from the moment its
//! headers are in until its response body is finished or dropped, so an open
//! watch or a streaming heartbeat keeps its connection busy, however quiet.
//!
//! Requests only count themselves; they wake nobody. The watchdog
//! ([`Activity::stalled`]) looks at the count when its own deadline comes,
//! and asks to be woken only for the first request and, when it finds
//! requests in progress, for the end of the last. A wake-up per request
//! start and end (a `watch` channel, before) cost every reconcile a
//! scheduler turn of the connection's task (BENCHMARKS.md, "kplug against
//! the relay, by crate").

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use futures::future::BoxFuture;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::auth::PeerIdentity;

/// One connection's requests, as they count themselves.
struct Usage {
    /// One lock for the count and the time it fell to zero, so that the
    /// watchdog never sees a last request ended but not yet its time.
    counts: Mutex<Counts>,
    /// Set while the watchdog waits on `changed`: for the first request,
    /// or for the last one in progress to end.
    watched: AtomicBool,
    changed: Notify,
}

#[derive(Clone, Copy, Default)]
struct Counts {
    in_flight: usize,
    started_any: bool,
    /// When `in_flight` last fell to zero.
    idle_since: Option<Instant>,
}

impl Counts {
    /// Since when no request has been in progress, if none is.
    fn idle(self) -> Option<Instant> {
        self.idle_since.filter(|_| self.in_flight == 0)
    }
}

impl Usage {
    fn new() -> Self {
        Self {
            counts: Mutex::default(),
            watched: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    /// Changes the counts; tells the watchdog, if it waits, when `change`
    /// says so. Nothing panics under the lock, so a poisoned one is sound.
    fn update(&self, change: impl FnOnce(&mut Counts) -> bool) {
        let tell = change(&mut self.counts.lock().unwrap_or_else(PoisonError::into_inner));
        // SeqCst here and in `wait_unless`: either the watchdog sees the
        // change or this sees `watched`.
        if tell && self.watched.swap(false, SeqCst) {
            // A wake-up nobody waits for leaves a permit, which only makes
            // the watchdog look again.
            self.changed.notify_one();
        }
    }

    fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Until a change is told, unless `done` holds once the watchdog is
    /// registered.
    async fn wait_unless(&self, done: impl Fn(Counts) -> bool) {
        let changed = self.changed.notified();
        self.watched.store(true, SeqCst);
        if done(self.counts()) {
            self.watched.store(false, SeqCst);
        } else {
            changed.await;
        }
    }
}

/// One request in progress, until dropped.
struct Busy(Arc<Usage>);

impl Busy {
    fn new(usage: &Arc<Usage>) -> Self {
        usage.update(|counts| {
            counts.in_flight += 1;
            !std::mem::replace(&mut counts.started_any, true)
        });
        Self(usage.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.update(|counts| {
            counts.in_flight = counts.in_flight.saturating_sub(1);
            let last = counts.in_flight == 0;
            if last {
                counts.idle_since = Some(Instant::now());
            }
            last
        });
    }
}

/// The application as one connection's service: each request carries the
/// connection's [`PeerIdentity`] and is counted while in progress.
#[derive(Clone)]
pub struct ConnectionService {
    app: Router,
    peer: PeerIdentity,
    usage: Arc<Usage>,
}

/// The watching side of a [`ConnectionService`]: when it has been unused
/// for too long.
pub struct Activity {
    usage: Arc<Usage>,
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
    let usage = Arc::new(Usage::new());
    let service = ConnectionService {
        app,
        peer,
        usage: usage.clone(),
    };
    (service, Activity { usage })
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Tracked>;
    type Error = Infallible;
    // Boxed: the router's future is not nameable once wrapped.
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.peer.clone());
        let busy = Busy::new(&self.usage);
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
    pub async fn stalled(self, first_by: Instant, idle: Duration) -> Stall {
        let usage = &*self.usage;
        let first = usage.wait_unless(|counts| counts.started_any);
        if tokio::time::timeout_at(first_by, first).await.is_err() && !usage.counts().started_any {
            return Stall::FirstRequest;
        }
        loop {
            match usage.counts().idle() {
                Some(since) => {
                    let deadline = since + idle;
                    if Instant::now() >= deadline {
                        return Stall::Idle;
                    }
                    tokio::time::sleep_until(deadline).await;
                }
                None => usage.wait_unless(|counts| counts.idle().is_some()).await,
            }
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
        let busy = Busy::new(&service.usage);
        // Far past both the first-request deadline and the idle timeout.
        tokio::time::sleep(LONG).await;
        assert!(!stalled.is_finished());
        let done = Instant::now();
        drop(busy);
        let stall = stalled.await.expect("the watchdog");
        assert_eq!(stall, Stall::Idle);
        assert_eq!(done.elapsed(), LONG / 2);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_end_not_from_the_first_deadline() {
        let (service, activity) = track(Router::new(), PeerIdentity::Anonymous);
        let start = Instant::now();
        let idle = Duration::from_secs(2);
        let stalled = tokio::spawn(activity.stalled(start + Duration::from_secs(10), idle));
        drop(Busy::new(&service.usage));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let last_end = Instant::now();
        drop(Busy::new(&service.usage));
        let stall = stalled.await.expect("the watchdog");
        assert_eq!(stall, Stall::Idle);
        assert_eq!(last_end.elapsed(), idle);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_closer_than_the_idle_timeout_keep_it_open() {
        let (service, activity) = track(Router::new(), PeerIdentity::Anonymous);
        let idle = Duration::from_secs(2);
        let stalled = tokio::spawn(activity.stalled(Instant::now() + idle, idle));
        for _ in 0..10 {
            tokio::time::sleep(idle / 2).await;
            drop(Busy::new(&service.usage));
            assert!(!stalled.is_finished());
        }
        let last_end = Instant::now();
        let stall = stalled.await.expect("the watchdog");
        assert_eq!(stall, Stall::Idle);
        assert_eq!(last_end.elapsed(), idle);
    }
}
