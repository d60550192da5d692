//! The Markdown helpers of the bench reports: number formatting and the
//! description of the machine a report was measured on.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::measure::{OtherLoad, cpus, proc_meminfo_kib};

/// Milliseconds with `decimals` decimals: "1.23 ms".
pub fn ms(duration: Duration, decimals: usize) -> String {
    format!("{:.*} ms", decimals, duration.as_secs_f64() * 1000.0)
}

/// Seconds with two decimals: "1.23 s".
pub fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

/// Whole microseconds, with thousands separators: "12,345 µs".
pub fn micros(duration: Duration) -> String {
    format!(
        "{} µs",
        thousands(duration.as_secs_f64().mul_add(1e6, 0.5) as usize)
    )
}

/// KiB as MiB with one decimal: "1.5 MiB".
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// A size in bytes: "1.50 MiB" from 1 MiB up, else "12.3 KiB".
pub fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// 12345 → "12,345".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Whether a target was met, as a report's cell: "met" or "**missed**".
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// The "Machine" section of a report: CPU, memory, kernel, competition
/// from other processes, the binaries measured and the command.
pub struct Machine<'a> {
    /// The section's heading, e.g. "## Machine".
    pub heading: &'a str,
    /// What shared the CPUs, e.g. "the server and the load generator".
    pub shared_by: &'a str,
    /// Whether to list the machine's memory.
    pub memory: bool,
    /// Items after the kernel, before the competition.
    pub notes: &'a [String],
    /// The competition from other processes, and during what, e.g. "the run".
    pub others: (OtherLoad, &'a str),
    /// Items after the competition, before the binaries.
    pub details: &'a [String],
    /// The binaries measured, as (role, path).
    pub binaries: &'a [(&'a str, &'a Path)],
    /// Appended to each binary's item, e.g. " (release build)".
    pub binary_note: &'a str,
    /// The command that produced the report.
    pub command: &'a str,
}

impl Machine<'_> {
    /// Prints the section to stdout, reading the machine from `/proc`.
    pub fn print(&self) -> Result<()> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
        let model = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown", |(_, model)| model.trim());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .context("reading the kernel release")?;
        let memory = if self.memory {
            Some(proc_meminfo_kib("MemTotal")?)
        } else {
            None
        };
        println!("{}\n", self.heading);
        println!(
            "- CPU: {model}, {} CPUs (`nproc`), shared by {}",
            cpus(),
            self.shared_by
        );
        if let Some(memory) = memory {
            println!("- Memory: {}", mib(memory));
        }
        println!("- Kernel: Linux {}", kernel.trim());
        for note in self.notes {
            println!("- {note}");
        }
        let (others, during) = &self.others;
        println!(
            "- Other processes used {:.1} of the {:.1} CPU-seconds there were during {during} \
             ({:.0} %)",
            others.used.as_secs_f64(),
            others.available.as_secs_f64(),
            others.percent(),
        );
        for detail in self.details {
            println!("- {detail}");
        }
        for (role, binary) in self.binaries {
            println!("- {role}: `{}`{}", binary.display(), self.binary_note);
        }
        println!("- Command: `{}`", self.command);
        println!();
        Ok(())
    }
}
