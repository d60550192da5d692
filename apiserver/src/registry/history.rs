//! The bounded window of recent change events that lets watches resume.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Event;

/// Recent events in resourceVersion order, oldest first.
#[derive(Debug)]
pub struct History {
    events: VecDeque<Arc<Event>>,
    capacity: usize,
    /// Highest resourceVersion whose event was dropped: a watch must start
    /// at or after it to miss nothing.
    compacted: u64,
}

/// A watch asked to resume from a resourceVersion whose later events are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// The oldest resourceVersion a watch can still resume from.
    pub oldest: u64,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            events: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
            compacted: 0,
        }
    }

    pub fn push(&mut self, event: Arc<Event>) {
        if self.events.len() == self.capacity
            && let Some(dropped) = self.events.pop_front()
        {
            self.compacted = dropped.resource_version;
        }
        self.events.push_back(event);
    }

    /// Every retained event newer than `resource_version`.
    pub fn since(&self, resource_version: u64) -> Result<Vec<Arc<Event>>, Expired> {
        if resource_version < self.compacted {
            return Err(Expired {
                oldest: self.compacted,
            });
        }
        let start = self
            .events
            .partition_point(|e| e.resource_version <= resource_version);
        Ok(self.events.range(start..).cloned().collect())
    }
}
