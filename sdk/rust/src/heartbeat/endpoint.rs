//! How the registry is dialed: its address checked, plain HTTP/2 or TLS.

use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::Error;

/// Bounds dialing the registry, so an unanswered dial cannot stall the
/// channel for the operating system's much longer TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Validates `registry` and configures how it is dialed: plain HTTP/2, or
/// TLS trusting the PEM certificates in `ca` for `https://`.
pub(crate) fn endpoint(registry: &str, ca: Option<&[u8]>) -> Result<Endpoint, Error> {
    let invalid = |reason: String| Error::InvalidRegistryAddress {
        address: registry.to_owned(),
        reason,
    };
    let tls_error = |reason: String| Error::RegistryTls {
        address: registry.to_owned(),
        reason,
    };
    let trimmed = registry.trim();
    let uri = if trimmed.contains("://") || trimmed.starts_with("unix:") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let mut endpoint = Endpoint::from_shared(uri).map_err(|e| invalid(error_chain(&e)))?;
    let scheme = endpoint.uri().scheme_str().unwrap_or_default().to_owned();
    if !matches!(scheme.as_str(), "http" | "https") {
        return Err(invalid(format!(
            "unsupported scheme {scheme:?}; use http:// or https://"
        )));
    }
    let host = match endpoint.uri().host() {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => return Err(invalid("missing host".into())),
    };
    if scheme == "https" {
        let Some(pem) = ca else {
            return Err(tls_error(
                "no CA to verify kplug's certificate with: set --registry-ca-file \
                 (KPLUG_REGISTRY_CA_FILE) to the PEM of the CA that signed it, e.g. from \
                 the kplug-ca ConfigMap"
                    .into(),
            ));
        };
        let certificates = rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_error(format!("the registry CA is not valid PEM: {e}")))?;
        if certificates.is_empty() {
            return Err(tls_error(
                "the registry CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        // The certificate must name the host dialed; IPv6 without brackets.
        let domain = host.trim_start_matches('[').trim_end_matches(']');
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem))
            .domain_name(domain);
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| tls_error(error_chain(&e)))?;
    }
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT))
}

/// `error: cause: cause…`, since tonic's errors keep the detail in sources.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_addresses() {
        for good in [
            "http://127.0.0.1:50051",
            "127.0.0.1:50051",
            "kplug.kplug-system.svc:50051",
            " http://[::1]:50051 ",
        ] {
            assert!(endpoint(good, None).is_ok(), "{good:?} should be accepted");
        }
        for bad in ["", "ftp://kplug:21", "http://", "https://", "not a uri"] {
            assert!(
                matches!(
                    endpoint(bad, Some(b"")),
                    Err(Error::InvalidRegistryAddress { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn https_needs_a_usable_ca() {
        let reason = |ca: Option<&[u8]>| match endpoint("https://kplug:8444", ca) {
            Err(Error::RegistryTls { reason, .. }) => reason,
            other => panic!("expected a TLS error, got {other:?}"),
        };
        assert!(reason(None).contains("--registry-ca-file"));
        assert!(reason(Some(b"")).contains("no PEM certificate"));
        assert!(reason(Some(b"not pem at all")).contains("no PEM certificate"));
        let broken = b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        assert!(reason(Some(broken)).contains("not valid PEM"));
    }
}
