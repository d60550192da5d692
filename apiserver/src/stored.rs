//! Objects stored in kube-apiserver, read with kplug's own identity: what a
//! reconcile by reference (`spec.objectRef`) sends to the plugin instead of
//! a body the caller wrote. kplug's ServiceAccount may read only what its
//! plugins' RBAC grants it (`kubectl kplug create plugin --api` emits a
//! `get` on the plugin's resource and its extension resources), so a
//! refusal here is kplug's, not the caller's: the caller's own right was
//! checked before the read.

use http::{Method, Request, header};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::kube_words::kube_error;

/// Where one object is served.
#[derive(Clone, Copy, Debug)]
pub struct Location<'a> {
    /// Empty for the core group.
    pub group: &'a str,
    pub version: &'a str,
    /// The resource's plural name, e.g. `databasetables`.
    pub resource: &'a str,
    /// Empty for a cluster-scoped object.
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Location<'_> {
    /// The object's path, each segment escaped.
    fn path(&self) -> String {
        let segment = |text: &str| utf8_percent_encode(text, SEGMENT).to_string();
        let mut path = if self.group.is_empty() {
            format!("/api/{}", segment(self.version))
        } else {
            format!("/apis/{}/{}", segment(self.group), segment(self.version))
        };
        if !self.namespace.is_empty() {
            path.push_str(&format!("/namespaces/{}", segment(self.namespace)));
        }
        path.push_str(&format!(
            "/{}/{}",
            segment(self.resource),
            segment(self.name)
        ));
        path
    }
}

/// What a path segment must escape: everything but unreserved characters
/// and the few a Kubernetes name may hold (`:` in RBAC names, `@`).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Why an object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not found")]
    NotFound,
    /// kplug's identity may not read it.
    #[error("kplug may not read it: {0}")]
    Forbidden(String),
    /// kube-apiserver failed or could not be reached: try again.
    #[error("reading it failed: {0}")]
    Unavailable(String),
}

/// Reads objects with kplug's client.
pub struct StoredObjects {
    client: kube::Client,
}

impl StoredObjects {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The object at `location`, exactly as kube-apiserver serves it
    /// (JSON).
    pub async fn get(&self, location: &Location<'_>) -> Result<String, ReadError> {
        let request = Request::builder()
            .method(Method::GET)
            .uri(location.path())
            .header(header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(|e| ReadError::Unavailable(e.to_string()))?;
        self.client
            .request_text(request)
            .await
            .map_err(|error| match &error {
                kube::Error::Api(status) if status.code == 404 => ReadError::NotFound,
                kube::Error::Api(status) if status.code == 403 => {
                    ReadError::Forbidden(status.message.clone())
                }
                _ => ReadError::Unavailable(kube_error(&error)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location<'a>(group: &'a str, namespace: &'a str, name: &'a str) -> Location<'a> {
        Location {
            group,
            version: "v1",
            resource: "things",
            namespace,
            name,
        }
    }

    #[test]
    fn paths_follow_kube_apiservers_layout() {
        assert_eq!(
            location("", "team-a", "settings").path(),
            "/api/v1/namespaces/team-a/things/settings"
        );
        assert_eq!(
            location("myorg.org", "", "orders").path(),
            "/apis/myorg.org/v1/things/orders"
        );
        assert_eq!(
            location("rbac.authorization.k8s.io", "", "system:kplug").path(),
            "/apis/rbac.authorization.k8s.io/v1/things/system:kplug"
        );
    }

    #[test]
    fn a_name_cannot_leave_its_segment() {
        let path = location("myorg.org", "team-a", "../../b/x?watch=1#").path();
        assert_eq!(
            path,
            "/apis/myorg.org/v1/namespaces/team-a/things/..%2F..%2Fb%2Fx%3Fwatch=1%23"
        );
    }
}
