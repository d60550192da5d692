//! Durations as kplug's command lines and environment variables take them:
//! one parser for the server, the operator and the Rust SDK, so that `5s`
//! or `1h30m` means the same to every part of kplug.
//!
//! The form is Go's `time.ParseDuration`, which kube-apiserver's and
//! kubectl's flags take: decimal numbers with the units `ns`, `us` (`µs`),
//! `ms`, `s`, `m` and `h`, e.g. `250ms`, `1.5s`, `1h30m`. jiff reads them:
//! it is maintained, already in kplug's tree, and checks the arithmetic.
//! Around it, this module keeps what kplug's parsers accepted before it:
//! surrounding whitespace, a space before a unit (`5 s`), a number that
//! starts or ends with its decimal point (`.5s`, as Go and the Python SDK
//! take it), `0` alone, and in [`parse_or_seconds`] a bare number of
//! seconds, the Python SDK's form for the `KPLUG_*` variables both SDKs
//! read. Unlike Go, units go from largest to smallest, once each (jiff's
//! rule), and, unlike the operator's old parser, a negative duration is
//! refused instead of being taken as positive.

use std::borrow::Cow;
use std::time::Duration;

/// Go's units, the only ones taken: jiff alone would also read `5 minutes`,
/// `2 days` or ISO 8601's `PT5S`, which kplug's flags never took.
const UNITS: &[&str] = &["ns", "us", "µs", "μs", "ms", "s", "m", "h"];

/// Why a duration was refused. Every message starts with
/// `invalid duration "TEXT"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// A number without a unit where a unit is required.
    #[error("invalid duration {text:?}: missing unit (ns, us, ms, s, m or h)")]
    MissingUnit { text: String },
    /// A unit other than Go's.
    #[error("invalid duration {text:?}: unknown unit {unit:?} (ns, us, ms, s, m or h)")]
    UnknownUnit { text: String, unit: String },
    /// A duration before zero.
    #[error("invalid duration {text:?}: must not be negative")]
    Negative { text: String },
    /// Anything else; `reason` is jiff's account of it.
    #[error("invalid duration {text:?}: expected e.g. 500ms, 5s, 2m or 1h30m{reason}")]
    Malformed { text: String, reason: String },
}

/// Parses a Go-style duration (`250ms`, `1.5s`, `2m`, `1h30m`, or `0`).
///
/// # Errors
///
/// A [`DurationError`] naming what is wrong.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    parse_with(text, false)
}

/// Parses a Go-style duration as [`parse`] does, or a bare number of
/// seconds (`5`, `1.5`), as the SDKs take their flags and variables.
///
/// # Errors
///
/// A [`DurationError`] naming what is wrong.
pub fn parse_or_seconds(text: &str) -> Result<Duration, DurationError> {
    parse_with(text, true)
}

fn parse_with(text: &str, bare_seconds: bool) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let malformed = |reason: String| DurationError::Malformed {
        text: text.to_owned(),
        reason,
    };
    if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        // Go takes `0` alone; the SDKs take any number as seconds.
        if !(bare_seconds || trimmed == "0") {
            return Err(DurationError::MissingUnit {
                text: text.to_owned(),
            });
        }
        return trimmed
            .parse::<f64>()
            .ok()
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
            .ok_or_else(|| malformed(String::new()));
    }
    if let Some(unit) = trimmed
        .split(|c: char| !c.is_alphabetic())
        .find(|unit| !unit.is_empty() && !UNITS.contains(unit))
    {
        return Err(DurationError::UnknownUnit {
            text: text.to_owned(),
            unit: unit.to_owned(),
        });
    }
    // jiff knows the micro sign, not the Greek mu Go also takes.
    let spelled = with_digits_around_points(trimmed).replace('μ', "µ");
    let parsed = spelled
        .parse::<jiff::SignedDuration>()
        .map_err(|e| malformed(format!(" ({e})")))?;
    if parsed.is_negative() {
        return Err(DurationError::Negative {
            text: text.to_owned(),
        });
    }
    Duration::try_from(parsed).map_err(|e| malformed(format!(" ({e})")))
}

