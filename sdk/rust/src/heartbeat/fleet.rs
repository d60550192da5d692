//! Heartbeating to every kplug replica: the registry's host resolved again
//! and again, a [`Session`] per address it resolves to, and the handle that
//! walks them through shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kplug_proto::v1alpha1::HeartbeatRequest;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;
use tracing::{Instrument, debug, info, info_span, warn};

use super::endpoint::{Host, Target};
use super::resolve::{Resolve, changes};
use super::session::{Phase, Session, next};
use super::status::{Outcome, Replica, Status};
use super::timing::{backoff, jitter};
use super::token::TokenFile;
use crate::Error;
use crate::identity::IssuedIdentity;

/// How long [`Heartbeats::drain`] waits at most for every replica to take
/// note that the instance is draining: a kplug that is down does not hold
/// shutdown up for longer.
pub const DRAIN_NOTICE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bounds one resolution of the registry's host, so that a wedged resolver
/// cannot stop the following of replicas for good.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The replicas followed, and how to heartbeat to new ones.
pub(super) struct Fleet {
    pub(super) target: Target,
    pub(super) request: HeartbeatRequest,
    /// The interval asked for, or the default, until a registry answers.
    pub(super) interval: Duration,
    pub(super) token_file: Option<PathBuf>,
    pub(super) resolver: Arc<dyn Resolve>,
    pub(super) resolve_interval: Duration,
    pub(super) identity: Option<Arc<IssuedIdentity>>,
    pub(super) status: Arc<watch::Sender<Status>>,
    pub(super) sessions: BTreeMap<SocketAddr, AbortOnDropHandle<()>>,
    /// Resolutions that failed in a row.
    pub(super) failures: u32,
}

impl Fleet {
    /// Follows the replicas while serving, then waits for the sessions to
    /// deregister once stopping.
    pub(super) async fn run(mut self, mut phase: watch::Receiver<Phase>) {
        match self.target.host.clone() {
            Host::Ip(ip) => {
                let address = SocketAddr::new(ip, self.target.port);
                self.follow(&[address], &phase);
            }
            Host::Name(name) => self.keep_resolving(&name, &mut phase).await,
        }
        // Draining: replicas that come now never had the instance.
        let mut current = *phase.borrow_and_update();
        while current != Phase::Stopping {
            current = next(&mut phase).await;
        }
        // Each session deregisters within its own time limit.
        for session in self.sessions.values_mut() {
            if let Err(error) = session.await {
                warn!(%error, "a heartbeat session ended abnormally");
            }
        }
        self.status.send_modify(|status| {
            status.summarize();
            status.uid = None;
            status.stopped = true;
        });
    }

