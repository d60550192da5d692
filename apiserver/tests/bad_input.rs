//! Bad input gets a precise Kubernetes Status (or gRPC status), never a
//! panic or a hang, and leaves the registry as it was.

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, PluginApi, Protocol};
use kplug_test_support::StandaloneKplug;

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn status(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn assert_status(
    kplug: &StandaloneKplug,
    method: &str,
    path: &str,
    headers: &[&str],
    code: u16,
    reason: &str,
) -> serde_json::Value {
    let (got, body) = kplug.curl(method, path, headers, None);
    let status = status(&body);
    assert_eq!(got, code, "{method} {path}: {body}");
    assert_eq!(status["kind"], "Status", "{body}");
    assert_eq!(status["apiVersion"], "v1", "{body}");
    assert_eq!(status["code"], code, "{body}");
    assert_eq!(status["reason"], reason, "{body}");
    status
}

fn heartbeat(name: &str, address: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        name: name.to_owned(),
        version: "1.0.0".to_owned(),
        api: Some(PluginApi {
            group: "myorg.org".to_owned(),
            resource: "databasetables".to_owned(),
            version: "v1alpha1".to_owned(),
        }),
        implementation: "PostgreSQL".to_owned(),
        address: address.to_owned(),
        interval: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        protocol: Some(Protocol {
            version: "v1alpha1".to_owned(),
            ..Protocol::default()
        }),
        ..HeartbeatRequest::default()
    }
}

#[test]
fn http_errors_are_statuses_with_the_right_code_and_reason() {
    let kplug = StandaloneKplug::start();
    assert_status(
        &kplug,
        "GET",
        "/apis/plugins.kplug.io/v1alpha1/foos",
        &[],
        404,
        "NotFound",
    );
    assert_status(
        &kplug,
        "GET",
        "/apis/nothing.example.com/v1",
        &[],
        404,
        "NotFound",
    );
    let missing = assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}/ghost"),
        &[],
        404,
        "NotFound",
    );
    assert_eq!(missing["details"]["name"], "ghost");
    assert_eq!(missing["details"]["group"], "plugins.kplug.io");
    assert_eq!(missing["details"]["kind"], "plugins");

    let bad_rv = assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?resourceVersion=abc"),
        &[],
        400,
        "BadRequest",
    );
    assert!(
        bad_rv["message"]
            .as_str()
            .unwrap_or_default()
            .contains("resourceVersion")
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?resourceVersion=999999"),
        &[],
        504,
        "Timeout",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?labelSelector=a%20in%20("),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?fieldSelector=spec.x%3Dy"),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?limit=ten"),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?continue=not-a-token"),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?watch=maybe"),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?includeObject=All"),
        &[],
        400,
        "BadRequest",
    );
    assert_status(
        &kplug,
        "GET",
        &format!("{PLUGINS}?timeoutSeconds=-1&watch=1"),
        &[],
        400,
        "BadRequest",
    );

    assert_status(
        &kplug,
        "GET",
        PLUGINS,
        &["Accept: application/vnd.kubernetes.protobuf"],
        406,
        "NotAcceptable",
    );
    assert_status(
        &kplug,
        "GET",
        PLUGINS,
        &["Accept: application/json;as=Table;g=meta.k8s.io;v=v2"],
        406,
        "NotAcceptable",
    );
    assert_status(
        &kplug,
        "GET",
        "/apis",
        &["Accept: application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList"],
        406,
        "NotAcceptable",
    );

    assert_status(
        &kplug,
        "POST",
        PLUGINS,
        &["Content-Type: application/json"],
        405,
        "MethodNotAllowed",
    );
    assert_status(
        &kplug,
        "PUT",
        &format!("{PLUGINS}/x"),
        &[],
        405,
        "MethodNotAllowed",
    );
    assert_status(
        &kplug,
        "PATCH",
        &format!("{PLUGINS}/x"),
        &[],
        405,
        "MethodNotAllowed",
    );
    assert_status(&kplug, "DELETE", PLUGINS, &[], 405, "MethodNotAllowed");

    let (code, body) = kplug.curl("DELETE", &format!("{PLUGINS}/x"), &[], Some("{not json"));
    assert_eq!(code, 400, "{body}");
    assert_eq!(status(&body)["reason"], "BadRequest");
}

#[test]
fn requests_without_a_client_certificate_are_unauthorized_but_probes_pass() {
    let kplug = StandaloneKplug::start();
    let (code, body) = kplug.curl_as(None, "GET", PLUGINS, &[], None);
    assert_eq!(code, 401, "{body}");
    assert_eq!(status(&body)["reason"], "Unauthorized");
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
    let (code, body) = kplug.curl(
        "GET",
        &format!("{PLUGINS}?watch=1&resourceVersion=1&timeoutSeconds=1"),
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
        &format!("{PLUGINS}?watch=1&resourceVersion=3&timeoutSeconds=1"),
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
                "reserved for kplug",
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
            let error = client
                .heartbeat(request)
                .await
                .expect_err("invalid heartbeat");
            assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error}");
            assert!(
                error.message().contains(expected),
                "{expected:?} not in {:?}",
                error.message()
            );
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
        let conflict = client
            .heartbeat(heartbeat("owner", "127.0.0.1:7001"))
            .await
            .expect("reply")
            .into_inner();
        assert!(!conflict.accepted);
        assert_eq!(conflict.reason, "AddressConflict");
        assert!(
            conflict.message.contains("127.0.0.1:7000"),
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
    // The server is still healthy after all of it.
    let (code, _) = kplug.curl("GET", "/readyz", &[], None);
    assert_eq!(code, 200);
}
