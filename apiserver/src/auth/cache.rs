//! A small time-bounded cache for review decisions.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Entries expire after the TTL given at insertion; the map never holds
/// more than `capacity` entries (expired ones go first, then everything).
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The live value for `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock();
        let (expires, value) = entries.get(key)?;
        (Instant::now() < *expires).then(|| value.clone())
    }

    /// Keeps `value` for `ttl`; a zero TTL keeps nothing.
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_capacity_is_bounded() {
        let cache = TtlCache::new(2);
        cache.insert("a", 1, Duration::from_secs(60));
        assert_eq!(cache.get(&"a"), Some(1));
        cache.insert("gone", 2, Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cache.get(&"gone"), None);
        cache.insert("b", 3, Duration::from_secs(60));
        cache.insert("c", 4, Duration::from_secs(60));
        assert!(cache.entries.lock().len() <= 2);
        cache.insert("zero", 5, Duration::ZERO);
        assert_eq!(cache.get(&"zero"), None);
    }
}
