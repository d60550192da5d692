//! Reconcile delegation through kplug to real plugin processes: the
//! subresource, server-side selection, and every failure kind.

use std::io::Write;
use std::time::{Duration, Instant};

use kplug_test_support::metrics::Samples;
use kplug_test_support::server_timing;
use kplug_test_support::{Process, StandaloneKplug, free_port, wait_until};
use serde_json::{Value, json};

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
const RECONCILES: &str = "/apis/plugins.kplug.io/v1alpha1/reconciles";
const GREETINGS: &str = "greetings.example.com/v1";

fn ready(object: &Value) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn greeting(name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": name}, "spec": {"big": 12345678901234567890u64, "nested": {"null": null}}})
}

fn request(spec: Value) -> String {
    json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": spec})
        .to_string()
}

fn write_temp(kplug: &StandaloneKplug, name: &str, contents: &str) -> String {
    let path = kplug.state.path().join(name);
    let mut file = std::fs::File::create(&path).expect("create request file");
    file.write_all(contents.as_bytes())
        .expect("write request file");
    path.to_string_lossy().into_owned()
}

fn post(kplug: &StandaloneKplug, path: &str, body: &str) -> (u16, Value) {
    let (code, text) = kplug.curl(
        "POST",
        path,
        &["Content-Type: application/json"],
        Some(body),
    );
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (code, value)
}

/// kplug's metrics, as Prometheus reads them. The scrape has credential
/// files of its own: `StandaloneKplug::curl` rewrites the admin's on every
/// call, and a call on another thread may be reading them meanwhile.
fn scrape(kplug: &StandaloneKplug) -> Samples {
    let dir = kplug.state.path();
    let credentials = (dir.join("scraper.crt"), dir.join("scraper.key"));
    if !credentials.1.exists() {
        let (cert, key) = kplug.admin_pem();
        std::fs::write(&credentials.0, cert).expect("write the scraper's certificate");
        std::fs::write(&credentials.1, key).expect("write the scraper's key");
    }
    let (code, body) = kplug.curl_as(Some(&credentials), "GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{body}");
    Samples::parse(&body)
}

/// The calls kplug made to `plugin`, whatever their outcome.
fn reconciles(kplug: &StandaloneKplug, plugin: &str) -> f64 {
    scrape(kplug).sum("kplug_reconciles_total", &[("plugin", plugin)])
}

/// Waits until kplug serves `calls` mutating requests at once: the
/// reconciles the test sent are in flight. kplug counts a request on
/// arrival and hands it to the plugin without waiting on anything else,
/// far sooner than a scrape and the next request take.
fn wait_for_calls_in_flight(kplug: &StandaloneKplug, calls: f64) {
    wait_until(
        "the calls in flight",
        Duration::from_secs(20),
        || match scrape(kplug).sum(
            "apiserver_current_inflight_requests",
            &[("request_kind", "mutating")],
        ) {
            n if n >= calls => Ok(()),
            n => Err(format!("{n} in flight")),
        },
    );
}

/// Starts a hello plugin on a free port and waits until it is Ready.
fn hello(kplug: &StandaloneKplug, name: &str, extra: &[&str]) -> (Process, String) {
    let address = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--listen", address.as_str()];
    args.extend_from_slice(extra);
    let process = kplug.plugin(name, &args);
    kplug.wait_for_plugin(name, ready);
    (process, address)
}

