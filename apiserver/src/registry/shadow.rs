//! Shadow records: how each plugin's shadows answered the dry-run copies
//! of its reconciles, compared with the caller's answers. The counts and
//! the last differences are this replica's, since it first copied a
//! reconcile of the plugin; they go with the plugin.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kplug_api::shadow::{
    KEPT_DIFFERENCES, MAX_COPIES_IN_FLIGHT, PluginShadow, PluginShadowStatus, ShadowDifference,
    ShadowInstance,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Registry;
use crate::v1alpha1::API_VERSION;

/// How one sampled reconcile ended on the shadow side.
#[derive(Debug)]
pub enum Comparison {
    /// The shadow answered as the caller's plugin did.
    Same,
    /// It answered otherwise (the difference names the fields).
    Different(ShadowDifference),
    /// It gave no answer (the difference holds the error).
    Failed(ShadowDifference),
    /// No copy was sent (kplug's bound on shadow calls, no shadow Ready,
    /// or a plugin that does not declare DryRun).
    Skipped,
}

/// One plugin's record.
pub(super) struct Record {
    pub(super) same: u64,
    pub(super) different: u64,
    pub(super) failed: u64,
    pub(super) skipped: u64,
    since: Option<Timestamp>,
    /// Newest first.
    last: VecDeque<ShadowDifference>,
    /// The bound on the plugin's copies in flight.
    in_flight: Arc<Semaphore>,
}

impl Default for Record {
    fn default() -> Self {
        Self {
            same: 0,
            different: 0,
            failed: 0,
            skipped: 0,
            since: None,
            last: VecDeque::new(),
            in_flight: Arc::new(Semaphore::new(MAX_COPIES_IN_FLIGHT)),
        }
    }
}

/// The record of each plugin that had a reconcile copied, by name.
#[derive(Default)]
pub(super) struct Records(pub(super) BTreeMap<String, Record>);

impl Records {
    pub(super) fn forget(&mut self, plugin: &str) {
        self.0.remove(plugin);
    }
}

impl Registry {
    /// A place for one more copy of `plugin`'s reconciles in flight, held
    /// until the permit drops; `None` when [`MAX_COPIES_IN_FLIGHT`] are out
    /// or the plugin is gone.
    pub fn shadow_slot(&self, plugin: &str) -> Option<OwnedSemaphorePermit> {
        let state = self.state.read();
        if !state.plugins.contains_key(plugin) {
            return None;
        }
        let mut records = self.shadows.lock();
        let record = records.0.entry(plugin.to_owned()).or_default();
        record.in_flight.clone().try_acquire_owned().ok()
    }

    /// Records how a sampled reconcile of `plugin` ended on its shadow.
    pub fn shadow_outcome(&self, plugin: &str, comparison: Comparison, now: Timestamp) {
        // Held while recording (the order `remove` takes them in), so that
        // a plugin removed while its copy was out leaves no record behind.
        let state = self.state.read();
        if !state.plugins.contains_key(plugin) {
            return;
        }
        let mut records = self.shadows.lock();
        let record = records.0.entry(plugin.to_owned()).or_default();
        record.since.get_or_insert(now);
        let kept = match comparison {
            Comparison::Same => {
                record.same += 1;
                None
            }
            Comparison::Different(difference) => {
                record.different += 1;
                Some(difference)
            }
            Comparison::Failed(difference) => {
                record.failed += 1;
                Some(difference)
            }
            Comparison::Skipped => {
                record.skipped += 1;
                None
            }
        };
        if let Some(difference) = kept {
            record.last.push_front(difference);
            record.last.truncate(KEPT_DIFFERENCES);
        }
    }

    /// What `plugins/NAME/shadow` serves; `None` when no plugin has that
    /// name.
    pub fn shadow(&self, name: &str) -> Option<PluginShadow> {
        let plugin = self.get(name)?;
        let shadows = plugin
            .status
            .instances
            .iter()
            .filter(|i| i.is_shadow())
            .map(|i| ShadowInstance {
                name: i.name.clone(),
                version: i.version.clone(),
                percent: i.shadow_percent,
                ready: i.ready,
            })
            .collect();
        let mut status = PluginShadowStatus {
            shadows,
            ..PluginShadowStatus::default()
        };
        if let Some(record) = self.shadows.lock().0.get(name) {
            status.same = record.same;
            status.different = record.different;
            status.compared = record.same + record.different;
            status.failed = record.failed;
            status.skipped = record.skipped;
            status.since = record.since.map(Time);
            status.differences = record.last.iter().cloned().collect();
        }
        Some(PluginShadow {
            api_version: API_VERSION.to_owned(),
            kind: PluginShadow::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                creation_timestamp: plugin.metadata.creation_timestamp.clone(),
                uid: plugin.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            status,
        })
    }
}
