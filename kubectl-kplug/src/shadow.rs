//! `kubectl kplug shadow PLUGIN`: how the plugin's shadow instances
//! answered the dry-run copies of its reconciles, from the subresource
//! `plugins/PLUGIN/shadow`, as a readable diff.

use std::fmt::Write as _;
use std::io::Write;

use http::{Request, header};
use k8s_openapi::jiff::Timestamp;
use kplug_api::shadow::{FieldDifference, PluginShadow, ShadowDifference};
use kube::Client;
use serde_json::Value;

use crate::cli::{Format, ShadowArgs};
use crate::connect::{Asked, send_to_kplug};
use crate::error::Error;
use crate::output;

const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
const RESOURCE: &str = "plugins/shadow";

/// `get plugins/NAME/shadow` through kube-apiserver.
async fn get(client: &Client, plugin: &str) -> Result<PluginShadow, Error> {
    let request = Request::get(format!("{PLUGINS_PATH}/{plugin}/shadow"))
        .header(header::ACCEPT, "application/json")
        .body(Vec::new().into())
        .map_err(|e| Error::Transport(e.to_string()))?;
    let asked = Asked {
        verb: "get",
        resource: RESOURCE,
        namespace: None,
        api: plugin,
    };
    let body = send_to_kplug(client, request, asked).await?;
    serde_json::from_slice(&body)
        .map_err(|e| Error::Transport(format!("kplug's PluginShadow: {e}")))
}

/// Runs `kubectl kplug shadow`.
pub async fn run(client: &Client, args: &ShadowArgs) -> Result<(), Error> {
    let shadow = get(client, &args.plugin).await?;
    let text = match args.output {
        Some(Format::Json) => output::json(&shadow)?,
        Some(Format::Yaml) => output::yaml(&shadow)?,
        None => describe(&shadow, Timestamp::now()),
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

/// The record in words: the shadows, the counts, then each difference
/// with `-` for the caller's answer and `+` for the shadow's.
pub fn describe(shadow: &PluginShadow, now: Timestamp) -> String {
    let name = shadow.metadata.name.as_deref().unwrap_or_default();
    let status = &shadow.status;
    let mut out = String::new();
    let _ = writeln!(out, "Plugin:   {name}");
    if status.shadows.is_empty() {
        let _ = writeln!(
            out,
            "Shadows:  none (an instance started with --shadow receives dry-run copies of the \
             plugin's reconciles)"
        );
    }
    for (i, instance) in status.shadows.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}{} {}, {}% of reconciles, {}",
            if i == 0 { "Shadows:  " } else { "          " },
            instance.name,
            instance.version,
            instance.percent,
            if instance.ready { "Ready" } else { "not Ready" }
        );
    }
    let Some(since) = &status.since else {
        out.push_str("Copies:   none yet\n");
        return out;
    };
    let age = output::age(now.duration_since(since.0).as_secs());
    let _ = writeln!(out, "Since:    {} ({age} ago)", since.0);
    let _ = writeln!(
        out,
        "Copies:   {} compared ({} same, {} different), {} failed, {} skipped",
        status.compared, status.same, status.different, status.failed, status.skipped
    );
    if status.differences.is_empty() {
        return out;
    }
    out.push_str("\nLast differences, newest first (- the caller's answer, + the shadow's):\n");
    for difference in &status.differences {
        out.push('\n');
        write_difference(&mut out, difference);
    }
    out
}

fn write_difference(out: &mut String, d: &ShadowDifference) {
    let object = match d.object.namespace.as_str() {
        "" => format!("{} {}", d.object.kind, d.object.name),
        namespace => format!("{} {namespace}/{}", d.object.kind, d.object.name),
    };
    let _ = writeln!(
        out,
        "  {}  {} {object}  (operation {})",
        d.time.0, d.operation, d.operation_id
    );
    let _ = writeln!(out, "    caller: {}", d.primary);
    if !d.error.is_empty() {
        let shadow = if d.shadow.is_empty() {
            "the shadow"
        } else {
            &d.shadow
        };
        let _ = writeln!(out, "    shadow: {shadow} gave no answer: {}", d.error);
        return;
    }
    let _ = writeln!(out, "    shadow: {}", d.shadow);
    for field in &d.fields {
        write_field(out, field);
    }
    if d.differing_fields > d.fields.len() {
        let _ = writeln!(
            out,
            "    ... and {} more fields",
            d.differing_fields - d.fields.len()
        );
    }
}

