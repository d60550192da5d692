//! Versions and the operator: an object bound to 1.x stays on 1.x when 2.0
//! turns Ready, waits (saying which versions are Ready) when 1.x goes, and
//! moves only when its binding is cleared; a new object goes to the newest
//! version, one that names a range (`spec.pluginVersion`) to a version in
//! it. Real kplug, real hello plugins declaring 1.2.0 and 2.0.0, the real
//! `kplug-operator`.

mod support;

use std::time::Duration;

use kplug_test_support::{Lines, wait_plugin_ready, wait_until};
use serde_json::Value;
use support::widgets::Widgets;

/// Waits until the Widget `name` satisfies `check` on its status.
fn wait_status(world: &Widgets, name: &str, what: &str, check: impl Fn(&Value) -> bool) {
    wait_until(&format!("{name}: {what}"), Duration::from_secs(60), || {
        let object = world.get(name)?;
        check(&object["status"])
            .then_some(())
            .ok_or_else(|| object["status"].to_string())
    });
}

/// Asks for a reconcile of `name` now, and waits for the operator's line
/// saying which plugin served it.
fn nudge_and_wait(world: &Widgets, log: &Lines, name: &str, served_by: &str) {
    log.drain();
    world.request_reconcile(name, &jiff::Timestamp::now().to_string());
    let object = format!("/{name}.default");
    log.wait_for(
        Duration::from_secs(30),
        &format!("{name} reconciled by {served_by}"),
        |l| {
            l.contains("reconciled")
                && l.contains(&object)
                && l.contains(&format!("plugin={served_by} "))
        },
    );
}

#[test]
fn a_bound_object_keeps_its_major_version_until_its_binding_is_cleared() {
    let world = Widgets::start();
    let (mut v1, _v1_log) =
        world.plugin_logged("widgets-v1", "Hello", &["--plugin-version", "1.2.0"]);
    wait_plugin_ready(&world.cluster, "widgets-v1");
    let (_operator, log) = world.run_operator(&[]);
    world.apply("bound", "size: 1");
    wait_status(&world, "bound", "bound to Hello 1.x", |s| {
        s["implementation"] == "Hello"
            && s["majorVersion"] == 1
            && s["plugin"]["version"] == "1.2.0"
    });

    // 2.0 turns Ready: new objects go to it, the bound one stays on 1.x,
    // and one that asks for <2 goes to 1.x.
    // Their logs are kept: a plugin whose stderr closes stops.
    let (mut v2, _v2_log) =
        world.plugin_logged("widgets-v2", "Hello", &["--plugin-version", "2.0.0"]);
    wait_plugin_ready(&world.cluster, "widgets-v2");
    world.apply("fresh", "size: 1");
    wait_status(&world, "fresh", "bound to Hello 2.x", |s| {
        s["majorVersion"] == 2 && s["plugin"]["name"] == "widgets-v2"
    });
    world.apply("ranged", "size: 1, pluginVersion: '<2'");
    wait_status(&world, "ranged", "served by 1.x", |s| {
        s["plugin"]["name"] == "widgets-v1"
    });
    nudge_and_wait(&world, &log, "bound", "widgets-v1");

    // 1.x goes: the bound object waits, saying what is Ready.
    assert!(v1.terminate(Duration::from_secs(30)), "widgets-v1 stopped");
    wait_until("widgets-v1 gone", Duration::from_secs(30), || {
        let out = world.cluster.kubectl(&["get", "plugin", "widgets-v1"]);
        (!out.status.success()).then_some(()).ok_or("still listed")
    });
    world.request_reconcile("bound", "waiting");
    wait_until("bound: waiting for 1.x", Duration::from_secs(60), || {
        let ready = world.ready("bound")?;
        let message = ready["message"].as_str().unwrap_or_default();
        (ready["reason"] == "PluginUnavailable"
            && message.starts_with(
                "no Ready plugin of implementation Hello serving widgets.test.kplug.io has a \
                 version in >=1.0.0, <2.0.0 (Ready: 2.0.0 (widgets-v2))",
            ))
        .then_some(())
        .ok_or_else(|| ready.to_string())
    });
    assert_eq!(
        world.get("bound").expect("bound")["status"]["majorVersion"],
        1,
        "still bound to 1.x"
    );

    // Clearing the binding (docs/src/concepts/operator.md, "Binding") lets it move to 2.x.
    world.clear_binding("bound");
    nudge_and_wait(&world, &log, "bound", "widgets-v2");
    wait_status(&world, "bound", "bound to Hello 2.x", |s| {
        s["implementation"] == "Hello"
            && s["majorVersion"] == 2
            && s["plugin"]["version"] == "2.0.0"
    });
    assert!(v2.terminate(Duration::from_secs(30)), "widgets-v2 stopped");
}
