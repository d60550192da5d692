//! The processes serving one plugin, each with its own declaration, address
//! and heartbeats.

use std::sync::atomic::{AtomicI64, Ordering};

use jiff::Timestamp;

use super::Declaration;

/// One instance of a plugin, e.g. one pod of its Deployment.
pub(super) struct Instance {
    pub(super) declaration: Declaration,
    /// It heartbeats on time (whether it drains or not).
    pub(super) on_time: bool,
    /// The real last heartbeat, in Unix milliseconds: updated without the
    /// write lock by unchanged heartbeats.
    last_seen_ms: AtomicI64,
}

impl Instance {
    pub(super) fn new(declaration: Declaration, now: Timestamp) -> Self {
        Self {
            declaration,
            on_time: true,
            last_seen_ms: AtomicI64::new(now.as_millisecond()),
        }
    }

    pub(super) fn last_seen(&self) -> Timestamp {
        // Only ever stored from a Timestamp, so always in range.
        Timestamp::from_millisecond(self.last_seen_ms.load(Ordering::Relaxed))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// Records a heartbeat; `&self`, so that unchanged heartbeats need only
    /// the read lock.
    pub(super) fn seen(&self, now: Timestamp) {
        self.last_seen_ms
            .store(now.as_millisecond(), Ordering::Relaxed);
    }

    /// kplug sends it calls.
    pub(super) fn serving(&self) -> bool {
        self.on_time && !self.declaration.draining
    }
}

/// A plugin's instances in the order they registered. Never empty, so a
/// plugin always has a newest instance to describe it: the last one.
pub(super) struct Instances {
    first: Instance,
    rest: Vec<Instance>,
}

impl Instances {
    pub(super) fn new(first: Instance) -> Self {
        Self {
            first,
            rest: Vec::new(),
        }
    }

    /// The first instance, the only one of a plugin that just registered.
    pub(super) fn into_first(self) -> Instance {
        self.first
    }

    pub(super) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Instance> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Instance> {
        std::iter::once(&mut self.first).chain(&mut self.rest)
    }

    /// The most recently registered instance, whose declaration gives the
    /// plugin its spec and labels: the choice does not change from one
    /// heartbeat to the next, so two versions heartbeating in turn during a
    /// rolling update do not make the spec flap. A shadow, which serves no
    /// caller, gives them only when every instance is one.
    pub(super) fn newest(&self) -> &Instance {
        let last = self.rest.last().unwrap_or(&self.first);
        std::iter::once(&self.first)
            .chain(&self.rest)
            .rev()
            .find(|i| i.declaration.shadow_percent == 0)
            .unwrap_or(last)
    }

    /// The instance that `identity` names (see [`Declaration::identity`]).
    pub(super) fn get(&self, identity: &str) -> Option<&Instance> {
        self.iter().find(|i| i.declaration.identity() == identity)
    }

    pub(super) fn get_mut(&mut self, identity: &str) -> Option<&mut Instance> {
        self.iter_mut()
            .find(|i| i.declaration.identity() == identity)
    }

    /// Any instance other than `identity`'s.
    pub(super) fn other_than(&self, identity: &str) -> Option<&Instance> {
        self.iter().find(|i| i.declaration.identity() != identity)
    }

    pub(super) fn push(&mut self, instance: Instance) {
        self.rest.push(instance);
    }

    /// Keeps the instances `keep` accepts and returns how many went, unless
    /// that would leave none: then nothing is removed and this returns
    /// `None` (the caller removes the plugin).
    pub(super) fn retain(&mut self, keep: impl Fn(&Instance) -> bool) -> Option<usize> {
        if !self.iter().any(&keep) {
            return None;
        }
        let before = self.len();
        self.rest.retain(&keep);
        if !keep(&self.first) {
            // Some instance is kept, and `first` is not: `rest` has one.
            if self.rest.is_empty() {
                return None;
            }
            self.first = self.rest.remove(0);
        }
        Some(before - self.len())
    }
}