#[test]
fn kubectl_create_raw_delegates_to_the_named_plugin() {
    let kplug = StandaloneKplug::start();
    let (_plugin, _) = hello(&kplug, "hello", &[]);
    let file = write_temp(
        &kplug,
        "req.json",
        &request(json!({"object": greeting("world")})),
    );
    let output = kplug.kubectl_ok(&[
        "create",
        "--raw",
        &format!("{PLUGINS}/hello/reconcile"),
        "-f",
        &file,
    ]);
    let answer: Value = serde_json::from_str(&output).expect("JSON answer");
    assert_eq!(answer["kind"], "Reconcile");
    let status = &answer["status"];
    assert_eq!(status["success"], true, "{answer:#}");
    assert_eq!(status["results"][0]["reason"], "Greeted");
    assert_eq!(status["results"][0]["message"], "hello, world");
    assert_eq!(status["objectStatus"]["greeting"], "hello, world");
    assert_eq!(status["plugin"]["name"], "hello");
    assert_eq!(status["plugin"]["implementation"], "Hello");
    assert_eq!(
        status["plugin"]["capabilities"],
        json!(["Reconcile", "Finalize", "DryRun"]),
        "what the plugin declared, for the operator to decide on its finalizer"
    );
    assert_eq!(status["selection"]["reason"], "Requested");
    assert!(
        status["operationId"]
            .as_str()
            .is_some_and(|id| id.len() == 36)
    );
    assert!(
        status["durationMilliseconds"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0)
    );
    // The object reached the plugin and came back losslessly.
    assert_eq!(
        answer["spec"]["object"]["spec"]["big"],
        json!(12345678901234567890u64)
    );
    // kplug passes objects on as the bytes it got: even numbers no JSON
    // library here could hold come back exactly.
    let huge = r#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Reconcile","spec":{"object":{"apiVersion":"example.com/v1","kind":"Greeting","metadata":{"name":"big"},"spec":{"n":123456789012345678901234567890.000000000000000000001}}}}"#;
    let file = write_temp(&kplug, "huge.json", huge);
    let output = kplug.kubectl_ok(&[
        "create",
        "--raw",
        &format!("{PLUGINS}/hello/reconcile"),
        "-f",
        &file,
    ]);
    assert!(
        output.contains(r#""n":123456789012345678901234567890.000000000000000000001"#),
        "{output}"
    );

    let finalize = write_temp(
        &kplug,
        "fin.json",
        &request(json!({"operation": "Finalize", "object": greeting("world")})),
    );
    let output = kplug.kubectl_ok(&[
        "create",
        "--raw",
        &format!("{PLUGINS}/hello/reconcile"),
        "-f",
        &finalize,
    ]);
    let answer: Value = serde_json::from_str(&output).expect("JSON answer");
    assert_eq!(
        answer["status"]["results"][0]["reason"], "Goodbye",
        "{answer:#}"
    );
}

#[test]
fn an_answer_says_where_its_time_went() {
    let kplug = StandaloneKplug::start();
    let (_plugin, _) = hello(&kplug, "hello", &["--delay-ms", "40"]);
    let file = write_temp(
        &kplug,
        "req.json",
        &request(json!({"object": greeting("world")})),
    );
    let path = format!("{PLUGINS}/hello/reconcile");
    let output = kplug.kubectl(&["create", "--raw", &path, "-f", &file, "-v=8"]);
    assert!(output.status.success(), "{output:?}");
    let stages = server_timing::from_kubectl_log(&String::from_utf8_lossy(&output.stderr))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let names: Vec<&str> = stages.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "auth", "read", "decode", "select", "checks", "plugin", "answer"
        ]
    );
    // The plugin's 40 ms are in its stage and nowhere else.
    let delay = Duration::from_millis(40);
    let plugin = stages[5].1;
    assert!(plugin >= delay && plugin < 25 * delay, "{stages:?}");
    let rest: Duration = stages.iter().map(|(_, took)| *took).sum::<Duration>() - plugin;
    assert!(rest < delay, "{stages:?}");
}

