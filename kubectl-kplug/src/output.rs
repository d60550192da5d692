//! What a person reads: a reconcile's outcome in `kubectl describe`'s
//! style, plugin tables in `kubectl get`'s, and `-o yaml|json`. All pure,
//! so that the unit tests pin the text.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use kplug_api::selection::compare_versions;
use kplug_api::v1alpha1::{CONDITION_CANARY, Plugin, ReconcileResult, ReconcileStatus, Selection};
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;

/// `-o json`: indented, as kubectl prints it.
pub fn json(value: &impl Serialize) -> Result<String, Error> {
    serde_json::to_string_pretty(value)
        .map(|text| text + "\n")
        .map_err(|e| Error::Output(e.to_string()))
}

/// `-o yaml`.
pub fn yaml(value: &impl Serialize) -> Result<String, Error> {
    serde_saphyr::to_string(value).map_err(|e| Error::Output(e.to_string()))
}

/// `value` as YAML, each line indented by `indent` spaces.
fn indented_yaml(value: &Value, indent: usize) -> String {
    let text = yaml(value).unwrap_or_else(|_| value.to_string());
    text.lines()
        .map(|line| format!("{:indent$}{line}\n", ""))
        .collect()
}

/// Columns padded to their widest cell plus three spaces, like kubectl's tables.
pub fn table(header: &[&str], rows: &[Vec<String>], indent: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = format!("{:indent$}", "");
        for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if index + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What is being reconciled, for the outcome's first lines.
pub struct Subject<'a> {
    /// `databasetable.myorg.org/users`, as kubectl names objects.
    pub object: &'a str,
    pub namespace: Option<&'a str>,
    pub dry_run: bool,
}

/// A selection's reason and message on one line.
fn selection_line(selection: &Selection) -> String {
    let reason = serde_json::to_value(selection.reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if selection.message.is_empty() {
        reason
    } else {
        format!("{reason}: {}", selection.message)
    }
}

/// The outcome of one reconcile, as `kubectl describe` would lay it out.
pub fn outcome(subject: &Subject<'_>, status: &ReconcileStatus) -> String {
    let mut out = String::new();
    let verdict = match (status.success, subject.dry_run) {
        (true, false) => "reconciled",
        (true, true) => "reconciled (dry run: nothing was changed)",
        (false, false) => "NOT reconciled: the plugin reported a failure",
        (false, true) => "NOT reconciled (dry run): the plugin reported a failure",
    };
    let _ = writeln!(out, "{} {verdict}", subject.object);
    let field = |out: &mut String, name: &str, value: &str| {
        let _ = writeln!(out, "{:<16}{value}", format!("{name}:"));
    };
    if let Some(namespace) = subject.namespace {
        field(&mut out, "Namespace", namespace);
    }
    let plugin = &status.plugin;
    field(
        &mut out,
        "Plugin",
        &format!(
            "{} (implementation {}, version {})",
            plugin.name, plugin.implementation, plugin.version
        ),
    );
    if !plugin.instance.is_empty() {
        field(&mut out, "Instance", &plugin.instance);
    }
    field(&mut out, "Selection", &selection_line(&status.selection));
    field(
        &mut out,
        "Success",
        if status.success { "True" } else { "False" },
    );
    out.push_str("Results:\n");
    if status.results.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = status
            .results
            .iter()
            .map(|r| vec![r.severity.clone(), r.reason.clone(), r.message.clone()])
            .collect();
        out.push_str(&table(&["SEVERITY", "REASON", "MESSAGE"], &rows, 2));
    }
    if !status.conditions.is_empty() {
        out.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = status
            .conditions
            .iter()
            .map(|c| {
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                ]
            })
            .collect();
        out.push_str(&table(&["TYPE", "STATUS", "REASON", "MESSAGE"], &rows, 2));
    }
    out.push_str("Object status (reported by the plugin, not written):\n");
    match &status.object_status {
        Some(value) if !is_empty(value) => out.push_str(&indented_yaml(value, 2)),
        _ => out.push_str("  <none>\n"),
    }
    out.push_str("Extension statuses (reported by the plugin, not written):\n");
    if status.extension_statuses.is_empty() {
        out.push_str("  <none>\n");
    }
    for extension in &status.extension_statuses {
        let reference = &extension.reference;
        let _ = writeln!(
            out,
            "  {} {} ({}):",
            reference.kind, reference.name, reference.api_version
        );
        out.push_str(&indented_yaml(&extension.status, 4));
    }
    let requeue = status
        .requeue_after_seconds
        .map_or_else(|| "<none>".to_owned(), |s| format!("{s}s"));
    field(&mut out, "Requeue after", &requeue);
    field(
        &mut out,
        "Duration",
        &format!("{:.1}ms", status.duration_milliseconds),
    );
    field(&mut out, "Operation ID", &status.operation_id);
    out
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

