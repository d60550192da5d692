//! Watches on the kinds of the children the operator applied: a change to
//! a child (its status turning ready, an edit, its deletion) reconciles
//! its parent at once. A kind is watched from the first child of it the
//! operator applies, on the children's parent-UID label only, each event
//! mapped to the parent through the child's controller owner reference.
//! Each watch keeps a store of the children it saw, which the reconciler
//! reads instead of asking kube-apiserver for every child every time.

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt;
use futures::StreamExt;
use futures::channel::mpsc;
use kube::api::{Api, ApiResource, DynamicObject, TypeMeta};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use parking_lot::Mutex;
use tokio_util::task::AbortOnDropHandle;
use tracing::info;

use crate::children::{PARENT_ANNOTATION, PARENT_UID_LABEL};

/// One kind's watch.
struct Watch {
    /// The watch stops when this is dropped.
    _task: AbortOnDropHandle<()>,
    /// The children of the kind, as the watch last saw them, keyed with
    /// `resource`.
    store: Store<DynamicObject>,
    resource: ApiResource,
}

/// The watches started so far, and where their events go.
pub struct ChildWatches {
    /// By `apiVersion/kind`.
    watches: Mutex<HashMap<String, Watch>>,
    wake: mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
    /// Taken once by the controller: the parents to reconcile.
    woken: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<DynamicObject>>>>,
}

impl Default for ChildWatches {
    fn default() -> Self {
        let (wake, woken) = mpsc::unbounded();
        Self {
            watches: Mutex::default(),
            wake,
            woken: Mutex::new(Some(woken)),
        }
    }
}

impl ChildWatches {
    /// The parents to reconcile as their children change; `None` after
    /// the first call.
    pub fn take_woken(&self) -> Option<mpsc::UnboundedReceiver<ObjectRef<DynamicObject>>> {
        self.woken.lock().take()
    }

    /// Watches `child`'s kind, unless it is watched already, in
    /// `namespace` (all namespaces for `None`), waking parents of `parent`'s
    /// resource.
    pub fn ensure(
        &self,
        client: &Client,
        child: &ApiResource,
        namespace: Option<&str>,
        parent: &ApiResource,
    ) {
        let key = format!("{}/{}", child.api_version, child.kind);
        let mut watches = self.watches.lock();
        if watches.contains_key(&key) {
            return;
        }
        let api = match namespace {
            Some(namespace) => {
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, child)
            }
            None => Api::all_with(client.clone(), child),
        };
        let config = watcher::Config::default().labels(PARENT_UID_LABEL);
        let (wake, parent) = (self.wake.clone(), parent.clone());
        let writer = Writer::new(child.clone());
        let store = writer.as_reader();
        let changes = watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        let task = tokio::spawn(async move {
            changes
                .for_each(|change| {
                    if let Ok(child) = change
                        && let Some(parent) = parent_of(&child, &parent)
                    {
                        let _ = wake.unbounded_send(parent);
                    }
                    std::future::ready(())
                })
                .await;
        });
        info!(kind = %key, "watching the operator's children of this kind");
        let watch = Watch {
            _task: AbortOnDropHandle::new(task),
            store,
            resource: child.clone(),
        };
        watches.insert(key, watch);
    }

    /// The child `name` of kind `child` in `namespace` (empty: cluster-
    /// scoped) as its watch last saw it: `Some(None)` when the watch has
    /// listed and not seen it, `None` when the kind is not watched or not
    /// listed yet (ask kube-apiserver).
    pub fn cached(
        &self,
        child: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Option<Option<DynamicObject>> {
        let key = format!("{}/{}", child.api_version, child.kind);
        let watches = self.watches.lock();
        let Watch {
            store, resource, ..
        } = watches.get(&key)?;
        store.wait_until_ready().now_or_never()?.ok()?;
        let reference = ObjectRef::new_with(name, resource.clone());
        let reference = match namespace {
            "" => reference,
            namespace => reference.within(namespace),
        };
        // Listed objects come without their kind: give it back.
        let typed = |child: Arc<DynamicObject>| DynamicObject {
            types: Some(TypeMeta {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
            }),
            ..DynamicObject::clone(&child)
        };
        Some(store.get(&reference).map(typed))
    }
}

/// The parent of `child` among objects of `parent`: its controller owner
/// reference, in the child's namespace; else, for a child its parent
/// cannot own, the parent its annotation names.
fn parent_of(child: &DynamicObject, parent: &ApiResource) -> Option<ObjectRef<DynamicObject>> {
    let owner = child.owner_references().iter().find(|owner| {
        owner.controller == Some(true)
            && owner.api_version == parent.api_version
            && owner.kind == parent.kind
    });
    if let Some(owner) = owner {
        let found = ObjectRef::new_with(&owner.name, parent.clone());
        return Some(match child.namespace() {
            Some(namespace) => found.within(&namespace),
            None => found,
        });
    }
    let named = child.annotations().get(PARENT_ANNOTATION)?;
    Some(match named.split_once('/') {
        Some((namespace, name)) => ObjectRef::new_with(name, parent.clone()).within(namespace),
        None => ObjectRef::new_with(named, parent.clone()),
    })
}
