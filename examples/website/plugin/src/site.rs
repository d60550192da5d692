//! What a Website asks for, with no IO: its pages in a ConfigMap (wave 0),
//! then httpd serving them from a Deployment and a Service in front of it
//! (wave 1, once the pages exist), and a status read from the Deployment
//! the operator observed. The objects are typed `k8s-openapi` values with
//! only the fields the site cares about: the rest is left to Kubernetes'
//! defaults and to anyone else who sets them.

use std::collections::BTreeMap;
use std::hash::Hasher;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction, PodSpec,
    PodTemplateSpec, Probe, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kplug_sdk::{Child, ChildError, Request};
use serde::Deserialize;
use serde_json::{Value, json};

/// The child keys: stable across answers, whatever the objects' names.
pub const PAGES: &str = "pages";
pub const WEB: &str = "web";
pub const SERVICE: &str = "service";

/// The annotation on the pod template that rolls the pods when the pages
/// change (a mounted ConfigMap would update in place, pod by pod, later).
pub const PAGES_HASH: &str = "sites.example.com/pages-hash";

const HTTP_PORT: i32 = 8080;

/// Ports are keyed by port and protocol in server-side apply, and
/// kube-apiserver before 1.21 refuses an applied port without its protocol
/// ("associative list with keys has an element that omits key field"), so
/// every port names it.
const TCP: &str = "TCP";

/// A Website's spec.
#[derive(Debug, Deserialize)]
pub struct WebsiteSpec {
    pub pages: BTreeMap<String, String>,
    #[serde(default = "one")]
    pub replicas: i32,
    /// Whether a Service fronts the pods; without it the site is reached
    /// through the pods alone (and a Service asked for before is removed).
    #[serde(default = "yes")]
    pub expose: bool,
}

fn one() -> i32 {
    1
}

fn yes() -> bool {
    true
}

/// Why a Website cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("the object has no metadata.name")]
    NoName,
    #[error("spec is not a Website's: {0}")]
    Spec(serde_json::Error),
    #[error("spec.pages is empty: a site needs at least one page")]
    NoPages,
    #[error(
        "spec.pages: {0:?} is not a ConfigMap key (letters, digits, '-', '_' and '.', at most 253)"
    )]
    PageName(String),
    #[error(transparent)]
    Child(#[from] ChildError),
}

/// The site a request asks for.
pub struct Site<'a> {
    pub name: &'a str,
    pub spec: WebsiteSpec,
}

impl<'a> Site<'a> {
    /// Reads and checks the Website in `request`.
    pub fn of(request: &'a Request) -> Result<Self, SiteError> {
        let name = request.name().ok_or(SiteError::NoName)?;
        let spec: WebsiteSpec =
            serde_json::from_value(request.object["spec"].clone()).map_err(SiteError::Spec)?;
        if spec.pages.is_empty() {
            return Err(SiteError::NoPages);
        }
        if let Some(bad) = spec.pages.keys().find(|page| !is_config_map_key(page)) {
            return Err(SiteError::PageName(bad.clone()));
        }
        Ok(Self { name, spec })
    }

