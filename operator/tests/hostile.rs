//! A hostile plugin as the operator meets it (issue 18, item 3): a plugin
//! whose answer kplug refuses leaves the object's status unwritten but for
//! the operator's condition, with an Event, both naming the plugin and what
//! is wrong with its answer. Real control plane, kplug, operator; the
//! plugin is `kplug_test_support::hostile`'s fake, heartbeating over TLS
//! with its ServiceAccount's token as the SDKs do.

mod support;

use std::time::{Duration, Instant};

use kplug_proto::v1alpha1::{PluginApi, ReconcileResponse};
use kplug_test_support::hostile::{Hostile, Mode, Registration, nested_json};
use kplug_test_support::{heartbeat_request, plugin_identity, wait_plugin_ready, wait_until};
use serde_json::Value;
use support::widgets::Widgets;

const PLUGIN: &str = "widgets-hostile";

#[test]
fn an_answer_kplug_refuses_is_a_condition_and_an_event_and_nothing_else() {
    let world = Widgets::start();
    // Deeper than kplug passes on: were it written, the Widget's status
    // would have the plugin's field `a`.
    let hostile = Hostile::start(Mode::Answer(ReconcileResponse {
        success: true,
        object_status: nested_json(101),
        ..ReconcileResponse::default()
    }));
    let token = plugin_identity(&world.cluster, PLUGIN, Some(PLUGIN), world.work.path());
    let mut request = heartbeat_request(PLUGIN, "", &hostile.address, Duration::from_secs(1));
    request.api = Some(PluginApi {
        group: "test.kplug.io".to_owned(),
        resource: "widgets".to_owned(),
        version: "v1".to_owned(),
    });
    request.implementation = "Hostile".to_owned();
    hostile.heartbeat_as(Registration::cluster(&world.kplug, &token, request));
    wait_plugin_ready(&world.cluster, PLUGIN);

    let (_operator, log) = world.run_operator(&[]);
    let started = Instant::now();
    world.apply("victim", "size: 1, preferredImplementation: Hostile");
    let field =
        "status.objectStatus: Invalid value: \"object\": must be nested at most 100 levels deep";
    wait_until(
        "Ready=False DelegationFailed",
        Duration::from_secs(60),
        || {
            let ready = world.ready("victim")?;
            (ready["status"] == "False" && ready["reason"] == "DelegationFailed")
                .then_some(())
                .ok_or_else(|| ready.to_string())
        },
    );
    let elapsed = started.elapsed();
    let ready = world.ready("victim").expect("the Ready condition");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "plugin {PLUGIN} returned an invalid answer: {field}"
        )),
        "{ready:#}"
    );
    let events = || -> Result<Vec<Value>, String> {
        let output = world.cluster.kubectl_ok(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=victim,reason=DelegationFailed",
            "-o",
            "json",
        ]);
        let events: Value = serde_json::from_str(&output).map_err(|e| e.to_string())?;
        Ok(events["items"].as_array().cloned().unwrap_or_default())
    };
    wait_until("the Warning Event", Duration::from_secs(30), || {
        events().and_then(|items| {
            (!items.is_empty())
                .then_some(())
                .ok_or("none yet".to_owned())
        })
    });
    let events = events().expect("the Events");
    assert!(
        events
            .iter()
            .all(|e| e["type"] == "Warning"
                && e["message"].as_str().is_some_and(|m| m.contains(field))),
        "{events:#?}"
    );
    let status = world.get("victim").expect("the Widget")["status"].clone();
    assert!(
        status.get("a").is_none(),
        "the refused status was written: {status:#}"
    );
    eprintln!(
        "hostile (operator): DelegationFailed {} ms after the apply; {} calls reached the plugin by the end (kplug refused each); the condition: {message}",
        elapsed.as_millis(),
        hostile.calls()
    );
    let logged = log.drain();
    assert!(
        logged
            .iter()
            .any(|l| l.contains(" WARN ") && l.contains(field)),
        "no log line: {logged:#?}"
    );
}
