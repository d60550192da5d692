//! Delegated authentication and authorization, the way Kubernetes
//! extension API servers do it: trust comes from the ConfigMap
//! `kube-system/extension-apiserver-authentication`, bearer tokens are
//! checked with TokenReviews and every request with a SubjectAccessReview.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use parking_lot::RwLock;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;

use super::attributes::Attributes;
use super::cache::{Bound, ReviewCache};
use super::metrics::{AuthMetrics, Cache};
use super::verifier::{DynamicVerifier, optional_client_auth, roots, verifies};
use super::{AuthError, PeerIdentity, User};
use crate::v1alpha1::{GROUP, VERSION};

/// Where kube-apiserver publishes the trust an extension server needs.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// Cache lifetimes and sizes, and the groups never sent for review.
#[derive(Clone, Debug)]
pub struct DelegatedSettings {
    pub token_ttl: Duration,
    pub allowed_ttl: Duration,
    pub denied_ttl: Duration,
    /// Authenticated tokens cached.
    pub token_cache_size: u64,
    /// Allowed decisions cached, and denied ones (apart).
    pub decision_cache_size: u64,
    /// Members are always allowed, as `system:masters` is by kube-apiserver.
    pub always_allow_groups: Vec<String>,
}

impl Default for DelegatedSettings {
    fn default() -> Self {
        Self {
            token_ttl: Duration::from_secs(10),
            allowed_ttl: Duration::from_secs(10),
            denied_ttl: Duration::from_secs(10),
            token_cache_size: 10_000,
            decision_cache_size: 10_000,
            always_allow_groups: vec!["system:masters".to_owned()],
        }
    }
}

/// Rejected tokens kept: enough to spare kube-apiserver a client retrying
/// a stale token, small because anyone can mint them.
const REJECTED_TOKENS: u64 = 1024;

/// Who may assert users with request headers, and which headers they use.
struct RequestHeader {
    verifier: Arc<dyn ClientCertVerifier>,
    allowed_names: Vec<String>,
    username_headers: Vec<String>,
    group_headers: Vec<String>,
    extra_prefixes: Vec<String>,
}

/// The trust read from the ConfigMap.
#[derive(Default)]
struct Trust {
    client_ca: Option<Arc<dyn ClientCertVerifier>>,
    request_header: Option<RequestHeader>,
}

/// Authenticates and authorizes through kube-apiserver.
pub struct Delegated {
    client: kube::Client,
    settings: DelegatedSettings,
    trust: RwLock<Arc<Trust>>,
    /// The TLS layer's view of the same trust: the union of both CAs.
    tls_verifier: Arc<DynamicVerifier>,
    tokens: ReviewCache<[u8; 32], User, String>,
    decisions: ReviewCache<String, (), String>,
    metrics: AuthMetrics,
}

fn json_list(data: &BTreeMap<String, String>, key: &str) -> Result<Vec<String>, String> {
    match data.get(key) {
        None => Ok(Vec::new()),
        Some(text) if text.trim().is_empty() => Ok(Vec::new()),
        Some(text) => {
            serde_json::from_str(text).map_err(|e| format!("{key}: not a JSON list: {e}"))
        }
    }
}

/// The decision cache's key for `user` doing `attributes`.
fn decision_key(user: &User, attributes: &Attributes) -> String {
    serde_json::to_string(&(user, attributes)).unwrap_or_default()
}

