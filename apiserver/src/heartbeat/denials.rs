//! A bound on what one identity's refused heartbeats cost kube-apiserver.
//!
//! In cluster mode every heartbeat under a plugin name kplug has no cached
//! decision for is one SubjectAccessReview. A plugin (or any pod with a
//! ServiceAccount token) that heartbeats under name after name it may not
//! use would make kplug send reviews at its own rate. Past [`LIMIT`]
//! denials within [`WINDOW`], an identity's heartbeats under names without
//! a cached decision are refused without a review until the window ends;
//! names it is allowed and kplug has cached go on being accepted, and
//! other identities are untouched.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Denials an identity may cost kube-apiserver per window. A plugin whose
/// RBAC is wrong is denied once per heartbeat interval (the denial is
/// cached for `--authorization-cache-ttl-denied`, 10 s by default): far
/// fewer.
pub const LIMIT: u32 = 20;
pub const WINDOW: Duration = Duration::from_secs(10);
/// Beyond this many identities tracked, windows that ended are dropped.
const PRUNE_ABOVE: usize = 1024;

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    denied: u32,
}

/// Recent denials, by identity.
#[derive(Default)]
pub struct Denials {
    windows: Mutex<HashMap<String, Window>>,
}

impl Denials {
    /// When `identity`'s window ends, if it is over the limit at `now`.
    pub fn over(&self, identity: &str, now: Instant) -> Option<Instant> {
        let windows = self.windows.lock();
        let window = windows.get(identity)?;
        let ends = window.started + WINDOW;
        (now < ends && window.denied >= LIMIT).then_some(ends)
    }

    /// Counts a denial of `identity` at `now`.
    pub fn record(&self, identity: &str, now: Instant) {
        let mut windows = self.windows.lock();
        if windows.len() > PRUNE_ABOVE {
            windows.retain(|_, window| now < window.started + WINDOW);
        }
        let window = windows.entry(identity.to_owned()).or_insert(Window {
            started: now,
            denied: 0,
        });
        if now >= window.started + WINDOW {
            *window = Window {
                started: now,
                denied: 0,
            };
        }
        window.denied = window.denied.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_over_the_limit_until_its_window_ends() {
        let denials = Denials::default();
        let start = Instant::now();
        for _ in 0..LIMIT - 1 {
            denials.record("hostile", start);
        }
        assert_eq!(denials.over("hostile", start), None);
        denials.record("hostile", start);
        assert_eq!(denials.over("hostile", start), Some(start + WINDOW));
        assert_eq!(denials.over("neighbour", start), None, "others untouched");
        assert_eq!(
            denials.over("hostile", start + WINDOW),
            None,
            "a new window"
        );
        denials.record("hostile", start + WINDOW);
        assert_eq!(denials.over("hostile", start + WINDOW), None);
    }

    #[test]
    fn ended_windows_are_dropped_once_many_are_tracked() {
        let denials = Denials::default();
        let start = Instant::now();
        for i in 0..=PRUNE_ABOVE {
            denials.record(&format!("identity-{i}"), start);
        }
        denials.record("late", start + WINDOW);
        assert_eq!(denials.windows.lock().len(), 1);
    }
}
