//! Running the measurement from inside the client pod's network namespace.
//!
//! `setns(CLONE_NEWNET)` moves only the calling thread, and a thread takes
//! its namespaces from the thread that creates it. So the work runs on a
//! thread of its own that enters the pod's namespace first and only then
//! creates whatever else it needs (the tokio runtime and its workers): every
//! socket of the measurement is opened in the pod's namespace, none on the
//! node's. The process stays one process, with its CPU time in
//! `/proc/self/stat` as before; its threads are in the pod's network
//! namespace, not in the pod's cgroups, so the pod's limits do not apply.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use anyhow::{Context, Result, anyhow, ensure};
use kplug_test_support::in_cluster::Pod;
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// `work` on a new thread inside `pod`'s network namespace; its result.
pub(super) fn run_in<T: Send>(pod: &Pod, work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let path = format!("/proc/{}/ns/net", pod.pid);
    let namespace = File::open(&path).with_context(|| format!("opening {path}"))?;
    let inode = namespace
        .metadata()
        .with_context(|| format!("reading {path}"))?
        .ino();
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(format!("in-{}", pod.name))
            .spawn_scoped(scope, move || {
                move_into_link_name_space(namespace.as_fd(), Some(LinkNameSpaceType::Network))
                    .with_context(|| format!("entering the network namespace {path}"))?;
                // The namespace this thread is in now, as the kernel sees it.
                let own = std::fs::metadata("/proc/thread-self/ns/net")
                    .context("reading /proc/thread-self/ns/net")?
                    .ino();
                ensure!(
                    own == inode,
                    "still outside pod {}'s network namespace after setns",
                    pod.name
                );
                work()
            })
            .context("starting the thread for the pod's network namespace")?;
        thread.join().map_err(|_| {
            anyhow!(
                "the thread in pod {}'s network namespace panicked",
                pod.name
            )
        })?
    })
}
