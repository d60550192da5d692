//! Finding kplug's replicas: the registry's host name resolved to
//! addresses, by the system resolver or one of the caller's.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

/// The future a [`Resolve`] returns.
pub type Resolving = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// Turns the registry's host name into the addresses of kplug's replicas.
///
/// The default, [`SystemResolver`], asks the operating system (DNS, the
/// hosts file), which for a headless Service gives one address per ready
/// replica. Closures `Fn(&str, u16) -> impl Future<Output =
/// io::Result<Vec<SocketAddr>>>` implement it too, e.g. to heartbeat to a
/// fixed set of replicas or to test:
///
/// ```
/// use std::net::SocketAddr;
/// use kplug_sdk::{ApiRef, Heartbeater, PluginInfo};
///
/// let replicas: Vec<SocketAddr> = vec!["10.0.0.7:50051".parse().unwrap()];
/// let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"));
/// let heartbeater = Heartbeater::new("http://kplug:50051", info)
///     .resolver(move |_host: &str, _port: u16| std::future::ready(Ok(replicas.clone())));
/// ```
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host`, with `port`.
    fn resolve(&self, host: &str, port: u16) -> Resolving;
}

impl<F, Fut> Resolve for F
where
    F: Fn(&str, u16) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static,
{
    fn resolve(&self, host: &str, port: u16) -> Resolving {
        Box::pin(self(host, port))
    }
}

/// The operating system's resolver, through [`tokio::net::lookup_host`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> Resolving {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// How the followed addresses change for a new resolution.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// Newly resolved: start heartbeating to them.
    pub(super) added: Vec<SocketAddr>,
    /// No longer resolved: stop heartbeating to them.
    pub(super) removed: Vec<SocketAddr>,
}

/// What to start and stop to go from `current` to `resolved`; duplicates
/// in `resolved` count once.
pub(super) fn changes(current: &BTreeSet<SocketAddr>, resolved: &[SocketAddr]) -> Changes {
    let resolved: BTreeSet<SocketAddr> = resolved.iter().copied().collect();
    Changes {
        added: resolved.difference(current).copied().collect(),
        removed: current.difference(&resolved).copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8444))
    }

    #[test]
    fn follows_additions_and_removals() {
        let current: BTreeSet<_> = [addr(1), addr(2)].into();
        assert_eq!(changes(&current, &[addr(2), addr(1)]), Changes::default());
        assert_eq!(
            changes(&current, &[addr(3), addr(2), addr(3)]),
            Changes {
                added: vec![addr(3)],
                removed: vec![addr(1)],
            }
        );
        assert_eq!(changes(&BTreeSet::new(), &[addr(1)]).added, vec![addr(1)]);
    }

    #[tokio::test]
    async fn the_system_resolver_resolves_names_and_ips() {
        let resolved = SystemResolver.resolve("127.0.0.1", 80).await.unwrap();
        assert_eq!(resolved, [SocketAddr::from(([127, 0, 0, 1], 80))]);
        // `localhost` is in every hosts file, as loopback.
        let resolved = SystemResolver.resolve("localhost", 80).await.unwrap();
        assert!(!resolved.is_empty());
        assert!(
            resolved.iter().all(|a| a.ip().is_loopback()),
            "{resolved:?}"
        );
    }
}
