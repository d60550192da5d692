//! A small certificate authority for standalone mode: the CA, the serving
//! certificate and the admin client certificate that kubectl presents.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// Why certificates could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

const CA_VALIDITY: Duration = Duration::days(3650);
/// Validity of the certificates standalone mode issues.
pub const LEAF_VALIDITY: Duration = Duration::days(365);

/// A PEM certificate and its PEM private key.
#[derive(Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A certificate authority that issues kplug's certificates.
pub struct CertificateAuthority {
    pem: Pem,
    issuer: Issuer<'static, KeyPair>,
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    // Some clock skew between machines must not make a fresh cert invalid.
    params.not_before = now - Duration::hours(1);
    params.not_after = now + lifetime;
}

fn read(path: &Path) -> Result<Option<String>, PkiError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `contents` to `path`, readable by the owner only when `secret`.
pub fn write(path: &Path, contents: &str, secret: bool) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_owned(),
        source,
    };
    std::fs::write(path, contents).map_err(io)?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    Ok(())
}

impl CertificateAuthority {
    /// Creates a new self-signed CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, CA_VALIDITY);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// Loads a CA from its PEM certificate and key files; `None` when
    /// either is missing.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Option<Self>, PkiError> {
        let (Some(cert), Some(key)) = (read(cert_path)?, read(key_path)?) else {
            return Ok(None);
        };
        let key_pair = KeyPair::from_pem(&key)?;
        let issuer = Issuer::from_ca_cert_pem(&cert, key_pair)?;
        Ok(Some(Self {
            pem: Pem { cert, key },
            issuer,
        }))
    }

    /// Loads `ca.crt` and `ca.key` from `dir`, or creates and saves them.
    pub fn load_or_generate(dir: &Path, common_name: &str) -> Result<Self, PkiError> {
        let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
        if let Some(ca) = Self::load(&cert_path, &key_path)? {
            return Ok(ca);
        }
        let ca = Self::generate(common_name)?;
        ca.save(&cert_path, &key_path)?;
        Ok(ca)
    }

    /// Writes the CA's certificate and (owner-only) key.
    pub fn save(&self, cert_path: &Path, key_path: &Path) -> Result<(), PkiError> {
        write(cert_path, &self.pem.cert, false)?;
        write(key_path, &self.pem.key, true)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pem.cert
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn issue_serving(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        lifetime: Duration,
    ) -> Result<Pem, PkiError> {
        let mut params = CertificateParams::new(dns_names.to_vec())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().map_or("kplug", String::as_str),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, lifetime)
    }

    /// A client certificate for user `user` in `groups` (CN and O, as
    /// Kubernetes reads them).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<Pem, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, LEAF_VALIDITY)
    }

    fn issue(&self, mut params: CertificateParams, lifetime: Duration) -> Result<Pem, PkiError> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        validity(&mut params, lifetime);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}
