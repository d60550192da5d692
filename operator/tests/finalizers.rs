//! The operator's finalizers, on a real control plane: an object carries
//! the finalize finalizer only while the plugin serving it declares
//! `Finalize`, so that one served by a plugin without it costs no
//! finalizer write and its deletion waits for nobody, not even a running
//! operator; and an object still carrying it when a release without
//! Finalize took over goes when deleted, not stuck on a call kplug would
//! refuse.

mod support;

use std::time::Duration;

use kplug_test_support::{Lines, Process, wait_plugin_ready, wait_until};
use serde_json::{Value, json};
use support::widgets::Widgets;

const FINALIZER: &str = "kplug.io/finalize";

/// The hello plugin `name` serving widgets as `Hello`, with `extra` flags,
/// once it is Ready (and its log, read while it runs).
fn hello(world: &Widgets, name: &str, extra: &[&str]) -> (Process, Lines) {
    let plugin = world.plugin_logged(name, "Hello", extra);
    wait_plugin_ready(&world.cluster, name);
    plugin
}

/// Waits until the Widget `name` was last served by `plugin` and carries
/// exactly `finalizers`.
fn wait_served(world: &Widgets, name: &str, plugin: &str, finalizers: &Value) {
    let what = format!("{name} served by {plugin} with the finalizers {finalizers}");
    wait_until(&what, Duration::from_secs(60), || {
        let widget = world.get(name)?;
        let metadata = &widget["metadata"];
        let held = metadata.get("finalizers").cloned().unwrap_or(json!([]));
        (widget["status"]["plugin"]["name"] == plugin && held == *finalizers)
            .then_some(())
            .ok_or_else(|| format!("{metadata}; {}", widget["status"]))
    });
}

#[test]
fn the_finalize_finalizer_follows_what_the_serving_plugin_declares() {
    let world = Widgets::start();
    let (mut without, _without_log) = hello(&world, "hello-without", &["--without-finalize"]);
    let (mut operator, log) = world.run_operator(&[]);

    world.apply("plain", "size: 1");
    wait_served(&world, "plain", "hello-without", &json!([]));
    let writes = log.drain();
    assert!(
        !writes.iter().any(|l| l.contains("finalizers set")),
        "no finalizer was ever written: {writes:#?}"
    );

    // A release that finalizes takes over: the finalizer goes on at the
    // next reconcile, before the call.
    without.terminate(Duration::from_secs(10));
    let (mut with, _with_log) = hello(&world, "hello-with", &[]);
    world.request_reconcile("plain", "1");
    wait_served(&world, "plain", "hello-with", &json!([FINALIZER]));
    world.apply("kept", "size: 2");
    wait_served(&world, "kept", "hello-with", &json!([FINALIZER]));

    // Back to one without: the finalizer comes off again at the next
    // reconcile.
    with.terminate(Duration::from_secs(10));
    let _without_again = hello(&world, "hello-without-again", &["--without-finalize"]);
    world.request_reconcile("plain", "2");
    wait_served(&world, "plain", "hello-without-again", &json!([]));

    // Deleted before any: it goes all the same, its plugins declaring no
    // Finalize to call.
    world
        .cluster
        .kubectl_ok(&["delete", "widget", "kept", "-n", "default", "--timeout=20s"]);
    assert!(world.gone(Some("default"), "widget/kept"));
    log.wait_for(Duration::from_secs(5), "why it was not finalized", |l| {
        l.contains("its plugins declare no Finalize") && l.contains("kept.default")
    });

    // Its deletion waits for nobody: the operator is not even running.
    operator.terminate(Duration::from_secs(10));
    world.cluster.kubectl_ok(&[
        "delete",
        "widget",
        "plain",
        "-n",
        "default",
        "--timeout=20s",
    ]);
    assert!(world.gone(Some("default"), "widget/plain"));
}
