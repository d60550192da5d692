//! The user's cluster and identity, found the way kubectl finds them.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::ConnectionArgs;
use crate::error::Error;

/// A client with the user's credentials, and the namespace to work in.
pub struct Connection {
    pub client: Client,
    pub namespace: String,
}

/// The namespace `-n` names, else the kubeconfig context's, else
/// "default", as kubectl picks it; read offline, for commands that only print.
pub async fn namespace(args: &ConnectionArgs) -> String {
    if let Some(namespace) = &args.namespace {
        return namespace.clone();
    }
    let options = KubeConfigOptions {
        context: args.context.clone(),
        cluster: args.cluster.clone(),
        user: args.user.clone(),
    };
    let config = match &args.kubeconfig {
        Some(path) => match Kubeconfig::read_from(path) {
            Ok(kubeconfig) => Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .ok(),
            Err(_) => None,
        },
        None => Config::from_kubeconfig(&options).await.ok(),
    };
    config.map_or_else(|| "default".to_owned(), |config| config.default_namespace)
}

/// `--kubeconfig`, else `$KUBECONFIG` (a list of files, merged), else
/// `~/.kube/config`, else the in-cluster config when running in a pod;
/// `--context`, `--cluster`, `--user`, `--as`, `--as-group` and `-n` as in
/// kubectl.
pub async fn connect(args: &ConnectionArgs) -> Result<Connection, Error> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        cluster: args.cluster.clone(),
        user: args.user.clone(),
    };
    let config_error = |e: kube::config::KubeconfigError| Error::Config(e.to_string());
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(config_error)?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(config_error)?
        }
        None => match Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            // Inside a pod without a kubeconfig, like kubectl.
            Err(error) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                Config::incluster().map_err(|incluster| {
                    Error::Config(format!("{error}; in-cluster: {incluster}"))
                })?
            }
            Err(error) => return Err(config_error(error)),
        },
    };
    if let Some(user) = &args.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !args.as_groups.is_empty() {
        config.auth_info.impersonate_groups = Some(args.as_groups.clone());
    }
    // A person waits at the terminal: kplug's 503 and 429 are answers to
    // report at once, not faults to retry behind their back.
    config.default_retry = false;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    Ok(Connection { client, namespace })
}

/// What a request to kplug is, for the messages of its failures: `verb` on
/// `resource` (e.g. `create`, `reconciles.plugins.kplug.io`), about `api`
/// (the API or plugin a 503 or 404 names), in `namespace` when namespaced.
pub struct Asked<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub api: &'a str,
}

/// Sends `request` to kplug through kube-apiserver; the body of a success,
/// else the error kube-apiserver's or kplug's answer means.
pub async fn send_to_kplug(
    client: &Client,
    request: http::Request<kube::client::Body>,
    asked: Asked<'_>,
) -> Result<bytes::Bytes, Error> {
    let response = client
        .send(request)
        .await
        .map_err(|e| Error::from_kube(e, asked.verb, asked.resource, asked.namespace))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| Error::Transport(e.to_string()))?;
    if !status.is_success() {
        return Err(Error::from_kplug(status, &body, &asked));
    }
    Ok(body)
}
