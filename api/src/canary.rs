//! Canary releases: which instances of a plugin an object's calls go to
//! while some of its instances are the canary of its next version
//! (`canaryWeight`), and when kplug withdraws a canary.
//!
//! Each object goes to one side for as long as the canary runs: its bucket
//! (0-99) is a hash of the plugin's name and the object's key (its uid,
//! else namespace/name), the same on every kplug replica and across
//! restarts, and the canary takes the objects whose bucket is below its
//! weight. The share of objects is the weight on average; for a given set
//! of objects it is what their hashes give (100 objects at weight 10: 10 %
//! on average, about 3 points either way).
//!
//! A canary is withdrawn once, among its last [`WINDOW`] calls and at
//! least [`MIN_CALLS`] of them, the share that failed (the plugin answered
//! a failure, or the call failed) or missed its deadline is at least
//! [`MARGIN`] above the stable instances' share over their last [`WINDOW`]
//! calls: a canary failing half its calls is withdrawn at its
//! [`MIN_CALLS`]th call when the stable instances fail none (unless fewer
//! than a fifth of those calls happened to fail, when a later call does).

use std::collections::VecDeque;
use std::hash::Hasher;

use crate::v1alpha1::PluginInstance;

/// Calls of each side a verdict looks back on.
pub const WINDOW: usize = 100;
/// Calls of the canary before any verdict.
pub const MIN_CALLS: usize = 20;
/// How much worse than the stable instances a canary may be, as a share
/// of its calls: 0.2 is 20 percentage points.
pub const MARGIN: f64 = 0.2;

/// The side of a plugin's instances a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Track {
    Stable,
    Canary,
}

impl Track {
    pub fn as_str(self) -> &'static str {
        match self {
            Track::Stable => "stable",
            Track::Canary => "canary",
        }
    }

    /// The side `instance` is on.
    pub fn of(instance: &PluginInstance) -> Self {
        match instance.canary_weight {
            0 => Track::Stable,
            _ => Track::Canary,
        }
    }
}

/// The canary's share, in percent, of instances with these weights: the
/// highest; `None` when none is a canary.
pub fn weight(weights: impl IntoIterator<Item = u32>) -> Option<u32> {
    weights.into_iter().filter(|&weight| weight > 0).max()
}

/// The bucket (0-99) of the object `key` for `plugin`.
pub fn bucket(plugin: &str, key: &str) -> u32 {
    // FNV-1a: fixed by its definition, so every replica and release agrees.
    let mut hash = fnv::FnvHasher::default();
    hash.write(plugin.as_bytes());
    hash.write(&[0]);
    hash.write(key.as_bytes());
    u32::try_from(hash.finish() % 100).unwrap_or_default()
}

/// The side the object `key` goes to among the instances that may take the
/// call: the canary when its bucket is below the canary's weight, unless
/// one side has no instance, when the other takes every object.
pub fn track(plugin: &str, key: &str, instances: &[&PluginInstance]) -> Track {
    let Some(weight) = weight(instances.iter().map(|i| i.canary_weight)) else {
        return Track::Stable;
    };
    if instances.iter().all(|i| Track::of(i) == Track::Canary) {
        return Track::Canary;
    }
    match bucket(plugin, key) < weight {
        true => Track::Canary,
        false => Track::Stable,
    }
}

/// How a call to one side ended, for the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Succeeded,
    /// The plugin answered a failure, or the call failed.
    Failed,
    /// The call missed its deadline.
    Late,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Late => "late",
        }
    }
}

/// The last [`WINDOW`] outcomes of one side.
#[derive(Clone, Debug, Default)]
struct Recent(VecDeque<Outcome>);

impl Recent {
    fn push(&mut self, outcome: Outcome) {
        if self.0.len() == WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(outcome);
    }

    fn calls(&self) -> usize {
        self.0.len()
    }

    fn bad(&self) -> usize {
        self.0.iter().filter(|&&o| o != Outcome::Succeeded).count()
    }

    fn share(&self) -> f64 {
        match self.calls() {
            0 => 0.0,
            calls => self.bad() as f64 / calls as f64,
        }
    }
}

/// The counts behind a withdrawal, for its condition and log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Withdrawal {
    pub canary_calls: usize,
    pub canary_bad: usize,
    pub stable_calls: usize,
    pub stable_bad: usize,
}

impl std::fmt::Display for Withdrawal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let percent = |bad: usize, calls: usize| match calls {
            0 => 0,
            _ => bad * 100 / calls,
        };
        write!(
            f,
            "{} of its last {} calls failed or missed their deadline ({}%), against {} of {} ({}%) for the stable instances",
            self.canary_bad,
            self.canary_calls,
            percent(self.canary_bad, self.canary_calls),
            self.stable_bad,
            self.stable_calls,
            percent(self.stable_bad, self.stable_calls),
        )
    }
}

/// One canary's record against the stable instances of its plugin.
#[derive(Clone, Debug, Default)]
pub struct Judge {
    stable: Recent,
    canary: Recent,
}

impl Judge {
    /// Starts the record of a new canary; the stable instances' stands.
    pub fn new_canary(&mut self) {
        self.canary = Recent::default();
    }

    /// Records a call to `track`; a withdrawal when the canary is now
    /// worse than the rule above allows.
    pub fn record(&mut self, track: Track, outcome: Outcome) -> Option<Withdrawal> {
        match track {
            Track::Stable => self.stable.push(outcome),
            Track::Canary => self.canary.push(outcome),
        }
        let worse =
            self.canary.calls() >= MIN_CALLS && self.canary.share() >= self.stable.share() + MARGIN;
        worse.then(|| Withdrawal {
            canary_calls: self.canary.calls(),
            canary_bad: self.canary.bad(),
            stable_calls: self.stable.calls(),
            stable_bad: self.stable.bad(),
        })
    }
}

#[cfg(test)]
#[path = "canary/tests.rs"]
mod tests;
