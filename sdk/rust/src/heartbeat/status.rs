//! What the heartbeats report: one [`Replica`] per kplug replica heartbeated
//! to, and the [`Status`] that sums them up. The summary is pure, so it is
//! tested without a registry.

use std::net::SocketAddr;
use std::time::Duration;

use tonic::Code;

/// What the heartbeats have achieved so far; see
/// [`Heartbeater::status`](super::Heartbeater::status).
///
/// kplug may run as several replicas, each with its own registry in memory;
/// the SDK heartbeats to every one of them ([`replicas`](Self::replicas)).
/// The other fields sum them up so that, with a single registry address,
/// they read as that registry's: the plugin counts as registered (`uid` is
/// set, `last` is [`Outcome::Accepted`]) as soon as at least one replica
/// accepted it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The registration's uid per the registry's last answer: set by an
    /// accepted heartbeat, cleared by a refusal or deregistration. Failed
    /// heartbeats leave it alone, as the registration outlives them until
    /// its TTL passes. With several replicas, the uid at the first replica
    /// (by address) that accepted the plugin.
    pub uid: Option<String>,
    /// The heartbeat interval the registry last asked for.
    pub interval: Option<Duration>,
    /// How long the registry keeps the registration without heartbeats, per
    /// its last accepted answer.
    pub ttl: Option<Duration>,
    /// The outcome of the latest heartbeat; `None` before the first one.
    /// With several replicas: `Accepted` when any replica accepted the
    /// plugin, else a refusal when any refused it, else a failure. A
    /// registry host name that does not resolve is a failure too, with the
    /// code `Unavailable`.
    pub last: Option<Outcome>,
    /// Heartbeats that failed in a row; any answer from the registry resets
    /// it. With several replicas, the fewest of any replica.
    pub consecutive_failures: u32,
    /// The loop has ended and deregistration was attempted.
    pub stopped: bool,
    /// Shutdown has begun: heartbeats tell kplug that this instance is
    /// draining, so that it sends no new calls.
    pub draining: bool,
    /// One entry per kplug replica heartbeated to, by address: the
    /// addresses the registry's host name resolves to (a headless Service
    /// has one per replica), or the one address given.
    pub replicas: Vec<Replica>,
}

/// How heartbeating to one kplug replica goes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replica {
    /// The replica's address, as resolved from the registry's host.
    pub address: SocketAddr,
    /// The registration's uid at this replica; see [`Status::uid`].
    pub uid: Option<String>,
    /// The heartbeat interval this replica last asked for.
    pub interval: Option<Duration>,
    /// This replica's TTL, per its last accepted answer.
    pub ttl: Option<Duration>,
    /// The outcome of the latest heartbeat to this replica.
    pub last: Option<Outcome>,
    /// Heartbeats to this replica that failed in a row.
    pub consecutive_failures: u32,
    /// The replica announced the `Instances` capability in its last
    /// answer: it tells instances of a plugin apart and honours `draining`.
    /// Without it (kplug before instances, or no answer yet), shutdown
    /// deregisters from it before draining calls.
    pub instances: bool,
    /// Once shutdown has begun: this replica has been told that the
    /// instance is draining (or deregistered from it), or that was tried
    /// and failed, or there was nothing to tell.
    pub drain_notified: bool,
}

impl Replica {
    pub(super) fn new(address: SocketAddr) -> Self {
        Self {
            address,
            uid: None,
            interval: None,
            ttl: None,
            last: None,
            consecutive_failures: 0,
            instances: false,
            drain_notified: false,
        }
    }
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

impl Outcome {
    /// Ranks outcomes for the summary: accepted beats refused beats failed
    /// beats nothing yet.
    fn rank(outcome: Option<&Self>) -> u8 {
        match outcome {
            Some(Self::Accepted) => 3,
            Some(Self::Refused { .. }) => 2,
            Some(Self::Failed { .. }) => 1,
            None => 0,
        }
    }
}

impl Status {
    /// Updates the replica at `address`, if it is still followed, and the
    /// summary.
    pub(super) fn update_replica(
        &mut self,
        address: SocketAddr,
        update: impl FnOnce(&mut Replica),
    ) {
        if let Some(replica) = self.replicas.iter_mut().find(|r| r.address == address) {
            update(replica);
            self.summarize();
        }
    }

