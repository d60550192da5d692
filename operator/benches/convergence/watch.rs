//! Widgets, the bench's kube client and its watch: when an object was seen
//! Ready, or at a resourceVersion.

use std::future::Future;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::{GROUP, KIND, OBJECT_TIMEOUT, PLURAL, REQUEST_TIMEOUT, STARTUP_TIMEOUT, VERSION};

pub fn widget_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// A Widget asking for plugins of `implementation`.
pub fn widget(name: &str, implementation: &str) -> DynamicObject {
    let spec = json!({"color": "blue", "preferredImplementation": implementation});
    DynamicObject::new(name, &widget_resource()).data(json!({ "spec": spec }))
}

pub async fn admin_client(kubeconfig: &Path) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Awaits one API call, at most `REQUEST_TIMEOUT`.
pub async fn call<T, E>(what: &str, request: impl Future<Output = Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .with_context(|| format!("{what} took longer than {REQUEST_TIMEOUT:?}"))?
        .with_context(|| what.to_owned())
}

/// Ready=True for the object's current generation, as the operator writes it.
pub fn ready_now(object: &DynamicObject) -> bool {
    let Some(generation) = object.metadata.generation else {
        return false;
    };
    let status = &object.data["status"];
    status["observedGeneration"] == generation
        && status["conditions"].as_array().is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c["type"] == "Ready"
                    && c["status"] == "True"
                    && c["observedGeneration"] == generation
            })
        })
}

/// An object as a watch saw it, and when.
pub type Seen = (DynamicObject, Instant);

/// Watches `api` and sends every object version it sees; returns once the
/// watch has listed the namespace, with the task to abort when done.
pub async fn watch(
    api: Api<DynamicObject>,
) -> Result<(mpsc::UnboundedReceiver<Seen>, tokio::task::JoinHandle<()>)> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let (listed, on_listed) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    if sender.send((object, Instant::now())).is_err() {
                        return;
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(_) => {}
                Err(error) => eprintln!("the bench's watch: {error}"),
            }
        }
    });
    tokio::time::timeout(STARTUP_TIMEOUT, on_listed)
        .await
        .context("the bench's watch did not list the namespace in time")?
        .context("the bench's watch ended")?;
    Ok((receiver, task))
}

/// The next object version the watch saw for which `wanted` holds, within
/// `within` (the ones before it are dropped).
pub async fn next_seen(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    within: tokio::time::Instant,
    what: impl Fn() -> String,
    wanted: impl Fn(&DynamicObject) -> bool,
) -> Result<Seen> {
    loop {
        match tokio::time::timeout_at(within, seen.recv()).await {
            Ok(Some((object, at))) if wanted(&object) => return Ok((object, at)),
            Ok(Some(_)) => {}
            Ok(None) => bail!("the bench's watch ended"),
            Err(_) => bail!("{} not seen in time", what()),
        }
    }
}

/// Whether a Ready object carries the plugin's greeting.
pub fn check_greeted(object: &DynamicObject) -> Result<()> {
    let name = object.name_any();
    ensure!(
        object.data["status"]["greeting"] == format!("hello, {name}"),
        "{name} is Ready without the greeting: {}",
        object.data["status"]
    );
    Ok(())
}

/// Waits until the watch shows `name` Ready; returns when it saw it.
pub async fn wait_ready(seen: &mut mpsc::UnboundedReceiver<Seen>, name: &str) -> Result<Instant> {
    let within = tokio::time::Instant::now() + OBJECT_TIMEOUT;
    let (object, at) = next_seen(
        seen,
        within,
        || format!("{name} Ready"),
        |o| o.name_any() == name && ready_now(o),
    )
    .await?;
    check_greeted(&object)?;
    Ok(at)
}

/// Waits until the watch saw `written` (its name at its resourceVersion);
/// returns when it did.
pub async fn wait_seen(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    written: &DynamicObject,
) -> Result<Instant> {
    let (name, version) = (written.name_any(), written.resource_version());
    let within = tokio::time::Instant::now() + OBJECT_TIMEOUT;
    let (_, at) = next_seen(
        seen,
        within,
        || format!("{name} at {version:?}"),
        |o| o.name_any() == name && o.resource_version() == version,
    )
    .await?;
    Ok(at)
}
