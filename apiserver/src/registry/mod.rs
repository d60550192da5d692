//! The live plugin registry: in-memory state filled by heartbeats.
//!
//! Every change bumps one monotonically increasing resourceVersion and is
//! broadcast to watchers, with a bounded history so that watches can resume.
//! Heartbeats that change nothing only touch an atomic timestamp under the
//! read lock: no event, no resourceVersion bump, no contention with readers.
//! Each stored object version carries its wire forms ([`Encoded`]), made
//! once when it is stored, which lists, tables and watches copy.
//!
//! Changes are in `write`, reads in `read`, events and watches in `events`,
//! the rendered object in `render`.

mod declaration;
mod encoded;
mod events;
mod history;
mod metrics;
mod read;
mod render;
mod select;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use parking_lot::RwLock;
use tokio::sync::broadcast;

pub use declaration::Declaration;
pub use encoded::Encoded;
pub use events::{Event, EventType, WatchError, WatchStart};
pub use history::Expired;
use history::History;
pub use kplug_api::selection::{Implementation, SelectError, compare_versions};
pub use metrics::RegistryCollector;
pub use read::{Census, Listed, Page, Row, Snapshot};
pub use write::{Accepted, DeleteError, Preconditions, Refusal};

use crate::v1alpha1::Plugin;

/// A plugin that misses this many intervals is shown as not Ready until it
/// heartbeats again or its TTL passes.
const LATE_AFTER_INTERVALS: u32 = 2;
/// How many events a slow watcher may fall behind before it is cut off (it
/// then resumes from its last resourceVersion, out of the history).
const BROADCAST_CAPACITY: usize = 4096;

/// Tunables of the registry.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// A plugin is garbage-collected after this many missed intervals.
    pub ttl_intervals: u32,
    /// Declared intervals are clamped to `min_interval..=max_interval`.
    pub min_interval: Duration,
    pub max_interval: Duration,
    /// Used when a plugin declares no interval.
    pub default_interval: Duration,
    /// An unchanged heartbeat rewrites `status.lastHeartbeatTime` (and emits
    /// MODIFIED) only when the recorded time is older than this.
    pub status_refresh: Duration,
    /// How many recent events a watch can resume from.
    pub history: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            ttl_intervals: 3,
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(300),
            default_interval: Duration::from_secs(10),
            status_refresh: Duration::from_secs(30),
            history: 10_000,
        }
    }
}

/// What the registry tracks about one registration beside its declaration.
struct Lifecycle {
    uid: String,
    created: Timestamp,
    ready: bool,
    ready_since: Timestamp,
    /// The heartbeat time written into the object's status.
    recorded: Timestamp,
}

impl Lifecycle {
    fn new(now: Timestamp) -> Self {
        Self {
            uid: uuid::Uuid::new_v4().to_string(),
            created: now,
            ready: true,
            ready_since: now,
            recorded: now,
        }
    }
}

struct Entry {
    declaration: Declaration,
    lifecycle: Lifecycle,
    /// The real last heartbeat, in Unix milliseconds: updated without the
    /// write lock by unchanged heartbeats.
    last_seen_ms: AtomicI64,
    object: Arc<Plugin>,
    /// `object`'s wire forms, replaced with it.
    encoded: Arc<Encoded>,
}

impl Entry {
    fn last_seen(&self) -> Timestamp {
        Timestamp::from_millisecond(self.last_seen_ms.load(Ordering::Relaxed))
            .unwrap_or(self.lifecycle.recorded)
    }

    fn listed(&self) -> Listed {
        Listed {
            object: self.object.clone(),
            encoded: self.encoded.clone(),
            last_seen: self.last_seen(),
        }
    }
}

struct State {
    /// Entries are boxed: B-tree nodes hold up to 11 values and are often
    /// half full, so slots the size of a pointer waste less than slots the
    /// size of an Entry.
    plugins: BTreeMap<String, Box<Entry>>,
    resource_version: u64,
    history: History,
}

/// The live, in-memory set of plugin registrations.
pub struct Registry {
    config: RegistryConfig,
    state: RwLock<State>,
    events: broadcast::Sender<Arc<Event>>,
    /// Registrations removed because their heartbeats stopped.
    expired: AtomicU64,
}

fn signed(duration: Duration) -> SignedDuration {
    SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX)
}

impl Registry {
    pub fn new(config: RegistryConfig) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let history = History::new(config.history);
        Self {
            config,
            state: RwLock::new(State {
                plugins: BTreeMap::new(),
                resource_version: 0,
                history,
            }),
            events,
            expired: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The interval the registry wants for a plugin that asked for `requested`.
    pub fn effective_interval(&self, requested: Option<Duration>) -> Duration {
        requested
            .unwrap_or(self.config.default_interval)
            .clamp(self.config.min_interval, self.config.max_interval)
    }

    /// How long a registration lives without heartbeats.
    pub fn ttl(&self, interval: Duration) -> Duration {
        interval * self.config.ttl_intervals.max(1)
    }
}

#[cfg(test)]
mod tests;
