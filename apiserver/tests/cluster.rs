//! kplug as a real aggregated API server: a real kube-apiserver and etcd
//! (hack/control-plane.sh), the shipped RBAC (deploy/) and APIService
//! (apiservice/), kplug in cluster mode running as its own ServiceAccount,
//! and plugins heartbeating with ServiceAccount tokens.

use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_proto::v1alpha1::TOKEN_AUDIENCE;
use kplug_test_support::metrics::Samples;
use kplug_test_support::postgres::{Postgres, venv_python};
use kplug_test_support::server_timing;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, FAST_REVIEWS, Process, client_cert, expired_token, free_port,
    hello_plugin, output_text, plugin_identity, wait_until,
};
use serde_json::{Value, json};

/// Beyond [`FAST_REVIEWS`], so that the test need not wait: certificate
/// reloads of one second.
const KPLUG_FLAGS: &[&str] = &[
    "--cert-reload-interval",
    "1s",
    "--readiness-warmup",
    "1h",
    "--log",
    "info,kplug_apiserver::auth=debug",
];

/// Whether kplug has logged refusing the aggregator's OpenAPI download.
fn kplug_refused_openapi(kplug: &AggregatedKplug) -> bool {
    kplug
        .log
        .drain()
        .iter()
        .any(|l| l.contains("system:aggregator") && l.contains("/openapi"))
}

