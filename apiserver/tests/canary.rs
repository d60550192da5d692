//! Canary releases (issue 19, part 2), with real hello plugins behind one
//! plugin's instances registered by hand: a stable 1.4.2 and a canary
//! 2.0.0 declaring `canaryWeight` 10. 1,000 reconciles over 100 objects
//! send each object to one side, about a tenth of them to the canary, by
//! the rule every kplug replica applies; a canary failing every other call
//! is withdrawn at its 20th call, shown in the Plugin's status and metrics,
//! and the stable instance serves every object after. The SDK's
//! `--canary-weight` reaches the Plugin's status.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use kplug_api::canary::{MIN_CALLS, bucket};
use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_test_support::database_table::{RECONCILES, reconcile_body};
use kplug_test_support::metrics::Samples;
use kplug_test_support::{BlockingRegistry, StandaloneKplug, heartbeat_request, workspace_binary};
use serde_json::{Value, json};

const PLUGIN: &str = "tables";
const OBJECTS: usize = 100;
const ROUNDS: usize = 10;
const WEIGHT: u32 = 10;

/// The instance `instance` of `tables` at `address`, of `version`.
fn instance(instance: &str, address: &str, version: &str, canary_weight: u32) -> HeartbeatRequest {
    HeartbeatRequest {
        version: version.to_owned(),
        canary_weight,
        ..heartbeat_request(PLUGIN, instance, address, Duration::from_secs(60))
    }
}

fn object_name(i: usize) -> String {
    format!("object-{i:03}")
}

/// Reconciles `name` of namespace shop; the answer's success and version.
fn reconcile(kplug: &StandaloneKplug, name: &str) -> (bool, String) {
    let (code, answer) = kplug.post_json(RECONCILES, &reconcile_body(name, json!({})));
    assert_eq!(code, 201, "{name}: {answer:#}");
    let status = &answer["status"];
    let version = status["plugin"]["version"].as_str().unwrap_or_default();
    (status["success"] == json!(true), version.to_owned())
}

