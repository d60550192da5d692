//! Reads of the live registry: one object, a consistent page, counts.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use jiff::Timestamp;

use super::{Encoded, Registry};
use crate::v1alpha1::Plugin;

/// One plugin of a [`Page`]: its wire forms and its last heartbeat.
pub struct Row {
    pub encoded: Arc<Encoded>,
    /// The real time of the last heartbeat, finer than `status.lastHeartbeatTime`.
    pub last_seen: Timestamp,
}

/// A consistent page of the registry, for list responses.
pub struct Page {
    pub resource_version: u64,
    pub rows: Vec<Row>,
    /// The name of the last row, where the next page starts.
    pub last_name: Option<String>,
    /// How many more plugins match after this page.
    pub remaining: usize,
}

/// How many plugins are registered, by readiness, and how many expired
/// since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    pub ready: usize,
    pub not_ready: usize,
    pub expired: u64,
}

impl Registry {
    /// The plugin named `name`, parsed from its stored JSON.
    pub fn get(&self, name: &str) -> Option<Arc<Plugin>> {
        let encoded = self.state.read().plugins.get(name)?.encoded.clone();
        encoded.object().map(Arc::new)
    }

    /// The plugin named `name`'s wire forms and when it last heartbeated,
    /// read together.
    pub fn get_row(&self, name: &str) -> Option<Row> {
        self.state.read().plugins.get(name).map(|e| e.row())
    }

    /// When the plugin named `name` last heartbeated (not rounded to the
    /// status refresh interval).
    pub fn last_seen(&self, name: &str) -> Option<Timestamp> {
        self.state.read().plugins.get(name).map(|e| e.last_seen())
    }

    /// Every plugin, parsed from its stored JSON, in name order.
    pub fn objects(&self) -> Vec<Plugin> {
        let rows = self.page(None, usize::MAX, |_, _| true).rows;
        rows.iter().filter_map(|row| row.encoded.object()).collect()
    }

    /// At most `limit` plugins in name order, after `start_after` when
    /// given, that match `filter` (given each one's name and stored version),
    /// and how many more match: what a list response needs, read under one
    /// lock.
    pub fn page(
        &self,
        start_after: Option<&str>,
        limit: usize,
        filter: impl Fn(&str, &Encoded) -> bool,
    ) -> Page {
        let state = self.state.read();
        let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut matching = state
            .plugins
            .range::<str, _>((lower, Bound::Unbounded))
            .filter(|(name, e)| filter(name, &e.encoded));
        let mut last_name = None;
        let rows = matching
            .by_ref()
            .take(limit)
            .map(|(name, e)| {
                last_name = Some(name);
                e.row()
            })
            .collect();
        Page {
            resource_version: state.resource_version,
            rows,
            last_name: last_name.cloned(),
            remaining: matching.count(),
        }
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.state.read().plugins.len()
    }

    /// True when no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.read().resource_version
    }
}
