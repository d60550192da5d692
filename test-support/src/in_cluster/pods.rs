//! A pod's process and cgroups, read from the node (this machine): its
//! memory and CPU throttling, once or sampled while a bench runs.
//!
//! The cluster runs cgroup v1 with the kubelet's cgroupfs driver, so a
//! container's cgroups are `/sys/fs/cgroup/CONTROLLER/kubepods/[QOS/]podUID/ID`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

use crate::measure::proc_status_kib;
use crate::report::{mib, seconds};

/// One container's pod: the first container's process and cgroups.
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub ip: IpAddr,
    /// The container's main process, in this machine's PID namespace.
    pub pid: u32,
    memory: PathBuf,
    cpu: PathBuf,
}

/// A container's memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodMemory {
    /// The main process's resident set (`VmRSS`), in KiB.
    pub rss_kib: u64,
    /// Of it, anonymous memory (`RssAnon`: heap, stacks), in KiB; the rest
    /// is mapped files, mostly the binary.
    pub anon_kib: u64,
    /// The cgroup's working set, in KiB: `memory.usage_in_bytes` less
    /// `total_inactive_file`, what the kubelet (and `kubectl top`) reports
    /// and evicts by.
    pub working_set_kib: u64,
}

impl PodMemory {
    fn max(self, other: Self) -> Self {
        Self {
            rss_kib: self.rss_kib.max(other.rss_kib),
            anon_kib: self.anon_kib.max(other.anon_kib),
            working_set_kib: self.working_set_kib.max(other.working_set_kib),
        }
    }
}

impl Pod {
    /// A pod of `kubectl get pods -o json`, found on this node.
    pub(super) fn from_json(pod: &Value) -> Result<Self> {
        let name = pod["metadata"]["name"]
            .as_str()
            .context("a pod without a name")?
            .to_owned();
        let uid = pod["metadata"]["uid"]
            .as_str()
            .with_context(|| format!("pod {name} without a uid"))?;
        let ip = pod["status"]["podIP"]
            .as_str()
            .with_context(|| format!("pod {name} without an IP"))?
            .parse()
            .with_context(|| format!("pod {name}'s IP"))?;
        let container = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|id| id.split_once("://"))
            .map(|(_, id)| id)
            .with_context(|| format!("pod {name} without a container ID"))?;
        let memory = cgroup("memory", uid, container)?;
        let cpu = cgroup("cpu", uid, container)?;
        let procs = std::fs::read_to_string(memory.join("cgroup.procs"))
            .with_context(|| format!("reading {}/cgroup.procs", memory.display()))?;
        let pid = procs
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("no process in {}", memory.display()))?;
        Ok(Self {
            name,
            ip,
            pid,
            memory,
            cpu,
        })
    }

    /// The container's memory now.
    pub fn memory(&self) -> Result<PodMemory> {
        let usage = read_number(&self.memory.join("memory.usage_in_bytes"))?;
        let stat = self.memory.join("memory.stat");
        let inactive_file = std::fs::read_to_string(&stat)
            .with_context(|| format!("reading {}", stat.display()))?
            .lines()
            .find_map(|line| line.strip_prefix("total_inactive_file "))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .with_context(|| format!("no total_inactive_file in {}", stat.display()))?;
        Ok(PodMemory {
            rss_kib: proc_status_kib(self.pid, "VmRSS")?,
            anon_kib: proc_status_kib(self.pid, "RssAnon")?,
            working_set_kib: usage.saturating_sub(inactive_file) / 1024,
        })
    }

    /// How long the container's CPU limit has held it back so far
    /// (`throttled_time` of its `cpu.stat`).
    pub fn throttled(&self) -> Result<Duration> {
        let stat = self.cpu.join("cpu.stat");
        std::fs::read_to_string(&stat)
            .with_context(|| format!("reading {}", stat.display()))?
            .lines()
            .find_map(|line| line.strip_prefix("throttled_time "))
            .and_then(|value| value.trim().parse().ok())
            .map(Duration::from_nanos)
            .with_context(|| format!("no throttled_time in {}", stat.display()))
    }
}

