//! kube-rs as a client of kplug: the Plugin resource and a client from a
//! kubeconfig, optionally sent to another server (a [`crate::Service`]).

use std::path::Path;

use kube::api::ApiResource;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// `plugins.plugins.kplug.io/v1alpha1`, for `Api::all_with`.
pub fn plugins_resource() -> ApiResource {
    ApiResource {
        group: "plugins.kplug.io".to_owned(),
        version: "v1alpha1".to_owned(),
        api_version: "plugins.kplug.io/v1alpha1".to_owned(),
        kind: "Plugin".to_owned(),
        plural: "plugins".to_owned(),
    }
}

/// A client with the credentials of the kubeconfig at `path`, talking to
/// `server` (e.g. `https://127.0.0.1:PORT`) instead of the kubeconfig's
/// server when given.
pub async fn kube_client(path: &Path, server: Option<&str>) -> Client {
    client_of(kube_config(path, server).await)
}

/// [`kube_client`] without kube's retries of 429, 503 and 504 (up to 15,
/// minutes in all), as the operator calls kplug: for a test of what one
/// request is answered.
pub async fn kube_client_without_retries(path: &Path, server: Option<&str>) -> Client {
    let mut config = kube_config(path, server).await;
    config.default_retry = false;
    client_of(config)
}

async fn kube_config(path: &Path, server: Option<&str>) -> Config {
    let mut kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("cannot read the kubeconfig {}: {e}", path.display()));
    if let Some(server) = server {
        for named in &mut kubeconfig.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.server = Some(server.to_owned());
            }
        }
    }
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kube config from {}: {e}", path.display()))
}

fn client_of(config: Config) -> Client {
    Client::try_from(config).unwrap_or_else(|e| panic!("kube client: {e}"))
}
