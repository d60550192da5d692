//! Watch semantics (bookmarks, initial events, selectors) and server-side
//! tables, read with curl so every field of the wire format is visible.

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, PluginApi};
use std::time::Duration;

use kplug_test_support::metrics::Samples;
use kplug_test_support::{StandaloneKplug, wait_until};
use serde_json::Value;

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
const TABLE: &str = "Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

fn heartbeat(name: &str, tier: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        name: name.to_owned(),
        version: "1.0.0".to_owned(),
        api: Some(PluginApi {
            group: "example.com".to_owned(),
            resource: "things".to_owned(),
            version: "v1".to_owned(),
        }),
        implementation: "Test".to_owned(),
        address: "127.0.0.1:9".to_owned(),
        labels: [("tier".to_owned(), tier.to_owned())].into(),
        interval: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..HeartbeatRequest::default()
    }
}

fn send(kplug: &StandaloneKplug, requests: Vec<HeartbeatRequest>) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect");
        for request in requests {
            let reply = client
                .heartbeat(request)
                .await
                .expect("heartbeat")
                .into_inner();
            assert!(reply.accepted, "{reply:?}");
        }
    });
}

/// Waits until kplug has `watches` watches of plugins open: a watch
/// counts once kplug has subscribed it to the registry's events, so
/// whatever happens next reaches it as an event.
///
/// The scrape has credential files of its own: `StandaloneKplug::curl`
/// rewrites the admin's on every call, which the watch may be reading.
fn wait_for_open_watches(kplug: &StandaloneKplug, watches: f64) {
    let dir = kplug.state.path();
    let credentials = (dir.join("scraper.crt"), dir.join("scraper.key"));
    let (cert, key) = kplug.admin_pem();
    std::fs::write(&credentials.0, cert).expect("write the scraper's certificate");
    std::fs::write(&credentials.1, key).expect("write the scraper's key");
    wait_until("the watch open", Duration::from_secs(20), || {
        let (code, body) = kplug.curl_as(Some(&credentials), "GET", "/metrics", &[], None);
        if code != 200 {
            return Err(format!("{code}: {body}"));
        }
        let open = Samples::parse(&body).sum(
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "plugins")],
        );
        (open >= watches)
            .then_some(())
            .ok_or_else(|| format!("{open} open"))
    });
}

fn events(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad event line ({e}): {l}")))
        .collect()
}

fn summary(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn bookmarks_and_initial_events_end() {
    let kplug = StandaloneKplug::start_with(&["--watch-bookmark-interval", "500ms"]);
    send(&kplug, vec![heartbeat("a", "x"), heartbeat("b", "x")]);
    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2"),
        &[],
        None,
    );
    assert_eq!(code, 200, "{body}");
    let events = events(&body);
    assert_eq!(summary(&events[..2]), ["ADDED a", "ADDED b"]);
    let end = &events[2];
    assert_eq!(end["type"], "BOOKMARK", "{body}");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // The bookmark is at the version of the last initial event.
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        events[1]["object"]["metadata"]["resourceVersion"]
    );
    let periodic = events[3..]
        .iter()
        .filter(|e| e["type"] == "BOOKMARK")
        .count();
    assert!(
        periodic >= 2,
        "periodic bookmarks over 2 s at 500 ms: {body}"
    );

    // sendInitialEvents without bookmarks is invalid, as in Kubernetes.
    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&sendInitialEvents=true"),
        &[],
        None,
    );
    assert_eq!(code, 422, "{body}");
}

#[test]
fn a_label_change_moves_a_plugin_out_of_a_filtered_watch_and_status_changes_stay_in() {
    let kplug = StandaloneKplug::start();
    send(
        &kplug,
        vec![heartbeat("mover", "a"), heartbeat("stayer", "b")],
    );
    let watch = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            kplug.curl(
                "GET",
                &format!("{PLUGINS}?watch=1&labelSelector=tier%3Da&timeoutSeconds=4"),
                &[],
                None,
            )
        });
        // The relabelling must reach the watch as events.
        wait_for_open_watches(&kplug, 1.0);
        // Then a change of status alone (draining) inside the selection:
        // kplug keeps no previous object for it, and it stays MODIFIED.
        let draining = HeartbeatRequest {
            draining: true,
            ..heartbeat("stayer", "a")
        };
        send(
            &kplug,
            vec![heartbeat("mover", "b"), heartbeat("stayer", "a"), draining],
        );
        watch.join().expect("watch thread")
    });
    let (code, body) = watch;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        summary(&events(&body)),
        [
            "ADDED mover",
            "DELETED mover",
            "ADDED stayer",
            "MODIFIED stayer"
        ]
    );
}

#[test]
fn tables_honour_include_object_and_watch_rows() {
    let kplug = StandaloneKplug::start();
    send(&kplug, vec![heartbeat("t", "x")]);
    let table = |query: &str| -> Value {
        let (code, body) = kplug.curl("GET", &format!("{PLUGINS}{query}"), &[TABLE], None);
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("table JSON")
    };
    let default = table("");
    assert_eq!(default["kind"], "Table");
    assert_eq!(default["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = default["columnDefinitions"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        columns,
        [
            "Name",
            "API",
            "Implementation",
            "Version",
            "Ready",
            "Instances",
            "Last Heartbeat",
            "Age",
            "Address"
        ]
    );
    assert_eq!(
        default["columnDefinitions"][8]["priority"], 1,
        "ADDRESS only with -o wide"
    );
    let row = &default["rows"][0];
    assert_eq!(row["cells"][0], "t");
    assert_eq!(row["cells"][1], "things.example.com");
    assert_eq!(row["cells"][5], "1/1", "Ready instances / all");
    assert_eq!(row["cells"][8], "127.0.0.1:9");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["metadata"]["name"], "t");
    assert!(row["object"].get("spec").is_none());

    assert!(
        table("?includeObject=None")["rows"][0]
            .get("object")
            .is_none()
    );
    assert_eq!(
        table("?includeObject=Object")["rows"][0]["object"]["spec"]["implementation"],
        "Test"
    );
    assert_eq!(
        table("/t")["rows"][0]["cells"][0],
        "t",
        "get also answers a Table"
    );

    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&timeoutSeconds=1"),
        &[TABLE],
        None,
    );
    assert_eq!(code, 200, "{body}");
    let events = events(&body);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["kind"], "Table");
    assert_eq!(events[0]["object"]["rows"][0]["cells"][0], "t");
}
