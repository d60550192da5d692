//! How often delegated decisions come from the cache, and how the reviews
//! sent to kube-apiserver end.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Which cache a lookup went to.
#[derive(Clone, Copy, Debug)]
pub enum Cache {
    /// TokenReview results.
    Token,
    /// SubjectAccessReview decisions.
    Decision,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    cache: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    review: &'static str,
    /// `allowed` or `denied` (for a token: authenticated or not), or `error`
    /// when kube-apiserver could not be asked.
    result: &'static str,
}

/// Delegated authentication and authorization families.
#[derive(Clone, Debug, Default)]
pub struct AuthMetrics {
    lookups: Family<LookupLabels, Counter>,
    reviews: Family<ReviewLabels, Counter>,
}

impl AuthMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_auth_cache_lookups",
            "Lookups in the delegated authentication (token) and authorization (decision) caches, by result (hit, miss)",
            self.lookups.clone(),
        );
        registry.register(
            "kplug_auth_reviews",
            "TokenReviews and SubjectAccessReviews sent to kube-apiserver, by result (allowed, denied, error)",
            self.reviews.clone(),
        );
    }

    pub fn lookup(&self, cache: Cache, hit: bool) {
        let cache = match cache {
            Cache::Token => "token",
            Cache::Decision => "decision",
        };
        let result = if hit { "hit" } else { "miss" };
        self.lookups
            .get_or_create(&LookupLabels { cache, result })
            .inc();
    }

    pub fn review<T, E>(&self, cache: Cache, outcome: Option<&Result<T, E>>) {
        let review = match cache {
            Cache::Token => "TokenReview",
            Cache::Decision => "SubjectAccessReview",
        };
        let result = match outcome {
            Some(Ok(_)) => "allowed",
            Some(Err(_)) => "denied",
            None => "error",
        };
        self.reviews
            .get_or_create(&ReviewLabels { review, result })
            .inc();
    }
}
