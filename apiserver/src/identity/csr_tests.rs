use rcgen::{CertificateParams, CustomExtension, KeyPair, SignatureAlgorithm};

use super::*;

const NAME: &str = "hello.plugins.kplug.io";

fn request(key: &KeyPair, names: &[&str]) -> Vec<u8> {
    let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .expect("params");
    params
        .serialize_request(key)
        .expect("request")
        .der()
        .to_vec()
}

fn key(algorithm: &'static SignatureAlgorithm) -> KeyPair {
    KeyPair::generate_for(algorithm).expect("key")
}

#[test]
fn the_plugins_own_name_with_an_accepted_key_passes() {
    for algorithm in [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
    ] {
        let der = request(&key(algorithm), &[NAME]);
        let checked = check(&der, "hello", NAME).expect("accepted");
        assert_eq!(checked.public_key.algorithm(), algorithm);
    }
}

#[test]
fn another_name_more_names_or_none_are_refused_with_what_was_asked() {
    let key = key(&rcgen::PKCS_ECDSA_P256_SHA256);
    for (names, asked) in [
        (
            &["other.plugins.kplug.io"][..],
            "DNS name \"other.plugins.kplug.io\"",
        ),
        (
            &[NAME, "evil.example"][..],
            "DNS name \"hello.plugins.kplug.io\", DNS name \"evil.example\"",
        ),
        (&[][..], "no name"),
        (&["10.0.0.1"][..], "IP address 10.0.0.1"),
    ] {
        match check(&request(&key, names), "hello", NAME) {
            Err(CsrError::WrongIdentity {
                plugin,
                asked: got,
                allowed,
            }) => {
                assert_eq!((plugin.as_str(), allowed.as_str()), ("hello", NAME));
                assert_eq!(got, asked, "{names:?}");
            }
            other => panic!("{names:?}: {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn rsa_keys_are_refused_by_type_and_size() {
    let rsa = KeyPair::from_pem(include_str!("testdata/rsa-2048.key")).expect("RSA key");
    let error = check(&request(&rsa, &[NAME]), "hello", NAME)
        .map(|_| ())
        .expect_err("RSA");
    assert_eq!(
        error,
        CsrError::UnsupportedKey {
            found: "RSA 2048".to_owned()
        }
    );
    assert!(
        error.to_string().contains("ECDSA P-256 or P-384"),
        "{error}"
    );
}

#[test]
fn garbage_trailing_bytes_forged_signatures_and_size_are_refused() {
    let good = request(&key(&rcgen::PKCS_ECDSA_P256_SHA256), &[NAME]);
    let refused = |der: &[u8]| check(der, "hello", NAME).map(|_| ()).expect_err("refused");
    assert!(matches!(
        refused(b"not a request"),
        CsrError::Malformed { .. }
    ));
    assert!(matches!(refused(&[]), CsrError::Malformed { .. }));
    assert!(matches!(
        refused(&good[..good.len() / 2]),
        CsrError::Malformed { .. }
    ));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        refused(&trailing),
        CsrError::Malformed {
            detail: "1 bytes follow the request".to_owned()
        }
    );
    let mut forged = good.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    assert_eq!(refused(&forged), CsrError::BadSignature);
    let huge = vec![0x30; MAX_REQUEST_BYTES + 1];
    assert_eq!(
        refused(&huge),
        CsrError::TooLarge {
            size: MAX_REQUEST_BYTES + 1
        }
    );
}

#[test]
fn requested_extensions_kplug_does_not_read_are_refused() {
    let key = key(&rcgen::PKCS_ECDSA_P256_SHA256);
    let mut params = CertificateParams::new(vec![NAME.to_owned()]).expect("params");
    params
        .custom_extensions
        .push(CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 99999, 1],
            vec![0x05, 0x00],
        ));
    let der = params
        .serialize_request(&key)
        .expect("request")
        .der()
        .to_vec();
    match check(&der, "hello", NAME) {
        Err(CsrError::Malformed { detail }) => assert!(detail.contains("extension"), "{detail}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
