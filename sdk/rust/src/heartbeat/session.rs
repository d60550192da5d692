//! Heartbeating to one kplug replica: the loop's state, what each answer
//! from the registry (or its silence) does to it, and the shutdown steps.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kplug_proto::v1alpha1::{DeregisterRequest, HeartbeatRequest, HeartbeatResponse};
use tokio::sync::watch;
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use super::calls::Calls;
use super::status::{Outcome, Replica, Status};
use super::timing::{backoff, jitter, positive};
use super::token::TokenFile;
use crate::identity::IssuedIdentity;

/// Lower bound on how long a heartbeat may take. Below it, a busy registry
/// would look down to plugins with very short intervals.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Shutdown waits at most this long to deregister; past it, kplug drops the
/// registration when its TTL passes anyway.
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(2);
/// The capability of a kplug that tells instances apart and honours
/// `draining`.
pub(super) const INSTANCES: &str = "Instances";

/// How far shutdown has come; every session follows it. It only moves
/// forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// Heartbeating.
    Serving,
    /// Telling kplug that the instance is draining, then heartbeating so.
    Draining,
    /// Deregistering, then done.
    Stopping,
}

/// Waits for the phase to move on; a vanished sender means stopping.
pub(super) async fn next(phase: &mut watch::Receiver<Phase>) -> Phase {
    match phase.changed().await {
        Ok(()) => *phase.borrow_and_update(),
        Err(_) => Phase::Stopping,
    }
}

/// Sleeps for `delay`, or for ever without one.
async fn sleep(delay: Option<Duration>) {
    match delay {
        Some(delay) => tokio::time::sleep(delay).await,
        None => std::future::pending().await,
    }
}

/// The heartbeats to one replica.
pub(super) struct Session {
    address: SocketAddr,
    calls: Calls,
    request: HeartbeatRequest,
    interval: Duration,
    token: Option<TokenFile>,
    /// The identity kplug certifies, asked for on heartbeats when due.
    identity: Option<Arc<IssuedIdentity>>,
    uid: Option<String>,
    failures: u32,
    /// The replica announced [`INSTANCES`] in its last answer.
    instances: bool,
    /// The last heartbeat got no answer (it failed, timed out or was
    /// abandoned): it may have registered the instance all the same.
    unanswered: bool,
    status: Arc<watch::Sender<Status>>,
}

impl Session {
    pub(super) fn new(
        address: SocketAddr,
        endpoint: Endpoint,
        request: HeartbeatRequest,
        interval: Duration,
        token: Option<TokenFile>,
        identity: Option<Arc<IssuedIdentity>>,
        status: Arc<watch::Sender<Status>>,
    ) -> Self {
        Self {
            address,
            calls: Calls::new(endpoint),
            request,
            interval,
            token,
            identity,
            uid: None,
            failures: 0,
            instances: false,
            unanswered: false,
            status,
        }
    }

    /// Heartbeats until the phase moves on: while serving, then while
    /// draining; then deregisters.
    pub(super) async fn run(mut self, mut phase: watch::Receiver<Phase>) {
        let mut current = *phase.borrow_and_update();
        while current == Phase::Serving {
            // A heartbeat in flight when shutdown begins is abandoned: the
            // draining heartbeat or the deregistration supersedes it.
            let delay = tokio::select! {
                biased;
                moved = next(&mut phase) => {
                    current = moved;
                    continue;
                }
                delay = self.heartbeat() => delay,
            };
            tokio::select! {
                biased;
                moved = next(&mut phase) => current = moved,
                () = tokio::time::sleep(delay) => {}
            }
        }
        let mut deregistered = false;
        if current == Phase::Draining {
            (current, deregistered) = self.drain(&mut phase).await;
        }
        debug_assert_eq!(current, Phase::Stopping);
        if !deregistered {
            self.deregister().await;
        }
    }

