//! When a call must give up: the caller's `grpc-timeout` header or the
//! request's own timeout, less a margin. Pure.

use std::time::Duration;

use tokio::time::Instant;

/// A call is cut off this much before the caller's deadline, so that
/// `DEADLINE_EXCEEDED` reaches the caller while it still listens, and
/// before tonic's own timer (which starts a moment earlier) answers
/// `CANCELLED` instead. A tenth of the timeout, within these bounds.
const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(2);
const MAX_DEADLINE_MARGIN: Duration = Duration::from_millis(20);

/// The shorter of two optional timeouts.
pub(super) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When to give up on a call that arrived at `arrival` with `timeout`;
/// `None` when that lies beyond what `Instant` can represent.
pub(super) fn deadline(arrival: Instant, timeout: Duration) -> Option<Instant> {
    let margin = (timeout / 10).clamp(MIN_DEADLINE_MARGIN, MAX_DEADLINE_MARGIN);
    arrival.checked_add(timeout.saturating_sub(margin))
}

/// Parses a `grpc-timeout` header: up to 8 digits and a unit, e.g. `100m`.
pub(super) fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    let (&unit, digits) = text.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Eight digits fit any unit below without overflow.
    let value: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(value * 3600),
        b'M' => Duration::from_secs(value * 60),
        b'S' => Duration::from_secs(value),
        b'm' => Duration::from_millis(value),
        b'u' => Duration::from_micros(value),
        b'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        for bad in ["", "S", "123456789S", "10x", "-1S", "1.5S", "10é", "é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn deadlines_leave_a_margin() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            Some(now + Duration::from_millis(980))
        );
        assert_eq!(
            deadline(now, Duration::from_millis(100)),
            Some(now + Duration::from_millis(90))
        );
        assert_eq!(deadline(now, Duration::from_millis(1)), Some(now));
        assert_eq!(deadline(now, Duration::MAX), None);
        assert_eq!(
            shorter(Some(Duration::from_secs(2)), Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            shorter(None, Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(shorter(None, None), None);
    }
}
