//! The live plugin registry: in-memory state filled by heartbeats.
//!
//! Every change bumps one monotonically increasing resourceVersion and is
//! broadcast to watchers, with a bounded history so that watches can resume.
//! A plugin is served by instances (e.g. the pods of a Deployment), each
//! heartbeating under the plugin's name with its own address; the plugin
//! lives while one does. Heartbeats that change nothing only touch the
//! instance's atomic timestamp under the read lock: no event, no
//! resourceVersion bump, no contention with readers.
//! Each stored object version is kept as its wire forms ([`Encoded`]),
//! made once when it is stored, which lists, tables and watches copy; the
//! typed object is parsed back from them on the rare paths that need it.
//!
//! Changes are in `write` and `sweep`, reads in `read`, events and watches
//! in `events`, the rendered object in `render`, instances in `instances`.

mod canary;
mod declaration;
mod encoded;
mod events;
mod history;
mod instances;
mod metrics;
mod read;
mod render;
mod select;
mod shadow;
mod sweep;
mod version;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kplug_api::canary::Withdrawal;
use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;

pub use declaration::{Declaration, Labels};
use encoded::Body;
pub use encoded::Encoded;
pub use events::{Event, EventType, WatchError, WatchStart};
pub use history::Expired;
use history::History;
use instances::{Instance, Instances};
pub use kplug_api::selection::{Implementation, SelectError, compare_versions};
pub use metrics::RegistryCollector;
pub use read::{Census, Page, Row};
pub use shadow::Comparison;
pub use version::{Epoch, ForeignVersion, InvalidVersion, RequestedVersion};
pub use write::{Accepted, DeleteError, Preconditions, Refusal};

/// An instance that misses this many intervals is shown as not Ready until
/// it heartbeats again or its TTL passes.
const LATE_AFTER_INTERVALS: u32 = 2;
/// How many events a slow watcher may fall behind before it is cut off (it
/// then resumes from its last resourceVersion, out of the history).
const BROADCAST_CAPACITY: usize = 4096;

/// Tunables of the registry.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// An instance is garbage-collected after this many missed intervals.
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
    /// Heartbeats of new plugins are refused beyond this many plugins.
    pub max_plugins: usize,
    /// Heartbeats of new instances of a plugin are refused beyond this many.
    pub max_instances: usize,
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
            max_plugins: 50_000,
            max_instances: 64,
        }
    }
}

/// What the registry tracks about one registration beside its instances.
struct Lifecycle {
    /// Kept as its 16 bytes, not as the 36 characters of its text: at
    /// 10,000 plugins that is 0.5 MiB less (BENCHMARKS.md, "kplug's memory
    /// at 10,000 plugins").
    uid: uuid::Uuid,
    created: Timestamp,
    /// At least one instance takes calls: the plugin's Ready condition.
    ready: bool,
    ready_since: Timestamp,
    /// When the object was last rendered: the status' heartbeat times are
    /// as of then. Unchanged heartbeats rewrite it only once this is older
    /// than the status refresh interval, whatever the number of instances.
    refreshed: Timestamp,
    /// Boxed, and only while the plugin has one: most plugins never do,
    /// and inline it would take the boxed `Entry` out of jemalloc's 512-byte
    /// size class into the 640-byte one (a test holds it there).
    canary: Option<Box<CanaryRecord>>,
}

/// `uid` written as Kubernetes writes one: lowercase, hyphenated.
fn uid_text(uid: uuid::Uuid) -> String {
    uid.hyphenated()
        .encode_lower(&mut uuid::Uuid::encode_buffer())
        .to_owned()
}

/// What the registry remembers of a plugin's canaries.
#[derive(Default)]
struct CanaryRecord {
    /// Since when canary instances are listed, while they are.
    since: Option<Timestamp>,
    /// The canary version kplug withdrew: its instances take no calls.
    withdrawn: Option<Withdrawn>,
}

/// A canary kplug withdrew, and why.
struct Withdrawn {
    version: String,
    withdrawal: Withdrawal,
    at: Timestamp,
}

impl Lifecycle {
    /// kplug sends `instance` calls: it heartbeats on time, does not drain,
    /// and is not a canary kplug withdrew.
    fn takes_calls(&self, instance: &Instance) -> bool {
        let declaration = &instance.declaration;
        let withdrawn = declaration.canary_weight > 0
            && self
                .withdrawn()
                .is_some_and(|w| w.version == declaration.version);
        instance.serving() && !withdrawn
    }

    /// The uid as its text, as `metadata.uid` shows it.
    fn uid(&self) -> String {
        uid_text(self.uid)
    }

    fn canary_since(&self) -> Option<Timestamp> {
        self.canary.as_ref().and_then(|c| c.since)
    }

    fn withdrawn(&self) -> Option<&Withdrawn> {
        self.canary.as_ref().and_then(|c| c.withdrawn.as_ref())
    }

    /// Records since when canary instances are listed (`None`: none is),
    /// keeping the record only while it holds something.
    fn set_canary_since(&mut self, since: Option<Timestamp>) {
        if since.is_none() && self.canary.is_none() {
            return;
        }
        let canary = self.canary.get_or_insert_default();
        canary.since = since;
        if canary.since.is_none() && canary.withdrawn.is_none() {
            self.canary = None;
        }
    }

    fn withdraw(&mut self, withdrawn: Withdrawn) {
        self.canary.get_or_insert_default().withdrawn = Some(withdrawn);
    }

    /// Whether `instance` makes the plugin Ready: it takes calls and is
    /// not a shadow, which serves no caller.
    fn serves_callers(&self, instance: &Instance) -> bool {
        instance.declaration.shadow_percent == 0 && self.takes_calls(instance)
    }

    fn new(now: Timestamp) -> Self {
        Self {
            uid: uuid::Uuid::new_v4(),
            created: now,
            ready: true,
            ready_since: now,
            refreshed: now,
            canary: None,
        }
    }
}

struct Entry {
    instances: Instances,
    lifecycle: Lifecycle,
    /// The current version, as stored: its wire forms (no typed object is
    /// kept; see [`Encoded`]).
    encoded: Arc<Encoded>,
}

impl Entry {
    /// The latest heartbeat of any instance.
    fn last_seen(&self) -> Timestamp {
        self.instances
            .iter()
            .map(Instance::last_seen)
            .max()
            .unwrap_or(self.lifecycle.created)
    }

    fn row(&self) -> Row {
        Row {
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
    /// Names this process's history in every resourceVersion it issues.
    epoch: Epoch,
    state: RwLock<State>,
    events: broadcast::Sender<Arc<Event>>,
    /// Registrations removed because their heartbeats stopped.
    expired: AtomicU64,
    /// The record of each plugin's canary against its stable instances.
    canaries: Mutex<canary::Judges>,
    /// How each plugin's shadows answered, compared with its callers'.
    shadows: Mutex<shadow::Records>,
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
            epoch: Epoch::random(),
            state: RwLock::new(State {
                plugins: BTreeMap::new(),
                resource_version: 0,
                history,
            }),
            events,
            expired: AtomicU64::new(0),
            canaries: Mutex::default(),
            shadows: Mutex::default(),
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// This process's resourceVersion for the change numbered `counter`.
    pub fn version(&self, counter: u64) -> String {
        self.epoch.version(counter)
    }

    /// What a resourceVersion a client sent back means here.
    pub fn place(&self, requested: &str) -> Result<RequestedVersion, InvalidVersion> {
        self.epoch.place(requested)
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
