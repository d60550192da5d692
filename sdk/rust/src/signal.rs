//! Shutdown on the signals a plugin receives from a terminal or from Kubernetes.

use std::future::Future;

use crate::Error;

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM (Kubernetes stopping
/// the pod); on other platforms, on Ctrl-C.
///
/// The handlers are installed when this is called rather than when the
/// future is first polled, so a failure surfaces at startup and a signal
/// arriving in between is not lost.
///
/// # Errors
///
/// [`Error::Signal`] when the handlers cannot be installed.
///
/// # Panics
///
/// When called outside a Tokio runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, Error> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};

        let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signal)?;
        Ok(async move {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            tracing::info!(signal = name, "shutting down");
        })
    }
    #[cfg(not(unix))]
    {
        let mut ctrl_c = tokio::signal::windows::ctrl_c().map_err(Error::Signal)?;
        Ok(async move {
            ctrl_c.recv().await;
            tracing::info!(signal = "Ctrl-C", "shutting down");
        })
    }
}
