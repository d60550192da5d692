//! The `host:port` a plugin declares to kplug, from `--advertise` and the
//! address actually bound. Pure but for a warning.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tracing::warn;

use crate::Error;

/// The `host:port` to declare: `given` with a missing or zero port replaced
/// by `bound`'s, or without `given`, `bound` itself with an unspecified IP
/// replaced by loopback.
pub(super) fn advertised_address(given: Option<&str>, bound: SocketAddr) -> Result<String, Error> {
    let given = given.map(str::trim).filter(|given| !given.is_empty());
    let Some(given) = given else {
        let ip = match bound.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => return Ok(SocketAddr::new(ip, bound.port()).to_string()),
        };
        let address = SocketAddr::new(ip, bound.port()).to_string();
        warn!(
            listen = %bound,
            %address,
            "listening on all interfaces without an advertised address: declaring loopback, \
             which only a kplug on this host can reach; set --advertise (KPLUG_ADVERTISE)"
        );
        return Ok(address);
    };
    let invalid = |reason: &str| Error::InvalidAdvertiseAddress {
        address: given.to_owned(),
        reason: reason.to_owned(),
    };
    // `[v6]:port`, `[v6]`, `host:port`, `host`, or a bare IPv6 address.
    let (host, port) = if let Some(rest) = given.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("missing ] after the IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| invalid("expected :port after ]"))?,
            ),
        };
        (format!("[{ip}]"), port)
    } else if given.matches(':').count() > 1 {
        (format!("[{given}]"), None)
    } else {
        match given.split_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (given.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(invalid("missing host"));
    }
    let port = match port {
        None => 0,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| invalid("the port is not a number from 0 to 65535"))?,
    };
    let port = if port == 0 { bound.port() } else { port };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_addresses() {
        let bound: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:4000".parse().unwrap();
        let any6: SocketAddr = "[::]:4000".parse().unwrap();
        let ok = |given, bound| advertised_address(given, bound).unwrap();
        assert_eq!(ok(None, bound), "127.0.0.1:4000");
        assert_eq!(ok(None, any), "127.0.0.1:4000");
        assert_eq!(ok(None, any6), "[::1]:4000");
        assert_eq!(ok(Some(""), bound), "127.0.0.1:4000");
        assert_eq!(ok(Some("svc.ns.svc:50052"), any), "svc.ns.svc:50052");
        assert_eq!(ok(Some("svc.ns.svc"), any), "svc.ns.svc:4000");
        assert_eq!(ok(Some("svc.ns.svc:0"), any), "svc.ns.svc:4000");
        assert_eq!(ok(Some("127.0.0.1:0"), bound), "127.0.0.1:4000");
        assert_eq!(ok(Some("[::1]:9"), bound), "[::1]:9");
        assert_eq!(ok(Some("[::1]"), bound), "[::1]:4000");
        assert_eq!(ok(Some("fd00::1"), bound), "[fd00::1]:4000");
        for bad in [":80", "host:x", "host:70000", "[::1", "[::1]x", "[]:80"] {
            assert!(
                matches!(
                    advertised_address(Some(bad), bound),
                    Err(Error::InvalidAdvertiseAddress { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }
}
