//! The real kubectl, the way every harness runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::process::{Lines, Process, output_text};

/// The kubectl the acceptance criteria name.
pub const KUBECTL: &str = "/usr/bin/kubectl";
/// Older and newer kubectls, driven too when installed, since users run them.
const OTHER_KUBECTLS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.27",
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
];

/// Every kubectl on this machine that the tests should drive, [`KUBECTL`]
/// first.
pub fn kubectls() -> Vec<PathBuf> {
    std::iter::once(KUBECTL)
        .chain(OTHER_KUBECTLS.iter().copied())
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
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
