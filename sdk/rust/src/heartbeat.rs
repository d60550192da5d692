//! Keeping the plugin registered: heartbeats into kplug's registry.
//!
//! kplug forgets a plugin that stops heartbeating, so [`Heartbeater::run`]
//! never gives up on an unreachable or refusing registry; it retries and
//! reports what happens through [`Status`].
//!
//! Against kplug in cluster mode, heartbeats go over TLS
//! ([`Heartbeater::registry_ca`]) and carry a Kubernetes ServiceAccount token
//! ([`Heartbeater::token_file`]); see [`Config`](crate::Config) for the
//! details.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{DeregisterRequest, HeartbeatRequest, HeartbeatResponse};
use tokio::sync::watch;
use tonic::Code;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
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
///
/// Against kplug in cluster mode:
///
/// ```no_run
/// # use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
/// # async fn example(info: PluginInfo) -> Result<(), Box<dyn std::error::Error>> {
/// let ca = std::fs::read("/var/run/kplug/ca/ca.crt")?;
/// Heartbeater::new("https://kplug.kplug-system.svc:8444", info)
///     .registry_ca(ca)
///     .token_file("/var/run/secrets/kplug/token")
///     .run(kplug_sdk::shutdown_signal()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct Heartbeater {
    registry: String,
    info: PluginInfo,
    interval: Option<Duration>,
    token_file: Option<PathBuf>,
    registry_ca: Option<Vec<u8>>,
    status: watch::Sender<Status>,
}

impl fmt::Debug for Heartbeater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeater")
            .field("registry", &self.registry)
            .field("info", &self.info)
            .field("interval", &self.interval)
            .field("token_file", &self.token_file)
            .field("registry_ca", &self.registry_ca.as_ref().map(|_| "PEM"))
            .finish_non_exhaustive()
    }
}

impl Heartbeater {
    /// Heartbeats `info` into the registry at `registry`, e.g.
    /// `http://127.0.0.1:50051`. A bare `host:port` means plain HTTP/2;
    /// `https://` needs [`registry_ca`](Self::registry_ca).
    ///
    /// The address is checked by [`run`](Self::run).
    pub fn new(registry: impl Into<String>, info: PluginInfo) -> Self {
        Self {
            registry: registry.into(),
            info,
            interval: None,
            token_file: None,
            registry_ca: None,
            status: watch::Sender::new(Status::default()),
        }
    }