    /// Resolves `name` at the resolve interval, following the replicas it
    /// names, until draining begins.
    async fn keep_resolving(&mut self, name: &str, phase: &mut watch::Receiver<Phase>) {
        let mut current = *phase.borrow_and_update();
        while current == Phase::Serving {
            let resolving = self.resolver.resolve(name, self.target.port);
            let resolved = tokio::select! {
                biased;
                moved = next(phase) => {
                    current = moved;
                    continue;
                }
                resolved = tokio::time::timeout(RESOLVE_TIMEOUT, resolving) => resolved,
            };
            let delay = match resolved {
                Ok(Ok(addresses)) if !addresses.is_empty() => {
                    if self.failures > 0 {
                        info!(
                            failures = self.failures,
                            "the registry's host resolves again"
                        );
                        self.failures = 0;
                    }
                    self.follow(&addresses, phase);
                    self.resolve_interval
                }
                failed => {
                    let message = match failed {
                        Ok(Ok(_)) => format!("{name} resolves to no address"),
                        Ok(Err(error)) => format!("cannot resolve {name}: {error}"),
                        Err(_) => {
                            format!("cannot resolve {name}: no answer within {RESOLVE_TIMEOUT:?}")
                        }
                    };
                    self.unresolved(message)
                }
            };
            tokio::select! {
                biased;
                moved = next(phase) => current = moved,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// A failed resolution: the replicas followed stay (DNS hiccups are
    /// common); without any, it is the plugin's status, retried with backoff.
    fn unresolved(&mut self, message: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        if !self.sessions.is_empty() {
            warn!(error = %message, replicas = self.sessions.len(), "keeping the replicas known");
            return self.resolve_interval;
        }
        let delay = jitter(backoff(
            self.failures,
            self.interval.min(self.resolve_interval),
        ));
        warn!(error = %message, failures = self.failures, retry_in = ?delay, "heartbeat failed");
        let failures = self.failures;
        self.status.send_modify(|status| {
            status.last = Some(Outcome::Failed {
                code: Code::Unavailable,
                message,
            });
            status.consecutive_failures = failures;
        });
        delay
    }

    /// Starts sessions for new addresses and ends those of vanished ones,
    /// without deregistering: their replica is gone.
    fn follow(&mut self, addresses: &[SocketAddr], phase: &watch::Receiver<Phase>) {
        let current: BTreeSet<SocketAddr> = self.sessions.keys().copied().collect();
        let changes = changes(&current, addresses);
        if changes.added.is_empty() && changes.removed.is_empty() {
            return;
        }
        if current.is_empty() && changes.added.len() == 1 {
            debug!(address = %changes.added[0], "heartbeating to the registry");
        } else {
            info!(added = ?changes.added, removed = ?changes.removed, "following kplug's replicas");
        }
        for address in &changes.removed {
            // Dropping the handle aborts the session.
            self.sessions.remove(address);
        }
        let mut started = Vec::new();
        for &address in &changes.added {
            let endpoint = match self.target.endpoint(address) {
                Ok(endpoint) => endpoint,
                Err(error) => {
                    warn!(%address, %error, "cannot dial this replica");
                    continue;
                }
            };
            let session = Session::new(
                address,
                endpoint,
                self.request.clone(),
                self.interval,
                self.token_file.clone().map(TokenFile::new),
                self.identity.clone(),
                Arc::clone(&self.status),
            );
            let span = info_span!("replica", %address);
            let task = tokio::spawn(session.run(phase.clone()).instrument(span));
            self.sessions.insert(address, AbortOnDropHandle::new(task));
            started.push(address);
        }
        self.status.send_modify(|status| {
            status
                .replicas
                .retain(|replica| !changes.removed.contains(&replica.address));
            status
                .replicas
                .extend(started.into_iter().map(Replica::new));
            status.replicas.sort_by_key(|replica| replica.address);
            status.summarize();
        });
    }
}

/// Heartbeats running in the background, from
/// [`Heartbeater::start`](super::Heartbeater::start), for programs that
/// serve kplug's Plugin service themselves and want the SDK's shutdown
/// order:
///
/// 1. [`drain`](Self::drain): every kplug replica is told that the
///    instance is draining, so that it sends no new calls;
/// 2. the program stops accepting connections and finishes the calls in
///    flight;
/// 3. [`stop`](Self::stop): the instance deregisters.
///
/// Dropped without [`stop`](Self::stop), the heartbeats end without
/// deregistering: kplug forgets the instance when its TTL passes.
#[derive(Debug)]
pub struct Heartbeats {
    pub(super) phase: watch::Sender<Phase>,
    pub(super) status: Arc<watch::Sender<Status>>,
    /// `None` once it ended.
    pub(super) task: Option<AbortOnDropHandle<()>>,
}

impl Heartbeats {
    /// Observes the heartbeats; see [`Status`].
    #[must_use]
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Tells every kplug replica that this instance is shutting down: a
    /// heartbeat with `draining` set goes out at once (and later ones say
    /// so too), after which kplug routes no new calls here. A replica not
    /// known to have the `Instances` capability (kplug before instances,
    /// or one that has not answered yet) might ignore it, so the instance
    /// deregisters from it instead. Replicas that appear from now on are
    /// not followed.
    ///
    /// Returns once every replica has taken note (or could not be told),
    /// and after [`DRAIN_NOTICE_TIMEOUT`] at most, so an unreachable kplug
    /// does not hold shutdown up. Calls keep being served meanwhile.
    pub async fn drain(&mut self) {
        if !self.advance(Phase::Draining) {
            return;
        }
        self.status.send_modify(|status| status.draining = true);
        let mut status = self.status.subscribe();
        let noted = status.wait_for(|s| s.replicas.iter().all(|r| r.drain_notified));
        match tokio::time::timeout(DRAIN_NOTICE_TIMEOUT, noted).await {
            Ok(_) => debug!("every kplug replica knows the instance is draining"),
            Err(_) => warn!(
                timeout = ?DRAIN_NOTICE_TIMEOUT,
                "not every kplug replica took note of the draining in time; going on"
            ),
        }
    }

    /// Stops heartbeating (abandoning heartbeats in flight) and deregisters
    /// from every replica, each within a few seconds.
    ///
    /// # Errors
    ///
    /// [`Error::Task`] when the heartbeats had panicked.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.advance(Phase::Stopping);
        match self.task.take() {
            Some(task) => task.await.map_err(Error::Task),
            None => Ok(()),
        }
    }

    /// Resolves only if the heartbeats end before [`stop`](Self::stop),
    /// which takes a panic.
    pub(crate) async fn ended(&mut self) -> Result<(), Error> {
        match &mut self.task {
            Some(task) => {
                let ended = task.await;
                self.task = None;
                ended.map_err(Error::Task)
            }
            None => std::future::pending().await,
        }
    }

    /// Moves shutdown forward to `phase`; false when it is there already.
    fn advance(&self, phase: Phase) -> bool {
        self.phase.send_if_modified(|current| {
            let forward = phase > *current;
            if forward {
                *current = phase;
            }
            forward
        })
    }
}
