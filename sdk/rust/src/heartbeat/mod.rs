//! Keeping the plugin registered: heartbeats into kplug's registry.
//!
//! kplug forgets a plugin that stops heartbeating, so [`Heartbeater::run`]
//! never gives up on an unreachable or refusing registry; it retries and
//! reports what happens through [`Status`].
//!
//! Heartbeats to each replica go as messages on one `Registry.Heartbeats`
//! stream, which costs kplug and the plugin a fraction of a call each. A
//! stream that kplug ended (it does when it shuts down) or whose
//! connection broke between two heartbeats is replaced at the next one,
//! without counting as a failure; a new token opens a new stream, as kplug
//! checks the stream's token for every heartbeat on it. A kplug from before
//! streams answers `UNIMPLEMENTED`, and then gets a `Heartbeat` call each.
//!
//! Against kplug in cluster mode, heartbeats go over TLS
//! ([`Heartbeater::registry_ca`]) and carry a Kubernetes ServiceAccount token
//! ([`Heartbeater::token_file`]); see [`Config`](crate::Config) for the
//! details.
//!
//! # Every kplug replica
//!
//! Each kplug replica keeps its own registry in memory, so the plugin must
//! heartbeat to all of them. When the registry's host is a name, it is
//! resolved ([`SystemResolver`] unless [`Heartbeater::resolver`] says
//! otherwise) and every address it resolves to gets its own heartbeats: a
//! headless Service in front of kplug resolves to one address per ready
//! replica. The name is resolved again every [`RESOLVE_INTERVAL`] (30 s;
//! sooner, with the failure backoff, while it resolves to nothing): new
//! addresses start getting heartbeats at once, vanished ones stop getting
//! them, without a deregistration, as their replica is gone. A failed
//! resolution keeps the replicas known. TLS still verifies kplug's
//! certificate against the host name given, whichever address is dialed.
//! A registry given as an IP address, or a name that resolves to a single
//! address (a ClusterIP Service), gets one set of heartbeats, as before.
//! [`Status`] sums the replicas up: the plugin counts as registered as soon
//! as one replica accepted it, and [`Status::replicas`] tells them apart.
//!
//! # Instances and shutdown
//!
//! Several processes (pods) may serve one plugin, each heartbeating under
//! the plugin's name with its own [`instance`](Heartbeater::instance) and
//! address; kplug spreads calls over the ready ones. On shutdown,
//! [`Heartbeats::drain`] tells every replica that this instance is
//! draining, so that kplug sends it no new calls while the ones in flight
//! finish; [`Heartbeats::stop`] deregisters it afterwards. A kplug without
//! the `Instances` capability ignores `draining`: the instance deregisters
//! from it at `drain` instead, as plugins did before instances.
//!
//! Inside, `fleet` follows the replicas and walks them through shutdown,
//! `session` heartbeats to one replica, `status` sums them up, `resolve`
//! finds the replicas, `timing` has the backoff and jitter (pure), `token`
//! the ServiceAccount token file and `endpoint` how the registry is dialed.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, warn};

use crate::identity::IssuedIdentity;
use crate::{Error, PluginInfo};
use fleet::Fleet;
use session::Phase;

mod calls;
mod endpoint;
mod fleet;
mod resolve;
mod session;
mod status;
mod timing;
mod token;

pub(crate) use endpoint::Target;
pub use fleet::{DRAIN_NOTICE_TIMEOUT, Heartbeats};
pub use resolve::{Resolve, Resolving, SystemResolver};
pub use status::{Outcome, Replica, Status};

