//! What the heartbeat tests share, whatever fake registry they run against:
//! a heartbeat loop in the background and the checks on its timing. Kept
//! here rather than in kplug-test-support, which does not depend on the SDK.

use std::time::{Duration, Instant};

use kplug_sdk::heartbeat::Outcome;
use kplug_sdk::{Error, Heartbeater, Status};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

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
