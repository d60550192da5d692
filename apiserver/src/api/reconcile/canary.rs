//! A reconcile of a plugin with canary instances: the side the object goes
//! to (`kplug_api::canary`), and how the call ended, for the registry's
//! verdict on the canary.

use jiff::Timestamp;
use kplug_api::canary::{self, Outcome, Track};
use kplug_api::selection::compare_versions;
use serde::Deserialize;

use super::decode::Object;
use crate::proxy::{Answered, ProxyError, Route};
use crate::registry::Registry;
use crate::v1alpha1::Plugin;
use crate::version::VersionConstraint;

/// A call to a plugin with a canary: the canary's version, and the side
/// the object went to.
pub(super) struct Split {
    version: String,
    track: Track,
}

/// Which instances of `plugin` may take the call for `object`: those in
/// `versions`, and, when canaries are among them, those on the object's
/// side.
pub(super) fn route<'v>(
    plugin: &Plugin,
    object: Option<&Object<'_>>,
    versions: Option<&'v VersionConstraint>,
) -> (Route<'v>, Option<Split>) {
    let in_range = Route {
        versions,
        track: None,
        shadow: false,
    };
    // The usual case, without a canary: nothing to collect or parse.
    if plugin.status.instances.iter().all(|i| i.canary_weight == 0) {
        return (in_range, None);
    }
    let eligible: Vec<_> = plugin
        .status
        .serving_instances()
        .filter(|i| in_range.admits(i))
        .collect();
    let Some(newest) = eligible
        .iter()
        .filter(|i| i.canary_weight > 0)
        .max_by(|a, b| compare_versions(&a.version, &b.version))
    else {
        return (in_range, None);
    };
    let track = canary::track(plugin.name(), &key(object), &eligible);
    let split = Split {
        version: newest.version.clone(),
        track,
    };
    let route = Route {
        track: Some(track),
        ..in_range
    };
    (route, Some(split))
}

/// The object's key for its side: its uid, else namespace/name.
fn key(object: Option<&Object<'_>>) -> String {
    #[derive(Default, Deserialize)]
    struct Metadata {
        uid: Option<String>,
        namespace: Option<String>,
        name: Option<String>,
    }
    #[derive(Default, Deserialize)]
    struct Head {
        #[serde(default)]
        metadata: Metadata,
    }
    // Read only for plugins with a canary; an object kplug passes on
    // without a readable metadata gets the empty key's side.
    let head: Head = object
        .and_then(|object| serde_json::from_slice(object.raw).ok())
        .unwrap_or_default();
    let Metadata {
        uid,
        namespace,
        name,
    } = head.metadata;
    match uid.filter(|uid| !uid.is_empty()) {
        Some(uid) => uid,
        None => format!(
            "{}/{}",
            namespace.unwrap_or_default(),
            name.unwrap_or_default()
        ),
    }
}

/// Tells the registry how the call ended, when that says something of the
/// side it went to.
pub(super) fn record(
    registry: &Registry,
    plugin: &str,
    split: &Split,
    result: &Result<Answered, ProxyError>,
) {
    let outcome = match result {
        Ok(answered) if answered.response.success => Outcome::Succeeded,
        Ok(_) => Outcome::Failed,
        Err(ProxyError::DeadlineExceeded { .. }) => Outcome::Late,
        // kplug's own bound, or no instance to call: not the side's doing.
        Err(ProxyError::Busy { .. } | ProxyError::NoneReady { .. }) => return,
        Err(_) => Outcome::Failed,
    };
    let now = Timestamp::now();
    if let Some(withdrawal) =
        registry.canary_outcome(plugin, &split.version, split.track, outcome, now)
    {
        tracing::warn!(
            plugin,
            canary = %split.version,
            "kplug withdrew the canary: {withdrawal}; it sends the canary nothing until its \
             instances declare another version"
        );
    }
}
