//! Changes to the registry: heartbeats, deregistration and deletes through
//! the API (the sweep that marks late instances and expires silent ones is
//! in `sweep`).

use std::collections::btree_map;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::{
    Body, Declaration, Encoded, Entry, Event, EventType, Instance, Instances, Lifecycle, Registry,
    State, signed, uid_text,
};
use crate::v1alpha1::{Plugin, PluginApi};

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
        "plugin {name:?} serves {existing} through its other instances; instance {instance:?} \
         declares {declared}, and every instance of a plugin must serve the same API and \
         implementation: use another plugin name for a different API or implementation, or \
         retry after the other instances deregister or expire (at {expires_at}), or delete \
         the plugin with `kubectl delete plugin {name}`"
    )]
    DeclarationConflict {
        name: String,
        instance: String,
        /// The API and implementation, as `resource.group/version (Implementation)`.
        existing: String,
        declared: String,
        expires_at: Timestamp,
    },
    #[error(
        "plugin {name:?} is registered by {existing:?}; another identity cannot take over a \
         live plugin's name"
    )]
    IdentityConflict { name: String, existing: String },
    #[error(
        "kplug already holds {limit} plugins, the most it takes (--max-plugins): plugin \
         {name:?} can register once another plugin deregisters or expires"
    )]
    TooManyPlugins { name: String, limit: usize },
    #[error(
        "plugin {name:?} already has {limit} instances, the most kplug takes for one plugin \
         (--max-instances-per-plugin): instance {instance:?} can register once another \
         deregisters or expires"
    )]
    TooManyInstances {
        name: String,
        instance: String,
        limit: usize,
    },
}

impl Refusal {
    /// Machine-readable reason for the heartbeat reply.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::DeclarationConflict { .. } => "DeclarationConflict",
            Self::IdentityConflict { .. } => "IdentityConflict",
            Self::TooManyPlugins { .. } => "TooManyPlugins",
            Self::TooManyInstances { .. } => "TooManyInstances",
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

/// `resource.group/version (Implementation)`, for conflict messages.
fn served(api: &PluginApi, implementation: &str) -> String {
    format!(
        "{}/{} ({implementation})",
        api.qualified_resource(),
        api.version
    )
}

/// What a heartbeat needs, as far as the registry's read lock tells.
enum Touch {
    /// Nothing but its time was new: recorded. The registration's uid.
    Touched(uuid::Uuid),
    /// A plugin the registry does not hold.
    NewPlugin,
    /// A change to a plugin the registry holds.
    Rewrite,
}

/// A heartbeat's change, made under the write lock.
// One value on the stack for the length of one heartbeat: a box would be
// an allocation for nothing.
#[expect(clippy::large_enum_variant)]
enum Change {
    Register(Registration),
    Rewrite(Declaration),
}

impl Change {
    fn declaration(&self) -> &Declaration {
        match self {
            Change::Register(registration) => &registration.instances.newest().declaration,
            Change::Rewrite(declaration) => declaration,
        }
    }

