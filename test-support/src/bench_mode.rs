//! Whether a bench binary was started to measure or to be checked.
//!
//! `cargo bench` passes `--bench` to a bench built without libtest's
//! harness; `cargo test --bench NAME` passes nothing. Like criterion's
//! benches, ours measure only when given `--bench` (and not `--test`, which
//! `cargo bench -- --test` adds); otherwise they check themselves: every
//! phase runs, at counts too small to measure anything, and every check a
//! phase makes still fails the run. That keeps a bench that the test suite
//! cannot afford at full size (minutes of measuring, a release build)
//! working.

/// How the bench was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    /// By `cargo bench`: the figures are the result.
    Measure,
    /// By `cargo test`: the run is the result; the figures mean nothing.
    Check,
}

impl BenchMode {
    /// The mode this process's arguments ask for.
    pub fn from_args() -> Self {
        Self::of(std::env::args().skip(1))
    }

    fn of(args: impl IntoIterator<Item = String>) -> Self {
        let (mut bench, mut test) = (false, false);
        for arg in args {
            bench |= arg == "--bench";
            test |= arg == "--test";
        }
        if bench && !test {
            Self::Measure
        } else {
            Self::Check
        }
    }

    /// `measure` when measuring, `check` when checking.
    pub fn pick<T>(self, measure: T, check: T) -> T {
        match self {
            Self::Measure => measure,
            Self::Check => check,
        }
    }

    /// What a report says above its figures when they measure nothing; `None`
    /// when measuring.
    pub fn warning(self) -> Option<&'static str> {
        match self {
            Self::Measure => None,
            Self::Check => Some(
                "> **A check run** (`cargo test`, not `cargo bench`): every phase ran at counts \
                 too small to measure anything, in whatever build `cargo test` made. None of \
                 these figures is a measurement.\n",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BenchMode;

    fn mode(args: &[&str]) -> BenchMode {
        BenchMode::of(args.iter().map(|arg| (*arg).to_owned()))
    }

    #[test]
    fn measures_only_when_cargo_bench_started_it() {
        assert_eq!(mode(&["--bench"]), BenchMode::Measure);
        assert_eq!(mode(&["--bench", "--nocapture"]), BenchMode::Measure);
        // `cargo test --bench NAME`, a direct start, `cargo bench -- --test`.
        assert_eq!(mode(&[]), BenchMode::Check);
        assert_eq!(mode(&["--nocapture"]), BenchMode::Check);
        assert_eq!(mode(&["--bench", "--test"]), BenchMode::Check);
    }

    #[test]
    fn picks_by_mode() {
        assert_eq!(BenchMode::Measure.pick(1_000, 10), 1_000);
        assert_eq!(BenchMode::Check.pick(1_000, 10), 10);
        assert!(BenchMode::Measure.warning().is_none());
        assert!(BenchMode::Check.warning().is_some());
    }
}