/// The container's cgroup directory under `controller`, in whichever QoS
/// class the pod is.
fn cgroup(controller: &str, pod_uid: &str, container: &str) -> Result<PathBuf> {
    let root = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join("kubepods");
    ["", "burstable", "besteffort"]
        .iter()
        .map(|qos| root.join(qos).join(format!("pod{pod_uid}")).join(container))
        .find(|dir| dir.is_dir())
        .with_context(|| {
            format!(
                "no {controller} cgroup for container {container} of pod {pod_uid} under {}",
                root.display()
            )
        })
}

fn read_number(path: &Path) -> Result<u64> {
    std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{} is not a number", path.display()))
}

/// The peak memory of some pods while it runs, sampled on a thread.
pub struct MemoryWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<PodMemory>>>,
}

impl MemoryWatch {
    /// Samples `pods` every `every` until [`MemoryWatch::finish`].
    pub fn start(pods: &[Pod], every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pods = pods.to_vec();
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peaks = vec![PodMemory::default(); pods.len()];
            loop {
                // One last sample after the stop.
                let last = stopped.load(Ordering::Relaxed);
                for (peak, pod) in peaks.iter_mut().zip(&pods) {
                    *peak = peak.max(pod.memory()?);
                }
                if last {
                    return Ok(peaks);
                }
                std::thread::sleep(every);
            }
        });
        Self { stop, thread }
    }

    /// Each pod's peak of each measure since the start, in the pods' order.
    pub fn finish(self) -> Result<Vec<PodMemory>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the memory sampler panicked"))?
    }
}

/// Every pod's memory around a bench's load: at rest, its peak under the
/// load, and after.
pub struct MemoryRun {
    /// Each pod, with its role ("kplug", "plugin", "operator").
    pub pods: Vec<(&'static str, Pod)>,
    /// How long the pods had idled when `at_rest` was read, and how often
    /// `peak` was sampled.
    pub settle: Duration,
    pub every: Duration,
    pub at_rest: Vec<PodMemory>,
    pub peak: Vec<PodMemory>,
    pub after: Vec<PodMemory>,
}

impl MemoryRun {
    /// The Markdown section: what was read, and a table of the pods;
    /// `during` names the load, e.g. "the runs above".
    pub fn print(&self, during: &str) {
        println!(
            "Per container, read on the node: RSS is the main process's `VmRSS` \
             (`/proc/PID/status`), in brackets its anonymous part (`RssAnon`: heap and stacks; \
             the rest is mapped files, mostly the binary); the working set is the container's \
             cgroup v1 \
             `memory.usage_in_bytes` less its `total_inactive_file` \
             (`/sys/fs/cgroup/memory/kubepods/…/podUID/containerID/`), what the kubelet and \
             `kubectl top` report. At rest: after {} idle, before the load. Peak: the largest of \
             samples every {} through {during}. After: once the load ended.\n",
            seconds(self.settle),
            seconds(self.every),
        );
        println!(
            "| Pod | RSS (anonymous) at rest | RSS (anonymous) peak | RSS (anonymous) after | Working set at rest | Working set peak | Working set after |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let rows = self
            .pods
            .iter()
            .zip(&self.at_rest)
            .zip(self.peak.iter().zip(&self.after));
        for (((role, pod), rest), (peak, after)) in rows {
            let rss = |m: &PodMemory| {
                format!(
                    "{:.1} ({:.1}) MiB",
                    m.rss_kib as f64 / 1024.0,
                    m.anon_kib as f64 / 1024.0
                )
            };
            println!(
                "| {role} `{}` | {} | {} | {} | {} | {} | {} |",
                pod.name,
                rss(rest),
                rss(peak),
                rss(after),
                mib(rest.working_set_kib),
                mib(peak.working_set_kib),
                mib(after.working_set_kib),
            );
        }
        println!();
    }
}
