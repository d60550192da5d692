//! Plugin identity: kplug as the CA of its plugins.
//!
//! A plugin instance proves who it is on every heartbeat with its
//! ServiceAccount token, which kplug reviews and authorizes for the
//! plugin's name (`create plugins/heartbeat`, see [`crate::auth`]). That
//! heartbeat may carry a certificate signing request for a key the
//! instance made in memory; kplug signs it ([`Signer::sign`]) for the one
//! name the instance may hold, its identity [`identity`]`(NAME)`, a DNS name
//! under a suffix of kplug's API group that nothing resolves. When kplug
//! dials an instance it verifies that name, not the address, so a pod that
//! takes over an address cannot answer for the plugin.
//!
//! The certificate is `serverAuth` only, so it cannot call another plugin;
//! kplug's client certificate, from the same CA, is `clientAuth` only. Both
//! are short-lived (`--plugin-cert-lifetime`) and renewed at two thirds of
//! their life. The private keys never leave their process and nothing is
//! written to a Secret.

mod csr;
mod signer;

pub use csr::{CsrError, MAX_REQUEST_BYTES};
pub use signer::{
    ClientCertificate, Issued, SignError, Signer, SignerError, SigningFiles, TrustBundle,
};

/// The DNS suffix of plugin identities: kplug's API group. Names under it
/// are certified only by kplug's plugin CA, and only to the plugin named.
pub const IDENTITY_SUFFIX: &str = "plugins.kplug.io";

/// The identity of plugin `plugin`: the DNS name its certificate holds and
/// kplug verifies, `NAME.plugins.kplug.io`.
pub fn identity(plugin: &str) -> String {
    format!("{plugin}.{IDENTITY_SUFFIX}")
}

/// The plugin whose identity `server_name` is, if it is one.
pub fn plugin_of(server_name: &str) -> Option<&str> {
    server_name
        .strip_suffix(IDENTITY_SUFFIX)
        .and_then(|name| name.strip_suffix('.'))
        .filter(|name| !name.is_empty())
}
