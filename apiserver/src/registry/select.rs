//! Server-side selection: which live plugin serves a request.
//!
//! The rule itself (pinned, required, preferred, fallback; highest version
//! then smallest name) lives in [`kplug_api::selection`], so that clients
//! such as `kubectl kplug plugins` explain a choice exactly as kplug makes
//! it; this applies it to the registry's live records.

use std::sync::Arc;

use kplug_api::selection::{self, Candidate, Implementation, SelectError};

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
}

impl Registry {
    /// The plugin a request should go to, and why.
    pub fn select(
        &self,
        api: Option<&ApiSelector>,
        implementation: Implementation<'_>,
        pinned: Option<&str>,
    ) -> Result<(Arc<Plugin>, Selection), SelectError> {
        if let Some(name) = pinned {
            return selection::pinned(name, self.get(name), api);
        }
        let Some(api) = api else {
            return Err(SelectError::NoneReady("an unspecified API".to_owned()));
        };
        let (chosen, selection) = {
            let state = self.state.read();
            let live = state
                .plugins
                .iter()
                .map(|(name, entry)| Live { name, entry });
            let (chosen, selection) = selection::choose(live, api, implementation)?;
            (chosen.entry.encoded.clone(), selection)
        };
        // Only the chosen plugin is read back into a typed object. Should it
        // not read back (a bug, logged), there is nobody to call.
        let plugin = chosen
            .object()
            .ok_or_else(|| SelectError::NoneReady(api.qualified_resource()))?;
        Ok((Arc::new(plugin), selection))
    }
}
