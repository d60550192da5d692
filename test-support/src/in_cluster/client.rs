//! The pod the benches send their calls from: the cluster's toolbox image
//! (`KPLUG_CLUSTER_TOOLBOX_IMAGE`, busybox) sleeping, so that a bench can
//! enter its network namespace (`/proc/PID/ns/net` of [`Pod::pid`]) and
//! reach kube-apiserver and the pods as a workload in the cluster does,
//! over the pod's veth and the bridge, not from the node.

use anyhow::{Context, Result};

use super::{Node, Pod};

/// The pod's name and namespace: `default`, which no bench creates or
/// deletes (the convergence bench makes its namespaces afresh).
pub const CLIENT: &str = "bench-client";
pub const CLIENT_NAMESPACE: &str = "default";

/// The client pod, created unless it runs already, once Ready.
pub fn client_pod(node: &Node) -> Result<Pod> {
    let image = node.var("KPLUG_CLUSTER_TOOLBOX_IMAGE")?;
    node.apply(&manifest(image))?;
    node.kubectl(&[
        "-n",
        CLIENT_NAMESPACE,
        "wait",
        "--for=condition=Ready",
        &format!("pod/{CLIENT}"),
        "--timeout=2m",
    ])?;
    node.pods(
        CLIENT_NAMESPACE,
        &format!("app.kubernetes.io/name={CLIENT}"),
    )?
    .pop()
    .with_context(|| format!("no Ready pod {CLIENT_NAMESPACE}/{CLIENT}"))
}

/// A bare Pod: nothing to restart it elsewhere, and nothing it needs (no
/// token, no Service links). busybox's `sleep` as PID 1 ignores SIGTERM,
/// hence the short grace period when the cluster deletes it.
fn manifest(image: &str) -> String {
    format!(
        r"apiVersion: v1
kind: Pod
metadata:
  name: {CLIENT}
  namespace: {CLIENT_NAMESPACE}
  labels: {{app.kubernetes.io/name: {CLIENT}}}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: {image}
    imagePullPolicy: Never
    command: [/bin/busybox, sleep, '86400']
    resources:
      requests: {{cpu: 10m, memory: 8Mi}}
      limits: {{cpu: 100m, memory: 16Mi}}
    securityContext:
      runAsNonRoot: true
      runAsUser: 65534
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {{drop: [ALL]}}
"
    )
}
