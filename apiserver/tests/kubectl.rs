//! kubectl against a real standalone kplug with real plugin processes.

use std::time::Duration;

use kplug_test_support::metrics::Samples;
use kplug_test_support::{StandaloneKplug, free_port, kubectls, wait_until};

fn ready(object: &serde_json::Value) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Waits until kplug has `watches` watches of plugins open: a watch
/// counts once kplug has subscribed it to the registry's events, so
/// whatever happens next reaches it as an event.
fn wait_for_open_watches(kplug: &StandaloneKplug, watches: f64) {
    wait_until("the watch open", Duration::from_secs(20), || {
        let (code, body) = kplug.curl("GET", "/metrics", &[], None);
        if code != 200 {
            return Err(format!("{code}: {body}"));
        }
        let open = Samples::parse(&body).sum(
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "plugins")],
        );
        (open >= watches)
            .then_some(())
            .ok_or_else(|| format!("{open} open"))
    });
}

#[test]
fn get_shows_a_table_with_the_documented_columns() {
    let kplug = StandaloneKplug::start();
    let address = format!("127.0.0.1:{}", free_port());
    let _plugin = kplug.plugin(
        "database-table-postgresql-plugin",
        &[
            "--implementation",
            "PostgreSQL",
            "--api",
            "databasetables.myorg.org/v1alpha1",
            "--listen",
            &address,
        ],
    );
    kplug.wait_for_plugin("database-table-postgresql-plugin", ready);

    let table = kplug.kubectl_ok(&["get", "plugins"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "API",
            "IMPLEMENTATION",
            "VERSION",
            "READY",
            "INSTANCES",
            "LAST HEARTBEAT",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..6],
        [
            "database-table-postgresql-plugin",
            "databasetables.myorg.org",
            "PostgreSQL",
            "0.1.0",
            "True",
            "1/1"
        ],
        "{table}"
    );
    assert!(row[6].ends_with('s'), "last heartbeat in seconds: {table}");

    let wide = kplug.kubectl_ok(&["get", "plugins", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap_or_default().contains("ADDRESS"),
        "{wide}"
    );
    assert!(wide.contains(&address), "{wide}");

    for alias in ["plg", "plugin", "kplug", "plugins.plugins.kplug.io"] {
        let out = kplug.kubectl_ok(&["get", alias]);
        assert!(
            out.contains("database-table-postgresql-plugin"),
            "get {alias}: {out}"
        );
    }
    let names = kplug.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(
        names.trim(),
        "plugin.plugins.kplug.io/database-table-postgresql-plugin"
    );
}

#[test]
fn yaml_json_and_describe_show_spec_and_status() {
    let kplug = StandaloneKplug::start();
    let address = format!("127.0.0.1:{}", free_port());
    let _plugin = kplug.plugin("hello", &["--label", "tier=demo", "--listen", &address]);
    kplug.wait_for_plugin("hello", ready);

    let json: serde_json::Value =
        serde_json::from_str(&kplug.kubectl_ok(&["get", "plugin", "hello", "-o", "json"]))
            .expect("json");
    assert_eq!(json["apiVersion"], "plugins.kplug.io/v1alpha1");
    assert_eq!(json["kind"], "Plugin");
    assert_eq!(json["metadata"]["labels"]["tier"], "demo");
    assert_eq!(
        json["metadata"]["labels"]["kplug.io/implementation"],
        "hello"
    );
    assert_eq!(json["spec"]["address"], address.as_str());
    assert_eq!(json["spec"]["heartbeatIntervalSeconds"], 1);
    assert_eq!(json["spec"]["protocol"]["version"], "v1alpha1");
    assert!(
        json["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(json["status"]["lastHeartbeatTime"].is_string());
    assert!(json["status"]["expiresAt"].is_string());
    assert_eq!(json["status"]["instances"][0]["address"], address.as_str());
    assert_eq!(json["status"]["instances"][0]["ready"], true);

    let list: serde_json::Value =
        serde_json::from_str(&kplug.kubectl_ok(&["get", "plugins", "-o", "json"])).expect("json");
    assert_eq!(list["items"][0]["metadata"]["name"], "hello");

    let yaml = kplug.kubectl_ok(&["get", "plugin", "hello", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Plugin") && yaml.contains("type: Ready"),
        "{yaml}"
    );

    let described = kplug.kubectl_ok(&["describe", "plugin", "hello"]);
    for expected in [
        "Name:",
        "hello",
        "Implementation:",
        "Address:",
        "Ready",
        "HeartbeatReceived",
    ] {
        assert!(
            described.contains(expected),
            "describe lacks {expected:?}: {described}"
        );
    }
}

#[test]
fn every_kubectl_version_discovers_gets_and_explains() {
    let kplug = StandaloneKplug::start();
    let _plugin = kplug.plugin("hello", &[]);
    kplug.wait_for_plugin("hello", ready);
    for kubectl in kubectls() {
        let run = |args: &[&str]| {
            let output = kplug.kubectl_with(&kubectl, args);
            assert!(
                output.status.success(),
                "{} {args:?}: {}",
                kubectl.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let resources = run(&["api-resources", "--api-group", "plugins.kplug.io"]);
        assert!(
            resources.contains("plugins")
                && resources.contains("plg")
                && resources.contains("Plugin"),
            "{}: {resources}",
            kubectl.display()
        );
        // Reconciles are namespaced (kubectl create -f posts them to the
        // namespace's), plugins are not, in either form of discovery.
        let namespaced = run(&[
            "api-resources",
            "--api-group",
            "plugins.kplug.io",
            "--namespaced=true",
            "-o",
            "name",
        ]);
        assert_eq!(
            namespaced.trim(),
            "reconciles.plugins.kplug.io",
            "{}",
            kubectl.display()
        );
        let table = run(&["get", "plugins"]);
        assert!(
            table.contains("hello") && table.contains("LAST HEARTBEAT"),
            "{}: {table}",
            kubectl.display()
        );
        let explained = run(&["explain", "plugins.spec"]);
        assert!(
            explained.contains("implementation") && explained.contains("address"),
            "{}: {explained}",
            kubectl.display()
        );
        let conditions = run(&["explain", "plugins.status.conditions"]);
        assert!(
            conditions.contains("lastTransitionTime"),
            "{}: {conditions}",
            kubectl.display()
        );
    }
}

#[test]
fn selectors_filter_and_bad_selectors_are_rejected() {
    let kplug = StandaloneKplug::start();
    let _a = kplug.plugin("alpha", &["--label", "tier=a"]);
    let _b = kplug.plugin("beta", &["--label", "tier=b"]);
    kplug.wait_for_plugin("alpha", ready);
    kplug.wait_for_plugin("beta", ready);

    let names = |args: &[&str]| -> Vec<String> {
        let mut full = vec!["get", "plugins", "-o", "name"];
        full.extend_from_slice(args);
        kplug
            .kubectl_ok(&full)
            .lines()
            .map(|l| l.rsplit('/').next().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(names(&[]), ["alpha", "beta"]);
    assert_eq!(names(&["-l", "tier=a"]), ["alpha"]);
    assert_eq!(names(&["-l", "tier in (a,b),tier!=a"]), ["beta"]);
    assert_eq!(
        names(&["-l", "kplug.io/implementation=hello"]),
        ["alpha", "beta"]
    );
    assert_eq!(names(&["--field-selector", "metadata.name=beta"]), ["beta"]);
    assert_eq!(
        names(&["--field-selector", "metadata.name!=beta"]),
        ["alpha"]
    );
    assert!(names(&["-l", "tier=none"]).is_empty());

    let err = kplug.kubectl_err(&["get", "plugins", "-l", "tier in (a"]);
    assert!(
        err.contains("BadRequest") && err.contains("unable to parse requirement"),
        "{err}"
    );
    let err = kplug.kubectl_err(&["get", "plugins", "--field-selector", "spec.address=x"]);
    assert!(
        err.contains("BadRequest") && err.contains("not a known field selector"),
        "{err}"
    );

    // Paging: one item per page, kubectl follows `continue` itself.
    let paged = kplug.kubectl_ok(&["get", "plugins", "--chunk-size", "1", "-o", "name"]);
    assert_eq!(paged.lines().count(), 2, "{paged}");
}

#[test]
fn watch_sees_a_plugin_added_and_deleted_after_its_ttl() {
    let kplug = StandaloneKplug::start();
    let (_watch, lines) = kplug.kubectl_spawn(&["get", "plugins", "-w", "--output-watch-events"]);
    // The plugin must appear as an event, not in kubectl's first list.
    wait_for_open_watches(&kplug, 1.0);
    let mut plugin = kplug.plugin("ephemeral", &[]);
    lines.wait_for(Duration::from_secs(20), "ADDED ephemeral", |l| {
        l.starts_with("ADDED") && l.contains("ephemeral")
    });
    // SIGKILL: no deregistration, so only the TTL (3 x 1 s) removes it.
    plugin.kill();
    lines.wait_for(Duration::from_secs(20), "DELETED ephemeral", |l| {
        l.starts_with("DELETED") && l.contains("ephemeral")
    });
    kplug.wait_for_absent("ephemeral", Duration::from_secs(1));
}

#[test]
fn a_gracefully_stopped_plugin_deregisters_at_once() {
    let kplug = StandaloneKplug::start();
    let mut plugin = kplug.plugin("graceful", &["--heartbeat-interval", "60"]);
    kplug.wait_for_plugin("graceful", ready);
    assert!(
        plugin.terminate(Duration::from_secs(10)),
        "plugin exits cleanly on SIGTERM"
    );
    // With a 60 s interval the TTL is 3 minutes: only deregistration explains this.
    kplug.wait_for_absent("graceful", Duration::from_secs(5));
}

#[test]
fn delete_evicts_and_a_live_plugin_returns_as_a_new_object() {
    let kplug = StandaloneKplug::start();
    let _plugin = kplug.plugin("comeback", &[]);
    let before = kplug.wait_for_plugin("comeback", ready);
    let out = kplug.kubectl_ok(&["delete", "plugin", "comeback"]);
    assert!(
        out.contains("plugin.plugins.kplug.io \"comeback\" deleted"),
        "{out}"
    );
    let after = kplug.wait_for_plugin("comeback", |p| {
        p["metadata"]["uid"] != before["metadata"]["uid"]
    });
    assert!(ready(&after));
    let err = kplug.kubectl_err(&["delete", "plugin", "never-was"]);
    assert!(
        err.contains("NotFound") && err.contains("never-was"),
        "{err}"
    );
}

#[test]
fn restart_keeps_the_ca_so_the_kubeconfig_stays_valid() {
    let kplug = StandaloneKplug::start();
    let kubeconfig = std::fs::read_to_string(&kplug.kubeconfig).expect("kubeconfig");
    let StandaloneKplug {
        mut process, state, ..
    } = kplug;
    process.kill();
    let again = StandaloneKplug::start_in(state, &[]);
    std::fs::write(
        &again.kubeconfig,
        kubeconfig.replace(
            kubeconfig
                .lines()
                .find(|l| l.contains("server:"))
                .unwrap_or_default(),
            &format!("    server: {}", again.api),
        ),
    )
    .expect("rewrite kubeconfig with the old credentials");
    let out = again.kubectl_ok(&["get", "plugins"]);
    assert!(out.is_empty(), "no plugins yet: {out}");
}
