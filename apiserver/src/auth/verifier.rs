//! Client certificate verification whose trusted CAs can change at run
//! time, as the delegated-authentication ConfigMap does.

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// Parses a PEM bundle into a root store; `None` when it holds no certificate.
pub fn roots(pem: &str) -> Result<Option<RootCertStore>, rustls::Error> {
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
        let cert = cert.map_err(|e| rustls::Error::General(format!("reading PEM: {e}")))?;
        roots.add(cert)?;
    }
    Ok((!roots.is_empty()).then_some(roots))
}

/// A verifier that accepts certificates chaining to `roots`, and clients
/// without a certificate (bearer tokens, probes). Without roots, clients
/// are not asked for a certificate at all.
pub fn optional_client_auth(roots: Option<RootCertStore>) -> Arc<dyn ClientCertVerifier> {
    let Some(roots) = roots else {
        return WebPkiClientVerifier::no_client_auth();
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
    {
        Ok(verifier) => verifier,
        Err(e) => {
            tracing::error!(error = %e, "cannot build a client certificate verifier; not asking for certificates");
            WebPkiClientVerifier::no_client_auth()
        }
    }
}

/// True when `chain` (end entity first) chains to what `verifier` trusts.
pub fn verifies(verifier: &dyn ClientCertVerifier, chain: &[CertificateDer<'_>]) -> bool {
    let Some((end_entity, intermediates)) = chain.split_first() else {
        return false;
    };
    verifier.offer_client_auth()
        && verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .is_ok()
}

/// Delegates to whichever verifier is current.
#[derive(Debug)]
pub struct DynamicVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
}

impl DynamicVerifier {
    pub fn new(initial: Arc<dyn ClientCertVerifier>) -> Self {
        Self {
            current: RwLock::new(initial),
        }
    }

    /// Applies to handshakes from now on.
    pub fn set(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self.current.write() = verifier;
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().clone()
    }
}

impl ClientCertVerifier for DynamicVerifier {
    fn offer_client_auth(&self) -> bool {
        self.current().offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    // No hints: clients then send whatever certificate they have, and the
    // list could not outlive a change of CAs anyway.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
