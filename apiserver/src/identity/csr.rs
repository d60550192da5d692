//! Checking a plugin's certificate signing request before kplug signs it.
//! Pure: bytes in, a verdict out.

use rcgen::{CertificateSigningRequestParams, PublicKey, SignatureAlgorithm};
use rustls::pki_types::CertificateSigningRequestDer;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey as ParsedKey;

/// The largest request kplug reads: an ECDSA P-384 request naming one DNS
/// name is under 500 bytes, and anything near this bound is not one kplug
/// would sign.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// Why a certificate signing request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("the certificate request is {size} bytes; kplug reads at most {MAX_REQUEST_BYTES}")]
    TooLarge { size: usize },
    #[error("the certificate request is not a DER PKCS#10 request: {detail}")]
    Malformed { detail: String },
    #[error("the certificate request's signature does not verify with its own public key")]
    BadSignature,
    #[error(
        "the certificate request's key is {found}; kplug signs ECDSA P-256 or P-384 keys \
         (signed with SHA-256 or SHA-384 respectively) and Ed25519 keys"
    )]
    UnsupportedKey { found: String },
    #[error(
        "the certificate request asks for {asked}; an instance of plugin {plugin:?} may ask \
         only for the DNS name {allowed:?}"
    )]
    WrongIdentity {
        plugin: String,
        asked: String,
        allowed: String,
    },
}

/// A request that passed every check: the public key to certify. Nothing
/// else of the request (subject, extensions) reaches the certificate.
pub struct CheckedRequest {
    pub(super) public_key: PublicKey,
}

/// The key types kplug signs, each with the one signature algorithm that
/// goes with it, and the key size in bits ([`ParsedKey::key_size`]).
fn accepted(algorithm: &SignatureAlgorithm) -> Option<usize> {
    if algorithm == &rcgen::PKCS_ECDSA_P256_SHA256 {
        Some(256)
    } else if algorithm == &rcgen::PKCS_ECDSA_P384_SHA384 {
        Some(384)
    } else if algorithm == &rcgen::PKCS_ED25519 {
        Some(0)
    } else {
        None
    }
}

/// Checks `der`, a request from an instance of plugin `plugin` for the
/// identity `allowed` (its DNS name).
pub fn check(der: &[u8], plugin: &str, allowed: &str) -> Result<CheckedRequest, CsrError> {
    if der.len() > MAX_REQUEST_BYTES {
        return Err(CsrError::TooLarge { size: der.len() });
    }
    let malformed = |detail: String| CsrError::Malformed { detail };
    let (rest, request) =
        X509CertificationRequest::from_der(der).map_err(|e| malformed(format!("{e}")))?;
    if !rest.is_empty() {
        return Err(malformed(format!(
            "{} bytes follow the request",
            rest.len()
        )));
    }
    request
        .verify_signature()
        .map_err(|_| CsrError::BadSignature)?;
    let key_info = &request.certification_request_info.subject_pki;
    let key = key_info
        .parsed()
        .map_err(|e| malformed(format!("public key: {e}")))?;
    // rcgen names the key's algorithm after the request's signature
    // algorithm; the key itself must agree with it.
    let params =
        CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(der))
            .map_err(|e| match e {
                rcgen::Error::InvalidCertificationRequestSignature => CsrError::BadSignature,
                rcgen::Error::UnsupportedSignatureAlgorithm => CsrError::UnsupportedKey {
                    found: describe(&key, &key_info.algorithm.algorithm.to_id_string()),
                },
                rcgen::Error::UnsupportedExtension => malformed(
                    "it requests an extension kplug does not read (only subjectAltName, keyUsage, \
                 extendedKeyUsage and basicConstraints may be requested; kplug sets them itself)"
                        .to_owned(),
                ),
                other => malformed(other.to_string()),
            })?;
    let algorithm = params.public_key.algorithm();
    let ed25519 = key_info.algorithm.algorithm == x509_parser::oid_registry::OID_SIG_ED25519;
    match accepted(algorithm) {
        Some(0) if ed25519 => {}
        Some(bits) if !ed25519 && matches!(key, ParsedKey::EC(_)) && key.key_size() == bits => {}
        _ => {
            return Err(CsrError::UnsupportedKey {
                found: describe(&key, &key_info.algorithm.algorithm.to_id_string()),
            });
        }
    }
    let mut asked = Vec::new();
    for extension in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(names) = extension {
            asked.extend(names.general_names.iter().map(describe_name));
        }
    }
    let wanted = format!("DNS name {allowed:?}");
    if asked != [wanted] {
        return Err(CsrError::WrongIdentity {
            plugin: plugin.to_owned(),
            asked: if asked.is_empty() {
                "no name".to_owned()
            } else {
                asked.join(", ")
            },
            allowed: allowed.to_owned(),
        });
    }
    Ok(CheckedRequest {
        public_key: params.public_key,
    })
}

/// A requested name as a person would read it, e.g. `IP address 10.0.0.1`.
fn describe_name(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(dns) => format!("DNS name {dns:?}"),
        GeneralName::URI(uri) => format!("URI {uri:?}"),
        GeneralName::RFC822Name(email) => format!("email address {email:?}"),
        GeneralName::IPAddress(bytes) => match <[u8; 4]>::try_from(*bytes) {
            Ok(v4) => format!("IP address {}", std::net::Ipv4Addr::from(v4)),
            Err(_) => match <[u8; 16]>::try_from(*bytes) {
                Ok(v6) => format!("IP address {}", std::net::Ipv6Addr::from(v6)),
                Err(_) => format!("an IP address of {} bytes", bytes.len()),
            },
        },
        other => format!("{other}"),
    }
}

/// The key as a person would name it, e.g. "RSA 2048" or "EC 521".
fn describe(key: &ParsedKey<'_>, oid: &str) -> String {
    match key {
        ParsedKey::RSA(_) => format!("RSA {}", key.key_size()),
        ParsedKey::EC(_) => format!("EC {} bits", key.key_size()),
        ParsedKey::DSA(_) => "DSA".to_owned(),
        _ => format!("of algorithm {oid}"),
    }
}

#[cfg(test)]
#[path = "csr_tests.rs"]
mod tests;
