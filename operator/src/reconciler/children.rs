//! The children's IO: what the operator observes of the children it
//! applied, applying a plugin's desired children (server-side apply, one
//! field manager per parent, forced), removing the ones no longer desired,
//! and tearing them all down before a parent goes. Each child is tied to
//! its parent by a controller owner reference, the parent's UID label and
//! its key annotation; only a child whose controller reference is the
//! parent is ever deleted, never one a list a user can edit names.

use kplug_api::v1alpha1::DesiredChild;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::discovery::Scope;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::Context;
use crate::ChildScope;
use crate::children::{
    self, ALLOW_MASS_PRUNE, ChildStatus, KEY_ANNOTATION, PARENT_ANNOTATION, PARENT_UID_LABEL,
    PRUNE, PRUNE_DISABLED, can_own, child_namespace, controlled_by, field_manager, line_of,
    owned_child, parent_uid, ready_by_default,
};

/// Where a child's kind is served.
#[derive(Clone)]
pub struct ChildKind {
    resource: ApiResource,
    namespaced: bool,
}

/// What applying a plugin's children came to.
pub struct Applied {
    /// The new inventory.
    pub lines: Vec<ChildStatus>,
    /// Why children no longer desired were kept: a mass prune held.
    pub prune_held: Option<String>,
}

/// What became of one child this reconcile.
enum Gone {
    /// Deleted, or not there.
    Yes,
    /// Still there (being deleted, or refused): this says why.
    No(String),
}

impl Context {
    /// Where `api_version` `kind` is served, by discovery (cached per kind).
    async fn child_kind(&self, api_version: &str, kind: &str) -> Result<ChildKind, String> {
        let cache_key = format!("{api_version}/{kind}");
        if let Some(found) = self.child_kinds.lock().get(&cache_key) {
            return Ok(found.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                format!(
                    "the cluster serves no {kind} in {api_version}: {}",
                    crate::words::kube_error(&e)
                )
            })?;
        let found = ChildKind {
            resource,
            namespaced: capabilities.scope == Scope::Namespaced,
        };
        self.child_kinds.lock().insert(cache_key, found.clone());
        Ok(found)
    }

    /// The API of the child `line` names, under `parent`.
    async fn child_api(
        &self,
        parent: &DynamicObject,
        line: &ChildStatus,
    ) -> Result<Api<DynamicObject>, String> {
        let kind = self.child_kind(&line.api_version, &line.kind).await?;
        Ok(match child_namespace(parent, line, kind.namespaced) {
            Some(namespace) => {
                Api::namespaced_with(self.client.clone(), &namespace, &kind.resource)
            }
            None => Api::all_with(self.client.clone(), &kind.resource),
        })
    }

    /// The child `line` names as its kind's watch last saw it, if that
    /// watch has listed its kind.
    async fn cached_child(&self, line: &ChildStatus) -> Option<Option<DynamicObject>> {
        let kind = self.child_kind(&line.api_version, &line.kind).await.ok()?;
        (self.child_watches).cached(&kind.resource, &line.namespace, &line.name)
    }

    /// The children of `parent`'s inventory as they are now, by key, from
    /// the watches on their kinds (else from kube-apiserver); one that is
    /// gone, or cannot be read, is left out (the plugin sees it missing and
    /// asks for it again).
    pub(super) async fn observe_children(
        &self,
        parent: &DynamicObject,
        inventory: &[ChildStatus],
    ) -> Vec<(String, DynamicObject)> {
        let mut observed = Vec::with_capacity(inventory.len());
        for line in inventory {
            if let Some(cached) = self.cached_child(line).await {
                if let Some(child) = cached.filter(|c| controlled_by(c, parent)) {
                    observed.push((line.key.clone(), child));
                }
                continue;
            }
            let Ok(api) = self.child_api(parent, line).await else {
                continue;
            };
            match api.get_opt(&line.name).await {
                Ok(Some(child)) if controlled_by(&child, parent) => {
                    observed.push((line.key.clone(), child));
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(child = %line.describe(), error = %crate::words::kube_error(&error), "cannot observe a child");
                }
            }
        }
        observed
    }

