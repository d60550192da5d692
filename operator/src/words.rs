//! Library errors as a person reads them in a log line, a condition or an
//! Event: kube-rs's own `Display` of an API error appends the whole
//! `Status` in `Debug` form (`ApiError: ... (Status { status: Some(..),
//! code: 409, ... })`); here it is kube-apiserver's message with its code
//! and reason.

use kube::core::Status;
use kube::runtime::{controller, watcher};

/// kube-apiserver's answer: its message, then the code and reason that
/// `kubectl` prints as `Error from server (Reason)`.
pub fn api_status(status: &Status) -> String {
    match (status.code, status.reason.as_str()) {
        (0, "") => status.message.clone(),
        (code, "") => format!("{} ({code})", status.message),
        (code, reason) => format!("{} ({code} {reason})", status.message),
    }
}

/// A kube client error.
pub fn kube_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(answer) => format!("kube-apiserver answered: {}", api_status(answer)),
        other => other.to_string(),
    }
}

/// The leader election's failure.
pub fn lease_error(error: &kube_lease_manager::LeaseManagerError) -> String {
    match error {
        kube_lease_manager::LeaseManagerError::KubeError(e) => kube_error(e),
        other => other.to_string(),
    }
}

/// A watch's failure.
pub fn watch_error(error: &watcher::Error) -> String {
    match error {
        watcher::Error::InitialListFailed(e) => format!("listing failed: {}", kube_error(e)),
        watcher::Error::WatchStartFailed(e) => {
            format!("starting a watch failed: {}", kube_error(e))
        }
        watcher::Error::WatchError(answer) => format!("the watch ended: {}", api_status(answer)),
        watcher::Error::WatchFailed(e) => format!("the watch failed: {}", kube_error(e)),
        other => other.to_string(),
    }
}

/// A controller's failure other than a reconcile's.
pub fn controller_error<E: std::error::Error>(
    error: &controller::Error<E, watcher::Error>,
) -> String {
    match error {
        controller::Error::QueueError(e) => watch_error(e),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_error_is_its_message_code_and_reason_without_debug() {
        let conflict = Status {
            code: 409,
            reason: "Conflict".into(),
            message: "Operation cannot be fulfilled on widgets.test.kplug.io \"a\": the object has been modified".into(),
            ..Default::default()
        };
        let error = kube::Error::Api(Box::new(conflict));
        assert!(error.to_string().contains("Status {"), "kube-rs's own text");
        assert_eq!(
            kube_error(&error),
            "kube-apiserver answered: \
             Operation cannot be fulfilled on widgets.test.kplug.io \"a\": the object has been \
             modified (409 Conflict)"
        );
        let watch = watcher::Error::WatchError(Box::new(Status {
            code: 410,
            reason: "Expired".into(),
            message: "too old resource version: 1 (5)".into(),
            ..Default::default()
        }));
        assert_eq!(
            watch_error(&watch),
            "the watch ended: too old resource version: 1 (5) (410 Expired)"
        );
    }
}
