//! The running heartbeat loop's state, and what each answer from the
//! registry (or its silence) does to it.

use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{DeregisterRequest, HeartbeatRequest, HeartbeatResponse};
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

use super::timing::{backoff, jitter, positive};
use super::token::TokenFile;
use super::{Outcome, Status};

/// Lower bound on how long a heartbeat may take. Below it, a busy registry
/// would look down to plugins with very short intervals.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Shutdown waits at most this long to deregister; past it, kplug drops the
/// registration when its TTL passes anyway.
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(2);

/// The running loop's state.
pub(super) struct Session {
    pub(super) client: RegistryClient<Channel>,
    pub(super) endpoint: Endpoint,
    pub(super) request: HeartbeatRequest,
    pub(super) interval: Duration,
    pub(super) token: Option<TokenFile>,
    pub(super) uid: Option<String>,
    pub(super) failures: u32,
    pub(super) status: watch::Sender<Status>,
}

impl Session {
    /// `message` as a request, with the token when there is one.
    async fn request<T>(&mut self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &mut self.token
            && let Some(authorization) = token.authorization().await
        {
            request
                .metadata_mut()
                .insert("authorization", authorization);
        }
        request
    }

    /// Sends one heartbeat and returns how long to wait for the next.
    pub(super) async fn heartbeat(&mut self) -> Duration {
        let timeout = self.interval.max(MIN_HEARTBEAT_TIMEOUT);
        let request = self.request(self.request.clone()).await;
        let call = self.client.heartbeat(request);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => self.answered(reply.into_inner()),
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
                // A connection whose peer vanished without closing it looks
                // healthy to the channel forever; dial afresh instead.
                self.client = RegistryClient::new(self.endpoint.connect_lazy());
                self.failed(
                    Code::DeadlineExceeded,
                    format!("no answer within {timeout:?}"),
                )
            }
        }
    }

    fn answered(&mut self, reply: HeartbeatResponse) -> Duration {
        let asked = reply.interval.and_then(positive);
        if let Some(interval) = asked {
            if interval != self.interval {
                debug!(?interval, "registry set the heartbeat interval");
            }
            self.interval = interval;
        }
        self.reachable();
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
        self.status.send_modify(|status| {
            status.uid.clone_from(&self.uid);
            status.interval = asked.or(status.interval);
            if outcome == Outcome::Accepted {
                status.ttl = ttl;
            }
            status.last = Some(outcome);
            status.consecutive_failures = 0;
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
        self.status.send_modify(|status| {
            status.uid = None;
            status.last = Some(Outcome::Refused {
                reason: reason.to_owned(),
                message,
            });
            status.consecutive_failures = 0;
        });
        jitter(self.interval)
    }

    /// Any answer from the registry ends a run of failures.
    fn reachable(&mut self) {
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
        self.status.send_modify(|status| {
            status.last = Some(Outcome::Failed { code, message });
            status.consecutive_failures = self.failures;
        });
        delay
    }

    /// Best effort: the registry drops the registration at its TTL anyway.
    pub(super) async fn deregister(&mut self) {
        let message = DeregisterRequest {
            name: self.request.name.clone(),
            address: self.request.address.clone(),
            instance: self.request.instance.clone(),
        };
        let call = async {
            let request = self.request(message).await;
            self.client.deregister(request).await
        };
        match tokio::time::timeout(DEREGISTER_TIMEOUT, call).await {
            Ok(Ok(reply)) if reply.get_ref().removed => info!("deregistered from kplug"),
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
        self.status.send_modify(|status| {
            status.uid = None;
            status.stopped = true;
        });
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
