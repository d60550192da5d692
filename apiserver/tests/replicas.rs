//! kplug as several processes: replicas side by side and a restart. Plugins
//! (the Rust SDK's real heartbeater) heartbeat to every process, so each
//! holds the whole registry; resourceVersions name the process that issued
//! them, so a client that moves to another process (kube-rs's watcher,
//! kubectl, through a stand-in for the Service) relists instead of
//! replaying another process's history.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kplug_sdk::heartbeat::Heartbeats;
use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
use kplug_test_support::{Service, StandaloneKplug, kube_client, plugins_resource, wait_until};
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde_json::Value;

/// The registry URL the heartbeaters are given; their resolver, not DNS,
/// turns it into the processes' addresses, as a headless Service would.
const REGISTRY: &str = "http://kplug-registry.test:1";

/// One plugin heartbeating to every address in `replicas` through the SDK.
fn heartbeater(name: &str, interval: Duration, replicas: Vec<SocketAddr>) -> Heartbeats {
    let info = PluginInfo::new(name, ApiRef::new("replicas.kplug.io", "things", "v1"))
        .version("1.0.0")
        .implementation("Replicated")
        .address(format!("{name}.plugins.test:50051"));
    Heartbeater::new(REGISTRY, info)
        .instance(format!("{name}-0"))
        .interval(interval)
        .resolver(move |_host: &str, _port: u16| std::future::ready(Ok(replicas.clone())))
        .start()
        .expect("start heartbeating")
}

/// name → uid of the plugins `kplug` lists.
fn listed(kplug: &StandaloneKplug) -> BTreeMap<String, String> {
    let (code, body) = kplug.curl("GET", "/apis/plugins.kplug.io/v1alpha1/plugins", &[], None);
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("a PluginList");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let text = |field: &str| p["metadata"][field].as_str().unwrap_or_default().to_owned();
            (text("name"), text("uid"))
        })
        .collect()
}

/// What a kube-rs `watcher` has seen: name → uid, and how many full lists
/// it has applied.
#[derive(Default)]
struct Watched {
    objects: BTreeMap<String, String>,
    relisting: BTreeMap<String, String>,
    lists: usize,
}

/// Runs kube-rs's watcher (with its default backoff, as controllers do)
/// over plugins through `server`, with the kubeconfig's credentials.
async fn watch(kplug: &StandaloneKplug, server: Option<&str>) -> Arc<Mutex<Watched>> {
    let client = kube_client(&kplug.kubeconfig, server).await;
    let api: Api<DynamicObject> = Api::all_with(client, &plugins_resource());
    let watched = Arc::new(Mutex::new(Watched::default()));
    let state = watched.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let key = |o: &DynamicObject| {
                let meta = &o.metadata;
                (
                    meta.name.clone().unwrap_or_default(),
                    meta.uid.clone().unwrap_or_default(),
                )
            };
            let mut state = state.lock();
            match event {
                watcher::Event::Init => state.relisting.clear(),
                watcher::Event::InitApply(o) => {
                    let (name, uid) = key(&o);
                    state.relisting.insert(name, uid);
                }
                watcher::Event::InitDone => {
                    state.objects = std::mem::take(&mut state.relisting);
                    state.lists += 1;
                }
                watcher::Event::Apply(o) => {
                    let (name, uid) = key(&o);
                    state.objects.insert(name, uid);
                }
                watcher::Event::Delete(o) => {
                    state.objects.remove(&key(&o).0);
                }
            }
        }
    });
    watched
}

/// Waits (off the runtime's threads) until `check` passes.
async fn eventually(
    what: &str,
    within: Duration,
    check: impl Fn() -> Result<(), String> + Send + 'static,
) {
    let what = what.to_owned();
    tokio::task::spawn_blocking(move || wait_until(&what, within, check))
        .await
        .expect("the wait panicked");
}

