//! The DatabaseTable walkthrough end to end, exactly as a user runs it:
//! `hack/walkthrough.sh --check` starts a real control plane, installs kplug
//! as an aggregated API server, starts PostgreSQL, MariaDB, both plugins and
//! the zero-code kplug-operator, applies `examples/database-table/users.yaml`
//! and verifies that the table `users` exists in MariaDB with the columns
//! `id, name`; then it stops everything it started.
//!
//! The script builds its binaries with the debug profile here
//! (`KPLUG_WALKTHROUGH_PROFILE=debug`), which `hack/test.sh` has already
//! built, so it costs no release build. It takes a minute or two.

use std::process::{Command, Stdio};
use std::time::Instant;

use kplug_test_support::repo_root;

#[test]
fn walkthrough_script_check_passes() {
    // Fresh (the script makes it), and under /tmp: as root, PostgreSQL
    // runs as nobody, who must reach it.
    let dir = tempfile::Builder::new()
        .prefix("kplug-walkthrough-test-")
        .tempdir_in("/tmp")
        .expect("temp dir")
        .keep();
    let script = repo_root().join("hack/walkthrough.sh");
    let mut command = Command::new(&script);
    command
        .arg("--check")
        .env("KPLUG_WALKTHROUGH_DIR", &dir)
        .env("KPLUG_WALKTHROUGH_PROFILE", "debug")
        .current_dir(repo_root())
        .stdin(Stdio::null());
    // What cargo sets for this test's package would leak into the script's
    // `cargo build`; leave the user's cargo settings (CARGO_HOME,
    // CARGO_TARGET_DIR, ...) alone.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
            || name == "CARGO_PRIMARY_PACKAGE"
        {
            command.env_remove(&*name);
        }
    }
    let started = Instant::now();
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "hack/walkthrough.sh --check failed ({}) after {:?}; its files stay in {}\n\
         --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status,
        started.elapsed(),
        dir.display(),
    );
    assert!(
        stdout.contains("CREATE TABLE `users`") && stderr.contains("walkthrough verified"),
        "hack/walkthrough.sh --check succeeded without showing the table\n\
         --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    eprintln!(
        "hack/walkthrough.sh --check passed in {:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
