//! Reconcile delegation through kplug to real plugin processes: the
//! subresource, server-side selection, and every failure kind.

use std::io::Write;
use std::time::{Duration, Instant};

use kplug_test_support::{Process, StandaloneKplug, free_port};
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
            "apiVersion: plugins.kplug.io/v1alpha1\nkind: Reconcile\nspec:\n  api: {{group: example.com, resource: greetings}}\n  preferredImplementation: {preferred}\n  object: {{apiVersion: example.com/v1, kind: Greeting, metadata: {{name: ada}}}}\n"
        );
        let file = write_temp(&kplug, "reconcile.yaml", &yaml);
        let out = kplug.kubectl_ok(&["create", "-f", &file, "-o", "json"]);
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

#[test]
fn malformed_requests_are_rejected_before_any_plugin_is_called() {
    let kplug = StandaloneKplug::start_with(&["--max-request-bytes", "4096"]);
    let (_plugin, _) = hello(&kplug, "hello", &[]);
    let path = format!("{PLUGINS}/hello/reconcile");

    let (code, status) = post(&kplug, &path, &request(json!({})));
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "{status:#}"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "spec.object");

    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": {"apiVersion": "v1", "kind": "X", "metadata": {}}})),
    );
    assert_eq!(code, 422, "{status:#}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.object.metadata.name"
    );

    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": greeting("a"), "operation": "Explode"})),
    );
    assert_eq!(
        (code, status["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.operation")),
        "{status:#}"
    );

    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": greeting("a"), "timeoutSeconds": 0})),
    );
    assert_eq!(
        (code, status["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.timeoutSeconds")),
        "{status:#}"
    );

    let (code, status) = post(
        &kplug,
        &path,
        &request(json!({"object": greeting("a"), "plugin": "other"})),
    );
    assert_eq!(
        (code, status["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.plugin")),
        "{status:#}"
    );

    let (code, status) = post(
        &kplug,
        RECONCILES,
        &request(json!({"object": greeting("a")})),
    );
    assert_eq!(
        (code, status["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.api")),
        "{status:#}"
    );

    let (code, status) = post(&kplug, &path, "{not json");
    assert_eq!(
        (code, status["reason"].as_str()),
        (400, Some("BadRequest")),
        "{status:#}"
    );

    let (code, status) = post(
        &kplug,
        &format!("{path}?fieldValidation=Strict"),
        &request(json!({"object": greeting("a"), "colour": "blue"})),
    );
    assert_eq!(code, 400, "{status:#}");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown field \"spec.colour\""),
        "{status:#}"
    );

    let (code, text) = kplug.curl(
        "POST",
        &path,
        &["Content-Type: text/plain"],
        Some(&request(json!({"object": greeting("a")}))),
    );
    assert_eq!(code, 415, "{text}");

    let huge = request(
        json!({"object": {"apiVersion": "v1", "kind": "X", "metadata": {"name": "big"}, "data": "x".repeat(8192)}}),
    );
    let (code, status) = post(&kplug, &path, &huge);
    assert_eq!(
        (code, status["reason"].as_str()),
        (413, Some("RequestEntityTooLarge")),
        "{status:#}"
    );

    let (code, status) = post(
        &kplug,
        &format!("{PLUGINS}/ghost/reconcile"),
        &request(json!({"object": greeting("a")})),
    );
    assert_eq!(
        (code, status["reason"].as_str()),
        (404, Some("NotFound")),
        "{status:#}"
    );

    let (code, text) = kplug.curl("GET", &path, &[], None);
    assert_eq!(code, 405, "{text}");

    // Nothing above reached the plugin or broke the server: a good request still works.
    let (code, answer) = post(&kplug, &path, &request(json!({"object": greeting("a")})));
    assert_eq!(
        (code, answer["status"]["success"].as_bool()),
        (201, Some(true)),
        "{answer:#}"
    );
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
        std::thread::sleep(Duration::from_millis(500));
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
        std::thread::sleep(Duration::from_millis(700));
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
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, answer) = post(&kplug, &path, &request(json!({"object": greeting("c")})));
        if code == 201 {
            assert_eq!(answer["status"]["success"], true);
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {code} {answer:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
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