fn condition<'a>(plugin: &'a Value, type_: &str) -> &'a Value {
    plugin["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[test]
fn a_canary_takes_its_share_by_object_and_is_withdrawn_when_it_fails() {
    let kplug = StandaloneKplug::start();
    let (_stable, stable_address) = kplug.plugin_serving("hello-stable", &[]);
    let (_canary, canary_address) = kplug.plugin_serving("hello-canary", &[]);
    let (_failing, failing_address) = kplug.plugin_serving("hello-failing", &["--fail-every", "2"]);
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    registry.accepted(instance("tables-stable", &stable_address, "1.4.2", 0));
    registry.accepted(instance("tables-canary", &canary_address, "2.0.0", WEIGHT));

    let plugin = kplug.wait_for_plugin(PLUGIN, |p| condition(p, "Canary")["status"] == "True");
    assert_eq!(
        condition(&plugin, "Canary")["message"],
        "canary 2.0.0 takes 10% of the objects"
    );

    // 1,000 reconciles over 100 objects: each object to one side.
    let mut sides: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        for i in 0..OBJECTS {
            let name = object_name(i);
            let (success, version) = reconcile(&kplug, &name);
            assert!(success, "{name} on {version}");
            sides.entry(name).or_default().push(version);
        }
    }
    for (name, versions) in &sides {
        assert!(
            versions.iter().all(|v| v == &versions[0]),
            "{name} went to both sides: {versions:?}"
        );
    }
    let canary_calls = sides.values().flatten().filter(|v| *v == "2.0.0").count();
    let share = canary_calls as f64 / (OBJECTS * ROUNDS) as f64;
    eprintln!(
        "canary: {canary_calls} of {} reconciles ({:.1} %) at weight {WEIGHT}",
        OBJECTS * ROUNDS,
        share * 100.0
    );
    assert!((0.07..=0.13).contains(&share), "{share}");
    // The side is the rule's, which every kplug replica computes alike.
    let canary_objects: Vec<&String> = sides
        .iter()
        .filter(|(_, versions)| versions[0] == "2.0.0")
        .map(|(name, _)| name)
        .collect();
    let predicted: Vec<String> = (0..OBJECTS)
        .map(object_name)
        .filter(|name| bucket(PLUGIN, &format!("shop/{name}")) < WEIGHT)
        .collect();
    assert_eq!(canary_objects, predicted.iter().collect::<Vec<_>>());

    // A new canary, failing every other call: withdrawn at its 20th call.
    registry.accepted(instance("tables-canary", &failing_address, "2.0.1", WEIGHT));
    kplug.wait_for_plugin(PLUGIN, |p| {
        condition(p, "Canary")["message"] == "canary 2.0.1 takes 10% of the objects"
    });
    let mut calls = 0;
    let mut failed = 0;
    'withdrawal: loop {
        for name in &predicted {
            let (success, version) = reconcile(&kplug, name);
            if version != "2.0.1" {
                break 'withdrawal;
            }
            calls += 1;
            failed += usize::from(!success);
            assert!(calls <= 2 * MIN_CALLS, "not withdrawn after {calls} calls");
        }
    }
    eprintln!("canary: withdrawn after {calls} calls, {failed} of them failed");
    assert_eq!((calls, failed), (MIN_CALLS, MIN_CALLS / 2));

    // The Plugin says so, the canary is not Ready, and the stable instance
    // serves every object.
    let plugin = kplug.wait_for_plugin(PLUGIN, |p| condition(p, "Canary")["status"] == "False");
    let canary = condition(&plugin, "Canary");
    assert_eq!(canary["reason"], "Withdrawn", "{canary:#}");
    assert_eq!(
        canary["message"],
        "kplug withdrew canary 2.0.1: 10 of its last 20 calls failed or missed their deadline \
         (50%), against 0 of 100 (0%) for the stable instances; it sends the canary nothing \
         until its instances declare another version"
    );
    let instances = plugin["status"]["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready: BTreeMap<&str, (bool, u64)> = instances
        .iter()
        .map(|i| {
            let name = i["name"].as_str().unwrap_or_default();
            (
                name,
                (
                    i["ready"] == json!(true),
                    i["canaryWeight"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect();
    assert_eq!(
        ready,
        BTreeMap::from([("tables-canary", (false, 10)), ("tables-stable", (true, 0))])
    );
    for i in 0..OBJECTS {
        let (success, version) = reconcile(&kplug, &object_name(i));
        assert_eq!((success, version.as_str()), (true, "1.4.2"));
    }
    let listed = Command::new(workspace_binary("kubectl-kplug"))
        .arg("plugins")
        .arg("--kubeconfig")
        .arg(&kplug.kubeconfig)
        .output()
        .expect("run kubectl-kplug plugins");
    let listed = String::from_utf8_lossy(&listed.stdout);
    let row = listed
        .lines()
        .find(|l| l.starts_with("tables "))
        .unwrap_or_default();
    assert!(
        row.contains(" 1/2 ") && row.contains(" 2.0.1 withdrawn "),
        "{listed}"
    );
    let (code, text) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{text}");
    let metrics = Samples::parse(&text);
    assert_eq!(
        metrics.sum("kplug_canary_withdrawals_total", &[("plugin", PLUGIN)]),
        1.0
    );
    assert_eq!(
        metrics.sum(
            "kplug_canary_calls_total",
            &[
                ("plugin", PLUGIN),
                ("track", "canary"),
                ("outcome", "failed")
            ]
        ),
        (MIN_CALLS / 2) as f64
    );
}

#[test]
fn the_sdks_canary_weight_reaches_the_plugin() {
    let kplug = StandaloneKplug::start();
    let _canary = kplug.plugin("hello-weighted", &["--canary-weight", "30"]);
    let plugin = kplug.wait_for_plugin("hello-weighted", |p| {
        condition(p, "Canary")["status"] == "True"
    });
    assert_eq!(plugin["status"]["instances"][0]["canaryWeight"], 30);
    assert_eq!(
        condition(&plugin, "Canary")["message"],
        "canary 0.1.0 takes 30% of the objects"
    );
}
