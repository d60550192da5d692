//! Shadow reconciles (issue 19, part 3), with real hello plugins behind
//! one plugin's instances registered by hand: a stable 1.4.2 that answers
//! callers, and a shadow 2.0.0 that receives a dry-run copy of every
//! reconcile after the caller's answer. A shadow failing every other call
//! on purpose shows each of those differences in `plugins/tables/shadow`,
//! in `kubectl kplug shadow` and in the metrics; a shadow that panics or
//! hangs changes nothing the caller gets, and kplug's bound on a plugin's
//! copies in flight skips copies instead of piling them up, without
//! touching another plugin's shadow.

use std::process::Command;
use std::time::Duration;

use kplug_api::shadow::{KEPT_DIFFERENCES, MAX_COPIES_IN_FLIGHT, PluginShadow};
use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_test_support::database_table::{RECONCILES, reconcile_body};
use kplug_test_support::metrics::Samples;
use kplug_test_support::{
    BlockingRegistry, StandaloneKplug, heartbeat_request, wait_until, workspace_binary,
};
use serde_json::{Value, json};

const PLUGIN: &str = "tables";

/// The instance `instance` of `tables` at `address`, of `version`.
fn instance(instance: &str, address: &str, version: &str, shadow_percent: u32) -> HeartbeatRequest {
    HeartbeatRequest {
        version: version.to_owned(),
        shadow_percent,
        ..heartbeat_request(PLUGIN, instance, address, Duration::from_secs(60))
    }
}

/// Reconciles `name` of namespace shop with this deadline; the answer's
/// status.
fn reconcile(kplug: &StandaloneKplug, name: &str, timeout_seconds: u32) -> Value {
    let body = reconcile_body(name, json!({"timeoutSeconds": timeout_seconds}));
    let (code, answer) = kplug.post_json(RECONCILES, &body);
    assert_eq!(code, 201, "{name}: {answer:#}");
    answer["status"].clone()
}

/// The caller's view of an answer: who served it and what it said.
fn served(status: &Value) -> (bool, &str, &str) {
    (
        status["success"] == json!(true),
        status["plugin"]["version"].as_str().unwrap_or_default(),
        status["objectStatus"]["greeting"]
            .as_str()
            .unwrap_or_default(),
    )
}

fn shadow_record(kplug: &StandaloneKplug, plugin: &str) -> PluginShadow {
    let path = format!("/apis/plugins.kplug.io/v1alpha1/plugins/{plugin}/shadow");
    let (code, text) = kplug.curl("GET", &path, &[], None);
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not a PluginShadow ({e}): {text}"))
}

/// Waits (on the record, polled) until `want` holds of it.
fn wait_for_record(
    kplug: &StandaloneKplug,
    plugin: &str,
    what: &str,
    want: impl Fn(&PluginShadow) -> bool,
) -> PluginShadow {
    let mut found = None;
    wait_until(what, Duration::from_secs(60), || {
        let record = shadow_record(kplug, plugin);
        if want(&record) {
            found = Some(record);
            return Ok(());
        }
        Err(format!("{:#?}", record.status))
    });
    found.unwrap_or_else(|| panic!("{what}: no record"))
}

