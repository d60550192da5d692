//! The kube-runtime `Controller` behind an [`Operator`](crate::Operator):
//! what triggers a reconcile.
//!
//! - the resource itself, filtered to changes that need a plugin: its
//!   generation, deletion, its annotations (so that annotating an object
//!   reconciles it at once); never the operator's own status and
//!   finalizer writes;
//! - the watched extension resources (generation changes), mapped to the
//!   objects that refer to them;
//! - Plugins of the resource's API turning Ready (kplug's own watch API,
//!   through kube-apiserver), mapped to the objects waiting for a plugin;
//! - the children the operator applied changing, mapped to their parent
//!   (`child_watch`).

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use kplug_api::v1alpha1::{API_VERSION, GROUP, Plugin, VERSION, labels};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::extensions;
use crate::reconciler::{Context, error_policy, reconcile};
use crate::status::Owned;

/// Changes to an object that call for a reconcile.
fn trigger_hash(object: &DynamicObject) -> u64 {
    let mut hasher = DefaultHasher::new();
    object.meta().generation.hash(&mut hasher);
    object.meta().deletion_timestamp.is_some().hash(&mut hasher);
    object.annotations().hash(&mut hasher);
    hasher.finish()
}

pub(crate) fn plugin_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: API_VERSION.to_owned(),
        kind: Plugin::KIND.to_owned(),
        plural: Plugin::PLURAL.to_owned(),
    }
}

pub(crate) fn is_ready(plugin: &DynamicObject) -> bool {
    let conditions = plugin
        .data
        .pointer("/status/conditions")
        .and_then(|c| c.as_array());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The longest wait between two asks whether kplug answers again.
const MAX_REACHABILITY_PROBE: Duration = Duration::from_secs(5);

/// While objects wait because kube-apiserver could not reach kplug (its
/// pods not Ready, say while their node is unreachable), asks kplug for one
/// plugin, backing off from `--min-backoff` to 5 s; once kplug answers,
/// wakes them all at once instead of leaving each to its own backoff,
/// which an outage has stretched towards `--max-backoff`. The watch of
/// plugins cannot tell: an open watch outlives the Service losing kplug.
async fn wake_when_kplug_answers(
    ctx: Arc<Context>,
    wake: mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
) {
    let plugins =
        Api::<DynamicObject>::all_with(ctx.delegator.client().clone(), &plugin_resource());
    loop {
        ctx.kplug_unreachable.notified().await;
        let mut delay = ctx.options.min_backoff.min(MAX_REACHABILITY_PROBE);
        while !ctx.unreachable.lock().is_empty() {
            tokio::time::sleep(delay).await;
            // In full: kplug serves no metadata-only (PartialObjectMetadata) lists.
            if plugins.list(&ListParams::default().limit(1)).await.is_ok() {
                let woken: Vec<_> = ctx.unreachable.lock().drain().collect();
                info!(
                    objects = woken.len(),
                    "kplug answers again: waking the objects that could not reach it"
                );
                for object in woken {
                    let _ = wake.unbounded_send(object);
                }
                break;
            }
            delay = (delay * 2).min(MAX_REACHABILITY_PROBE);
        }
    }
}

/// The objects in `store` that refer to `extension`.
fn referring(
    ctx: &Context,
    store: &Store<DynamicObject>,
    extension: &DynamicObject,
) -> Vec<ObjectRef<DynamicObject>> {
    store
        .state()
        .iter()
        .filter(|object| {
            let namespace = object.namespace();
            (ctx.hooks.extensions)(object, &ctx.options).is_ok_and(|refs| {
                refs.iter()
                    .any(|r| extensions::names(r, extension, namespace.as_deref()))
            })
        })
        .map(|object| ObjectRef::from_obj_with(object.as_ref(), ctx.resource.clone()))
        .collect()
}

/// The resources watched besides the operator's own, resolved at startup.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    /// `--watch-extension`: changes wake the objects that refer to them.
    pub extensions: Vec<ApiResource>,
    /// `--child-resource`: changes wake the child's parent.
    pub children: Vec<ApiResource>,
}

