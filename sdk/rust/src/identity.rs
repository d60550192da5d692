//! The plugin's identity from kplug (cluster mode without certificate
//! files): a key made in memory at start, which never leaves the process,
//! and the certificates kplug signs for it on heartbeats.
//!
//! Every heartbeat that is due for a certificate carries a signing request
//! for the plugin's identity `NAME.plugins.kplug.io` (the same key each
//! time, as Linkerd's proxies do); kplug signs it once it has authorized the
//! heartbeat for that name. The answer also brings the trust bundle: the
//! CAs whose client certificates (kplug's) the plugin accepts. The next
//! request goes out when kplug's `certificate_renew_after` has passed, two
//! thirds into the certificate's life. New connections use the newest
//! certificate and bundle; connections already open keep theirs, so a
//! renewal drops no call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kplug_proto::v1alpha1::{HeartbeatRequest, HeartbeatResponse, identity};
use rcgen::{CertificateParams, KeyPair};
use ring::digest::{SHA256, digest};
use rustls::server::ServerConfig;
use tokio::sync::watch;

use crate::Error;
use crate::serve::tls::{Pem, build};

/// What the plugin holds from kplug.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) config: Arc<ServerConfig>,
    chain: String,
    bundle: String,
    bundle_sha256: Vec<u8>,
    renew_at: Instant,
}

/// The key, its signing request, and what kplug answered.
pub(crate) struct IssuedIdentity {
    name: String,
    key: String,
    request: Vec<u8>,
    held: watch::Sender<Option<Held>>,
}

impl IssuedIdentity {
    /// A new ECDSA P-256 key and its request for plugin `plugin`'s identity.
    pub(crate) fn new(plugin: &str) -> Result<Self, Error> {
        let name = identity(plugin);
        let failed = |e: rcgen::Error| Error::ServeTls {
            reason: format!("cannot make a key and certificate request for {name}: {e}"),
        };
        let key = KeyPair::generate().map_err(failed)?;
        let request = CertificateParams::new(vec![name.clone()])
            .and_then(|params| params.serialize_request(&key))
            .map_err(failed)?;
        Ok(Self {
            request: request.der().to_vec(),
            key: key.serialize_pem(),
            name,
            held: watch::channel(None).0,
        })
    }

    /// The DNS name kplug verifies.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Follows what is held, `None` until kplug signed a certificate.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Held>> {
        self.held.subscribe()
    }

    /// Adds what `request` must carry now: the signing request when a
    /// certificate is due, and the digest of the bundle held.
    pub(crate) fn stamp(&self, request: &mut HeartbeatRequest) {
        let held = self.held.borrow();
        let due = held
            .as_ref()
            .is_none_or(|held| Instant::now() >= held.renew_at);
        request.certificate_request = if due {
            self.request.clone()
        } else {
            Vec::new()
        };
        request.trust_bundle_sha256 = held
            .as_ref()
            .map(|held| held.bundle_sha256.clone())
            .unwrap_or_default();
    }

    /// Takes a new certificate or bundle from `reply`; `Ok(false)` when it
    /// brought neither.
    pub(crate) fn take(&self, reply: &HeartbeatResponse) -> Result<bool, String> {
        if reply.certificate_chain.is_empty() && reply.trust_bundle.is_empty() {
            return Ok(false);
        }
        let current = self.held.borrow().clone();
        let (chain, renew_at) = match (&current, reply.certificate_chain.is_empty()) {
            (_, false) => {
                let renew_after = reply
                    .certificate_renew_after
                    .and_then(|d| Duration::try_from(d).ok())
                    .ok_or("kplug sent a certificate without certificate_renew_after")?;
                (
                    reply.certificate_chain.clone(),
                    Instant::now() + renew_after,
                )
            }
            (Some(held), true) => (held.chain.clone(), held.renew_at),
            (None, true) => return Ok(false),
        };
        let bundle = match (&current, reply.trust_bundle.is_empty()) {
            (_, false) => reply.trust_bundle.clone(),
            (Some(held), true) => held.bundle.clone(),
            (None, true) => {
                return Err("kplug sent a certificate without its trust bundle".to_owned());
            }
        };
        let config = build(&Pem {
            cert: chain.clone().into_bytes(),
            key: self.key.clone().into_bytes(),
            client_ca: Some(bundle.clone().into_bytes()),
        })
        .map_err(|reason| format!("the certificate kplug sent does not load: {reason}"))?;
        let bundle_sha256 = digest(&SHA256, bundle.as_bytes()).as_ref().to_vec();
        self.held.send_replace(Some(Held {
            config: Arc::new(config),
            chain,
            bundle,
            bundle_sha256,
            renew_at,
        }));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use kplug_proto::v1alpha1::HeartbeatRequest;

    use super::*;

    #[test]
    fn a_request_is_due_until_a_certificate_comes_then_only_the_digest_goes() {
        let identity = IssuedIdentity::new("hello").expect("identity");
        assert_eq!(identity.name(), "hello.plugins.kplug.io");
        let mut request = HeartbeatRequest::default();
        identity.stamp(&mut request);
        assert!(!request.certificate_request.is_empty());
        assert!(request.trust_bundle_sha256.is_empty());
        // Nothing to take from an answer without either.
        assert_eq!(identity.take(&HeartbeatResponse::default()), Ok(false));
        assert!(identity.subscribe().borrow().is_none());
        let garbage = HeartbeatResponse {
            certificate_chain: "not PEM".to_owned(),
            trust_bundle: "not PEM".to_owned(),
            certificate_renew_after: Some(prost_types::Duration {
                seconds: 40,
                nanos: 0,
            }),
            ..HeartbeatResponse::default()
        };
        let error = identity.take(&garbage).expect_err("garbage");
        assert!(error.contains("does not load"), "{error}");
        assert!(
            identity.subscribe().borrow().is_none(),
            "nothing held after garbage"
        );
    }
}
