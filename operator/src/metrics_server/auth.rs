//! Who may read `/metrics`: what kube-apiserver's delegated authentication
//! and authorization do, and controller-runtime's
//! `filters.WithAuthenticationAndAuthorization`. The caller's bearer token
//! is checked with a TokenReview, then the user it names with a
//! SubjectAccessReview for the non-resource URL `/metrics`, verb `get`,
//! both with the operator's own client (so its ServiceAccount needs
//! `create` on `tokenreviews` and `subjectaccessreviews`). Decisions are
//! cached briefly per token, as kube-apiserver's webhook authenticator and
//! authorizer cache theirs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::HeaderMap;
use http::header::AUTHORIZATION;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;

/// How long an allowed token is trusted without asking again.
const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token is refused without asking again.
const DENIED_TTL: Duration = Duration::from_secs(10);
/// Tokens remembered at most; past it the expired ones go, then all.
const CACHE_CAPACITY: usize = 1024;

/// The path and verb the SubjectAccessReview asks about.
pub const METRICS_PATH: &str = "/metrics";
const VERB: &str = "get";

/// What the caller may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// No bearer token, or kube-apiserver did not accept it: 401.
    Unauthenticated,
    /// Authenticated as the user named, but not allowed: 403.
    Forbidden(String),
}

/// The reviews could not be made (kube-apiserver unreachable, the
/// operator not allowed to create them): 500, and nothing is cached.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("reviewing the token (TokenReview): {0}")]
    TokenReview(#[source] kube::Error),
    #[error("reviewing the access (SubjectAccessReview): {0}")]
    AccessReview(#[source] kube::Error),
}

/// Checks callers' tokens against kube-apiserver.
pub struct Authorizer {
    client: Client,
    cache: Mutex<HashMap<[u8; 32], (Decision, Instant)>>,
}

/// The bearer token of an `Authorization` header, if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn digest(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

impl Authorizer {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::default(),
        }
    }

    /// The decision for a request with `headers`.
    pub async fn decide(&self, headers: &HeaderMap) -> Result<Decision, AuthError> {
        let Some(token) = bearer_token(headers) else {
            return Ok(Decision::Unauthenticated);
        };
        let key = digest(token);
        if let Some(decision) = self.cached(&key) {
            return Ok(decision);
        }
        let decision = match self.authenticate(token).await? {
            None => Decision::Unauthenticated,
            Some(user) => self.authorize(user).await?,
        };
        self.remember(key, decision.clone());
        Ok(decision)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Decision> {
        let cache = self.cache.lock();
        let (decision, until) = cache.get(key)?;
        (Instant::now() < *until).then(|| decision.clone())
    }

    fn remember(&self, key: [u8; 32], decision: Decision) {
        let ttl = if decision == Decision::Allowed {
            ALLOWED_TTL
        } else {
            DENIED_TTL
        };
        let now = Instant::now();
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, (_, until)| now < *until);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(key, (decision, now + ttl));
    }

    /// The user the token authenticates, if kube-apiserver accepts it.
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::TokenReview)?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            tracing::debug!(error = ?status.error, "a metrics request with a token that does not authenticate");
            return Ok(None);
        }
        Ok(status.user)
    }

    async fn authorize(&self, user: UserInfo) -> Result<Decision, AuthError> {
        let name = user.username.clone().unwrap_or_default();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some(VERB.to_owned()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::AccessReview)?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed);
        Ok(if allowed {
            Decision::Allowed
        } else {
            Decision::Forbidden(name)
        })
    }
}

/// kube-apiserver's words for a refusal.
pub fn forbidden_message(user: &str) -> String {
    format!("forbidden: User \"{user}\" cannot {VERB} path \"{METRICS_PATH}\"")
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn only_a_bearer_token_counts() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        for (value, token) in [
            ("Bearer abc.def", Some("abc.def")),
            ("bearer  abc ", Some("abc")),
            ("Basic dXNlcjpwYXNz", None),
            ("Bearer ", None),
            ("Bearer", None),
        ] {
            headers.insert(AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(bearer_token(&headers), token, "{value:?}");
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("header");
        headers.insert(AUTHORIZATION, value);
        headers
    }

    #[tokio::test]
    async fn decisions_are_cached_and_failures_are_not() {
        // Nothing listens there: every review fails.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let authorizer = Authorizer::new(Client::try_from(config).expect("client"));
        assert_eq!(
            authorizer.decide(&HeaderMap::new()).await.ok(),
            Some(Decision::Unauthenticated),
            "no token: no review needed"
        );
        let error = authorizer.decide(&bearer("fresh")).await;
        assert!(matches!(error, Err(AuthError::TokenReview(_))), "{error:?}");
        assert!(authorizer.cached(&digest("fresh")).is_none(), "not cached");
        authorizer.remember(digest("known"), Decision::Allowed);
        authorizer.remember(digest("refused"), Decision::Forbidden("u".into()));
        assert_eq!(
            authorizer.decide(&bearer("known")).await.ok(),
            Some(Decision::Allowed)
        );
        assert_eq!(
            authorizer.decide(&bearer("refused")).await.ok(),
            Some(Decision::Forbidden("u".into()))
        );
    }

    #[test]
    fn refusals_read_like_kube_apiservers() {
        assert_eq!(
            forbidden_message("system:serviceaccount:plugins:nobody"),
            "forbidden: User \"system:serviceaccount:plugins:nobody\" cannot get path \"/metrics\""
        );
    }
}
