//! `kplug-apiserver certs`: the CA and serving certificate an APIService
//! needs, with the SANs kube-apiserver's aggregator checks.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::pki::{CertificateAuthority, write};
use crate::config::CertsConfig;

/// The names a serving certificate for `service.namespace` must carry.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        // For running kplug outside the cluster, e.g. behind an ExternalName Service.
        "localhost".to_owned(),
    ]
}

/// Writes the files and prints the caBundle (base64 of ca.crt) on stdout.
pub fn run(config: &CertsConfig) -> anyhow::Result<()> {
    let dir = &config.out_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = match (&config.ca_cert, &config.ca_key) {
        (Some(cert), Some(key)) => CertificateAuthority::load(cert, key)?
            .with_context(|| format!("reading the CA {} and {}", cert.display(), key.display()))?,
        _ => {
            let ca = CertificateAuthority::generate("kplug-ca")?;
            ca.save(&dir.join("ca.crt"), &dir.join("ca.key"))?;
            ca
        }
    };
    if config.ca_cert.is_some() {
        write(&dir.join("ca.crt"), ca.cert_pem(), false)?;
    }
    let ips = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    let serving = ca.issue_serving(
        &service_names(&config.service, &config.namespace),
        &ips,
        time::Duration::days(i64::from(config.days)),
    )?;
    write(&dir.join("tls.crt"), &serving.cert, false)?;
    write(&dir.join("tls.key"), &serving.key, true)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", STANDARD.encode(ca.cert_pem()))?;
    Ok(())
}
