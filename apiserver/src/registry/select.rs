//! Server-side selection: which live plugin serves a request.
//!
//! The rule itself (pinned, required, preferred, fallback; highest version
//! then smallest name) lives in [`kplug_api::selection`], so that clients
//! such as `kubectl kplug plugins` explain a choice exactly as kplug makes
//! it; this applies it to the registry's live records.

use std::sync::Arc;

use kplug_api::selection::{self, Candidate, Implementation, SelectError};
use kplug_api::version::VersionConstraint;

use super::{Entry, Registry};
use crate::v1alpha1::{ApiSelector, Plugin, PluginApi, Selection};

/// A registration as the rule sees it: what its stored version shows,
/// read from the registry's record without parsing the version back.
struct Live<'a> {
    name: &'a str,
    entry: &'a Entry,
}

impl Candidate for Live<'_> {
    fn name(&self) -> &str {
        self.name
    }

    fn is_ready(&self) -> bool {
        self.entry.lifecycle.ready
    }

    // The spec is the newest instance's declaration (see `render`).
    fn api(&self) -> &PluginApi {
        &self.entry.instances.newest().declaration.api
    }

    fn implementation(&self) -> &str {
        &self.entry.instances.newest().declaration.implementation
    }

    fn version(&self) -> &str {
        &self.entry.instances.newest().declaration.version
    }

    fn ready_versions(&self) -> Vec<&str> {
        // As `status.serving_instances()` of the plugin would list them.
        if !self.entry.lifecycle.ready {
            return Vec::new();
        }
        self.entry
            .instances
            .iter()
            .filter(|i| self.entry.lifecycle.serves_callers(i))
            .map(|i| i.declaration.version.as_str())
            .collect()
    }
}

impl Registry {
    /// The plugin a request should go to, and why, among those with a Ready
    /// instance in `versions` when given. The plugin is rendered
    /// from its record as of now, as its stored version shows it but with
    /// the instances' latest heartbeat times: a fraction of the work of
    /// parsing the stored JSON back, on every reconcile.
    pub fn select(
        &self,
        api: Option<&ApiSelector>,
        implementation: Implementation<'_>,
        pinned: Option<&str>,
        versions: Option<&VersionConstraint>,
    ) -> Result<(Arc<Plugin>, Selection), SelectError> {
        let state = self.state.read();
        if let Some(name) = pinned {
            let found = state.plugins.get(name).map(|entry| self.live(entry));
            return selection::pinned(name, found, api, versions);
        }
        let Some(api) = api else {
            return Err(SelectError::NoneReady("an unspecified API".to_owned()));
        };
        let candidates = state
            .plugins
            .iter()
            .map(|(name, entry)| Live { name, entry });
        let (chosen, selection) = selection::choose(candidates, api, implementation, versions)?;
        Ok((self.live(chosen.entry), selection))
    }

    fn live(&self, entry: &Entry) -> Arc<Plugin> {
        let mut object = self.render(&entry.instances, &entry.lifecycle);
        self.stamp(&mut object, entry.encoded.resource_version());
        Arc::new(object)
    }
}
