//! The clients: straight to kplug as the front proxy, or to kube-apiserver
//! as admin; and waiting for the cluster to get somewhere.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http::{HeaderMap, HeaderName, HeaderValue};
use kplug_test_support::AggregatedKplug;
use rustls::pki_types::ServerName;

use crate::support::{ApiClient, tls_config};

/// Certificates and addresses the clients need.
pub(super) struct Endpoints {
    pub(super) kplug_ca: Vec<u8>,
    pub(super) front_proxy_cert: Vec<u8>,
    pub(super) front_proxy_key: Vec<u8>,
    pub(super) cluster_ca: Vec<u8>,
    pub(super) admin_cert: Vec<u8>,
    pub(super) admin_key: Vec<u8>,
    pub(super) apiserver: SocketAddr,
}

impl Endpoints {
    /// Straight to kplug as the front proxy asserting `user` in `group`.
    pub(super) async fn front_proxy(
        &self,
        kplug: &AggregatedKplug,
        user: &str,
        group: &str,
    ) -> Result<ApiClient> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("x-remote-user"),
            HeaderValue::from_str(user)?,
        );
        headers.insert(
            HeaderName::from_static("x-remote-group"),
            HeaderValue::from_str(group)?,
        );
        let config = tls_config(
            &self.kplug_ca,
            &self.front_proxy_cert,
            &self.front_proxy_key,
        )?;
        let address = SocketAddr::from(([127, 0, 0, 1], kplug.https));
        ApiClient::connect_with(address, localhost()?, config, headers).await
    }

    /// To kube-apiserver with the admin (system:masters) client certificate.
    pub(super) async fn apiserver_admin(&self) -> Result<ApiClient> {
        let config = tls_config(&self.cluster_ca, &self.admin_cert, &self.admin_key)?;
        ApiClient::connect_with(self.apiserver, localhost()?, config, HeaderMap::new()).await
    }
}

fn localhost() -> Result<ServerName<'static>> {
    ServerName::try_from("localhost").context("the server name localhost")
}

/// Waits (asynchronously) until `check` succeeds.
pub(super) async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(()) => return Ok(()),
            Err(last) if Instant::now() > deadline => {
                bail!("{what} not reached within {within:?}: {last:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}
