//! Processes whose log is gone: their stderr a pipe nobody reads any more,
//! as when whatever collected it has died, so that every line they log
//! fails with EPIPE. They must go on serving. tracing-subscriber reports a
//! failed write with `eprintln!`, which panics when stderr is that same
//! broken pipe, in whatever task was logging; kplug, the operator and the
//! example plugins turn that report off.

use kplug_test_support::{StandaloneKplug, greeting_reconcile};
use serde_json::Value;

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn ready(plugin: &Value) -> bool {
    plugin["status"]["conditions"][0]["status"] == "True"
}

/// Asks the hello plugin to reconcile a Greeting through `kplug`; its
/// greeting.
fn greet(kplug: &StandaloneKplug, name: &str) -> String {
    let path = format!("{PLUGINS}/hello/reconcile");
    let (code, answer) = kplug.post_json(&path, &greeting_reconcile(name));
    assert_eq!(code, 201, "{answer:#}");
    answer["status"]["results"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_plugin_whose_log_is_gone_still_answers() {
    let kplug = StandaloneKplug::start();
    // The plugin logs its registration, and a line in every call.
    let _plugin = kplug.plugin_with_lost_log("hello", &[]);
    kplug.wait_for_plugin("hello", ready);
    for name in ["ada", "grace"] {
        assert_eq!(greet(&kplug, name), format!("hello, {name}"));
    }
}

#[test]
fn kplug_whose_log_is_gone_still_serves() {
    // Debug lines for every heartbeat change and every reconcile.
    let kplug = StandaloneKplug::start_with_lost_log(&[]);
    let _plugin = kplug.plugin("hello", &[]);
    kplug.wait_for_plugin("hello", ready);
    for name in ["ada", "grace"] {
        assert_eq!(greet(&kplug, name), format!("hello, {name}"));
    }
    let listed = kplug.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(listed.trim(), "plugin.plugins.kplug.io/hello");
}
