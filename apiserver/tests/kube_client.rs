//! A second real client: kube-rs reads and watches the same API.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kplug_test_support::{StandaloneKplug, kube_client, plugins_resource};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};

async fn client(kplug: &StandaloneKplug) -> Client {
    kube_client(&kplug.kubeconfig, None).await
}

#[tokio::test]
async fn kube_rs_lists_and_watches_plugins() {
    let kplug = StandaloneKplug::start();
    let api: Api<DynamicObject> = Api::all_with(client(&kplug).await, &plugins_resource());

    let empty = api.list(&ListParams::default()).await.expect("list");
    assert!(empty.items.is_empty());
    let start_rv = empty.metadata.resource_version.clone().unwrap_or_default();

    let stream = api
        .watch(&WatchParams::default().timeout(20), &start_rv)
        .await
        .expect("watch");
    let mut stream = stream.boxed();
    let _plugin = kplug.plugin("kube-rs-sees-me", &["--label", "client=kube-rs"]);

    let added = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = stream.try_next().await.expect("watch event") {
            if let WatchEvent::Added(object) = event {
                return Some(object);
            }
        }
        None
    })
    .await
    .expect("an ADDED event within 20 s")
    .expect("the watch ended before ADDED");
    assert_eq!(added.metadata.name.as_deref(), Some("kube-rs-sees-me"));
    assert_eq!(added.data["spec"]["implementation"], "Hello");

    let listed = api
        .list(&ListParams::default().labels("client=kube-rs"))
        .await
        .expect("list with a label selector");
    let names: Vec<_> = listed
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(names, ["kube-rs-sees-me"]);
    let got = api.get("kube-rs-sees-me").await.expect("get");
    assert_eq!(got.metadata.uid, added.metadata.uid);

    let missing = api.get("nobody").await.expect_err("NotFound");
    match missing {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 404);
            assert_eq!(status.reason, "NotFound");
        }
        other => panic!("expected an API error, got {other}"),
    }
}