/// Runs the controller until `shutdown`, then lets reconciles under way
/// finish. `plugins` fills the Context's store of the API's Plugins.
pub async fn run(
    ctx: Arc<Context>,
    watched: Watched,
    plugins: Writer<DynamicObject>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let client = ctx.client.clone();
    let resource = ctx.resource.clone();
    let api = match &ctx.options.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let writer = Writer::new(resource.clone());
    let store = writer.as_reader();
    let field_manager = ctx.options.field_manager.clone();
    let objects = watcher(api, watcher::Config::default())
        .default_backoff()
        // Of an object's managedFields the operator reads only its own
        // entry; the cache keeps no other manager's.
        .modify(move |object: &mut DynamicObject| {
            Owned::keep_only_ours(object.meta_mut(), &field_manager);
        })
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            |o: &DynamicObject| Some(trigger_hash(o)),
            Default::default(),
        );
    let config = controller::Config::default().concurrency(ctx.options.concurrency);
    let mut controller =
        Controller::for_stream_with(objects, store.clone(), resource.clone()).with_config(config);

    for extension in watched.extensions {
        let api = Api::<DynamicObject>::all_with(client.clone(), &extension);
        let changes = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .predicate_filter(predicates::generation, Default::default());
        let (ctx, store) = (ctx.clone(), store.clone());
        controller = controller.watches_stream_with(
            changes,
            move |e| referring(&ctx, &store, &e),
            extension,
        );
    }

    let api_label = format!("{}={}.{}", labels::API, resource.plural, resource.group);
    let plugins_api = Api::<DynamicObject>::all_with(client, &plugin_resource());
    let ready_changes = watcher(plugins_api, watcher::Config::default().labels(&api_label))
        .default_backoff()
        .reflect(plugins)
        .applied_objects()
        .predicate_filter(
            |p: &DynamicObject| {
                let mut hasher = DefaultHasher::new();
                (p.uid(), is_ready(p)).hash(&mut hasher);
                Some(hasher.finish())
            },
            Default::default(),
        );
    let waking = ctx.clone();
    controller = controller.watches_stream_with(
        ready_changes,
        move |plugin| {
            if !is_ready(&plugin) {
                return Vec::new();
            }
            let waiting: Vec<_> = waking.waiting.lock().iter().cloned().collect();
            if !waiting.is_empty() {
                info!(plugin = %plugin.name_any(), objects = waiting.len(), "a plugin is Ready: waking the objects waiting for one");
            }
            waiting
        },
        plugin_resource(),
    );

    let (wake, woken) = mpsc::unbounded();
    let _prober = AbortOnDropHandle::new(tokio::spawn(wake_when_kplug_answers(ctx.clone(), wake)));
    controller = controller.reconcile_on(woken);
    if let Some(children_changed) = ctx.child_watches.take_woken() {
        controller = controller.reconcile_on(children_changed);
    }
    let namespace = ctx.options.child_watch_namespace();
    for child in &watched.children {
        (ctx.child_watches).ensure(&ctx.client, child, namespace, &resource);
    }

    // The controller wants a `Sync` trigger; a oneshot receiver is one.
    let (stop, stopped) = oneshot::channel::<()>();
    let (early, stopped_early) = oneshot::channel::<()>();
    let first_list = store.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(());
        // kube-runtime holds every reconcile until the store has its first
        // list, and a graceful shutdown before then waits for that list
        // forever (the watch is no longer read): nothing has run, so there
        // is nothing to finish.
        if first_list.wait_until_ready().now_or_never().is_none() {
            let _ = early.send(());
        }
    });
    info!(resource = %format!("{}.{}", resource.plural, resource.group), "controller started");
    let running = controller
        .graceful_shutdown_on(stopped.map(|_| ()))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(%object, "reconciled"),
                // error_policy has logged it with its delay.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(object)) => {
                    debug!(%object, "gone before its reconcile")
                }
                Err(error) => {
                    let error = crate::words::controller_error(&error);
                    warn!(%error, "controller");
                }
            }
        });
    let before_first_list = async {
        match stopped_early.await {
            Ok(()) => info!("stopped before the first list of the resource: nothing to finish"),
            // Stopped after it, or not at all: the controller finishes.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = running => {}
        () = before_first_list => {}
    }
    info!("controller stopped");
}