fn sha256(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

impl Delegated {
    /// Starts with no trust; call [`Delegated::load`] or [`Delegated::follow`].
    pub fn new(client: kube::Client, settings: DelegatedSettings) -> Self {
        let bound = |capacity, ttl| Bound { capacity, ttl };
        let tokens = ReviewCache::new(
            bound(settings.token_cache_size, settings.token_ttl),
            bound(REJECTED_TOKENS, settings.token_ttl),
        );
        let decisions = ReviewCache::new(
            bound(settings.decision_cache_size, settings.allowed_ttl),
            bound(settings.decision_cache_size, settings.denied_ttl),
        );
        Self {
            client,
            settings,
            trust: RwLock::new(Arc::new(Trust::default())),
            tls_verifier: Arc::new(DynamicVerifier::new(optional_client_auth(None))),
            tokens,
            decisions,
            metrics: AuthMetrics::default(),
        }
    }

    /// The families this authenticator counts into, to register.
    pub fn metrics(&self) -> &AuthMetrics {
        &self.metrics
    }

    /// The client certificate verifier the TLS server must use.
    pub fn tls_verifier(&self) -> Arc<DynamicVerifier> {
        self.tls_verifier.clone()
    }

    /// Applies the ConfigMap's data. Keys that fail to parse are logged and
    /// left out: the rest still works.
    pub fn apply(&self, data: &BTreeMap<String, String>) {
        let mut tls_roots = String::new();
        let client_ca = match data.get("client-ca-file").map(|pem| (pem, roots(pem))) {
            Some((pem, Ok(Some(store)))) => {
                tls_roots.push_str(pem);
                tls_roots.push('\n');
                Some(optional_client_auth(Some(store)))
            }
            Some((_, Err(e))) => {
                tracing::error!(error = %e, "client-ca-file in {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} is invalid: client certificates are not accepted");
                None
            }
            _ => None,
        };
        let request_header = match data
            .get("requestheader-client-ca-file")
            .map(|pem| (pem, roots(pem)))
        {
            Some((pem, Ok(Some(store)))) => {
                let lists = (
                    json_list(data, "requestheader-allowed-names"),
                    json_list(data, "requestheader-username-headers"),
                    json_list(data, "requestheader-group-headers"),
                    json_list(data, "requestheader-extra-headers-prefix"),
                );
                match lists {
                    (
                        Ok(allowed_names),
                        Ok(username_headers),
                        Ok(group_headers),
                        Ok(extra_prefixes),
                    ) => {
                        tls_roots.push_str(pem);
                        Some(RequestHeader {
                            verifier: optional_client_auth(Some(store)),
                            allowed_names,
                            username_headers,
                            group_headers,
                            extra_prefixes,
                        })
                    }
                    (a, b, c, d) => {
                        for error in [a.err(), b.err(), c.err(), d.err()].into_iter().flatten() {
                            tracing::error!(%error, "front-proxy settings in {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} are invalid: requests from kube-apiserver are not accepted");
                        }
                        None
                    }
                }
            }
            Some((_, Err(e))) => {
                tracing::error!(error = %e, "requestheader-client-ca-file in {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} is invalid: requests from kube-apiserver are not accepted");
                None
            }
            _ => None,
        };
        if request_header.is_none() {
            tracing::warn!(
                "no front-proxy CA in {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: requests proxied by kube-apiserver will get 401 (the APIService shows FailedDiscoveryCheck)"
            );
        }
        let tls = roots(&tls_roots).ok().flatten();
        self.tls_verifier.set(optional_client_auth(tls));
        tracing::info!(
            client_ca = client_ca.is_some(),
            front_proxy = request_header.is_some(),
            allowed_names = ?request_header.as_ref().map(|r| r.allowed_names.clone()),
            "loaded {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}"
        );
        *self.trust.write() = Arc::new(Trust {
            client_ca,
            request_header,
        });
    }

    /// Reads the ConfigMap once. A missing ConfigMap is logged, not fatal:
    /// bearer tokens still work.
    pub async fn load(&self) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), CONFIG_MAP_NAMESPACE);
        match api.get_opt(CONFIG_MAP_NAME).await {
            Ok(Some(config_map)) => self.apply(&config_map.data.unwrap_or_default()),
            Ok(None) => tracing::error!(
                "ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} not found: only bearer tokens can authenticate"
            ),
            Err(e) => tracing::error!(
                error = %e,
                "cannot read ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} (is the extension-apiserver-authentication-reader RoleBinding in place?)"
            ),
        }
    }

    /// Follows changes to the ConfigMap until the stream ends. A deleted
    /// ConfigMap keeps the last trust, as kube-apiserver's own dynamic CA
    /// loading does.
    pub async fn follow(self: Arc<Self>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), CONFIG_MAP_NAMESPACE);
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP_NAME}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(config_map) | watcher::Event::InitApply(config_map)) => {
                    self.apply(&config_map.data.unwrap_or_default());
                }
                Ok(watcher::Event::Delete(_)) => tracing::error!(
                    "ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} was deleted: keeping the last trust"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watching {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}")
                }
            }
        }
    }

    /// What a verified client certificate chain proves, given the current trust.
    pub fn identify(&self, chain: &[CertificateDer<'_>]) -> PeerIdentity {
        let trust = self.trust.read().clone();
        if let Some(request_header) = &trust.request_header
            && verifies(&*request_header.verifier, chain)
        {
            let common_name = chain
                .first()
                .and_then(User::from_certificate)
                .map(|u| u.name)
                .unwrap_or_default();
            let allowed = request_header.allowed_names.is_empty()
                || request_header.allowed_names.contains(&common_name);
            return PeerIdentity::FrontProxy {
                common_name,
                allowed,
            };
        }
        if let Some(client_ca) = &trust.client_ca
            && verifies(&**client_ca, chain)
            && let Some(user) = chain.first().and_then(User::from_certificate)
        {
            return PeerIdentity::User(Arc::new(user));
        }
        PeerIdentity::Anonymous
    }

    /// The user a front proxy asserts in headers; `None` without a username.
    fn user_from_headers(&self, headers: &HeaderMap) -> Option<User> {
        let trust = self.trust.read().clone();
        let settings = trust.request_header.as_ref()?;
        let values = |name: &str| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let name = settings
            .username_headers
            .iter()
            .flat_map(|h| values(h))
            .find(|v| !v.is_empty())?;
        let groups = settings
            .group_headers
            .iter()
            .flat_map(|h| values(h))
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let header = header.as_str();
            for prefix in &settings.extra_prefixes {
                if header.len() > prefix.len()
                    && header[..prefix.len()].eq_ignore_ascii_case(prefix)
                    && let Ok(value) = value.to_str()
                {
                    let key = percent_decode(&header[prefix.len()..].to_lowercase());
                    extra.entry(key).or_default().push(value.to_owned());
                }
            }
        }
        Some(User {
            name,
            groups,
            extra,
        })
    }

    /// The user behind a request.
    pub async fn authenticate(
        &self,
        peer: &PeerIdentity,
        headers: &HeaderMap,
    ) -> Result<User, AuthError> {
        match peer {
            PeerIdentity::FrontProxy {
                common_name,
                allowed,
            } => {
                if let Some(user) = self.user_from_headers(headers) {
                    if !allowed {
                        return Err(AuthError::Unauthenticated(format!(
                            "Unauthorized: client certificate CN {common_name:?} is not in requestheader-allowed-names"
                        )));
                    }
                    return Ok(user);
                }
            }
            PeerIdentity::User(user) => return Ok((**user).clone()),
            PeerIdentity::Anonymous => {}
        }
        match bearer_token(headers) {
            Some(token) => self.review_token(token, None).await,
            None => Err(AuthError::Unauthenticated("Unauthorized".to_owned())),
        }
    }

    /// Authenticates a bearer token with a (cached) TokenReview; with an
    /// `audience`, only a token issued for it (kube-apiserver reviews it
    /// for that audience alone, and must say so in its answer).
    pub async fn review_token(
        &self,
        token: &str,
        audience: Option<&str>,
    ) -> Result<User, AuthError> {
        // A token accepted for one audience is not for another.
        let key = sha256(&format!("{}\n{token}", audience.unwrap_or_default()));
        let cached = self.tokens.get(&key);
        self.metrics.lookup(Cache::Token, cached.is_some());
        if let Some(cached) = cached {
            return cached.map_err(AuthError::Unauthenticated);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: audience.map(|audience| vec![audience.to_owned()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                self.metrics.review::<(), ()>(Cache::Token, None);
                tracing::warn!(error = %e, "TokenReview failed");
                AuthError::TokenReview(e)
            })?;
        let status = reviewed.status.unwrap_or_default();
        let for_audience = audience.is_none_or(|audience| {
            status
                .audiences
                .as_ref()
                .is_some_and(|audiences| audiences.iter().any(|a| a == audience))
        });
        let outcome = match (status.authenticated, status.user) {
            (Some(true), Some(_)) if !for_audience => Err(format!(
                "Unauthorized: the token is not for audience {:?} (its review names {:?})",
                audience.unwrap_or_default(),
                status.audiences.unwrap_or_default()
            )),
            (Some(true), Some(info)) => Ok(User {
                name: info.username.unwrap_or_default(),
                groups: info.groups.unwrap_or_default(),
                extra: info.extra.unwrap_or_default(),
            }),
            _ => Err(format!(
                "Unauthorized: invalid bearer token{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            )),
        };
        self.metrics.review(Cache::Token, Some(&outcome));
        self.tokens.insert(key, outcome.clone());
        outcome.map_err(AuthError::Unauthenticated)
    }

    /// Whether `user` is in a group that is never reviewed (`system:masters`).
    pub fn always_allowed(&self, user: &User) -> bool {
        user.groups
            .iter()
            .any(|g| self.settings.always_allow_groups.contains(g))
    }

    /// Asks kube-apiserver (with a short cache) whether `user` may do `attributes`.
    pub async fn authorize(&self, user: &User, attributes: &Attributes) -> Result<(), AuthError> {
        self.decide(user, attributes).await.0
    }

    /// As [`Delegated::authorize`], for attributes that name one of many
    /// objects (the objects a reconcile sends): the right on every name is
    /// asked first, so that while its allowed answer is cached, the objects
    /// of a namespace cost one review between them instead of one each. A
    /// right held on some names only (RBAC's `resourceNames`) is then
    /// refused on every name, and asked about the object's own.
    pub async fn authorize_object(
        &self,
        user: &User,
        attributes: &Attributes,
    ) -> Result<(), AuthError> {
        if let Some(every_name) = attributes.on_every_name() {
            match self.authorize(user, &every_name).await {
                Err(AuthError::Forbidden(_)) => {}
                decided => return decided,
            }
        }
        self.authorize(user, attributes).await
    }

    /// As [`Delegated::authorize`], and whether a review was sent for it
    /// (`false`: decided by group or from the cache).
    pub async fn decide(
        &self,
        user: &User,
        attributes: &Attributes,
    ) -> (Result<(), AuthError>, bool) {
        if let Some(known) = self.cached(user, attributes) {
            return (known, false);
        }
        let key = decision_key(user, attributes);
        (self.review(user, attributes, key).await, true)
    }

    /// The decision on `user` doing `attributes` that needs no review: by
    /// group, or from the cache. `None`: only a review can say.
    pub fn cached(&self, user: &User, attributes: &Attributes) -> Option<Result<(), AuthError>> {
        if self.always_allowed(user) {
            return Some(Ok(()));
        }
        let cached = self.decisions.get(&decision_key(user, attributes));
        self.metrics.lookup(Cache::Decision, cached.is_some());
        cached.map(|decision| decision.map_err(AuthError::Forbidden))
    }

    /// A SubjectAccessReview of `user` doing `attributes`, its answer
    /// cached under `key`.
    async fn review(
        &self,
        user: &User,
        attributes: &Attributes,
        key: String,
    ) -> Result<(), AuthError> {
        let (resource_attributes, non_resource_attributes) = match attributes {
            Attributes::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => (
                Some(ResourceAttributes {
                    group: Some(group.clone()),
                    // RBAC ignores versions; kplug's own is the one it serves.
                    version: (group == GROUP).then(|| VERSION.to_owned()),
                    resource: Some(resource.clone()),
                    subresource: (!subresource.is_empty()).then(|| subresource.clone()),
                    namespace: (!namespace.is_empty()).then(|| namespace.clone()),
                    name: (!name.is_empty()).then(|| name.clone()),
                    verb: Some(verb.clone()),
                    ..ResourceAttributes::default()
                }),
                None,
            ),
            Attributes::NonResource { verb, path } => (
                None,
                Some(NonResourceAttributes {
                    path: Some(path.clone()),
                    verb: Some(verb.clone()),
                }),
            ),
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes,
                non_resource_attributes,
                uid: None,
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let reviewed = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                self.metrics.review::<(), ()>(Cache::Decision, None);
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                AuthError::AccessReview(e)
            })?;
        let status = reviewed.status.unwrap_or_default();
        tracing::debug!(
            user = %user.name,
            ?attributes,
            allowed = status.allowed,
            "SubjectAccessReview answered"
        );
        let decision = if status.allowed {
            Ok(())
        } else {
            Err(attributes.forbidden(&user.name, status.reason.as_deref().unwrap_or_default()))
        };
        self.decisions.insert(key, decision.clone());
        self.metrics.review(Cache::Decision, Some(&decision));
        decision.map_err(AuthError::Forbidden)
    }
}

/// The token of an `Authorization: Bearer` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Undoes the percent-encoding kube-apiserver applies to extra keys;
/// malformed escapes stay as they are.
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer abc".parse().expect("header"));
        assert_eq!(bearer_token(&headers), Some("abc"));
        headers.insert("authorization", "bearer   xyz ".parse().expect("header"));
        assert_eq!(bearer_token(&headers), Some("xyz"));
        headers.insert("authorization", "Basic abc".parse().expect("header"));
        assert_eq!(bearer_token(&headers), None);
        headers.insert("authorization", "Bearer ".parse().expect("header"));
        assert_eq!(bearer_token(&headers), None);
    }

    #[test]
    fn extra_keys_are_percent_decoded() {
        assert_eq!(percent_decode("scopes"), "scopes");
        assert_eq!(percent_decode("example.com%2fteam"), "example.com/team");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }
}