    /// Applies the desired children of the waves whose lower waves are
    /// ready, removes those the answer no longer has (unless that is a mass
    /// prune the parent does not allow), and returns the new inventory. A
    /// child the API refuses is reported on its line; the others still
    /// apply.
    pub(super) async fn apply_children(
        &self,
        parent: &DynamicObject,
        desired: &[DesiredChild],
        inventory: &[ChildStatus],
        observed: &[(String, DynamicObject)],
    ) -> Applied {
        let ready_now = |key: &str| {
            inventory
                .iter()
                .any(|line| line.key == key && line.ready && line.error.is_empty())
        };
        // Applying wave by wave: each applied child's readiness, as its
        // apply answered it, opens the next wave in the same reconcile.
        let mut lines: Vec<ChildStatus> = Vec::with_capacity(desired.len());
        let mut applied: Vec<String> = Vec::new();
        loop {
            let ready = |key: &str| {
                lines
                    .iter()
                    .find(|l| l.key == key)
                    .map_or_else(|| ready_now(key), |l| l.ready && l.error.is_empty())
            };
            let Some(last) = children::last_wave(desired, ready) else {
                break;
            };
            let next: Vec<&DesiredChild> = desired
                .iter()
                .filter(|c| c.wave <= last && !applied.contains(&c.key))
                .collect();
            if next.is_empty() {
                break;
            }
            for child in next {
                applied.push(child.key.clone());
                let live = observed.iter().find(|(key, _)| *key == child.key);
                let before = inventory.iter().find(|l| l.key == child.key);
                let mut line = self.apply_child(parent, child, live.map(|(_, l)| l)).await;
                // The last drift undone stays on the line until another.
                if line.drifted.is_none() {
                    line.drifted = before.and_then(|b| b.drifted.clone());
                }
                lines.retain(|l| l.key != line.key);
                lines.push(line);
            }
        }
        // Children of waves not reached yet: kept as they were, or waiting.
        for child in desired.iter().filter(|c| !applied.contains(&c.key)) {
            let mut line = line_of(parent, child);
            let live = observed.iter().find(|(key, _)| *key == child.key);
            line.ready = live.is_some_and(|(_, live)| readiness(child, live));
            lines.push(line);
        }
        lines.sort_by_key(|l| desired.iter().position(|c| c.key == l.key));
        let stale = children::to_prune(inventory, &lines);
        let allowed = parent
            .annotations()
            .get(ALLOW_MASS_PRUNE)
            .map(String::as_str)
            == Some("true");
        let prune_held = children::prune_held(inventory.len(), &stale, allowed);
        if prune_held.is_some() {
            lines.extend(stale.into_iter().cloned());
            return Applied { lines, prune_held };
        }
        for stale in stale {
            if let Gone::No(why) = self.remove_child(parent, stale).await {
                // Kept in the inventory, so that the next reconcile tries again.
                warn!(child = %stale.describe(), %why, "a child no longer desired is not removed yet");
                lines.push(ChildStatus {
                    error: why,
                    ..stale.clone()
                });
            }
        }
        Applied { lines, prune_held }
    }

    /// Server-side applies one child as `parent`'s, unless `live` (the
    /// child as observed before) already is what the apply would make it;
    /// reports the drift it undoes.
    async fn apply_child(
        &self,
        parent: &DynamicObject,
        child: &DesiredChild,
        live: Option<&DynamicObject>,
    ) -> ChildStatus {
        let mut line = line_of(parent, child);
        let api = match self.child_api(parent, &line).await {
            Ok(api) => api,
            Err(why) => {
                line.error = why;
                return line;
            }
        };
        let kind = self.child_kind(&line.api_version, &line.kind).await;
        if let Ok(kind) = &kind {
            if !kind.namespaced {
                line.namespace.clear();
            }
            if !can_own(parent, &line.namespace)
                && self.options.child_scope == ChildScope::Namespace
            {
                let place = if kind.namespaced {
                    format!("in namespace {}", line.namespace)
                } else {
                    "cluster-scoped".to_owned()
                };
                line.error = format!(
                    "{} {} is {place}: the object cannot own it, and this operator applies \
                     children in the object's namespace only (--child-scope=namespace; \
                     cluster allows it)",
                    line.kind, line.name
                );
                return line;
            }
            let namespace = self.options.child_watch_namespace();
            (self.child_watches).ensure(&self.client, &kind.resource, namespace, &self.resource);
        }
        let body = owned_child(parent, child, &line);
        // A child applied by a reconcile whose parent the store had not yet
        // updated is not in its inventory, so not observed: its watch has it.
        let cached = match live {
            Some(_) => None,
            None => (self.cached_child(&line).await)
                .flatten()
                .filter(|c| controlled_by(c, parent)),
        };
        let live = live
            .or(cached.as_ref())
            .map(|live| (live, serde_json::to_value(live).unwrap_or_default()));
        if let Some((live, live_json)) = &live
            && children::unchanged(&body, live_json)
        {
            line.namespace = live.namespace().unwrap_or_default();
            line.ready = readiness(child, live);
            return line;
        }
        let manager = field_manager(&parent_uid(parent));
        let drifted = live.and_then(|(live, live_json)| {
            let managed = live.metadata.managed_fields.as_deref().unwrap_or_default();
            children::drift(&child.object, &live_json, managed, &manager)
        });
        if let Some(drift) = &drifted {
            let note = format!(
                "child {:?} ({}): {}; applied again",
                line.key,
                line.describe(),
                drift.describe()
            );
            warn!(%note, "drift undone");
            self.warning(parent, "ChildDrifted", &note, "Reconcile")
                .await;
            self.metrics.child_drifted(&line.kind);
            line.drifted = drifted;
        }
        let params = PatchParams::apply(&manager).force();
        match api.patch(&line.name, &params, &Patch::Apply(&body)).await {
            Ok(live) => {
                line.namespace = live.namespace().unwrap_or_default();
                line.ready = readiness(child, &live);
            }
            Err(error) => {
                line.error = crate::words::kube_error(&error);
                warn!(child = %line.describe(), error = %line.error, "a child was not applied");
            }
        }
        line
    }

