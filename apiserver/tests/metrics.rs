//! `/metrics` after a known workload: exact counts, in output the
//! Prometheus project's own parser accepts.

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, PluginApi, Protocol};
use kplug_test_support::metrics::Samples;
use std::time::Duration;

use kplug_test_support::{Process, StandaloneKplug, free_port, wait_until};
use serde_json::{Value, json};

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// Heartbeats the test sends itself, so their number is known.
const HEARTBEATS: usize = 7;
const RECONCILES: usize = 5;

fn heartbeat(name: &str, address: &str, protocol: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        name: name.to_owned(),
        version: "1.0.0".to_owned(),
        api: Some(PluginApi {
            group: "example.com".to_owned(),
            resource: "greetings".to_owned(),
            version: "v1".to_owned(),
        }),
        implementation: "Test".to_owned(),
        address: address.to_owned(),
        // The longest allowed: the registration outlives the test.
        interval: Some(prost_types::Duration {
            seconds: 300,
            nanos: 0,
        }),
        protocol: Some(Protocol {
            version: protocol.to_owned(),
            ..Protocol::default()
        }),
        ..HeartbeatRequest::default()
    }
}

fn scrape(kplug: &StandaloneKplug) -> Samples {
    let (code, body) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{body}");
    Samples::parse(&body)
}

fn reconcile(kplug: &StandaloneKplug, plugin: &str, timeout_seconds: u64) -> (u16, Value) {
    let body = json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "timeoutSeconds": timeout_seconds,
            "object": {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}},
        },
    });
    let (code, text) = kplug.curl(
        "POST",
        &format!("{PLUGINS}/{plugin}/reconcile"),
        &["Content-Type: application/json"],
        Some(&body.to_string()),
    );
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (code, value)
}

fn hello(kplug: &StandaloneKplug, name: &str, extra: &[&str]) -> Process {
    let address = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--listen", address.as_str()];
    args.extend_from_slice(extra);
    let process = kplug.plugin(name, &args);
    kplug.wait_for_plugin(name, |plugin| {
        plugin["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    });
    process
}

#[test]
fn metrics_count_a_known_workload_exactly() {
    let kplug = StandaloneKplug::start();
    let before = scrape(&kplug);
    assert_eq!(before.sum("kplug_heartbeats_total", &[]), 0.0);
    assert!(
        before.sum("process_resident_memory_bytes", &[]) > 0.0,
        "process metrics are served"
    );

    // Heartbeats from the test itself: accepted, refused and rejected.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect");
        for _ in 0..HEARTBEATS {
            let answer = client
                .heartbeat(heartbeat("counted", "127.0.0.1:1", "v1alpha1"))
                .await
                .expect("heartbeat")
                .into_inner();
            assert!(answer.accepted, "{answer:?}");
        }
        let refused = client
            .heartbeat(heartbeat("future", "127.0.0.1:2", "v9"))
            .await
            .expect("an answer")
            .into_inner();
        assert_eq!(refused.reason, "UnsupportedProtocol");
        let rejected = client
            .heartbeat(heartbeat("Not_A_Name", "127.0.0.1:3", "v1alpha1"))
            .await
            .expect_err("an invalid name is INVALID_ARGUMENT");
        assert_eq!(rejected.code(), tonic::Code::InvalidArgument);
    });
    let after_heartbeats = scrape(&kplug);
    let heartbeats = |result: &str, reason: &str| {
        after_heartbeats.sum(
            "kplug_heartbeats_total",
            &[("result", result), ("reason", reason)],
        )
    };
    assert_eq!(heartbeats("accepted", ""), HEARTBEATS as f64);
    assert_eq!(heartbeats("refused", "UnsupportedProtocol"), 1.0);
    assert_eq!(heartbeats("rejected", "Invalid"), 1.0);
    assert_eq!(
        after_heartbeats.sum("kplug_plugins", &[("ready", "true")]),
        1.0
    );

    // Reconciles: some that succeed, one that times out.
    let _fast = hello(&kplug, "fast", &[]);
    let _slow = hello(&kplug, "slow", &["--delay-ms", "5000"]);
    for _ in 0..RECONCILES {
        let (code, answer) = reconcile(&kplug, "fast", 10);
        assert_eq!(code, 201, "{answer:#}");
    }
    let (code, status) = reconcile(&kplug, "slow", 1);
    assert_eq!((code, status["reason"].as_str()), (504, Some("Timeout")));

    let page = scrape(&kplug);
    let reconciles = |plugin: &str, outcome: &str| {
        page.sum(
            "kplug_reconciles_total",
            &[
                ("plugin", plugin),
                ("operation", "Reconcile"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(reconciles("fast", "success"), RECONCILES as f64);
    assert_eq!(reconciles("fast", "error"), 0.0);
    assert_eq!(reconciles("slow", "error"), 1.0);
    assert_eq!(
        page.sum(
            "kplug_proxy_errors_total",
            &[("plugin", "slow"), ("class", "timeout")]
        ),
        1.0
    );
    assert_eq!(
        page.sum(
            "kplug_reconcile_duration_seconds_count",
            &[("plugin", "fast"), ("operation", "Reconcile")]
        ),
        RECONCILES as f64
    );
    let requests = |code: &str| {
        page.sum(
            "apiserver_request_total",
            &[
                ("verb", "POST"),
                ("resource", "plugins"),
                ("subresource", "reconcile"),
                ("code", code),
            ],
        )
    };
    assert_eq!(requests("201"), RECONCILES as f64);
    assert_eq!(requests("504"), 1.0);
    assert_eq!(
        page.sum("kplug_plugins", &[("ready", "true")]),
        3.0,
        "counted, fast and slow"
    );
}

#[test]
fn an_open_watch_is_a_long_running_request_until_it_ends() {
    let kplug = StandaloneKplug::start();
    let (watch, lines) = kplug.kubectl_spawn(&["get", "plugins", "--watch", "-o", "name"]);
    let watching = |page: &Samples| {
        page.sum(
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "plugins")],
        )
    };
    // kubectl lists, then watches: wait until the watch is open.
    let _plugin = hello(&kplug, "seen", &[]);
    lines.wait_for(
        Duration::from_secs(30),
        "kubectl shows the plugin",
        |line| line.contains("plugin.plugins.kplug.io/seen"),
    );
    assert_eq!(watching(&scrape(&kplug)), 1.0);
    drop(watch);
    wait_until(
        "the watch ends when kubectl goes",
        Duration::from_secs(10),
        || match watching(&scrape(&kplug)) {
            0.0 => Ok(()),
            open => Err(format!("{open} watches open")),
        },
    );
}
