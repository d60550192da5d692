//! The plugin CA in kplug's hands: it signs plugins' serving certificates
//! on their heartbeats and kplug's own client certificate, and keeps the
//! trust bundle both sides verify with. Its files are reloaded when they
//! change, as every certificate of kplug's is, so a rotation needs no
//! restart (docs/src/guides/certificates.md, "Rotating the plugin CA").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use ring::digest::{SHA256, digest};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::csr::{CheckedRequest, CsrError, check};
use super::identity;

/// How far back a certificate's validity starts: a plugin whose clock is
/// a little behind kplug's must not see a fresh certificate as not yet
/// valid.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The signing CA and the trust bundle, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningFiles {
    /// The CA certificate kplug signs with.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Every CA certificate kplug and plugins trust for each other: the
    /// signing CA, and during a rotation the other one too.
    pub trust_bundle: PathBuf,
}

/// Why the signing files do not load.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("the signing CA {cert} and the key {key} do not go together")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error(
        "the signing CA {cert} is not in the trust bundle {bundle}: kplug would issue \
         certificates that neither it nor plugins accept (during a rotation, add the new CA to \
         the bundle first; see docs/src/guides/certificates.md)"
    )]
    NotTrusted { cert: PathBuf, bundle: PathBuf },
    #[error("signing: {0}")]
    Sign(#[from] rcgen::Error),
}

/// Why a plugin's request was not signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The request itself: the plugin must send another.
    #[error(transparent)]
    Request(#[from] CsrError),
    /// kplug could not sign a good request.
    #[error("kplug could not sign the certificate: {0}")]
    Internal(#[from] rcgen::Error),
}

/// A certificate kplug signed for a plugin instance.
#[derive(Debug, Clone)]
pub struct Issued {
    /// PEM, the leaf only: the signing CA is in the trust bundle.
    pub certificate_chain: String,
    /// When the instance should ask for the next one: two thirds of the
    /// lifetime, as kubelet and cert-manager renew.
    pub renew_after: Duration,
}

/// The trust bundle, as sent to plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    pub pem: Arc<str>,
    pub sha256: [u8; 32],
}

/// Which CAs the loaded files hold, by name, for the log lines that let a
/// person follow a rotation (docs/src/guides/certificates.md): the CA kplug signs with and
/// every CA of the trust bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaNames {
    pub signing: String,
    pub trusted: Vec<String>,
}

impl std::fmt::Display for CaNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "signs with {}, trusts {}",
            self.signing,
            self.trusted.join(" and ")
        )
    }
}

/// A client certificate kplug issued itself, PEM.
pub struct ClientCertificate {
    pub cert: String,
    pub key: String,
}

/// One loaded generation of the files.
struct Loaded {
    generation: u64,
    contents: [Vec<u8>; 3],
    issuer: Issuer<'static, KeyPair>,
    trust_bundle: TrustBundle,
    names: CaNames,
}

/// kplug as the plugin CA.
pub struct Signer {
    files: SigningFiles,
    lifetime: Duration,
    current: RwLock<Arc<Loaded>>,
}

impl Signer {
    /// Reads and checks the files; certificates it issues live `lifetime`.
    pub fn load(files: SigningFiles, lifetime: Duration) -> Result<Self, SignerError> {
        let loaded = load(&files, read_all(&files)?, 1)?;
        Ok(Self {
            files,
            lifetime,
            current: RwLock::new(Arc::new(loaded)),
        })
    }

    /// Re-reads the files; returns whether anything changed. Files that do
    /// not load keep the current CA and bundle.
    pub fn reload(&self) -> Result<bool, SignerError> {
        let contents = read_all(&self.files)?;
        if self.current.read().contents == contents {
            return Ok(false);
        }
        let generation = self.current.read().generation + 1;
        let loaded = load(&self.files, contents, generation)?;
        *self.current.write() = Arc::new(loaded);
        Ok(true)
    }

    /// Grows with every reload that changed something.
    pub fn generation(&self) -> u64 {
        self.current.read().generation
    }

    pub fn files(&self) -> &SigningFiles {
        &self.files
    }

