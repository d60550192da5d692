//! Bad input gets a precise Kubernetes Status (or gRPC status), never a
//! panic or a hang, and leaves the registry as it was.

use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{ExtensionKind, HeartbeatRequest, Protocol};
use kplug_test_support::{StandaloneKplug, heartbeat_request};

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn status(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A request: method, path, headers and body.
type Request<'a> = (&'a str, String, &'a [&'a str], Option<&'a str>);
/// The Status it must get: code, reason and part of the message.
type Expected<'a> = (u16, &'a str, &'a str);

/// Sends `method path` with `headers` and `body`, and checks the answer is
/// a `Status` with `code`, `reason` and a message containing `message`;
/// returns the Status.
fn assert_status(
    kplug: &StandaloneKplug,
    (method, path, headers, body): (&str, &str, &[&str], Option<&str>),
    (code, reason, message): Expected<'_>,
) -> serde_json::Value {
    let (got, text) = kplug.curl(method, path, headers, body);
    let status = status(&text);
    assert_eq!(got, code, "{method} {path}: {text}");
    assert_eq!(status["kind"], "Status", "{method} {path}: {text}");
    assert_eq!(status["apiVersion"], "v1", "{method} {path}: {text}");
    assert_eq!(status["status"], "Failure", "{method} {path}: {text}");
    assert_eq!(status["code"], code, "{method} {path}: {text}");
    assert_eq!(status["reason"], reason, "{method} {path}: {text}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains(message)),
        "{method} {path}: {message:?} not in {text}"
    );
    status
}

/// A heartbeat of the plugin `name` at `address`, every second.
fn heartbeat(name: &str, address: &str) -> HeartbeatRequest {
    heartbeat_request(name, "", address, Duration::from_secs(1))
}

