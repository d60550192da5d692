//! Server-side `Table` output, what `kubectl get` prints, written from the
//! registry's cached bytes.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::Serialize;

use super::negotiate::TableVersion;
use super::status::ApiError;
use crate::registry::Encoded;

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    /// A `PartialObjectMetadata`, the default: enough for kubectl to name rows.
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None | Some("") | Some("Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(other) => Err(ApiError::BadRequest(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"None\", \"Metadata\", \"Object\""
            ))),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ColumnDefinition {
    name: &'static str,
    #[serde(rename = "type")]
    type_: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
}

const fn column(
    name: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
) -> ColumnDefinition {
    ColumnDefinition {
        name,
        type_: "string",
        format,
        description,
        priority,
    }
}

/// Priority 1 columns appear only with `kubectl get -o wide`. The registry
/// keeps each object's cells in this order ([`Encoded`]): "Name" to
/// "Instances" before the two ages, which are made per request, and
/// "Address" after.
pub(super) const COLUMNS: [ColumnDefinition; 9] = [
    column(
        "Name",
        "name",
        "Name of the plugin, unique in the cluster.",
        0,
    ),
    column(
        "API",
        "",
        "The resource the plugin reconciles, as resource.group.",
        0,
    ),
    column(
        "Implementation",
        "",
        "The implementation the plugin provides.",
        0,
    ),
    column("Version", "", "The plugin's own version.", 0),
    column(
        "Ready",
        "",
        "Whether an instance of the plugin heartbeats on time and takes calls.",
        0,
    ),
    column(
        "Instances",
        "",
        "Instances taking calls (heartbeating on time, not draining) / all instances.",
        0,
    ),
    column(
        "Last Heartbeat",
        "",
        "Time since the plugin's last heartbeat.",
        0,
    ),
    column("Age", "", "Time since this registration was created.", 0),
    column(
        "Address",
        "",
        "host:port where kplug reaches the plugin's newest instance.",
        1,
    ),
];

/// Writes `meta.k8s.io` Tables of plugins from the registry's cached bytes
/// ([`Encoded`]): only the two ages are formatted per request. The output is
/// what serde would write for the Table (see the tests).
pub struct TableWriter {
    version: TableVersion,
    include: IncludeObject,
    /// Ages are relative to this.
    now: Timestamp,
}

impl TableWriter {
    pub fn new(version: TableVersion, include: IncludeObject, now: Timestamp) -> Self {
        Self {
            version,
            include,
            now,
        }
    }

    /// Everything before the first row.
    pub fn head(&self, metadata: &ListMeta) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::with_capacity(2048);
        out.extend_from_slice(br#"{"kind":"Table","apiVersion":""#);
        out.extend_from_slice(self.version.api_version().as_bytes());
        out.extend_from_slice(br#"","metadata":"#);
        serde_json::to_writer(&mut out, metadata)?;
        out.extend_from_slice(br#","columnDefinitions":"#);
        serde_json::to_writer(&mut out, &COLUMNS)?;
        out.extend_from_slice(br#","rows":["#);
        Ok(out)
    }

    /// Everything after the last row.
    pub const TAIL: &'static [u8] = b"]}";

    /// One row (without a separating comma).
    pub fn row(&self, out: &mut Vec<u8>, encoded: &Encoded, last_seen: Timestamp) {
        out.extend_from_slice(br#"{"cells":["#);
        out.extend_from_slice(encoded.cells_before_ages());
        for since in [last_seen, encoded.created()] {
            out.extend_from_slice(b",\"");
            // kubectl's durations are digits, units and "<invalid>": nothing
            // that JSON escapes.
            write_human_duration(out, self.now.duration_since(since).as_secs());
            out.push(b'"');
        }
        out.push(b',');
        out.extend_from_slice(encoded.cells_after_ages());
        out.push(b']');
        match self.include {
            IncludeObject::None => {}
            IncludeObject::Metadata => {
                out.extend_from_slice(
                    br#","object":{"kind":"PartialObjectMetadata","apiVersion":""#,
                );
                out.extend_from_slice(self.version.api_version().as_bytes());
                out.extend_from_slice(br#"","metadata":"#);
                out.extend_from_slice(encoded.metadata());
                out.push(b'}');
            }
            IncludeObject::Object => {
                out.extend_from_slice(br#","object":"#);
                encoded.write_json(out);
            }
        }
        out.push(b'}');
    }

    /// A whole Table of one plugin, as `get` and table watches send it.
    pub fn single(
        &self,
        out: &mut Vec<u8>,
        metadata: &ListMeta,
        encoded: &Encoded,
        last_seen: Timestamp,
    ) -> Result<(), serde_json::Error> {
        out.extend_from_slice(&self.head(metadata)?);
        self.row(out, encoded, last_seen);
        out.extend_from_slice(Self::TAIL);
        Ok(())
    }
}

/// Formats an age the way kubectl does (apimachinery's `HumanDuration`).
pub fn human_duration(seconds: i64) -> String {
    let mut out = Vec::with_capacity(8);
    write_human_duration(&mut out, seconds);
    String::from_utf8_lossy(&out).into_owned()
}

/// [`human_duration`] appended to `out`, without an allocation per cell.
fn write_human_duration(out: &mut Vec<u8>, seconds: i64) {
    // Writing into a Vec cannot fail.
    let _ = human_duration_to(out, seconds);
}

fn human_duration_to(out: &mut Vec<u8>, seconds: i64) -> std::io::Result<()> {
    use std::io::Write;
    if seconds < -1 {
        return out.write_all(b"<invalid>");
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = minutes / 60;
    let days = hours / 24;
    let years = days / 365;
    let mut with_remainder = |major: i64, unit: &str, minor: i64, minor_unit: &str| {
        if minor == 0 {
            write!(out, "{major}{unit}")
        } else {
            write!(out, "{major}{unit}{minor}{minor_unit}")
        }
    };
    if seconds < 120 {
        with_remainder(seconds, "s", 0, "")
    } else if minutes < 10 {
        with_remainder(minutes, "m", seconds % 60, "s")
    } else if minutes < 180 {
        with_remainder(minutes, "m", 0, "")
    } else if hours < 8 {
        with_remainder(hours, "h", minutes % 60, "m")
    } else if hours < 48 {
        with_remainder(hours, "h", 0, "")
    } else if hours < 24 * 8 {
        with_remainder(days, "d", hours % 24, "h")
    } else if hours < 24 * 365 * 2 {
        with_remainder(days, "d", 0, "")
    } else if hours < 24 * 365 * 8 {
        with_remainder(years, "y", days % 365, "d")
    } else {
        with_remainder(years, "y", 0, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86_400 + 3600, "3d1h"),
            (30 * 86_400, "30d"),
            (3 * 365 * 86_400, "3y"),
            (9 * 365 * 86_400, "9y"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(human_duration(seconds), expected, "{seconds}s");
        }
    }

    #[test]
    fn include_object_values() {
        assert_eq!(IncludeObject::parse(None), Ok(IncludeObject::Metadata));
        assert_eq!(IncludeObject::parse(Some("None")), Ok(IncludeObject::None));
        assert_eq!(
            IncludeObject::parse(Some("Object")),
            Ok(IncludeObject::Object)
        );
        assert!(IncludeObject::parse(Some("All")).is_err());
    }
}
