//! Which instance of a plugin takes a call, and whether a failed call may
//! go to another.
//!
//! Calls go to the Ready instances (heartbeating on time, not draining) of
//! the Plugin object the request selected: the least busy one, ties broken
//! round-robin from a rotating start so that idle instances share the calls.
//! The in-flight bound (`--max-inflight-per-plugin`) holds per instance, as
//! each is a process with its own capacity; a call is refused as busy only
//! when every Ready instance is full.
//!
//! A call that failed before the plugin could have seen it (see
//! [`undelivered`]) is tried once more on another Ready instance, so that
//! rolling a Deployment pod by pod loses no call. A call that may have run
//! is never repeated: the failure goes back to the caller.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::OwnedSemaphorePermit;

use super::{Proxy, ProxyError, Upstream};
use crate::v1alpha1::{Plugin, PluginInstance};

/// An instance chosen for a call, with its channel and its in-flight slot.
pub(super) struct Chosen {
    /// Its position in the list it was chosen from.
    pub(super) index: usize,
    pub(super) upstream: Upstream,
    pub(super) permit: OwnedSemaphorePermit,
}

/// The instances of `plugin` that take calls, shadows too (a call's
/// [`Route`](super::Route) picks the side). An object without instances
/// (from a server before instances) is its `spec.address`, in `fallback`.
pub(super) fn serving<'p>(
    plugin: &'p Plugin,
    fallback: &'p mut Option<PluginInstance>,
) -> Vec<&'p PluginInstance> {
    if plugin.status.instances.is_empty() {
        let instance = fallback.insert(PluginInstance {
            name: plugin.spec.address.clone(),
            address: plugin.spec.address.clone(),
            server_name: String::new(),
            version: plugin.spec.version.clone(),
            ready: plugin.is_ready(),
            draining: false,
            last_heartbeat_time: plugin.status.last_heartbeat_time.clone(),
            canary_weight: 0,
            shadow_percent: 0,
        });
        return vec![instance];
    }
    plugin.status.ready_instances().collect()
}

impl Proxy {
    /// The least busy of `instances` except `exclude`, with a slot for one
    /// call.
    pub(super) fn choose(
        &self,
        plugin: &str,
        instances: &[&PluginInstance],
        exclude: Option<usize>,
    ) -> Result<Chosen, ProxyError> {
        let busy = || ProxyError::Busy {
            plugin: plugin.to_owned(),
            limit: self.config.max_in_flight,
        };
        // One instance, the usual case: nothing to compare.
        if let ([instance], None) = (instances, exclude) {
            let upstream = self.upstream(plugin, instance)?;
            let permit = upstream
                .in_flight
                .clone()
                .try_acquire_owned()
                .map_err(|_| busy())?;
            return Ok(Chosen {
                index: 0,
                upstream,
                permit,
            });
        }
        let count = instances.len();
        let start = self.rotation.fetch_add(1, Ordering::Relaxed);
        let mut candidates = Vec::with_capacity(count);
        let mut invalid = None;
        for offset in 0..count {
            let index = start.wrapping_add(offset) % count;
            if Some(index) == exclude {
                continue;
            }
            let Some(instance) = instances.get(index) else {
                continue;
            };
            match self.upstream(plugin, instance) {
                Ok(upstream) => {
                    let load = self
                        .config
                        .max_in_flight
                        .saturating_sub(upstream.in_flight.available_permits());
                    candidates.push((load, index, upstream));
                }
                Err(error) => invalid = Some(error),
            }
        }
        if candidates.is_empty() {
            return Err(invalid.unwrap_or_else(busy));
        }
        // Stable: among equally loaded instances the rotation decides.
        candidates.sort_by_key(|(load, _, _)| *load);
        for (_, index, upstream) in candidates {
            if let Ok(permit) = Arc::clone(&upstream.in_flight).try_acquire_owned() {
                return Ok(Chosen {
                    index,
                    upstream,
                    permit,
                });
            }
        }
        Err(busy())
    }
}

/// Whether `status` proves that the call never reached the plugin's code,
/// so that another instance may take it without running it twice:
///
/// - no connection could be made (refused, unreachable, timed out);
/// - the request was never handed to a connection (hyper cancels the
///   requests it queued for a connection that closed);
/// - the plugin refused the stream with `REFUSED_STREAM`, which HTTP/2
///   defines as "before performing any application processing";
/// - the plugin's `GOAWAY` left the stream out (its last stream id is
///   below it), or came before the request was sent.
///
/// A connection that breaks once the request was sent, a keep-alive
/// timeout and any status the plugin answered with, `UNAVAILABLE`
/// included, do not qualify: the plugin may have acted on the call.
pub(super) fn undelivered(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            let refused = h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            return h2.is_remote() && (refused || h2.is_go_away());
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>()
            && hyper.is_canceled()
        {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
#[path = "balance_tests.rs"]
mod tests;
