//! The live plugin registry: in-memory state filled by heartbeats.
//!
//! Every change bumps one monotonically increasing resourceVersion and is
//! broadcast to watchers, with a bounded history so that watches can resume.
//! Heartbeats that change nothing only touch an atomic timestamp under the
//! read lock: no event, no resourceVersion bump, no contention with readers.

mod declaration;
mod history;
mod metrics;
mod select;

use std::collections::{BTreeMap, btree_map};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use parking_lot::RwLock;
use tokio::sync::broadcast;

pub use declaration::Declaration;
pub use history::Expired;
use history::History;
pub use kplug_api::selection::{Implementation, SelectError, compare_versions};
pub use metrics::RegistryCollector;

use crate::v1alpha1::{self, API_VERSION, CONDITION_READY, Plugin, PluginStatus};

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
    pub object: Arc<Plugin>,
    /// The object before a MODIFIED change, so that filtered watches can
    /// turn a change that leaves or enters their selection into DELETED or ADDED.
    pub previous: Option<Arc<Plugin>>,
}

/// A heartbeat the registry recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub uid: String,
    pub interval: Duration,
    pub ttl: Duration,
}

/// Why a heartbeat was not recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "plugin {name:?} is already registered with address {existing:?}; a plugin's address \
         cannot change while it is live: retry after the registration expires \
         (at {expires_at}) or delete it with `kubectl delete plugin {name}`"
    )]
    AddressConflict {
        name: String,
        existing: String,
        expires_at: Timestamp,
    },
    #[error(
        "plugin {name:?} is registered by {existing:?}; another identity cannot take over a \
         live plugin's name"
    )]
    IdentityConflict { name: String, existing: String },
}

impl Refusal {
    /// Machine-readable reason for the heartbeat reply.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::AddressConflict { .. } => "AddressConflict",
            Self::IdentityConflict { .. } => "IdentityConflict",
        }
    }
}

/// Conditions a delete must meet, as in `DeleteOptions.preconditions`.
#[derive(Debug, Default, Clone)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// Why a delete did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeleteError {
    #[error("plugins.plugins.kplug.io \"{0}\" not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
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

/// A consistent page of the registry.
pub struct Snapshot {
    pub resource_version: u64,
    pub items: Vec<Listed>,
}

/// A plugin in a [`Snapshot`].
pub struct Listed {
    pub object: Arc<Plugin>,
    /// The real time of the last heartbeat, finer than `status.lastHeartbeatTime`.
    pub last_seen: Timestamp,
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
}

impl Entry {
    fn last_seen(&self) -> Timestamp {
        Timestamp::from_millisecond(self.last_seen_ms.load(Ordering::Relaxed))
            .unwrap_or(self.lifecycle.recorded)
    }
}

struct State {
    plugins: BTreeMap<String, Entry>,
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

/// How many plugins are registered, by readiness, and how many expired
/// since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    pub ready: usize,
    pub not_ready: usize,
    pub expired: u64,
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

    /// Records a heartbeat at `now`.
    pub fn heartbeat(&self, declaration: Declaration, now: Timestamp) -> Result<Accepted, Refusal> {
        let interval = declaration.interval;
        let accepted = |uid: &str| Accepted {
            uid: uid.to_owned(),
            interval,
            ttl: self.ttl(interval),
        };
        {
            let state = self.state.read();
            if let Some(entry) = state.plugins.get(&declaration.name)
                && let Some(uid) = self.touch(entry, &declaration, now)?
            {
                return Ok(accepted(uid));
            }
        }

        let mut state = self.state.write();
        let state = &mut *state;
        let previous = match state.plugins.get(&declaration.name) {
            Some(entry) => {
                if let Some(uid) = self.touch(entry, &declaration, now)? {
                    return Ok(accepted(uid));
                }
                Some(entry.object.clone())
            }
            None => None,
        };
        state.resource_version += 1;
        let resource_version = state.resource_version;
        let entry = match state.plugins.entry(declaration.name.clone()) {
            btree_map::Entry::Occupied(occupied) => {
                let entry = occupied.into_mut();
                if !entry.lifecycle.ready {
                    entry.lifecycle.ready = true;
                    entry.lifecycle.ready_since = now;
                }
                entry.lifecycle.recorded = now;
                entry.declaration = declaration;
                entry.object =
                    Arc::new(self.render(&entry.declaration, &entry.lifecycle, resource_version));
                entry
            }
            btree_map::Entry::Vacant(vacant) => {
                let lifecycle = Lifecycle::new(now);
                let object = Arc::new(self.render(&declaration, &lifecycle, resource_version));
                vacant.insert(Entry {
                    declaration,
                    lifecycle,
                    last_seen_ms: AtomicI64::new(now.as_millisecond()),
                    object,
                })
            }
        };
        entry
            .last_seen_ms
            .store(now.as_millisecond(), Ordering::Relaxed);
        let result = accepted(&entry.lifecycle.uid);
        let object = entry.object.clone();
        let event_type = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.publish(state, event_type, resource_version, object, previous);
        Ok(result)
    }

