//! Server-side selection: which live plugin serves a request.
//!
//! The rule itself (pinned, required, preferred, fallback; highest version
//! then smallest name) lives in [`kplug_api::selection`], so that clients
//! such as `kubectl kplug plugins` explain a choice exactly as kplug makes
//! it; this applies it to the registry's live objects.

use std::sync::Arc;

use kplug_api::selection::{self, Implementation, SelectError};

use super::Registry;
use crate::v1alpha1::{ApiSelector, Plugin, Selection};

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
        // Only the candidates are listed (and cloned as Arcs): the registry
        // filters under its lock, the rule re-checks the same predicate.
        let ready = self
            .list(None, |p| p.is_ready() && api.matches(&p.spec.api))
            .items
            .into_iter()
            .map(|item| item.object);
        selection::choose(ready, api, implementation)
    }
}
