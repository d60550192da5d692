//! When the next heartbeat goes out: the registry's durations, backoff after
//! failures and jitter. Pure, so it is tested without a registry.

use std::time::Duration;

/// First retry delay after a failed heartbeat; doubles up to the interval.
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// Heartbeat intervals and retry delays vary by up to this fraction, so
/// plugins restarted together (or reconnecting after a registry restart) do
/// not keep hitting the registry in lockstep.
const JITTER: f64 = 0.1;

/// Registry durations that are absent, negative or zero mean "no opinion";
/// honouring a zero interval would spin.
pub(super) fn positive(duration: prost_types::Duration) -> Option<Duration> {
    Duration::try_from(duration).ok().filter(|d| !d.is_zero())
}

/// The delay after the `failures`-th failure in a row: doubling from
/// [`INITIAL_BACKOFF`], never beyond the heartbeat interval, so a recovered
/// registry hears from the plugin no later than from a healthy one.
pub(super) fn backoff(failures: u32, interval: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    INITIAL_BACKOFF.saturating_mul(factor).min(interval)
}

/// `duration` ± [`JITTER`].
pub(super) fn jitter(duration: Duration) -> Duration {
    let factor = 1.0 + JITTER * (2.0 * fastrand::f64() - 1.0);
    // Fails only for durations near Duration::MAX, which need no jitter.
    Duration::try_from_secs_f64(duration.as_secs_f64() * factor).unwrap_or(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_interval() {
        let interval = Duration::from_secs(5);
        let delays: Vec<_> = (1..=7).map(|n| backoff(n, interval)).collect();
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(
            delays,
            [
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000)
            ]
        );
        assert_eq!(backoff(u32::MAX, interval), interval);
        assert_eq!(backoff(1, ms(100)), ms(100));
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(10);
        for _ in 0..1000 {
            let d = jitter(base);
            assert!(
                (Duration::from_secs(9)..=Duration::from_secs(11)).contains(&d),
                "{d:?}"
            );
        }
        // Must not panic where scaling overflows.
        jitter(Duration::MAX);
    }

    #[test]
    fn registry_durations() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(
            positive(d(1, 500_000_000)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(positive(d(0, 0)), None);
        assert_eq!(positive(d(-1, 0)), None);
    }
}
