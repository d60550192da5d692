//! Changes to the registry: heartbeats, deregistration, deletes through the
//! API, and the sweep that marks late plugins and expires silent ones.

use std::collections::btree_map;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use jiff::Timestamp;

use super::{
    Declaration, Encoded, Entry, Event, EventType, LATE_AFTER_INTERVALS, Lifecycle, Registry,
    State, signed,
};
use crate::v1alpha1::Plugin;

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

impl Registry {
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
                self.store(entry, resource_version);
                entry
            }
            btree_map::Entry::Vacant(vacant) => {
                let lifecycle = Lifecycle::new(now);
                let object = self.render(&declaration, &lifecycle, resource_version);
                let encoded = Arc::new(Encoded::new(&object));
                vacant.insert(Box::new(Entry {
                    declaration,
                    lifecycle,
                    last_seen_ms: AtomicI64::new(now.as_millisecond()),
                    object: Arc::new(object),
                    encoded,
                }))
            }
        };
        entry
            .last_seen_ms
            .store(now.as_millisecond(), Ordering::Relaxed);
        let result = accepted(&entry.lifecycle.uid);
        let event = Event {
            event_type: if previous.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            resource_version,
            object: entry.object.clone(),
            encoded: entry.encoded.clone(),
            previous,
        };
        self.publish(state, event);
        Ok(result)
    }

    /// Renders the entry's object anew at `resource_version`, with its wire
    /// forms: the only place a stored version is made, so every version is
    /// encoded once.
    fn store(&self, entry: &mut Entry, resource_version: u64) {
        let object = self.render(&entry.declaration, &entry.lifecycle, resource_version);
        entry.encoded = Arc::new(Encoded::new(&object));
        entry.object = Arc::new(object);
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
            self.store(entry, resource_version);
            let event = Event {
                event_type: EventType::Modified,
                resource_version,
                object: entry.object.clone(),
                encoded: entry.encoded.clone(),
                previous: Some(previous),
            };
            self.publish(state, event);
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
        let encoded = Arc::new(Encoded::new(&object));
        let object = Arc::new(object);
        let event = Event {
            event_type: EventType::Deleted,
            resource_version,
            object: object.clone(),
            encoded,
            previous: None,
        };
        self.publish(state, event);
        Some(object)
    }
}
