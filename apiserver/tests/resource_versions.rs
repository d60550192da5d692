//! kplug's resourceVersions (`EPOCH.COUNTER`, see registry/version.rs) are
//! opaque strings to real clients: client-go's informer machinery (behind
//! `kubectl wait`) and the official Python client list, then watch from the
//! list's version. kube-rs is in replicas.rs and kube_client.rs, kubectl's
//! own watch in kubectl.rs.

use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::postgres::venv_python;
use kplug_test_support::{Process, StandaloneKplug, kubectls, output_text};

/// Lists plugins, says so, then watches from the list's resourceVersion
/// and prints every event until the plugin named in argv[2] is ADDED.
const PYTHON_WATCH: &str = r#"
import sys
from kubernetes import client, config, watch

config.load_kube_config(sys.argv[1])
api = client.CustomObjectsApi()
args = ("plugins.kplug.io", "v1alpha1", "plugins")
listed = api.list_cluster_custom_object(*args)
print("listed", listed["metadata"]["resourceVersion"], flush=True)
for event in watch.Watch().stream(
    api.list_cluster_custom_object,
    *args,
    resource_version=listed["metadata"]["resourceVersion"],
    timeout_seconds=30,
):
    name = event["object"]["metadata"]["name"]
    print(event["type"], name, event["object"]["metadata"]["resourceVersion"], flush=True)
    if event["type"] == "ADDED" and name == sys.argv[2]:
        break
"#;

#[test]
fn client_go_waits_on_a_plugin_with_kplugs_resource_versions() {
    let kplug = StandaloneKplug::start();
    let _plugin = kplug.plugin("opaque", &[]);
    // `kubectl wait` lists and watches through client-go's
    // watchtools.UntilWithSync (a reflector), which keeps and resends
    // the resourceVersions it was given; the oldest and the newest kubectl.
    let all = kubectls();
    for kubectl in [all.first(), all.last()].into_iter().flatten() {
        let output = kplug.kubectl_with(
            kubectl,
            &[
                "wait",
                "--for=condition=Ready",
                "plugin/opaque",
                "--timeout=30s",
            ],
        );
        assert!(
            output.status.success(),
            "{}: {}",
            kubectl.display(),
            output_text(&output)
        );
        assert!(
            output_text(&output).contains("plugin.plugins.kplug.io/opaque condition met"),
            "{}",
            output_text(&output)
        );
    }
}

#[test]
fn the_python_client_watches_from_a_listed_resource_version() {
    let kplug = StandaloneKplug::start();
    let _first = kplug.plugin("opaque-first", &[]);
    kplug.wait_for_plugin("opaque-first", |_| true);
    let (_watch, lines) = Process::spawn_with_stdout(
        Command::new(venv_python())
            .args(["-c", PYTHON_WATCH])
            .arg(&kplug.kubeconfig)
            .arg("opaque-later")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit()),
        "the Python client's watch",
    );
    let listed = lines.wait_for(Duration::from_secs(30), "the Python list", |l| {
        l.starts_with("listed ")
    });
    let version = listed.trim_start_matches("listed ").trim();
    assert!(version.contains('.'), "not EPOCH.COUNTER: {listed}");

    // Started after the list: the watch from its version must report it,
    // and not replay opaque-first (older than the version).
    let _later = kplug.plugin("opaque-later", &[]);
    let seen = std::sync::Mutex::new(Vec::new());
    let added = lines.wait_for(Duration::from_secs(30), "ADDED opaque-later", |l| {
        if let Ok(mut seen) = seen.lock() {
            seen.push(l.to_owned());
        }
        l.starts_with("ADDED opaque-later ")
    });
    let seen = seen.into_inner().unwrap_or_default();
    assert!(
        !seen.iter().any(|l| l.contains("opaque-first")),
        "replayed an object older than the listed version: {seen:?}"
    );
    assert_ne!(added.split_whitespace().nth(2), Some(version), "{added}");
}