    /// Tells the replica that the instance is draining, so that it routes
    /// no new calls here, and keeps heartbeating so until stopping. A
    /// replica not known to have [`INSTANCES`] (kplug before instances, or
    /// one that never answered) might ignore `draining`: the instance is
    /// deregistered from it now instead, which stops its calls either way.
    /// Returns the next phase and whether the instance was deregistered.
    async fn drain(&mut self, phase: &mut watch::Receiver<Phase>) -> (Phase, bool) {
        self.request.draining = true;
        let mut deregistered = false;
        let mut delay = if self.uid.is_none() && !self.unanswered {
            // Refused, or never sent: nothing to tell, and registering a
            // draining instance would serve no one.
            debug!("not registered with this replica; nothing to tell");
            None
        } else if self.instances {
            let delay = tokio::select! {
                biased;
                moved = next(phase) => {
                    self.drain_notified();
                    return (moved, false);
                }
                delay = self.heartbeat() => delay,
            };
            if self.failures == 0 {
                info!("told kplug that this instance is draining");
            }
            Some(delay)
        } else {
            info!(
                "this kplug is not known to tell instances apart (no {INSTANCES:?} capability): \
                 deregistering before draining calls"
            );
            self.deregister().await;
            deregistered = true;
            None
        };
        self.drain_notified();
        loop {
            let moved = tokio::select! {
                biased;
                moved = next(phase) => moved,
                () = sleep(delay) => {
                    delay = Some(tokio::select! {
                        biased;
                        moved = next(phase) => return (moved, deregistered),
                        delay = self.heartbeat() => delay,
                    });
                    continue;
                }
            };
            if moved == Phase::Stopping {
                return (moved, deregistered);
            }
        }
    }

    fn drain_notified(&self) {
        self.update(|replica| replica.drain_notified = true);
    }

    /// Applies `update` to this replica's entry in the status.
    fn update(&self, update: impl FnOnce(&mut Replica)) {
        self.status
            .send_modify(|status| status.update_replica(self.address, update));
    }

    /// The token's `authorization` header, when there is a token.
    async fn authorization(&mut self) -> Option<AsciiMetadataValue> {
        match &mut self.token {
            Some(token) => token.authorization().await,
            None => None,
        }
    }

