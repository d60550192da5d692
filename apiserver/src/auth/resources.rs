//! Which resource serves a kind, for authorizing an object that a request
//! names by its `apiVersion` and `kind`: a SubjectAccessReview names the
//! resource (`widgets`), as kube-apiserver's RESTMapper finds it for its
//! own admission checks. Found by discovery (one `GET /apis/GROUP/VERSION`)
//! and cached: a CRD's plural cannot change while the CRD exists, and a
//! kind that is not served is remembered apart, for a short time, so that a
//! flood of invented kinds evicts only its own kind.

use std::time::Duration;

use kube::api::GroupVersionKind;

use super::cache::{Bound, ReviewCache};

/// How a served kind is authorized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedResource {
    /// The resource's plural name, e.g. `widgets`.
    pub plural: String,
    /// Whether objects of it live in namespaces.
    pub namespaced: bool,
}

/// Why a kind has no resource to authorize.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    /// The cluster serves no such kind (a wrong apiVersion, a typo, an
    /// invented object).
    #[error("the cluster serves no kind {kind:?} in {api_version:?}")]
    NotServed { api_version: String, kind: String },
    /// Discovery failed: the answer is unknown, not negative.
    #[error("discovering the resource of kind {kind:?} in {api_version:?}: {message}")]
    Discovery {
        api_version: String,
        kind: String,
        message: String,
    },
}

/// How long a resolved kind is trusted; a deleted and re-created CRD with
/// another plural is rare enough to wait this long for.
const SERVED_TTL: Duration = Duration::from_secs(600);
/// Kinds cached each side.
const CAPACITY: u64 = 1_000;

/// Resolves kinds to resources through kube-apiserver's discovery.
pub struct Resources {
    client: kube::Client,
    cache: ReviewCache<(String, String), ServedResource, ResolveError>,
}

impl Resources {
    /// `not_served_ttl`: how long a kind found missing stays missing (a CRD
    /// being installed is found afterwards).
    pub fn new(client: kube::Client, not_served_ttl: Duration) -> Self {
        Self {
            client,
            cache: ReviewCache::new(
                Bound {
                    capacity: CAPACITY,
                    ttl: SERVED_TTL,
                },
                Bound {
                    capacity: CAPACITY,
                    ttl: not_served_ttl,
                },
            ),
        }
    }

    /// The resource serving `kind` in `api_version` (`v1`, `apps/v1`).
    pub async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<ServedResource, ResolveError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(known) = self.cache.get(&key) {
            return known;
        }
        let (group, version) = split_api_version(api_version);
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, capabilities)) => Ok(ServedResource {
                plural: resource.plural,
                namespaced: capabilities.scope == kube::discovery::Scope::Namespaced,
            }),
            Err(error) if not_served(&error) => Err(ResolveError::NotServed {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
            }),
            Err(error) => {
                // Not cached: the next request asks again.
                return Err(ResolveError::Discovery {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    message: crate::kube_words::kube_error(&error),
                });
            }
        };
        self.cache.insert(key, found.clone());
        found
    }
}

/// `apps/v1` is group `apps`, version `v1`; `v1` the core group's.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// Whether discovery says the kind is not there, rather than failing.
fn not_served(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_split_into_group_and_version() {
        assert_eq!(split_api_version("v1"), ("", "v1"));
        assert_eq!(split_api_version("apps/v1"), ("apps", "v1"));
        assert_eq!(
            split_api_version("myorg.org/v1alpha1"),
            ("myorg.org", "v1alpha1")
        );
    }

    #[test]
    fn only_a_missing_group_version_or_kind_is_not_served() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(not_served(&status(404)));
        assert!(!not_served(&status(403)));
        assert!(!not_served(&status(503)));
        assert!(not_served(&kube::Error::Discovery(
            kube::error::DiscoveryError::MissingKind("Widget".to_owned())
        )));
    }
}
