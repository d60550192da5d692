//! Bad input reaches the zero-code operator as conditions, Events and clear
//! exits, never as a panic: malformed or dangling extension references,
//! kinds the cluster does not serve, resources without a status
//! subresource or not served at all.

mod support;

use std::time::Duration;

use kplug_test_support::{output_text, wait_until};
use support::widgets::Widgets;

#[test]
fn bad_references_and_resources_are_conditions_and_clear_errors() {
    let world = Widgets::start();
    let _plugin = world.plugin("widgets", "Hello");

    // Resources the operator cannot serve: it says why and exits.
    for (resource, says) in [
        (
            "gadgets.test.kplug.io",
            "gadgets.test.kplug.io has no status subresource",
        ),
        (
            "nothings.test.kplug.io",
            "no resource \"nothings\" in test.kplug.io",
        ),
        (
            "widgets.nowhere.example.com",
            "the group \"nowhere.example.com\" is not served",
        ),
    ] {
        let output = world
            .operator(resource)
            .output()
            .expect("run kplug-operator");
        assert!(
            !output.status.success(),
            "{resource}: {}",
            output_text(&output)
        );
        assert!(
            output_text(&output).contains(says),
            "{resource}: {}",
            output_text(&output)
        );
        assert!(
            !output_text(&output).contains("panicked"),
            "{}",
            output_text(&output)
        );
    }

    let (mut running, log) = world.run_operator(&[]);

    let cases = [
        ("plain", "", "True", "Reconciled"),
        (
            "no-name",
            ", extensions: [{apiVersion: v1, kind: ConfigMap}]",
            "False",
            "InvalidExtensionReference",
        ),
        (
            "not-a-list",
            ", extensions: settings",
            "False",
            "InvalidExtensionReference",
        ),
        (
            "bad-api-version",
            ", extensions: [{apiVersion: a/b/c, kind: X, name: y}]",
            "False",
            "InvalidExtensionReference",
        ),
        (
            "unknown-kind",
            ", extensions: [{apiVersion: test.kplug.io/v1, kind: Nope, name: x}]",
            "False",
            "ExtensionKindNotServed",
        ),
        (
            "dangling",
            ", extensions: [{apiVersion: v1, kind: ConfigMap, name: absent}]",
            "False",
            "ExtensionNotFound",
        ),
    ];
    for (name, extensions, _, _) in cases {
        world.apply(name, &format!("size: 1{extensions}"));
    }
    for (name, _, status, reason) in cases {
        wait_until(
            &format!("{name}: Ready={status} {reason}"),
            Duration::from_secs(30),
            || {
                let ready = world.ready(name)?;
                (ready["status"] == status && ready["reason"] == reason)
                    .then_some(())
                    .ok_or_else(|| ready.to_string())
            },
        );
    }
    let plain = world.get("plain").expect("plain");
    assert_eq!(
        plain["status"]["greeting"], "hello, plain",
        "the plugin's objectStatus, without extensions"
    );
    let message = world
        .ready("no-name")
        .map(|r| r["message"].to_string())
        .unwrap_or_default();
    assert!(
        message.contains("spec.extensions[0]") && message.contains("name"),
        "{message}"
    );

    // The dangling reference resolves once its object exists (a retry).
    world.cluster.kubectl_ok(&[
        "create",
        "configmap",
        "absent",
        "-n",
        "default",
        "--from-literal=k=v",
    ]);
    wait_until("dangling: Ready=True", Duration::from_secs(30), || {
        let ready = world.ready("dangling")?;
        (ready["status"] == "True")
            .then_some(())
            .ok_or_else(|| ready.to_string())
    });
    assert!(
        running.child.try_wait().ok().flatten().is_none(),
        "still running"
    );
    assert!(
        !log.drain().iter().any(|l| l.contains("panicked")),
        "no panic in the operator's log"
    );
    assert!(
        running.terminate(Duration::from_secs(30)),
        "a clean exit on SIGTERM"
    );
}
