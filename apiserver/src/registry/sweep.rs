//! The sweep: marks instances that stopped heartbeating not Ready, expires
//! them after their TTL, and the plugin with its last instance.

use std::sync::atomic::Ordering;

use jiff::Timestamp;

use super::{Instance, LATE_AFTER_INTERVALS, Registry, signed};

impl Registry {
    fn expired(&self, instance: &Instance, now: Timestamp) -> bool {
        now.duration_since(instance.last_seen()) >= signed(self.ttl(instance.declaration.interval))
    }

    fn late(&self, instance: &Instance, now: Timestamp) -> bool {
        instance.on_time
            && now.duration_since(instance.last_seen())
                >= signed(instance.declaration.interval * LATE_AFTER_INTERVALS)
    }

    /// Marks late instances not Ready and garbage-collects expired ones,
    /// each on its own clock. Returns how many plugins were removed (their
    /// last instance expired).
    pub fn sweep(&self, now: Timestamp) -> usize {
        let due: Vec<String> = {
            let state = self.state.read();
            state
                .plugins
                .iter()
                .filter(|(_, entry)| {
                    entry
                        .instances
                        .iter()
                        .any(|i| self.late(i, now) || self.expired(i, now))
                })
                .map(|(name, _)| name.clone())
                .collect()
        };
        if due.is_empty() {
            return 0;
        }
        let mut state = self.state.write();
        let state = &mut *state;
        let mut removed = 0;
        for name in due {
            // Re-checked under the write lock: a heartbeat may have arrived.
            let Some(entry) = state.plugins.get_mut(&name) else {
                continue;
            };
            let Some(expired) = entry.instances.retain(|i| !self.expired(i, now)) else {
                tracing::info!(plugin = %name, "plugin expired: no heartbeat within its TTL");
                self.remove(state, &name);
                self.expired.fetch_add(1, Ordering::Relaxed);
                removed += 1;
                continue;
            };
            if expired > 0 {
                tracing::info!(plugin = %name, expired, "plugin instances expired: no heartbeat within their TTL");
            }
            let mut late = 0;
            for instance in entry.instances.iter_mut() {
                if self.late(instance, now) {
                    instance.on_time = false;
                    late += 1;
                }
            }
            if late > 0 {
                tracing::info!(plugin = %name, late, "plugin instance heartbeats late: marking them not Ready");
            }
            if expired > 0 || late > 0 {
                self.modify(state, &name, now);
            }
        }
        removed
    }
}