#[test]
fn kubectl_create_selects_the_preferred_implementation_or_falls_back() {
    let kplug = StandaloneKplug::start();
    let (_hello, _) = hello(
        &kplug,
        "hello",
        &["--implementation", "Hello", "--api", GREETINGS],
    );
    let (_bonjour, _) = hello(
        &kplug,
        "bonjour",
        &["--implementation", "Bonjour", "--api", GREETINGS],
    );
    let reconcile = |preferred: &str| -> Value {
        let yaml = format!(
            "apiVersion: plugins.kplug.io/v1alpha1\nkind: Reconcile\nspec:\n  api: {{group: example.com, resource: greetings}}\n  preferredImplementation: {preferred}\n  object: {{apiVersion: example.com/v1, kind: Greeting, metadata: {{name: ada, namespace: team-a}}}}\n"
        );
        let file = write_temp(&kplug, "reconcile.yaml", &yaml);
        // Reconciles are namespaced: kubectl posts to the namespace's.
        let out = kplug.kubectl_ok(&["create", "-n", "team-a", "-f", &file, "-o", "json"]);
        serde_json::from_str(&out).expect("JSON answer")
    };
    let preferred = reconcile("BONJOUR");
    assert_eq!(preferred["status"]["plugin"]["name"], "bonjour");
    assert_eq!(
        preferred["status"]["selection"]["reason"],
        "PreferredImplementation"
    );
    let fallback = reconcile("Klingon");
    // Same version: the smallest name wins.
    assert_eq!(fallback["status"]["plugin"]["name"], "bonjour");
    assert_eq!(fallback["status"]["selection"]["reason"], "Fallback");
    assert!(
        fallback["status"]["selection"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Klingon")
    );

    // With no Ready plugin for an API: 503 naming the API, with Retry-After.
    let (code, status) = post(
        &kplug,
        RECONCILES,
        &request(
            json!({"api": {"group": "nothing.example.com", "resource": "things"}, "object": greeting("x")}),
        ),
    );
    assert_eq!(code, 503, "{status:#}");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("things.nothing.example.com")
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
}

/// `namespaces/{namespace}/reconciles` delegates objects of that namespace
/// only, and answers with the Reconcile in it.
#[test]
fn namespaced_reconciles_take_objects_of_their_namespace_only() {
    let kplug = StandaloneKplug::start();
    let (_hello, _) = hello(&kplug, "hello", &["--api", GREETINGS]);
    let in_team_a = "/apis/plugins.kplug.io/v1alpha1/namespaces/team-a/reconciles";
    let api = json!({"group": "example.com", "resource": "greetings"});
    let greeting_in = |namespace: Option<&str>| {
        let mut object = greeting("ada");
        if let Some(namespace) = namespace {
            object["metadata"]["namespace"] = json!(namespace);
        }
        object
    };
    let (code, answer) = post(
        &kplug,
        in_team_a,
        &request(json!({"api": api, "object": greeting_in(Some("team-a"))})),
    );
    assert_eq!(code, 201, "{answer:#}");
    assert_eq!(answer["metadata"]["namespace"], "team-a", "{answer:#}");
    assert_eq!(answer["status"]["objectStatus"]["greeting"], "hello, ada");

    for (object, message) in [
        (
            greeting_in(Some("team-b")),
            "spec.object.metadata.namespace: Invalid value: \"team-b\": must be \"team-a\", the namespace of the request",
        ),
        (
            greeting_in(None),
            "spec.object.metadata.namespace: Required value: must be \"team-a\", the namespace of the request",
        ),
    ] {
        let (code, status) = post(
            &kplug,
            in_team_a,
            &request(json!({"api": api, "object": object})),
        );
        assert_eq!(
            (code, &status["reason"]),
            (422, &json!("Invalid")),
            "{status:#}"
        );
        assert_eq!(
            status["details"]["causes"][0]["field"], "spec.object.metadata.namespace",
            "{status:#}"
        );
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.ends_with(message)),
            "{status:#}"
        );
    }
    // The Reconcile's own namespace, if it names one, is the path's.
    let elsewhere = json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "metadata": {"namespace": "team-b"},
        "spec": {"api": api, "object": greeting_in(Some("team-a"))},
    });
    let (code, status) = post(&kplug, in_team_a, &elsewhere.to_string());
    assert_eq!(
        (code, &status["reason"]),
        (400, &json!("BadRequest")),
        "{status:#}"
    );
    assert_eq!(
        status["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );
    // Nothing but create.
    let (code, status) = kplug.curl("GET", in_team_a, &[], None);
    assert_eq!(code, 405, "{status}");
}

/// A request: method, path, Content-Type and body (none when empty).
type Request<'a> = (&'a str, &'a str, &'a str, String);
/// The Status it must get: code, reason, the field of its first cause and
/// part of the message.
type Expected<'a> = (u16, &'a str, Option<&'a str>, &'a str);

