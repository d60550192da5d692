//! The operator's requests for an object, sent by the bench itself, in the
//! same run: what the bound of `phases` leaves out.
//!
//! The bound adds up raw writes of one field each. The operator's are
//! larger: its status apply carries the whole status (two conditions, the
//! plugin, the selection, `observedGeneration`, the plugin's fields) and
//! its managedFields, its finalizer is a JSON patch, its Event an
//! `events.k8s.io` Event; and during its run two watches (its own and the
//! bench's) see every change of every object. Here the bench copies what
//! the operator wrote for one object of the latency run and sends the same
//! requests, in the operator's order (create, finalizer, reconcile, status,
//! Event), `IN_FLIGHT` objects at a time in `baseline`: once with no watch
//! on that namespace and once with two. What is left between the second and
//! the operator's own run is the operator: its CPU on the same cores, its
//! queue, its cache.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kplug_test_support::measure::{CpuSnapshot, CpuUsage};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::phases::{in_flight, quiet, reconcile_once};
use crate::watch::{admin_client, call, watch, widget, widget_resource};
use crate::{BASELINE_NAMESPACE, Counts, GROUP, HELLO, KIND, NAMESPACE, VERSION};

/// The object of the latency run whose writes are copied.
const TEMPLATE: &str = "latency-00";

pub struct Replays {
    /// `counts.objects` objects' requests with no watch on their namespace.
    pub unwatched: Duration,
    /// The same with two watches on it, as in the operator's run.
    pub watched: Duration,
    /// The bytes of the operator's status apply, against the raw one's.
    pub status_bytes: usize,
    pub phases: Vec<(&'static str, usize, CpuUsage)>,
}

/// What the operator wrote for one object.
struct Template {
    finalizers: Vec<String>,
    /// The body of its status apply and its field manager.
    status: Value,
    manager: String,
    event: Event,
}

impl Template {
    async fn of(client: &Client) -> Result<Self> {
        let bench =
            Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &widget_resource());
        let object = call("get the template", bench.get(TEMPLATE)).await?;
        let manager = object
            .managed_fields()
            .iter()
            .find(|entry| entry.operation.as_deref() == Some("Apply"))
            .and_then(|entry| entry.manager.clone())
            .with_context(|| format!("{TEMPLATE} has no applied fields"))?;
        let events = Api::<Event>::namespaced(client.clone(), NAMESPACE);
        let event = call("list the Events", events.list(&ListParams::default()))
            .await?
            .items
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(TEMPLATE))
            .with_context(|| format!("no Event about {TEMPLATE}"))?;
        Ok(Self {
            finalizers: object.finalizers().to_vec(),
            status: json!({
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": KIND,
                "status": object.data["status"],
            }),
            manager,
            event,
        })
    }

    /// The operator's requests for a new object `name`, one after another.
    async fn replay(&self, client: &Client, name: String) -> Result<()> {
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            BASELINE_NAMESPACE,
            &widget_resource(),
        );
        let created = call(
            "create",
            api.create(&PostParams::default(), &widget(&name, HELLO)),
        )
        .await?;
        // The operator's finalizer patch: test the list it read, then add.
        let finalizers: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": self.finalizers},
        ]))?;
        let patched = call(
            "patch the finalizer",
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Json::<()>(finalizers),
            ),
        )
        .await?;
        reconcile_once(client, patched.clone()).await?;
        let params = PatchParams::apply(&self.manager).force();
        let written = call(
            "apply the status",
            api.patch_status(&name, &params, &Patch::Apply(&self.status)),
        )
        .await?;
        let mut event = self.event.clone();
        event.metadata = ObjectMeta {
            name: Some(format!("{name}.replayed")),
            namespace: Some(BASELINE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        };
        if let Some(regarding) = &mut event.regarding {
            regarding.namespace = Some(BASELINE_NAMESPACE.to_owned());
            regarding.name = Some(name.clone());
            regarding.uid = created.uid();
            regarding.resource_version = written.resource_version();
        }
        let events = Api::<Event>::namespaced(client.clone(), BASELINE_NAMESPACE);
        call(
            "create the Event",
            events.create(&PostParams::default(), &event),
        )
        .await?;
        Ok(())
    }
}

pub async fn measure(
    kubeconfig: &Path,
    processes: &[(&'static str, u32)],
    counts: Counts,
) -> Result<Replays> {
    let client = admin_client(kubeconfig).await?;
    let template = Template::of(&client).await?;
    let pids: Vec<u32> = processes.iter().map(|(_, pid)| *pid).collect();
    let mut phases = Vec::new();
    let mut replay = async |what: &'static str, prefix: &str| -> Result<Duration> {
        quiet(processes).await?;
        let before = CpuSnapshot::now(&pids)?;
        let (elapsed, _) = in_flight(what, counts.objects, |i| {
            template.replay(&client, format!("{prefix}-{i:04}"))
        })
        .await?;
        phases.push((what, counts.objects, before.usage()?));
        Ok(elapsed)
    };
    let unwatched = replay(
        "the operator's requests replayed, no watch (per object)",
        "replay",
    )
    .await?;
    let baseline = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        BASELINE_NAMESPACE,
        &widget_resource(),
    );
    // The operator's watch and the bench's, each reading every change.
    let (_seen, first) = watch(baseline.clone()).await?;
    let (_also_seen, second) = watch(baseline).await?;
    let watched = replay("the same, two watches open (per object)", "replay-watched").await;
    first.abort();
    second.abort();
    let watched = watched?;
    Ok(Replays {
        unwatched,
        watched,
        status_bytes: template.status.to_string().len(),
        phases,
    })
}