fn same(watched: &Arc<Mutex<Watched>>, expected: &BTreeMap<String, String>) -> Result<(), String> {
    let seen = watched.lock().objects.clone();
    let stale: Vec<&String> = seen
        .iter()
        .filter(|(name, uid)| expected.get(*name) != Some(*uid))
        .map(|(name, _)| name)
        .collect();
    let missing: Vec<&String> = expected
        .keys()
        .filter(|name| !seen.contains_key(*name))
        .collect();
    if stale.is_empty() && missing.is_empty() {
        return Ok(());
    }
    let some = |names: &[&String]| {
        names
            .iter()
            .take(5)
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "the watcher holds {} stale objects ({}...) and misses {} ({}...)",
        stale.len(),
        some(&stale),
        missing.len(),
        some(&missing)
    ))
}

/// Waits until the watcher holds exactly what `kplug` lists, uids included,
/// and checks that it got there by a new full list (more than
/// `lists_before`), not by resuming another process's history.
async fn relisted_and_converged(
    watched: &Arc<Mutex<Watched>>,
    kplug: &Arc<StandaloneKplug>,
    lists_before: usize,
    when: &str,
) {
    let (w, k) = (watched.clone(), kplug.clone());
    eventually(
        &format!("the watcher converges {when}"),
        Duration::from_secs(60),
        move || same(&w, &listed(&k)),
    )
    .await;
    assert!(
        watched.lock().lists > lists_before,
        "the watcher did not relist {when}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_the_same_plugins_and_a_client_that_moves_relists() {
    let a = StandaloneKplug::start();
    let b = a.replica(&[]);
    let replicas = vec![a.grpc_address(), b.grpc_address()];
    let interval = Duration::from_secs(1);
    let names: Vec<String> = (0..20).map(|i| format!("replicated-{i:02}")).collect();
    let mut plugins: BTreeMap<String, Heartbeats> = names
        .iter()
        .map(|name| (name.clone(), heartbeater(name, interval, replicas.clone())))
        .collect();

    let (a, b) = (Arc::new(a), Arc::new(b));
    let (a2, b2, expected) = (a.clone(), b.clone(), names.clone());
    eventually(
        "both replicas list every plugin",
        Duration::from_secs(30),
        move || {
            let (on_a, on_b) = (listed(&a2), listed(&b2));
            let (names_a, names_b): (Vec<_>, Vec<_>) =
                (on_a.into_keys().collect(), on_b.into_keys().collect());
            (names_a == expected && names_b == expected)
                .then_some(())
                .ok_or_else(|| format!("a lists {names_a:?}, b lists {names_b:?}"))
        },
    )
    .await;

    // Each process's versions are its own: b answers a's with 410 Expired,
    // for a watch (an ERROR event, as kube-apiserver) and a list's continue.
    let (code, body) = a.curl(
        "GET",
        "/apis/plugins.kplug.io/v1alpha1/plugins?limit=5",
        &[],
        None,
    );
    assert_eq!(code, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("a PluginList");
    let version = page["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let token = page["metadata"]["continue"].as_str().unwrap_or_default();
    assert!(!version.is_empty() && !token.is_empty(), "{body}");
    let (code, body) = b.curl(
        "GET",
        &format!("/apis/plugins.kplug.io/v1alpha1/plugins?watch=1&resourceVersion={version}&timeoutSeconds=2"),
        &[],
        None,
    );
    assert_eq!(code, 200, "{body}");
    let event: Value =
        serde_json::from_str(body.lines().next().unwrap_or_default()).expect("an event");
    assert_eq!(event["type"], "ERROR", "{body}");
    assert_eq!(event["object"]["code"], 410, "{body}");
    assert_eq!(event["object"]["reason"], "Expired", "{body}");
    let (code, body) = b.curl(
        "GET",
        &format!("/apis/plugins.kplug.io/v1alpha1/plugins?limit=5&continue={token}"),
        &[],
        None,
    );
    assert_eq!(code, 410, "{body}");
    // A continue on the process that issued it still works.
    let (code, body) = a.curl(
        "GET",
        &format!("/apis/plugins.kplug.io/v1alpha1/plugins?limit=5&continue={token}"),
        &[],
        None,
    );
    assert_eq!(code, 200, "{body}");

    // Clients reach the replicas through a Service; a is first in line.
    let service = Service::new(vec![a.api_address(), b.api_address()]);
    let server = format!("https://127.0.0.1:{}", service.port);
    let watched = watch(&a, Some(&server)).await;
    let (w, a2) = (watched.clone(), a.clone());
    eventually(
        "the watcher holds a's plugins",
        Duration::from_secs(20),
        move || same(&w, &listed(&a2)),
    )
    .await;
    let lists_before = watched.lock().lists;

    // a goes away; meanwhile the plugins change: three stop (deregistering
    // from b, the replica left) and two new ones start.
    let mut a = Arc::into_inner(a).expect("the only handle on a");
    a.process.kill();
    for name in &names[..3] {
        if let Some(stopping) = plugins.remove(name) {
            // Deregistering from a, which is gone, fails; b must hear it.
            let _ = stopping.stop().await;
        }
    }
    for name in ["replicated-new-0", "replicated-new-1"] {
        plugins.insert(
            name.to_owned(),
            heartbeater(name, interval, replicas.clone()),
        );
    }
    let b2 = b.clone();
    eventually(
        "b lists the changed plugins",
        Duration::from_secs(20),
        move || {
            let names: Vec<String> = listed(&b2).into_keys().collect();
            (names.len() == 19 && !names.contains(&"replicated-00".to_owned()))
                .then_some(())
                .ok_or_else(|| format!("b lists {names:?}"))
        },
    )
    .await;

    // The watcher resumed on b with a's version, was told 410 and relisted:
    // it holds exactly b's plugins, uids included.
    relisted_and_converged(&watched, &b, lists_before, "after moving to b").await;

    // kubectl through the Service keeps working against b.
    let kubectl = tokio::task::spawn_blocking({
        let b = b.clone();
        move || b.kubectl_ok(&["get", "plugins", "-o", "name", "--server", &server])
    })
    .await
    .expect("kubectl");
    assert_eq!(kubectl.lines().count(), 19, "{kubectl}");
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_kplug_is_whole_again_within_one_heartbeat_interval() {
    let kplug = StandaloneKplug::start();
    let replicas = vec![kplug.grpc_address()];
    let interval = Duration::from_secs(2);
    let mut plugins: Vec<Heartbeats> = (0..200)
        .map(|i| heartbeater(&format!("restarted-{i:03}"), interval, replicas.clone()))
        .collect();
    let watched = watch(&kplug, None).await;
    let kplug = Arc::new(kplug);
    let (w, k) = (watched.clone(), kplug.clone());
    eventually(
        "the watcher holds the 200 plugins",
        Duration::from_secs(30),
        move || {
            let listed = listed(&k);
            if listed.len() != 200 {
                return Err(format!("{} plugins listed", listed.len()));
            }
            same(&w, &listed)
        },
    )
    .await;
    let lists_before = watched.lock().lists;

    // Ten plugins die without a word just before kplug restarts: a watch
    // resumed across the restart would never hear they are gone.
    for dead in plugins.drain(..10) {
        drop(dead);
    }
    let kplug = Arc::into_inner(kplug).expect("the only handle on kplug");
    let kplug = Arc::new(kplug.restart());
    let restarted = Instant::now();
    let k = kplug.clone();
    eventually("the 190 live plugins are back", interval * 5, move || {
        let listed = listed(&k);
        (listed.len() == 190)
            .then_some(())
            .ok_or_else(|| format!("{} plugins listed", listed.len()))
    })
    .await;
    let back_after = restarted.elapsed();
    // One interval plus the SDK's 10 % jitter, and a second for this test's
    // own polling on a loaded machine: the plugins retry no later than at
    // their interval.
    assert!(
        back_after <= interval.mul_f64(1.1) + Duration::from_secs(1),
        "the plugins took {back_after:?} to come back (interval {interval:?})"
    );

    relisted_and_converged(&watched, &kplug, lists_before, "after the restart").await;
}
