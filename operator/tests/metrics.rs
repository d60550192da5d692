//! The operator's observability on a real control plane: a known workload
//! (three Widgets a hello plugin reconciles, one that a failing plugin
//! refuses) gives exact counts on `/metrics`, which only a bearer token
//! allowed `get` on `/metrics` may read (TokenReview and
//! SubjectAccessReview made with the operator's own ServiceAccount and the
//! RBAC of `examples/database-table/deploy/operator-rbac.yaml`); and every
//! log line of a reconcile carries its trace id, the one the object's
//! `kplug.io/traceparent` annotation names when it has one.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::metrics::{Credential, Samples, Trust, get, scrape};
use kplug_test_support::{
    Lines, Process, repo_root, wait_plugin_ready, wait_until, workspace_binary,
};
use support::widgets::{Widgets, widget};
use support::{Tee, metrics_url, operator_log_path};

const OPERATOR_SA: &str = "database-table-operator";
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const LEASE: &str = "kplug-operator-widgets.test.kplug.io";

/// Beyond operator-rbac.yaml, the example's operator identity may operate
/// widgets (instead of DatabaseTables) in this test.
const WIDGET_RIGHTS: &str = r"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: test-widget-operator}
rules:
- {apiGroups: [test.kplug.io], resources: [widgets], verbs: [get, list, watch, update, patch]}
- {apiGroups: [test.kplug.io], resources: [widgets/status, widgets/finalizers], verbs: [get, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: test-widget-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-widget-operator}
subjects:
- {kind: ServiceAccount, name: database-table-operator, namespace: plugins}
";

/// `kplug-operator` for widgets as the example's operator ServiceAccount,
/// with leader election, its log tee'd to target/tmp.
fn operator(kubeconfig: &Path, identity: &str, extra: &[&str]) -> (Process, Lines) {
    let mut child = Command::new(workspace_binary("kplug-operator"))
        .args([
            "--resource",
            "widgets.test.kplug.io",
            "--namespace",
            "default",
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--leader-election-namespace",
            "plugins",
            "--leader-election-identity",
            identity,
            "--lease-duration",
            "4s",
            // One retry at most within the test: the failing object's
            // count stays exact.
            "--min-backoff",
            "10m",
            "--max-backoff",
            "10m",
        ])
        .args(extra)
        .env("NO_COLOR", "1")
        .env("KPLUG_LOG", "info,kplug_operator=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kplug-operator");
    let file = std::fs::File::create(operator_log_path(identity)).expect("the operator's log");
    let lines = Lines::new(Tee(child.stderr.take().expect("stderr"), file));
    (Process::new(child, identity), lines)
}

/// A sample's name, labels and expected value.
type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

/// The samples that differ from `expected`, as text.
fn mismatches(samples: &Samples, expected: &[Expected<'_>]) -> Vec<String> {
    expected
        .iter()
        .filter_map(|(name, labels, want)| {
            let got = samples.value(name, labels);
            (got != Some(*want)).then(|| format!("{name}{labels:?} = {got:?}, want {want}"))
        })
        .collect()
}

/// The values of `key=` in a log line.
fn fields<'a>(line: &'a str, key: &str) -> Vec<&'a str> {
    line.split(key)
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| c.is_whitespace() || c == '}').next())
        .collect()
}

