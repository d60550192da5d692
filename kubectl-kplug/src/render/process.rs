//! The plugin command `kubectl kplug render` runs: started with the SDKs'
//! local mode (`KPLUG_LOCAL_ADDRESS_FILE`), waited for until it says where
//! it listens, and stopped as a pod is (SIGTERM, then SIGKILL).

use std::os::fd::AsFd;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

/// How often the address file is looked for while the plugin starts.
const LOOK_EVERY: Duration = Duration::from_millis(20);
/// How long the plugin gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Why the plugin could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot run {command:?}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("{command:?} exited ({status}) before it listened; what it printed is above")]
    Exited { command: String, status: ExitStatus },
    #[error(
        "{command:?} did not start listening within {waited:?}; what it printed is above\n  is it a kplug plugin built with the Rust or Python SDK? Those serve locally when KPLUG_LOCAL_ADDRESS_FILE is set; --start-timeout waits longer"
    )]
    Silent { command: String, waited: Duration },
    #[error("cannot prepare the plugin's start: {0}")]
    Io(#[from] std::io::Error),
}

/// A plugin command running locally.
pub struct LocalPlugin {
    child: Child,
    /// Holds the address file; removed when the plugin is dropped.
    _dir: tempfile::TempDir,
}

impl LocalPlugin {
    /// Starts `command` (program and arguments) and waits until it listens;
    /// returns it and its address. Its output goes to stderr, keeping
    /// stdout for the outcome.
    pub async fn start(command: &[String], within: Duration) -> Result<(Self, String), StartError> {
        let dir = tempfile::tempdir()?;
        let address_file = dir.path().join("address");
        let shown = command.join(" ");
        let (program, args) = command.split_first().ok_or_else(|| StartError::Spawn {
            command: shown.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command"),
        })?;
        let stdout = std::io::stderr().as_fd().try_clone_to_owned()?;
        let child = Command::new(program)
            .args(args)
            .env("KPLUG_LOCAL_ADDRESS_FILE", &address_file)
            .env("KPLUG_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            // Never outlives an error on the way.
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| StartError::Spawn {
                command: shown.clone(),
                source,
            })?;
        let mut plugin = Self { child, _dir: dir };
        let address = tokio::time::timeout(within, plugin.address(&address_file, &shown))
            .await
            .map_err(|_| StartError::Silent {
                command: shown,
                waited: within,
            })??;
        Ok((plugin, address))
    }

    /// The address the plugin writes once it listens, unless it exits first.
    async fn address(&mut self, file: &Path, command: &str) -> Result<String, StartError> {
        loop {
            match tokio::fs::read_to_string(file).await {
                // Empty: a plugin that creates the file before it writes
                // the address (the SDKs write it whole) is not done yet.
                Ok(address) if !address.trim().is_empty() => return Ok(address.trim().to_owned()),
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error.into()),
            }
            tokio::select! {
                status = self.child.wait() => return Err(StartError::Exited {
                    command: command.to_owned(),
                    status: status?,
                }),
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }

    /// Stops the plugin as the kubelet stops a pod: SIGTERM, and SIGKILL if
    /// it is still running after [`STOP_GRACE`].
    pub async fn stop(mut self) {
        if let Some(pid) = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}