    /// Sums the replicas up in the top-level fields. Without replicas (the
    /// host has not resolved yet) these are left as the resolution set them.
    pub(super) fn summarize(&mut self) {
        // The first best: `max_by_key` would pick the last of equals.
        let Some(best) = self
            .replicas
            .iter()
            .fold(None, |best: Option<&Replica>, r| match best {
                Some(b) if Outcome::rank(b.last.as_ref()) >= Outcome::rank(r.last.as_ref()) => {
                    Some(b)
                }
                _ => Some(r),
            })
        else {
            self.uid = None;
            return;
        };
        self.uid.clone_from(&best.uid);
        self.interval = best.interval.or(self.interval);
        self.ttl = best.ttl.or(self.ttl);
        self.last.clone_from(&best.last);
        self.consecutive_failures = self
            .replicas
            .iter()
            .map(|r| r.consecutive_failures)
            .min()
            .unwrap_or_default();
    }

    /// Replicas whose last heartbeat was accepted.
    pub fn accepted_by(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.last == Some(Outcome::Accepted))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(port: u16, last: Option<Outcome>, failures: u32) -> Replica {
        let mut replica = Replica::new(SocketAddr::from(([127, 0, 0, 1], port)));
        replica.uid = matches!(last, Some(Outcome::Accepted)).then(|| format!("uid-{port}"));
        replica.last = last;
        replica.consecutive_failures = failures;
        replica.interval = Some(Duration::from_secs(u64::from(port)));
        replica
    }

    fn failed() -> Option<Outcome> {
        Some(Outcome::Failed {
            code: Code::Unavailable,
            message: "down".into(),
        })
    }

    fn refused() -> Option<Outcome> {
        Some(Outcome::Refused {
            reason: "AddressConflict".into(),
            message: "taken".into(),
        })
    }

    #[test]
    fn one_accepting_replica_is_enough() {
        let mut status = Status {
            replicas: vec![
                replica(1, failed(), 4),
                replica(2, Some(Outcome::Accepted), 0),
            ],
            ..Status::default()
        };
        status.summarize();
        assert_eq!(status.uid.as_deref(), Some("uid-2"));
        assert_eq!(status.last, Some(Outcome::Accepted));
        assert_eq!(status.interval, Some(Duration::from_secs(2)));
        assert_eq!(status.consecutive_failures, 0);
        assert_eq!(status.accepted_by(), 1);

        // The first of equals: uids stay put while both accept.
        status.update_replica(SocketAddr::from(([127, 0, 0, 1], 1)), |r| {
            *r = replica(1, Some(Outcome::Accepted), 0);
        });
        assert_eq!(status.uid.as_deref(), Some("uid-1"));
        assert_eq!(status.accepted_by(), 2);
    }

    #[test]
    fn without_acceptance_refusals_come_before_failures() {
        let mut status = Status {
            replicas: vec![replica(1, failed(), 3), replica(2, refused(), 0)],
            ..Status::default()
        };
        status.summarize();
        assert_eq!(status.last, refused());
        assert_eq!(status.uid, None);

        let mut status = Status {
            replicas: vec![replica(1, failed(), 3), replica(2, failed(), 5)],
            ..Status::default()
        };
        status.summarize();
        assert_eq!(status.last, failed());
        assert_eq!(status.consecutive_failures, 3);
    }

    #[test]
    fn a_single_replica_reads_as_itself() {
        let only = replica(7, refused(), 0);
        let mut status = Status {
            uid: Some("stale".into()),
            replicas: vec![only.clone()],
            ..Status::default()
        };
        status.summarize();
        assert_eq!(status.uid, only.uid);
        assert_eq!(status.last, only.last);
        assert_eq!(status.interval, only.interval);

        // Updates to addresses no longer followed are dropped.
        status.update_replica(SocketAddr::from(([127, 0, 0, 9], 9)), |r| {
            r.last = Some(Outcome::Accepted);
        });
        assert_eq!(status.last, only.last);
    }

    #[test]
    fn without_replicas_the_resolution_speaks() {
        let mut status = Status {
            uid: Some("stale".into()),
            last: failed(),
            consecutive_failures: 2,
            ..Status::default()
        };
        status.summarize();
        assert_eq!(status.uid, None);
        assert_eq!(status.last, failed());
        assert_eq!(status.consecutive_failures, 2);
    }
}