    /// For a heartbeat that changes nothing, only records when it came and
    /// returns the registration's uid; `None` means the entry must be rewritten.
    fn touch<'e>(
        &self,
        entry: &'e Entry,
        declaration: &Declaration,
        now: Timestamp,
    ) -> Result<Option<&'e str>, Refusal> {
        self.check_ownership(entry, declaration)?;
        if self.needs_write(entry, declaration, now) {
            return Ok(None);
        }
        entry
            .last_seen_ms
            .store(now.as_millisecond(), Ordering::Relaxed);
        Ok(Some(&entry.lifecycle.uid))
    }

    fn check_ownership(&self, entry: &Entry, declaration: &Declaration) -> Result<(), Refusal> {
        let existing = &entry.declaration;
        if existing.registered_by != declaration.registered_by {
            return Err(Refusal::IdentityConflict {
                name: declaration.name.clone(),
                existing: existing.registered_by.clone().unwrap_or_default(),
            });
        }
        if existing.address != declaration.address {
            return Err(Refusal::AddressConflict {
                name: declaration.name.clone(),
                existing: existing.address.clone(),
                expires_at: entry.last_seen() + signed(self.ttl(existing.interval)),
            });
        }
        Ok(())
    }

    fn needs_write(&self, entry: &Entry, declaration: &Declaration, now: Timestamp) -> bool {
        !entry.lifecycle.ready
            || entry.declaration != *declaration
            || now.duration_since(entry.lifecycle.recorded) >= signed(self.config.status_refresh)
    }

    /// Removes a registration on the plugin's own request. Only the address
    /// that registered may deregister, so a stale process cannot remove its
    /// successor.
    pub fn deregister(&self, name: &str, address: &str) -> bool {
        let mut state = self.state.write();
        match state.plugins.get(name) {
            Some(entry) if entry.declaration.address == address => {
                self.remove(&mut state, name);
                true
            }
            _ => false,
        }
    }

    /// Evicts a registration through the API.
    pub fn delete(
        &self,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Arc<Plugin>, DeleteError> {
        let mut state = self.state.write();
        let entry = state
            .plugins
            .get(name)
            .ok_or_else(|| DeleteError::NotFound(name.to_owned()))?;
        if let Some(uid) = &preconditions.uid
            && *uid != entry.lifecycle.uid
        {
            return Err(DeleteError::Conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                entry.lifecycle.uid
            )));
        }
        let current = entry
            .object
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        if let Some(rv) = &preconditions.resource_version
            && *rv != current
        {
            return Err(DeleteError::Conflict(format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in \
                 object meta: {current}"
            )));
        }
        self.remove(&mut state, name)
            .ok_or_else(|| DeleteError::NotFound(name.to_owned()))
    }

    /// Marks late plugins not Ready and garbage-collects expired ones.
    /// Returns how many registrations were removed.
    pub fn sweep(&self, now: Timestamp) -> usize {
        let (late, expired) = {
            let state = self.state.read();
            let mut late = Vec::new();
            let mut expired = Vec::new();
            for (name, entry) in &state.plugins {
                let silent = now.duration_since(entry.last_seen());
                let interval = entry.declaration.interval;
                if silent >= signed(self.ttl(interval)) {
                    expired.push(name.clone());
                } else if entry.lifecycle.ready && silent >= signed(interval * LATE_AFTER_INTERVALS)
                {
                    late.push(name.clone());
                }
            }
            (late, expired)
        };
        if late.is_empty() && expired.is_empty() {
            return 0;
        }
        let mut state = self.state.write();
        let mut removed = 0;
        for name in expired {
            // Re-check under the write lock: a heartbeat may have arrived.
            let still_expired = state.plugins.get(&name).is_some_and(|entry| {
                now.duration_since(entry.last_seen())
                    >= signed(self.ttl(entry.declaration.interval))
            });
            if still_expired {
                tracing::info!(plugin = %name, "plugin expired: no heartbeat within its TTL");
                self.remove(&mut state, &name);
                self.expired.fetch_add(1, Ordering::Relaxed);
                removed += 1;
            }
        }
        for name in late {
            let state = &mut *state;
            let Some(entry) = state.plugins.get_mut(&name) else {
                continue;
            };
            let silent = now.duration_since(entry.last_seen());
            if !entry.lifecycle.ready
                || silent < signed(entry.declaration.interval * LATE_AFTER_INTERVALS)
            {
                continue;
            }
            tracing::info!(plugin = %name, "plugin heartbeat late: marking not Ready");
            entry.lifecycle.ready = false;
            entry.lifecycle.ready_since = now;
            state.resource_version += 1;
            let resource_version = state.resource_version;
            let previous = entry.object.clone();
            entry.object =
                Arc::new(self.render(&entry.declaration, &entry.lifecycle, resource_version));
            let object = entry.object.clone();
            self.publish(
                state,
                EventType::Modified,
                resource_version,
                object,
                Some(previous),
            );
        }
        removed
    }

    fn remove(&self, state: &mut State, name: &str) -> Option<Arc<Plugin>> {
        let entry = state.plugins.remove(name)?;
        state.resource_version += 1;
        let resource_version = state.resource_version;
        // Like Kubernetes, the deleted object carries the deletion's resourceVersion.
        let mut object = (*entry.object).clone();
        object.metadata.resource_version = Some(resource_version.to_string());
        let object = Arc::new(object);
        self.publish(
            state,
            EventType::Deleted,
            resource_version,
            object.clone(),
            None,
        );
        Some(object)
    }

    fn publish(
        &self,
        state: &mut State,
        event_type: EventType,
        resource_version: u64,
        object: Arc<Plugin>,
        previous: Option<Arc<Plugin>>,
    ) {
        let event = Arc::new(Event {
            event_type,
            resource_version,
            object,
            previous,
        });
        state.history.push(event.clone());
        // An error only means that nobody is watching.
        let _ = self.events.send(event);
    }

    fn render(
        &self,
        declaration: &Declaration,
        lifecycle: &Lifecycle,
        resource_version: u64,
    ) -> Plugin {
        let spec = declaration.spec();
        let (reason, message) = if lifecycle.ready {
            ("HeartbeatReceived", "the plugin is heartbeating".to_owned())
        } else {
            (
                "HeartbeatLate",
                format!(
                    "no heartbeat for {LATE_AFTER_INTERVALS} intervals of {}s",
                    declaration.interval.as_secs()
                ),
            )
        };
        Plugin {
            api_version: API_VERSION.to_owned(),
            kind: Plugin::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(declaration.name.clone()),
                uid: Some(lifecycle.uid.clone()),
                resource_version: Some(resource_version.to_string()),
                creation_timestamp: Some(Time(lifecycle.created)),
                labels: Some(v1alpha1::object_labels(&declaration.labels, &spec)),
                ..ObjectMeta::default()
            },
            spec,
            status: PluginStatus {
                conditions: vec![Condition {
                    type_: CONDITION_READY.to_owned(),
                    status: if lifecycle.ready { "True" } else { "False" }.to_owned(),
                    reason: reason.to_owned(),
                    message,
                    last_transition_time: Time(lifecycle.ready_since),
                    observed_generation: None,
                }],
                last_heartbeat_time: Time(lifecycle.recorded),
                expires_at: Time(lifecycle.recorded + signed(self.ttl(declaration.interval))),
                registered_by: declaration.registered_by.clone(),
            },
        }
    }

    /// The plugin named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Plugin>> {
        self.state
            .read()
            .plugins
            .get(name)
            .map(|e| e.object.clone())
    }

    /// When the plugin named `name` last heartbeated (not rounded to the
    /// status refresh interval).
    pub fn last_seen(&self, name: &str) -> Option<Timestamp> {
        self.state.read().plugins.get(name).map(Entry::last_seen)
    }

    /// Plugins in name order, after `start_after` when given, that match `filter`.
    pub fn list(&self, start_after: Option<&str>, filter: impl Fn(&Plugin) -> bool) -> Snapshot {
        let state = self.state.read();
        let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
        let items = state
            .plugins
            .range::<str, _>((lower, Bound::Unbounded))
            .filter(|(_, e)| filter(&e.object))
            .map(|(_, e)| Listed {
                object: e.object.clone(),
                last_seen: e.last_seen(),
            })
            .collect();
        Snapshot {
            resource_version: state.resource_version,
            items,
        }
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.state.read().plugins.len()
    }

    /// Counts by readiness, for metrics.
    pub fn census(&self) -> Census {
        let state = self.state.read();
        let ready = state.plugins.values().filter(|e| e.lifecycle.ready).count();
        Census {
            ready,
            not_ready: state.plugins.len() - ready,
            expired: self.expired.load(Ordering::Relaxed),
        }
    }

    /// True when no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.read().resource_version
    }

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
                        resource_version: e
                            .object
                            .metadata
                            .resource_version
                            .as_deref()
                            .and_then(|rv| rv.parse().ok())
                            .unwrap_or(current),
                        object: e.object.clone(),
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
}

#[cfg(test)]
mod tests;
