//! Where the repository and the workspace's built binaries are, from any
//! test or bench of any package.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

use crate::process::output_text;

/// The repository's root: the nearest ancestor of this crate with a
/// workspace `Cargo.toml` (this crate's parent), so that scripts such as
/// `hack/control-plane.sh` are found whichever package's test runs.
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .skip(1)
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.contains("[workspace]"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no workspace Cargo.toml above {}: kplug-test-support must stay inside the kplug repository",
                here.display()
            )
        })
        .to_owned()
}

/// `target/<profile>/<name>`, the binary of some workspace package built
/// with the same profile as the running test or bench; `build` is the
/// command that builds it, named in the error when it is missing.
///
/// The profile directory is the nearest ancestor of the running executable
/// that holds `deps/` (tests and benches live in `target/<profile>/deps/`).
/// `CARGO_BIN_EXE_*` would not do: cargo sets it only for the binaries of
/// the test's own package.
pub fn target_binary(name: &str, build: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running test executable")?;
    let profile_dir = exe
        .ancestors()
        .skip(1)
        .find(|dir| dir.join("deps").is_dir())
        .with_context(|| {
            format!(
                "{} is not inside a cargo target profile directory",
                exe.display()
            )
        })?;
    let binary = profile_dir.join(name);
    ensure!(
        binary.exists(),
        "{} is missing: run `{build}` first",
        binary.display()
    );
    Ok(binary)
}

/// [`target_binary`] for tests: panics, telling to run
/// `cargo build --workspace` (as `hack/test.sh` does) when it is missing.
pub fn workspace_binary(name: &str) -> PathBuf {
    target_binary(name, "cargo build --workspace")
        .unwrap_or_else(|e| panic!("{e:#} (hack/test.sh builds the workspace before the tests)"))
}

/// The commit the tree is at, and whether it has changes beyond it (what
/// a bench measured, or the images were built from), as Markdown.
pub fn tree() -> Result<String> {
    let git = |args: &[&str]| -> Result<String> {
        let output = Command::new("git")
            .arg("-C")
            .arg(repo_root())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running git")?;
        ensure!(
            output.status.success(),
            "git {args:?}: {}",
            output_text(&output)
        );
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    Ok(
        if git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
            format!("`{commit}`")
        } else {
            format!("`{commit}` with uncommitted changes")
        },
    )
}