    /// The labels of the site's pods, which the Deployment and the Service select.
    fn pod_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "website".to_owned()),
            (
                "app.kubernetes.io/instance".to_owned(),
                self.name.to_owned(),
            ),
        ])
    }

    fn pages_name(&self) -> String {
        format!("{}-pages", self.name)
    }

    // ANCHOR: children
    /// Every child the site needs, in waves: the pages, then what serves them.
    pub fn children(&self, image: &str) -> Result<Vec<Child>, SiteError> {
        let mut children = vec![
            Child::typed(PAGES, &self.pages())?.wave(0),
            Child::typed(WEB, &self.deployment(image))?.wave(1),
        ];
        if self.spec.expose {
            children.push(Child::typed(SERVICE, &self.service())?.wave(1));
        }
        Ok(children)
    }
    // ANCHOR_END: children

    fn pages(&self) -> ConfigMap {
        ConfigMap {
            metadata: named(&self.pages_name()),
            data: Some(self.spec.pages.clone()),
            ..ConfigMap::default()
        }
    }

    fn deployment(&self, image: &str) -> Deployment {
        let labels = self.pod_labels();
        let http = IntOrString::String("http".to_owned());
        let container = Container {
            name: "httpd".to_owned(),
            image: Some(image.to_owned()),
            command: Some(
                [
                    "busybox",
                    "httpd",
                    "-f",
                    "-p",
                    &HTTP_PORT.to_string(),
                    "-h",
                    "/www",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
            ports: Some(vec![ContainerPort {
                name: Some("http".to_owned()),
                container_port: HTTP_PORT,
                protocol: Some(TCP.to_owned()),
                ..ContainerPort::default()
            }]),
            readiness_probe: Some(Probe {
                http_get: Some(HTTPGetAction {
                    path: Some("/".to_owned()),
                    port: http,
                    ..HTTPGetAction::default()
                }),
                period_seconds: Some(2),
                ..Probe::default()
            }),
            volume_mounts: Some(vec![VolumeMount {
                name: PAGES.to_owned(),
                mount_path: "/www".to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        };
        Deployment {
            metadata: named(self.name),
            spec: Some(DeploymentSpec {
                replicas: Some(self.spec.replicas),
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        annotations: Some(BTreeMap::from([(
                            PAGES_HASH.to_owned(),
                            pages_hash(&self.spec.pages),
                        )])),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![container],
                        volumes: Some(vec![Volume {
                            name: PAGES.to_owned(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: self.pages_name(),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        }]),
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        }
    }

    fn service(&self) -> Service {
        Service {
            metadata: named(self.name),
            spec: Some(ServiceSpec {
                selector: Some(self.pod_labels()),
                ports: Some(vec![ServicePort {
                    name: Some("http".to_owned()),
                    port: 80,
                    protocol: Some(TCP.to_owned()),
                    target_port: Some(IntOrString::String("http".to_owned())),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    /// The Website's status: where it is served, and how many pods serve
    /// it now, from the Deployment the operator observed (0 before).
    pub fn status(&self, request: &Request) -> Value {
        let available = request
            .observed_child_as::<Deployment>(WEB)
            .ok()
            .flatten()
            .and_then(|d| d.status)
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        let namespace = request.namespace().unwrap_or("default");
        json!({
            "url": format!("http://{}.{namespace}.svc/", self.name),
            "availableReplicas": available,
        })
    }
}

fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

/// A ConfigMap key, as Kubernetes' `IsConfigMapKey` allows one.
fn is_config_map_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && !key.starts_with("..")
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// FNV-1a of the pages, as Kubernetes hashes a pod template.
fn pages_hash(pages: &BTreeMap<String, String>) -> String {
    let mut hasher = fnv::FnvHasher::default();
    for (name, content) in pages {
        hasher.write(name.as_bytes());
        hasher.write(&[0]);
        hasher.write(content.as_bytes());
        hasher.write(&[0]);
    }
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn website(spec: Value) -> Request {
        Request::new(json!({
            "apiVersion": "sites.example.com/v1alpha1",
            "kind": "Website",
            "metadata": {"name": "hello", "namespace": "shop"},
            "spec": spec,
        }))
    }

    #[test]
    fn a_site_is_its_pages_then_a_deployment_and_a_service() {
        let request = website(json!({"pages": {"index.html": "<h1>hi</h1>"}, "replicas": 2}));
        let site = Site::of(&request).expect("a valid site");
        let children = site.children("kplug.local/toolbox:1").expect("children");
        let summary: Vec<_> = children
            .iter()
            .map(|c| {
                let kind = c.object["kind"].as_str().unwrap_or_default();
                let name = c.object["metadata"]["name"].as_str().unwrap_or_default();
                (c.key.as_str(), kind, name, c.wave, c.ready)
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("pages", "ConfigMap", "hello-pages", 0, None),
                ("web", "Deployment", "hello", 1, None),
                ("service", "Service", "hello", 1, None),
            ]
        );
        let deployment = &children[1].object;
        assert_eq!(deployment["spec"]["replicas"], 2);
        assert_eq!(
            deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"],
            "hello-pages"
        );
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "kplug.local/toolbox:1"
        );
        // Only what the site cares about: no status, no namespace (the
        // operator puts children in the Website's).
        assert!(deployment.get("status").is_none());
        assert!(deployment["metadata"].get("namespace").is_none());
        assert_eq!(
            children[2].object["spec"]["selector"],
            deployment["spec"]["selector"]["matchLabels"]
        );
    }

    #[test]
    fn a_site_not_exposed_has_no_service() {
        let request = website(json!({"pages": {"index.html": "x"}, "expose": false}));
        let site = Site::of(&request).expect("a valid site");
        let keys: Vec<String> = (site.children("busybox").expect("children").into_iter())
            .map(|c| c.key)
            .collect();
        assert_eq!(keys, [PAGES, WEB]);
    }

    #[test]
    fn new_pages_roll_the_pods() {
        let hash = |pages: Value| {
            let request = website(json!({"pages": pages}));
            let site = Site::of(&request).expect("a valid site");
            let children = site.children("busybox").expect("children");
            children[1].object["spec"]["template"]["metadata"]["annotations"][PAGES_HASH].clone()
        };
        assert_eq!(hash(json!({"a": "1"})), hash(json!({"a": "1"})));
        assert_ne!(hash(json!({"a": "1"})), hash(json!({"a": "2"})));
        assert_ne!(hash(json!({"a": "1", "b": ""})), hash(json!({"a": "1b"})));
    }

    #[test]
    fn the_status_counts_the_observed_deployment_s_available_pods() {
        let request = website(json!({"pages": {"index.html": "x"}}));
        let site = Site::of(&request).expect("a valid site");
        assert_eq!(
            site.status(&request),
            json!({"url": "http://hello.shop.svc/", "availableReplicas": 0})
        );
        let observed = request.clone().with_observed_child(
            WEB,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hello"},
                   "status": {"availableReplicas": 2}}),
        );
        assert_eq!(site.status(&observed)["availableReplicas"], 2);
    }

    #[test]
    fn a_site_without_pages_or_with_bad_page_names_is_refused() {
        for (spec, message) in [
            (json!({"pages": {}}), "spec.pages is empty"),
            (
                json!({"pages": {"a/b": "x"}}),
                "\"a/b\" is not a ConfigMap key",
            ),
            (json!({"replicas": 1}), "missing field `pages`"),
        ] {
            let request = website(spec);
            let error = Site::of(&request).err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.contains(message)),
                "{error:?}"
            );
        }
    }
}