#[test]
fn http_errors_are_statuses_with_the_right_code_and_reason() {
    let kplug = StandaloneKplug::start();
    let plugins = |tail: &str| format!("{PLUGINS}{tail}");
    const NO_ROUTE: &str = "the server could not find the requested resource";
    const NOT_ALLOWED: &str = "the server does not allow this method on the requested resource";
    const ACCEPTED: &str = "only the following media types are accepted: application/json";
    const JSON: &[&str] = &["Content-Type: application/json"];
    #[rustfmt::skip]
    let cases: Vec<(Request<'_>, Expected<'_>)> = vec![
        (("GET", "/apis/plugins.kplug.io/v1alpha1/foos".into(), &[], None), (404, "NotFound", NO_ROUTE)),
        (("GET", "/apis/nothing.example.com/v1".into(), &[], None), (404, "NotFound", NO_ROUTE)),
        (("GET", plugins("/ghost"), &[], None), (404, "NotFound", r#"plugins.plugins.kplug.io "ghost" not found"#)),
        (("GET", plugins("?resourceVersion=abc"), &[], None), (400, "BadRequest", "resourceVersion")),
        // A bare number is another process's (kplug before epochs, or kube-apiserver's).
        (("GET", plugins("?resourceVersion=999999"), &[], None), (410, "Expired", "too old resource version: 999999")),
        // {"rv":"00000000.1","start":"a"}: a continue token of another kplug process.
        (("GET", plugins("?continue=eyJydiI6IjAwMDAwMDAwLjEiLCJzdGFydCI6ImEifQ"), &[], None), (410, "Expired", "The provided continue parameter is too old")),
        (("GET", plugins("?labelSelector=a%20in%20("), &[], None), (400, "BadRequest", "unable to parse requirement")),
        (("GET", plugins("?fieldSelector=spec.x%3Dy"), &[], None), (400, "BadRequest", r#""spec.x" is not a known field selector"#)),
        (("GET", plugins("?limit=ten"), &[], None), (400, "BadRequest", r#"limit: Invalid value: "ten""#)),
        (("GET", plugins("?continue=not-a-token"), &[], None), (400, "BadRequest", "continue")),
        (("GET", plugins("?watch=maybe"), &[], None), (400, "BadRequest", r#"watch: Invalid value: "maybe""#)),
        (("GET", plugins("?includeObject=All"), &[], None), (400, "BadRequest", r#"includeObject: Unsupported value: "All""#)),
        (("GET", plugins("?timeoutSeconds=-1&watch=1"), &[], None), (400, "BadRequest", r#"timeoutSeconds: Invalid value: "-1""#)),
        (("GET", PLUGINS.into(), &["Accept: application/vnd.kubernetes.protobuf"], None), (406, "NotAcceptable", ACCEPTED)),
        (("GET", PLUGINS.into(), &["Accept: application/json;as=Table;g=meta.k8s.io;v=v2"], None), (406, "NotAcceptable", ACCEPTED)),
        (("GET", "/apis".into(), &["Accept: application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList"], None), (406, "NotAcceptable", ACCEPTED)),
        (("POST", PLUGINS.into(), JSON, None), (405, "MethodNotAllowed", NOT_ALLOWED)),
        (("PUT", plugins("/x"), &[], None), (405, "MethodNotAllowed", NOT_ALLOWED)),
        (("PATCH", plugins("/x"), &[], None), (405, "MethodNotAllowed", NOT_ALLOWED)),
        (("DELETE", PLUGINS.into(), &[], None), (405, "MethodNotAllowed", NOT_ALLOWED)),
        (("DELETE", plugins("/x"), &[], Some("{not json")), (400, "BadRequest", "invalid DeleteOptions")),
    ];
    for ((method, path, headers, body), expected) in &cases {
        let status = assert_status(&kplug, (method, path, headers, *body), *expected);
        if path.ends_with("/ghost") {
            assert_eq!(status["details"]["name"], "ghost");
            assert_eq!(status["details"]["group"], "plugins.kplug.io");
            assert_eq!(status["details"]["kind"], "plugins");
        }
    }
}

#[test]
fn requests_without_a_client_certificate_are_unauthorized_but_probes_pass() {
    let kplug = StandaloneKplug::start();
    let (code, body) = kplug.curl_as(None, "GET", PLUGINS, &[], None);
    assert_eq!(code, 401, "{body}");
    assert_eq!(status(&body)["reason"], "Unauthorized");
    assert_eq!(
        status(&body)["message"],
        "Unauthorized: a client certificate signed by kplug's CA is required"
    );
    for probe in ["/healthz", "/livez", "/readyz"] {
        let (code, body) = kplug.curl_as(None, "GET", probe, &[], None);
        assert_eq!((code, body.as_str()), (200, "ok"), "{probe}");
    }
}

#[test]
fn a_watch_from_a_compacted_resource_version_gets_an_expired_error_event() {
    let kplug = StandaloneKplug::start_with(&["--watch-history", "2"]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect");
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            let reply = client
                .heartbeat(heartbeat(name, &format!("127.0.0.1:{}", 40000 + i)))
                .await
                .expect("heartbeat");
            assert!(reply.get_ref().accepted);
        }
    });
    // resourceVersions are EPOCH.COUNTER; this process counted 4 changes.
    let (code, list) = kplug.curl("GET", PLUGINS, &[], None);
    assert_eq!(code, 200, "{list}");
    let list: serde_json::Value = serde_json::from_str(&list).expect("list");
    let current = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let (epoch, counter) = current.split_once('.').expect("EPOCH.COUNTER");
    assert_eq!(counter, "4", "{current}");

    let too_large = format!("{PLUGINS}?resourceVersion={epoch}.999999");
    let expected = (504, "Timeout", "Too large resource version");
    assert_status(&kplug, ("GET", &too_large, &[], None), expected);

    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&resourceVersion={epoch}.1&timeoutSeconds=1"),
        &[],
        None,
    );
    assert_eq!(code, 200, "{body}");
    let event: serde_json::Value =
        serde_json::from_str(body.lines().next().unwrap_or_default()).expect("event");
    assert_eq!(event["type"], "ERROR", "{body}");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");

    // A resumable resourceVersion replays exactly the later events.
    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&resourceVersion={epoch}.3&timeoutSeconds=1"),
        &[],
        None,
    );
    assert_eq!(code, 200);
    let names: Vec<String> = body
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(names, ["ADDED d"]);
}

#[test]
fn invalid_heartbeats_are_refused_precisely_and_change_nothing() {
    let kplug = StandaloneKplug::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect");
        let cases: Vec<(HeartbeatRequest, &str)> = vec![
            (heartbeat("", "127.0.0.1:1"), "name: Required value"),
            (
                heartbeat("Bad_Name", "127.0.0.1:1"),
                "name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain",
            ),
            (
                heartbeat("ok", "no-port"),
                "address: Invalid value: \"no-port\": must be host:port",
            ),
            (
                heartbeat("ok", "host:70000"),
                "address: Invalid value: \"host:70000\"",
            ),
            (
                HeartbeatRequest {
                    instance: "Pod_0".to_owned(),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "instance: Invalid value: \"Pod_0\": a lowercase RFC 1123 subdomain",
            ),
            (
                HeartbeatRequest {
                    server_name: "plugin.svc:443".to_owned(),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "serverName: Invalid value: \"plugin.svc:443\": must be an IP address or a DNS name",
            ),
            (
                HeartbeatRequest {
                    server_name: "other.plugins.kplug.io".to_owned(),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "serverName: Invalid value: \"other.plugins.kplug.io\": names under plugins.kplug.io are plugin identities: plugin \"ok\" may declare only \"ok.plugins.kplug.io\"",
            ),
            (
                HeartbeatRequest {
                    api: None,
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "api.group: Required value",
            ),
            (
                HeartbeatRequest {
                    labels: [("kplug.io/api".to_owned(), "x".to_owned())].into(),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "labels[kplug.io/api]: Invalid value: \"kplug.io/api\": the prefix \"kplug.io/\" is reserved for kplug",
            ),
            (
                HeartbeatRequest {
                    extensions: vec![ExtensionKind {
                        group: "backups.example.com".to_owned(),
                        kind: "backup".to_owned(),
                        version: String::new(),
                    }],
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "extensions[0].kind: Invalid value: \"backup\": must be a CamelCase kind name",
            ),
            (
                HeartbeatRequest {
                    protocol: Some(Protocol {
                        capabilities: vec!["Reconcile".to_owned(), "finalize".to_owned()],
                        ..Protocol::default()
                    }),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "protocol.capabilities[1]: Invalid value: \"finalize\"",
            ),
            (
                HeartbeatRequest {
                    canary_weight: 100,
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "canaryWeight: Invalid value: 100: must be between 0 and 99, inclusive",
            ),
            (
                HeartbeatRequest {
                    shadow_percent: 101,
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "shadowPercent: Invalid value: 101: must be between 0 and 100, inclusive",
            ),
            (
                HeartbeatRequest {
                    shadow_percent: 10,
                    canary_weight: 10,
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "shadowPercent: Invalid value: 10: must be 0 when canaryWeight is set",
            ),
            (
                HeartbeatRequest {
                    interval: Some(prost_types::Duration {
                        seconds: -5,
                        nanos: 0,
                    }),
                    ..heartbeat("ok", "127.0.0.1:1")
                },
                "interval: Invalid value",
            ),
        ];
        for (request, expected) in cases {
            let called = client
                .heartbeat(request.clone())
                .await
                .expect_err("invalid heartbeat");
            // On a stream, the same error ends the stream: the valid
            // heartbeat behind it is never taken (only "owner" is listed
            // at the end).
            let streamed = client
                .heartbeats(tokio_stream::iter([
                    request,
                    heartbeat("behind-invalid", "127.0.0.1:1"),
                ]))
                .await
                .expect("a heartbeat stream")
                .into_inner()
                .message()
                .await
                .expect_err("invalid heartbeat on a stream");
            for error in [called, streamed] {
                assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error}");
                assert!(
                    error.message().contains(expected),
                    "{expected:?} not in {:?}",
                    error.message()
                );
            }
        }

        let unsupported = HeartbeatRequest {
            protocol: Some(Protocol {
                version: "v9".to_owned(),
                ..Protocol::default()
            }),
            ..heartbeat("future", "127.0.0.1:1")
        };
        let reply = client
            .heartbeat(unsupported)
            .await
            .expect("a reply")
            .into_inner();
        assert!(!reply.accepted);
        assert_eq!(reply.reason, "UnsupportedProtocol");

        let first = client
            .heartbeat(heartbeat("owner", "127.0.0.1:7000"))
            .await
            .expect("reply")
            .into_inner();
        assert!(first.accepted, "{first:?}");
        // Another address is another instance, but it must serve what the
        // live one serves.
        let conflict = client
            .heartbeat(HeartbeatRequest {
                implementation: "MariaDB".to_owned(),
                ..heartbeat("owner", "127.0.0.1:7001")
            })
            .await
            .expect("reply")
            .into_inner();
        assert!(!conflict.accepted);
        assert_eq!(conflict.reason, "DeclarationConflict");
        assert!(
            conflict.message.contains("(PostgreSQL)") && conflict.message.contains("(MariaDB)"),
            "{}",
            conflict.message
        );
    });
    let listed = kplug.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(
        listed.trim(),
        "plugin.plugins.kplug.io/owner",
        "only the valid registration exists"
    );
    let owner = kplug.wait_for_plugin("owner", |_| true);
    assert_eq!(
        owner["spec"]["address"], "127.0.0.1:7000",
        "the conflicting heartbeat swapped nothing"
    );
    assert_eq!(
        owner["status"]["instances"].as_array().map(Vec::len),
        Some(1),
        "the conflicting heartbeat added no instance"
    );
    // The server is still healthy after all of it.
    let (code, _) = kplug.curl("GET", "/readyz", &[], None);
    assert_eq!(code, 200);
}
