//! The W3C trace context (`traceparent`) that travels with a reconcile: as an
//! HTTP header from an operator to kplug, and as gRPC metadata from kplug to
//! the plugin. kplug exports no spans; it only carries the context so every
//! hop can log the same trace id. A full OpenTelemetry pipeline is not needed
//! for that, and the header is a fixed 55-character format
//! (<https://www.w3.org/TR/trace-context/#traceparent-header>).

use std::fmt;
use std::str::FromStr;

/// The header and gRPC metadata key.
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent`: which trace, which span is the caller, and the
/// caller's flags (bit 0: sampled).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

/// Why a `traceparent` value was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    #[error("traceparent must be version-traceid-parentid-flags in lowercase hex")]
    Malformed,
    #[error("traceparent version ff is invalid")]
    InvalidVersion,
    #[error("traceparent trace-id and parent-id must not be all zeros")]
    ZeroId,
}

impl TraceParent {
    /// A new trace, sampled, with random ids: what the first hop starts
    /// when its caller sent none.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero_random(),
            parent_id: nonzero_random(),
            flags: 0x01,
        }
    }

    /// The same trace seen from a new span of this hop, to send downstream.
    pub fn child(&self) -> Self {
        Self {
            parent_id: nonzero_random(),
            ..*self
        }
    }

    /// The trace id as 32 lowercase hex digits, as logs show it.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The caller's span id as 16 lowercase hex digits.
    pub fn parent_id(&self) -> String {
        hex(&self.parent_id)
    }

    pub fn sampled(&self) -> bool {
        self.flags & 0x01 == 0x01
    }
}

impl FromStr for TraceParent {
    type Err = TraceParentError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim_matches([' ', '\t']);
        let mut fields = value.splitn(5, '-');
        let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(TraceParentError::Malformed);
        };
        let version: [u8; 1] = parse_hex(version)?;
        let trace_id: [u8; 16] = parse_hex(trace_id)?;
        let parent_id: [u8; 8] = parse_hex(parent_id)?;
        let flags_field = flags;
        let [flags] = parse_hex::<1>(flags_field)?;
        match (version[0], fields.next()) {
            (0xff, _) => return Err(TraceParentError::InvalidVersion),
            // Version 00 has exactly four fields; later versions may append
            // more after a dash, which a version-00 reader ignores.
            (0x00, Some(_)) => return Err(TraceParentError::Malformed),
            _ => {}
        }
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return Err(TraceParentError::ZeroId);
        }
        Ok(Self {
            trace_id,
            parent_id,
            flags,
        })
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::with_capacity(55);
        text.push_str("00-");
        push_hex(&mut text, &self.trace_id);
        text.push('-');
        push_hex(&mut text, &self.parent_id);
        text.push('-');
        push_hex(&mut text, &[self.flags]);
        f.write_str(&text)
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

fn parse_hex<const N: usize>(field: &str) -> Result<[u8; N], TraceParentError> {
    let digits = field.as_bytes();
    if digits.len() != 2 * N {
        return Err(TraceParentError::Malformed);
    }
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Ok(bytes)
}

/// Lowercase only: the specification forbids uppercase hex.
fn nibble(digit: u8) -> Result<u8, TraceParentError> {
    match digit {
        b'0'..=b'9' => Ok(digit - b'0'),
        b'a'..=b'f' => Ok(digit - b'a' + 10),
        _ => Err(TraceParentError::Malformed),
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    push_hex(&mut text, bytes);
    text
}

/// Lowercase hex, without a formatting call per byte: kplug makes these
/// on every reconcile.
fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

fn nonzero_random<const N: usize>() -> [u8; N] {
    loop {
        let mut bytes = [0; N];
        bytes.fill_with(|| fastrand::u8(..));
        if bytes != [0; N] {
            return bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_specification_example() {
        let parsed: TraceParent = EXAMPLE.parse().expect("valid");
        assert_eq!(parsed.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.parent_id(), "00f067aa0ba902b7");
        assert!(parsed.sampled());
        assert_eq!(parsed.to_string(), EXAMPLE);
    }

    #[test]
    fn later_versions_may_carry_more_fields() {
        let parsed: TraceParent =
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-the-future-holds"
                .parse()
                .expect("a version-00 reader accepts a later version's prefix");
        assert!(!parsed.sampled());
        assert_eq!(
            parsed.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
    }

    #[test]
    fn rejects_what_the_specification_rejects() {
        let cases = [
            ("", TraceParentError::Malformed),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                TraceParentError::Malformed,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                TraceParentError::Malformed,
            ),
            (
                "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceParentError::InvalidVersion,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceParentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceParentError::ZeroId,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(value.parse::<TraceParent>(), Err(expected), "{value:?}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_changes_the_span() {
        let root = TraceParent::new_root();
        let child = root.child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.parent_id(), root.parent_id());
        assert_eq!(child.to_string().parse::<TraceParent>(), Ok(child));
    }
}
