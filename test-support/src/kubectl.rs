//! The real kubectl, the way every harness runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::process::{Lines, Process, output_text};
use crate::required;

/// The kubectl the acceptance criteria name.
pub const KUBECTL: &str = "/usr/bin/kubectl";
/// Older and newer kubectls, driven too since users run them.
const OTHER_KUBECTLS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.27",
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
];
/// Where the kubectls come from.
const INSTALL_KUBECTLS: &str = "the machine's `kubectl` package (the Google Cloud SDK's, \
    which ships kubectl.1.27 to kubectl.1.33 beside kubectl) installs them";

/// The kubectls the tests drive, [`KUBECTL`] first: all of them under CI;
/// elsewhere those installed (see [`required::tool`]).
pub fn kubectls() -> Vec<PathBuf> {
    std::iter::once(KUBECTL)
        .chain(OTHER_KUBECTLS.iter().copied())
        .filter_map(|path| required::tool(path, INSTALL_KUBECTLS))
        .collect()
}

/// The kubectl of minor version `minor` (one of [`OTHER_KUBECTLS`]), as
/// [`required::tool`] finds it.
pub fn kubectl_of(minor: &str) -> Option<PathBuf> {
    let path = OTHER_KUBECTLS
        .iter()
        .find(|path| path.ends_with(&format!("kubectl.{minor}")))
        .unwrap_or_else(|| panic!("no kubectl {minor} among {OTHER_KUBECTLS:?}"));
    required::tool(path, INSTALL_KUBECTLS)
}

fn command(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(kubectl);
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null());
    command
}

/// `kubectl --kubeconfig KUBECONFIG ARGS...`, run to completion.
pub(crate) fn run(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    command(kubectl, kubeconfig, args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", kubectl.display()))
}

/// [`run`] with [`KUBECTL`], failing the test on a non-zero exit; its stdout.
pub(crate) fn run_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let output = run(Path::new(KUBECTL), kubeconfig, args);
    assert!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        output_text(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A [`KUBECTL`] that keeps running (e.g. `get -w`), its stdout as lines.
pub(crate) fn spawn(kubeconfig: &Path, args: &[&str]) -> (Process, Lines) {
    Process::spawn_with_stdout(
        command(Path::new(KUBECTL), kubeconfig, args).stderr(Stdio::inherit()),
        "kubectl",
    )
}

/// A one-hour token of the ServiceAccount `namespace/name` for `audiences`
/// (none: kube-apiserver's own), from the TokenRequest API: the request is
/// written in `dir` and sent with `create_raw` (`kubectl create --raw PATH
/// -f FILE` as the cluster's admin, returning its output).
pub(crate) fn service_account_token(
    dir: &Path,
    namespace: &str,
    name: &str,
    audiences: &[&str],
    create_raw: impl FnOnce(&[&str]) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    use anyhow::Context;
    let request = dir.join("token-request.json");
    let mut spec = serde_json::json!({"expirationSeconds": 3600});
    if !audiences.is_empty() {
        spec["audiences"] = serde_json::json!(audiences);
    }
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": spec,
    });
    std::fs::write(&request, body.to_string())
        .with_context(|| format!("writing {}", request.display()))?;
    let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token");
    let answer = create_raw(&["create", "--raw", &path, "-f", &request.to_string_lossy()])?;
    let answer: serde_json::Value =
        serde_json::from_str(&answer).context("the TokenRequest's answer is not JSON")?;
    answer["status"]["token"]
        .as_str()
        .map(str::to_owned)
        .context("no token in the TokenRequest's answer")
}