/// Assumed until the registry answers; matches the registry's own default.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// How often the registry's host name is resolved again to follow kplug's
/// replicas coming and going; see [`Heartbeater::resolve_interval`]. Fixed
/// rather than tied to the heartbeat interval, so a registry that asks for
/// frequent heartbeats does not turn into frequent DNS lookups too.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(30);

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
    instance: String,
    server_name: String,
    canary_weight: u32,
    shadow_percent: u32,
    resolver: Arc<dyn Resolve>,
    resolve_interval: Duration,
    identity: Option<Arc<IssuedIdentity>>,
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
            .field("instance", &self.instance)
            .field("server_name", &self.server_name)
            .field("canary_weight", &self.canary_weight)
            .field("shadow_percent", &self.shadow_percent)
            .field("resolve_interval", &self.resolve_interval)
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
            instance: String::new(),
            server_name: String::new(),
            canary_weight: 0,
            shadow_percent: 0,
            resolver: Arc::new(SystemResolver),
            resolve_interval: RESOLVE_INTERVAL,
            identity: None,
            status: watch::Sender::new(Status::default()),
        }
    }

    /// Names the instance of the plugin this process is, e.g. its pod's
    /// name, in every heartbeat and the deregistration. Empty, the default
    /// here, means the address names the instance, as before instances;
    /// [`Config`](crate::Config) defaults to [`default_instance`].
    #[must_use]
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The name kplug verifies in the plugin's serving certificate when it
    /// calls over TLS, sent with every heartbeat; empty, the default, means
    /// the host of the advertised address.
    #[must_use]
    pub fn server_name(mut self, server_name: impl Into<String>) -> Self {
        self.server_name = server_name.into();
        self
    }

    /// Declares this instance a canary of the plugin's next version, taking
    /// `percent` (1-99) of the plugin's objects; 0, the default, is a
    /// stable instance. See [`Config`](crate::Config)'s `--canary-weight`.
    #[must_use]
    pub fn canary_weight(mut self, percent: u32) -> Self {
        self.canary_weight = percent;
        self
    }

    /// Declares this instance a shadow of the plugin's next version,
    /// receiving dry-run copies of `percent` (1-100) of the plugin's
    /// reconciles; 0, the default, is not a shadow. See
    /// [`Config`](crate::Config)'s `--shadow`.
    #[must_use]
    pub fn shadow_percent(mut self, percent: u32) -> Self {
        self.shadow_percent = percent;
        self
    }

    /// Asks kplug for the certificate of `identity` on heartbeats, and
    /// declares its name as the server name kplug verifies.
    #[must_use]
    pub(crate) fn identity(mut self, identity: Arc<IssuedIdentity>) -> Self {
        self.server_name = identity.name().to_owned();
        self.identity = Some(identity);
        self
    }

    /// Resolves the registry's host with `resolver` instead of the
    /// system's; see [`Resolve`].
    #[must_use]
    pub fn resolver(mut self, resolver: impl Resolve) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// How often the registry's host name is resolved again to follow
    /// kplug's replicas; [`RESOLVE_INTERVAL`] by default, and zero is
    /// ignored. Without effect for a registry given as an IP address.
    #[must_use]
    pub fn resolve_interval(mut self, interval: Duration) -> Self {
        if !interval.is_zero() {
            self.resolve_interval = interval;
        }
        self
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
    /// There is no draining step here; a program that serves calls itself
    /// and wants kplug to stop sending them before it stops accepting uses
    /// [`start`](Self::start).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRegistryAddress`] when the registry address cannot
    /// be dialed, [`Error::RegistryTls`] for an `https://` registry without
    /// a usable [`registry_ca`](Self::registry_ca); nothing is sent then.
    /// [`Error::Task`] if the heartbeats panic.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let mut heartbeats = self.start()?;
        let shutdown = pin!(shutdown);
        tokio::select! {
            biased;
            () = shutdown => {}
            ended = heartbeats.ended() => return ended,
        }
        heartbeats.stop().await
    }

    /// Starts heartbeating in the background; the returned handle drains
    /// and stops it. Must be called within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run), before anything is sent.
    pub fn start(self) -> Result<Heartbeats, Error> {
        let target = Target::parse(&self.registry, self.registry_ca.as_deref())?;
        let span =
            tracing::info_span!("heartbeat", plugin = %self.info.name, registry = %self.registry);
        span.in_scope(|| {
            if target.is_plain() && self.registry_ca.is_some() {
                warn!("ignoring the registry CA: the registry address is plain http://");
            }
            if let Some(token_file) = self.token_file.as_ref().filter(|_| target.is_plain()) {
                warn!(
                    token_file = %token_file.display(),
                    "sending the ServiceAccount token over plain http://; use https://"
                );
            }
        });
        let mut request = self.info.heartbeat_request(self.interval);
        request.instance = self.instance;
        request.server_name = self.server_name;
        request.canary_weight = self.canary_weight;
        request.shadow_percent = self.shadow_percent;
        let status = Arc::new(self.status);
        let (phase, phase_receiver) = watch::channel(Phase::Serving);
        let fleet = Fleet {
            target,
            request,
            interval: self.interval.unwrap_or(DEFAULT_INTERVAL),
            token_file: self.token_file,
            resolver: self.resolver,
            resolve_interval: self.resolve_interval,
            identity: self.identity,
            status: Arc::clone(&status),
            sessions: BTreeMap::new(),
            failures: 0,
        };
        let task = tokio::spawn(fleet.run(phase_receiver).instrument(span));
        Ok(Heartbeats {
            phase,
            status,
            task: Some(AbortOnDropHandle::new(task)),
        })
    }
}

/// The instance name [`Config`](crate::Config) uses when none is given:
/// the `POD_NAME` environment variable (set it from the pod's
/// `metadata.name` with the downward API), else none, so that the address
/// names the instance. Not the host name: processes on one machine, or
/// pods with `hostNetwork`, share it and would take turns being one
/// instance.
pub fn default_instance() -> String {
    choose_instance(std::env::var("POD_NAME").ok())
}

/// `pod_name` unless blank.
fn choose_instance(pod_name: Option<String>) -> String {
    pod_name
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_defaults() {
        assert_eq!(choose_instance(Some("pod-1\n".to_owned())), "pod-1");
        assert_eq!(choose_instance(Some(" ".to_owned())), "");
        assert_eq!(choose_instance(None), "");
    }
}
