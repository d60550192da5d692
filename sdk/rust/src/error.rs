//! The SDK's error type.

/// Errors the SDK reports to the plugin.
///
/// The message says what failed; the cause, when there is one, is the
/// error's [`source`](std::error::Error::source), so that reporters that
/// print the chain (like `anyhow`) show it once.
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
    /// The registry cannot be dialed over TLS as configured, e.g. an
    /// `https://` registry without a CA to trust
    /// ([`Config::registry_ca_file`](crate::Config::registry_ca_file)), or a
    /// CA file without a PEM certificate.
    #[error("cannot use TLS for the registry {address:?}: {reason}")]
    RegistryTls {
        /// The registry address as given.
        address: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// The registry CA file cannot be read.
    #[error("cannot read the registry CA file {}", path.display())]
    ReadRegistryCa {
        /// The file as configured.
        path: std::path::PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },
    /// The plugin cannot serve TLS as configured, e.g. a certificate without
    /// its key, a key that does not match the certificate, or a certificate
    /// without a client CA
    /// ([`Config::client_ca_file`](crate::Config::client_ca_file)) and
    /// without [`Config::allow_unauthenticated_clients`](crate::Config::allow_unauthenticated_clients).
    #[error("cannot serve TLS: {reason}")]
    ServeTls {
        /// What is missing or wrong.
        reason: String,
    },
    /// A file for serving TLS (certificate, key or client CA) cannot be read.
    #[error("cannot read the {what} {}", path.display())]
    ReadTlsFile {
        /// Which file: `certificate`, `private key` or `client CA`.
        what: &'static str,
        /// The file as configured.
        path: std::path::PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
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
    #[error("cannot listen for shutdown signals")]
    Signal(#[source] std::io::Error),
    /// The plugin's gRPC server cannot listen on its address, e.g. because
    /// another process holds the port.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address as configured.
        address: std::net::SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
    /// The address to declare to kplug is not `host[:port]`.
    #[error("invalid advertised address {address:?}: {reason}")]
    InvalidAdvertiseAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The listening address cannot be written to
    /// [`Config::local_address_file`](crate::Config::local_address_file).
    #[error("cannot write the listening address to {}", path.display())]
    WriteLocalAddress {
        /// The file as configured.
        path: std::path::PathBuf,
        /// Why writing failed.
        #[source]
        source: std::io::Error,
    },
    /// The plugin's gRPC server failed while serving.
    #[error("the gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
    /// A task of the SDK panicked or was cancelled by the runtime.
    #[error("an SDK task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
}

/// `error: cause: cause…`, since tonic's and rustls's errors keep the
/// detail in their sources.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