    fn into_declaration(self) -> Declaration {
        match self {
            Change::Register(registration) => registration.instances.into_first().declaration,
            Change::Rewrite(declaration) => declaration,
        }
    }
}

/// A new plugin's entry and object, all but its resourceVersion: the
/// costly part of a registration (rendering, and compressing the object's
/// body), which needs no lock.
struct Registration {
    instances: Instances,
    lifecycle: Lifecycle,
    object: Plugin,
    body: Body,
}

impl Registration {
    fn new(registry: &Registry, declaration: Declaration, now: Timestamp) -> Self {
        let mut lifecycle = Lifecycle::new(now);
        let instances = Instances::new(Instance::new(declaration, now));
        lifecycle.ready = instances.iter().any(|i| lifecycle.serves_callers(i));
        let object = registry.render(&instances, &lifecycle);
        let body = Body::new(&object);
        Self {
            instances,
            lifecycle,
            object,
            body,
        }
    }
}

impl Registry {
    /// Records a heartbeat of one instance at `now`.
    pub fn heartbeat(&self, declaration: Declaration, now: Timestamp) -> Result<Accepted, Refusal> {
        let interval = declaration.interval;
        let accepted = |uid: uuid::Uuid| Accepted {
            uid: uid_text(uid),
            interval,
            ttl: self.ttl(interval),
        };
        // Refusals too are decided under the read lock, so that a flood of
        // heartbeats beyond the caps does not queue on the write lock.
        let touch = self.touch_or_refuse(&self.state.read(), &declaration, now)?;
        // What follows the read lock: the uid's text, and a new plugin's
        // object, rendered and compressed before the write lock, which every
        // heartbeat that changes something waits for.
        let change = match touch {
            Touch::Touched(uid) => return Ok(accepted(uid)),
            Touch::NewPlugin => Change::Register(Registration::new(self, declaration, now)),
            Touch::Rewrite => Change::Rewrite(declaration),
        };

        let mut state = self.state.write();
        let state = &mut *state;
        if let Touch::Touched(uid) = self.touch_or_refuse(state, change.declaration(), now)? {
            return Ok(accepted(uid));
        }
        let name = &change.declaration().name;
        let previous = state.plugins.get(name).map(|entry| entry.encoded.clone());
        state.resource_version += 1;
        let resource_version = state.resource_version;
        let entry = match state.plugins.entry(name.clone()) {
            btree_map::Entry::Occupied(occupied) => {
                let declaration = change.into_declaration();
                let entry = occupied.into_mut();
                match entry.instances.get_mut(declaration.identity()) {
                    // A known instance whose declaration changed, maybe
                    // its address: then it moved.
                    Some(instance) => {
                        instance.declaration = declaration;
                        instance.on_time = true;
                        instance.seen(now);
                    }
                    None => entry.instances.push(Instance::new(declaration, now)),
                }
                let object = self.refresh(entry, now, resource_version);
                (&**entry, object)
            }
            btree_map::Entry::Vacant(vacant) => {
                let Registration {
                    instances,
                    lifecycle,
                    mut object,
                    body,
                } = match change {
                    Change::Register(registration) => registration,
                    // Gone since the read lock was released.
                    Change::Rewrite(declaration) => Registration::new(self, declaration, now),
                };
                self.stamp(&mut object, resource_version);
                let encoded = Arc::new(Encoded::with_body(&object, resource_version, body));
                let entry = vacant.insert(Box::new(Entry {
                    instances,
                    lifecycle,
                    encoded,
                }));
                (&**entry, object)
            }
        };
        let (entry, object) = entry;
        let result = accepted(entry.lifecycle.uid);
        let event_type = match previous {
            Some(_) => EventType::Modified,
            None => EventType::Added,
        };
        let previous = previous.and_then(|p| Event::kept_previous(p, &object));
        let event = Event {
            event_type,
            resource_version,
            encoded: entry.encoded.clone(),
            previous,
        };
        self.publish(state, event);
        Ok(result)
    }

    /// Renders the entry's object anew at `resource_version` and stores its
    /// wire forms: the only place a stored version is made, so every version
    /// is encoded once. Returns the typed object, for the event's rule.
    fn store(&self, entry: &mut Entry, resource_version: u64) -> Plugin {
        let mut object = self.render(&entry.instances, &entry.lifecycle);
        self.stamp(&mut object, resource_version);
        entry.encoded = Arc::new(Encoded::new(&object, resource_version));
        object
    }

    /// Re-derives the plugin's readiness from its instances after a change
    /// at `now`, and stores the object anew (returned as in [`Registry::store`]).
    pub(super) fn refresh(
        &self,
        entry: &mut Entry,
        now: Timestamp,
        resource_version: u64,
    ) -> Plugin {
        let lifecycle = &mut entry.lifecycle;
        let ready = entry.instances.iter().any(|i| lifecycle.serves_callers(i));
        if ready != lifecycle.ready {
            lifecycle.ready = ready;
            lifecycle.ready_since = now;
        }
        let canaries = entry
            .instances
            .iter()
            .any(|i| i.declaration.canary_weight > 0);
        let since = canaries.then(|| lifecycle.canary_since().unwrap_or(now));
        lifecycle.set_canary_since(since);
        entry.lifecycle.refreshed = now;
        self.store(entry, resource_version)
    }

    /// Publishes the plugin `name` as MODIFIED after its instances changed.
    pub(super) fn modify(&self, state: &mut State, name: &str, now: Timestamp) {
        let Some(entry) = state.plugins.get_mut(name) else {
            return;
        };
        state.resource_version += 1;
        let resource_version = state.resource_version;
        let previous = entry.encoded.clone();
        let object = self.refresh(entry, now, resource_version);
        let event = Event {
            event_type: EventType::Modified,
            resource_version,
            encoded: entry.encoded.clone(),
            previous: Event::kept_previous(previous, &object),
        };
        self.publish(state, event);
    }

    /// [`Registry::touch`], or the refusal of a heartbeat that would add a
    /// plugin or an instance beyond the caps.
    fn touch_or_refuse(
        &self,
        state: &State,
        declaration: &Declaration,
        now: Timestamp,
    ) -> Result<Touch, Refusal> {
        let Some(entry) = state.plugins.get(&declaration.name) else {
            let limit = self.config.max_plugins;
            if state.plugins.len() >= limit {
                return Err(Refusal::TooManyPlugins {
                    name: declaration.name.clone(),
                    limit,
                });
            }
            return Ok(Touch::NewPlugin);
        };
        if let Some(uid) = self.touch(entry, declaration, now)? {
            return Ok(Touch::Touched(uid));
        }
        let limit = self.config.max_instances;
        if entry.instances.get(declaration.identity()).is_none() && entry.instances.len() >= limit {
            return Err(Refusal::TooManyInstances {
                name: declaration.name.clone(),
                instance: declaration.identity().to_owned(),
                limit,
            });
        }
        Ok(Touch::Rewrite)
    }

