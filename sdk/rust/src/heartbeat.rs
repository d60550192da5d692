//! Keeping the plugin registered: heartbeats into kplug's registry.
//!
//! kplug forgets a plugin that stops heartbeating, so [`Heartbeater::run`]
//! never gives up on an unreachable or refusing registry; it retries and
//! reports what happens through [`Status`].

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{DeregisterRequest, HeartbeatRequest, HeartbeatResponse};
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tracing::{Instrument, debug, info, warn};

use crate::{Error, PluginInfo};

/// Assumed until the registry answers; matches the registry's own default.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// First retry delay after a failed heartbeat; doubles up to the interval.
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// Heartbeat intervals and retry delays vary by up to this fraction, so
/// plugins restarted together (or reconnecting after a registry restart) do
/// not keep hitting the registry in lockstep.
const JITTER: f64 = 0.1;
/// Lower bound on how long a heartbeat may take. Below it, a busy registry
/// would look down to plugins with very short intervals.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bounds dialing the registry, so an unanswered dial cannot stall the
/// channel for the operating system's much longer TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Shutdown waits at most this long to deregister; past it, kplug drops the
/// registration when its TTL passes anyway.
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(2);

/// Keeps a plugin registered with kplug until shutdown.
///
/// ```no_run
/// use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
///
/// # async fn example() -> Result<(), kplug_sdk::Error> {
/// let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
///     .implementation("Hello")
///     .address("127.0.0.1:50052");
/// Heartbeater::new("http://127.0.0.1:50051", info)
///     .run(kplug_sdk::shutdown_signal()?)
///     .await
/// # }
/// ```
#[derive(Debug)]
pub struct Heartbeater {
    registry: String,
    info: PluginInfo,
    interval: Option<Duration>,
    status: watch::Sender<Status>,
}

impl Heartbeater {
    /// Heartbeats `info` into the registry at `registry`, e.g.
    /// `http://127.0.0.1:50051`. A bare `host:port` means plain HTTP/2.
    ///
    /// The address is checked by [`run`](Self::run).
    pub fn new(registry: impl Into<String>, info: PluginInfo) -> Self {
        Self {
            registry: registry.into(),
            info,
            interval: None,
            status: watch::Sender::new(Status::default()),
        }
    }

    /// Asks the registry for a heartbeat interval. The registry may answer
    /// with another, which is then used. Zero, the default, lets the
    /// registry choose.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = (!interval.is_zero()).then_some(interval);
        self
    }

    /// Observes the heartbeats: the registration's uid, the interval in use
    /// and the last outcome. The sender closes when [`run`](Self::run)
    /// returns.
    #[must_use]
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Heartbeats until `shutdown` resolves, then deregisters.
    ///
    /// The first heartbeat goes out at once, later ones at the interval the
    /// registry asks for. Failures are retried with exponential backoff and
    /// refusals at the interval, so this only returns early when the
    /// registry address is invalid.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRegistryAddress`] when the registry address cannot
    /// be dialed; nothing is sent then.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let endpoint = endpoint(&self.registry)?;
        let span =
            tracing::info_span!("heartbeat", plugin = %self.info.name, registry = %self.registry);
        let mut session = Session {
            client: RegistryClient::new(endpoint.connect_lazy()),
            endpoint,
            request: self.info.heartbeat_request(self.interval),
            interval: self.interval.unwrap_or(DEFAULT_INTERVAL),
            uid: None,
            failures: 0,
            status: self.status,
        };
        async move {
            let mut shutdown = pin!(shutdown);
            loop {
                // A heartbeat in flight at shutdown is abandoned: the
                // deregistration that follows supersedes it.
                let delay = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    delay = session.heartbeat() => delay,
                };
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            session.deregister().await;
        }
        .instrument(span)
        .await;
        Ok(())
    }
}

/// What the heartbeats have achieved so far; see [`Heartbeater::status`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The registration's uid per the registry's last answer: set by an
    /// accepted heartbeat, cleared by a refusal or deregistration. Failed
    /// heartbeats leave it alone, as the registration outlives them until
    /// its TTL passes.
    pub uid: Option<String>,
    /// The heartbeat interval the registry last asked for.
    pub interval: Option<Duration>,
    /// How long the registry keeps the registration without heartbeats, per
    /// its last accepted answer.
    pub ttl: Option<Duration>,
    /// The outcome of the latest heartbeat; `None` before the first one.
    pub last: Option<Outcome>,
    /// Heartbeats that failed in a row; any answer from the registry resets it.
    pub consecutive_failures: u32,
    /// The loop has ended and deregistration was attempted.
    pub stopped: bool,
}

