//! The trust plugins need in kplug, brought to their namespaces: kplug
//! keeps a ConfigMap `kplug-trust` (key `ca.crt`: the CA of kplug's
//! serving certificate, which the registry endpoint presents) in every
//! namespace labelled `plugins.kplug.io/trust=enabled`, as trust-manager
//! does for its bundles. A plugin mounts it as its registry CA; nothing is
//! copied by hand per plugin or per rotation.
//!
//! A kube-runtime controller over the labelled namespaces applies the
//! ConfigMap (server-side apply, field manager `kplug`), puts it back when
//! it is changed or deleted, and applies every namespace again when the
//! bundle file changes. Every kplug replica runs it; their applies are
//! identical, so they agree without a leader. A namespace that loses the
//! label keeps its ConfigMap (delete it by hand).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use parking_lot::RwLock;
use tokio::sync::watch;

/// The label that opts a namespace in.
pub const NAMESPACE_LABEL: &str = "plugins.kplug.io/trust";
/// Its value.
pub const ENABLED: &str = "enabled";
/// The ConfigMap kept in each namespace, and its key.
pub const CONFIG_MAP: &str = "kplug-trust";
pub const KEY: &str = "ca.crt";
const FIELD_MANAGER: &str = "kplug";
/// After a failed apply, when to try that namespace again.
const RETRY: Duration = Duration::from_secs(10);

/// Why the bundle or a ConfigMap could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading the trust bundle {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the trust bundle {path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error(
        "applying ConfigMap {namespace}/{CONFIG_MAP}: {}",
        crate::kube_words::kube_error(source)
    )]
    Apply {
        namespace: String,
        source: kube::Error,
    },
}

/// The ConfigMap for `namespace` holding `bundle`.
pub fn config_map(namespace: &str, bundle: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                [
                    ("app.kubernetes.io/managed-by", "kplug"),
                    ("app.kubernetes.io/part-of", "kplug"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ),
            annotations: Some(
                [(
                    "plugins.kplug.io/description".to_owned(),
                    format!(
                        "kept by kplug while the namespace has the label {NAMESPACE_LABEL}={ENABLED}: \
                         the CA of kplug's registry endpoint, for plugins' KPLUG_REGISTRY_CA_FILE"
                    ),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([(KEY.to_owned(), bundle.to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// The bundle file, reloaded when it changes.
pub struct TrustBundle {
    path: PathBuf,
    pem: RwLock<String>,
    changed: watch::Sender<()>,
}

impl TrustBundle {
    pub fn load(path: PathBuf) -> Result<Self, TrustError> {
        let pem = read(&path)?;
        Ok(Self {
            path,
            pem: RwLock::new(pem),
            changed: watch::channel(()).0,
        })
    }

    /// Re-reads the file; whether it changed.
    pub fn reload(&self) -> Result<bool, TrustError> {
        let pem = read(&self.path)?;
        if *self.pem.read() == pem {
            return Ok(false);
        }
        *self.pem.write() = pem;
        self.changed.send_replace(());
        Ok(true)
    }

    fn pem(&self) -> String {
        self.pem.read().clone()
    }
}

fn read(path: &Path) -> Result<String, TrustError> {
    let pem = std::fs::read_to_string(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(TrustError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(pem)
}

struct Context {
    client: Client,
    bundle: Arc<TrustBundle>,
}

async fn reconcile(namespace: Arc<Namespace>, context: Arc<Context>) -> Result<Action, TrustError> {
    let name = namespace.name_any();
    let api: Api<ConfigMap> = Api::namespaced(context.client.clone(), &name);
    api.patch(
        CONFIG_MAP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(config_map(&name, &context.bundle.pem())),
    )
    .await
    .map_err(|source| TrustError::Apply {
        namespace: name.clone(),
        source,
    })?;
    tracing::debug!(namespace = %name, "trust bundle applied");
    Ok(Action::await_change())
}

fn error_policy(_namespace: Arc<Namespace>, error: &TrustError, _context: Arc<Context>) -> Action {
    tracing::warn!(%error, "cannot keep the trust bundle; retrying");
    Action::requeue(RETRY)
}

/// Keeps the ConfigMaps until `shutdown` turns true.
pub async fn run(client: Client, bundle: Arc<TrustBundle>, mut shutdown: watch::Receiver<bool>) {
    let selector = format!("{NAMESPACE_LABEL}={ENABLED}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::all(client.clone());
    let bundle_changes =
        futures::stream::unfold(bundle.changed.subscribe(), |mut changed| async move {
            changed.changed().await.ok().map(|()| ((), changed))
        });
    let controller = Controller::new(namespaces, watcher::Config::default().labels(&selector))
        .watches(
            config_maps,
            watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}")),
            |config_map: ConfigMap| {
                config_map
                    .namespace()
                    .map(|ns| ObjectRef::<Namespace>::new(&ns))
            },
        )
        .reconcile_all_on(bundle_changes)
        .graceful_shutdown_on(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .run(
            reconcile,
            error_policy,
            Arc::new(Context { client, bundle }),
        )
        .for_each(|_| std::future::ready(()));
    tracing::info!(label = %selector, config_map = CONFIG_MAP, "keeping kplug's trust bundle in labelled namespaces");
    controller.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_holds_the_bundle_and_says_who_keeps_it() {
        let map = config_map("plugins", "-----BEGIN CERTIFICATE-----\n");
        assert_eq!(map.metadata.name.as_deref(), Some(CONFIG_MAP));
        assert_eq!(map.metadata.namespace.as_deref(), Some("plugins"));
        assert_eq!(
            map.data
                .as_ref()
                .and_then(|d| d.get(KEY))
                .map(String::as_str),
            Some("-----BEGIN CERTIFICATE-----\n")
        );
        let labels = map.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("kplug")
        );
    }

    #[test]
    fn a_bundle_without_a_certificate_is_refused_and_a_change_is_seen() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not PEM").expect("write");
        assert!(matches!(
            TrustBundle::load(path.clone()),
            Err(TrustError::NoCertificate { .. })
        ));
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\none").expect("write");
        let bundle = TrustBundle::load(path.clone()).expect("load");
        let changed = bundle.changed.subscribe();
        assert!(!bundle.reload().expect("same"));
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\ntwo").expect("write");
        assert!(bundle.reload().expect("changed"));
        assert!(changed.has_changed().expect("open"));
        assert!(bundle.pem().ends_with("two"));
    }
}