#[test]
fn metrics_count_a_known_workload_for_allowed_readers_and_logs_carry_the_trace() {
    let world = Widgets::start();
    let cluster = &world.cluster;
    let examples = repo_root().join("examples/database-table");
    cluster.kubectl_ok(&[
        "apply",
        "-f",
        &examples.join("deploy/operator-rbac.yaml").to_string_lossy(),
    ]);
    cluster.apply(WIDGET_RIGHTS);
    for account in ["scraper", "nobody"] {
        cluster.kubectl_ok(&["create", "serviceaccount", account, "-n", "plugins"]);
    }
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "scraper-reads-metrics",
        "--clusterrole=kplug-operator:metrics-reader",
        "--serviceaccount=plugins:scraper",
    ]);
    let scraper = cluster.token("plugins", "scraper");
    let nobody = cluster.token("plugins", "nobody");
    let kubeconfig = world.work.path().join("operator.kubeconfig");
    cluster.kubeconfig_for_token(&kubeconfig, &cluster.token("plugins", OPERATOR_SA));

    let _hello = world.plugin("widgets", "Hello");
    let broken_token =
        kplug_test_support::plugin_identity(cluster, "broken", Some("broken"), world.work.path());
    let _broken = Process::spawn(
        kplug_test_support::hello_plugin_command(&world.kplug, "broken", &broken_token)
            .args([
                "--api",
                "widgets.test.kplug.io/v1",
                "--heartbeat-interval",
                "1",
            ])
            .args(["--implementation", "Broken", "--fail-with", "Broken"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
        "broken",
    );
    wait_plugin_ready(&world.cluster, "widgets");
    wait_plugin_ready(&world.cluster, "broken");

    let (mut leader, log) = operator(
        &kubeconfig,
        "metrics",
        &["--metrics-bind-address", "127.0.0.1:0"],
    );
    let serving = log.wait_for(Duration::from_secs(30), "serving metrics", |l| {
        l.contains("serving metrics")
    });
    let url = metrics_url(&serving);
    assert!(url.starts_with("https://127.0.0.1:"), "{serving}");
    log.wait_for(Duration::from_secs(30), "the leader", |l| {
        l.contains("became the leader")
    });

    // Who may read: 401 without a token or with one kube-apiserver does
    // not accept, 403 for a ServiceAccount without the role.
    for (credential, status) in [
        (Credential::Anonymous, 401),
        (Credential::Bearer("not-a-token"), 401),
        (Credential::Bearer(&nobody), 403),
    ] {
        let (got, body) = get(&url, Trust::Any, credential);
        assert_eq!(got, status, "{credential:?}: {body}");
        if status == 403 {
            assert!(
                body.contains(
                    r#"User "system:serviceaccount:plugins:nobody" cannot get path "/metrics""#
                ),
                "{body}"
            );
        }
    }
    let healthz = url.replace("/metrics", "/healthz");
    assert_eq!(get(&healthz, Trust::Any, Credential::Anonymous).0, 200);
    let before = scrape(&url, Trust::Any, Credential::Bearer(&scraper));
    assert_eq!(
        before.expect("leader_election_master_status", &[("name", LEASE)]),
        1.0
    );

    // A standby replica serves its metrics too; plain HTTP for anyone with
    // --metrics-secure=false.
    let (mut standby, standby_log) = operator(
        &kubeconfig,
        "metrics-standby",
        &[
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--metrics-secure=false",
        ],
    );
    let standby_url = metrics_url(&standby_log.wait_for(
        Duration::from_secs(30),
        "serving metrics",
        |l| l.contains("serving metrics"),
    ));
    assert!(
        standby_url.starts_with("http://127.0.0.1:"),
        "{standby_url}"
    );
    standby_log.wait_for(Duration::from_secs(30), "waiting to lead", |l| {
        l.contains("waiting to lead")
    });
    let standby_samples = scrape(&standby_url, Trust::Any, Credential::Anonymous);
    assert_eq!(
        standby_samples.expect("leader_election_master_status", &[("name", LEASE)]),
        0.0
    );

    // The workload: three objects the hello plugin reconciles (one with a
    // trace to continue), one the failing plugin refuses.
    let traceparent = format!("00-{TRACE_ID}-b7ad6b7169203331-01");
    cluster.apply(&widget("good-1", "Hello", Some(&traceparent)));
    for name in ["good-2", "good-3"] {
        cluster.apply(&widget(name, "Hello", None));
    }
    cluster.apply(&widget("broken", "Broken", None));
    for (name, status, reason) in [
        ("good-1", "True", "Reconciled"),
        ("good-2", "True", "Reconciled"),
        ("good-3", "True", "Reconciled"),
        ("broken", "False", "Broken"),
    ] {
        wait_until(
            &format!("{name}: Ready={status} {reason}"),
            Duration::from_secs(60),
            || {
                let ready = world.ready(name)?;
                (ready["status"] == status && ready["reason"] == reason)
                    .then_some(())
                    .ok_or_else(|| ready.to_string())
            },
        );
    }

    // Each object: one reconcile, which adds the finalizer (the plugins
    // declare Finalize) before it delegates; the failing one is retried in
    // 10 minutes, after the test.
    let widget_ = [("controller", "widget")];
    let expected: &[Expected<'_>] = &[
        (
            "controller_runtime_reconcile_total",
            &[("controller", "widget"), ("result", "success")],
            3.0,
        ),
        (
            "controller_runtime_reconcile_total",
            &[("controller", "widget"), ("result", "error")],
            1.0,
        ),
        (
            "controller_runtime_reconcile_total",
            &[("controller", "widget"), ("result", "requeue")],
            0.0,
        ),
        (
            "controller_runtime_reconcile_total",
            &[("controller", "widget"), ("result", "requeue_after")],
            0.0,
        ),
        ("controller_runtime_reconcile_errors_total", &widget_, 1.0),
        (
            "controller_runtime_reconcile_time_seconds_count",
            &widget_,
            4.0,
        ),
        ("controller_runtime_active_workers", &widget_, 0.0),
        ("workqueue_depth", &[("name", "widget")], 1.0),
        ("workqueue_retries_total", &[("name", "widget")], 1.0),
        (
            "kplug_operator_delegations_total",
            &[("operation", "Reconcile"), ("reason", "Success")],
            4.0,
        ),
        (
            "kplug_operator_delegation_duration_seconds_count",
            &[("operation", "Reconcile")],
            4.0,
        ),
        (
            "kplug_operator_status_writes_total",
            &[("target", "object"), ("result", "success")],
            4.0,
        ),
        (
            "kplug_operator_events_total",
            &[("type", "Normal"), ("reason", "Greeted")],
            3.0,
        ),
        (
            "kplug_operator_events_total",
            &[("type", "Warning"), ("reason", "Broken")],
            1.0,
        ),
        ("leader_election_master_status", &[("name", LEASE)], 1.0),
    ];
    let mut samples = before;
    wait_until(
        "the workload's exact counts",
        Duration::from_secs(30),
        || {
            samples = scrape(&url, Trust::Any, Credential::Bearer(&scraper));
            let wrong = mismatches(&samples, expected);
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(format!("{wrong:#?}\n{}", samples.text))
            }
        },
    );
    for absent in [
        ("kplug_operator_status_writes_total", [("result", "error")]),
        (
            "kplug_operator_delegations_total",
            [("reason", "PluginUnavailable")],
        ),
    ] {
        assert_eq!(samples.value(absent.0, &absent.1), None, "{}", samples.text);
    }

    // An unchanged outcome costs the delegation and nothing more: a nudged
    // good-2 is answered as before, so no status write and no routine
    // Normal Event (an Event per resync would be one write per object
    // every resync, for nothing new).
    world.request_reconcile("good-2", "unchanged");
    let success = [("controller", "widget"), ("result", "success")];
    wait_until("good-2's nudged reconcile", Duration::from_secs(30), || {
        samples = scrape(&url, Trust::Any, Credential::Bearer(&scraper));
        let reconciles = samples.expect("controller_runtime_reconcile_total", &success);
        (reconciles >= 4.0)
            .then_some(())
            .ok_or_else(|| format!("{reconciles} successful reconciles"))
    });
    for (name, labels, value) in [
        (
            "kplug_operator_status_writes_total",
            &[("target", "object"), ("result", "success")],
            4.0,
        ),
        (
            "kplug_operator_events_total",
            &[("type", "Normal"), ("reason", "Greeted")],
            3.0,
        ),
    ] {
        assert_eq!(
            samples.expect(name, labels),
            value,
            "{name}\n{}",
            samples.text
        );
    }
    assert!(
        samples.expect(
            "kplug_operator_delegations_total",
            &[("operation", "Reconcile"), ("reason", "Success")]
        ) >= 5.0,
        "{}",
        samples.text
    );

    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(samples.expect(process, &[]) > 0.0, "{process}");
    }
    let help = samples.help("workqueue_depth").unwrap_or_default();
    assert!(help.contains("not observable"), "{help}");

    // Every line of good-1's reconciles carries the annotated trace; the
    // others start their own, and record kplug's operation id.
    let lines = std::fs::read_to_string(operator_log_path("metrics")).expect("the operator's log");
    let in_span = |name: &str| -> Vec<&str> {
        lines
            .lines()
            .filter(|l| l.contains("reconcile{object=") && l.contains(&format!("/{name}.default")))
            .collect()
    };
    let traced = in_span("good-1");
    assert!(traced.len() >= 2, "{lines}");
    for line in &traced {
        assert_eq!(fields(line, "trace_id="), [TRACE_ID], "{line}");
    }
    let reconciled = |name: &str| -> String {
        in_span(name)
            .into_iter()
            .find(|l| l.contains("kplug_operator::reconciler: reconciled"))
            .unwrap_or_else(|| panic!("no reconciled line for {name}:\n{lines}"))
            .to_owned()
    };
    for name in ["good-1", "good-2", "broken"] {
        let line = reconciled(name);
        let trace = fields(&line, "trace_id=");
        let [trace] = trace.as_slice() else {
            panic!("one trace_id in {line}");
        };
        assert!(
            trace.len() == 32 && trace.chars().all(|c| c.is_ascii_hexdigit()),
            "{line}"
        );
        assert_eq!(*trace == TRACE_ID, name == "good-1", "{line}");
        // The span's operation id, recorded after kplug answered, is the
        // one the line reports.
        let operations = fields(&line, "operation_id=");
        assert_eq!(operations.len(), 2, "{line}");
        assert!(
            !operations[0].is_empty() && operations[0] == operations[1],
            "{line}"
        );
    }

    assert!(
        standby.terminate(Duration::from_secs(30)),
        "the standby stops cleanly"
    );
    assert!(
        leader.terminate(Duration::from_secs(30)),
        "the leader stops cleanly"
    );
}
