//! Several processes serving one plugin: their registration as instances
//! through raw heartbeats, what kubectl shows of them, the caps, and
//! reconciles spread over two real hello plugins, one of which is killed.

use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_test_support::metrics::Samples;
use kplug_test_support::{
    BlockingRegistry, Lines, Process, StandaloneKplug, free_port, heartbeat_request,
    plugin_instances, workspace_binary,
};
use serde_json::{Value, json};

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

/// A heartbeat of `instance` of the plugin `name` at `address`, asking for
/// a minute's interval so that nothing turns late during a test.
fn heartbeat(name: &str, instance: &str, address: &str) -> HeartbeatRequest {
    heartbeat_request(name, instance, address, Duration::from_secs(60))
}

/// `kubectl get plugins` as rows of cells, the header first.
fn table(kplug: &StandaloneKplug) -> Vec<Vec<String>> {
    kplug
        .kubectl_ok(&["get", "plugins"])
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The cell of `column` in the row of the plugin `name`.
fn cell(table: &[Vec<String>], name: &str, column: &str) -> String {
    // Headers of two words ("LAST HEARTBEAT") take two slots in the
    // header but one in a row: count the words before `column`.
    let header = table.first().map(Vec::as_slice).unwrap_or_default();
    let position = header
        .iter()
        .position(|h| h == column)
        .unwrap_or_else(|| panic!("no column {column} in {table:?}"));
    let words_before = header[..position]
        .iter()
        .filter(|h| *h == "HEARTBEAT")
        .count();
    table
        .iter()
        .find(|row| row.first().map(String::as_str) == Some(name))
        .and_then(|row| row.get(position - words_before))
        .cloned()
        .unwrap_or_else(|| panic!("no {column} for {name} in {table:?}"))
}

fn ready(plugin: &Value) -> bool {
    plugin["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn owned(items: &[(&str, &str, bool)]) -> Vec<(String, String, bool)> {
    items
        .iter()
        .map(|(n, a, r)| ((*n).to_owned(), (*a).to_owned(), *r))
        .collect()
}

#[test]
fn instances_show_in_kubectl_and_leave_one_at_a_time() {
    let kplug = StandaloneKplug::start();
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    let reply = registry.heartbeat(heartbeat("pg", "pg-0", "127.0.0.1:41000"));
    assert!(reply.accepted, "{reply:?}");
    let capabilities = reply.server_protocol.unwrap_or_default().capabilities;
    assert!(
        capabilities.iter().any(|c| c == "Instances"),
        "{capabilities:?}"
    );
    registry.accepted(heartbeat("pg", "pg-1", "127.0.0.1:41001"));

    let rows = table(&kplug);
    assert_eq!(cell(&rows, "pg", "INSTANCES"), "2/2", "{rows:?}");
    assert_eq!(cell(&rows, "pg", "READY"), "True", "{rows:?}");
    let plugin = kplug.wait_for_plugin("pg", |_| true);
    assert_eq!(
        plugin_instances(&plugin),
        owned(&[
            ("pg-0", "127.0.0.1:41000", true),
            ("pg-1", "127.0.0.1:41001", true)
        ])
    );
    assert_eq!(plugin["spec"]["address"], "127.0.0.1:41001", "the newest's");

    // A draining instance is listed, not Ready, and not counted.
    registry.accepted(HeartbeatRequest {
        draining: true,
        ..heartbeat("pg", "pg-1", "127.0.0.1:41001")
    });
    let plugin = kplug.wait_for_plugin("pg", |_| true);
    assert_eq!(plugin["status"]["instances"][1]["draining"], true);
    assert_eq!(cell(&table(&kplug), "pg", "INSTANCES"), "1/2");

    // The draining instance leaves, as a plugin does on a graceful stop:
    // the plugin stays, Ready.
    assert!(registry.deregister("pg", "pg-1", "127.0.0.1:41001"));
    let rows = table(&kplug);
    assert_eq!(cell(&rows, "pg", "INSTANCES"), "1/1", "{rows:?}");
    assert_eq!(cell(&rows, "pg", "READY"), "True", "{rows:?}");
    let plugin = kplug.wait_for_plugin("pg", |_| true);
    assert!(ready(&plugin), "{plugin:#}");
    assert_eq!(
        plugin_instances(&plugin),
        owned(&[("pg-0", "127.0.0.1:41000", true)])
    );
    assert_eq!(plugin["spec"]["address"], "127.0.0.1:41000");

    // Heartbeats of plugins before instances carry none: the address
    // names each instance.
    registry.accepted(heartbeat("legacy", "", "127.0.0.1:42000"));
    registry.accepted(heartbeat("legacy", "", "127.0.0.1:42000"));
    registry.accepted(heartbeat("legacy", "", "127.0.0.1:42001"));
    assert_eq!(cell(&table(&kplug), "legacy", "INSTANCES"), "2/2");
    assert!(registry.deregister("legacy", "", "127.0.0.1:42000"));
    let legacy = kplug.wait_for_plugin("legacy", |_| true);
    assert_eq!(
        plugin_instances(&legacy),
        owned(&[("127.0.0.1:42001", "127.0.0.1:42001", true)])
    );

    // The last instance takes the plugin with it.
    assert!(registry.deregister("pg", "pg-0", "127.0.0.1:41000"));
    kplug.wait_for_absent("pg", Duration::from_secs(10));
}

#[test]
fn heartbeats_past_the_caps_or_in_conflict_are_refused_with_their_reason() {
    let kplug =
        StandaloneKplug::start_with(&["--max-plugins", "2", "--max-instances-per-plugin", "2"]);
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    registry.accepted(heartbeat("a", "a-0", "127.0.0.1:43000"));
    registry.accepted(heartbeat("b", "b-0", "127.0.0.1:43010"));

    let refused = registry.heartbeat(heartbeat("c", "c-0", "127.0.0.1:43020"));
    assert!(!refused.accepted);
    assert_eq!(refused.reason, "TooManyPlugins", "{refused:?}");
    assert!(refused.message.contains("--max-plugins"), "{refused:?}");
    assert!(refused.interval.is_some(), "told when to retry");

    registry.accepted(heartbeat("b", "b-1", "127.0.0.1:43011"));
    let refused = registry.heartbeat(heartbeat("b", "b-2", "127.0.0.1:43012"));
    assert!(!refused.accepted);
    assert_eq!(refused.reason, "TooManyInstances", "{refused:?}");
    assert!(refused.message.contains("\"b-2\""), "{refused:?}");

    let mut queue = heartbeat("a", "a-1", "127.0.0.1:43001");
    if let Some(api) = queue.api.as_mut() {
        api.resource = "queues".to_owned();
    }
    let refused = registry.heartbeat(queue);
    assert!(!refused.accepted);
    assert_eq!(refused.reason, "DeclarationConflict", "{refused:?}");
    assert!(
        refused.message.contains("use another plugin name"),
        "{refused:?}"
    );

    let rows = table(&kplug);
    assert_eq!(rows.len(), 3, "a and b only: {rows:?}");
    assert_eq!(cell(&rows, "a", "INSTANCES"), "1/1");
    assert_eq!(cell(&rows, "b", "INSTANCES"), "2/2");

    let (code, body) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{body}");
    let metrics = Samples::parse(&body);
    for reason in ["TooManyPlugins", "TooManyInstances", "DeclarationConflict"] {
        assert_eq!(
            metrics.expect(
                "kplug_heartbeats_total",
                &[("result", "refused"), ("reason", reason)]
            ),
            1.0,
            "{reason}"
        );
    }
}

/// A hello plugin registered as `name` on `address`, heartbeating every
/// `interval`, with its log lines readable.
fn hello(kplug: &StandaloneKplug, name: &str, instance: &str, address: &str) -> (Process, Lines) {
    Process::spawn_with_stderr(
        Command::new(workspace_binary("hello-plugin"))
            .args([
                "--registry",
                &kplug.grpc,
                "--name",
                name,
                "--listen",
                address,
            ])
            // Long enough that a killed instance stays Ready for the whole
            // test: the calls directed at it must be retried elsewhere.
            .args(["--heartbeat-interval", "30s"])
            // Through the environment, which an SDK without instances
            // ignores: then the addresses tell the two apart.
            .env("KPLUG_INSTANCE", instance)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null()),
        instance,
    )
}

fn reconcile(kplug: &StandaloneKplug, plugin: &str, object: &str) -> (u16, Value) {
    let body = json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": object}}},
    });
    let (code, text) = kplug.curl(
        "POST",
        &format!("{PLUGINS}/{plugin}/reconcile"),
        &["Content-Type: application/json"],
        Some(&body.to_string()),
    );
    let answer = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (code, answer)
}

