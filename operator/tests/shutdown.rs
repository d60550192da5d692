//! SIGTERM as a pod's stop sends it, at the worst moment: just after the
//! controller started, before its first list of the resource. kube-runtime
//! holds every reconcile until that list, and its graceful shutdown then
//! waited for the list forever (5 of 6 tries hung before the fix); the
//! operator must stop at once, since nothing ran. The bound is a hang's,
//! not a speed: the operator exits within milliseconds.

use std::process::Stdio;
use std::time::Duration;

use kplug_test_support::{ControlPlane, Lines, Process, widget_crd, workspace_binary};

#[test]
fn sigterm_right_after_start_stops_the_operator() {
    let work = tempfile::Builder::new()
        .prefix("kplug-operator-shutdown-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));
    cluster.apply(&widget_crd("test.kplug.io"));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.test.kplug.io",
        "--timeout=30s",
    ]);
    for attempt in 1..=5 {
        let mut child = std::process::Command::new(workspace_binary("kplug-operator"))
            .args([
                "--resource",
                "widgets.test.kplug.io",
                "--leader-elect=false",
            ])
            .args(["--metrics-bind-address", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kplug-operator");
        let log = Lines::new(child.stderr.take().expect("stderr"));
        let mut operator = Process::new(child, "kplug-operator");
        log.wait_for(Duration::from_secs(30), "the controller", |l| {
            l.contains("controller started")
        });
        assert!(
            operator.terminate(Duration::from_secs(20)),
            "attempt {attempt}: kplug-operator did not stop within 20 s of SIGTERM"
        );
    }
}