fn write_field(out: &mut String, field: &FieldDifference) {
    let shown = |value: &Option<Value>| match value {
        Some(value) => value.to_string(),
        None => "(absent)".to_owned(),
    };
    let _ = writeln!(out, "    - {}: {}", field.path, shown(&field.primary));
    let _ = writeln!(out, "    + {}: {}", field.path, shown(&field.shadow));
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use kplug_api::shadow::{PluginShadowStatus, ShadowInstance};
    use kplug_api::v1alpha1::ObjectRef;
    use serde_json::json;

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn shadow(status: PluginShadowStatus) -> PluginShadow {
        PluginShadow {
            api_version: "plugins.kplug.io/v1alpha1".to_owned(),
            kind: "PluginShadow".to_owned(),
            metadata: ObjectMeta {
                name: Some("tables".to_owned()),
                ..ObjectMeta::default()
            },
            status,
        }
    }

    #[test]
    fn a_plugin_without_shadow_says_how_to_start_one() {
        let text = describe(
            &shadow(PluginShadowStatus::default()),
            at("2026-01-01T00:00:00Z"),
        );
        assert_eq!(
            text,
            "Plugin:   tables\n\
             Shadows:  none (an instance started with --shadow receives dry-run copies of the \
             plugin's reconciles)\n\
             Copies:   none yet\n"
        );
    }

    #[test]
    fn differences_read_as_a_diff_and_failures_say_why() {
        let object = ObjectRef {
            api_version: "myorg.org/v1alpha1".to_owned(),
            kind: "DatabaseTable".to_owned(),
            namespace: "shop".to_owned(),
            name: "orders".to_owned(),
        };
        let status = PluginShadowStatus {
            shadows: vec![ShadowInstance {
                name: "tables-v2".to_owned(),
                version: "2.0.0".to_owned(),
                percent: 100,
                ready: true,
            }],
            compared: 3,
            same: 2,
            different: 1,
            failed: 1,
            skipped: 0,
            since: Some(Time(at("2026-01-01T00:00:00Z"))),
            differences: vec![
                ShadowDifference {
                    time: Time(at("2026-01-01T00:04:00Z")),
                    operation_id: "op-2".to_owned(),
                    operation: "Reconcile".to_owned(),
                    object: object.clone(),
                    primary: "1.4.2 (tables-v1)".to_owned(),
                    shadow: "2.0.0 (tables-v2)".to_owned(),
                    error: String::new(),
                    fields: vec![
                        FieldDifference {
                            path: "success".to_owned(),
                            primary: Some(json!(true)),
                            shadow: Some(json!(false)),
                        },
                        FieldDifference {
                            path: "objectStatus.phase".to_owned(),
                            primary: Some(json!("Ready")),
                            shadow: None,
                        },
                    ],
                    differing_fields: 5,
                },
                ShadowDifference {
                    time: Time(at("2026-01-01T00:03:00Z")),
                    operation_id: "op-1".to_owned(),
                    operation: "Reconcile".to_owned(),
                    object,
                    primary: "1.4.2 (tables-v1)".to_owned(),
                    shadow: String::new(),
                    error: "plugin tables did not answer within 30s".to_owned(),
                    fields: Vec::new(),
                    differing_fields: 0,
                },
            ],
        };
        let text = describe(&shadow(status), at("2026-01-01T00:05:30Z"));
        assert_eq!(
            text,
            "Plugin:   tables\n\
             Shadows:  tables-v2 2.0.0, 100% of reconciles, Ready\n\
             Since:    2026-01-01T00:00:00Z (5m30s ago)\n\
             Copies:   3 compared (2 same, 1 different), 1 failed, 0 skipped\n\
             \n\
             Last differences, newest first (- the caller's answer, + the shadow's):\n\
             \n  2026-01-01T00:04:00Z  Reconcile DatabaseTable shop/orders  (operation op-2)\n\
             \x20   caller: 1.4.2 (tables-v1)\n\
             \x20   shadow: 2.0.0 (tables-v2)\n\
             \x20   - success: true\n\
             \x20   + success: false\n\
             \x20   - objectStatus.phase: \"Ready\"\n\
             \x20   + objectStatus.phase: (absent)\n\
             \x20   ... and 3 more fields\n\
             \n  2026-01-01T00:03:00Z  Reconcile DatabaseTable shop/orders  (operation op-1)\n\
             \x20   caller: 1.4.2 (tables-v1)\n\
             \x20   shadow: the shadow gave no answer: plugin tables did not answer within 30s\n"
        );
    }
}
