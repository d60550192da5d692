//! Plugins of an [`AggregatedKplug`]: their Kubernetes identity, the
//! hello plugin (examples/hello-rust) heartbeating with it, and waiting
//! until one is Ready.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::kplug::AggregatedKplug;
use crate::process::{Process, free_port, output_text, wait_until};
use crate::workspace::workspace_binary;

/// A plugin's identity as a chart would make it: the ServiceAccount
/// `plugins/NAME`, allowed to heartbeat as the plugin `heartbeat_as` only
/// (`None`: no role at all), and a token of it for kplug's registry in
/// `dir/NAME.token`, whose path this returns. The namespace `plugins` must
/// exist.
pub fn plugin_identity(
    cluster: &ControlPlane,
    name: &str,
    heartbeat_as: Option<&str>,
    dir: &Path,
) -> PathBuf {
    cluster.service_account_with_role(name, heartbeat_as);
    let token_file = dir.join(format!("{name}.token"));
    std::fs::write(&token_file, cluster.plugin_token("plugins", name))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", token_file.display()));
    token_file
}

/// The hello plugin's command line to heartbeat to `kplug` over TLS as
/// `name` with the token in `token_file`, serving on a free port; add the
/// interval and where its output goes.
pub fn hello_plugin_command(kplug: &AggregatedKplug, name: &str, token_file: &Path) -> Command {
    let mut command = Command::new(workspace_binary("hello-plugin"));
    command
        .args([
            "--registry",
            &format!("https://localhost:{}", kplug.grpc),
            "--name",
            name,
        ])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--registry-ca-file")
        .arg(kplug.certs.join("ca.crt"))
        .arg("--token-file")
        .arg(token_file)
        .stdin(Stdio::null());
    command
}

/// The hello plugin heartbeating to `kplug` every second as `name` with the
/// token in `token_file`, logging to stderr.
pub fn hello_plugin(kplug: &AggregatedKplug, name: &str, token_file: &Path) -> Process {
    Process::spawn(
        hello_plugin_command(kplug, name, token_file)
            .args(["--heartbeat-interval", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
        name,
    )
}

/// Adds what a plugin (of either SDK) needs to heartbeat to `kplug`:
/// its TLS registry, kplug's CA, the token in `token`, a one-second
/// interval; stdout is dropped and stderr inherited.
pub fn plugin_tls(command: &mut Command, kplug: &AggregatedKplug, token: &Path) {
    command
        .args(["--registry", &format!("https://localhost:{}", kplug.grpc)])
        .arg("--registry-ca-file")
        .arg(kplug.certs.join("ca.crt"))
        .arg("--token-file")
        .arg(token)
        .args(["--heartbeat-interval", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
}

/// Waits until kplug lists the plugin `name` with Ready=True.
pub fn wait_plugin_ready(cluster: &ControlPlane, name: &str) {
    wait_until(
        &format!("plugin {name} Ready"),
        Duration::from_secs(60),
        || {
            let output = cluster.kubectl(&["get", "plugin", name, "-o", "json"]);
            if !output.status.success() {
                return Err(output_text(&output));
            }
            let plugin: Value =
                serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
            let ready = plugin["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(()).ok_or_else(|| plugin.to_string())
        },
    );
}

/// A `Reconcile` of the Greeting `name`, the hello plugin's API, as a
/// caller posts it to `plugins/NAME/reconcile`.
pub fn greeting_reconcile(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {"object": {
            "apiVersion": "example.com/v1",
            "kind": "Greeting",
            "metadata": {"name": name},
        }},
    })
}