    /// The lifetime of the certificates issued.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    pub fn trust_bundle(&self) -> TrustBundle {
        self.current.read().trust_bundle.clone()
    }

    /// The names of the signing CA and of the bundle's CAs.
    pub fn names(&self) -> CaNames {
        self.current.read().names.clone()
    }

    /// Signs the request `der` of an instance of plugin `plugin`, whose
    /// heartbeat was authorized for that name.
    pub fn sign(&self, plugin: &str, der: &[u8]) -> Result<Issued, SignError> {
        let name = identity(plugin);
        let CheckedRequest { public_key } = check(der, plugin, &name)?;
        let mut params = self.params()?;
        // Names the plugin for people reading the certificate; X.509 caps a
        // common name at 64 characters, a plugin's name may be longer. The
        // identity is the DNS name.
        if plugin.len() <= 64 {
            params.distinguished_name.push(DnType::CommonName, plugin);
        }
        params.subject_alt_names = vec![rcgen::SanType::DnsName(name.try_into()?)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let request = CertificateSigningRequestParams { params, public_key };
        let loaded = self.current.read().clone();
        let cert = request.signed_by(&loaded.issuer)?;
        Ok(Issued {
            certificate_chain: cert.pem(),
            renew_after: self.lifetime * 2 / 3,
        })
    }

    /// A client certificate for kplug itself, named `common_name`, with a
    /// key made here.
    pub fn issue_client(&self, common_name: &str) -> Result<ClientCertificate, SignerError> {
        let mut params = self.params()?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let loaded = self.current.read().clone();
        let cert = params.signed_by(&key, &loaded.issuer)?;
        Ok(ClientCertificate {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// What every certificate issued shares: validity, a random serial
    /// number, the key usage of a TLS key.
    fn params(&self) -> Result<CertificateParams, rcgen::Error> {
        let mut params = CertificateParams::default();
        let now = OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + self.lifetime;
        let mut serial = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut serial)
            .map_err(|_| rcgen::Error::RingUnspecified)?;
        // Positive, as RFC 5280 asks.
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }
}

fn read_all(files: &SigningFiles) -> Result<[Vec<u8>; 3], SignerError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| SignerError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok([
        read(&files.cert)?,
        read(&files.key)?,
        read(&files.trust_bundle)?,
    ])
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, SignerError> {
    let invalid = |detail: String| SignerError::Invalid {
        path: path.to_owned(),
        detail,
    };
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid("holds no PEM certificate".to_owned()));
    }
    Ok(certs)
}

/// Checks what would otherwise show only as plugins' failed handshakes: a
/// key that is not the CA's, a CA that is not in the bundle.
fn load(
    files: &SigningFiles,
    contents: [Vec<u8>; 3],
    generation: u64,
) -> Result<Loaded, SignerError> {
    let [cert_pem, key_pem, bundle_pem] = &contents;
    let invalid = |path: &Path, detail: String| SignerError::Invalid {
        path: path.to_owned(),
        detail,
    };
    let ca = certificates(&files.cert, cert_pem)?;
    let text = |path: &Path, bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| invalid(path, "is not PEM text".to_owned()))
    };
    let key = KeyPair::from_pem(&text(&files.key, key_pem)?).map_err(|e| {
        invalid(
            &files.key,
            format!("not a private key kplug can sign with: {e}"),
        )
    })?;
    let (_, parsed) = X509Certificate::from_der(&ca[0])
        .map_err(|e| invalid(&files.cert, format!("not an X.509 certificate: {e}")))?;
    if !parsed.is_ca() {
        return Err(invalid(
            &files.cert,
            "is not a CA certificate (basicConstraints CA:TRUE)".to_owned(),
        ));
    }
    if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(SignerError::Mismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
        });
    }
    let bundle = certificates(&files.trust_bundle, bundle_pem)?;
    let trusted = bundle
        .iter()
        .map(|der| {
            X509Certificate::from_der(der)
                .map(|(_, cert)| ca_name(&cert))
                .map_err(|e| {
                    invalid(
                        &files.trust_bundle,
                        format!("holds what is not an X.509 certificate: {e}"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !bundle.contains(&ca[0]) {
        return Err(SignerError::NotTrusted {
            cert: files.cert.clone(),
            bundle: files.trust_bundle.clone(),
        });
    }
    let issuer = Issuer::from_ca_cert_der(&ca[0], key)?;
    let bundle_text = text(&files.trust_bundle, bundle_pem)?;
    let sha256 = digest(&SHA256, bundle_text.as_bytes())
        .as_ref()
        .try_into()
        .map_err(|_| invalid(&files.trust_bundle, "SHA-256 is not 32 bytes".to_owned()))?;
    Ok(Loaded {
        generation,
        issuer,
        trust_bundle: TrustBundle {
            pem: bundle_text.into(),
            sha256,
        },
        names: CaNames {
            signing: ca_name(&parsed),
            trusted,
        },
        contents,
    })
}

/// A CA by its common name (`plugin-certs ca` names it
/// `kplug-plugin-ca@<unix time>`), or its whole subject without one.
fn ca_name(cert: &X509Certificate) -> String {
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map_or_else(|| cert.subject().to_string(), str::to_owned)
}

#[cfg(test)]
#[path = "signer_tests.rs"]
mod tests;