/// The first result a failed reconcile reports that is not Normal, as
/// `Reason: message`, for the error line.
pub fn failure_summary(results: &[ReconcileResult]) -> String {
    results
        .iter()
        .find(|r| r.severity != "Normal")
        .or(results.first())
        .map_or_else(
            || "it gave no reason".to_owned(),
            |r| format!("{}: {}", r.reason, r.message),
        )
}

/// kubectl's short ages: 45s, 3m20s, 5h, 2d.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A plugin listed with the raw object it came from (for fields kplug adds
/// that this version's types do not know yet, such as instances).
pub struct Listed {
    pub plugin: Plugin,
    pub raw: Value,
}

impl Listed {
    /// `ready/total` of `status.instances`, when kplug reports instances.
    pub fn instances(&self) -> Option<String> {
        let instances = self.raw.pointer("/status/instances")?.as_array()?;
        let ready = instances
            .iter()
            .filter(|i| i.get("ready").and_then(Value::as_bool) == Some(true))
            .count();
        let knows_readiness = instances.iter().any(|i| i.get("ready").is_some());
        Some(if knows_readiness {
            format!("{ready}/{}", instances.len())
        } else {
            instances.len().to_string()
        })
    }

    /// The canary, while the plugin has one: its version and share, or
    /// that kplug withdrew it.
    pub fn canary(&self) -> Option<String> {
        let condition = self
            .plugin
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_CANARY)?;
        let canaries = self
            .plugin
            .status
            .instances
            .iter()
            .filter(|i| i.canary_weight > 0);
        let newest = canaries.max_by(|a, b| compare_versions(&a.version, &b.version))?;
        Some(match condition.reason.as_str() {
            "Withdrawn" => format!("{} withdrawn", newest.version),
            _ => format!("{} {}%", newest.version, newest.canary_weight),
        })
    }
}

/// The plugins as `kubectl get plugins` lays them out, with their canaries
/// when any has one; `wide` adds the address, the SDK and the capabilities.
pub fn plugin_table(plugins: &[Listed], wide: bool, now: Timestamp) -> String {
    let with_instances = plugins.iter().any(|p| p.instances().is_some());
    let with_canaries = plugins.iter().any(|p| p.canary().is_some());
    let mut header = vec!["NAME", "API", "IMPLEMENTATION", "VERSION", "READY"];
    if with_instances {
        header.push("INSTANCES");
    }
    if with_canaries {
        header.push("CANARY");
    }
    header.push("AGE");
    if wide {
        header.extend(["ADDRESS", "SDK", "CAPABILITIES"]);
    }
    let rows: Vec<Vec<String>> = plugins
        .iter()
        .map(|listed| {
            let plugin = &listed.plugin;
            let ready = plugin
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == kplug_api::v1alpha1::CONDITION_READY)
                .map_or_else(|| "Unknown".to_owned(), |c| c.status.clone());
            let created = plugin.metadata.creation_timestamp.as_ref().map_or_else(
                || "<unknown>".to_owned(),
                |t| age(now.duration_since(t.0).as_secs()),
            );
            let mut row = vec![
                plugin.name().to_owned(),
                plugin.spec.api.qualified_resource(),
                plugin.spec.implementation.clone(),
                plugin.spec.version.clone(),
                ready,
            ];
            if with_instances {
                row.push(listed.instances().unwrap_or_else(|| "<none>".to_owned()));
            }
            if with_canaries {
                row.push(listed.canary().unwrap_or_else(|| "<none>".to_owned()));
            }
            row.push(created);
            if wide {
                let protocol = &plugin.spec.protocol;
                row.push(plugin.spec.address.clone());
                row.push(if protocol.sdk.is_empty() {
                    "<none>".to_owned()
                } else {
                    protocol.sdk.clone()
                });
                row.push(protocol.capabilities.join(","));
            }
            row
        })
        .collect();
    table(&header, &rows, 0)
}