#[test]
fn a_shadow_gets_dry_run_copies_and_its_differences_are_shown() {
    let kplug = StandaloneKplug::start();
    let (_stable, stable_address) = kplug.plugin_serving("hello-stable", &[]);
    let (_shadow, shadow_log) = kplug.plugin_logging("hello-shadow", &["--fail-every", "2"]);
    let shadow_address = kplug.plugin_address("hello-shadow");
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    registry.accepted(instance("tables-stable", &stable_address, "1.4.2", 0));
    registry.accepted(instance("tables-shadow", &shadow_address, "2.0.0", 100));
    let plugin = kplug.wait_for_plugin(PLUGIN, |p| {
        p["status"]["instances"]
            .as_array()
            .is_some_and(|i| i.len() == 2)
    });
    let shadow = &plugin["status"]["instances"][1];
    assert_eq!(
        (&shadow["name"], &shadow["shadowPercent"]),
        (&json!("tables-shadow"), &json!(100))
    );
    // The shadow registered last, but the Plugin is what serves callers.
    assert_eq!(plugin["spec"]["version"], "1.4.2", "{plugin:#}");
    // A shadow's version serves no range either.
    let (code, answer) = kplug.post_json(
        RECONCILES,
        &reconcile_body("ranged", json!({"versionConstraint": ">=2"})),
    );
    assert_eq!(code, 503, "{answer:#}");
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(message.contains("(Ready: 1.4.2 (tables))"), "{message}");

    // Every caller is served by the stable instance, as without a shadow.
    const CALLS: usize = 20;
    for i in 0..CALLS {
        let name = format!("object-{i:02}");
        let status = reconcile(&kplug, &name, 30);
        assert_eq!(
            served(&status),
            (true, "1.4.2", format!("hello, {name}").as_str())
        );
    }
    let record = wait_for_record(&kplug, PLUGIN, "every copy compared", |r| {
        r.status.compared as usize == CALLS
    });
    let status = &record.status;
    assert_eq!(
        (status.same, status.different, status.failed, status.skipped),
        (CALLS as u64 / 2, CALLS as u64 / 2, 0, 0)
    );
    assert_eq!(status.shadows.len(), 1);
    assert_eq!(
        (
            status.shadows[0].version.as_str(),
            status.shadows[0].percent
        ),
        ("2.0.0", 100)
    );
    assert_eq!(status.differences.len(), KEPT_DIFFERENCES);
    // Every kept difference is a call the shadow failed on purpose (which
    // objects those are depends on the order the copies reached it).
    for difference in &status.differences {
        let name = &difference.object.name;
        let fields: Vec<(&str, Option<&Value>, Option<&Value>)> = difference
            .fields
            .iter()
            .map(|f| (f.path.as_str(), f.primary.as_ref(), f.shadow.as_ref()))
            .collect();
        assert_eq!(
            fields,
            [
                ("success", Some(&json!(true)), Some(&json!(false))),
                (
                    "results[0].reason",
                    Some(&json!("Greeted")),
                    Some(&json!("FailedOnPurpose"))
                ),
                (
                    "objectStatus",
                    Some(&json!({"greeting": format!("hello, {name}")})),
                    None
                ),
            ],
            "{difference:#?}"
        );
        assert!(
            difference.primary.starts_with("1.4.2 (tables-stable")
                && difference.shadow.starts_with("2.0.0 (tables-shadow"),
            "{difference:#?}"
        );
    }
    let newest = &status.differences[0].object.name;

    // The shadow was asked for a dry run each time it greeted.
    let greetings: Vec<String> = shadow_log
        .drain()
        .into_iter()
        .filter(|l| l.contains(" greeting "))
        .collect();
    assert_eq!(greetings.len(), CALLS / 2, "{greetings:#?}");
    assert!(
        greetings.iter().all(|l| l.contains("dry_run=true")),
        "{greetings:#?}"
    );

    // kubectl kplug shadow shows each difference as a diff.
    let shown = Command::new(workspace_binary("kubectl-kplug"))
        .args(["shadow", PLUGIN, "--kubeconfig"])
        .arg(&kplug.kubeconfig)
        .output()
        .expect("run kubectl-kplug shadow");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    eprintln!("{text}");
    assert!(
        text.contains("Copies:   20 compared (10 same, 10 different), 0 failed, 0 skipped"),
        "{text}"
    );
    for line in [
        format!("Reconcile DatabaseTable shop/{newest}"),
        "    - success: true\n    + success: false\n".to_owned(),
        "    - results[0].reason: \"Greeted\"\n    + results[0].reason: \"FailedOnPurpose\"\n"
            .to_owned(),
        format!(
            "    - objectStatus: {{\"greeting\":\"hello, {newest}\"}}\n    + objectStatus: (absent)\n"
        ),
    ] {
        assert!(text.contains(&line), "{line:?} not in:\n{text}");
    }

    let (code, text) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{text}");
    let metrics = Samples::parse(&text);
    for (result, count) in [("same", 10.0), ("different", 10.0), ("failed", 0.0)] {
        assert_eq!(
            metrics.sum(
                "kplug_shadow_copies_total",
                &[("plugin", PLUGIN), ("result", result)]
            ),
            count,
            "{result}"
        );
    }
    // The shadow's calls are not counted as the plugin's calls.
    assert_eq!(
        metrics.sum("kplug_reconciles_total", &[("plugin", PLUGIN)]),
        CALLS as f64
    );
}

