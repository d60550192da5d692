//! Change events and watches: what changed, in resourceVersion order, live
//! through a broadcast channel and replayed out of the history.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::history::Expired;
use super::{Encoded, Registry};
use crate::v1alpha1::Plugin;

/// The type of a change event, as in a Kubernetes watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change to the registry.
#[derive(Debug)]
pub struct Event {
    pub event_type: EventType,
    pub resource_version: u64,
    /// The object as of this change (for DELETED, as it was deleted).
    pub encoded: Arc<Encoded>,
    /// The object before a MODIFIED change that touched its declaration
    /// (labels, spec or instance addresses), so that filtered watches can
    /// turn a change that leaves or enters their selection into DELETED or
    /// ADDED, and the proxy can drop channels to addresses that left. `None`
    /// when only the status changed (a refresh of its times, readiness):
    /// selections and addresses are then `encoded`'s. Most events are status
    /// refreshes, and keeping their previous versions would double what the
    /// history holds.
    pub previous: Option<Arc<Encoded>>,
}

impl Event {
    /// `previous` as a MODIFIED event to `object` keeps it (see
    /// [`Event::previous`]). A previous version that does not read back
    /// (a bug, logged) is kept: watchers then compare both sides.
    pub(super) fn kept_previous(previous: Arc<Encoded>, object: &Plugin) -> Option<Arc<Encoded>> {
        let Some(before) = previous.object() else {
            return Some(previous);
        };
        let declaration_changed = before.metadata.labels != object.metadata.labels
            || before.spec != object.spec
            || !before.addresses().eq(object.addresses());
        declaration_changed.then_some(previous)
    }
}

/// A consistent start for a watch: the events to send first, then the live feed.
pub struct WatchStart {
    pub initial: Vec<Arc<Event>>,
    pub resource_version: u64,
    pub feed: broadcast::Receiver<Arc<Event>>,
}

/// Why a watch cannot start where it was asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("too old resource version: {requested} ({oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("too large resource version: {requested}, current: {current}")]
    TooLarge { requested: u64, current: u64 },
}

impl Registry {
    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Starts a watch. `since: None` sends every live plugin as ADDED first;
    /// `Some(rv)` replays the retained events after `rv`.
    pub fn watch(&self, since: Option<u64>) -> Result<WatchStart, WatchError> {
        let state = self.state.read();
        // Subscribing under the read lock means no event can fall between
        // the initial events and the feed.
        let feed = self.events.subscribe();
        let current = state.resource_version;
        let initial = match since {
            None => state
                .plugins
                .values()
                .map(|e| {
                    Arc::new(Event {
                        event_type: EventType::Added,
                        resource_version: e.encoded.resource_version(),
                        encoded: e.encoded.clone(),
                        previous: None,
                    })
                })
                .collect(),
            Some(requested) if requested > current => {
                return Err(WatchError::TooLarge { requested, current });
            }
            Some(requested) => state
                .history
                .since(requested)
                .map_err(|Expired { oldest }| WatchError::Expired { requested, oldest })?,
        };
        Ok(WatchStart {
            initial,
            resource_version: current,
            feed,
        })
    }

    /// Records a change and tells every watcher.
    pub(super) fn publish(&self, state: &mut super::State, event: Event) {
        let event = Arc::new(event);
        state.history.push(event.clone());
        // An error only means that nobody is watching.
        let _ = self.events.send(event);
    }
}