    /// For a heartbeat that changes nothing, only records when it came and
    /// returns the registration's uid; `None` means the entry must be
    /// rewritten (or the instance added).
    fn touch(
        &self,
        entry: &Entry,
        declaration: &Declaration,
        now: Timestamp,
    ) -> Result<Option<uuid::Uuid>, Refusal> {
        self.admit(entry, declaration)?;
        let Some(instance) = entry.instances.get(declaration.identity()) else {
            return Ok(None);
        };
        if !instance.on_time
            || instance.declaration != *declaration
            || now.duration_since(entry.lifecycle.refreshed) >= signed(self.config.status_refresh)
        {
            return Ok(None);
        }
        instance.seen(now);
        Ok(Some(entry.lifecycle.uid))
    }

    /// Whether `declaration` may join (or stay in) `entry`: same identity
    /// as the plugin's, and the same API and implementation as its other
    /// instances.
    fn admit(&self, entry: &Entry, declaration: &Declaration) -> Result<(), Refusal> {
        let owner = &entry.instances.newest().declaration.registered_by;
        if *owner != declaration.registered_by {
            return Err(Refusal::IdentityConflict {
                name: declaration.name.clone(),
                existing: owner.clone().unwrap_or_default(),
            });
        }
        let identity = declaration.identity();
        if let Some(other) = entry.instances.other_than(identity)
            && (other.declaration.api != declaration.api
                || other.declaration.implementation != declaration.implementation)
        {
            let expires_at = entry
                .instances
                .iter()
                .filter(|i| i.declaration.identity() != identity)
                .map(|i| i.last_seen() + signed(self.ttl(i.declaration.interval)))
                .max()
                .unwrap_or(Timestamp::UNIX_EPOCH);
            return Err(Refusal::DeclarationConflict {
                name: declaration.name.clone(),
                instance: identity.to_owned(),
                existing: served(&other.declaration.api, &other.declaration.implementation),
                declared: served(&declaration.api, &declaration.implementation),
                expires_at,
            });
        }
        Ok(())
    }

    /// Removes one instance on its own request; the plugin goes with its
    /// last instance. `instance` empty (plugins before instances) matches
    /// by address alone; otherwise both must match, so that a stale process
    /// cannot remove its successor.
    pub fn deregister(&self, name: &str, instance: &str, address: &str, now: Timestamp) -> bool {
        let matches = |i: &Instance| {
            i.declaration.address == address
                && (instance.is_empty() || i.declaration.instance == instance)
        };
        let mut state = self.state.write();
        let state = &mut *state;
        let Some(entry) = state.plugins.get_mut(name) else {
            return false;
        };
        if !entry.instances.iter().any(matches) {
            return false;
        }
        match entry.instances.retain(|i| !matches(i)) {
            Some(_) => self.modify(state, name, now),
            None => {
                self.remove(state, name);
            }
        }
        true
    }

    /// Evicts a registration, every instance with it, through the API.
    pub fn delete(
        &self,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Arc<Encoded>, DeleteError> {
        let mut state = self.state.write();
        let entry = state
            .plugins
            .get(name)
            .ok_or_else(|| DeleteError::NotFound(name.to_owned()))?;
        if let Some(uid) = &preconditions.uid
            && *uid != entry.lifecycle.uid()
        {
            return Err(DeleteError::Conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                entry.lifecycle.uid()
            )));
        }
        let current = self.version(entry.encoded.resource_version());
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

    /// Removes the plugin `name` and publishes DELETED; returns the deleted
    /// object's wire forms.
    pub(super) fn remove(&self, state: &mut State, name: &str) -> Option<Arc<Encoded>> {
        let entry = state.plugins.remove(name)?;
        self.canaries.lock().forget(name);
        self.shadows.lock().forget(name);
        state.resource_version += 1;
        let resource_version = state.resource_version;
        // Like Kubernetes, the deleted object carries the deletion's
        // resourceVersion. Should the stored version not read back (a bug,
        // logged), watchers still see the deletion, of the last version.
        let encoded = match entry.encoded.object() {
            Some(mut object) => {
                object.metadata.resource_version = Some(self.version(resource_version));
                Arc::new(Encoded::new(&object, resource_version))
            }
            None => entry.encoded,
        };
        let event = Event {
            event_type: EventType::Deleted,
            resource_version,
            encoded: encoded.clone(),
            previous: None,
        };
        self.publish(state, event);
        Some(encoded)
    }
}