/// How one heartbeat went.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The registry recorded the heartbeat.
    Accepted,
    /// The registry answered but did not record the heartbeat, e.g. because
    /// another plugin holds the name. Retried at the interval.
    Refused {
        /// Machine-readable, e.g. `AddressConflict`.
        reason: String,
        /// Human-readable explanation.
        message: String,
    },
    /// The registry could not be reached or the call failed. Retried with
    /// backoff.
    Failed {
        /// The gRPC status code; `DeadlineExceeded` when no answer came in time.
        code: Code,
        /// The error's description.
        message: String,
    },
}

/// The running loop's state.
struct Session {
    client: RegistryClient<Channel>,
    endpoint: Endpoint,
    request: HeartbeatRequest,
    interval: Duration,
    uid: Option<String>,
    failures: u32,
    status: watch::Sender<Status>,
}

impl Session {
    /// Sends one heartbeat and returns how long to wait for the next.
    async fn heartbeat(&mut self) -> Duration {
        let timeout = self.interval.max(MIN_HEARTBEAT_TIMEOUT);
        let call = self.client.heartbeat(self.request.clone());
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => self.answered(reply.into_inner()),
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
        if self.failures > 0 {
            info!(failures = self.failures, "registry reachable again");
            self.failures = 0;
        }
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
                detail = %reply.message,
                retry_in = ?self.interval,
                "kplug refused the heartbeat"
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
    async fn deregister(&mut self) {
        let request = DeregisterRequest {
            name: self.request.name.clone(),
            address: self.request.address.clone(),
        };
        match tokio::time::timeout(DEREGISTER_TIMEOUT, self.client.deregister(request)).await {
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

/// Validates `registry` and configures how it is dialed.
pub(crate) fn endpoint(registry: &str) -> Result<Endpoint, Error> {
    let invalid = |reason: String| Error::InvalidRegistryAddress {
        address: registry.to_owned(),
        reason,
    };
    let trimmed = registry.trim();
    let uri = if trimmed.contains("://") || trimmed.starts_with("unix:") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| invalid(error_chain(&e)))?;
    match endpoint.uri().scheme_str() {
        Some("http") => {}
        Some("https") => return Err(invalid("TLS is not supported yet; use http://".into())),
        other => {
            return Err(invalid(format!(
                "unsupported scheme {:?}; use http://",
                other.unwrap_or_default()
            )));
        }
    }
    if endpoint.uri().host().is_none_or(str::is_empty) {
        return Err(invalid("missing host".into()));
    }
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT))
}

/// `error: cause: cause…`, since tonic's errors keep the detail in sources.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
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
    match root {
        Some(root) => format!("{}: {root}", status.message()),
        None => status.message().to_owned(),
    }
}

/// Registry durations that are absent, negative or zero mean "no opinion";
/// honouring a zero interval would spin.
fn positive(duration: prost_types::Duration) -> Option<Duration> {
    Duration::try_from(duration).ok().filter(|d| !d.is_zero())
}

/// The delay after the `failures`-th failure in a row: doubling from
/// [`INITIAL_BACKOFF`], never beyond the heartbeat interval, so a recovered
/// registry hears from the plugin no later than from a healthy one.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    INITIAL_BACKOFF.saturating_mul(factor).min(interval)
}

/// `duration` ± [`JITTER`].
fn jitter(duration: Duration) -> Duration {
    let factor = 1.0 + JITTER * (2.0 * fastrand::f64() - 1.0);
    // Fails only for durations near Duration::MAX, which need no jitter.
    Duration::try_from_secs_f64(duration.as_secs_f64() * factor).unwrap_or(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_interval() {
        let interval = Duration::from_secs(5);
        let delays: Vec<_> = (1..=7).map(|n| backoff(n, interval)).collect();
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(
            delays,
            [
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000)
            ]
        );
        assert_eq!(backoff(u32::MAX, interval), interval);
        assert_eq!(backoff(1, ms(100)), ms(100));
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(10);
        for _ in 0..1000 {
            let d = jitter(base);
            assert!(
                (Duration::from_secs(9)..=Duration::from_secs(11)).contains(&d),
                "{d:?}"
            );
        }
        // Must not panic where scaling overflows.
        jitter(Duration::MAX);
    }

    #[test]
    fn registry_addresses() {
        for good in [
            "http://127.0.0.1:50051",
            "127.0.0.1:50051",
            "kplug.kplug-system.svc:50051",
            " http://[::1]:50051 ",
        ] {
            assert!(endpoint(good).is_ok(), "{good:?} should be accepted");
        }
        for bad in [
            "",
            "https://kplug:50051",
            "ftp://kplug:21",
            "http://",
            "not a uri",
        ] {
            assert!(
                matches!(endpoint(bad), Err(Error::InvalidRegistryAddress { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn registry_durations() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(
            positive(d(1, 500_000_000)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(positive(d(0, 0)), None);
        assert_eq!(positive(d(-1, 0)), None);
    }
}