#[test]
fn malformed_requests_are_rejected_before_any_plugin_is_called() {
    let kplug = StandaloneKplug::start_with(&["--max-request-bytes", "4096"]);
    let (_plugin, _) = hello(&kplug, "hello", &[]);
    let path = format!("{PLUGINS}/hello/reconcile");
    let strict = format!("{path}?fieldValidation=Strict");
    let ghost = format!("{PLUGINS}/ghost/reconcile");
    let with = |field: &str, value: Value| {
        let mut spec = json!({"object": greeting("a")});
        spec[field] = value;
        request(spec)
    };
    let huge = request(
        json!({"object": {"apiVersion": "v1", "kind": "X", "metadata": {"name": "big"}, "data": "x".repeat(8192)}}),
    );
    const JSON: &str = "application/json";
    #[rustfmt::skip]
    let cases: Vec<(Request<'_>, Expected<'_>)> = vec![
        (("POST", &path, JSON, request(json!({}))),
            (422, "Invalid", Some("spec.object"), "spec.object: Required value")),
        (("POST", &path, JSON, request(json!({"object": {"apiVersion": "v1", "kind": "X", "metadata": {}}}))),
            (422, "Invalid", Some("spec.object.metadata.name"), "spec.object.metadata.name: Required value")),
        (("POST", &path, JSON, with("operation", json!("Explode"))),
            (422, "Invalid", Some("spec.operation"), r#"spec.operation: Unsupported value: "Explode""#)),
        (("POST", &path, JSON, with("timeoutSeconds", json!(0))),
            (422, "Invalid", Some("spec.timeoutSeconds"), "spec.timeoutSeconds: Invalid value: 0")),
        (("POST", &path, JSON, with("plugin", json!("other"))),
            (422, "Invalid", Some("spec.plugin"), r#"spec.plugin: Invalid value: "other""#)),
        (("POST", RECONCILES, JSON, request(json!({"object": greeting("a")}))),
            (422, "Invalid", Some("spec.api"), "spec.api: Required value")),
        // Standalone, kplug has no cluster to read a stored object from.
        (("POST", &path, JSON, request(json!({"objectRef": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "a", "name": "b"}}))),
            (422, "Invalid", Some("spec.objectRef"), "spec.objectRef: Forbidden: kplug runs standalone")),
        (("POST", &path, JSON, request(json!({"object": greeting("a"), "objectRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "b"}}))),
            (422, "Invalid", Some("spec.objectRef"), "spec.objectRef: Forbidden: may not be set with spec.object")),
        (("POST", &path, JSON, "{not json".to_owned()),
            (400, "BadRequest", None, "decoding the Reconcile")),
        (("POST", &strict, JSON, with("colour", json!("blue"))),
            (400, "BadRequest", None, r#"unknown field "spec.colour""#)),
        (("POST", &path, "text/plain", request(json!({"object": greeting("a")}))),
            (415, "UnsupportedMediaType", None, "accepted media types include: application/json")),
        (("POST", &path, JSON, huge),
            (413, "RequestEntityTooLarge", None, "at most 4096 bytes")),
        (("POST", &ghost, JSON, request(json!({"object": greeting("a")}))),
            (404, "NotFound", None, r#"plugins.plugins.kplug.io "ghost" not found"#)),
        (("GET", &path, "", String::new()),
            (405, "MethodNotAllowed", None, "does not allow this method")),
    ];
    for ((method, path, content_type, body), (code, reason, field, message)) in &cases {
        let header = format!("Content-Type: {content_type}");
        let headers: Vec<&str> = [header.as_str()]
            .into_iter()
            .filter(|_| !content_type.is_empty())
            .collect();
        let (got, text) = kplug.curl(
            method,
            path,
            &headers,
            (!body.is_empty()).then_some(body.as_str()),
        );
        let status: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        let what = format!("{method} {path} expecting {message:?}: {text}");
        assert_eq!(got, *code, "{what}");
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["code"], *code, "{what}");
        assert_eq!(status["reason"], *reason, "{what}");
        assert_eq!(
            status["details"]["causes"][0]["field"].as_str(),
            *field,
            "{what}"
        );
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains(message)),
            "{what}"
        );
    }

    // Nothing above reached the plugin or broke the server: a good request still works.
    assert_eq!(reconciles(&kplug, "hello"), 0.0, "the plugin was called");
    let (code, answer) = post(&kplug, &path, &request(json!({"object": greeting("a")})));
    assert_eq!(
        (code, answer["status"]["success"].as_bool()),
        (201, Some(true)),
        "{answer:#}"
    );
    assert_eq!(reconciles(&kplug, "hello"), 1.0);
}

#[test]
fn a_slow_plugin_gets_a_timeout_and_a_busy_one_too_many_requests() {
    let kplug = StandaloneKplug::start_with(&["--max-inflight-per-plugin", "1"]);
    let (_plugin, _) = hello(&kplug, "slow", &["--delay-ms", "3000"]);
    let path = format!("{PLUGINS}/slow/reconcile");
    let started = Instant::now();
    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": greeting("a"), "timeoutSeconds": 1})),
    );
    assert_eq!(
        (code, status["reason"].as_str()),
        (504, Some("Timeout")),
        "{status:#}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered at the deadline, not when the plugin finished"
    );

    // One call in flight fills the bound of 1: a second is refused at once.
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            post(
                &kplug,
                &path,
                &request(json!({"object": greeting("first")})),
            )
        });
        wait_for_calls_in_flight(&kplug, 1.0);
        let (code, status) = post(
            &kplug,
            &path,
            &request(json!({"object": greeting("second")})),
        );
        assert_eq!(
            (code, status["reason"].as_str()),
            (429, Some("TooManyRequests")),
            "{status:#}"
        );
        let (code, answer) = first.join().expect("first call");
        assert_eq!(
            (code, answer["status"]["success"].as_bool()),
            (201, Some(true)),
            "{answer:#}"
        );
    });
}

#[test]
fn a_plugin_killed_mid_call_gives_503_and_recovers_when_it_returns() {
    let kplug = StandaloneKplug::start();
    let (mut plugin, address) = hello(&kplug, "fragile", &["--delay-ms", "5000"]);
    let path = format!("{PLUGINS}/fragile/reconcile");
    std::thread::scope(|scope| {
        let call = scope.spawn(|| post(&kplug, &path, &request(json!({"object": greeting("a")}))));
        wait_for_calls_in_flight(&kplug, 1.0);
        plugin.kill();
        let (code, status) = call.join().expect("call");
        assert_eq!(
            (code, status["reason"].as_str()),
            (503, Some("ServiceUnavailable")),
            "{status:#}"
        );
    });
    // Still registered (TTL not passed) but nothing listens: 503, not a hang.
    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": greeting("b"), "timeoutSeconds": 10})),
    );
    assert!(code == 503, "{code}: {status:#}");

    // The plugin comes back at the same address: calls succeed again.
    let _again = kplug.plugin("fragile", &["--listen", &address]);
    wait_until("recovery", Duration::from_secs(20), || {
        match post(&kplug, &path, &request(json!({"object": greeting("c")}))) {
            (201, answer) if answer["status"]["success"] == true => Ok(()),
            (code, answer) => Err(format!("{code} {answer:#}")),
        }
    });
}

#[test]
fn a_late_plugin_is_not_ready_and_gets_503() {
    let kplug = StandaloneKplug::start();
    let (mut plugin, _) = hello(&kplug, "late", &[]);
    plugin.kill();
    kplug.wait_for_plugin("late", |p| !ready(p));
    let (code, status) = post(
        &kplug,
        &format!("{PLUGINS}/late/reconcile"),
        &request(json!({"object": greeting("a")})),
    );
    assert_eq!(
        (code, status["reason"].as_str()),
        (503, Some("ServiceUnavailable")),
        "{status:#}"
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not Ready"),
        "{status:#}"
    );
}

/// SIGTERM (a pod being deleted) with a reconcile in flight and a watch open:
/// the reconcile gets its plugin's answer, the watch ends cleanly (its
/// client watches again, on another replica), and kplug exits once both
/// are done. Before kplug closed gracefully, the reconcile was cut off and
/// kube-apiserver answered 503 "error trying to reach service: unexpected
/// EOF" in a rollout (BENCHMARKS.md, "Failure drills").
#[test]
fn sigterm_lets_a_reconcile_in_flight_finish_and_ends_watches_cleanly() {
    let mut kplug = StandaloneKplug::start();
    let (_plugin, _) = hello(&kplug, "slow", &["--delay-ms", "2000"]);
    let (cert, key) = kplug.admin_credentials();
    let mut watch = std::process::Command::new("curl")
        .args(["-sS", "-N", "--max-time", "60", "--cacert"])
        .arg(kplug.state.path().join("ca.crt"))
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg(format!("{}{PLUGINS}?watch=true", kplug.api))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run curl");
    wait_until(
        "the watch open",
        Duration::from_secs(20),
        || match scrape(&kplug).sum("apiserver_longrunning_requests", &[]) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} open")),
        },
    );
    let path = format!("{PLUGINS}/slow/reconcile");
    let terminated = std::thread::scope(|scope| {
        let call = scope.spawn(|| post(&kplug, &path, &request(json!({"object": greeting("a")}))));
        wait_for_calls_in_flight(&kplug, 1.0);
        let terminated = Instant::now();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &kplug.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
        let (code, answer) = call.join().expect("the call");
        assert_eq!(
            (code, answer["status"]["success"].as_bool()),
            (201, Some(true)),
            "{answer:#}"
        );
        terminated
    });
    let ended = watch.wait().expect("curl ends");
    assert!(
        ended.success(),
        "the watch was cut off instead of ended: curl {ended}"
    );
    assert!(
        kplug.process.terminate(Duration::from_secs(10)),
        "kplug did not exit cleanly"
    );
    assert!(
        terminated.elapsed() < Duration::from_secs(15),
        "shutdown took {:?}",
        terminated.elapsed()
    );
}

