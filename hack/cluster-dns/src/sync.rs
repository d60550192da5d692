//! The Kubernetes side: watches of all Services and Endpoints (kube's
//! reflectors), and a new [`Zone`] after every change once both have
//! listed everything.

use std::pin::pin;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::zone::Zone;

/// Why the watches stopped (they retry failures with backoff, so only an
/// end of their streams stops them).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("the watch of Services and Endpoints ended")]
    WatchEnded,
}

/// What one event of either watch did to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// An object was added, changed or deleted.
    Changed,
    /// A (re)list is complete: the store holds everything listed.
    Listed,
    /// Nothing yet (a list in progress, or a failure that is retried).
    Nothing,
}

/// The [`Step`] of an event of the watch of `kind`.
fn step<K>(kind: Kind) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> (Kind, Step) {
    move |event| {
        let step = match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Step::Changed,
            Ok(watcher::Event::InitDone) => Step::Listed,
            // The store changes at InitDone, when the list is complete.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Step::Nothing,
            Err(error) => {
                // The watcher retries with backoff; what is served meanwhile
                // is the last complete state (or SERVFAIL before the first).
                warn!(%error, "watching {kind:?} failed; retrying");
                Step::Nothing
            }
        };
        (kind, step)
    }
}

/// What the watches have done so far.
#[derive(Default)]
struct Progress {
    services_listed: bool,
    endpoints_listed: bool,
}

impl Progress {
    /// Notes one step of the watch of `kind`; true when its store changed.
    fn note(&mut self, (kind, step): (Kind, Step)) -> bool {
        if step == Step::Listed {
            match kind {
                Kind::Services => self.services_listed = true,
                Kind::Endpoints => self.endpoints_listed = true,
            }
        }
        step != Step::Nothing
    }

    fn listed(&self) -> bool {
        self.services_listed && self.endpoints_listed
    }
}

/// Which watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Services,
    Endpoints,
}

/// Watches Services and Endpoints in all namespaces and sends a new zone
/// for `domain` to `publish` after each change, once both are listed;
/// returns only if a watch ends.
pub async fn run(
    client: Client,
    domain: Name,
    ttl: u32,
    publish: watch::Sender<Option<Arc<Zone>>>,
) -> Result<(), SyncError> {
    let (services, services_writer) = reflector::store::<Service>();
    let (endpoints, endpoints_writer) = reflector::store::<Endpoints>();
    let service_events = reflector::reflector(
        services_writer,
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map(step(Kind::Services));
    let endpoint_events = reflector::reflector(
        endpoints_writer,
        watcher(Api::<Endpoints>::all(client), watcher::Config::default()),
    )
    .default_backoff()
    .map(step(Kind::Endpoints));
    let mut events = pin!(futures::stream::select(service_events, endpoint_events));

    let mut progress = Progress::default();
    let mut serial: u32 = 1;
    let mut current: Option<Arc<Zone>> = None;
    while let Some(change) = events.next().await {
        let mut changed = progress.note(change);
        // One rebuild for a burst of events (a list, a rollout).
        while let Some(Some(change)) = events.next().now_or_never() {
            changed |= progress.note(change);
        }
        if !changed || !progress.listed() {
            continue;
        }
        let zone = build(&domain, ttl, serial, &services, &endpoints);
        if current.as_ref().is_some_and(|c| c.same_records(&zone)) {
            continue;
        }
        for problem in zone.problems() {
            if !current
                .as_ref()
                .is_some_and(|c| c.problems().contains(problem))
            {
                warn!("left out: {problem}");
            }
        }
        if current.is_none() {
            info!(
                services = zone.service_count(),
                "synced: answering for {}",
                zone.domain()
            );
        } else {
            debug!(services = zone.service_count(), serial, "zone changed");
        }
        serial = serial.wrapping_add(1);
        let zone = Arc::new(zone);
        current = Some(zone.clone());
        publish.send_replace(Some(zone));
    }
    Err(SyncError::WatchEnded)
}

fn build(
    domain: &Name,
    ttl: u32,
    serial: u32,
    services: &Store<Service>,
    endpoints: &Store<Endpoints>,
) -> Zone {
    let services = services.state();
    let endpoints = endpoints.state();
    Zone::build(
        domain,
        ttl,
        serial,
        services.iter().map(AsRef::as_ref),
        endpoints.iter().map(AsRef::as_ref),
    )
}
