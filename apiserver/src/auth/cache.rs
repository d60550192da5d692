//! Bounded, time-limited caches of review answers.
//!
//! Two properties matter against a hostile client. The caches are bounded
//! and evict one entry at a time, never everything. And what anyone can
//! produce at will, a rejected token or a denied request, lives in a cache
//! of its own, so a flood of it can only evict its own kind. (moka's TinyLFU
//! admission also favours entries in use over one-off keys, but its
//! frequency sketch is sized to the cache, so that is best effort against
//! a flood of allowed one-off keys, which needs a caller allowed to make
//! them.)

use std::hash::Hash;
use std::time::Duration;

use moka::sync::Cache;

/// Entries live `ttl` from insertion; at most about `capacity` are kept.
pub struct TtlCache<K, V> {
    /// `None` for a zero TTL: nothing is kept.
    cache: Option<Cache<K, V>>,
}

impl<K, V> TtlCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(capacity: u64, ttl: Duration) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            Cache::builder()
                .max_capacity(capacity.max(1))
                .time_to_live(ttl)
                .build()
        });
        Self { cache }
    }

    /// The live value for `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        self.cache.as_ref()?.get(key)
    }

    pub fn insert(&self, key: K, value: V) {
        if let Some(cache) = &self.cache {
            cache.insert(key, value);
        }
    }

    #[cfg(test)]
    fn len(&self) -> u64 {
        self.cache.as_ref().map_or(0, |cache| {
            cache.run_pending_tasks();
            cache.entry_count()
        })
    }
}

/// Answers that admit (`Ok`) and answers that refuse (`Err`), each in a
/// cache of its own size and TTL.
pub struct ReviewCache<K, A, R> {
    admitted: TtlCache<K, A>,
    refused: TtlCache<K, R>,
}

/// Size and lifetime of one side of a [`ReviewCache`].
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub capacity: u64,
    pub ttl: Duration,
}

impl<K, A, R> ReviewCache<K, A, R>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Clone + Send + Sync + 'static,
    R: Clone + Send + Sync + 'static,
{
    pub fn new(admitted: Bound, refused: Bound) -> Self {
        Self {
            admitted: TtlCache::new(admitted.capacity, admitted.ttl),
            refused: TtlCache::new(refused.capacity, refused.ttl),
        }
    }

    /// The cached answer for `key`; admissions are looked up first, as
    /// they are what callers in good standing hit.
    pub fn get(&self, key: &K) -> Option<Result<A, R>> {
        if let Some(admitted) = self.admitted.get(key) {
            return Some(Ok(admitted));
        }
        self.refused.get(key).map(Err)
    }

    pub fn insert(&self, key: K, answer: Result<A, R>) {
        match answer {
            Ok(admitted) => self.admitted.insert(key, admitted),
            Err(refused) => self.refused.insert(key, refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn bound(capacity: u64, ttl: Duration) -> Bound {
        Bound { capacity, ttl }
    }

    #[test]
    fn entries_expire() {
        let cache = TtlCache::new(10, Duration::from_millis(50));
        cache.insert("a", 1);
        assert_eq!(cache.get(&"a"), Some(1));
        let deadline = Instant::now() + Duration::from_secs(5);
        while cache.get(&"a").is_some() {
            assert!(Instant::now() < deadline, "the entry outlived its TTL");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let cache = TtlCache::new(10, Duration::ZERO);
        cache.insert("zero", 5);
        assert_eq!(cache.get(&"zero"), None);
    }

    #[test]
    fn capacity_is_bounded_and_never_cleared_at_once() {
        let cache = TtlCache::new(100, MINUTE);
        for i in 0..1_000 {
            cache.insert(i, i);
        }
        let len = cache.len();
        // Full, one eviction at a time: not emptied to make room.
        assert!((50..=100).contains(&len), "{len} entries");
    }

    #[test]
    fn refusals_never_evict_admissions() {
        let cache: ReviewCache<String, &str, &str> =
            ReviewCache::new(bound(100, MINUTE), bound(10, MINUTE));
        cache.insert("real-user".to_owned(), Ok("alice"));
        for i in 0..10_000 {
            cache.insert(format!("random-{i}"), Err("invalid bearer token"));
        }
        assert_eq!(cache.get(&"real-user".to_owned()), Some(Ok("alice")));
        assert!(cache.refused.len() <= 10, "{}", cache.refused.len());
    }

    #[test]
    fn denials_never_evict_allowed_decisions() {
        // Any authenticated caller can make 10,000 denied decisions by asking
        // for random names it may not see; a user allowed meanwhile keeps theirs.
        let cache: ReviewCache<String, (), String> =
            ReviewCache::new(bound(100, MINUTE), bound(100, MINUTE));
        let user = "user: list plugins".to_owned();
        cache.insert(user.clone(), Ok(()));
        for i in 0..10_000 {
            let key = format!("someone: get plugins/random-{i}");
            if cache.get(&key).is_none() {
                cache.insert(key, Err("forbidden".to_owned()));
            }
        }
        assert_eq!(cache.get(&user), Some(Ok(())));
        assert!(cache.refused.len() <= 100, "{}", cache.refused.len());
    }

    #[test]
    fn answers_come_back_from_their_own_side() {
        let cache: ReviewCache<&str, u8, String> =
            ReviewCache::new(bound(10, MINUTE), bound(10, Duration::ZERO));
        cache.insert("yes", Ok(1));
        cache.insert("no", Err("denied".to_owned()));
        assert_eq!(cache.get(&"yes"), Some(Ok(1)));
        // The refused side has a zero TTL here: nothing kept.
        assert_eq!(cache.get(&"no"), None);
    }
}
