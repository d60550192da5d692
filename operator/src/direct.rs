//! The direct path: reconciles sent straight to kplug's Service with the
//! operator's own ServiceAccount token, instead of through kube-apiserver's
//! APIService.
//!
//! kplug reviews the token (TokenReview) and checks RBAC and the object
//! checks (SubjectAccessReviews) as it does for the users kube-apiserver's
//! front proxy asserts, so the same identity and rules apply. What changes:
//! one hop fewer, and kube-apiserver's audit log and API Priority and
//! Fairness no longer see these calls (kplug's log, audit line and metrics
//! do). Everything else, the watches, status writes and Events, still goes
//! to kube-apiserver.

use std::path::{Path, PathBuf};

/// Where a pod's ServiceAccount token is mounted, reread as the kubelet
/// rotates it.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// kplug's Service, and how the operator trusts it and is known to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectToKplug {
    /// kplug's API, e.g. `https://kplug.kplug-system.svc`.
    pub url: http::Uri,
    /// The CA that signed kplug's serving certificate (the `ca.crt` of the
    /// `kplug-trust` ConfigMap kplug keeps in labelled namespaces); reread
    /// when it changes.
    pub ca_file: PathBuf,
    /// The bearer token kplug reviews; reread when it changes.
    pub token_file: PathBuf,
}

/// Why the direct path cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("reading kplug's CA {}: {source}", .path.display())]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kplug's CA {} holds no PEM certificate", .0.display())]
    NoCertificate(PathBuf),
}

impl DirectToKplug {
    /// The client configuration for kplug, with the timeouts of `base` (the
    /// operator's configuration for kube-apiserver) and without kube's
    /// retries, as every delegation client.
    pub fn config(&self, base: &kube::Config) -> Result<kube::Config, DirectError> {
        let mut config = kube::Config::new(self.url.clone());
        // Read once here, so that a wrong path fails at start; kube rereads
        // the file itself from then on (root_cert_file).
        config.root_cert = Some(certificates(&self.ca_file)?);
        config.root_cert_file = Some(self.ca_file.clone());
        config.auth_info.token_file = Some(self.token_file.to_string_lossy().into_owned());
        config.connect_timeout = base.connect_timeout;
        config.read_timeout = base.read_timeout;
        config.write_timeout = base.write_timeout;
        config.default_retry = false;
        Ok(config)
    }
}

/// The DER certificates of the PEM file at `path`.
fn certificates(path: &Path) -> Result<Vec<Vec<u8>>, DirectError> {
    let read_error = |source| DirectError::ReadCa {
        path: path.to_owned(),
        source,
    };
    let pem = std::fs::read(path).map_err(read_error)?;
    let certificates = rustls_pemfile::certs(&mut pem.as_slice())
        .map(|certificate| certificate.map(|der| der.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_error)?;
    if certificates.is_empty() {
        return Err(DirectError::NoCertificate(path.to_owned()));
    }
    Ok(certificates)
}

/// `--kplug-url`: an `https://` URL (the token must not travel in clear).
pub(crate) fn parse_url(text: &str) -> Result<http::Uri, String> {
    let url: http::Uri = text
        .parse()
        .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
    match (url.scheme_str(), url.host()) {
        (Some("https"), Some(_)) => Ok(url),
        _ => Err(format!(
            "invalid URL {text:?}: expected https://HOST[:PORT], as the bearer token must not travel in clear"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_urls_with_a_host() {
        assert_eq!(
            parse_url("https://kplug.kplug-system.svc").map(|u| u.to_string()),
            Ok("https://kplug.kplug-system.svc/".to_owned())
        );
        assert!(parse_url("https://127.0.0.1:8443").is_ok());
        for bad in [
            "http://kplug.kplug-system.svc",
            "kplug.kplug-system.svc",
            "https://",
            "",
        ] {
            let error = parse_url(bad).expect_err(bad);
            assert!(error.starts_with("invalid URL"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_config_trusts_the_ca_file_and_reads_the_token_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("ca.crt");
        let certified =
            rcgen::generate_simple_self_signed(vec!["kplug".to_owned()]).expect("a certificate");
        std::fs::write(&ca, certified.cert.pem()).expect("write the CA");
        let direct = DirectToKplug {
            url: parse_url("https://kplug.kplug-system.svc").expect("URL"),
            ca_file: ca.clone(),
            token_file: dir.path().join("token"),
        };
        let mut base = kube::Config::new(http::Uri::from_static("https://kube-apiserver"));
        base.read_timeout = Some(std::time::Duration::from_secs(7));
        let config = direct.config(&base).expect("config");
        assert_eq!(config.cluster_url, direct.url);
        assert_eq!(config.root_cert, Some(vec![certified.cert.der().to_vec()]));
        assert_eq!(config.root_cert_file, Some(ca.clone()));
        assert_eq!(
            config.auth_info.token_file.as_deref(),
            Some(&*direct.token_file.to_string_lossy())
        );
        assert_eq!(config.read_timeout, base.read_timeout);
        assert!(!config.default_retry);

        std::fs::write(&ca, "not a certificate").expect("write");
        let error = direct.config(&base).expect_err("no certificate");
        assert!(
            error.to_string().contains("holds no PEM certificate"),
            "{error}"
        );
        let missing = DirectToKplug {
            ca_file: dir.path().join("absent.crt"),
            ..direct
        };
        let error = missing.config(&base).expect_err("no file");
        assert!(
            error.to_string().starts_with("reading kplug's CA"),
            "{error}"
        );
    }
}
