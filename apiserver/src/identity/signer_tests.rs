use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use x509_parser::extensions::GeneralName;

use super::*;
use crate::identity::CsrError;

/// A CA certificate and key, PEM.
fn ca(name: &str) -> (String, String) {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("CA");
    (cert.pem(), key.serialize_pem())
}

fn files(dir: &Path) -> SigningFiles {
    SigningFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        trust_bundle: dir.join("ca.crt"),
    }
}

fn write(files: &SigningFiles, (cert, key): &(String, String), bundle: &str) {
    std::fs::write(&files.key, key).expect("key");
    std::fs::write(&files.cert, cert).expect("cert");
    std::fs::write(&files.trust_bundle, bundle).expect("bundle");
}

fn parse(pem: &str) -> Vec<u8> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

const LIFETIME: Duration = Duration::from_secs(60);

#[test]
fn a_plugins_request_becomes_a_server_only_certificate_for_its_identity() {
    let dir = tempfile::tempdir().expect("dir");
    let files = files(dir.path());
    let authority = ca("plugin-ca");
    write(&files, &authority, &authority.0);
    let signer = Signer::load(files, LIFETIME).expect("load");
    let key = KeyPair::generate().expect("key");
    let request = CertificateParams::new(vec!["hello.plugins.kplug.io".to_owned()])
        .expect("params")
        .serialize_request(&key)
        .expect("request");
    let issued = signer.sign("hello", request.der()).expect("signed");
    assert_eq!(issued.renew_after, Duration::from_secs(40));
    let der = parse(&issued.certificate_chain);
    let (_, cert) = X509Certificate::from_der(&der).expect("X.509");
    let ca_der = parse(&authority.0);
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).expect("CA");
    cert.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the CA");
    assert_eq!(
        cert.public_key().raw,
        key.subject_public_key_info().as_slice(),
        "the plugin's own key"
    );
    let names: Vec<_> = cert
        .subject_alternative_name()
        .expect("SAN")
        .expect("SAN present")
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => (*d).to_owned(),
            other => panic!("{other}"),
        })
        .collect();
    assert_eq!(names, ["hello.plugins.kplug.io"]);
    let eku = cert
        .extended_key_usage()
        .expect("EKU")
        .expect("EKU present")
        .value;
    assert!(eku.server_auth && !eku.client_auth && !eku.any);
    assert!(!cert.is_ca());
    let validity = cert.validity();
    let life = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert_eq!(life, (LIFETIME + CLOCK_SKEW).as_secs() as i64);
    // Another plugin's name is refused, whoever asks.
    let error = signer
        .sign("other", request.der())
        .expect_err("another identity");
    assert!(
        matches!(error, SignError::Request(CsrError::WrongIdentity { .. })),
        "{error}"
    );
}

#[test]
fn kplugs_client_certificate_is_client_only() {
    let dir = tempfile::tempdir().expect("dir");
    let files = files(dir.path());
    let authority = ca("plugin-ca");
    write(&files, &authority, &authority.0);
    let signer = Signer::load(files, LIFETIME).expect("load");
    let client = signer.issue_client("kplug").expect("client");
    let der = parse(&client.cert);
    let (_, cert) = X509Certificate::from_der(&der).expect("X.509");
    let eku = cert
        .extended_key_usage()
        .expect("EKU")
        .expect("EKU present")
        .value;
    assert!(eku.client_auth && !eku.server_auth);
    KeyPair::from_pem(&client.key).expect("its key");
}

#[test]
fn a_key_of_another_ca_or_a_ca_outside_the_bundle_does_not_load() {
    let dir = tempfile::tempdir().expect("dir");
    let files = files(dir.path());
    let (old, new) = (ca("old"), ca("new"));
    write(&files, &(old.0.clone(), new.1.clone()), &old.0);
    assert!(matches!(
        Signer::load(files.clone(), LIFETIME),
        Err(SignerError::Mismatch { .. })
    ));
    write(&files, &new, &old.0);
    let error = Signer::load(files.clone(), LIFETIME)
        .map(|_| ())
        .expect_err("not trusted");
    assert!(matches!(error, SignerError::NotTrusted { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("add the new CA to the bundle first"),
        "{error}"
    );
    std::fs::write(&files.trust_bundle, "").expect("empty bundle");
    assert!(matches!(
        Signer::load(files.clone(), LIFETIME),
        Err(SignerError::Invalid { .. })
    ));
    // PEM whose content is no certificate: refused by name, not passed on
    // to plugins as trust.
    let garbage =
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
    std::fs::write(&files.trust_bundle, format!("{}{garbage}", new.0)).expect("bundle");
    let error = Signer::load(files, LIFETIME)
        .map(|_| ())
        .expect_err("garbage in the bundle");
    assert!(
        error
            .to_string()
            .contains("holds what is not an X.509 certificate"),
        "{error}"
    );
}

#[test]
fn a_rotation_step_reloads_and_a_bad_one_keeps_the_last_good_files() {
    let dir = tempfile::tempdir().expect("dir");
    let files = files(dir.path());
    let (old, new) = (ca("old"), ca("new"));
    write(&files, &old, &old.0);
    let signer = Signer::load(files.clone(), LIFETIME).expect("load");
    let first = signer.trust_bundle();
    let names = |signing: &str, trusted: &[&str]| CaNames {
        signing: signing.to_owned(),
        trusted: trusted.iter().map(|&n| n.to_owned()).collect(),
    };
    assert_eq!(signer.names(), names("old", &["old"]));
    assert!(!signer.reload().expect("unchanged"));
    // Step 1: both CAs trusted, the old one still signing.
    std::fs::write(&files.trust_bundle, format!("{}{}", old.0, new.0)).expect("bundle");
    assert!(signer.reload().expect("reloaded"));
    assert_eq!(signer.generation(), 2);
    let both = signer.trust_bundle();
    assert_ne!(both.sha256, first.sha256);
    assert!(both.pem.contains(old.0.trim()) && both.pem.contains(new.0.trim()));
    assert_eq!(
        signer.names().to_string(),
        "signs with old, trusts old and new"
    );
    // A signing CA written before its key: refused, the last good kept.
    std::fs::write(&files.cert, &new.0).expect("cert");
    assert!(matches!(signer.reload(), Err(SignerError::Mismatch { .. })));
    assert_eq!(signer.generation(), 2);
    std::fs::write(&files.key, &new.1).expect("key");
    assert!(signer.reload().expect("step 2 reloaded"));
    assert_eq!(signer.generation(), 3);
    assert_eq!(signer.names(), names("new", &["old", "new"]));
}
