//! The SDK's error type.

/// Errors the SDK reports to the plugin.
///
/// Failures to reach the registry are not errors: the heartbeat loop retries
/// them and reports them through [`Status`](crate::Status), because a plugin
/// must keep running while kplug restarts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The registry address is not a URI the SDK can dial.
    #[error("invalid registry address {address:?}: {reason}")]
    InvalidRegistryAddress {
        /// The address as given.
        address: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A string is not an API reference of the form `resource.group/version`.
    #[error(
        "invalid API {value:?}: {reason}; expected resource.group/version, e.g. \
         databasetables.myorg.org/v1alpha1"
    )]
    InvalidApiRef {
        /// The string as given.
        value: String,
        /// Which part is wrong.
        reason: &'static str,
    },
    /// Installing the shutdown signal handlers failed.
    #[error("cannot listen for shutdown signals: {0}")]
    Signal(#[source] std::io::Error),
}
