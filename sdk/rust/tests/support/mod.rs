//! What the heartbeat tests share, whatever fake registry they run against:
//! a heartbeat loop in the background, the checks on its timing, and a
//! fake's answers on a heartbeat stream. Kept
//! here rather than in kplug-test-support, which does not depend on the SDK.

use std::pin::Pin;
use std::time::{Duration, Instant};

use kplug_sdk::heartbeat::Outcome;
use kplug_sdk::proto::v1alpha1::{HeartbeatRequest, HeartbeatResponse};
use kplug_sdk::{Error, Heartbeater, Status};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::{Stream, StreamExt};
use tonic::Streaming;

/// A fake registry's answers on a `Heartbeats` stream.
pub type Answers = Pin<Box<dyn Stream<Item = Result<HeartbeatResponse, tonic::Status>> + Send>>;

/// Answers each heartbeat on `inbound` with `answer`, which also says
/// whether the stream ends after it; it ends after an error too, as kplug's
/// does.
pub fn answer_each(
    inbound: Streaming<HeartbeatRequest>,
    mut answer: impl FnMut(HeartbeatRequest) -> (Result<HeartbeatResponse, tonic::Status>, bool)
    + Send
    + 'static,
) -> Answers {
    let mut ended = false;
    Box::pin(inbound.map_while(move |request| {
        if ended {
            return None;
        }
        let (reply, ends) = match request {
            Ok(request) => answer(request),
            Err(status) => (Err(status), true),
        };
        ended = ends || reply.is_err();
        Some(reply)
    }))
}

/// Bounds every wait; far above anything a healthy run needs.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A heartbeat loop in the background, stopped by `stop`.
pub struct Client {
    /// The loop's status; a clone outlives `stop`, to see what it left.
    pub status: watch::Receiver<Status>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl Client {
    pub fn start(heartbeater: Heartbeater) -> Self {
        let status = heartbeater.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(heartbeater.run(async {
            let _ = stopped.await;
        }));
        Self {
            status,
            stop: Some(stop),
            task,
        }
    }

    /// Signals shutdown and waits, bounded, for `run` to return; how long
    /// that took.
    pub async fn stop(mut self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("run did not end after shutdown")
            .unwrap()
            .unwrap();
        started.elapsed()
    }

    pub async fn wait_status(&mut self, what: impl FnMut(&Status) -> bool) -> Status {
        tokio::time::timeout(PATIENCE, self.status.wait_for(what))
            .await
            .expect("status never matched")
            .unwrap()
            .clone()
    }

    /// Waits for an accepted heartbeat, and checks the fake registry's uid.
    pub async fn wait_accepted(&mut self) -> Status {
        let status = self
            .wait_status(|s| s.last == Some(Outcome::Accepted))
            .await;
        assert_eq!(status.uid.as_deref(), Some("uid-1"));
        status
    }
}

/// Checks that heartbeats arriving at `times` were at least `min` apart:
/// retried at the interval, not with the much shorter failure backoff.
pub fn assert_gaps_at_least(times: &[Instant], min: Duration) {
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= min,
            "gap {gap:?} below the interval: retried with the failure backoff?"
        );
    }
}