    /// Deletes the child `line` names if `parent` controls it, or abandons
    /// it when it is marked so ([`children::PRUNE`]).
    async fn remove_child(&self, parent: &DynamicObject, line: &ChildStatus) -> Gone {
        let api = match self.child_api(parent, line).await {
            Ok(api) => api,
            Err(why) => return Gone::No(why),
        };
        match api.get_opt(&line.name).await {
            Ok(None) => Gone::Yes,
            // Not ours (any more): forgotten, never deleted.
            Ok(Some(child)) if !controlled_by(&child, parent) => {
                warn!(child = %line.describe(), "no longer controlled by its parent: left alone");
                Gone::Yes
            }
            Ok(Some(child)) if child.metadata.deletion_timestamp.is_some() => {
                Gone::No(format!("{} is being deleted", line.describe()))
            }
            Ok(Some(child))
                if child.annotations().get(PRUNE).map(String::as_str) == Some(PRUNE_DISABLED) =>
            {
                self.abandon_child(&api, line).await
            }
            Ok(Some(_)) => match api.delete(&line.name, &DeleteParams::background()).await {
                Ok(_) => {
                    info!(child = %line.describe(), key = %line.key, "removed a child");
                    Gone::Yes
                }
                Err(error) => Gone::No(crate::words::kube_error(&error)),
            },
            Err(error) => Gone::No(crate::words::kube_error(&error)),
        }
    }

    /// Lets go of a child marked not to be deleted: its owner reference,
    /// parent label and key annotation are removed, the rest stays.
    async fn abandon_child(&self, api: &Api<DynamicObject>, line: &ChildStatus) -> Gone {
        let patch = json!({"metadata": {
            "ownerReferences": null,
            "labels": {PARENT_UID_LABEL: null},
            "annotations": {KEY_ANNOTATION: null, PARENT_ANNOTATION: null},
        }});
        let params = PatchParams::default();
        match api.patch(&line.name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                info!(child = %line.describe(), key = %line.key, "abandoned a child marked {PRUNE}={PRUNE_DISABLED}");
                Gone::Yes
            }
            Err(error) => Gone::No(crate::words::kube_error(&error)),
        }
    }

    /// Removes `parent`'s children, highest wave first: `Ok` once they are
    /// all gone; else what the wave being removed waits for.
    pub(super) async fn tear_down_children(
        &self,
        parent: &DynamicObject,
        inventory: &[ChildStatus],
    ) -> Result<(), String> {
        let mut waves: Vec<i32> = inventory.iter().map(|l| l.wave).collect();
        waves.sort_unstable();
        waves.dedup();
        for wave in waves.into_iter().rev() {
            let mut waiting = Vec::new();
            for line in inventory.iter().filter(|l| l.wave == wave) {
                if let Gone::No(why) = self.remove_child(parent, line).await {
                    waiting.push(format!("child {:?}: {why}", line.key));
                }
            }
            // Removed now, or still going: either way the next wave waits
            // until this one is gone, which the next attempt checks.
            let still_there = self.observe_children(parent, inventory).await;
            let wave_left: Vec<String> = still_there
                .iter()
                .filter_map(|(key, _)| inventory.iter().find(|l| l.key == *key && l.wave == wave))
                .map(|l| format!("{:?} ({})", l.key, l.describe()))
                .collect();
            if !waiting.is_empty() || !wave_left.is_empty() {
                let mut why = waiting;
                if !wave_left.is_empty() {
                    why.push(format!("waiting for {} to go", wave_left.join(", ")));
                }
                return Err(why.join("; "));
            }
        }
        Ok(())
    }
}

/// The plugin's verdict, else the default rule on the live object.
fn readiness(child: &DesiredChild, live: &DynamicObject) -> bool {
    child.ready.unwrap_or_else(|| {
        let mut object = live.data.clone();
        if let (Value::Object(map), Some(types)) = (&mut object, &live.types) {
            map.insert("apiVersion".into(), json!(types.api_version));
            map.insert("kind".into(), json!(types.kind));
            map.insert(
                "metadata".into(),
                json!({"generation": live.metadata.generation}),
            );
        }
        ready_by_default(&object)
    })
}
