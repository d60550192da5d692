//! How the registry is dialed: its address checked, plain HTTP/2 or TLS,
//! and one endpoint per address its host resolves to.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Uri};

use crate::Error;
use crate::error::error_chain;

/// Bounds dialing the registry, so an unanswered dial cannot stall the
/// channel for the operating system's much longer TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the registry's replicas are found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    /// An IP address: dialed as it is, one replica.
    Ip(IpAddr),
    /// A name, resolved to one address per replica (a headless Service) or
    /// to one for all of them (a ClusterIP Service).
    Name(String),
}

/// A checked registry address: how to dial each of its replicas.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    scheme: &'static str,
    pub(crate) host: Host,
    pub(crate) port: u16,
    /// `scheme://host:port` as given, the `:authority` of every call
    /// whichever address is dialed.
    origin: Uri,
    /// For `https://`: trusts the registry CA and verifies the certificate
    /// against the host as given, not the address dialed.
    tls: Option<ClientTlsConfig>,
}

impl Target {
    /// Validates `registry` and configures how it is dialed: plain HTTP/2,
    /// or TLS trusting the PEM certificates in `ca` for `https://`.
    pub(crate) fn parse(registry: &str, ca: Option<&[u8]>) -> Result<Self, Error> {
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
        let endpoint = Endpoint::from_shared(uri).map_err(|e| invalid(error_chain(&e)))?;
        let uri = endpoint.uri();
        let scheme = match uri.scheme_str().unwrap_or_default() {
            "http" => "http",
            "https" => "https",
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?}; use http:// or https://"
                )));
            }
        };
        let host = match uri.host() {
            Some(host) if !host.is_empty() => host,
            _ => return Err(invalid("missing host".into())),
        };
        // IPv6 without brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let origin = format!("{scheme}://{host}:{port}")
            .parse::<Uri>()
            .map_err(|e| invalid(error_chain(&e)))?;
        let tls = if scheme == "https" {
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
            // The certificate must name the host given, whichever of its
            // addresses is dialed.
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(pem))
                .domain_name(bare);
            // Fails here rather than for each replica.
            endpoint
                .clone()
                .tls_config(tls.clone())
                .map_err(|e| tls_error(error_chain(&e)))?;
            Some(tls)
        } else {
            None
        };
        let host = match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(bare.to_owned()),
        };
        Ok(Self {
            scheme,
            host,
            port,
            origin,
            tls,
        })
    }

    /// Whether calls go over plain `http://`.
    pub(crate) fn is_plain(&self) -> bool {
        self.tls.is_none()
    }

    /// How to dial the replica at `address`.
    pub(crate) fn endpoint(&self, address: SocketAddr) -> Result<Endpoint, String> {
        let uri = format!("{}://{address}", self.scheme);
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| error_chain(&e))?
            .origin(self.origin.clone())
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| error_chain(&e))?;
        }
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_addresses() {
        let parse = |address| Target::parse(address, None).unwrap();
        let target = parse("http://127.0.0.1:50051");
        assert_eq!(target.host, Host::Ip([127, 0, 0, 1].into()));
        assert_eq!(target.port, 50051);
        assert!(target.is_plain());
        let target = parse("kplug.kplug-system.svc:50051");
        assert_eq!(target.host, Host::Name("kplug.kplug-system.svc".into()));
        let target = parse(" http://[::1]:50051 ");
        assert_eq!(target.host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(parse("http://kplug").port, 80);
        for bad in ["", "ftp://kplug:21", "http://", "https://", "not a uri"] {
            assert!(
                matches!(
                    Target::parse(bad, Some(b"")),
                    Err(Error::InvalidRegistryAddress { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn each_replica_is_dialed_by_address_under_the_name_given() {
        let target = Target::parse("http://kplug.kplug-system.svc:8444", None).unwrap();
        let endpoint = target
            .endpoint(SocketAddr::from(([10, 0, 0, 7], 8444)))
            .unwrap();
        assert_eq!(endpoint.uri().to_string(), "http://10.0.0.7:8444/");
        let endpoint = target.endpoint("[fd00::7]:8444".parse().unwrap()).unwrap();
        assert_eq!(endpoint.uri().host(), Some("[fd00::7]"));
        assert_eq!(
            target.origin.to_string(),
            "http://kplug.kplug-system.svc:8444/"
        );
    }

    #[test]
    fn https_needs_a_usable_ca() {
        let reason = |ca: Option<&[u8]>| match Target::parse("https://kplug:8444", ca) {
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
