//! The fleet: one task per plugin, heartbeating as the SDK does (at the
//! interval the registry answers with, ±10 % jitter, failures retried with
//! a doubling backoff), over a few shared gRPC connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::Settings;
use crate::support::heartbeats::{declaration, lazy_registry_clients};
use crate::support::{Server, join_all};

/// Retries after a failure start this soon and double up to the interval
/// (the SDK's backoff).
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// Intervals vary by up to this fraction (the SDK's jitter).
const JITTER: f64 = 0.1;
/// A heartbeat gets at least this long to be answered (the SDK's floor).
const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Failure messages kept for the report.
const KEPT_ERRORS: usize = 10;

/// What the fleet saw, shared by its tasks and read by the monitor.
#[derive(Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    /// RPC failures and timeouts.
    pub failures: AtomicU64,
    /// Answers with `accepted: false`.
    pub refusals: AtomicU64,
    /// Plugins with at least one accepted heartbeat.
    pub registered: AtomicUsize,
    /// The longest time between two accepted heartbeats of one plugin, in
    /// microseconds: the registry marks a plugin late after two intervals.
    pub longest_gap_micros: AtomicU64,
    /// The first failures and refusals, described.
    pub errors: Mutex<Vec<String>>,
    /// The intervals the registry answered with (distinct).
    pub intervals: Mutex<Vec<Duration>>,
    /// Latencies of the accepted heartbeats since the monitor last took them.
    window: Mutex<Vec<Duration>>,
}

impl Stats {
    pub fn errors(&self) -> u64 {
        self.failures.load(Ordering::Relaxed) + self.refusals.load(Ordering::Relaxed)
    }

    pub fn longest_gap(&self) -> Duration {
        Duration::from_micros(self.longest_gap_micros.load(Ordering::Relaxed))
    }

    /// The latencies recorded since the last call.
    pub fn take_latencies(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.window.lock())
    }

    fn error(&self, counter: &AtomicU64, message: impl FnOnce() -> String) {
        counter.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock();
        if errors.len() < KEPT_ERRORS {
            errors.push(message());
        }
    }

    fn accepted(&self, latency: Duration, gap: Option<Duration>, interval: Duration) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.window.lock().push(latency);
        match gap {
            Some(gap) => {
                let micros = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
                self.longest_gap_micros.fetch_max(micros, Ordering::Relaxed);
            }
            None => {
                self.registered.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut intervals = self.intervals.lock();
        if !intervals.contains(&interval) {
            intervals.push(interval);
        }
    }
}

/// The running fleet: stopped by [`Fleet::stop`], or aborted when dropped.
pub struct Fleet {
    pub stats: Arc<Stats>,
    tasks: JoinSet<Result<()>>,
    stop: watch::Sender<bool>,
}

impl Fleet {
    /// Connects and starts `settings.plugins` plugins, their first
    /// heartbeats spread evenly over one interval (a fleet rolled out, not
    /// restarted at once), plugin `i` on connection `i % settings.connections`.
    pub async fn start(server: &Server, settings: &Settings) -> Result<Self> {
        let clients = lazy_registry_clients(server.grpc, settings.connections)?;
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let spread = settings.expected_interval();
        for index in 0..settings.plugins {
            let mut request = declaration(index, settings.interval);
            // As a StatefulSet names its first pod.
            request.instance = format!("{}-0", request.name);
            let first = spread.mul_f64(index as f64 / settings.plugins as f64);
            tasks.spawn(
                Plugin {
                    index,
                    client: clients[index % clients.len()].clone(),
                    request,
                    interval: spread,
                    stats: stats.clone(),
                    random: index as u64,
                }
                .run(first, stopped.clone()),
            );
        }
        Ok(Self { stats, tasks, stop })
    }

    /// Stops every plugin after its heartbeat in flight, if any; fails if a
    /// plugin's task did.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(true);
        join_all(self.tasks).await.map(drop)
    }
}

/// One plugin instance.
struct Plugin {
    index: usize,
    client: RegistryClient<Channel>,
    request: HeartbeatRequest,
    /// The registry's answer, or what is expected until it answers.
    interval: Duration,
    stats: Arc<Stats>,
    /// State of the jitter's generator (splitmix64), seeded per plugin so
    /// that runs repeat.
    random: u64,
}

impl Plugin {
    async fn run(mut self, first: Duration, mut stopped: watch::Receiver<bool>) -> Result<()> {
        let mut delay = first;
        let mut failures = 0u32;
        let mut last_accepted: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = stopped.changed() => return Ok(()),
                () = tokio::time::sleep(delay) => {}
            }
            let sent = Instant::now();
            let timeout = self.interval.max(MIN_TIMEOUT);
            let call = self.client.heartbeat(self.request.clone());
            let outcome = tokio::time::timeout(timeout, call).await;
            let answered = Instant::now();
            let index = self.index;
            let accepted = match outcome {
                Ok(Ok(reply)) => {
                    let reply = reply.into_inner();
                    if let Some(interval) = reply.interval.and_then(|d| Duration::try_from(d).ok())
                        && !interval.is_zero()
                    {
                        self.interval = interval;
                    }
                    if !reply.accepted {
                        self.stats.error(&self.stats.refusals, || {
                            format!(
                                "plugin {index}: refused: {}: {}",
                                reply.reason, reply.message
                            )
                        });
                    }
                    reply.accepted
                }
                Ok(Err(status)) => {
                    self.stats.error(&self.stats.failures, || {
                        format!("plugin {index}: {:?}: {}", status.code(), status.message())
                    });
                    false
                }
                Err(_) => {
                    self.stats.error(&self.stats.failures, || {
                        format!("plugin {index}: no answer within {timeout:?}")
                    });
                    false
                }
            };
            delay = if accepted {
                let gap = last_accepted.map(|last| answered - last);
                self.stats.accepted(answered - sent, gap, self.interval);
                last_accepted = Some(answered);
                failures = 0;
                self.jitter(self.interval)
            } else {
                failures += 1;
                let factor = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
                self.jitter(INITIAL_BACKOFF.saturating_mul(factor).min(self.interval))
            };
        }
    }

    /// `duration` ± [`JITTER`].
    fn jitter(&mut self, duration: Duration) -> Duration {
        // splitmix64
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        duration.mul_f64(1.0 + JITTER * (2.0 * unit - 1.0))
    }
}
