//! A small certificate authority for standalone mode: the CA, the serving
//! certificate and the admin client certificate that kubectl presents.

use std::io::Write;
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
///
/// The bytes go to a new file in the same directory, created with its
/// final mode, then renamed over `path`: a secret is never readable by
/// others, not even for the moment between a write and a chmod, nor written
/// into an existing file whose mode is looser; and a reader (the serving
/// certificate's reload) sees the old file or the new one, never half of one.
pub fn write(path: &Path, contents: &str, secret: bool) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = create_beside(path, secret).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.as_file().sync_all().map_err(io)?;
    file.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// An empty temporary file next to `path`, owner-only when `secret`,
/// removed unless persisted.
fn create_beside(path: &Path, secret: bool) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().map_or_else(
        || ".kplug".into(),
        |name| format!(".{}", name.to_string_lossy()),
    );
    let mut builder = tempfile::Builder::new();
    builder.prefix(&name).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(if secret {
            0o600
        } else {
            0o644
        }));
    }
    builder.tempfile_in(dir)
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

#[cfg(all(test, unix))]
pub(super) mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    /// The permission bits of `path`.
    pub(in crate::server) fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn a_secret_file_is_owner_only_before_its_first_byte() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = create_beside(&dir.path().join("ca.key"), true).expect("create");
        let metadata = file.as_file().metadata().expect("metadata");
        assert_eq!(metadata.len(), 0);
        assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
        let public = create_beside(&dir.path().join("ca.crt"), false).expect("create");
        let mode = public
            .as_file()
            .metadata()
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077 & !0o044, 0, "{mode:o}");
    }

    #[test]
    fn secrets_are_written_owner_only_and_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("tls.key");
        write(&key, "secret", true).expect("write");
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read_to_string(&key).expect("read"), "secret");
        // Nothing left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("tls.key")]);
    }

    #[test]
    fn a_world_readable_file_in_the_way_never_receives_the_secret() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "old").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        // Another name for the old inode, as a reader holding it open would see it.
        let old = dir.path().join("old-inode");
        std::fs::hard_link(&key, &old).expect("link");
        write(&key, "secret", true).expect("write");
        assert_eq!(std::fs::read_to_string(&old).expect("read"), "old");
        assert_eq!(mode(&old), 0o644);
        assert_eq!(mode(&key), 0o600);
        assert_ne!(
            std::fs::metadata(&key).expect("metadata").ino(),
            std::fs::metadata(&old).expect("metadata").ino()
        );
    }
}
