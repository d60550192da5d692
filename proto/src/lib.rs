//! kplug's gRPC contract, generated from `proto/kplug/v1alpha1/*.proto`,
//! the trace context that travels with its calls, and the duration form
//! both sides' command lines take.

pub mod codec;
pub mod duration;
pub mod trace;

/// Version `v1alpha1` of the contract.
pub mod v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/registry/kplug.v1alpha1.rs"));
    include!(concat!(env!("OUT_DIR"), "/plugin/kplug.v1alpha1.rs"));

    /// The protocol version this crate implements.
    pub const PROTOCOL_VERSION: &str = "v1alpha1";

    /// The DNS suffix of plugin identities (HeartbeatRequest.certificate_request):
    /// kplug's API group. kplug's plugin CA certifies names under it only to
    /// the plugin named.
    pub const IDENTITY_SUFFIX: &str = "plugins.kplug.io";

    /// The audience of the ServiceAccount tokens plugins heartbeat with (a
    /// projected token, `serviceAccountToken.audience`). kplug asks
    /// kube-apiserver to review a heartbeat's token for this audience only,
    /// so the token a plugin sends kplug is of no use against
    /// kube-apiserver, and a token for kube-apiserver is refused.
    pub const TOKEN_AUDIENCE: &str = "plugins.kplug.io";

    /// The identity of plugin `plugin`: the DNS name its certificate holds
    /// and kplug verifies, `NAME.plugins.kplug.io`.
    pub fn identity(plugin: &str) -> String {
        format!("{plugin}.{IDENTITY_SUFFIX}")
    }

    /// How a result's `severity` reads in kplug's API
    /// (`ReconcileResult.severity`): `Normal`, `Warning` or `Error`; an
    /// unspecified or unknown value reads as `Normal`.
    pub fn severity_name(severity: i32) -> &'static str {
        match Severity::try_from(severity) {
            Ok(Severity::Warning) => "Warning",
            Ok(Severity::Error) => "Error",
            _ => "Normal",
        }
    }

    /// The plugin whose identity `server_name` is, if it is one.
    pub fn plugin_of(server_name: &str) -> Option<&str> {
        server_name
            .strip_suffix(IDENTITY_SUFFIX)
            .and_then(|name| name.strip_suffix('.'))
            .filter(|name| !name.is_empty())
    }
}