    /// Sends one heartbeat and returns how long to wait for the next.
    async fn heartbeat(&mut self) -> Duration {
        let timeout = self.interval.max(MIN_HEARTBEAT_TIMEOUT);
        let mut message = self.request.clone();
        if let Some(identity) = &self.identity {
            identity.stamp(&mut message);
        }
        let authorization = self.authorization().await;
        // Until an answer says otherwise.
        self.unanswered = true;
        let call = self.calls.heartbeat(message, authorization);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => self.answered(reply),
            Ok(Err(status))
                if matches!(
                    status.code(),
                    Code::Unauthenticated | Code::PermissionDenied
                ) =>
            {
                self.denied(&status)
            }
            Ok(Err(status)) => self.failed(status.code(), describe(&status)),
            Err(_) => {
                self.calls.redial();
                self.failed(
                    Code::DeadlineExceeded,
                    format!("no answer within {timeout:?}"),
                )
            }
        }
    }

    fn answered(&mut self, reply: HeartbeatResponse) -> Duration {
        if let Some(identity) = &self.identity {
            match identity.take(&reply) {
                Ok(true) => info!(
                    identity = identity.name(),
                    "certificate or trust bundle from kplug in use for new connections"
                ),
                Ok(false) => {}
                Err(error) => warn!(%error, "cannot use what kplug sent for the plugin's identity"),
            }
        }
        let asked = reply.interval.and_then(positive);
        if let Some(interval) = asked {
            if interval != self.interval {
                debug!(?interval, "registry set the heartbeat interval");
            }
            self.interval = interval;
        }
        self.reachable();
        self.instances = reply
            .server_protocol
            .as_ref()
            .is_some_and(|protocol| protocol.capabilities.iter().any(|c| c == INSTANCES));
        let outcome = if reply.accepted {
            match self.uid.as_deref() {
                Some(uid) if uid == reply.uid => debug!("heartbeat accepted"),
                // The registry keeps registrations in memory only.
                Some(previous) => info!(
                    uid = %reply.uid,
                    previous,
                    "registered again under a new uid: the registration expired or the \
                     registry restarted"
                ),
                None => info!(uid = %reply.uid, interval = ?self.interval, "registered with kplug"),
            }
            self.uid = Some(reply.uid);
            Outcome::Accepted
        } else {
            warn!(
                reason = %reply.reason,
                retry_in = ?self.interval,
                "kplug refused the heartbeat: {}",
                reply.message
            );
            self.uid = None;
            Outcome::Refused {
                reason: reply.reason,
                message: reply.message,
            }
        };
        let ttl = reply.ttl.and_then(positive);
        let (uid, instances) = (self.uid.clone(), self.instances);
        self.update(|replica| {
            replica.uid = uid;
            replica.interval = asked.or(replica.interval);
            if outcome == Outcome::Accepted {
                replica.ttl = ttl;
            }
            replica.last = Some(outcome);
            replica.consecutive_failures = 0;
            replica.instances = instances;
        });
        jitter(self.interval)
    }

    /// kplug refused the call itself: the token is missing or invalid, or
    /// its identity may not heartbeat under this name. Neither fixes
    /// itself within a backoff, so it is retried at the interval, like a
    /// refusal in the answer.
    fn denied(&mut self, status: &tonic::Status) -> Duration {
        self.reachable();
        let reason = match status.code() {
            Code::Unauthenticated => "Unauthenticated",
            _ => "PermissionDenied",
        };
        let message = status.message().to_owned();
        warn!(
            code = ?status.code(),
            retry_in = ?self.interval,
            "kplug refused the heartbeat: {message}"
        );
        self.uid = None;
        self.update(|replica| {
            replica.uid = None;
            replica.last = Some(Outcome::Refused {
                reason: reason.to_owned(),
                message,
            });
            replica.consecutive_failures = 0;
        });
        jitter(self.interval)
    }

    /// Any answer from the registry ends a run of failures.
    fn reachable(&mut self) {
        self.unanswered = false;
        if self.failures > 0 {
            info!(failures = self.failures, "registry reachable again");
            self.failures = 0;
        }
    }

    fn failed(&mut self, code: Code, message: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = jitter(backoff(self.failures, self.interval));
        warn!(
            ?code,
            error = %message,
            failures = self.failures,
            retry_in = ?delay,
            "heartbeat failed"
        );
        let failures = self.failures;
        self.update(|replica| {
            replica.last = Some(Outcome::Failed { code, message });
            replica.consecutive_failures = failures;
        });
        delay
    }

    /// Best effort: the registry drops the registration at its TTL anyway.
    async fn deregister(&mut self) {
        let message = DeregisterRequest {
            name: self.request.name.clone(),
            address: self.request.address.clone(),
            instance: self.request.instance.clone(),
        };
        let call = async {
            let authorization = self.authorization().await;
            self.calls.deregister(message, authorization).await
        };
        match tokio::time::timeout(DEREGISTER_TIMEOUT, call).await {
            Ok(Ok(reply)) if reply.removed => info!("deregistered from kplug"),
            Ok(Ok(_)) => debug!("nothing to deregister"),
            Ok(Err(status)) => warn!(
                code = ?status.code(),
                error = %describe(&status),
                "could not deregister; kplug drops the registration when its TTL passes"
            ),
            Err(_) => warn!(
                timeout = ?DEREGISTER_TIMEOUT,
                "registry did not answer the deregistration; kplug drops the registration \
                 when its TTL passes"
            ),
        }
        self.uid = None;
        self.update(|replica| replica.uid = None);
    }
}

/// The status message with its cause: for transport failures tonic's
/// message alone ("tcp connect error") hides what went wrong.
fn describe(status: &tonic::Status) -> String {
    // The layers in between repeat the message; the root cause is the news.
    let mut cause = std::error::Error::source(status);
    let mut root = None;
    while let Some(error) = cause {
        root = Some(error);
        cause = error.source();
    }
    match root.map(ToString::to_string) {
        Some(root) if !status.message().contains(&root) => format!("{}: {root}", status.message()),
        _ => status.message().to_owned(),
    }
}
