//! `kplug-apiserver plugin-certs`: the certificates of mutual TLS between
//! kplug and its plugins, from one plugin CA kept apart from kplug's own
//! serving CA.
//!
//! Extended key usages keep the roles apart: kplug's client certificate is
//! `clientAuth` only, and a plugin's serving certificate `serverAuth` only,
//! so a plugin cannot present its own certificate to call another plugin
//! (TLS stacks, rustls and Go's included, refuse a client certificate
//! without `clientAuth`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::pki::{CertificateAuthority, Pem, write};
use crate::config::{PluginCert, PluginCertsConfig};

/// The common name of a plugin CA this command makes, before "@" and the
/// time it was made: CAs of successive rotations differ by name, so that a
/// certificate of the other one is reported as of an unknown issuer.
const CA_NAME: &str = "kplug-plugin-ca";

/// Makes the certificate `config` asks for (and the CA when the directory
/// holds none), and prints the paths written on stdout.
pub fn run(config: &PluginCertsConfig) -> anyhow::Result<()> {
    let dir = &config.out_dir;
    if let PluginCert::Serving { dns_names, .. } = &config.make {
        for name in dns_names {
            check_dns_name(name)?;
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (ca, mut written) = authority(dir)?;
    let issued = match &config.make {
        PluginCert::Ca => None,
        PluginCert::Client { common_name } => Some((
            dir.join("kplug-client.crt"),
            dir.join("kplug-client.key"),
            ca.issue_client(common_name, &[])?,
        )),
        PluginCert::Serving {
            dns_names,
            ips,
            days,
        } => {
            let Some(first) = dns_names.first() else {
                anyhow::bail!("a serving certificate needs at least one DNS name");
            };
            let plugin_dir = dir.join("plugins").join(first);
            std::fs::create_dir_all(&plugin_dir)
                .with_context(|| format!("creating {}", plugin_dir.display()))?;
            let pem = ca.issue_serving(dns_names, ips, time::Duration::days(i64::from(*days)))?;
            Some((plugin_dir.join("tls.crt"), plugin_dir.join("tls.key"), pem))
        }
    };
    if let Some((cert_path, key_path, pem)) = issued {
        save(&pem, &cert_path, &key_path)?;
        written.extend([cert_path, key_path]);
    }
    let mut stdout = std::io::stdout().lock();
    for path in written {
        writeln!(stdout, "{}", path.display())?;
    }
    Ok(())
}

/// The plugin CA of `dir`, made there when missing, and the files made.
fn authority(dir: &Path) -> anyhow::Result<(CertificateAuthority, Vec<PathBuf>)> {
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if let Some(ca) = CertificateAuthority::load(&cert, &key)? {
        return Ok((ca, Vec::new()));
    }
    // Half a CA (say ca.key kept offline): a new CA would silently replace
    // the ca.crt that kplug and every plugin trust.
    if cert.exists() || key.exists() {
        anyhow::bail!(
            "{} holds only one of ca.crt and ca.key: put the other back, or use a new \
             --out-dir for a new plugin CA (see docs/src/guides/certificates.md)",
            dir.display()
        );
    }
    let made = time::OffsetDateTime::now_utc().unix_timestamp();
    let ca = CertificateAuthority::generate(&format!("{CA_NAME}@{made}"))?;
    ca.save(&cert, &key)?;
    Ok((ca, vec![cert, key]))
}

fn save(pem: &Pem, cert: &Path, key: &Path) -> anyhow::Result<()> {
    // The key first: a reader that polls both files (kplug, the SDKs) sees
    // a new pair complete once the certificate changes.
    write(key, &pem.key, true)?;
    write(cert, &pem.cert, false)?;
    Ok(())
}

/// A DNS name of letters, digits and hyphens in dot-separated labels; it
/// also names a directory, so nothing else may pass.
fn check_dns_name(name: &str) -> anyhow::Result<()> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        Ok(())
    } else {
        anyhow::bail!(
            "{name:?} is not a DNS name (lower-case letters, digits and '-' in dot-separated labels)"
        )
    }
}

#[cfg(all(test, unix))]
mod tests {
    use x509_parser::prelude::{FromDer, X509Certificate};

    use super::*;
    use crate::server::pki::tests::mode;

    fn make(dir: &Path, make: PluginCert) -> anyhow::Result<()> {
        run(&PluginCertsConfig {
            out_dir: dir.to_owned(),
            make,
        })
    }

    /// (serverAuth, clientAuth) of the certificate in `path`.
    fn usages(path: &Path) -> (bool, bool) {
        let pem = std::fs::read(path).expect("read the certificate");
        let der = rustls_pemfile::certs(&mut &pem[..])
            .next()
            .expect("a certificate")
            .expect("PEM");
        let (_, cert) = X509Certificate::from_der(&der).expect("DER");
        let eku = cert
            .extended_key_usage()
            .expect("parse")
            .expect("an extended key usage");
        (eku.value.server_auth, eku.value.client_auth)
    }

    #[test]
    fn one_ca_a_client_only_kplug_and_server_only_plugins() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dir = dir.path();
        make(
            dir,
            PluginCert::Client {
                common_name: "kplug".to_owned(),
            },
        )
        .expect("client");
        let ca = std::fs::read(dir.join("ca.crt")).expect("a CA made");
        make(
            dir,
            PluginCert::Serving {
                dns_names: vec!["hello.plugins.svc".to_owned()],
                ips: Vec::new(),
                days: 30,
            },
        )
        .expect("serving");
        assert_eq!(
            std::fs::read(dir.join("ca.crt")).expect("CA"),
            ca,
            "the second certificate reuses the CA"
        );
        let serving = dir.join("plugins/hello.plugins.svc");
        assert_eq!(usages(&dir.join("kplug-client.crt")), (false, true));
        assert_eq!(usages(&serving.join("tls.crt")), (true, false));
        for key in [
            dir.join("ca.key"),
            dir.join("kplug-client.key"),
            serving.join("tls.key"),
        ] {
            assert_eq!(mode(&key), 0o600, "{}", key.display());
        }
    }

    #[test]
    fn ca_makes_only_the_plugin_ca_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        make(dir.path(), PluginCert::Ca).expect("a CA");
        let ca = std::fs::read(dir.path().join("ca.crt")).expect("ca.crt");
        assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
        make(dir.path(), PluginCert::Ca).expect("again");
        assert_eq!(
            std::fs::read(dir.path().join("ca.crt")).expect("ca.crt"),
            ca,
            "kept"
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["ca.crt", "ca.key"]);
    }

    #[test]
    fn names_that_are_not_dns_names_and_half_a_ca_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let serving = |name: &str| PluginCert::Serving {
            dns_names: vec![name.to_owned()],
            ips: Vec::new(),
            days: 1,
        };
        for name in ["../up", "a/b", "UPPER", "-a", "a..b", ""] {
            assert!(make(dir.path(), serving(name)).is_err(), "{name:?}");
        }
        assert!(
            std::fs::read_dir(dir.path())
                .expect("list")
                .next()
                .is_none(),
            "nothing written for a bad name"
        );
        make(dir.path(), serving("ok.plugins.svc")).expect("a CA and a certificate");
        std::fs::remove_file(dir.path().join("ca.key")).expect("remove the key");
        let error = make(dir.path(), serving("ok.plugins.svc")).expect_err("half a CA");
        assert!(error.to_string().contains("only one of"), "{error}");
    }
}
