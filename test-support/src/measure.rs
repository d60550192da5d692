//! CPU and memory accounting from `/proc`, for the benches: the CPU time of
//! a process, of this one and of the whole machine, snapshots of them and
//! what was used between two, and latency percentiles.
//!
//! Unlike the rest of this crate these return errors rather than panic: a
//! bench reports them from `main`.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

/// Linux reports CPU time in ticks of this many per second (USER_HZ).
const TICKS_PER_SECOND: u64 = 100;

/// The CPUs this process may use (`nproc`), at least 1.
pub fn cpus() -> u32 {
    std::thread::available_parallelism()
        .ok()
        .and_then(|n| u32::try_from(n.get()).ok())
        .unwrap_or(1)
}

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// Sums `fields` of a `/proc/.../stat` file, in ticks; field 0 is the one
/// after the parenthesized command name (field 3, state, in proc(5)).
fn stat_ticks(stat_path: &str, fields: RangeInclusive<usize>) -> Result<u64> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let values: Vec<&str> = after_name.split_whitespace().collect();
    fields
        .map(|index| {
            values
                .get(index)
                .and_then(|value| value.parse::<u64>().ok())
        })
        .sum::<Option<u64>>()
        .with_context(|| format!("malformed {stat_path}"))
}

/// User plus system CPU time of all threads of a process (utime, stime;
/// fields 14 and 15 of proc(5)).
fn cpu_time(stat_path: &str) -> Result<Duration> {
    stat_ticks(stat_path, 11..=12).map(ticks)
}

/// CPU time of the process `pid`.
pub fn process_cpu_time(pid: u32) -> Result<Duration> {
    cpu_time(&format!("/proc/{pid}/stat"))
}

/// CPU time of this process.
pub fn own_cpu_time() -> Result<Duration> {
    cpu_time("/proc/self/stat")
}

/// CPU time of this process plus that of its children it has waited for
/// (utime, stime, cutime, cstime).
fn own_and_reaped_cpu_time() -> Result<Duration> {
    stat_ticks("/proc/self/stat", 11..=14).map(ticks)
}

/// Busy time of all CPUs of the machine (everything but idle and iowait).
pub fn machine_busy() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let totals: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("malformed /proc/stat")?;
    ensure!(totals.len() == 8, "malformed /proc/stat");
    // user nice system idle iowait irq softirq steal
    Ok(ticks(
        totals[0] + totals[1] + totals[2] + totals[5] + totals[6] + totals[7],
    ))
}

/// The machine's load averages over 1, 5 and 15 minutes (`uptime`'s),
/// from `/proc/loadavg`: runnable and waiting tasks, this process's too.
pub fn load_averages() -> Result<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let values: Vec<f64> = text
        .split_whitespace()
        .take(3)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("malformed /proc/loadavg")?;
    values.try_into().ok().context("malformed /proc/loadavg")
}

/// A `field` of `/proc/PID/status` in KiB, e.g. `VmRSS` (resident memory
/// now) or `VmHWM` (peak resident memory).
pub fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    kib_field(&format!("/proc/{pid}/status"), field)
}

/// A `field` of `/proc/meminfo` in KiB, e.g. `MemTotal`.
pub fn proc_meminfo_kib(field: &str) -> Result<u64> {
    kib_field("/proc/meminfo", field)
}

fn kib_field(path: &str, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in {path}"))
}

/// CPU times at one moment: the machine's, this process's and those of
/// the processes it was taken for.
pub struct CpuSnapshot {
    at: Instant,
    machine_busy: Duration,
    pids: Vec<u32>,
    /// Of `pids`, in their order.
    processes: Vec<Duration>,
    /// This process plus its children it has waited for.
    own: Duration,
}

impl CpuSnapshot {
    /// The CPU times now, of the machine, this process and `pids`.
    pub fn now(pids: &[u32]) -> Result<Self> {
        Ok(Self {
            at: Instant::now(),
            machine_busy: machine_busy()?,
            pids: pids.to_vec(),
            processes: pids
                .iter()
                .map(|pid| process_cpu_time(*pid))
                .collect::<Result<_>>()?,
            own: own_and_reaped_cpu_time()?,
        })
    }

    /// The CPU used from this snapshot until now, by the same processes.
    pub fn usage(&self) -> Result<CpuUsage> {
        let now = Self::now(&self.pids)?;
        let processes: Vec<Duration> = now
            .processes
            .iter()
            .zip(&self.processes)
            .map(|(after, before)| after.saturating_sub(*before))
            .collect();
        let own = now.own.saturating_sub(self.own);
        let ours = processes.iter().sum::<Duration>() + own;
        Ok(CpuUsage {
            elapsed: now.at - self.at,
            others: now
                .machine_busy
                .saturating_sub(self.machine_busy)
                .saturating_sub(ours),
            processes,
            own,
        })
    }
}

/// CPU used between two snapshots.
pub struct CpuUsage {
    pub elapsed: Duration,
    /// Per process the snapshot was taken for, in their order.
    pub processes: Vec<Duration>,
    /// This process plus its children it has waited for meanwhile.
    pub own: Duration,
    /// Everything else on the machine.
    pub others: Duration,
}

impl CpuUsage {
    /// How much other processes competed with the measured ones.
    pub fn other_load(&self) -> OtherLoad {
        OtherLoad {
            used: self.others,
            available: self.elapsed * cpus(),
        }
    }
}

/// Competition from other processes during a run: the CPU time they used
/// of the CPU time there was.
#[derive(Clone, Copy, Default)]
pub struct OtherLoad {
    pub used: Duration,
    pub available: Duration,
}

impl OtherLoad {
    /// `used` as a percentage of `available`.
    pub fn percent(&self) -> f64 {
        100.0 * self.used.as_secs_f64() / self.available.as_secs_f64().max(f64::EPSILON)
    }
}

impl std::iter::Sum for OtherLoad {
    fn sum<I: Iterator<Item = Self>>(loads: I) -> Self {
        loads.fold(Self::default(), |sum, load| Self {
            used: sum.used + load.used,
            available: sum.available + load.available,
        })
    }
}

/// Latency samples, sorted.
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Nearest-rank percentile, `p` in 0..=100; zero without samples.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    /// These samples and `other`'s, as one set.
    pub fn merge(self, other: Self) -> Self {
        let mut samples = self.0;
        samples.extend(other.0);
        Self::new(samples)
    }

    /// Every sample, shortest first.
    pub fn samples(&self) -> &[Duration] {
        &self.0
    }

    /// The largest sample; zero without samples.
    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}
