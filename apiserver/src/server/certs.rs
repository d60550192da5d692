//! `kplug-apiserver certs`: the CA and serving certificate an APIService
//! needs, with the SANs kube-apiserver's aggregator checks.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::pki::{CertificateAuthority, write};
use crate::config::CertsConfig;

/// The names a serving certificate for `service.namespace` must carry:
/// the Service the aggregator and clients reach, and its headless twin
/// `SERVICE-registry` that plugins resolve to heartbeat to every replica
/// (deploy/service.yaml).
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    let registry = format!("{service}-registry");
    let mut names = Vec::new();
    for name in [service, registry.as_str()] {
        names.extend([
            name.to_owned(),
            format!("{name}.{namespace}"),
            format!("{name}.{namespace}.svc"),
            format!("{name}.{namespace}.svc.cluster.local"),
        ]);
    }
    // For running kplug outside the cluster, e.g. behind an ExternalName Service.
    names.push("localhost".to_owned());
    names
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

#[cfg(test)]
mod tests {
    use super::service_names;

    #[test]
    fn the_certificate_covers_the_service_and_its_headless_registry_twin() {
        let names = service_names("kplug", "kplug-system");
        for name in [
            "kplug",
            "kplug.kplug-system.svc",
            "kplug-registry.kplug-system.svc",
            "kplug-registry.kplug-system.svc.cluster.local",
            "localhost",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
        }
    }
}
