//! Leader election: replicas wait for the Lease; the holder runs the
//! controller until shutdown or until it loses the Lease, then releases it
//! so that another replica takes over at once.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{self, Either};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing::info;

use crate::Error;
use crate::config::LeaderElection;
use crate::metrics::Metrics;

/// Resolves when the receiver reads `want` (or the sender is gone).
async fn until(receiver: &mut watch::Receiver<bool>, want: bool) {
    let _ = receiver.wait_for(|leading| *leading == want).await;
}

/// Runs `work(stop)` while this replica holds the Lease; `stop` resolves on
/// shutdown or when the Lease is lost.
pub async fn run_as_leader<W, F>(
    client: Client,
    election: &LeaderElection,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
    work: W,
) -> Result<(), Error>
where
    W: FnOnce(future::BoxFuture<'static, ()>) -> F,
    F: Future<Output = ()>,
{
    let seconds = election
        .lease_duration
        .max(Duration::from_secs(2))
        .as_secs();
    let manager = LeaseManagerBuilder::new(client, &election.lease_name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(seconds)
        // Renew a third of the way before the end.
        .with_grace((seconds / 3).max(1))
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    metrics.leading(&election.lease_name, false);
    let shutdown = shutdown.shared();
    info!(lease = %election.lease_name, namespace = %election.namespace, identity = %election.identity, "waiting to lead");
    let shut_down_first = matches!(
        future::select(shutdown.clone(), Box::pin(until(&mut leading, true))).await,
        Either::Left(_)
    );
    let became_leader = !shut_down_first && *leading.borrow();
    let mut lost = false;
    if became_leader {
        info!(lease = %election.lease_name, identity = %election.identity, "became the leader");
        metrics.leading(&election.lease_name, true);
        let mut watching = leading.clone();
        let lost_lease = async move { until(&mut watching, false).await };
        let stop = future::select(shutdown.clone(), Box::pin(lost_lease))
            .map(|_| ())
            .boxed();
        work(stop).await;
        metrics.leading(&election.lease_name, false);
        lost = !*leading.borrow();
    }
    // Dropping the receiver ends the manager's task, which releases the Lease.
    drop(leading);
    if let Ok(Err(error)) = task.await {
        let error = crate::words::lease_error(&error);
        tracing::warn!(%error, "releasing the Lease");
    }
    if lost {
        return Err(Error::LostLeadership(election.lease_name.clone()));
    }
    Ok(())
}
