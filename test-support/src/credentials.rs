//! Credentials that tests forge with openssl, to check that kplug refuses
//! them: client certificates from any CA, and expired ServiceAccount tokens.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use crate::control_plane::ControlPlane;
use crate::process::output_text;

/// A client certificate (clientAuth) for `common_name`, signed by the CA in
/// the files `ca_cert` and `ca_key`; written under `dir` as NAME.crt and
/// NAME.key, whose paths it returns as (cert, key).
pub fn client_cert(dir: &Path, common_name: &str, ca_cert: &str, ca_key: &str) -> (String, String) {
    let key = dir.join(format!("{common_name}.key"));
    let csr = dir.join(format!("{common_name}.csr"));
    let cert = dir.join(format!("{common_name}.crt"));
    let ext = dir.join("client.ext");
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n")
        .expect("write the openssl extensions file");
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .output()
            .expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            output_text(&output)
        );
    };
    let (key_s, csr_s, cert_s, ext_s) = (
        key.to_string_lossy(),
        csr.to_string_lossy(),
        cert.to_string_lossy(),
        ext.to_string_lossy(),
    );
    run(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key_s,
        "-out",
        &csr_s,
        "-subj",
        &format!("/CN={common_name}"),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        ca_cert,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        &cert_s,
        "-days",
        "1",
        "-extfile",
        &ext_s,
    ]);
    (cert_s.into_owned(), key_s.into_owned())
}

/// A token of the ServiceAccount `namespace/service_account`, signed with
/// the cluster's ServiceAccount key exactly as kube-apiserver signs them,
/// but expired an hour ago: only the expiry makes it invalid.
pub fn expired_token(cluster: &ControlPlane, namespace: &str, service_account: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "typ": "JWT"}).to_string());
    let claims = URL_SAFE_NO_PAD.encode(
        json!({
            "iss": cluster.var("KPLUG_SA_ISSUER"),
            "aud": [cluster.var("KPLUG_API_AUDIENCES")],
            "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
            "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": service_account, "uid": "00000000-0000-0000-0000-000000000000"}},
        })
        .to_string(),
    );
    let signing_input = format!("{header}.{claims}");
    let mut sign = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-sign",
            &cluster.var("KPLUG_SA_SIGNING_KEY"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run openssl dgst");
    sign.stdin
        .take()
        .expect("openssl's stdin is piped")
        .write_all(signing_input.as_bytes())
        .expect("write the JWT to openssl");
    let signature = sign.wait_with_output().expect("openssl's signature").stdout;
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
}
