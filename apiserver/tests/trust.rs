//! kplug keeps its registry's trust bundle in labelled namespaces, with the
//! RBAC deploy/ ships, against a real kube-apiserver: the ConfigMap
//! appears, comes back when deleted or edited, follows the bundle file, and
//! stays out of namespaces that did not opt in.

use std::time::Duration;

use kplug_test_support::{AggregatedKplug, ControlPlane, replace_file, wait_until};

const WITHIN: Duration = Duration::from_secs(30);

/// The `ca.crt` of ConfigMap kplug-trust in `namespace`, or why not.
fn bundle_in(cluster: &ControlPlane, namespace: &str) -> Result<String, String> {
    let output = cluster.kubectl(&[
        "-n",
        namespace,
        "get",
        "configmap",
        "kplug-trust",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn the_trust_bundle_is_kept_in_labelled_namespaces_only() {
    let work = tempfile::Builder::new()
        .prefix("kplug-trust-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let dir = work.path();
    let cluster = ControlPlane::start(dir.join("cp"));
    // The bundle kplug reads: first its own CA, later another certificate.
    let bundle = dir.join("trust.crt");
    let other = dir.join("other.crt");
    let flags = [
        "--cert-reload-interval=1s",
        &format!("--registry-trust-bundle-file={}", bundle.display()),
    ];
    // The installation makes kplug's certificates; the bundle must exist first.
    std::fs::write(
        &bundle,
        "-----BEGIN CERTIFICATE-----\nfirst\n-----END CERTIFICATE-----\n",
    )
    .expect("bundle");
    let kplug = AggregatedKplug::start(&cluster, dir, &flags);
    replace_file(&kplug.certs.join("ca.crt"), &bundle);
    let ca = std::fs::read_to_string(&bundle).expect("CA");

    for namespace in ["plugins", "elsewhere"] {
        cluster.kubectl_ok(&["create", "namespace", namespace]);
    }
    cluster.kubectl_ok(&[
        "label",
        "namespace",
        "plugins",
        "plugins.kplug.io/trust=enabled",
    ]);
    wait_until("kplug-trust in plugins", WITHIN, || {
        bundle_in(&cluster, "plugins").and_then(|got| (got == ca).then_some(()).ok_or(got))
    });

    // Deleted or edited: put back.
    cluster.kubectl_ok(&["-n", "plugins", "delete", "configmap", "kplug-trust"]);
    wait_until("kplug-trust back after a delete", WITHIN, || {
        bundle_in(&cluster, "plugins").and_then(|got| (got == ca).then_some(()).ok_or(got))
    });
    cluster.kubectl_ok(&[
        "-n",
        "plugins",
        "patch",
        "configmap",
        "kplug-trust",
        "--type=merge",
        "-p",
        r#"{"data":{"ca.crt":"edited"}}"#,
    ]);
    wait_until("kplug-trust restored after an edit", WITHIN, || {
        bundle_in(&cluster, "plugins").and_then(|got| (got == ca).then_some(()).ok_or(got))
    });

    // The bundle rotates: every labelled namespace follows.
    std::fs::write(&other, format!("{ca}{ca}")).expect("two certificates");
    replace_file(&other, &bundle);
    let rotated = format!("{ca}{ca}");
    wait_until("kplug-trust follows the bundle file", WITHIN, || {
        bundle_in(&cluster, "plugins").and_then(|got| (got == rotated).then_some(()).ok_or(got))
    });

    // A namespace without the label gets nothing.
    let error = bundle_in(&cluster, "elsewhere").expect_err("no ConfigMap there");
    assert!(error.contains("NotFound"), "{error}");
}
