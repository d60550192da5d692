//! Canary verdicts: how each call to a plugin with canary instances ended,
//! judged by `kplug_api::canary::Judge`; a withdrawal goes into the
//! plugin's status (its canary instances are no longer Ready, its Canary
//! condition says why) and every kplug call afterwards leaves them out.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use kplug_api::canary::{Judge, Outcome, Track, Withdrawal};

use super::{Registry, Withdrawn};

/// One plugin's canary: the version judged, its judge, and the counts the
/// metrics show.
#[derive(Default)]
pub(super) struct Record {
    version: String,
    judge: Judge,
    pub(super) calls: HashMap<(Track, Outcome), u64>,
    pub(super) withdrawals: u64,
}

/// The record of each plugin that has had a canary, by name.
#[derive(Default)]
pub(super) struct Judges(pub(super) BTreeMap<String, Record>);

impl Judges {
    pub(super) fn forget(&mut self, plugin: &str) {
        self.0.remove(plugin);
    }
}

impl Registry {
    /// Records how a call to `plugin` ended on `track` while `canary` is its
    /// canary version; returns the withdrawal this call brought about, if
    /// any. A new canary version starts a new record of the canary, beside
    /// the stable instances' record so far.
    pub fn canary_outcome(
        &self,
        plugin: &str,
        canary: &str,
        track: Track,
        outcome: Outcome,
        now: Timestamp,
    ) -> Option<Withdrawal> {
        let withdrawal = {
            let mut judges = self.canaries.lock();
            let record = judges.0.entry(plugin.to_owned()).or_default();
            if record.version != canary {
                record.version = canary.to_owned();
                record.judge.new_canary();
            }
            *record.calls.entry((track, outcome)).or_default() += 1;
            let withdrawal = record.judge.record(track, outcome)?;
            record.withdrawals += 1;
            withdrawal
        };
        let mut state = self.state.write();
        let entry = state.plugins.get_mut(plugin)?;
        if entry
            .lifecycle
            .withdrawn()
            .is_some_and(|w| w.version == canary)
        {
            // Another call's verdict came first.
            return None;
        }
        entry.lifecycle.withdraw(Withdrawn {
            version: canary.to_owned(),
            withdrawal: withdrawal.clone(),
            at: now,
        });
        self.modify(&mut state, plugin, now);
        Some(withdrawal)
    }
}
