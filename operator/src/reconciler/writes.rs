//! What a reconcile writes: the object's and its extensions' status
//! (server-side apply, skipped when nothing would change) and Events.

use std::sync::Arc;

use jiff::Timestamp;
use kplug_api::v1alpha1::ReconcileStatus;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};
use tracing::warn;

use super::{Context, ReconcileError};
use crate::children::ChildStatus;
use crate::extensions::{self, ExtensionRef};
use crate::metrics::WriteTarget;
use crate::status::{Desired, Outcome, Owned, RETRYING, needs_write, reporter};

/// What a reconcile knows of the object's children, for its status.
#[derive(Clone, Copy)]
pub(super) struct Written<'a> {
    /// The inventory after the reconcile.
    pub children: &'a [ChildStatus],
    /// Why a mass prune was held, if it was.
    pub prune_held: Option<&'a str>,
}

/// An object as a status write left it, and the resourceVersion it replaced.
pub(super) struct LastWrite {
    replaced: Option<String>,
    written: Arc<DynamicObject>,
}

impl Context {
    pub(super) async fn event(
        &self,
        object: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note.chars().take(1024).collect()),
            action: action.to_owned(),
            secondary: None,
        };
        let reference = object.object_ref(&self.resource);
        let published = self.events.publish(&event, &reference).await;
        self.metrics
            .event(type_ == EventType::Normal, reason, published.is_ok());
        if let Err(error) = published {
            let error = crate::words::kube_error(&error);
            warn!(%error, object = %self.object_ref(object), reason, "recording an Event failed");
        }
    }

    pub(super) async fn warning(
        &self,
        object: &DynamicObject,
        reason: &str,
        note: &str,
        action: &str,
    ) {
        self.event(object, EventType::Warning, reason, note, action)
            .await;
    }

    /// Applies `desired` to `object`'s status unless nothing would change;
    /// returns the object as written, if it wrote.
    pub(super) async fn write_status(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        desired: Map<String, Value>,
        owned: &Owned,
        target: WriteTarget,
    ) -> Result<Option<DynamicObject>, ReconcileError> {
        let current = object.data.get("status").unwrap_or(&Value::Null);
        if !needs_write(current, &desired, owned) {
            return Ok(None);
        }
        let types = object.types.clone().unwrap_or_default();
        let what = format!("the status of {} {}", types.kind, object.name_any());
        let patch = json!({
            "apiVersion": types.api_version,
            "kind": types.kind,
            "status": desired,
        });
        tracing::debug!(%what, %patch, "applying");
        let params = PatchParams::apply(&self.options.field_manager).force();
        let written = api
            .patch_status(&object.name_any(), &params, &Patch::Apply(&patch))
            .await;
        self.metrics.status_written(target, written.is_ok());
        written
            .map(Some)
            .map_err(|source| ReconcileError::Write { what, source })
    }

    /// `object`, or the object as this operator's last status write left it
    /// while the cache still shows the version that write replaced: a
    /// reconcile the write's own watch events woke compares with what was
    /// written, not with what the cache has not caught up with.
    fn fresher(&self, object: &DynamicObject) -> Option<Arc<DynamicObject>> {
        let key = self.object_ref(object);
        let mut last = self.last_written.lock();
        let LastWrite { replaced, written } = last.get(&key)?;
        if object.resource_version() == *replaced {
            return Some(Arc::clone(written));
        }
        // The cache caught up (or someone else wrote): trust it again.
        last.remove(&key);
        None
    }

    /// Writes the object's status for `outcome` and its children, when it
    /// changes anything.
    pub(super) async fn write_outcome(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        binding: Option<&str>,
        outcome: &Outcome<'_>,
        written: Written<'_>,
    ) -> Result<bool, ReconcileError> {
        let fresher = self.fresher(object);
        let object = fresher.as_deref().unwrap_or(object);
        let owned = Owned::read(&object.metadata, &self.options.field_manager);
        let desired = Desired {
            current: object.data.get("status").unwrap_or(&Value::Null),
            owned: &owned,
            generation: object.metadata.generation,
            binding,
            layout: &self.options.object_status,
            now: Timestamp::now(),
            children: written.children,
            prune_held: written.prune_held,
        }
        .status(outcome);
        let Some(after) = self
            .write_status(api, object, desired, &owned, WriteTarget::Object)
            .await?
        else {
            return Ok(false);
        };
        let last = LastWrite {
            replaced: object.resource_version(),
            written: Arc::new(after),
        };
        self.last_written
            .lock()
            .insert(self.object_ref(object), last);
        Ok(true)
    }

    /// Writes the plugin's extension statuses; a failure is reported on the
    /// object and does not stop the others.
    pub(super) async fn write_extension_statuses(
        &self,
        object: &DynamicObject,
        extensions: &[DynamicObject],
        answer: &ReconcileStatus,
    ) {
        for reported in &answer.extension_statuses {
            let reference = ExtensionRef {
                api_version: reported.reference.api_version.clone(),
                kind: reported.reference.kind.clone(),
                name: reported.reference.name.clone(),
                namespace: Some(reported.reference.namespace.clone()).filter(|n| !n.is_empty()),
            };
            let namespace = object.namespace();
            let Some(extension) = extensions
                .iter()
                .find(|e| extensions::names(&reference, e, namespace.as_deref()))
            else {
                warn!(object = %self.object_ref(object), extension = %reference, "the plugin reported a status for an extension it was not sent");
                continue;
            };
            let Value::Object(desired) = &reported.status else {
                warn!(extension = %reference, "the plugin reported a status that is not an object");
                continue;
            };
            let result = async {
                let api = self
                    .resolver
                    .api(&reference, namespace.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                let owned = Owned::read(&extension.metadata, &self.options.field_manager);
                self.write_status(
                    &api,
                    extension,
                    desired.clone(),
                    &owned,
                    WriteTarget::Extension,
                )
                .await
                .map_err(|e| e.to_string())
            };
            if let Err(message) = result.await {
                self.warning(object, "ExtensionStatusNotWritten", &message, "Reconcile")
                    .await;
            }
        }
    }

    pub(super) async fn record_results(
        &self,
        object: &DynamicObject,
        answer: &ReconcileStatus,
        action: &str,
    ) {
        for result in &answer.results {
            if result.severity == "Normal" {
                self.event(
                    object,
                    EventType::Normal,
                    &result.reason,
                    &result.message,
                    action,
                )
                .await;
                continue;
            }
            // As the Ready condition words it: who said so, and what next.
            let reporter = reporter(&answer.plugin);
            let note = if answer.success {
                format!("{} (reported by {reporter})", result.message)
            } else {
                format!("{} (reported by {reporter}); {RETRYING}", result.message)
            };
            self.event(object, EventType::Warning, &result.reason, &note, action)
                .await;
        }
        if answer.results.is_empty() && !answer.success {
            self.warning(
                object,
                "ReconcileFailed",
                "the plugin reported a failure",
                action,
            )
            .await;
        }
    }
}