#[cfg(test)]
mod tests {
    use kplug_api::v1alpha1::{
        ExtensionStatus, ObjectRef, PluginRef, ReconcileResult, SelectionReason,
    };
    use serde_json::json;

    use super::*;

    fn answer(success: bool) -> ReconcileStatus {
        ReconcileStatus {
            plugin: PluginRef {
                name: "database-table-postgresql-plugin".into(),
                version: "0.1.0".into(),
                implementation: "PostgreSQL".into(),
                instance: "database-table-postgresql-plugin-5d8f7-abcde".into(),
                capabilities: vec!["Reconcile".into(), "Finalize".into()],
            },
            selection: Selection {
                reason: SelectionReason::Fallback,
                message: "no Ready plugin implements MariaDB; chose database-table-postgresql-plugin (PostgreSQL) by highest version, then name".into(),
            },
            success,
            results: vec![ReconcileResult {
                severity: if success { "Normal" } else { "Warning" }.into(),
                reason: if success { "TableCreated" } else { "UnknownColumnType" }.into(),
                message: "created table users (2 columns)".into(),
            }],
            conditions: vec![],
            object_status: Some(json!({"columns": 2})),
            extension_statuses: vec![ExtensionStatus {
                reference: ObjectRef {
                    api_version: "myorg.org/v1alpha1".into(),
                    kind: "DatabaseTablePostgreSqlExtension".into(),
                    namespace: String::new(),
                    name: "users".into(),
                },
                status: json!({"partitions": 4}),
            }],
            requeue_after_seconds: Some(300.0),
            operation_id: "op-1".into(),
            duration_milliseconds: 14.5,
            ..ReconcileStatus::default()
        }
    }

    #[test]
    fn an_outcome_reads_like_describe() {
        let subject = Subject {
            object: "databasetable.myorg.org/users",
            namespace: Some("default"),
            dry_run: true,
        };
        let text = outcome(&subject, &answer(true));
        let expected = "\
databasetable.myorg.org/users reconciled (dry run: nothing was changed)
Namespace:      default
Plugin:         database-table-postgresql-plugin (implementation PostgreSQL, version 0.1.0)
Instance:       database-table-postgresql-plugin-5d8f7-abcde
Selection:      Fallback: no Ready plugin implements MariaDB; chose database-table-postgresql-plugin (PostgreSQL) by highest version, then name
Success:        True
Results:
  SEVERITY   REASON         MESSAGE
  Normal     TableCreated   created table users (2 columns)
Object status (reported by the plugin, not written):
  columns: 2
Extension statuses (reported by the plugin, not written):
  DatabaseTablePostgreSqlExtension users (myorg.org/v1alpha1):
    partitions: 4
Requeue after:  300s
Duration:       14.5ms
Operation ID:   op-1
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_failure_is_said_first_and_summarized() {
        let failed = answer(false);
        let text = outcome(
            &Subject {
                object: "databasetable.myorg.org/users",
                namespace: None,
                dry_run: false,
            },
            &failed,
        );
        assert!(text.starts_with(
            "databasetable.myorg.org/users NOT reconciled: the plugin reported a failure\nPlugin:"
        ));
        assert_eq!(
            failure_summary(&failed.results),
            "UnknownColumnType: created table users (2 columns)"
        );
    }

    #[test]
    fn ages_are_short_like_kubectl() {
        assert_eq!(age(45), "45s");
        assert_eq!(age(200), "3m20s");
        assert_eq!(age(3000), "50m");
        assert_eq!(age(4 * 3600 + 120), "4h2m");
        assert_eq!(age(30 * 3600), "30h");
        assert_eq!(age(3 * 86_400 + 7200), "3d2h");
        assert_eq!(age(40 * 86_400), "40d");
    }

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let rows = vec![vec![
            "a".to_owned(),
            "long value".to_owned(),
            "x".to_owned(),
        ]];
        assert_eq!(
            table(&["NAME", "VALUE", "END"], &rows, 0),
            "NAME   VALUE        END\na      long value   x\n"
        );
    }
}