#[test]
fn a_shadow_that_panics_or_hangs_changes_nothing_for_callers() {
    let kplug = StandaloneKplug::start();
    let (_stable, stable_address) = kplug.plugin_serving("hello-stable", &[]);
    let (_panicking, panicking_address) = kplug.plugin_serving("hello-panicking", &["--panic"]);
    let (_hanging, hanging_address) =
        kplug.plugin_serving("hello-hanging", &["--delay-ms", "600000"]);
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    registry.accepted(instance("tables-stable", &stable_address, "1.4.2", 0));
    registry.accepted(instance("tables-shadow", &panicking_address, "2.0.0", 100));
    kplug.wait_for_plugin(PLUGIN, |p| {
        p["status"]["instances"]
            .as_array()
            .is_some_and(|i| i.len() == 2)
    });

    // A shadow that panics: every copy fails, every caller is served.
    for i in 0..5 {
        let name = format!("object-{i}");
        let status = reconcile(&kplug, &name, 30);
        assert_eq!(
            served(&status),
            (true, "1.4.2", format!("hello, {name}").as_str())
        );
    }
    let record = wait_for_record(&kplug, PLUGIN, "five failed copies", |r| {
        r.status.failed == 5
    });
    assert_eq!((record.status.compared, record.status.skipped), (0, 0));
    let error = &record.status.differences[0].error;
    assert!(error.contains("tables-shadow"), "{error}");

    // A shadow that hangs: the callers' answers all come while its copies
    // are still out, and beyond kplug's bound the copies are skipped.
    registry.accepted(instance("tables-shadow", &hanging_address, "2.0.1", 100));
    kplug.wait_for_plugin(PLUGIN, |p| {
        p["status"]["instances"][1]["version"] == "2.0.1"
    });
    const CALLS: usize = MAX_COPIES_IN_FLIGHT + 6;
    for i in 0..CALLS {
        let name = format!("object-{i:02}");
        let status = reconcile(&kplug, &name, 20);
        assert_eq!(
            served(&status),
            (true, "1.4.2", format!("hello, {name}").as_str())
        );
    }
    let record = shadow_record(&kplug, PLUGIN);
    assert_eq!(
        (
            record.status.failed,
            record.status.skipped,
            record.status.compared
        ),
        (5, (CALLS - MAX_COPIES_IN_FLIGHT) as u64, 0),
        "the copies in flight are still out when every caller has its answer"
    );
    // The bound is the plugin's: another plugin's shadow still gets copies.
    for (name, version, shadow_percent) in [("others-a", "1.0.0", 0), ("others-b", "1.1.0", 100)] {
        registry.accepted(HeartbeatRequest {
            version: version.to_owned(),
            shadow_percent,
            ..heartbeat_request("others", name, &stable_address, Duration::from_secs(60))
        });
    }
    kplug.wait_for_plugin("others", |p| {
        p["status"]["instances"]
            .as_array()
            .is_some_and(|i| i.len() == 2)
    });
    for i in 0..5 {
        let (code, answer) = kplug.post_json(
            "/apis/plugins.kplug.io/v1alpha1/plugins/others/reconcile",
            &json!({"spec": {"object": {"apiVersion": "myorg.org/v1alpha1",
                "kind": "DatabaseTable", "metadata": {"name": format!("other-{i}")}}}}),
        );
        assert_eq!(code, 201, "{answer:#}");
    }
    wait_for_record(
        &kplug,
        "others",
        "the other plugin's copies compared",
        |r| r.status.same == 5,
    );
    let record = shadow_record(&kplug, PLUGIN);
    assert_eq!(
        (record.status.failed, record.status.compared),
        (5, 0),
        "the hanging copies are still out"
    );
    // They fail at the caller's deadline (20 s), and free their places.
    let record = wait_for_record(&kplug, PLUGIN, "the hanging copies failed", |r| {
        r.status.failed == 5 + MAX_COPIES_IN_FLIGHT as u64
    });
    assert!(
        record.status.differences[0]
            .error
            .contains("did not answer within 20s"),
        "{:?}",
        record.status.differences[0]
    );
}

#[test]
fn the_sdks_shadow_flag_reaches_the_plugin_and_a_shadow_alone_serves_nobody() {
    let kplug = StandaloneKplug::start();
    let _shadow = kplug.plugin("hello-shadow-only", &["--shadow", "25"]);
    let plugin = kplug.wait_for_plugin("hello-shadow-only", |p| {
        p["status"]["instances"][0]["shadowPercent"] == 25
    });
    let ready = plugin["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "False", "{plugin:#}");
    let (code, answer) = kplug.post_json(
        "/apis/plugins.kplug.io/v1alpha1/plugins/hello-shadow-only/reconcile",
        &json!({"spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting",
                                    "metadata": {"name": "world"}}}}),
    );
    assert_eq!(code, 503, "{answer:#}");

    // Unknown plugins are a 404 Status.
    let (code, text) = kplug.curl(
        "GET",
        "/apis/plugins.kplug.io/v1alpha1/plugins/nobody/shadow",
        &[],
        None,
    );
    assert_eq!(code, 404, "{text}");
    let status: Value = serde_json::from_str(&text).unwrap_or_default();
    assert_eq!(
        (&status["kind"], &status["reason"]),
        (&json!("Status"), &json!("NotFound"))
    );
    let shown = Command::new(workspace_binary("kubectl-kplug"))
        .args(["shadow", "nobody", "--kubeconfig"])
        .arg(&kplug.kubeconfig)
        .output()
        .expect("run kubectl-kplug shadow");
    assert_eq!(shown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&shown.stderr),
        "error: plugin \"nobody\" not found\n  `kubectl kplug plugins` lists the registered plugins\n"
    );
}
