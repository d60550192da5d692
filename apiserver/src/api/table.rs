//! Server-side `Table` output, what `kubectl get` prints.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use serde::Serialize;

use super::negotiate::TableVersion;
use super::status::ApiError;
use crate::v1alpha1::Plugin;

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
struct ColumnDefinition {
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

/// Priority 1 columns appear only with `kubectl get -o wide`.
const COLUMNS: [ColumnDefinition; 8] = [
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
        "Whether the plugin is heartbeating on time.",
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
        "host:port where kplug reaches the plugin.",
        1,
    ),
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartialObjectMetadata<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: &'a ObjectMeta,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RowObject<'a> {
    Metadata(PartialObjectMetadata<'a>),
    Object(&'a Plugin),
}

#[derive(Serialize)]
struct Row<'a> {
    cells: [String; COLUMNS.len()],
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<RowObject<'a>>,
}

/// A `meta.k8s.io` Table of plugins, ready to serialize.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Table<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ListMeta,
    column_definitions: &'static [ColumnDefinition],
    rows: Vec<Row<'a>>,
}

/// One plugin to show, with the real time of its last heartbeat.
pub struct TableItem<'a> {
    pub plugin: &'a Plugin,
    pub last_seen: Timestamp,
}

impl<'a> Table<'a> {
    /// Builds the table at `now` (ages are relative to it).
    pub fn new(
        version: TableVersion,
        metadata: ListMeta,
        items: impl IntoIterator<Item = TableItem<'a>>,
        include: IncludeObject,
        now: Timestamp,
    ) -> Self {
        let rows = items
            .into_iter()
            .map(|item| Row {
                cells: cells(item.plugin, item.last_seen, now),
                object: match include {
                    IncludeObject::None => None,
                    IncludeObject::Metadata => Some(RowObject::Metadata(PartialObjectMetadata {
                        kind: "PartialObjectMetadata",
                        api_version: version.api_version(),
                        metadata: &item.plugin.metadata,
                    })),
                    IncludeObject::Object => Some(RowObject::Object(item.plugin)),
                },
            })
            .collect();
        Self {
            kind: "Table",
            api_version: version.api_version(),
            metadata,
            column_definitions: &COLUMNS,
            rows,
        }
    }
}

fn cells(plugin: &Plugin, last_seen: Timestamp, now: Timestamp) -> [String; COLUMNS.len()] {
    let spec = &plugin.spec;
    let created = plugin
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let ready = plugin
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::v1alpha1::CONDITION_READY)
        .map_or("Unknown", |c| c.status.as_str());
    [
        plugin.name().to_owned(),
        spec.api.qualified_resource(),
        spec.implementation.clone(),
        spec.version.clone(),
        ready.to_owned(),
        human_duration(now.duration_since(last_seen).as_secs()),
        human_duration(now.duration_since(created).as_secs()),
        spec.address.clone(),
    ]
}

/// Formats an age the way kubectl does (apimachinery's `HumanDuration`).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = minutes / 60;
    let days = hours / 24;
    let years = days / 365;
    let with_remainder = |major: i64, unit: &str, minor: i64, minor_unit: &str| {
        if minor == 0 {
            format!("{major}{unit}")
        } else {
            format!("{major}{unit}{minor}{minor_unit}")
        }
    };
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        with_remainder(minutes, "m", seconds % 60, "s")
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        with_remainder(hours, "h", minutes % 60, "m")
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        with_remainder(days, "d", hours % 24, "h")
    } else if hours < 24 * 365 * 2 {
        format!("{days}d")
    } else if hours < 24 * 365 * 8 {
        with_remainder(years, "y", days % 365, "d")
    } else {
        format!("{years}y")
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
