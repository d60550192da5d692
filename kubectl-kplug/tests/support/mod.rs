//! Runs `kubectl kplug` the way a user does: the real kubectl finds the
//! plugin `kubectl-kplug` on the PATH and runs it.

#![allow(dead_code)] // each test binary uses a part

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use kplug_test_support::{KUBECTL, output_text};

/// A PATH whose first directory holds only `kubectl-kplug` (this
/// package's binary), so kubectl finds exactly this build of the plugin.
pub struct Plugin {
    path: OsString,
}

impl Plugin {
    /// Puts a link to the built binary in `dir/bin`.
    pub fn install(dir: &Path) -> Self {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("create the plugin's bin directory");
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_kubectl-kplug"),
            bin.join("kubectl-kplug"),
        )
        .expect("link kubectl-kplug into the bin directory");
        let mut dirs = vec![bin];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        Self {
            path: std::env::join_paths(dirs).expect("a PATH"),
        }
    }

    /// `kubectl kplug ARGS...` with the kubeconfig given by `--kubeconfig`.
    pub fn run(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        self.command(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .output()
            .expect("run kubectl kplug")
    }

    /// `kubectl kplug ARGS...` with `KUBECONFIG` set instead of the flag.
    pub fn run_with_env(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        self.command(args)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .expect("run kubectl kplug")
    }

    /// `kubectl kplug ARGS...`, killed by `timeout` after `seconds` (exit
    /// 124), so that a hang fails a test instead of stalling it.
    pub fn bounded(&self, seconds: u32, args: &[&str]) -> Output {
        let mut command = Command::new("timeout");
        command
            .args(["--kill-after=5", &seconds.to_string(), KUBECTL, "kplug"])
            .args(args)
            .env("PATH", &self.path)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        command.output().expect("run timeout kubectl kplug")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(KUBECTL);
        command
            .arg("kplug")
            .args(args)
            .env("PATH", &self.path)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        command
    }
}

/// stdout of a run that must succeed.
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "kubectl kplug failed: {}",
        output_text(output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// stderr of a run that must fail with exit code 1, without a panic.
pub fn fails(output: &Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(1),
        "kubectl kplug should fail with 1: {}",
        output_text(output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.starts_with("error: "),
        "kubectl's error form: {stderr}"
    );
    stderr
}
