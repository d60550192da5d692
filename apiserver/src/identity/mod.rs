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

pub use kplug_proto::v1alpha1::{IDENTITY_SUFFIX, identity, plugin_of};
