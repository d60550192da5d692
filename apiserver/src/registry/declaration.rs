//! A plugin instance's validated self-description, as carried by its
//! heartbeats.

use std::time::Duration;

use crate::v1alpha1::{ExtensionKind, PluginApi, PluginSpec, Protocol};

/// What one instance of a plugin says about itself. Two heartbeats with
/// equal declarations change nothing in the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declaration {
    pub name: String,
    /// The instance's own name, e.g. its pod's; empty for plugins that
    /// predate instances, whose address names the instance.
    pub instance: String,
    /// The instance is shutting down: no new calls.
    pub draining: bool,
    pub version: String,
    pub api: PluginApi,
    pub implementation: String,
    pub address: String,
    /// The TLS name to verify when calling the instance; empty means the
    /// host part of `address`.
    pub server_name: String,
    /// A canary's share of the plugin's objects, in percent; 0: stable.
    pub canary_weight: u32,
    /// A shadow's share of the plugin's reconciles, in percent; 0: serves
    /// callers.
    pub shadow_percent: u32,
    pub extensions: Vec<ExtensionKind>,
    pub labels: Labels,
    /// Already clamped to the range the registry accepts.
    pub interval: Duration,
    pub protocol: Protocol,
    /// The authenticated identity that sent the heartbeat, when known.
    pub registered_by: Option<String>,
}

impl Declaration {
    /// What tells this instance from the plugin's others: its name, or its
    /// address when it has none. The two never collide: instance names are
    /// DNS names, addresses always hold a ':'.
    pub fn identity(&self) -> &str {
        if self.instance.is_empty() {
            &self.address
        } else {
            &self.instance
        }
    }

    /// The Plugin `spec` this declaration renders to.
    pub fn spec(&self) -> PluginSpec {
        PluginSpec {
            api: self.api.clone(),
            implementation: self.implementation.clone(),
            version: self.version.clone(),
            address: self.address.clone(),
            extensions: self.extensions.clone(),
            heartbeat_interval_seconds: u32::try_from(self.interval.as_secs()).unwrap_or(u32::MAX),
            protocol: self.protocol.clone(),
        }
    }
}

/// A declaration's labels, sorted by key. Plugins declare a handful, and a
/// `BTreeMap` takes a node of half a kilobyte for any number of them: one
/// allocation of pairs holds 10,000 plugins' labels in a tenth of that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(String, String)]>);

impl Labels {
    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: String, value: String) {
        let mut pairs = std::mem::take(&mut self.0).into_vec();
        pairs.push((key, value));
        *self = pairs.into_iter().collect();
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }
}

impl FromIterator<(String, String)> for Labels {
    /// Like collecting into a map: the last value of a key wins.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        let mut pairs: Vec<_> = pairs.into_iter().collect();
        // Latest first, so that the stable sort keeps it first among its
        // key's pairs and `dedup_by` keeps it.
        pairs.reverse();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs.dedup_by(|a, b| a.0 == b.0);
        Self(pairs.into_boxed_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::Labels;

    fn pair(key: &str, value: &str) -> (String, String) {
        (key.to_owned(), value.to_owned())
    }

    #[test]
    fn labels_are_sorted_by_key_and_the_last_value_wins() {
        let mut labels: Labels = [
            pair("tier", "gold"),
            pair("team", "a"),
            pair("tier", "silver"),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            labels.iter().collect::<Vec<_>>(),
            [("team", "a"), ("tier", "silver")]
        );
        labels.insert("app".to_owned(), "db".to_owned());
        labels.insert("team".to_owned(), "b".to_owned());
        assert_eq!(
            labels.iter().collect::<Vec<_>>(),
            [("app", "db"), ("team", "b"), ("tier", "silver")]
        );
        let same: Labels = [pair("tier", "silver"), pair("app", "db"), pair("team", "b")]
            .into_iter()
            .collect();
        assert_eq!(labels, same, "equal whatever the order they came in");
    }
}