    /// Sends the Kubernetes ServiceAccount token in the file at `path` as
    /// `authorization: Bearer <token>` with every heartbeat and the
    /// deregistration, as kplug in cluster mode requires.
    ///
    /// The file is read afresh each time, because the kubelet rotates
    /// projected tokens. When it cannot be read (or is empty) that is
    /// logged and the heartbeat goes out without a token, so that kplug's
    /// refusal shows in [`Status`] and the plugin recovers by itself once
    /// the file appears.
    #[must_use]
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Trusts the CA certificate(s) in `pem` (PEM-encoded) for an
    /// `https://` registry: the CA that signed kplug's serving certificate,
    /// e.g. from the `kplug-ca` ConfigMap. The certificate must be valid for
    /// the registry URL's host. Required for `https://`, as no other roots
    /// are trusted; ignored (with a warning) for `http://`.
    #[must_use]
    pub fn registry_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.registry_ca = Some(pem.into());
        self
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
    /// registry asks for. Failures are retried with exponential backoff;
    /// refusals, including gRPC's `UNAUTHENTICATED` and `PERMISSION_DENIED`,
    /// at the interval. So this only returns early when the registry
    /// address or its TLS settings are invalid.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRegistryAddress`] when the registry address cannot
    /// be dialed, [`Error::RegistryTls`] for an `https://` registry without
    /// a usable [`registry_ca`](Self::registry_ca); nothing is sent then.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let endpoint = endpoint(&self.registry, self.registry_ca.as_deref())?;
        let span =
            tracing::info_span!("heartbeat", plugin = %self.info.name, registry = %self.registry);
        let plain = endpoint.uri().scheme_str() == Some("http");
        let ca_ignored = plain && self.registry_ca.is_some();
        let mut session = Session {
            client: RegistryClient::new(endpoint.connect_lazy()),
            endpoint,
            request: self.info.heartbeat_request(self.interval),
            interval: self.interval.unwrap_or(DEFAULT_INTERVAL),
            token: self.token_file.map(TokenFile::new),
            uid: None,
            failures: 0,
            status: self.status,
        };
        async move {
            if ca_ignored {
                warn!("ignoring the registry CA: the registry address is plain http://");
            }
            if let Some(token) = session.token.as_ref().filter(|_| plain) {
                warn!(
                    token_file = %token.path.display(),
                    "sending the ServiceAccount token over plain http://; use https://"
                );
            }
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
    /// another plugin holds the name, or refused the call as
    /// `UNAUTHENTICATED` (no or an invalid ServiceAccount token) or
    /// `PERMISSION_DENIED` (the token's identity may not heartbeat under
    /// this name). Retried at the interval.
    Refused {
        /// Machine-readable, e.g. `AddressConflict`; `Unauthenticated` and
        /// `PermissionDenied` for the gRPC refusals.
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
    token: Option<TokenFile>,
    uid: Option<String>,
    failures: u32,
    status: watch::Sender<Status>,
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
    async fn heartbeat(&mut self) -> Duration {
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
    async fn deregister(&mut self) {
        let message = DeregisterRequest {
            name: self.request.name.clone(),
            address: self.request.address.clone(),
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

/// The ServiceAccount token file, read for every call.
struct TokenFile {
    path: PathBuf,
    /// What was wrong with the file last time, so that a lasting problem is
    /// logged once at warn rather than with every heartbeat.
    problem: Option<String>,
}

impl TokenFile {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            problem: None,
        }
    }

    /// `Bearer <token>`, or `None` (logged) when the file cannot be used.
    async fn authorization(&mut self) -> Option<AsciiMetadataValue> {
        match read_token(&self.path).await {
            Ok(value) => {
                if self.problem.take().is_some() {
                    info!(token_file = %self.path.display(), "the token file is usable again");
                }
                Some(value)
            }
            Err(problem) => {
                if self.problem.as_ref() == Some(&problem) {
                    debug!(token_file = %self.path.display(), %problem, "heartbeating without a token");
                } else {
                    warn!(
                        token_file = %self.path.display(),
                        %problem,
                        "cannot use the ServiceAccount token file; sending without a token, \
                         which kplug in cluster mode refuses"
                    );
                    self.problem = Some(problem);
                }
                None
            }
        }
    }
}

/// The `authorization` value for the token in `path`.
async fn read_token(path: &Path) -> Result<AsciiMetadataValue, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|error| error.to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_owned());
    }
    let mut value = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token has characters a gRPC header cannot carry".to_owned())?;
    // Kept out of HTTP/2 header compression tables.
    value.set_sensitive(true);
    Ok(value)
}

/// Validates `registry` and configures how it is dialed: plain HTTP/2, or
/// TLS trusting the PEM certificates in `ca` for `https://`.
pub(crate) fn endpoint(registry: &str, ca: Option<&[u8]>) -> Result<Endpoint, Error> {
    let invalid = |reason: String| Error::InvalidRegistryAddress {
        address: registry.to_owned(),
        reason,
    };
    let tls_error = |reason: String| Error::RegistryTls {
        address: registry.to_owned(),
        reason,
    };
    let trimmed = registry.trim();
    let uri = if trimmed.contains("://") || trimmed.starts_with("unix:") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let mut endpoint = Endpoint::from_shared(uri).map_err(|e| invalid(error_chain(&e)))?;
    let scheme = endpoint.uri().scheme_str().unwrap_or_default().to_owned();
    if !matches!(scheme.as_str(), "http" | "https") {
        return Err(invalid(format!(
            "unsupported scheme {scheme:?}; use http:// or https://"
        )));
    }
    let host = match endpoint.uri().host() {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => return Err(invalid("missing host".into())),
    };
    if scheme == "https" {
        let Some(pem) = ca else {
            return Err(tls_error(
                "no CA to verify kplug's certificate with: set --registry-ca-file \
                 (KPLUG_REGISTRY_CA_FILE) to the PEM of the CA that signed it, e.g. from \
                 the kplug-ca ConfigMap"
                    .into(),
            ));
        };
        let certificates = rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_error(format!("the registry CA is not valid PEM: {e}")))?;
        if certificates.is_empty() {
            return Err(tls_error(
                "the registry CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        // The certificate must name the host dialed; IPv6 without brackets.
        let domain = host.trim_start_matches('[').trim_end_matches(']');
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem))
            .domain_name(domain);
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| tls_error(error_chain(&e)))?;
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
    match root.map(ToString::to_string) {
        Some(root) if !status.message().contains(&root) => format!("{}: {root}", status.message()),
        _ => status.message().to_owned(),
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
            assert!(endpoint(good, None).is_ok(), "{good:?} should be accepted");
        }
        for bad in ["", "ftp://kplug:21", "http://", "https://", "not a uri"] {
            assert!(
                matches!(
                    endpoint(bad, Some(b"")),
                    Err(Error::InvalidRegistryAddress { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }

    #[tokio::test]
    async fn token_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let read = |contents: &str| {
            std::fs::write(&path, contents).unwrap();
            read_token(&path)
        };
        let value = read(" abc.def-ghi\n").await.unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer abc.def-ghi");
        assert!(value.is_sensitive());
        assert_eq!(read(" \n").await.unwrap_err(), "the file is empty");
        assert!(read("a\nb").await.unwrap_err().contains("characters"));
        assert!(read_token(&dir.path().join("missing")).await.is_err());
    }

    #[test]
    fn https_needs_a_usable_ca() {
        let reason = |ca: Option<&[u8]>| match endpoint("https://kplug:8444", ca) {
            Err(Error::RegistryTls { reason, .. }) => reason,
            other => panic!("expected a TLS error, got {other:?}"),
        };
        assert!(reason(None).contains("--registry-ca-file"));
        assert!(reason(Some(b"")).contains("no PEM certificate"));
        assert!(reason(Some(b"not pem at all")).contains("no PEM certificate"));
        let broken = b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        assert!(reason(Some(broken)).contains("not valid PEM"));
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
