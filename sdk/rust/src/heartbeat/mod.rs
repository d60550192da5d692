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
//!
//! Inside, `session` is the loop's state and what each answer does to it,
//! `timing` the backoff and jitter (pure), `token` the ServiceAccount token
//! file and `endpoint` how the registry is dialed.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use tokio::sync::watch;
use tonic::Code;
use tracing::{Instrument, warn};

use crate::{Error, PluginInfo};
use session::Session;
use token::TokenFile;

mod endpoint;
mod session;
mod timing;
mod token;

pub(crate) use endpoint::endpoint;

/// Assumed until the registry answers; matches the registry's own default.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

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