/// `.5s` as `0.5s` and `5.s` as `5.0s`: Go and the Python SDK take a number
/// that starts or ends with its decimal point, jiff wants digits on both
/// sides. A point with no digit on either side stays, for jiff to refuse.
fn with_digits_around_points(text: &str) -> Cow<'_, str> {
    if !text.contains('.') {
        return Cow::Borrowed(text);
    }
    let mut spelled = String::with_capacity(text.len() + 2);
    let mut previous: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '.' {
            let before = previous.is_some_and(|p| p.is_ascii_digit());
            let after = chars.peek().is_some_and(char::is_ascii_digit);
            if after && !before {
                spelled.push('0');
            }
            spelled.push('.');
            if before && !after {
                spelled.push('0');
            }
        } else {
            spelled.push(c);
        }
        previous = Some(c);
    }
    Cow::Owned(spelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What both forms take: every form the server's, the SDK's and the
    /// operator's own parsers took before, and Go's compound durations.
    #[test]
    fn go_style_durations() {
        for (text, expected) in [
            ("250ms", ms(250)),
            ("5s", ms(5_000)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("1.5s", ms(1_500)),
            ("1.5h", ms(5_400_000)),
            (".5s", ms(500)),
            ("5.s", ms(5_000)),
            (" 2m ", ms(120_000)),
            ("5 s", ms(5_000)),
            ("+5s", ms(5_000)),
            ("007s", ms(7_000)),
            ("1h30m", ms(5_400_000)),
            ("1h 30m", ms(5_400_000)),
            ("1m0.5s", ms(60_500)),
            ("0", ms(0)),
            ("0s", ms(0)),
            ("4ns", Duration::from_nanos(4)),
            ("2us", Duration::from_micros(2)),
            ("3µs", Duration::from_micros(3)),
            ("3μs", Duration::from_micros(3)),
            ("1.5ms", Duration::from_micros(1_500)),
        ] {
            assert_eq!(parse(text), Ok(expected), "{text:?}");
            assert_eq!(parse_or_seconds(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn bare_numbers_are_seconds_only_where_asked() {
        for (text, expected) in [
            ("5", ms(5_000)),
            ("1.5", ms(1_500)),
            (".5", ms(500)),
            ("5.", ms(5_000)),
            (" 30 ", ms(30_000)),
            ("0", ms(0)),
        ] {
            assert_eq!(parse_or_seconds(text), Ok(expected), "{text:?}");
            if text != "0" {
                assert_eq!(
                    parse(text),
                    Err(DurationError::MissingUnit {
                        text: text.to_owned()
                    }),
                    "{text:?}"
                );
            }
        }
        for text in [".", "1.2.3", "99999999999999999999999"] {
            assert!(
                matches!(parse_or_seconds(text), Err(DurationError::Malformed { .. })),
                "{text:?}"
            );
            assert!(
                matches!(parse(text), Err(DurationError::MissingUnit { .. })),
                "{text:?}"
            );
        }
    }

    #[test]
    fn refusals_say_why() {
        let refused = |text: &str| {
            let error = parse_or_seconds(text).expect_err(text);
            assert_eq!(parse(text).as_ref().err(), Some(&error), "{text:?}");
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("invalid duration {text:?}")),
                "{message}"
            );
            message
        };
        for (text, says) in [
            ("5d", "unknown unit \"d\""),
            ("5x", "unknown unit \"x\""),
            ("five", "unknown unit \"five\""),
            ("5 minutes", "unknown unit \"minutes\""),
            ("1e3", "unknown unit \"e\""),
            ("PT5S", "unknown unit \"PT\""),
            ("5S", "unknown unit \"S\""),
            ("-1s", "must not be negative"),
            ("", "expected e.g. 500ms"),
            ("  ", "expected e.g. 500ms"),
            ("s", "expected e.g. 500ms"),
            (".s", "expected e.g. 500ms"),
            ("1.2.3s", "expected e.g. 500ms"),
            ("1s1s", "expected e.g. 500ms"),
            ("99999999999999999999s", "expected e.g. 500ms"),
        ] {
            let message = refused(text);
            assert!(message.contains(says), "{text:?}: {message}");
        }
    }
}