fn succeeded((code, answer): &(u16, Value)) -> bool {
    *code == 201 && answer["status"]["success"] == true
}

#[test]
fn reconciles_spread_over_instances_and_survive_a_killed_one() {
    let kplug = StandaloneKplug::start();
    let (address_a, address_b) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let (_a, log_a) = hello(&kplug, "hello", "hello-a", &address_a);
    let (mut b, log_b) = hello(&kplug, "hello", "hello-b", &address_b);
    let plugin = kplug.wait_for_plugin("hello", |p| {
        p["status"]["instances"]
            .as_array()
            .is_some_and(|i| i.len() == 2 && i.iter().all(|i| i["ready"] == true))
    });
    assert!(ready(&plugin), "{plugin:#}");

    // Idle instances take calls in turn: both greet.
    for i in 0..6 {
        let answer = reconcile(&kplug, "hello", &format!("before-{i}"));
        assert!(succeeded(&answer), "{answer:?}");
    }
    let greeted = |log: &Lines| {
        log.wait_for(Duration::from_secs(10), "a greeting", |line| {
            line.contains("greeting") && line.contains("before-")
        })
    };
    greeted(&log_a);
    greeted(&log_b);

    // Killed between two calls (a call in flight could have been half
    // done: kplug would not repeat it), b is still listed Ready, so calls
    // keep going to it; each finds nothing there and goes to a instead.
    b.kill();
    for i in 0..10 {
        let answer = reconcile(&kplug, "hello", &format!("after-{i}"));
        assert!(succeeded(&answer), "call {i} after the kill: {answer:?}");
    }
    let plugin = kplug.wait_for_plugin("hello", |_| true);
    assert_eq!(
        plugin["status"]["instances"]
            .as_array()
            .map(|i| i.iter().filter(|i| i["ready"] == true).count()),
        Some(2),
        "b was Ready all along, so calls were sent to it: {plugin:#}"
    );
    for i in 0..10 {
        log_a.wait_for(Duration::from_secs(10), "a's greeting", |line| {
            line.contains(&format!("after-{i}"))
        });
    }
}