#[test]
fn kplug_behind_a_real_kube_apiserver() {
    let work = tempfile::Builder::new()
        .prefix("kplug-cluster-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));

    // The shipped RBAC, kplug's own identity and certificates, kplug
    // serving, registered through the real APIService.
    let kplug =
        AggregatedKplug::start(&cluster, work.path(), &[FAST_REVIEWS, KPLUG_FLAGS].concat());
    assert!(!kplug.ca_bundle.trim().is_empty(), "prints the caBundle");
    kplug.wait_for_log(Duration::from_secs(10), "the auth ConfigMap loaded", |l| {
        l.contains("loaded kube-system/extension-apiserver-authentication")
            && l.contains("front_proxy=true")
    });
    let certs = kplug.certs.clone();
    // kube-apiserver's front proxy identity: what the aggregator presents.
    let front_proxy = (
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT"),
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY"),
    );

    let out = cluster.kubectl(&["get", "plugins"]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("No resources found"),
        "{}",
        output_text(&out)
    );
    // The aggregator may read kplug's OpenAPI (deploy/aggregator-openapi.yaml).
    assert!(
        !kplug_refused_openapi(&kplug),
        "the aggregator was refused kplug's OpenAPI"
    );

    // A plugin heartbeating with a ServiceAccount token that may.
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let token_a = plugin_identity(&cluster, "hello-a", Some("hello-a"), work.path());
    let (mut watch, watch_lines) =
        cluster.kubectl_spawn(&["get", "plugins", "-w", "--output-watch-events"]);
    // The plugin must appear as an event, not in kubectl's first list:
    // wait until kplug has the watch kube-apiserver passes on open.
    wait_until(
        "kubectl's watch open in kplug",
        Duration::from_secs(30),
        || {
            let (_, code, body) = kplug.curl(
                Some((&front_proxy.0, &front_proxy.1)),
                &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
                "/metrics",
            );
            if code != 200 {
                return Err(format!("{code}: {body}"));
            }
            let open = Samples::parse(&body).sum(
                "apiserver_longrunning_requests",
                &[("verb", "WATCH"), ("resource", "plugins")],
            );
            (open >= 1.0)
                .then_some(())
                .ok_or_else(|| format!("{open} open"))
        },
    );
    let _hello_a = hello_plugin(&kplug, "hello-a", &token_a);
    watch_lines.wait_for(
        Duration::from_secs(30),
        "ADDED hello-a through kube-apiserver",
        |l| l.starts_with("ADDED") && l.contains("hello-a"),
    );
    watch.kill();
    let plugin: Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "plugin", "hello-a", "-o", "json"]))
            .expect("plugin JSON");
    assert_eq!(
        plugin["status"]["registeredBy"],
        "system:serviceaccount:plugins:hello-a"
    );

    // No heartbeat role: refused, never listed.
    let token_none = plugin_identity(&cluster, "no-role", None, work.path());
    let _no_role = hello_plugin(&kplug, "no-role", &token_none);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "a refused heartbeat", |l| {
            l.contains("heartbeat refused") && l.contains("no-role")
        });
    let listed = cluster.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert!(!listed.contains("no-role"), "{listed}");

    // A token for kube-apiserver rather than for kplug's registry (the
    // role is right): refused, saying which audience a plugin needs.
    let token_wrong = plugin_identity(
        &cluster,
        "for-apiserver",
        Some("for-apiserver"),
        work.path(),
    );
    std::fs::write(&token_wrong, cluster.token("plugins", "for-apiserver"))
        .expect("replace the token");
    let _for_apiserver = hello_plugin(&kplug, "for-apiserver", &token_wrong);
    let refused = kplug.log.wait_for(
        Duration::from_secs(20),
        "a heartbeat refused for its token's audience",
        |l| l.contains("heartbeat refused") && l.contains("for-apiserver"),
    );
    assert!(
        refused.contains("ServiceAccount token for audience") && refused.contains(TOKEN_AUDIENCE),
        "{refused}"
    );
    let listed = cluster.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert!(!listed.contains("for-apiserver"), "{listed}");

    // Another identity, even one allowed to use the name, cannot take over a live plugin.
    let token_thief = plugin_identity(&cluster, "thief", Some("hello-a"), work.path());
    let _thief = hello_plugin(&kplug, "hello-a", &token_thief);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "an IdentityConflict", |l| {
            l.contains("IdentityConflict")
        });
    let plugin: Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "plugin", "hello-a", "-o", "json"]))
            .expect("plugin JSON");
    assert_eq!(
        plugin["status"]["registeredBy"],
        "system:serviceaccount:plugins:hello-a"
    );

    // RBAC through kube-apiserver: nothing without a role, the shipped roles work.
    let reconcile_file = work.path().join("reconcile.json");
    std::fs::write(
        &reconcile_file,
        json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}}}}).to_string(),
    )
    .expect("request file");
    let reconcile_path = "/apis/plugins.kplug.io/v1alpha1/plugins/hello-a/reconcile";
    let reconcile_args = [
        "create",
        "--raw",
        reconcile_path,
        "-f",
        &reconcile_file.to_string_lossy(),
    ]
    .map(str::to_owned);
    let as_someone = |args: &[String]| {
        let mut full = vec!["--as=someone".to_owned()];
        full.extend_from_slice(args);
        cluster.kubectl(&full.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let denied = as_someone(&["get".to_owned(), "plugins".to_owned()]);
    assert!(
        !denied.status.success() && output_text(&denied).contains("Forbidden"),
        "{}",
        output_text(&denied)
    );
    let denied = as_someone(&reconcile_args);
    assert!(
        !denied.status.success() && output_text(&denied).contains("forbidden"),
        "{}",
        output_text(&denied)
    );
    let can_i = |verb: &str, subresource: &str| {
        let output = cluster.kubectl(&[
            "auth",
            "can-i",
            verb,
            "plugins.plugins.kplug.io",
            &format!("--subresource={subresource}"),
            "--as=someone",
        ]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(can_i("list", ""), "no");
    assert_eq!(can_i("create", "reconcile"), "no");
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "someone-reads",
        "--clusterrole=kplug:reader",
        "--user=someone",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "someone-reconciles",
        "--clusterrole=kplug:operator",
        "--user=someone",
    ]);
    // Creating reconciles is not enough: the caller must hold a
    // controller's right on the object (object_access.rs has the rest).
    wait_until(
        "someone refused for the Greeting itself",
        Duration::from_secs(20),
        || {
            let refused = as_someone(&reconcile_args);
            let text = output_text(&refused);
            text.contains(
                "greetings.example.com \"ada\" is forbidden: User \"someone\" cannot update \
                 resource \"greetings/status\" in API group \"example.com\" at the cluster scope",
            )
            .then_some(())
            .ok_or(text)
        },
    );
    cluster.apply(
        r"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: greetings-and-tables-controller}
rules:
- apiGroups: [example.com]
  resources: [greetings/status]
  verbs: [update]
- apiGroups: [myorg.org]
  resources: [databasetables/status]
  verbs: [update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: someone-controls}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: greetings-and-tables-controller}
subjects: [{kind: User, name: someone}]
",
    );
    wait_until(
        "someone may list and reconcile",
        Duration::from_secs(20),
        || {
            let listed = as_someone(&["get".to_owned(), "plugins".to_owned()]);
            let reconciled = as_someone(&reconcile_args);
            (listed.status.success() && reconciled.status.success())
                .then_some(())
                .ok_or_else(|| format!("{} / {}", output_text(&listed), output_text(&reconciled)))
        },
    );
    let answer: Value =
        serde_json::from_slice(&as_someone(&reconcile_args).stdout).expect("reconcile answer");
    assert_eq!(
        answer["status"]["objectStatus"]["greeting"], "hello, ada",
        "{answer:#}"
    );
    assert_eq!(can_i("list", ""), "yes");
    assert_eq!(can_i("create", "reconcile"), "yes");
    // kube-apiserver passes kplug's Server-Timing on to the caller.
    let verbose = [&reconcile_args[..], &["-v=8".to_owned()]].concat();
    let log = String::from_utf8_lossy(&as_someone(&verbose).stderr).into_owned();
    let stages = server_timing::from_kubectl_log(&log).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        stages.iter().any(|(stage, _)| stage == "plugin"),
        "{stages:?}"
    );

    // The database example through kube-apiserver: the PostgreSQL plugin
    // heartbeats with its own ServiceAccount, an operator reconciles.
    let pg = Postgres::start();
    let pg_name = "database-table-postgresql-plugin";
    let pg_token = plugin_identity(&cluster, pg_name, Some(pg_name), work.path());
    let pg_plugin = Command::new(venv_python())
        .args([
            "-m",
            "postgresql_plugin",
            "--heartbeat-interval",
            "1s",
            "--dsn",
            &pg.dsn,
        ])
        .args(["--registry", &format!("https://localhost:{}", kplug.grpc)])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--registry-ca-file")
        .arg(kplug.certs.join("ca.crt"))
        .arg("--token-file")
        .arg(&pg_token)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the PostgreSQL plugin (run hack/python-env.sh first)");
    let _pg_plugin = Process {
        child: pg_plugin,
        name: pg_name.to_owned(),
    };
    wait_until(
        "the PostgreSQL plugin listed",
        Duration::from_secs(30),
        || cluster.kubectl_check(&["get", "plugin", pg_name]),
    );
    let table_request = work.path().join("table.json");
    std::fs::write(
        &table_request,
        json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {
            "api": {"group": "myorg.org", "resource": "databasetables"},
            "preferredImplementation": "PostgreSQL",
            "object": {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "metadata": {"name": "accounts", "namespace": "default"},
                       "spec": {"serverName": "accounts-db", "columns": [{"name": "id", "type": "uint64"}, {"name": "owner", "type": "string"}]}},
        }})
        .to_string(),
    )
    .expect("request file");
    let answer = as_someone(
        &[
            "create",
            "-f",
            &table_request.to_string_lossy(),
            "-o",
            "json",
        ]
        .map(str::to_owned),
    );
    assert!(answer.status.success(), "{}", output_text(&answer));
    let answer: Value = serde_json::from_slice(&answer.stdout).expect("reconcile answer");
    assert_eq!(answer["status"]["plugin"]["name"], pg_name, "{answer:#}");
    assert_eq!(
        answer["status"]["success"], true,
        "{:#}",
        answer["status"]["results"]
    );
    assert_eq!(
        pg.query("select string_agg(column_name, ',' order by column_name) from information_schema.columns where table_name = 'accounts'"),
        "id,owner"
    );

    // kplug's own checks, straight at kplug.
    let plugins = "/apis/plugins.kplug.io/v1alpha1/plugins";
    // Forged identity headers without the front-proxy certificate: 401.
    let (_, code, body) = kplug.curl(
        None,
        &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // The front proxy asserting a user without the role: kplug's own SAR says 403.
    let (_, code, body) = kplug.curl(
        Some((&front_proxy.0, &front_proxy.1)),
        &[
            "X-Remote-User: nobody",
            "X-Remote-Group: system:authenticated",
        ],
        plugins,
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("cannot list resource \\\"plugins\\\""),
        "{body}"
    );
    // /metrics is a non-resource URL, authorized like kube-apiserver's:
    // 403 without kplug:metrics-reader, the page with it.
    let scrape_as = |user: &str| {
        let (_, code, body) = kplug.curl(
            Some((&front_proxy.0, &front_proxy.1)),
            &[
                &format!("X-Remote-User: {user}"),
                "X-Remote-Group: system:authenticated",
            ],
            "/metrics",
        );
        (code, body)
    };
    let (code, body) = scrape_as("nobody");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"cannot get path \"/metrics\""#), "{body}");
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "scraper-kplug-metrics",
        "--clusterrole=kplug:metrics-reader",
        "--user=scraper",
    ]);
    let (code, body) = scrape_as("scraper");
    assert_eq!(code, 200, "{body}");
    let page = Samples::parse(&body);
    assert!(
        page.sum("apiserver_request_total", &[("code", "403")]) >= 1.0,
        "the refused scrape is counted: {body}"
    );
    // A front-proxy CA certificate whose CN is not in requestheader-allowed-names: 401.
    let (cert, key) = client_cert(
        work.path(),
        "impostor",
        &cluster.var("KPLUG_FRONT_PROXY_CA_CERT"),
        &cluster.var("KPLUG_FRONT_PROXY_CA_KEY"),
    );
    let (_, code, body) = kplug.curl(
        Some((&cert, &key)),
        &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // A client certificate from a CA kplug does not trust: the handshake fails.
    let stranger = work.path().join("stranger");
    let made = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .args(["certs", "--out-dir"])
        .arg(&stranger)
        .output()
        .expect("stranger CA");
    assert!(made.status.success());
    let (stranger_cert, stranger_key) = client_cert(
        work.path(),
        "stranger",
        &stranger.join("ca.crt").to_string_lossy(),
        &stranger.join("ca.key").to_string_lossy(),
    );
    let (exit, code, _) = kplug.curl(Some((&stranger_cert, &stranger_key)), &[], plugins);
    assert!(
        exit != 0 && code == 0,
        "a foreign client certificate must fail the handshake"
    );
    // Malformed and expired bearer tokens: 401.
    let (_, code, body) = kplug.curl(None, &["Authorization: Bearer not-a-jwt"], plugins);
    assert_eq!(code, 401, "{body}");
    let (_, code, body) = kplug.curl(
        None,
        &[&format!(
            "Authorization: Bearer {}",
            expired_token(&cluster, "plugins", "hello-a")
        )],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // A plugin's heartbeat token is for kplug's registry only: not even
    // kplug's API takes it (it reviews API tokens for kube-apiserver's
    // audiences, as kube-apiserver would).
    let (_, code, body) = kplug.curl(
        None,
        &[&format!(
            "Authorization: Bearer {}",
            std::fs::read_to_string(&token_a).unwrap_or_default()
        )],
        plugins,
    );
    assert_eq!(code, 401, "a heartbeat token is not an API token: {body}");
    // A token for kube-apiserver authenticates, and authorization still applies.
    let (_, code, body) = kplug.curl(
        None,
        &[&format!(
            "Authorization: Bearer {}",
            cluster.token("plugins", "hello-a")
        )],
        plugins,
    );
    assert_eq!(
        code, 403,
        "a plugin's ServiceAccount may heartbeat, not list: {body}"
    );
    // Probes need nothing. Ready only after the warm-up (an hour here):
    // a new replica must hear every plugin first.
    let (_, code, _) = kplug.curl(None, &[], "/livez");
    assert_eq!(code, 200);
    let (_, code, body) = kplug.curl(None, &[], "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-]registry-warmup failed"), "{body}");

    // The auth ConfigMap changed while running: followed.
    cluster.kubectl_ok(&[
        "-n",
        "kube-system",
        "patch",
        "configmap",
        "extension-apiserver-authentication",
        "--type=merge",
        "-p",
        r#"{"data":{"kplug-e2e":"changed"}}"#,
    ]);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the change loaded", |l| {
            l.contains("loaded kube-system/extension-apiserver-authentication")
        });

    // The serving certificate rotated (same CA): served without a restart.
    let fingerprint = || {
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect 127.0.0.1:{} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256",
                kplug.https
            ))
            .output()
            .expect("openssl s_client");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let before = fingerprint();
    assert!(before.contains("Fingerprint"), "{before}");
    let rotated = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .args(["certs", "--out-dir"])
        .arg(&certs)
        .arg("--ca-cert")
        .arg(certs.join("ca.crt"))
        .arg("--ca-key")
        .arg(certs.join("ca.key"))
        .output()
        .expect("rotate the serving certificate");
    assert!(rotated.status.success(), "{}", output_text(&rotated));
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the reload logged", |l| {
            l.contains("serving certificate reloaded")
        });
    let after = fingerprint();
    assert!(
        after.contains("Fingerprint") && after != before,
        "{before} / {after}"
    );
    let out = cluster.kubectl(&["get", "plugins", "-o", "name"]);
    assert!(
        out.status.success(),
        "through the aggregator after rotation: {}",
        output_text(&out)
    );

    // The auth ConfigMap deleted while running: logged, the last trust kept.
    cluster.kubectl_ok(&[
        "-n",
        "kube-system",
        "delete",
        "configmap",
        "extension-apiserver-authentication",
    ]);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the deletion logged", |l| {
            l.contains("was deleted: keeping the last trust")
        });
    let out = cluster.kubectl(&["get", "plugins", "-o", "name"]);
    assert!(
        out.status.success() && output_text(&out).contains("hello-a"),
        "{}",
        output_text(&out)
    );
}