/// kplug's audit log (stdout by default): one JSON line per reconcile,
/// answered or refused, naming who asked, the object and the outcome.
#[test]
fn each_reconcile_is_one_audit_line() {
    let kplug = StandaloneKplug::start();
    let (_plugin, _) = hello(&kplug, "hello", &[]);
    let answered = post(
        &kplug,
        "/apis/plugins.kplug.io/v1alpha1/plugins/hello/reconcile",
        &request(json!({"object": greeting("audited"), "dryRun": true})),
    );
    assert_eq!(answered.0, 201, "{}", answered.1);
    let missing = post(
        &kplug,
        "/apis/plugins.kplug.io/v1alpha1/plugins/nobody/reconcile",
        &request(json!({"object": greeting("orphan")})),
    );
    assert_eq!(missing.0, 404, "{}", missing.1);

    let event = |name: &str| -> Value {
        let line = kplug
            .stdout
            .wait_for(Duration::from_secs(10), "the audit line", |l| {
                l.contains(&format!(r#""name":"{name}""#))
            });
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    };
    let answered_line = event("audited");
    assert_eq!(answered_line["user"]["username"], "kplug-admin");
    assert_eq!(answered_line["code"], 201);
    assert_eq!(answered_line["outcome"], "Success");
    assert_eq!(answered_line["dryRun"], true);
    assert_eq!(answered_line["plugin"], "hello");
    assert_eq!(
        answered_line["operationId"],
        answered.1["status"]["operationId"]
    );
    assert_eq!(
        answered_line["objectRef"],
        json!({"apiVersion": "example.com/v1", "kind": "Greeting", "name": "audited"})
    );
    let missing_line = event("orphan");
    assert_eq!(missing_line["code"], 404);
    assert_eq!(missing_line["outcome"], "NotFound");
    assert_eq!(missing_line["operationId"], "");
    assert_eq!(
        missing_line["message"],
        "plugins.plugins.kplug.io \"nobody\" not found"
    );
}
