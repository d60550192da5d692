//! `kubectl kplug plugins [RESOURCE]`: the registry as the user may read
//! it, and which plugin a reconcile of RESOURCE would go to, computed by
//! kplug's own rule ([`kplug_api::selection`]) on the listed objects.

use std::fmt::Write as _;
use std::io::Write;

use http::{Request, header};
use k8s_openapi::jiff::Timestamp;
use kplug_api::selection::{self, Implementation};
use kplug_api::v1alpha1::{ApiSelector, Plugin};
use kube::Client;
use serde_json::Value;

use crate::cli::{ListFormat, PluginsArgs};
use crate::connect::{Asked, send_to_kplug};
use crate::error::Error;
use crate::output::{self, Listed};
use crate::resource;

const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
const PLUGINS: &str = "plugins.kplug.io";

/// `list plugins` through kube-apiserver: the PluginList as sent, and its
/// items decoded.
async fn list(client: &Client) -> Result<(Value, Vec<Listed>), Error> {
    let request = Request::get(PLUGINS_PATH)
        .header(header::ACCEPT, "application/json")
        .body(Vec::new().into())
        .map_err(|e| Error::Transport(e.to_string()))?;
    let asked = Asked {
        verb: "list",
        resource: PLUGINS,
        namespace: None,
        api: "plugins",
    };
    let body = send_to_kplug(client, request, asked).await?;
    let decode = |e: serde_json::Error| Error::Transport(format!("kplug's PluginList: {e}"));
    let raw: Value = serde_json::from_slice(&body).map_err(decode)?;
    let mut listed = raw["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|item| {
            serde_json::from_value::<Plugin>(item.clone()).map(|plugin| Listed {
                plugin,
                raw: item.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(decode)?;
    // Which plugins serve which API: grouped by API, then by name.
    listed.sort_by(|a, b| {
        (a.plugin.spec.api.qualified_resource(), a.plugin.name())
            .cmp(&(b.plugin.spec.api.qualified_resource(), b.plugin.name()))
    });
    Ok((raw, listed))
}

/// The API whose plugins serve RESOURCE, as the operator derives it: the
/// resource's group and plural, any version. A RESOURCE the cluster does
/// not serve (its CRD not installed yet) still matches plugins that
/// declare it as `plural` or `plural.group`.
async fn api_of(client: &Client, type_: &str, plugins: &[Listed]) -> Result<ApiSelector, Error> {
    match resource::resolve(client, type_).await {
        Ok(found) => Ok(ApiSelector {
            group: found.resource.group,
            resource: found.resource.plural,
            version: String::new(),
        }),
        Err(Error::UnknownType(unknown)) => plugins
            .iter()
            .map(|p| &p.plugin.spec.api)
            .find(|api| api.resource == type_ || api.qualified_resource() == type_)
            .map(|api| ApiSelector {
                group: api.group.clone(),
                resource: api.resource.clone(),
                version: String::new(),
            })
            .ok_or(Error::UnknownType(unknown)),
        Err(other) => Err(other),
    }
}

/// Which plugin a reconcile of `api` goes to and why, in words.
pub fn explain(plugins: &[Listed], api: &ApiSelector, preferred: Option<&str>) -> String {
    let mut out = String::new();
    let resource = api.qualified_resource();
    let asked = preferred.map_or_else(String::new, |p| format!(" preferring implementation {p}"));
    let candidates = plugins.iter().map(|p| &p.plugin);
    match selection::choose(
        candidates,
        api,
        Implementation::from_spec(None, preferred),
        None,
    ) {
        Ok((plugin, why)) => {
            let reason = serde_json::to_value(why.reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(out, "A reconcile of {resource}{asked} goes to:");
            let _ = writeln!(
                out,
                "  {} (implementation {}, version {})",
                plugin.name(),
                plugin.spec.implementation,
                plugin.spec.version
            );
            let _ = writeln!(out, "  Reason: {reason}: {}", why.message);
        }
        Err(error) => {
            let _ = writeln!(
                out,
                "A reconcile of {resource}{asked} would be refused: {error}\n  kplug answers 503 ServiceUnavailable until a plugin of the API is Ready."
            );
        }
    }
    out.push_str(
        "An object's own preferredImplementation and its binding (status.implementation) also count:\n\
         `kubectl kplug reconcile TYPE/NAME --dry-run=server` shows the choice for one object.\n",
    );
    out
}

/// Runs `kubectl kplug plugins`.
pub async fn run(client: &Client, args: &PluginsArgs) -> Result<(), Error> {
    let (raw, mut plugins) = list(client).await?;
    let api = match &args.resource {
        Some(type_) => Some(api_of(client, type_, &plugins).await?),
        None => None,
    };
    if let Some(api) = &api {
        plugins.retain(|p| api.matches(&p.plugin.spec.api));
    }
    let text = match args.output {
        Some(ListFormat::Json | ListFormat::Yaml) => {
            let mut list = raw;
            list["items"] = Value::Array(plugins.iter().map(|p| p.raw.clone()).collect());
            if args.output == Some(ListFormat::Json) {
                output::json(&list)?
            } else {
                output::yaml(&list)?
            }
        }
        format => {
            let mut text = match (&api, plugins.is_empty()) {
                (Some(api), true) => {
                    format!("No plugins serve {}.\n", api.qualified_resource())
                }
                (None, true) => "No plugins are registered.\n".to_owned(),
                (_, false) => output::plugin_table(
                    &plugins,
                    format == Some(ListFormat::Wide),
                    Timestamp::now(),
                ),
            };
            if let Some(api) = &api {
                text.push('\n');
                text.push_str(&explain(&plugins, api, args.implementation.as_deref()));
            }
            text
        }
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn listed(name: &str, implementation: &str, version: &str, ready: &str) -> Listed {
        let raw = json!({
            "apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Plugin",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"api": {"group": "myorg.org", "resource": "databasetables", "version": "v1alpha1"},
                     "implementation": implementation, "version": version, "address": "127.0.0.1:1",
                     "heartbeatIntervalSeconds": 5, "protocol": {"version": "v1alpha1"}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "lastHeartbeatTime": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-01T00:00:15Z"}
        });
        Listed {
            plugin: serde_json::from_value(raw.clone()).expect("a Plugin"),
            raw,
        }
    }

    fn tables() -> ApiSelector {
        ApiSelector {
            group: "myorg.org".into(),
            resource: "databasetables".into(),
            version: String::new(),
        }
    }

    #[test]
    fn the_explanation_names_the_plugin_and_the_rule() {
        let plugins = [
            listed("pg", "PostgreSQL", "1.0.0", "True"),
            listed("maria", "MariaDB", "2.0.0", "False"),
        ];
        let text = explain(&plugins, &tables(), Some("mariadb"));
        assert!(
            text.starts_with(
                "A reconcile of databasetables.myorg.org preferring implementation mariadb goes to:\n  pg (implementation PostgreSQL, version 1.0.0)\n  Reason: Fallback: no Ready plugin implements mariadb; chose pg"
            ),
            "{text}"
        );
        let none = explain(&plugins[1..], &tables(), None);
        assert!(
            none.contains(
                "A reconcile of databasetables.myorg.org would be refused: no Ready plugin serves databasetables.myorg.org\n"
            ),
            "{none}"
        );
    }

    #[test]
    fn the_table_shows_instances_only_when_kplug_reports_them() {
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().expect("a time");
        let mut plugins = vec![listed("pg", "PostgreSQL", "1.0.0", "True")];
        let table = output::plugin_table(&plugins, false, now);
        assert_eq!(
            table,
            "NAME   API                        IMPLEMENTATION   VERSION   READY   AGE\n\
             pg     databasetables.myorg.org   PostgreSQL       1.0.0     True    5m0s\n"
        );
        plugins[0].raw["status"]["instances"] = json!([{"ready": true}, {"ready": false}]);
        let table = output::plugin_table(&plugins, false, now);
        assert!(
            table.contains("INSTANCES") && table.contains(" 1/2 "),
            "{table}"
        );
    }

    #[test]
    fn the_table_shows_a_canary_and_its_withdrawal() {
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().expect("a time");
        let with_canary = |reason: &str| {
            let mut plugin = listed("pg", "PostgreSQL", "1.0.0", "True");
            let instance = |name: &str, version: &str, weight: u32| {
                json!({"name": name, "address": "127.0.0.1:1", "version": version, "ready": true,
                       "draining": false, "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                       "canaryWeight": weight})
            };
            plugin.raw["status"]["instances"] = json!([
                instance("stable", "1.0.0", 0),
                instance("canary", "2.0.0", 10)
            ]);
            plugin.raw["status"]["conditions"]
                .as_array_mut()
                .expect("conditions")
                .push(
                    json!({"type": "Canary", "status": "True", "reason": reason, "message": "",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}),
                );
            plugin.plugin = serde_json::from_value(plugin.raw.clone()).expect("a Plugin");
            plugin
        };
        let table = output::plugin_table(&[with_canary("Serving")], false, now);
        assert!(
            table.contains("CANARY") && table.contains(" 2.0.0 10% "),
            "{table}"
        );
        let table = output::plugin_table(&[with_canary("Withdrawn")], false, now);
        assert!(table.contains(" 2.0.0 withdrawn "), "{table}");
    }
}
