//! Bad input reaches the zero-code operator as conditions, Events and clear
//! exits, never as a panic: malformed or dangling extension references,
//! kinds the cluster does not serve, resources without a status
//! subresource or not served at all.

use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::{
    AggregatedKplug, ControlPlane, Lines, Process, hello_plugin_command, output_text,
    plugin_identity, wait_until, workspace_binary,
};
use serde_json::Value;

const CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.kplug.io}
spec:
  group: test.kplug.io
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.test.kplug.io}
spec:
  group: test.kplug.io
  scope: Namespaced
  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

fn widget(name: &str, extensions: &str) -> String {
    format!(
        "apiVersion: test.kplug.io/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\nspec: {{size: 1{extensions}}}\n"
    )
}

fn operator(cluster: &ControlPlane, resource: &str) -> Command {
    let mut command = Command::new(workspace_binary("kplug-operator"));
    command
        .args([
            "--resource",
            resource,
            "--leader-elect=false",
            "--namespace",
            "default",
        ])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

fn ready(cluster: &ControlPlane, name: &str) -> Result<Value, String> {
    let output = cluster.kubectl(&["get", "widget", name, "-n", "default", "-o", "json"]);
    let object: Value = serde_json::from_slice(&output.stdout).map_err(|_| output_text(&output))?;
    let conditions = object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions
        .into_iter()
        .find(|c| c["type"] == "Ready")
        .ok_or_else(|| format!("no Ready condition yet: {}", object["status"]))
}

#[test]
fn bad_references_and_resources_are_conditions_and_clear_errors() {
    let work = tempfile::Builder::new()
        .prefix("kplug-operator-bad-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kplug = AggregatedKplug::start(&cluster, work.path(), &["--min-heartbeat-interval", "1s"]);
    cluster.apply(CRDS);
    for crd in ["widgets", "gadgets"] {
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{crd}.test.kplug.io"),
            "--timeout=30s",
        ]);
    }
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let token = plugin_identity(&cluster, "widgets", Some("widgets"), work.path());
    let _plugin = Process::spawn(
        hello_plugin_command(&kplug, "widgets", &token)
            .args(["--api", "widgets.test.kplug.io/v1", "--interval", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
        "widgets plugin",
    );

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
        let output = operator(&cluster, resource)
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

    let mut child = operator(&cluster, "widgets.test.kplug.io")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kplug-operator");
    let log = Lines::new(child.stderr.take().expect("stderr"));
    let mut running = Process::new(child, "kplug-operator");
    log.wait_for(Duration::from_secs(30), "the controller", |l| {
        l.contains("controller started")
    });

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
        cluster.apply(&widget(name, extensions));
    }
    for (name, _, status, reason) in cases {
        wait_until(
            &format!("{name}: Ready={status} {reason}"),
            Duration::from_secs(30),
            || {
                let ready = ready(&cluster, name)?;
                (ready["status"] == status && ready["reason"] == reason)
                    .then_some(())
                    .ok_or_else(|| ready.to_string())
            },
        );
    }
    let plain = cluster.kubectl_ok(&[
        "get",
        "widget",
        "plain",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.greeting}",
    ]);
    assert_eq!(
        plain, "hello, plain",
        "the plugin's objectStatus, without extensions"
    );
    let message = ready(&cluster, "no-name")
        .map(|r| r["message"].to_string())
        .unwrap_or_default();
    assert!(
        message.contains("spec.extensions[0]") && message.contains("name"),
        "{message}"
    );

    // The dangling reference resolves once its object exists (a retry).
    cluster.kubectl_ok(&[
        "create",
        "configmap",
        "absent",
        "-n",
        "default",
        "--from-literal=k=v",
    ]);
    wait_until("dangling: Ready=True", Duration::from_secs(30), || {
        let ready = ready(&cluster, "dangling")?;
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
