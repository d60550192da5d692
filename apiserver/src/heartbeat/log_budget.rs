//! A bound on the log lines refused heartbeats write.
//!
//! Every refused heartbeat is worth a line to the person reading kplug's
//! log, until a plugin (or anything that reaches the registry port) sends
//! thousands a second: then the lines cost more than the refusals. Within
//! each [`WINDOW`] the first [`LINES`] refusals are logged; the rest are
//! only counted, and the next line logged says how many were left out.
//! The `kplug_heartbeats_total` metric counts every one by answer.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub const WINDOW: Duration = Duration::from_secs(10);
pub const LINES: u32 = 20;

/// Whether to write the line for one refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it; `left_out` refusals before it were not logged.
    Log { left_out: u64 },
    /// Leave it out: the window's lines are spent.
    LeaveOut,
}

struct Spent {
    started: Instant,
    lines: u32,
    left_out: u64,
}

/// Log lines left in the current window.
pub struct LogBudget {
    spent: Mutex<Spent>,
}

impl LogBudget {
    pub fn new(now: Instant) -> Self {
        Self {
            spent: Mutex::new(Spent {
                started: now,
                lines: 0,
                left_out: 0,
            }),
        }
    }

    /// Spends a line at `now`, if one is left.
    pub fn spend(&self, now: Instant) -> Verdict {
        let mut spent = self.spent.lock();
        if now >= spent.started + WINDOW {
            spent.started = now;
            spent.lines = 0;
        }
        if spent.lines < LINES {
            spent.lines += 1;
            Verdict::Log {
                left_out: std::mem::take(&mut spent.left_out),
            }
        } else {
            spent.left_out = spent.left_out.saturating_add(1);
            Verdict::LeaveOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_logs_its_lines_and_the_next_says_how_many_were_left_out() {
        let start = Instant::now();
        let budget = LogBudget::new(start);
        for _ in 0..LINES {
            assert_eq!(budget.spend(start), Verdict::Log { left_out: 0 });
        }
        for _ in 0..1000 {
            assert_eq!(budget.spend(start + WINDOW / 2), Verdict::LeaveOut);
        }
        let next = start + WINDOW;
        assert_eq!(budget.spend(next), Verdict::Log { left_out: 1000 });
        assert_eq!(budget.spend(next), Verdict::Log { left_out: 0 });
    }
}
